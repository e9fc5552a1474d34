"""The steps of a run: every budget and the no-progress detector checked before the next
one starts, and what a step says about itself (progress, the agent's state)."""

from __future__ import annotations

from typing import Any

from tether import _digest
from tether.effects._canonical import canonical_json
from tether.run._outcome import StopReason
from tether.run._runstate import (
    RunState,
    begin,
    count_step,
    end_step,
    progressed,
)
from tether.run._stops import STEP_CHECKS, first_stop

__all__ = ["Steps"]


class Steps:
    """A run's step loop (a part of :class:`tether.Run`, given the run's state)."""

    def __init__(self, state: RunState) -> None:
        self.s = state

    def proceed(self) -> bool:
        """See :meth:`tether.Run.proceed`."""
        s = self.s
        if begin(s) is not None:  # stopped
            return False
        if s.steps:  # the step that ended, for the no-progress detector
            reason = end_step(s)
            if reason is not None:
                s._halt(*reason)
                return False
        reason = first_stop(s, STEP_CHECKS)  # every budget, as data (run/_stops.py)
        if reason is not None:
            s._halt(*reason)
            return False
        count_step(s)
        return True

    def progress(self, note: str = "") -> None:
        """Say that this step made progress (a new fact, a finished sub-goal)."""
        progressed(self.s)
        if note:
            self.s.transcript.append({"step": self.s.steps, "progress": note})

    def observe_state(self, state: Any) -> None:
        """Record the agent's state; raises Stopped (STATE_CYCLE) when it repeats."""
        s = self.s
        text = canonical_json(state, ignore=(), path="state")
        digest = _digest.sha256(text.encode("ascii")).hexdigest()
        if s._loops.observe_state(digest, s.steps):
            raise s._halt(StopReason.STATE_CYCLE, f"state at step {s.steps} repeats an earlier one")
        progressed(s)  # a state never seen before is a new fact
