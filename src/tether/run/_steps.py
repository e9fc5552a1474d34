"""The steps of a run: every budget and the no-progress detector checked before the next
one starts, and what a step says about itself (progress, the agent's state)."""

from __future__ import annotations

import hashlib
from typing import Any

from tether import telemetry
from tether.effects._canonical import canonical_json
from tether.run._outcome import StopReason
from tether.run._runstate import RunState
from tether.run._stops import STEP_CHECKS, first_stop

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
        reason = first_stop(s, STEP_CHECKS)  # every budget, as data (run/_stops.py)
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
