"""The budgets of a run as data: one small check object per stop condition, run by one loop.

A check names its :class:`~tether.run._outcome.StopReason` (whose ``meaning`` says its family,
status, whether a person is needed and the customer's message) and, given the run's state,
says why the run must stop before its next spend, or None. :func:`first_stop` runs a list
of them in order: the step loop runs :data:`STEP_CHECKS` before each step, the tool-call
pipeline :data:`TOOL_CHECKS` before each call. A new budget is one enum member (with its
meaning) and one class here, added to the list that should run it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

from tether.run._outcome import StopReason
from tether.run._runstate import escalate

if TYPE_CHECKING:
    from tether.run._runstate import RunState

__all__ = ["STEP_CHECKS", "TOOL_CHECKS", "Check", "first_stop"]


class Check:
    """One stop condition: ``reason`` and why it holds for a run (None: it does not)."""

    reason: ClassVar[StopReason]

    def __call__(self, s: RunState) -> str | None:  # pragma: no cover - every check overrides
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reason.name})"


def first_stop(s: RunState, checks: Iterable[Check]) -> tuple[StopReason, str] | None:
    """The first check of ``checks`` that holds for the run: its reason and why."""
    for check in checks:
        detail = check(s)
        if detail is not None:
            return check.reason, detail
    return None


class MaxSteps(Check):
    reason = StopReason.MAX_STEPS

    def __call__(self, s: RunState) -> str | None:
        if s._max_steps is not None and s.steps >= s._max_steps:
            return f"max steps ({s._max_steps}) reached"
        return None


class Timeout(Check):
    reason = StopReason.TIMEOUT

    def __call__(self, s: RunState) -> str | None:
        limit = s.budget.max_seconds
        if limit is not None and s.elapsed >= limit:
            return f"time budget ({limit:g} s) exceeded at step {s.steps}"
        return None


class MaxModelCalls(Check):
    reason = StopReason.MAX_MODEL_CALLS

    def __call__(self, s: RunState) -> str | None:
        limit = s.budget.max_model_calls
        if limit is not None and s.model_calls >= limit:
            return f"max model calls ({limit}) reached"
        return None


class MaxTokens(Check):
    """The whole run's tokens with the next call's (about the last one's), and the input
    and output budgets on their own."""

    reason = StopReason.MAX_TOKENS

    def __call__(self, s: RunState) -> str | None:
        b = s.budget
        if b.max_tokens is not None and (used := s.total_tokens) + s._last_tokens > b.max_tokens:
            return (
                f"{used} tokens used; the next model call (about {s._last_tokens}) "
                f"would pass the budget of {b.max_tokens}"
            )
        if b.max_input_tokens is not None and s.input_tokens >= b.max_input_tokens:
            return f"max_input_tokens ({b.max_input_tokens}) reached"
        if b.max_output_tokens is not None and s.output_tokens >= b.max_output_tokens:
            return f"max_output_tokens ({b.max_output_tokens}) reached"
        return None


class MaxCost(Check):
    """What was spent and the next call's cost, extrapolated from the last two (costs tend
    to grow), against the cost budget. (A model turn checks its own request's worst case.)"""

    reason = StopReason.MAX_COST

    def __call__(self, s: RunState) -> str | None:
        limit = s.budget.max_cost_usd
        if limit is None:
            return None
        costs = s._last_costs
        last = costs[-1] if costs else 0.0
        nxt = max(last, last + (last - (costs[-2] if len(costs) > 1 else last)))
        if s.cost_usd + nxt > limit:
            return (
                f"${s.cost_usd:.4f} spent; the next model call (about ${nxt:.4f}) would pass "
                f"the budget of ${limit:.4f}"
            )
        return None


class EscalationSteps(Check):
    """``Escalation(max_steps=)``: past it, the run is handed to a person."""

    reason = StopReason.ESCALATED

    def __call__(self, s: RunState) -> str | None:
        esc = s.guard.escalation
        if esc is not None and esc.max_steps is not None and s.steps >= esc.max_steps:
            escalate(s)
            return f"step count passed {esc.max_steps}"
        return None


class MaxToolCalls(Check):
    reason = StopReason.MAX_TOOL_CALLS

    def __call__(self, s: RunState) -> str | None:
        limit = s.budget.max_tool_calls
        if limit is not None and s.tool_calls >= limit:
            return f"max tool calls ({limit}) reached"
        return None


#: checked before each step, in this order (the first that holds stops the run)
STEP_CHECKS: tuple[Check, ...] = (
    MaxSteps(),
    Timeout(),
    MaxModelCalls(),
    MaxTokens(),
    MaxCost(),
    EscalationSteps(),
)
#: checked before each tool call
TOOL_CHECKS: tuple[Check, ...] = (MaxToolCalls(),)
