"""The τ² suite's LiteLLM policies (in ``.venv-crewai``): the loop a user writes around
``litellm.acompletion``, alone (its retries as LiteLLM's docs set them) and through tether,
on the suite's scripted model and faults."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of the cost map

from tether.bench._tau import TauData, run_episode, run_tau

#: test_tau's write tasks: exchanges, returns, cancellations, item and address changes (that
#: module needs the Anthropic SDK, which this venv does not have)
WRITE_TASKS = ["0", "5", "17", "24", "60"]

POLICIES = ["litellm", "tether-litellm"]

#: LiteLLM's own types and event loops warn (pydantic's ReadOnly TypedDicts, its logging
#: worker's unclosed loops): LiteLLM's warnings, not this code's
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*ReadOnly. qualifier:UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in:pytest.PytestUnraisableExceptionWarning"
    ),
]


def test_litellm_replays_the_golden_actions_at_lambda_zero(tau_data: str) -> None:
    """No faults: LiteLLM alone and with tether pass with exactly the golden calls."""
    tau = TauData(tau_data)
    task = next(t for t in tau.tasks if t["id"] == "0")
    for policy in POLICIES:
        result = run_episode(tau, policy, task, 0.0, 0)
        assert (policy, result["reward"], result["dishonest"]) == (policy, 1, False)
        assert result["tool_executions"] == len(task["actions"])
        assert result["model_calls"] == len(task["actions"]) + 1


def test_under_faults_tether_litellm_is_right_and_honest(tau_data: str) -> None:
    """λ=0.5 on the write tasks: tether-litellm passes every trial with no duplicate effect
    and no dishonest ending; LiteLLM alone does not."""
    out = run_tau(tau_data, policies=POLICIES, lambdas=[0.5], tasks=WRITE_TASKS, seeds=2,
                  workers=1)  # fmt: skip
    cells = out["scenarios"]["retail"]["lambda"]["0.5"]["policies"]
    tethered = cells["tether-litellm"]
    assert (tethered["pass^1"], tethered["dishonest_endings"]) == (1.0, 0)
    assert tethered["duplicate_effects"] == 0
    assert cells["litellm"]["pass^1"] < 1.0
