"""How a run ends: status, reason, facts from the ledger, checkpoint, handoff, message."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tether import telemetry
from tether.effects._canonical import jsonable
from tether.redaction._redact import redact, redact_conversation, redact_text, redacted_entries
from tether.run._document import Form, read, run_fields, write
from tether.run._handoff import SOME_STEP, HandoffRecord, _Delivery
from tether.run._outcome import (
    Outcome,
    Status,
    StopReason,
    Usage,
    deferred_messages,
    deferred_partial,
)
from tether.run._runstate import (
    RunState,
    end_step_span,
    end_with,
    ended_as,
    file_case,
    note_filed,
    pending_saved,
    unconfirm_effects,
)

if TYPE_CHECKING:
    from tether.records._records import Records

__all__ = ["Ending"]

_log = logging.getLogger("tether")

#: the newest messages of a conversation a run's record keeps (what the run's page shows)
CONVERSATION_KEPT = 200


class Ending:
    """The end of a run (a part of :class:`tether.Run`): its status, facts, outcome, record."""

    def __init__(self, state: RunState) -> None:
        self.s = state

    def facts(self) -> list[str]:
        """Effects of this run that the ledger records as done (and no rollback undid),
        in words.

        Raises what the ledger's store raises when it cannot be read;
        :meth:`tether.Run.finish` turns that into an open issue.
        """
        ledger = self.s.guard.ledger
        undone = {e.key for e in self.s._journal if e.state == "compensated"}
        out: list[str] = []
        for tool, args, key in self.s._effects:
            if key in undone:
                continue
            record = ledger.get(key)
            if record is not None and record.state.value == "done":
                text = self.s._effect_text(tool, args, ledger.result(key))
                if text and text not in out:
                    out.append(text)
        return out

    def _read_facts(self, issues: list[str]) -> list[str]:
        try:
            return self.facts()
        except Exception as exc:  # a store that is down never loses the outcome
            _log.error("tether: run %s: the ledger could not be read: %s", self.s.run_id, exc)
            issues.append(
                f"the ledger could not be read ({type(exc).__name__}): what this run's effects "
                "did is not confirmed; check the provider's records"
            )
            unconfirm_effects(self.s)
            return []

    def _status(self, reason: StopReason) -> Status:
        """The status of an ending for ``reason``, from its meaning (:data:`MEANINGS`)."""
        esc = self.s.guard.escalation
        meaning = reason.meaning
        if meaning.status in _OWN_STATUS and not self.s._escalate:
            return meaning.status
        # a handoff is made when the code asks for one, when a trigger fires, or, for any
        # run that did not reach its goal, when a sink is configured to receive it (not for
        # a decision that stands: a person's "no")
        if self.s._escalate or (
            esc is not None and (reason in esc.on or (esc.sink is not None and not meaning.final))
        ):
            return Status.ESCALATED
        if meaning.status is Status.FAILED or not _acted(self.s):
            return Status.FAILED
        return Status.PARTIAL

    def _conclude(self, status: str, *, amend: bool) -> Outcome:
        """The outcome of a run whose status is known (again, after a late rollback)."""
        assert self.s._stop is not None
        reason, detail = self.s._stop
        esc = self.s.guard.escalation
        issues = list(self.s._issues)
        if status != "success":
            issues.insert(0, f"stopped: {reason.value}" + (f" ({detail})" if detail else ""))
        facts = redact(self._read_facts(issues))
        undone = [str(c.get("effect") or SOME_STEP) for c in self.s._compensated]
        # the reason's own words when it ends as it means to (a refusal is final: trying
        # again gets the same answer; a hand-over says a person has it)
        said = _said(reason, status)
        # a person is promised only when a case is filed: the handoff below says whether
        handoff = self.s._outcome.handoff if self.s._outcome is not None else None
        filed = status == "escalated" and (handoff is None or self.s._case_filed)
        message = self._message(said, facts, undone, case_filed=filed)
        # everything below leaves tether (the outcome's words, checkpoints, handoffs): redacted
        detail, issues, task = redact(detail), redact(issues), redact(self.s.task)
        usage = self.s.usage()
        pending = self.s._pending.to_doc() if self.s._pending is not None else None
        partial, omitted = self.s.partial.newest(), self.s.partial.summary()
        # the record of the steps, made once for the checkpoint, the handoff and the run record
        steps: dict[str, Any] = {"transcript": redact(jsonable(self.s.transcript.newest()))}
        if self.s.guard.checkpoints is not None or self.s.guard.records is not None:
            steps["partial"] = redacted_entries(partial, jsonable)  # each call redacted once
            views = tuple(steps["partial"])
        else:  # only the outcome holds them: its calls are made into views when read
            views = deferred_partial(lambda: tuple(redacted_entries(partial, jsonable)))
        checkpoint_id = None
        if self.s.guard.checkpoints is not None:
            doc = {
                **run_fields(self.s),  # the run, its request, its effects (redacted)
                "task": task,
                "status": status,
                "reason": reason.value,
                "detail": detail,
                "usage": _usage_doc(usage),
                "models": list(self.s.models),
                **steps,
                "open_issues": issues,
                "omitted": {"partial": omitted, "transcript": self.s.transcript.summary()},
                "journal": [e.to_doc() for e in self.s._journal],
                "compensated": list(self.s._compensated),
                "pending": pending,
                "scopes": list(self.s.scopes),
            }
            if self.s.messages is not None:  # a worker in another process resumes the conversation
                from tether.records._runs import portable  # a run with messages only

                doc["messages"] = redact(portable(self.s.messages))
            try:
                doc = write(doc, Form.CHECKPOINT, self.s.guard.signing_keys)
                checkpoint_id = self.s.guard.checkpoints.save(doc, self.s.clock.wall())
                if self.s._pending is not None and not amend:
                    saved = pending_saved(self.s, checkpoint_id)
                    self.s.guard._approvals().put(saved, self.s.clock.wall())
                    pending = saved.to_doc()
            except Exception as exc:  # a failing store never loses the outcome
                _log.error("tether: run %s: checkpoint failed: %s", self.s.run_id, redact(str(exc)))
                issues.append(f"checkpoint failed: {type(exc).__name__}")
        if status == "escalated" and handoff is None:
            handoff = HandoffRecord(
                f"ho_{os.urandom(16).hex()[:20]}",
                self.s.run_id,
                task,
                reason,
                detail,
                tuple(steps["transcript"]),
                tuple(facts),
                tuple(issues),
                message,
                self.s.clock.wall(),
            )
            records = self.s.guard.records
            into_records, joined = records is not None, False
            if records is not None and self.s._outage is not None:  # one case per outage
                handoff, joined = _join_incident(self.s, records, handoff, issues)
                into_records = False
            for sink in (  # a run joining an open incident: its sink has the incident's case
                esc.sink if esc is not None and not joined else None,
                records.handoffs if records is not None and into_records else None,
            ):
                delivery = _Delivery(sink)
                file_case(self.s, delivery.deliver(handoff))
                issues.extend(delivery.errors)
            if not self.s._case_filed:  # nobody has the case: the customer is promised nobody
                message = self._message(said, facts, undone, case_filed=False)
                handoff = replace(handoff, customer_message=message)
                issues.append(
                    "the handoff reached no one (give Guard(records=...) or "
                    "Escalation(sink=...)): the customer was promised no person"
                )
        outcome = Outcome(
            status,
            reason,
            self.s._result,
            views,
            detail,
            tuple(issues),
            usage,
            checkpoint_id,
            message,
            self.s.run_id,
            handoff,
            self._conversation(status),
            self.s._error,
            tuple(self.s._compensated),
            pending,
            omitted["omitted"],
            tuple(self.s.models),
        )
        end_with(self.s, outcome)
        self._record(outcome, task, steps)
        if amend:
            return outcome
        end_step_span(self.s)
        telemetry.record_stop(
            reason.value, status, **{"tether.run_id": self.s.run_id, "tether.steps": usage.steps}
        )
        telemetry.notify("stop", outcome)
        if self.s.guard.on_stop is not None:
            try:
                self.s.guard.on_stop(outcome)
            except Exception:
                _log.exception("tether: on_stop hook raised; ignored")
        return outcome

    def _ended_as(self, record: Mapping[str, Any]) -> None:
        """This run was resumed from a checkpoint it has moved past (a redelivered job, a
        second worker, after the run ended): it ends at once with the outcome it was
        recorded with, so that nothing is done, asked or filed again from the older state."""
        try:
            reason = StopReason(record["reason"])
            usage = Usage(**record["usage"])
            status = str(record["status"])
        except (KeyError, TypeError, ValueError):
            return  # a record we cannot read: the run resumes as before
        detail = str(record.get("detail") or "")
        ended_as(self.s, reason, detail, record.get("result"))
        outcome = Outcome(
            status,
            reason,
            self.s._result,
            tuple(record.get("partial") or ()),
            detail,
            tuple(record.get("open_issues") or ()),
            usage,
            record.get("checkpoint_id"),
            str(record.get("customer_message") or ""),
            self.s.run_id,
            None,
            (),
            record.get("error"),
            tuple(record.get("compensated") or ()),
            record.get("pending_approval"),
            int(record.get("partial_omitted") or 0),
        )
        end_with(self.s, outcome)
        _log.info(
            "tether: run %s was resumed from checkpoint %s, which it has moved past: its "
            "recorded outcome (%s) stands",
            self.s.run_id,
            self.s._resumed_from,
            status,
        )

    def _conversation(self, status: str) -> tuple[Any, ...]:
        """The conversation, redacted; a run that stopped keeps its last turn (the calls a
        resume makes keep their arguments). Redacted when ``outcome.messages`` is first
        read (nothing else at the ending reads it: a checkpoint redacts its own copy), from
        the messages as they are now: a framework that goes on adding to its list after
        the run ended changes nothing."""
        messages, keep_last = tuple(self.s.messages or ()), status != "success"
        if not messages:
            return ()
        return deferred_messages(lambda: redact_conversation(messages, keep_last=keep_last))

    def _message(
        self, status: str, facts: list[str], undone: list[str], *, case_filed: bool
    ) -> str:
        assert self.s._stop is not None  # whether a call ran, whether trying again can help
        text = self.s.guard.messages.render(
            status,
            facts,
            unconfirmed=self.s._unconfirmed,
            undone=undone,
            case_filed=case_filed,
            acted=_acted(self.s),
            retry_helps=self.s._stop[0].meaning.retry_helps,
        )
        return str(redact(text))

    def _record(self, outcome: Outcome, task: str, steps: dict[str, Any]) -> None:
        """File the outcome in the guard's records (what the operator page lists)."""
        records = self.s.guard.records
        if records is None:
            return
        if _overtaken(self.s):
            _log.info(
                "tether: run %s: another worker ended it first; its record stands", self.s.run_id
            )
            return
        usage = outcome.usage
        body = {
            **run_fields(self.s),
            "task": task,
            "status": outcome.status,
            "reason": outcome.stopped_because.value,
            "detail": outcome.detail,
            "usage": _usage_doc(usage),
            "cost_usd": usage.cost_usd,
            "steps": usage.steps,
            "seconds": usage.seconds,
            "open_issues": list(outcome.open_issues),
            "customer_message": outcome.customer_message,
            "result": redact(jsonable(outcome.result)),
            **steps,
            "partial_omitted": outcome.partial_omitted,
            "checkpoint_id": outcome.checkpoint_id,
            "error": outcome.error,
            "handoff_id": getattr(outcome.handoff, "id", None),
            "compensated": list(outcome.compensated),
            "pending_approval": outcome.pending_approval,
            "ended_at": self.s.clock.wall(),
            "agent": self.s.agent,
        }
        messages = list(self.s.messages or ())
        if messages:  # the conversation, redacted, for the operator's page of the run
            from tether.records._runs import portable  # a run with messages only

            body["messages"] = redact(portable(messages[-CONVERSATION_KEPT:]))
            body["messages_omitted"] = max(0, len(messages) - CONVERSATION_KEPT)
        try:
            doc = write(body, Form.RECORD, self.s.guard.signing_keys)
            records.runs.save(doc, self.s.clock.wall())
            note_filed(self.s, outcome.checkpoint_id)
        except Exception as exc:  # a failing store never loses the outcome
            _log.error(
                "tether: run %s: its record could not be written: %s",
                self.s.run_id,
                redact(str(exc)),
            )


