"""Governance of a tool call: the guard's policies and a person's approval, before it runs."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from tether import telemetry
from tether._errors import StoreUnavailable
from tether.effects._canonical import jsonable
from tether.records import _approvals as gov
from tether.records._approvals import ApprovalRecord, approval_id
from tether.redaction._redact import redact
from tether.run._governance import (
    ApprovalRejected,
    PolicyDenied,
    call_limits,
    check_policies,
    needs_approval,
)
from tether.run._outcome import StopReason
from tether.run._runstate import (
    RunState,
    ask_approval,
    count_call,
    decline,
)
from tether.run._tooldecisions import ToolDecisions
from tether.run._toolkit import (
    _already_claimed,
    _Call,
    _current_approval,
    _said,
)

__all__ = ["ToolGate"]

_log = logging.getLogger("tether")


class ToolGate:
    """Policies, then the approval (a part of :class:`tether.Run`'s tool pipeline)."""

    def __init__(self, state: RunState, decide: ToolDecisions) -> None:
        self.s = state
        self.decide = decide
        # the policies' per-tool limits (policies.max_calls), checked again as a call is counted
        self._limits = call_limits(state.guard._policy_calls)

    def _govern(
        self, call: _Call, requires_approval: Any, compensate: Any
    ) -> Callable[[], None] | None:
        """Policies, then the approval: either may refuse the call before anything runs.
        Returns None for a call no approval governs; else what to do once the ledger's
        claim on the call is won (mark the approval used)."""
        if compensate is not None and not callable(compensate):
            raise TypeError(f"compensate of {call.name!r} must be callable, got {compensate!r}")
        policies = self.s.guard._policy_calls
        reason = check_policies(policies, call.name, call.args, self.s) if policies else None
        if reason is not None:
            raise self._denied(call, reason)
        gate = (
            self._approval(call)
            if requires_approval is not False and needs_approval(requires_approval, call.args)
            else None  # the default, False: no approval, nothing to ask the rule
        )
        # counted as one step with its limit's check: another thread's call may have taken
        # the last one since the policies read the count
        limit = self._limits.get(call.name) if self._limits else None
        if not count_call(self.s, call.name, None if limit is None else limit.n):
            assert limit is not None
            raise self._denied(call, limit.refusal)
        return gate

    def _denied(self, call: _Call, reason: str) -> BaseException:
        """What to raise for a call a policy denied: the model reads the policy's reason."""
        said = str(redact(reason))
        _log.warning("tether: run %s: policy denied %s: %s", self.s.run_id, call.name, said)
        telemetry.add_event(
            "tether.policy_denied", **{"gen_ai.tool.name": call.name, "tether.reason": said}
        )
        return self.decide._after_failure(call, PolicyDenied(f"denied by policy: {said}"))

    def _approval(self, call: _Call) -> Callable[[], None]:
        """Let an approved call through once; stop the run for one not decided yet; give
        the model the approver's reason for a rejected one.

        An approval authorises one execution: the call runs through the ledger under its
        intent in this request, and the approval is marked used once the ledger's claim is
        won (so a worker that finds it used finds the claim too). A call the ledger already
        knows (done, failed, being done by another worker) asks no new approval: the ledger
        replays it, or says who is doing it, and nothing runs again.
        """
        approvals = self.s.guard._approvals()
        try:
            record_id, record = _current_approval(
                approvals, approval_id(self.s.run_id, call.action, self.s._request)
            )
            approved = record is not None and record.status == gov.APPROVED
            known = None if approved else self.s.guard.ledger.get(call.key)
        except Exception as exc:  # our own store failed: nothing has run
            raise StoreUnavailable(
                f"the approvals of run {self.s.run_id} could not be read ({type(exc).__name__}): "
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
            raise self.s._halt(
                StopReason.AWAITING_APPROVAL, f"{call.name} asked for approval too often"
            )
        now = self.s.clock.wall()
        if record is not None and record.status == gov.REJECTED:
            raise self._rejected(call, record)
        ask_approval(
            self.s,
            ApprovalRecord(
                record_id,
                self.s.run_id,
                call.name,
                redact(jsonable(call.args)),
                call.action,
                gov.PENDING,
                now,
                task=str(redact(self.s.task)),
            ),
        )
        raise self.s._halt(StopReason.AWAITING_APPROVAL, f"{call.name} needs a person's approval")

    def _rejected(self, call: _Call, record: ApprovalRecord) -> ApprovalRejected:
        """A decision stands: the rejected call is never asked again as a new approval, nor
        counted as a failure; the model reads the person's words, never their name. A run
        that then answers, or asks the same call again, ends ``DECLINED``."""
        why = _said(record.note) if record.note else "a person said no"
        self.s.transcript.append({"step": call.step, "tool": call.name, "ok": False,
                                  "error": "ApprovalRejected"})  # fmt: skip
        if decline(self.s, call.action, call.name, why):  # asked again after it was told
            self.s._halt(StopReason.DECLINED, f"{call.name}: rejected: {why}")  # the run ends
        return ApprovalRejected(call.name, f"rejected: {why}", cause_kind="declined")

    def _use_approval(self, approvals: Any, record: ApprovalRecord) -> None:
        """Mark an approval used: it covered this one execution (a failure to say so is
        logged; the ledger's claim is what keeps the call once)."""
        try:
            approvals.put(replace(record, status=gov.USED), self.s.clock.wall())
        except Exception as exc:
            _log.error(
                "tether: run %s: approval %s could not be marked used (%s); the ledger "
                "still runs %s once",
                self.s.run_id,
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
        return call.under(self.s.guard._policy(call.name, timeout, effect=True)), False
