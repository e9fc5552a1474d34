"""Stop conditions as data: every StopReason carries its meaning (family, status, person,
message), and the budgets are check objects run by one loop (run/_stops.py)."""

from __future__ import annotations

import pytest

from tether import Budget, Guard, StopReason, VirtualClock
from tether.run._outcome import MEANINGS, Family
from tether.run._stops import STEP_CHECKS, TOOL_CHECKS, Check, first_stop


def test_every_stop_reason_has_its_meaning_and_family() -> None:
    """A member without an entry in MEANINGS is a failure, never a silent default."""
    assert set(MEANINGS) == set(StopReason)
    assert {r for r in StopReason if r.family is Family.LOOP} == {
        StopReason.REPEATED_ACTION,
        StopReason.REPEATED_SEQUENCE,
        StopReason.STATE_CYCLE,
        StopReason.NO_PROGRESS,
    }
    assert {r for r in StopReason if r.family is Family.BUDGET} == {
        r for r in StopReason if r.name.startswith("MAX_") or r is StopReason.TIMEOUT
    }


def test_each_budget_check_names_its_reason_once() -> None:
    reasons = [check.reason for check in (*STEP_CHECKS, *TOOL_CHECKS)]
    assert len(reasons) == len(set(reasons))
    assert all(StopReason(r.value).family in (Family.BUDGET, Family.PERSON) for r in reasons)


@pytest.mark.parametrize(
    ("budget", "reason"),
    [
        (Budget(max_steps=1), StopReason.MAX_STEPS),
        (Budget(max_model_calls=1), StopReason.MAX_MODEL_CALLS),
        (Budget(max_tokens=100), StopReason.MAX_TOKENS),
        (Budget(max_cost_usd=0.001), StopReason.MAX_COST),
    ],
)
def test_the_step_loop_runs_the_checks(budget: Budget, reason: StopReason) -> None:
    """The checks stop the run before the next step, through ``run.proceed()``."""
    with Guard(budget=budget, clock=VirtualClock()).start() as run:
        while run.proceed():
            run.record_model_call(input_tokens=90, output_tokens=20, cost_usd=0.002)
    assert run.outcome.stopped_because is reason


def test_a_new_check_is_one_class_run_by_the_same_loop() -> None:
    """A stop condition of one's own: a class with a reason, run by ``first_stop``."""

    class MaxRetries(Check):
        reason = StopReason.MAX_STEPS

        def __call__(self, s: object) -> str | None:
            return "too many retries" if getattr(s, "retries", 0) >= 2 else None

    with Guard(clock=VirtualClock()).start() as run:
        state = run._state
        assert first_stop(state, (MaxRetries(),)) is None
        run.count_retries(2)
        assert first_stop(state, (*STEP_CHECKS, MaxRetries())) == (
            StopReason.MAX_STEPS,
            "too many retries",
        )
        assert repr(MaxRetries()) == "MaxRetries(MAX_STEPS)"