def _join_incident(
    s: RunState, records: Records, handoff: HandoffRecord, issues: list[str]
) -> tuple[HandoffRecord, bool]:
    """File a run that an outage stopped under that outage's incident: the open case of
    its dependency, or a new one when there is none (records/_incidents.py); the
    handoff, named by that case's id, and whether the run joined a case already open
    (whose handoff an ``Escalation(sink=...)`` had with the incident's first run: the
    sink gets one handoff per incident, ``records.incidents.runs(handoff.id)`` lists its
    conversations)."""
    from tether.records._collections import CaseState  # loaded by an outage's run only

    assert s._outage is not None
    dependency = str(redact_text(s._outage))

    def new_case() -> dict[str, Any]:
        doc = handoff.to_doc()
        doc.update(state=CaseState.OPEN, incident={"dependency": dependency})
        return doc

    try:
        case_id, opened = records.incidents.join(dependency, handoff.at, new_case)
    except Exception as exc:  # a failing store never loses the outcome
        _log.error(
            "tether: run %s: its incident could not be filed: %s",
            s.run_id,
            redact(str(exc)),
        )
        issues.append(f"incident filing failed: {type(exc).__name__}")
        return handoff, False
    file_case(s)
    if not opened:
        _log.info("tether: run %s joins the open incident %s (%s)", s.run_id, case_id, dependency)
    return replace(handoff, id=case_id), not opened


