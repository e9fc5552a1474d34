"""The tool-call pipeline of a run: checks -> breaker -> retry -> ledger -> result."""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from tether import telemetry
from tether._errors import (
    CircuitOpenError,
    ControlSignal,
    DeadlineExceeded,
    EffectInProgress,
    StoreUnavailable,
    UnknownOutcome,
)
from tether.classification._classify import Kind, classify
from tether.clock import hung_threads
from tether.effects._canonical import (
    VOLATILE_FIELDS,
    canonical_json,
    intent_keys_and_text,
    jsonable,
)
from tether.records import _approvals as gov
from tether.records._approvals import ApprovalRecord, approval_id
from tether.redaction._redact import REDACTED, masks_pii, redact, redacted_paths
from tether.retries._policy import RetryPolicy
from tether.run._governance import (
    ApprovalRejected,
    JournalEntry,
    PolicyDenied,
    check_policies,
    needs_approval,
)
from tether.run._health import UNRESPONSIVE_AFTER, ToolHealth, ToolUnresponsive
from tether.run._outcome import Stopped, StopReason, ToolError
from tether.run._runstate import RunState
from tether.run._tool import _is_async

__all__ = ["ToolCalls"]

_log = logging.getLogger("tether")

#: An intent approved and used this many times in one run asks no more (a loop).
MAX_APPROVALS_PER_INTENT = 20

UNAVAILABLE = "temporarily unavailable; try again later or continue without it"
REJECTED = "rejected: the tool could not do this; do not call it again with the same arguments"
QUOTA_REACHED = "unavailable: a usage limit was reached; do not call it again in this conversation"
NOT_ANSWERING = "unavailable: it is not answering; do not call it again in this conversation"


def _said(text: str) -> str:
    """A tool's own message for the model: its first line, redacted (personal data masked,
    unless ``register_secrets(mask_pii=False)``), at most 300 characters."""
    first = text.strip().splitlines()[0] if text.strip() else "the tool refused"
    return str(redact(first, pii=masks_pii()))[:300]


@dataclass(frozen=True, slots=True)
class _Call:
    """The checked context of one tool call."""

    name: str
    args: Any
    action: str  # the intent: what the loop checks compare
    key: str  # the ledger's key: the intent, scoped by the guard's scope when it has one
    step: int
    policy: RetryPolicy
    allow_repeat: int | None = None  # this call's own repeat cap (a read-only tool's polling)


