"""PydanticAI's own DBOS durable execution (``DBOSDurability``) with tether's capability,
for real: DBOS on SQLite, the workflow's process SIGKILLed after a refund was made and
recovered by a new process (DBOS's own recovery), and a run a guard stops read back from
DBOS's records in another process. The worker is ``pydantic_dbos_worker.py``."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("dbos")
pytest.importorskip("pydantic_ai.durable_exec.dbos")

WORKER = Path(__file__).with_name("pydantic_dbos_worker.py")


def _process(mode: str, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(WORKER), mode], env=env, capture_output=True, text=True, timeout=120
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if mode == "start" and env.get("CRASH"):
        assert proc.returncode == -9 and not lines, (proc.returncode, proc.stderr[-2000:])
        return {}
    assert lines, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(lines[-1][7:])
    return result


def _env(tmp_path: Path, **settings: str) -> dict[str, str]:
    return {
        **os.environ,
        "DIR": str(tmp_path),
        "DBOS_SYSTEM_URL": f"sqlite:///{tmp_path / 'dbos.sqlite'}",
        "WORKFLOW_ID": "refund-ticket-1",
        "PYTHONWARNINGS": "ignore",
        **settings,
    }


def _refunds(tmp_path: Path) -> int:
    with sqlite3.connect(tmp_path / "provider.db") as conn:
        row = conn.execute("SELECT count(*) FROM refunds").fetchone()
    return int(row[0])


@pytest.mark.parametrize("workflow", ["agent", "run"])
def test_a_recovered_workflow_pays_once_without_a_key(tmp_path: Path, workflow: str) -> None:
    """The process dies after the refund, before the tool returns; DBOS recovers the
    workflow in a new process and runs the agent again (its model replies replayed from
    DBOS's steps, its tools not). The run serves the durable run's conversation (derived
    from the workflow id), so the ledger knows the refund: paid once (before: twice)."""
    env = _env(tmp_path, WORKFLOW=workflow, CRASH="after_effect")
    _process("start", env)
    assert _refunds(tmp_path) == 1
    result = _process("recover", env)
    assert result["workflow_status"] == "SUCCESS", result
    assert _refunds(tmp_path) == 1


def test_with_the_workflow_id_as_key(tmp_path: Path) -> None:
    env = _env(tmp_path, WORKFLOW="run", CRASH="after_effect", KEY="workflow")
    _process("start", env)
    result = _process("recover", env)
    assert result["ok"]["status"] == "success", result
    assert _refunds(tmp_path) == 1


def test_a_stopped_run_ends_with_the_customer_message(tmp_path: Path) -> None:
    """tether's run() inside the workflow (the agent carries its capability, as DBOS
    requires): the stop is the workflow's result, a SUCCESS holding the customer message
    (before: DBOS refused the run with a UserError)."""
    result = _process("start", _env(tmp_path, WORKFLOW="run", MAX_STEPS="1"))
    assert result["workflow_status"] == "SUCCESS", result
    assert result["ok"]["reason"] == "max_steps"
    assert "Done: refund completed" in result["ok"]["message"]
    assert _refunds(tmp_path) == 1


def test_run_stopped_read_back_in_another_process(tmp_path: Path) -> None:
    """agent.run() lets RunStopped out of the workflow; DBOS stores it pickled. Another
    process reading the workflow's result gets the RunStopped with its outcome (before: an
    AttributeError from rebuilding it, the customer message lost)."""
    env = _env(tmp_path, WORKFLOW="agent", MAX_STEPS="1")
    first = _process("start", env)
    assert first["workflow_status"] == "ERROR"
    result = _process("recover", env)
    assert result["workflow_status"] == "ERROR"
    assert "Done: refund completed" in result.get("stopped", ""), result
    assert _refunds(tmp_path) == 1
