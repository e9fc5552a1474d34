"""Guarded runs: budgets, loop detection and a graceful stop around an agent's loop.

A reliable agent checks every guard on every iteration, before spending the next
call; every way out of the loop returns a result, or a partial result and a reason.
The run's parts live in modules of their own: its state (``_runstate``), the tool-call
pipeline (``_toolcall``) and its ending (``_ending``); this module is its lifecycle.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from tether import telemetry
from tether.effects._canonical import canonical_json
from tether.run._ending import Ending
from tether.run._outcome import StopReason
from tether.run._pricing import UnknownModelError
from tether.run._rollback import Rollback
from tether.run._toolcall import ToolCalls

__all__ = ["Run"]

_log = logging.getLogger("tether")


class Run(ToolCalls, Rollback, Ending):
    """One guarded run of an agent; see :class:`tether.Guard`."""

    def __repr__(self) -> str:
        return (
            f"Run({self.run_id!r}, steps={self.steps}, stopped={self._stop and self._stop[0].name})"
        )

    # --- the loop ---------------------------------------------------------------------

    def proceed(self) -> bool:
        """Start the next step if every guard allows it; False once a stop condition holds."""
        if self._stop is not None:
            return False
        self._began = True
        if self.steps and not self._end_step():
            return False
        reason = self._budget_stop()
        if reason is not None:
            self._halt(*reason)
            return False
        self.steps += 1
        self._step_progress = False
        self._step_counted = False
        self._step_calls = 0
        telemetry.end_step(self._step_span)
        self._step_span = telemetry.start_step(
            **{"tether.run_id": self.run_id, "tether.step": self.steps}
        )
        return True

    def _end_step(self) -> bool:
        """Account the step that just ended for the no-progress detector."""
        if self._step_progress:
            self._no_progress = 0
            if self.budget.progress_extension and self._max_steps is not None:
                ceiling = self.budget.max_steps_ceiling
                extended = self._max_steps + self.budget.progress_extension
                self._max_steps = extended if ceiling is None else min(extended, ceiling)
        elif self._step_counted or not self._step_exempt():
            self._no_progress += 1
        limit = self.guard.loops.max_no_progress
        if (
            limit is not None
            and self._no_progress >= limit
            and self.steps >= self.guard.loops.min_steps
        ):
            self._halt(
                StopReason.NO_PROGRESS, f"{self._no_progress} steps in a row added nothing new"
            )
            return False
        return True

    def _step_exempt(self) -> bool:
        """A step whose only tool calls were allowed repeats (polling) is not judged."""
        return self._step_calls > 0 and not self._step_counted

    def _budget_stop(self) -> tuple[StopReason, str] | None:
        b = self.budget
        if self._max_steps is not None and self.steps >= self._max_steps:
            return StopReason.MAX_STEPS, f"max steps ({self._max_steps}) reached"
        if b.max_seconds is not None and self.elapsed >= b.max_seconds:
            return (
                StopReason.TIMEOUT,
                f"time budget ({b.max_seconds:g} s) exceeded at step {self.steps}",
            )
        if b.max_model_calls is not None and self.model_calls >= b.max_model_calls:
            return StopReason.MAX_MODEL_CALLS, f"max model calls ({b.max_model_calls}) reached"
        if b.max_tokens is not None and self.total_tokens + self._last_tokens > b.max_tokens:
            return StopReason.MAX_TOKENS, (
                f"{self.total_tokens} tokens used; the next model call (about {self._last_tokens}) "
                f"would pass the budget of {b.max_tokens}"
            )
        for name, used in (
            ("max_input_tokens", self.input_tokens),
            ("max_output_tokens", self.output_tokens),
        ):
            limit = getattr(b, name)
            if limit is not None and used >= limit:
                return StopReason.MAX_TOKENS, f"{name} ({limit}) reached"
        if b.max_cost_usd is not None:
            nxt = self._next_cost()
            if self.cost_usd + nxt > b.max_cost_usd:
                return StopReason.MAX_COST, (
                    f"${self.cost_usd:.4f} spent; the next model call (about ${nxt:.4f}) would pass "
                    f"the budget of ${b.max_cost_usd:.4f}"
                )
        esc = self.guard.escalation
        if esc is not None and esc.max_steps is not None and self.steps >= esc.max_steps:
            self._escalate = True
            return StopReason.ESCALATED, f"step count passed {esc.max_steps}"
        return None

    def _next_cost(self) -> float:
        """The next model call's cost, extrapolated from the last two (costs tend to grow)."""
        if not self._last_costs:
            return 0.0
        last = self._last_costs[-1]
        prev = self._last_costs[-2] if len(self._last_costs) > 1 else last
        return max(last, last + (last - prev))

    def record_model_call(
        self,
        *,
        input_tokens: int = 0,
        output_tokens: int = 0,
        model: str = "",
        cache_write_tokens: int = 0,
        cache_read_tokens: int = 0,
        cost_usd: float | None = None,
        provider: str | None = None,
        unmeasured: bool = False,
    ) -> float | None:
        """Count one model call's usage and cost; returns the cost in USD (None: unknown).

        The cost comes from ``cost_usd`` or the guard's prices for ``model``; a model
        with no price has its tokens counted and its cost unknown
        (``Usage.unpriced_calls``). Under a cost budget that raises
        :class:`tether.UnknownModelError` (call :meth:`check_model` before the request
        to refuse it before paying). ``unmeasured=True`` says the provider reported no
        token counts for the call: its cost is unknown too, never zero.
        """
        counts = {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cache_write_tokens": cache_write_tokens,
            "cache_read_tokens": cache_read_tokens,
        }
        for name, value in counts.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        self._tokens.settle(model, input_tokens + cache_write_tokens, output_tokens)
        if unmeasured:
            cost_usd = None
        elif cost_usd is None:
            if model:
                cost_usd = self.guard.prices.cost(
                    model,
                    input_tokens,
                    output_tokens,
                    cache_write_tokens,
                    cache_read_tokens,
                    provider=provider,
                )
            elif self.budget.max_cost_usd is not None and (input_tokens or output_tokens):
                raise ValueError(
                    "a cost budget is set: pass model= (priced from the table) or cost_usd="
                )
            else:
                cost_usd = 0.0
        self.model_calls += 1
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.cache_write_tokens += cache_write_tokens
        self.cache_read_tokens += cache_read_tokens
        if cost_usd is None:
            self.unpriced_calls += 1
        else:
            self.cost_usd += cost_usd
            self._last_costs = [*self._last_costs[-1:], cost_usd]
        self._last_tokens = input_tokens + output_tokens + cache_write_tokens + cache_read_tokens
        telemetry.add_event(
            "gen_ai.client.inference",
            **{
                "gen_ai.request.model": model or None,
                "gen_ai.usage.input_tokens": input_tokens,
                "gen_ai.usage.output_tokens": output_tokens,
                "tether.cost_usd": cost_usd,
            },
        )
        self.transcript.append(
            {
                "step": self.steps,
                "model": model,
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "cost_usd": cost_usd,
            }
        )
        if cost_usd is None and self.budget.max_cost_usd is not None:
            why = (
                "the provider reported no token counts for this call"
                if unmeasured
                else (self.guard.prices.missing(model))
            )
            raise UnknownModelError(f"{why}; the cost budget cannot count this call")
        return cost_usd

    def progress(self, note: str = "") -> None:
        """Say that this step made progress (a new fact, a finished sub-goal)."""
        self._step_progress = True
        if note:
            self.transcript.append({"step": self.steps, "progress": note})

    def observe_state(self, state: Any) -> None:
        """Record the agent's state; raises Stopped (STATE_CYCLE) when it repeats."""
        digest = hashlib.sha256(
            canonical_json(state, ignore=(), path="state").encode("ascii")
        ).hexdigest()
        if self._loops.observe_state(digest, self.steps):
            raise self._halt(
                StopReason.STATE_CYCLE, f"state at step {self.steps} repeats an earlier one"
            )
        self._step_progress = True  # a state never seen before is a new fact

    def succeed(self, result: Any = None) -> None:
        """The goal is reached: record the result; proceed() returns False from now on."""
        self._result = result
        if self._stop is None or self._stop[0] is not StopReason.GOAL_REACHED:
            self._stop = None
            self._halt(StopReason.GOAL_REACHED)

    def stop(self, reason: StopReason, detail: str = "") -> None:
        """End the run now for ``reason``; raises Stopped (swallowed by the with-block)."""
        raise self._halt(reason, detail)

    def fail(self, reason: str = "") -> None:
        """End the run as failed, for a reason the agent's code knows (raises Stopped,
        swallowed by the with-block); the outcome's status is "failed"."""
        raise self._halt(StopReason.FAILED, reason or "the agent's code gave up")

    def escalate(self, detail: str = "") -> None:
        """Hand the run to a person now; raises Stopped (swallowed by the with-block)."""
        self._escalate = True
        raise self._halt(StopReason.ESCALATED, detail or "escalated by the agent's code")