class ToolCalls(RunState):
    """Calls a tool under every guard (mixed into :class:`tether.Run`)."""

    def _before_tool(
        self,
        name: str,
        args: Any,
        timeout: float | None,
        idempotent: bool,
        volatile: tuple[str, ...] = (),
        allow_repeat: int | None = None,
    ) -> _Call:
        if self._stop is not None:
            raise self._halt(*self._stop)
        self._began = True
        b = self.budget
        if b.max_tool_calls is not None and self.tool_calls >= b.max_tool_calls:
            raise self._halt(
                StopReason.MAX_TOOL_CALLS, f"max tool calls ({b.max_tool_calls}) reached"
            )
        # a non-idempotent call's timeout is the ledger's business: the attempt it abandons
        # keeps its claim until it really ends, so that nothing runs it a second time
        policy = self.guard._policy(name, timeout, effect=not idempotent)
        if b.max_seconds is not None and b.max_seconds - self.elapsed <= 0:
            raise self._halt(StopReason.TIMEOUT, f"time budget ({b.max_seconds:g} s) exceeded")
        hung = hung_threads() - self._hung_base
        if hung >= b.max_hung_threads:
            self._escalate = self._escalate or self.guard.on_hung_tool == "hand_over"
            raise self._halt(
                StopReason.HUNG_TOOLS, f"{hung} tool calls are still hanging in threads"
            )
        ignore = (*VOLATILE_FIELDS, *volatile) if volatile else None
        action, key, text = intent_keys_and_text(name, args, self._scope, ignore)  # one encoding
        if REDACTED in text if text is not None else _holds_placeholder(args):
            self._refuse_placeholders(name, args)
        loop = self._loops.check_action(name, action, self.steps, cap=allow_repeat)
        if loop is not None:
            raise self._halt(loop[0], f"{loop[1]} (step {self.steps})")
        self.tool_calls += 1
        self._step_calls += 1
        if allow_repeat is None and name not in self.guard.loops.allow_repeat:
            self._step_counted = True
        return _Call(name, args, action, key, self.steps, policy, allow_repeat)

    def _not_made(self) -> None:
        """A call that a framework's control flow interrupted did not happen."""
        self.tool_calls -= 1
        self._step_calls -= 1

    def _refuse_placeholders(self, name: str, args: Any) -> None:
        """A call whose arguments hold the redaction placeholder never runs: the value was
        lost when the conversation was stored (a secret is never kept in clear), and the
        placeholder is no card number. A resumed run stops FAILED saying so (its pending
        call cannot be completed, nor approved again); the model of a live run is told to
        ask for the value again."""
        lost = redacted_paths(args)
        if not lost:  # the placeholder in a key, not a value: nothing was lost
            return
        fields = ", ".join(p.removeprefix("args.") for p in lost)
        if self._resumed_from is not None:
            self._issues.append(
                f"{name} was not resumed: its argument {fields} was redacted when the run was "
                "stored (secrets are never kept); ask the customer for it again"
            )
            raise self._halt(
                StopReason.FAILED,
                f"{name} cannot be resumed: its argument {fields} was redacted when the run was "
                "stored",
            )
        raise ToolError(
            name,
            f"rejected: {fields} holds a redacted placeholder, not the value; ask the customer "
            "for it again",
            cause_kind="rejected",
        )

    def _label(self, name: str, label: str | None) -> None:
        if label is not None:
            if not isinstance(label, str) or not label.strip():
                raise ValueError(
                    f"label of tool {name!r} must be a non-empty string, got {label!r}"
                )
            self._labels[name] = label.strip()

    def _effect_timeout(self, timeout: float | None) -> float | None:
        """An effect's timeout: the tool's (or the policy's), never past the run's time."""
        bounds = [
            t
            for t in (
                timeout if timeout is not None else self.guard.retry.attempt_timeout,
                self.time_left(),
            )
            if t is not None
        ]
        return min(bounds) if bounds else None

    def _lease(self, timeout: float | None) -> float:
        """A claim's lease covers the call's timeout (the heartbeat renews it anyway)."""
        lease = self.guard.ledger.lease
        return lease if timeout is None else max(lease, 2.0 * timeout)

    def _effect(
        self,
        call: _Call,
        attempt: Callable[[], Any],
        idempotent: bool,
        lookup: Callable[[str], Any] | None,
        timeout: float | None,
    ) -> Callable[[], Any]:
        if idempotent:
            return attempt
        ledger, key, lease = self.guard.ledger, self._effect_key(call), self._lease(timeout)
        return lambda: ledger.once(
            key, attempt, lookup=lookup, lease=lease, timeout=self._effect_timeout(timeout)
        )

    def _effect_key(self, call: _Call) -> str:
        """The ledger key of a non-idempotent call, noted so that the outcome can state
        what the ledger says was done."""
        self._effects.append((call.name, call.args, call.key))
        return call.key

    # --- governance: policies and approvals before, the journal after ----------------------

    def _govern(
        self, call: _Call, requires_approval: Any, compensate: Any
    ) -> Callable[[], None] | None:
        """Policies, then the approval: either may refuse the call before anything runs.
        Returns None for a call no approval governs; else what to do once the ledger's
        claim on the call is won (mark the approval used)."""
        if compensate is not None and not callable(compensate):
            raise TypeError(f"compensate of {call.name!r} must be callable, got {compensate!r}")
        policies = self.guard._policy_calls
        reason = check_policies(policies, call.name, call.args, self) if policies else None
        if reason is not None:
            said = str(redact(reason))
            _log.warning("tether: run %s: policy denied %s: %s", self.run_id, call.name, said)
            telemetry.add_event(
                "tether.policy_denied", **{"gen_ai.tool.name": call.name, "tether.reason": said}
            )
            raise self._after_failure(call, PolicyDenied(f"denied by policy: {said}"))
        gate = self._approval(call) if needs_approval(requires_approval, call.args) else None
        self._tool_counts[call.name] += 1
        return gate

    def _approval(self, call: _Call) -> Callable[[], None]:
        """Let an approved call through once; stop the run for one not decided yet; give
        the model the approver's reason for a rejected one.

        An approval authorises one execution: the call runs through the ledger under its
        intent in this request, and the approval is marked used once the ledger's claim is
        won (so a worker that finds it used finds the claim too). A call the ledger already
        knows (done, failed, being done by another worker) asks no new approval: the ledger
        replays it, or says who is doing it, and nothing runs again.
        """
        approvals = self.guard._approvals()
        try:
            record_id, record = _current_approval(approvals, approval_id(self.run_id, call.action))
            approved = record is not None and record.status == gov.APPROVED
            known = None if approved else self.guard.ledger.get(call.key)
        except Exception as exc:  # our own store failed: nothing has run
            raise StoreUnavailable(
                f"the approvals of run {self.run_id} could not be read ({type(exc).__name__}): "
                f"{call.name} was not executed; try again when the checkpoints store and the "
                "ledger answer"
            ) from exc
        if approved:
            assert record is not None
            telemetry.add_event("tether.approved", **{"gen_ai.tool.name": call.name})
            return functools.partial(self._use_approval, approvals, record)
        if known is not None:
            return _already_claimed
        if record_id is None:
            raise self._halt(
                StopReason.AWAITING_APPROVAL, f"{call.name} asked for approval too often"
            )
        now = self.clock.wall()
        if record is not None and record.status == gov.REJECTED:
            why = f"rejected by {record.decided_by}" + (f": {record.note}" if record.note else "")
            raise self._after_failure(call, ApprovalRejected(why))
        self._pending = ApprovalRecord(
            record_id,
            self.run_id,
            call.name,
            redact(jsonable(call.args)),
            call.action,
            gov.PENDING,
            now,
            task=str(redact(self.task)),
        )
        raise self._halt(StopReason.AWAITING_APPROVAL, f"{call.name} needs a person's approval")

    def _use_approval(self, approvals: Any, record: ApprovalRecord) -> None:
        """Mark an approval used: it covered this one execution (a failure to say so is
        logged; the ledger's claim is what keeps the call once)."""
        try:
            approvals.put(replace(record, status=gov.USED), self.clock.wall())
        except Exception as exc:
            _log.error(
                "tether: run %s: approval %s could not be marked used (%s); the ledger "
                "still runs %s once",
                self.run_id,
                record.id,
                type(exc).__name__,
                record.tool,
            )

    def _gated(
        self, call: _Call, gate: Callable[[], None] | None, idempotent: bool, timeout: float | None
    ) -> tuple[_Call, bool]:
        """A call under an approval runs through the ledger whatever ``idempotent`` says."""
        if gate is None or not idempotent:
            return call, idempotent
        return replace(call, policy=self.guard._policy(call.name, timeout, effect=True)), False

    def _after_success(
        self, call: _Call, result: Any, idempotent: bool = True, compensate: Any = None
    ) -> Any:
        if compensate is not None:
            key = call.action if idempotent else call.key
            self._journal.append(
                JournalEntry(call.name, call.args, key, result, not idempotent, compensate)
            )
        # only completed calls count as repeats: a call that failed is the business of
        # max_identical_failures, so a model retrying a dead dependency is not a "loop"
        self._loops.record_action(call.name, call.action, allowed=call.allow_repeat is not None)
        self.retries += call.policy.statistics.retries
        entry = {"step": call.step, "tool": call.name, "args": call.args, "result": result}
        self.partial.append(entry)
        self.transcript.append({"step": call.step, "tool": call.name, "ok": True})
        try:
            digest = canonical_json(result, ignore=())
        except (TypeError, ValueError):
            digest = repr(result)
        digest = hashlib.sha256(f"{call.name}\x00{digest}".encode()).hexdigest()
        if digest not in self._results:
            self._results[digest] = None
            if len(self._results) > self.guard.loops.state_window:
                self._results.popitem(last=False)
            self._step_progress = True
        self._check_retry_escalation()
        return result

    def _check_retry_escalation(self) -> None:
        esc = self.guard.escalation
        if esc is not None and esc.max_retries is not None and self.retries > esc.max_retries:
            self._escalate = True
            raise self._halt(StopReason.ESCALATED, f"retries passed {esc.max_retries}")

    def _after_failure(self, call: _Call, exc: Exception) -> BaseException:
        """The exception to raise for a failed tool call (Stopped or ToolError)."""
        if not (isinstance(exc, ToolUnresponsive) and exc.before):
            self.retries += call.policy.statistics.retries
        entry = {"step": call.step, "tool": call.name, "ok": False, "error": type(exc).__name__}
        if isinstance(exc, UnknownOutcome):  # what a person must check (the case shows it)
            entry.update(args=redact(jsonable(call.args)), key=exc.key)
        self.transcript.append(entry)
        if isinstance(exc, Stopped | ReturnedAwaitable):  # the latter: the code's mistake
            return exc
        if isinstance(exc, ToolUnresponsive):
            return self._not_answering(call, exc)
        if isinstance(exc, CircuitOpenError):
            return self._halt(
                StopReason.CIRCUIT_OPEN, f"{call.name}: its dependency is down (circuit open)"
            )
        if isinstance(exc, EffectInProgress):  # one request, two runs: the other one has it
            self._issues.append(
                f"{call.name} is being done by another worker of this request (it holds the "
                f"claim until its lease ends); its result will be in the ledger (key "
                f"{exc.key[:16]}…): do not do it again"
            )
            return self._halt(
                StopReason.IN_PROGRESS, f"{call.name} is being done by another worker"
            )
        if isinstance(exc, UnknownOutcome):
            self._unconfirmed.append(call.name)
            self._issues.append(
                f"{call.name} may have happened: its outcome is unknown; check the provider's "
                f"records before trying it again (ledger key {exc.key[:16]}…)"
            )
            return self._halt(
                StopReason.UNKNOWN_OUTCOME, f"{call.name} may or may not have happened"
            )
        verdict = classify(exc)
        if isinstance(exc, DeadlineExceeded) and self.budget.max_seconds is not None:
            return self._halt(StopReason.TIMEOUT, f"time budget ran out during {call.name}")
        if isinstance(exc, TimeoutError) and call.name in self._health:
            unresponsive = self._unresponsive(call.name)
            if unresponsive is not None:
                return self._not_answering(call, unresponsive)
        signature = (call.action, type(exc).__name__, f"{verdict.status}:{verdict.code}")
        self._failures[signature] += 1
        limit = self.budget.max_identical_failures
        if limit is not None and self._failures[signature] >= limit:
            self._park(call, exc)
            return self._halt(
                StopReason.IDENTICAL_FAILURES,
                f"{call.name} failed {limit} times the same way ({type(exc).__name__})",
            )
        try:
            self._check_retry_escalation()
        except Stopped as stopped:
            return stopped
        if verdict.retryable or isinstance(exc, DeadlineExceeded):
            return ToolError(call.name, UNAVAILABLE, cause_kind="unavailable")
        if isinstance(exc, ToolError):  # the tool's own words for the model
            return ToolError(call.name, _said(exc.model_message), cause_kind="rejected")
        self._park(call, exc)
        if isinstance(exc, self.guard.model_errors):  # a business rule, said on purpose
            return ToolError(call.name, f"rejected: {_said(str(exc))}", cause_kind="rejected")
        if verdict.kind is Kind.QUOTA:
            return ToolError(call.name, QUOTA_REACHED, cause_kind="quota")
        return ToolError(call.name, REJECTED, cause_kind="rejected")

    def _interrupted(
        self, call: _Call, progress: _Progress | None, idempotent: bool, compensate: Any
    ) -> None:
        """What a cancelled (or interrupted) call leaves behind, before the cancellation goes
        on: the result it returned is kept; an effect that may have started stops the run
        UNKNOWN_OUTCOME; one that cannot have started leaves nothing (the ledger gave its
        claim back)."""
        if progress is None:
            return
        progress.give_up()
        if progress.returned:
            try:
                self._after_success(call, progress.result, idempotent, compensate)
            except Stopped:
                pass  # the cancellation is what the caller gets
        elif progress.running:
            self._after_failure(
                call, UnknownOutcome(call.key, "cancelled while it ran: it may have happened")
            )

    def _park(self, call: _Call, exc: BaseException) -> None:
        letters = self.guard.dead_letters
        if letters is None:
            return
        letter = letters.park(
            tool=call.name,
            args=call.args,
            error=exc,
            run_id=self.run_id,
            task=self.task,
            at=self.clock.wall(),
            key=call.key,
        )
        issue = f"{call.name} failed permanently; dead letter {letter.id}"
        if issue not in self._issues:  # the model asking again joins the same letter
            self._issues.append(issue)

    # --- tools that stopped answering ---------------------------------------------------

    def _watch(self, call: _Call, idempotent: bool) -> ToolHealth | None:
        """The health record of a timed call of a read (an effect's timeout is the
        ledger's: it ends the run UNKNOWN_OUTCOME); None when nothing is watched."""
        if not idempotent or call.policy.attempt_timeout is None:
            return None
        if self.guard.on_hung_tool == "wait":
            return None
        health = self._health.get(call.name)
        if health is None:
            health = self._health[call.name] = ToolHealth()
        return health

    def _unresponsive(self, name: str) -> ToolUnresponsive | None:
        """The tool stopped answering in this run: it holds ``UNRESPONSIVE_AFTER`` hung
        worker threads, or timed out that many times and its breaker is not closed."""
        health = self._health.get(name)
        if health is None:
            return None
        hanging = health.hanging()
        if hanging >= UNRESPONSIVE_AFTER or (
            health.timed_out >= UNRESPONSIVE_AFTER and self.guard.breaker(name).state != "closed"
        ):
            return ToolUnresponsive(name, health.timed_out, hanging)
        return None

    def _refuse_unresponsive(self, call: _Call, before: bool = False) -> None:
        """Start no attempt of a tool that stopped answering (raises ToolUnresponsive)."""
        found = self._unresponsive(call.name)
        if found is not None:
            if before:  # refused before its retry policy ran: none of its retries to count
                found.before = True
            raise found

    def _unless_unresponsive(self, call: _Call, fn: Callable[[], Any]) -> Any:
        """``fn()``; an open breaker of a tool that stopped answering is not waited for."""
        try:
            return fn()
        except CircuitOpenError:
            self._refuse_unresponsive(call)
            raise

    async def _aunless_unresponsive(self, call: _Call, fn: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await fn()
        except CircuitOpenError:
            self._refuse_unresponsive(call)
            raise

    def _not_answering(self, call: _Call, exc: ToolUnresponsive) -> BaseException:
        """A tool that stopped answering: the run hands over (``Guard(on_hung_tool=
        "hand_over")``, the default), or the model is told it is unavailable."""
        attributes = {"gen_ai.tool.name": call.name, "tether.timed_out": exc.timed_out}
        telemetry.add_event(
            "tether.tool_unresponsive", **attributes, **{"tether.hung_threads": exc.hanging}
        )
        _log.warning("tether: run %s: %s", self.run_id, exc)
        if self.guard.on_hung_tool == "tell_model":
            return ToolError(call.name, NOT_ANSWERING, cause_kind="unavailable")
        issue = f"{exc}; it was not started again"
        if issue not in self._issues:
            self._issues.append(issue)
        self._escalate = True
        if exc.hanging >= UNRESPONSIVE_AFTER:  # it holds worker threads
            return self._halt(StopReason.HUNG_TOOLS, str(exc))
        return self._halt(StopReason.CIRCUIT_OPEN, f"{exc}, and its circuit is open")

    def call_tool(
        self,
        name: str,
        fn: Callable[..., Any],
        args: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        idempotent: bool = True,
        lookup: Callable[[str], Any] | None = None,
        requires_approval: bool | Callable[[Mapping[str, Any]], bool] = False,
        compensate: Callable[[Any], Any] | None = None,
        volatile: Iterable[str] = (),
        label: str | None = None,
        allow_repeat: int | None = None,
        passthrough: tuple[type[BaseException], ...] = (),
    ) -> Any:
        """Call a tool under every guard: policies, approval, loops and budgets, breaker,
        retries, ledger.

        ``fn(**args)`` is retried on transient failures with ``timeout`` per attempt;
        a non-idempotent tool runs at most once through the guard's ledger (an attempt
        that outlives ``timeout`` is never run again: the run stops ``UNKNOWN_OUTCOME``).
        The guard's policies may deny the call before anything runs; ``requires_approval``
        (True, or a predicate of the arguments) stops the run ``AWAITING_APPROVAL`` until a
        person approves this very call; ``compensate(result)`` is what ``run.rollback()``
        runs to undo it once it completed. ``volatile`` names argument paths that the
        model fills anew on every call (``"meta.nonce"``, ``"items.*.request_id"``), left
        out of the call's identity besides the top-level request ids
        (:data:`tether.VOLATILE_FIELDS`); every other field, at any depth, is the intent.
        ``label`` is what the customer's message calls
        its effect (``"refund"``: "Done: refund completed"); the tool's name never reaches
        the customer.
        ``allow_repeat`` gives this call its own repeat cap, as a tool named in
        ``LoopPolicy.allow_repeat`` (a read-only tool that polls). ``passthrough`` names
        exceptions that are a framework's control flow (LangGraph's ``GraphInterrupt``):
        raised by ``fn``, they leave as they are, and the call counts as not made (no
        retry, no record, a ledger's claim given back).
        Raises :class:`tether.Stopped` when a guard ends the run (the call is not made),
        or :class:`tether.ToolError` with a short text for the model when it fails.
        """
        if _is_async(fn):
            raise TypeError(
                f"tool {name!r} is a coroutine function: call it with `await run.acall_tool(...)`"
                " (call_tool would never await it, and the tool would never run)"
            )
        args = _arguments(name, args)
        self._label(name, label)
        cap, fn = _repeat_cap(name, allow_repeat), _carried(fn, passthrough)
        call = self._before_tool(name, args, timeout, idempotent, _paths(name, volatile), cap)
        gate = self._govern(call, requires_approval, compensate)
        call, idempotent = self._gated(call, gate, idempotent, timeout)
        if gate is None:
            attempt = _attempt_span(name, lambda: _not_awaitable(name, fn(**args)))
        else:

            def approved() -> Any:  # runs once the ledger's claim is won
                gate()
                return _not_awaitable(name, fn(**args))

            attempt = _attempt_span(name, approved)
        health = self._watch(call, idempotent)
        if health is not None:
            attempt = health.sync(functools.partial(self._refuse_unresponsive, call), attempt)
        run = self._effect(call, attempt, idempotent, lookup, timeout)
        progress = None if idempotent else _Progress()
        if progress is not None:
            run = functools.partial(progress.run, run)
        with telemetry.span(
            "tether.tool_call", **{"gen_ai.tool.name": name, "tether.run_id": self.run_id}
        ):
            try:
                if health is not None:
                    self._refuse_unresponsive(call, before=True)
                result = self.through_breaker(
                    lambda: self._unless_unresponsive(
                        call, lambda: call.policy.call_within(self.time_left(), run)
                    ),
                    timeout=timeout,
                )
            except ControlSignal as carried:  # the framework's own control flow
                self._not_made()
                raise carried.signal from None
            except Exception as exc:
                raise self._after_failure(call, exc) from exc
            except BaseException:  # KeyboardInterrupt, SystemExit
                self._interrupted(call, progress, idempotent, compensate)
                raise
        return self._after_success(call, result, idempotent, compensate)

    async def acall_tool(
        self,
        name: str,
        fn: Callable[..., Awaitable[Any]] | Callable[..., Any],
        args: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        idempotent: bool = True,
        lookup: Callable[[str], Any] | None = None,
        requires_approval: bool | Callable[[Mapping[str, Any]], bool] = False,
        compensate: Callable[[Any], Any] | None = None,
        volatile: Iterable[str] = (),
        label: str | None = None,
        allow_repeat: int | None = None,
        passthrough: tuple[type[BaseException], ...] = (),
    ) -> Any:
        """The async form of :meth:`call_tool`; a hanging attempt is cancelled.

        ``fn`` may be a coroutine function (awaited) or a plain function (run in a
        worker thread, so that it does not block the event loop).
        """
        args = _arguments(name, args)
        self._label(name, label)
        cap, fn = _repeat_cap(name, allow_repeat), _acarried(fn, passthrough)
        call = self._before_tool(name, args, timeout, idempotent, _paths(name, volatile), cap)
        gate = self._govern(call, requires_approval, compensate)
        call, idempotent = self._gated(call, gate, idempotent, timeout)
        attempt: Callable[[], Awaitable[Any]]
        progress = None if idempotent else _Progress()
        health = self._watch(call, idempotent)
        check = functools.partial(self._refuse_unresponsive, call)
        if _is_async(fn):

            async def attempt() -> Any:
                if gate is not None:
                    gate()  # the ledger's claim is won
                return await fn(**args)

            attempt = _aattempt_span(name, attempt)
            if health is not None:
                attempt = health.coro(check, attempt)

            if progress is not None:
                ledger, key, lease = self.guard.ledger, self._effect_key(call), self._lease(timeout)
                coro = functools.partial(progress.arun, attempt)  # what the ledger runs

                async def attempt() -> Any:
                    return await ledger.aonce(
                        key, coro, lookup=lookup, lease=lease, timeout=self._effect_timeout(timeout)
                    )
        else:

            def body() -> Any:
                if gate is not None:
                    gate()
                return _not_awaitable(name, fn(**args))

            sync = self._effect(call, _attempt_span(name, body), idempotent, lookup, timeout)
            if progress is not None:
                sync = functools.partial(progress.run, sync)

            if health is not None:
                attempt = health.threaded(check, sync)
            else:

                async def attempt() -> Any:
                    import asyncio  # imported when first used: `import tether` loads no asyncio

                    return await asyncio.to_thread(sync)

        with telemetry.span(
            "tether.tool_call", **{"gen_ai.tool.name": name, "tether.run_id": self.run_id}
        ):
            try:
                if health is not None:
                    self._refuse_unresponsive(call, before=True)
                result = await self.athrough_breaker(
                    lambda: self._aunless_unresponsive(
                        call, lambda: call.policy.acall_within(self.time_left(), attempt)
                    ),
                    timeout=timeout,
                )
            except ControlSignal as carried:
                self._not_made()
                raise carried.signal from None
            except Exception as exc:
                raise self._after_failure(call, exc) from exc
            except BaseException:  # cancelled
                self._interrupted(call, progress, idempotent, compensate)
                raise
        return self._after_success(call, result, idempotent, compensate)


def _repeat_cap(name: str, cap: int | None) -> int | None:
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        raise ValueError(f"allow_repeat of tool {name!r} must be an int >= 1 or None, got {cap!r}")
    return cap


def _signals(passthrough: object) -> tuple[type[BaseException], ...]:
    if not isinstance(passthrough, tuple) or not all(
        isinstance(t, type) and issubclass(t, BaseException) for t in passthrough
    ):
        raise TypeError(f"passthrough must be a tuple of exception types, got {passthrough!r}")
    return passthrough


def _carried(fn: Callable[..., Any], passthrough: object) -> Callable[..., Any]:
    """``fn`` whose control-flow exceptions travel as :class:`ControlSignal`."""
    signals = _signals(passthrough)
    if not signals:
        return fn

    @functools.wraps(fn)
    def carried(**args: Any) -> Any:
        try:
            return fn(**args)
        except signals as exc:
            raise ControlSignal(exc) from None

    return carried


def _acarried(fn: Callable[..., Any], passthrough: object) -> Callable[..., Any]:
    signals = _signals(passthrough)
    if not signals:
        return fn
    if not _is_async(fn):
        return _carried(fn, signals)

    @functools.wraps(fn)
    async def carried(**args: Any) -> Any:
        try:
            return await fn(**args)
        except signals as exc:
            raise ControlSignal(exc) from None

    return carried


class _Progress:
    """How far one non-idempotent call got, for a cancellation to tell.

    ``running`` while an attempt of the effect is under way (the effect itself, or, run
    in a worker thread, the whole ledger call, which goes on to its end once it began);
    ``returned`` once one gave a result. An attempt that raised is settled by the ledger
    (released, failed or unknown) and is no longer running. Once the caller gave up, a
    worker thread that had not begun yet never does.
    """

    __slots__ = ("_lock", "_off", "result", "returned", "running")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._off = self.running = self.returned = False
        self.result: Any = None

    def run(self, fn: Callable[[], Any]) -> Any:
        with self._lock:
            if self._off:
                return None  # the caller was cancelled before this thread began
            self.running = True
        try:
            result = fn()
        except Exception:
            self.running = False
            raise
        self.result, self.returned, self.running = result, True, False
        return result

    async def arun(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        self.running = True
        try:
            result = await fn()
        except Exception:
            self.running = False
            raise
        self.result, self.returned, self.running = result, True, False
        return result

    def give_up(self) -> None:
        with self._lock:
            self._off = True


def _already_claimed() -> None:
    """A call the ledger knows already: no approval to mark (the ledger replays it)."""


def _current_approval(approvals: Any, base: str) -> tuple[str | None, ApprovalRecord | None]:
    """The record that decides this intent's next call: the first not used up (None: not
    asked yet); ``(None, None)`` when MAX_APPROVALS_PER_INTENT were used."""
    for n in range(MAX_APPROVALS_PER_INTENT):
        record_id = base if n == 0 else f"{base}.{n}"
        record = approvals.get(record_id)
        if record is None or record.status != gov.USED:
            return record_id, record
    return None, None


class ReturnedAwaitable(TypeError):
    """A tool's plain function returned an awaitable: a mistake of the code, raised to it
    (never retried, never shown to the model), in both shells."""


def _not_awaitable(name: str, result: Any) -> Any:
    """One behaviour for both shells: a plain function that returns an awaitable is
    refused (the coroutine is closed, never started: nothing ran). Declare the tool
    ``async def`` and call it with ``await run.acall_tool(...)``."""
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # never started: nothing ran
        raise ReturnedAwaitable(
            f"tool {name!r} is a plain function that returned an awaitable: declare it "
            "`async def` and call it with `await run.acall_tool(...)`"
        )
    return result


def _paths(name: str, volatile: Any) -> tuple[str, ...]:
    """A tool's declared volatile paths, as a tuple (a single string is refused: it would
    read as its letters)."""
    if not volatile:
        return ()
    if isinstance(volatile, str):
        raise TypeError(
            f"volatile of tool {name!r} takes a list of paths, e.g. "
            f"volatile=[{volatile!r}], got the string {volatile!r}"
        )
    return tuple(volatile)


def _arguments(name: str, args: Any) -> dict[str, Any]:
    if args is None:
        return {}
    if not isinstance(args, Mapping):
        raise TypeError(
            f"args of tool {name!r} must be a mapping of argument names to values "
            f"(passed as fn(**args)), got a {type(args).__name__}: {args!r:.80}"
        )
    return dict(args)


def _aattempt_span(name: str, fn: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
    """The async form of :func:`_attempt_span`: the same spans for an awaited attempt."""
    if not telemetry.enabled():
        return fn
    attempts = [0]

    async def attempt() -> Any:
        attempts[0] += 1
        telemetry.record_attempt(name, attempts[0])
        with telemetry.span(
            "tether.attempt", **{"gen_ai.tool.name": name, "tether.attempt": attempts[0]}
        ):
            return await fn()

    return attempt


def _attempt_span(name: str, fn: Callable[[], Any]) -> Callable[[], Any]:
    """Each attempt of a tool call as a ``tether.attempt`` span (only when telemetry is on)."""
    if not telemetry.enabled():
        return fn
    attempts = [0]

    def attempt() -> Any:
        attempts[0] += 1
        telemetry.record_attempt(name, attempts[0])
        with telemetry.span(
            "tether.attempt", **{"gen_ai.tool.name": name, "tether.attempt": attempts[0]}
        ):
            return fn()

    return attempt


def _holds_placeholder(value: Any) -> bool:
    """Whether a value holds the redaction placeholder anywhere (cheap: a walk, no paths;
    at most 100,000 values are looked at, so a self-containing value cannot loop)."""
    stack = [value]
    budget = 100_000
    while stack and budget:
        budget -= 1
        item = stack.pop()
        kind = type(item)
        if kind is dict or (kind not in _SCALARS and isinstance(item, Mapping)):
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
        elif kind is str or (kind not in _SCALARS and isinstance(item, str)):
            if REDACTED in item:
                return True
        elif kind not in _SCALARS and isinstance(item, list | tuple):
            stack.extend(item)
    return False


_SCALARS = frozenset({int, float, bool, type(None)})
