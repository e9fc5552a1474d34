"""Governance: approvals before a call, policies on its arguments, compensations after.

* An **approval** covers one intent (``intent_key``: the tool and its arguments, fresh
  UUIDs aside) in one run, once. A call that needs one and has none stops the run
  ``AWAITING_APPROVAL`` before anything runs; the pending call is written beside the
  run's checkpoint, where ``guard.approve``/``guard.reject`` decide it (who, when, why)
  and a resumed run finds the decision.
* A **policy** is ``policy(tool, args) -> None | reason``; the first reason denies the
  call before the breaker, the retry and the ledger. :mod:`tether.policies` has the
  common ones.
* A **compensation** ``compensate(result)`` undoes a completed call; ``run.rollback()``
  runs them newest first, each at most once through the ledger (keyed by the original
  call's key), so a second ``rollback()``, or one in a process that resumed the run,
  finishes what is left and repeats nothing.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

from tether.effects._canonical import jsonable
from tether.run._outcome import ToolError

__all__ = [
    "ApprovalRejected",
    "CallLimit",
    "PolicyDenied",
    "call_limits",
    "check_policies",
    "needs_approval",
]

_log = logging.getLogger("tether")


class PolicyDenied(ToolError):
    """A policy refused a call before it ran; the model reads the policy's reason."""


class ApprovalRejected(ToolError):
    """A person rejected the call; the model reads why (never who), and the run ends
    ``DECLINED``."""


def needs_approval(rule: bool | Callable[[Mapping[str, Any]], bool] | None, args: Any) -> bool:
    """``requires_approval``: a bool, or a predicate of the call's arguments. A predicate
    that raises asks for approval (a rule that cannot be read is not a yes)."""
    if rule is None or rule is False:
        return False
    if rule is True:
        return True
    if not callable(rule):
        raise TypeError(
            f"requires_approval must be a bool or a predicate of the arguments, got {rule!r}"
        )
    try:
        return bool(rule(args))
    except Exception as exc:
        _log.warning("tether: requires_approval raised %s; asking for approval", type(exc).__name__)
        return True


def takes_run(policy: Callable[..., Any]) -> bool:
    """Does ``policy`` declare a ``run`` keyword (asked once, when the guard is made)?"""
    try:
        return "run" in inspect.signature(policy).parameters
    except (TypeError, ValueError):
        return False


def check_policies(
    policies: tuple[tuple[Callable[..., Any], bool], ...], tool: str, args: Any, state: Any
) -> str | None:
    """The first policy's reason to deny the call, or None. ``policies`` pairs each policy
    with whether it takes the run (the :class:`tether.Run` that owns ``state``). A policy
    that raises denies (fail closed) and is logged."""
    run = state.owner
    for policy, wants_run in policies:
        try:
            reason = policy(tool, args, run=run) if wants_run else policy(tool, args)
        except Exception as exc:
            name = getattr(policy, "__name__", type(policy).__name__)
            _log.error(
                "tether: policy %s raised %s on %s; the call is denied",
                name,
                type(exc).__name__,
                tool,
            )
            return f"the policy {name} could not decide ({type(exc).__name__})"
        if reason:
            return str(reason)
    return None


class CallLimit:
    """``policies.max_calls(tool, n)``: deny ``tool`` after ``n`` calls in one run. A policy
    like any other; the run also checks it as it counts a call let through (one step among
    the run's threads, see ``_runstate.count_call``), so that calls made from several
    threads at once cannot all pass it before one of them is counted."""

    def __init__(self, tool: str, n: int) -> None:
        self.tool = tool
        self.n = n
        self.__name__ = f"max_calls_{tool}"

    def __call__(self, name: str, args: Any, *, run: Any = None) -> str | None:
        if name != self.tool:
            return None
        if run is None:  # called outside a run: nothing to count, so not allowed
            return f"{self.tool}: its calls cannot be counted outside a run (max_calls {self.n})"
        if run._tool_counts[self.tool] >= self.n:
            return self.refusal
        return None

    @property
    def refusal(self) -> str:
        return f"{self.tool} may be called at most {self.n} times in one run"

    def __repr__(self) -> str:
        return f"max_calls({self.tool!r}, {self.n})"


def call_limits(policies: tuple[tuple[Callable[..., Any], bool], ...]) -> dict[str, CallLimit]:
    """The strictest ``max_calls`` limit of each tool among a guard's policies."""
    limits: dict[str, CallLimit] = {}
    for policy, _ in policies:
        if isinstance(policy, CallLimit):
            held = limits.get(policy.tool)
            if held is None or policy.n < held.n:
                limits[policy.tool] = policy
    return limits


class JournalEntry:
    """A completed call with a compensation, in the order calls completed (a plain slots
    class: a dataclass would compile its methods at import, see :mod:`tether._frozen`)."""

    __slots__ = ("args", "compensate", "in_ledger", "key", "result", "state", "tool")
    _FIELDS = ("tool", "args", "key", "result", "in_ledger", "compensate", "state")

    def __init__(
        self,
        tool: str,
        args: Any,
        key: str,
        result: Any,
        in_ledger: bool,
        compensate: Callable[[Any], Any] | None = None,
        state: str = "done",
    ) -> None:
        self.tool = tool
        self.args = args  # redacted in checkpoints
        self.key = key  # the original call's ledger key (or its intent, for an idempotent call)
        self.result = result
        self.in_ledger = in_ledger  # the result is the ledger's record (replayable after a restart)
        self.compensate = compensate
        self.state = state  # "done" -> "compensated" | "unknown" | "failed"

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._FIELDS)
        return f"JournalEntry({shown})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not JournalEntry or not isinstance(other, JournalEntry):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self._FIELDS)

    __hash__ = None  # type: ignore[assignment]  # mutable, as a dataclass with eq

    def to_doc(self) -> dict[str, Any]:
        from tether.redaction._redact import redact

        doc = {
            "tool": self.tool,
            "args": redact(self.args),
            "key": self.key,
            "in_ledger": self.in_ledger,
            "state": self.state,
        }
        if not self.in_ledger:  # only an idempotent call's result lives here, redacted
            doc["result"] = redact(jsonable(self.result))
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> JournalEntry:
        return cls(
            str(doc["tool"]),
            doc.get("args"),
            str(doc["key"]),
            doc.get("result"),
            bool(doc.get("in_ledger")),
            None,
            str(doc.get("state", "done")),
        )
