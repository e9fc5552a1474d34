"""A DBOS application process for the crash tests: ``python dbos_worker.py start|recover``.

Settings come from the environment: DBOS_SYSTEM_URL (DBOS's system database),
TETHER_PG_DSN (effects, the provider's records and tether's ledger), TABLE (this test's
table prefix), WORKFLOW (the workflow to run), WORKFLOW_ID and CRASH (where the process
SIGKILLs itself: ``before_effect``, ``after_effect``, ``after_record_<n>`` (after the
ledger's n-th record), ``after_model_<turn>``;
empty: no crash). ``start`` runs the workflow; ``recover`` launches DBOS, which recovers
the workflow the killed process left, and prints its result as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

import psycopg
from dbos import DBOS, DBOSConfig, SetWorkflowID

import tether
from tether.integrations import dbos as tether_dbos

DSN = os.environ["TETHER_PG_DSN"]
TABLE = os.environ["TABLE"]
CRASH = os.environ.get("CRASH", "")
WORKFLOW = os.environ["WORKFLOW"]
WORKFLOW_ID = os.environ["WORKFLOW_ID"]
LOOKUP = os.environ.get("LOOKUP", "1") == "1"
STARTING = sys.argv[1:2] == ["start"]  # only the first process crashes; the recovering one never
_records = [0]

config: DBOSConfig = {
    "name": "tether-crash-test",
    "system_database_url": os.environ["DBOS_SYSTEM_URL"],
    "run_admin_server": False,
    "enable_otlp": False,
    "notification_listener_polling_interval_sec": 0.05,
}
DBOS(config=config)


def execute(sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(DSN, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def crash(point: str) -> None:
    if point == CRASH and STARTING:
        os.kill(os.getpid(), signal.SIGKILL)


class _KillAfterRecord:
    """The ledger's backend, SIGKILLing the process once it recorded an effect done:
    after tether's record, before DBOS's checkpoint."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def complete(self, *args: Any) -> Any:
        verdict = self._inner.complete(*args)
        _records[0] += 1
        crash(f"after_record_{_records[0]}")
        return verdict


ledger = tether.Ledger.postgres(DSN, table=f"{TABLE}_ledger", lease=1.0, wait=8.0)
ledger.backend = _KillAfterRecord(ledger.backend)


def refund_effect(order: str, amount: int) -> dict[str, Any]:
    """The provider: one row per refund it made."""
    crash("before_effect")
    execute(
        f"INSERT INTO {TABLE}_effects (kind, what, pid) VALUES ('refund', %s, %s)",
        order,
        os.getpid(),
    )
    crash("after_effect")
    return {"refund": f"re_{order}", "amount": amount}


def lookup_refund(key: str) -> dict[str, Any] | None:
    """The provider's records: was the refund made?"""
    rows = execute(f"SELECT what FROM {TABLE}_effects WHERE kind = 'refund'")
    return {"refund": f"re_{rows[0][0]}", "amount": 10, "found": True} if rows else None


# --- the engine alone, and a tether step -----------------------------------------------


@DBOS.step()
def plain_refund(order: str, amount: int) -> dict[str, Any]:
    return refund_effect(order, amount)


@tether_dbos.step(ledger, lookup=lookup_refund if LOOKUP else None)
def guarded_refund(order: str, amount: int) -> dict[str, Any]:
    return refund_effect(order, amount)


@DBOS.workflow()
def engine_workflow(order: str) -> dict[str, Any]:
    return plain_refund(order, 10)


@DBOS.workflow()
def tether_workflow(order: str) -> dict[str, Any]:
    return guarded_refund(order, 10)


@tether_dbos.step(ledger, lookup=lookup_refund if LOOKUP else None, name="guarded_refund")
async def aguarded_refund(order: str, amount: int) -> dict[str, Any]:
    return await asyncio.to_thread(refund_effect, order, amount)


@DBOS.workflow()
async def atether_workflow(order: str) -> dict[str, Any]:
    return await aguarded_refund(order, 10)


# --- a guarded run: two model calls and a refund ----------------------------------------


