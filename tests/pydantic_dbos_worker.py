"""A DBOS application process running a PydanticAI agent made durable by PydanticAI's own
``DBOSDurability``, under tether: ``python pydantic_dbos_worker.py start|recover``.

Settings come from the environment: DBOS_SYSTEM_URL (DBOS's system database), DIR (a
directory for tether's ledger and the provider's records, SQLite files shared by the
processes), WORKFLOW (``run``: tether's run(); ``agent``: agent.run()), WORKFLOW_ID, KEY (``workflow``: the run is given ``key=`` the workflow id;
empty: no key), MAX_STEPS (the guard's step limit) and CRASH (``after_effect``: the
starting process SIGKILLs itself once the refund was made, before the tool returns;
empty: no crash). ``start`` runs the workflow; ``recover`` launches DBOS, which recovers
the workflow the killed process left (or reads the result of the one that ended). Each prints the workflow's result as JSON.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

from dbos import DBOS, DBOSConfig, SetWorkflowID
from pydantic_ai import Agent
from pydantic_ai.durable_exec.dbos import DBOSDurability
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import tether
from tether.integrations import pydantic_ai as ta

DIR = Path(os.environ["DIR"])
CRASH = os.environ.get("CRASH", "")
KEY = os.environ.get("KEY", "")
WORKFLOW_ID = os.environ["WORKFLOW_ID"]
STARTING = sys.argv[1:2] == ["start"]  # only the first process crashes

DBOS(
    config=DBOSConfig(
        name="tether-pydantic-dbos",
        system_database_url=os.environ["DBOS_SYSTEM_URL"],
        run_admin_server=False,
        enable_otlp=False,
    )
)


def _provider() -> sqlite3.Connection:
    conn = sqlite3.connect(DIR / "provider.db", isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS refunds (id INTEGER PRIMARY KEY, order_id TEXT)")
    return conn


def refund_lookup(key: str) -> dict[str, Any] | None:
    """The provider's records: was a refund made?"""
    with _provider() as conn:
        row = conn.execute("SELECT id, order_id FROM refunds").fetchone()
    return {"refund": f"re_{row[0]}", "order": row[1]} if row else None


ledger = tether.Ledger.sqlite(str(DIR / "ledger.db"), lease=1.0, wait=3.0)
guard = tether.Guard(
    budget=tether.Budget(max_steps=int(os.environ.get("MAX_STEPS", "10"))),
    ledger=ledger,
)


#: tether's capability is the agent's own (DBOS refuses a capability added per run): one
#: instance serves every run of the agent
tether_capability = ta.TetherCapability(
    guard, {"issue_refund": refund_lookup}, labels={"issue_refund": "refund"}
)
agent = Agent(
    FunctionModel(lambda messages, info: _reply(messages, info)),
    name="refunder",
    capabilities=[tether_capability, DBOSDurability()],
)


def _reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The model: ask for the refund of A-1, then say it is done."""
    returned = any(getattr(p, "part_kind", "") == "tool-return" for m in messages for p in m.parts)
    if returned:
        return ModelResponse(parts=[TextPart("Your refund of order A-1 is on its way.")])
    return ModelResponse(parts=[ToolCallPart("issue_refund", {"order": "A-1"})])


def issue_refund(order: str) -> dict[str, Any]:
    """Refund an order."""
    with _provider() as conn:
        cur = conn.execute("INSERT INTO refunds (order_id) VALUES (?)", (order,))
        refund = {"refund": f"re_{cur.lastrowid}", "order": order}
    if CRASH == "after_effect" and STARTING:
        os.kill(os.getpid(), signal.SIGKILL)
    return refund


agent.tool_plain(issue_refund)


@DBOS.workflow()
async def refund_workflow(prompt: str) -> dict[str, Any]:
    """The guarded run through tether's run(): its outcome, stopped or not."""
    outcome = await ta.run(
        agent, prompt, guard=guard, key=DBOS.workflow_id if KEY == "workflow" else None
    )
    return {
        "status": str(outcome.status),
        "reason": outcome.stopped_because.value,
        "result": outcome.result,
        "message": outcome.customer_message,
        "tool_calls": outcome.usage.tool_calls,
    }


@DBOS.workflow()
async def plain_workflow(prompt: str) -> str:
    """agent.run() itself: a run a guard stops raises RunStopped out of the workflow."""
    result = await agent.run(prompt)
    return str(result.output)


WORKFLOWS = {"run": refund_workflow, "agent": plain_workflow}


def main() -> None:
    DBOS.launch()
    try:
        if sys.argv[1] == "start":
            with SetWorkflowID(WORKFLOW_ID):
                workflow = WORKFLOWS[os.environ.get("WORKFLOW", "run")]
                handle = DBOS.start_workflow(workflow, "Please refund order A-1")
        else:
            handle = DBOS.retrieve_workflow(WORKFLOW_ID)
        try:
            result: Any = {"ok": handle.get_result()}
        except ta.RunStopped as stopped:  # it came back whole from DBOS's records
            result = {"stopped": stopped.outcome.customer_message}
        except Exception as exc:
            result = {"error": type(exc).__name__, "message": str(exc)}
        result["workflow_status"] = handle.get_status().status
        print("RESULT " + json.dumps(result, default=str), flush=True)
    finally:
        DBOS.destroy(workflow_completion_timeout_sec=0)


if __name__ == "__main__":
    main()
