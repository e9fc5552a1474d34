"""The τ² suite's CrewAI policies (in ``.venv-crewai``): a crew alone and under
``TetherCrew``, on the suite's scripted model and faults."""

from __future__ import annotations

import warnings

import pytest

with warnings.catch_warnings():  # crewai's lazy imports warn on import (ImportWarning)
    warnings.simplefilter("ignore", ImportWarning)
    import crewai  # noqa: F401 - missing: a failure, never a skip
from tether.bench._tau import TauData, run_episode, run_tau

POLICIES = ["crewai", "tether-crewai"]
#: test_tau's write tasks (exchanges, returns, cancellations, item and address changes):
#: that module needs the Anthropic SDK, which this venv does not have
WRITE_TASKS = ["0", "5", "17", "24", "60"]

#: CrewAI's own Agent reads the fields it deprecates on every Agent built
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_crewai_replays_the_golden_actions_at_lambda_zero(tau_data: str) -> None:
    """No faults: the crew, alone and with tether, passes with exactly the golden calls."""
    tau = TauData(tau_data)
    task = next(t for t in tau.tasks if t["id"] == "0")
    for policy in POLICIES:
        result = run_episode(tau, policy, task, 0.0, 0)
        assert (policy, result["reward"], result["dishonest"]) == (policy, 1, False)
        assert result["tool_executions"] == len(task["actions"])
        assert result["model_calls"] == len(task["actions"]) + 1


def test_under_faults_tether_crewai_is_right_and_honest(tau_data: str) -> None:
    """λ=0.5 on the write tasks: tether-crewai passes every trial with no duplicate effect
    and no dishonest ending; CrewAI alone does not."""
    out = run_tau(tau_data, policies=POLICIES, lambdas=[0.5], tasks=WRITE_TASKS, seeds=2,
                  workers=1)  # fmt: skip
    cells = out["scenarios"]["retail"]["lambda"]["0.5"]["policies"]
    mine = cells["tether-crewai"]
    assert (mine["pass^1"], mine["dishonest_endings"], mine["duplicate_effects"]) == (1.0, 0, 0)
    assert cells["crewai"]["pass^1"] < 1.0