def model_reply(turn: int, prompt: str) -> dict[str, Any]:
    """The model provider: one row per paid call."""
    execute(
        f"INSERT INTO {TABLE}_effects (kind, what, pid) VALUES ('model', %s, %s)",
        str(turn),
        os.getpid(),
    )
    crash(f"after_model_{turn}")
    return {
        "text": "refund A-1" if turn == 0 else "done",
        "input_tokens": 1000,
        "output_tokens": 100,
    }


@tether_dbos.step(ledger, lookup=lambda key: None)  # a lost reply is asked again
def ask_model(turn: int, prompt: str) -> dict[str, Any]:
    return model_reply(turn, prompt)


@DBOS.step()
def plain_ask_model(turn: int, prompt: str) -> dict[str, Any]:
    return model_reply(turn, prompt)


guard = tether.Guard(
    budget=tether.Budget(max_steps=10, max_cost_usd=1.0),
    ledger=ledger,
    records=tether.Records.postgres(DSN, table=f"{TABLE}_records"),
)


def agent(run: tether.Run) -> None:
    while run.proceed():
        reply = ask_model(run.model_calls, "refund order A-1")
        run.record_model_call(
            input_tokens=reply["input_tokens"],
            output_tokens=reply["output_tokens"],
            model="scripted",
            cost_usd=0.01,
        )
        if reply["text"] == "done":
            run.succeed("refunded A-1")
        else:
            run.call_tool(
                "refund",
                refund_effect,
                {"order": "A-1", "amount": 10},
                idempotent=False,
                lookup=lookup_refund if LOOKUP else None,
                label="refund",
            )


def outcome_doc(outcome: tether.Outcome) -> dict[str, Any]:
    return {
        "status": outcome.status,
        "reason": outcome.stopped_because.value,
        "result": outcome.result,
        "model_calls": outcome.usage.model_calls,
        "tool_calls": outcome.usage.tool_calls,
        "cost_usd": outcome.usage.cost_usd,
        "message": outcome.customer_message,
        "open_issues": list(outcome.open_issues),
        "run_id": outcome.run_id,
    }


@DBOS.workflow()
def run_workflow(order: str) -> dict[str, Any]:
    return outcome_doc(tether_dbos.run(guard, agent, task=f"refund {order}"))


@DBOS.workflow()
def engine_run_workflow(order: str) -> dict[str, Any]:
    """The same agent with DBOS alone: its model calls and the refund are plain steps."""
    calls, cost, refunded = 0, 0.0, None
    for turn in range(10):
        reply = plain_ask_model(turn, "refund order A-1")
        calls, cost = calls + 1, cost + 0.01
        if reply["text"] == "done":
            break
        refunded = plain_refund(order, 10)
    return {
        "status": "success",
        "model_calls": calls,
        "cost_usd": round(cost, 10),
        "result": refunded,
    }


def approval_agent(run: tether.Run) -> None:
    while run.proceed():
        refund = run.call_tool(
            "refund",
            refund_effect,
            {"order": "A-1", "amount": 10},
            idempotent=False,
            requires_approval=True,
            lookup=lookup_refund,
            label="refund",
        )
        run.succeed(refund)


@DBOS.workflow()
def approval_workflow(order: str) -> dict[str, Any]:
    return outcome_doc(
        tether_dbos.run(guard, approval_agent, task=f"refund {order}", approval_poll=0.2)
    )


WORKFLOWS = {
    "engine": engine_workflow,
    "tether": tether_workflow,
    "atether": atether_workflow,
    "approval": approval_workflow,
    "run": run_workflow,
    "engine_run": engine_run_workflow,
}


def main() -> None:
    mode = sys.argv[1]
    DBOS.launch()
    try:
        if mode == "start":
            with SetWorkflowID(WORKFLOW_ID):
                handle = DBOS.start_workflow(WORKFLOWS[WORKFLOW], "A-1")
        else:
            handle = DBOS.retrieve_workflow(WORKFLOW_ID)
        try:
            result: Any = {"ok": handle.get_result()}
        except Exception as exc:
            result = {"error": type(exc).__name__, "message": str(exc)}
        print("RESULT " + json.dumps(result, default=str), flush=True)
    finally:
        DBOS.destroy(workflow_completion_timeout_sec=0)


if __name__ == "__main__":
    main()
