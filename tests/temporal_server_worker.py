"""A Temporal worker process against a real server: ``python temporal_server_worker.py``.

It polls TASK_QUEUE on the server at TEMPORAL_ADDRESS and runs the ``ChargeWorkflow``
workflow and its ``charge`` activity until it is stopped. Settings come from the
environment: DIR (tether's ledger and the provider's records, SQLite files shared by the
worker processes), GUARDED ("1": the activity under ``tether.integrations.temporal.effect``;
"0": the activity alone) and CRASH (``after_effect``: the process SIGKILLs itself once the
charge was made; ``after_record``: once tether's ledger recorded it; in both, before the
worker could report the activity's completion to the server; empty: no crash).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

import tether
from tether.integrations import temporal as tether_temporal

DIR = Path(os.environ["DIR"])
CRASH = os.environ.get("CRASH", "")
#: the price of one charge, in the provider's records and in what the workflow counts
FEE = 10


def crash(point: str) -> None:
    if point == CRASH:
        os.kill(os.getpid(), signal.SIGKILL)


def _provider() -> sqlite3.Connection:
    conn = sqlite3.connect(DIR / "provider.db", isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS charges (id INTEGER PRIMARY KEY, what TEXT, fee INT)")
    return conn


def lookup(key: str) -> dict[str, Any] | None:
    """The provider's records: was the charge made?"""
    with _provider() as conn:
        row = conn.execute("SELECT id, what, fee FROM charges").fetchone()
    return {"charge": f"ch_{row[0]}", "order": row[1], "fee": row[2]} if row else None


class _KillAfterRecord:
    """The ledger's backend, SIGKILLing the process once it recorded the charge done."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def complete(self, *args: Any) -> Any:
        verdict = self._inner.complete(*args)
        crash("after_record")
        return verdict


ledger = tether.Ledger.sqlite(str(DIR / "ledger.db"), lease=1.0, wait=3.0)
ledger.backend = _KillAfterRecord(ledger.backend)


async def charge(order: str) -> dict[str, Any]:
    """Charge the order's fee at the provider."""

    def pay() -> dict[str, Any]:
        with _provider() as conn:
            cur = conn.execute("INSERT INTO charges (what, fee) VALUES (?, ?)", (order, FEE))
        return {"charge": f"ch_{cur.lastrowid}", "order": order, "fee": FEE}

    done = await asyncio.to_thread(pay)
    crash("after_effect")
    return done


if os.environ.get("GUARDED") == "1":
    charge = tether_temporal.effect(ledger, lookup=lookup)(charge)
charge_activity = activity.defn(name="charge")(charge)


@workflow.defn(name="ChargeWorkflow")
class ChargeWorkflow:
    @workflow.run
    async def run(self, order: str) -> dict[str, Any]:
        done = await workflow.execute_activity(
            "charge",
            order,
            start_to_close_timeout=timedelta(seconds=4),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200)),
        )
        # the spend the workflow counts: the fee of each charge it was told about
        return {"charge": done, "spend_counted": done["fee"]}


async def main() -> None:
    client = await Client.connect(os.environ["TEMPORAL_ADDRESS"])
    worker = Worker(
        client,
        task_queue=os.environ["TASK_QUEUE"],
        workflows=[ChargeWorkflow],
        activities=[charge_activity],
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    print("WORKER READY", flush=True)
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main())
