"""One attempt of a Temporal activity, in a process of its own: ``python temporal_worker.py N``.

The activity runs in ``temporalio.testing.ActivityEnvironment`` (a real activity context)
as attempt N of one scheduled activity (the same workflow, run and activity ids), with
tether's ledger on PostgreSQL. Settings come from the environment: TETHER_PG_DSN, TABLE,
GUARDED ("1": under ``tether.integrations.temporal.effect``; "0": the activity alone),
LOOKUP, ASYNC and CRASH (``before_effect``, ``after_effect``, ``after_record``: where the
first attempt SIGKILLs its process, before it could report to Temporal). It prints what the
attempt reported as JSON: its result, or the error Temporal would see.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import sys
from typing import Any

import psycopg
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import tether
from tether.integrations import temporal as tether_temporal

DSN = os.environ["TETHER_PG_DSN"]
TABLE = os.environ["TABLE"]
CRASH = os.environ.get("CRASH", "")
ATTEMPT = int(sys.argv[1])


def crash(point: str) -> None:
    if point == CRASH and ATTEMPT == 1:
        os.kill(os.getpid(), signal.SIGKILL)


def execute(sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(DSN, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


class _KillAfterRecord:
    """The ledger's backend, SIGKILLing the process once it recorded the effect done."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def complete(self, *args: Any) -> Any:
        verdict = self._inner.complete(*args)
        crash("after_record")
        return verdict


ledger = tether.Ledger.postgres(DSN, table=f"{TABLE}_ledger", lease=1.0, wait=5.0)
ledger.backend = _KillAfterRecord(ledger.backend)


def charge_body(order: str, amount: int) -> dict[str, Any]:
    crash("before_effect")
    execute(f"INSERT INTO {TABLE}_effects (what) VALUES (%s)", order)
    crash("after_effect")
    return {"charge": f"ch_{order}", "amount": amount}


def lookup(key: str) -> dict[str, Any] | None:
    rows = execute(f"SELECT what FROM {TABLE}_effects")
    return {"charge": f"ch_{rows[0][0]}", "amount": 10, "found": True} if rows else None


def make() -> Any:
    if os.environ.get("ASYNC") == "1":

        async def charge(order: str, amount: int) -> dict[str, Any]:
            return await asyncio.to_thread(charge_body, order, amount)

    else:

        def charge(order: str, amount: int) -> dict[str, Any]:
            return charge_body(order, amount)

    if os.environ.get("GUARDED") == "1":
        found = lookup if os.environ.get("LOOKUP") == "1" else None
        charge = tether_temporal.effect(ledger, lookup=found)(charge)
    return activity.defn(name="charge")(charge)


def main() -> None:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, workflow_id=f"order-{TABLE}", workflow_run_id="run-1",
                                   activity_id="1", activity_type="charge", attempt=ATTEMPT)  # fmt: skip
    charge = make()
    try:
        result = env.run(charge, "A-1", 10)
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
        report: dict[str, Any] = {"ok": result}
    except ApplicationError as exc:
        report = {"error": exc.type, "non_retryable": exc.non_retryable}
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
