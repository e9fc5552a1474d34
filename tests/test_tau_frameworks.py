"""The τ² suite's Google ADK and Strands policies (in ``.venv-frameworks``): each framework
alone and under tether's adapter, on the suite's scripted model and faults."""

from __future__ import annotations

from test_tau import WRITE_TASKS
from tether.bench._tau import TauData, run_episode, run_tau

FRAMEWORKS = ["adk", "tether-adk", "strands", "tether-strands"]


def test_the_frameworks_replay_the_golden_actions_at_lambda_zero(tau_data: str) -> None:
    """No faults: ADK and Strands, alone and with tether, pass with exactly the golden calls."""
    tau = TauData(tau_data)
    task = next(t for t in tau.tasks if t["id"] == "0")
    for policy in FRAMEWORKS:
        result = run_episode(tau, policy, task, 0.0, 0)
        assert (policy, result["reward"], result["dishonest"]) == (policy, 1, False)
        assert result["tool_executions"] == len(task["actions"])
        assert result["model_calls"] == len(task["actions"]) + 1


def test_under_faults_tether_adk_and_tether_strands_are_right_and_honest(tau_data: str) -> None:
    """λ=0.5 on the write tasks: tether-adk and tether-strands pass every trial with no
    duplicate effect and no dishonest ending; ADK and Strands alone do not."""
    out = run_tau(tau_data, policies=FRAMEWORKS, lambdas=[0.5], tasks=WRITE_TASKS, seeds=2,
                  workers=1)  # fmt: skip
    cells = out["scenarios"]["retail"]["lambda"]["0.5"]["policies"]
    for name in ("tether-adk", "tether-strands"):
        assert (name, cells[name]["pass^1"], cells[name]["dishonest_endings"]) == (name, 1.0, 0)
        assert cells[name]["duplicate_effects"] == 0
    for name in ("adk", "strands"):
        assert cells[name]["pass^1"] < 1.0, name