def _overtaken(s: RunState) -> bool:
    """Another worker that resumed the same checkpoint ended the run first: this ending
    is not filed over its record (nor over a later one)."""
    records = s.guard.records
    if records is None or s._resumed_from is None:
        return False
    try:
        found = records.runs.get(s.run_id)
        current = None if found is None else read(found, Form.RECORD, s.guard.signing_keys)
    except Exception:  # unreadable, altered or forged: this ending is filed over it
        return False
    return current is not None and current.get("checkpoint_id") not in (
        s._resumed_from,
        *s._filed,
    )


def _acted(s: RunState) -> bool:
    """Tool calls of the run completed (the ones ``partial`` keeps, or let go of)."""
    return bool(s.partial) or s.partial.omitted > 0


#: the statuses a reason gives on its own, unless a handoff was asked for
_OWN_STATUS = (Status.SUCCESS, Status.AWAITING_APPROVAL, Status.PAUSED, Status.PARTIAL)


def _said(reason: StopReason, status: str) -> str:
    """The customer message (a :class:`CustomerMessages` field) of an ending with ``status``
    for ``reason``: the reason's own message when it ended with the status it means to
    (``Meaning.message``), else the status's."""
    meaning = reason.meaning
    if meaning.message is None:
        return status
    own = meaning.status
    if own is None:  # decided by what was done: its message when nothing else was
        own = Status.FAILED
        if meaning.person and status == Status.ESCALATED:  # and when a person has it
            return meaning.message
    return meaning.message if status == own else status


def _usage_doc(usage: Usage) -> dict[str, Any]:
    names: tuple[str, ...] = Usage.__slots__
    return {name: getattr(usage, name) for name in names}
