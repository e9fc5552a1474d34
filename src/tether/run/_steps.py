"""The steps of a run: every budget and the no-progress detector checked before the next
one starts, and what a step says about itself (progress, the agent's state)."""

from __future__ import annotations

import hashlib
from typing import Any

from tether import telemetry
from tether.effects._canonical import canonical_json
from tether.run._outcome import StopReason
from tether.run._runstate import RunState

__all__ = ["Steps"]


class Steps:
    """A run's step loop (a part of :class:`tether.Run`, given the run's state)."""

    def __init__(self, state: RunState) -> None:
        self.s = state

    def proceed(self) -> bool:
        """See :meth:`tether.Run.proceed`."""
        s = self.s
        if s._stop is not None:
            return False
        s._began = True
        if s.steps and not self._end_step():
            return False
        reason = self._budget_stop()
        if reason is not None:
            s._halt(*reason)
            return False
        s.steps += 1
        s._step_progress = False
        s._step_counted = False
        s._step_calls = 0
        if s._step_span is not None:
            telemetry.end_step(s._step_span)
        s._step_span = (  # while nothing records, a step costs one check
            telemetry.start_step(**{"tether.run_id": s.run_id, "tether.step": s.steps})
            if telemetry.enabled()
            else None
        )
        return True

    def _end_step(self) -> bool:
        """Account the step that just ended for the no-progress detector."""
        s, budget = self.s, self.s.budget
        if s._step_progress:
            s._no_progress = 0
            if budget.progress_extension and s._max_steps is not None:
                ceiling = budget.max_steps_ceiling
                extended = s._max_steps + budget.progress_extension
                s._max_steps = extended if ceiling is None else min(extended, ceiling)
        elif s._step_counted or not self._step_exempt():
            s._no_progress += 1
        limit = s.guard.loops.max_no_progress
        if limit is not None and s._no_progress >= limit and s.steps >= s.guard.loops.min_steps:
            s._halt(StopReason.NO_PROGRESS, f"{s._no_progress} steps in a row added nothing new")
            return False
        return True

    def _step_exempt(self) -> bool:
        """A step whose only tool calls were allowed repeats (polling) is not judged."""
        return self.s._step_calls > 0 and not self.s._step_counted

    def _budget_stop(self) -> tuple[StopReason, str] | None:
        s, b = self.s, self.s.budget
        if s._max_steps is not None and s.steps >= s._max_steps:
            return StopReason.MAX_STEPS, f"max steps ({s._max_steps}) reached"
        if b.max_seconds is not None and s.elapsed >= b.max_seconds:
            return (
                StopReason.TIMEOUT,
                f"time budget ({b.max_seconds:g} s) exceeded at step {s.steps}",
            )
        if b.max_model_calls is not None and s.model_calls >= b.max_model_calls:
            return StopReason.MAX_MODEL_CALLS, f"max model calls ({b.max_model_calls}) reached"
        if b.max_tokens is not None and (used := s.total_tokens) + s._last_tokens > b.max_tokens:
            return StopReason.MAX_TOKENS, (
                f"{used} tokens used; the next model call (about {s._last_tokens}) "
                f"would pass the budget of {b.max_tokens}"
            )
        if b.max_input_tokens is not None and s.input_tokens >= b.max_input_tokens:
            return StopReason.MAX_TOKENS, f"max_input_tokens ({b.max_input_tokens}) reached"
        if b.max_output_tokens is not None and s.output_tokens >= b.max_output_tokens:
            return StopReason.MAX_TOKENS, f"max_output_tokens ({b.max_output_tokens}) reached"
        if b.max_cost_usd is not None:
            nxt = self._next_cost()
            if s.cost_usd + nxt > b.max_cost_usd:
                return StopReason.MAX_COST, (
                    f"${s.cost_usd:.4f} spent; the next model call (about ${nxt:.4f}) would pass "
                    f"the budget of ${b.max_cost_usd:.4f}"
                )
        esc = s.guard.escalation
        if esc is not None and esc.max_steps is not None and s.steps >= esc.max_steps:
            s._escalate = True
            return StopReason.ESCALATED, f"step count passed {esc.max_steps}"
        return None

    def _next_cost(self) -> float:
        """The next model call's cost, extrapolated from the last two (costs tend to grow)."""
        costs = self.s._last_costs
        if not costs:
            return 0.0
        last = costs[-1]
        prev = costs[-2] if len(costs) > 1 else last
        return max(last, last + (last - prev))

    def progress(self, note: str = "") -> None:
        """Say that this step made progress (a new fact, a finished sub-goal)."""
        self.s._step_progress = True
        if note:
            self.s.transcript.append({"step": self.s.steps, "progress": note})

    def observe_state(self, state: Any) -> None:
        """Record the agent's state; raises Stopped (STATE_CYCLE) when it repeats."""
        s = self.s
        digest = hashlib.sha256(
            canonical_json(state, ignore=(), path="state").encode("ascii")
        ).hexdigest()
        if s._loops.observe_state(digest, s.steps):
            raise s._halt(StopReason.STATE_CYCLE, f"state at step {s.steps} repeats an earlier one")
        s._step_progress = True  # a state never seen before is a new fact
