"""The PostgreSQL stores fail closed with tether's error, never the driver's (on the real
server, TETHER_PG_DSN): a statement the server refuses is :class:`tether.StoreUnavailable`
saying what it refused, and nothing runs; tables made at the same moment by a session that
does not take tether's schema lock are found made. (Before: psycopg's own
``ReadOnlySqlTransaction``, ``UniqueViolation`` and ``LockNotAvailable`` escaped, and a
refused claim was taken for the tool's own permanent failure.)"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import tether
from pg_sessions import with_setting
from tether import Checkpoints, Ledger, StoreUnavailable
from tether.stores._schema import SCHEMA_LOCK

SHELLS = ["sync", "async"]


def once(ledger: Ledger, shell: str, key: str, fn: Callable[[], Any]) -> Any:
    if shell == "sync":
        return ledger.once(key, fn)

    async def afn() -> Any:
        return fn()

    return asyncio.run(ledger.aonce(key, afn))


@pytest.mark.parametrize("shell", SHELLS)
def test_a_claim_the_server_refuses_is_store_unavailable(
    pg_dsn: str, table: Callable[[], str], shell: str
) -> None:
    """The ledger's database turned read-only (a failover to a standby): the claim is refused;
    the effect does not run and the caller gets StoreUnavailable, a transient failure tether
    retries (before: psycopg's ReadOnlySqlTransaction, classified a permanent failure of the
    tool)."""
    name = table()
    Ledger.postgres(pg_dsn, table=name).close()  # the table exists: a warm start
    ran: list[int] = []
    ro = Ledger.postgres(with_setting(pg_dsn, "default_transaction_read_only=on"), table=name)
    with ro, pytest.raises(StoreUnavailable, match="refused the statement") as refused:
        once(ro, shell, "refund-A-1", lambda: ran.append(1))
    assert ran == []
    assert "ReadOnlySqlTransaction" in str(refused.value)
    assert "nothing was executed" in str(refused.value)
    assert tether.classify(refused.value).kind is tether.Kind.TRANSIENT


@pytest.mark.parametrize("shell", SHELLS)
def test_a_guarded_effect_on_a_refused_ledger_never_runs(
    pg_dsn: str, table: Callable[[], str], shell: str
) -> None:
    """Through a run: the refund's claim refused, the refund never runs and the model is told
    the tool is unavailable, not that it was rejected."""
    name = table()
    Ledger.postgres(pg_dsn, table=name).close()
    paid: list[str] = []

    def refund(order: str) -> str:
        paid.append(order)
        return "refunded"

    ro = Ledger.postgres(with_setting(pg_dsn, "default_transaction_read_only=on"), table=name)
    guard = tether.Guard(ledger=ro, retry=tether.RetryPolicy(max_attempts=2, base=0.001))
    with guard.start() as run:
        run.proceed()
        with pytest.raises(tether.ToolError) as told:
            if shell == "sync":
                run.call_tool("refund", refund, {"order": "A-1"}, idempotent=False)
            else:
                asyncio.run(run.acall_tool("refund", refund, {"order": "A-1"}, idempotent=False))
    ro.close()
    assert paid == []
    assert told.value.cause_kind == "unavailable"


def _made_meanwhile(pg_dsn: str, name: str, open_store: Callable[[], Any]) -> Any:
    """``open_store()`` while another session creates table ``name`` without tether's lock
    and commits it a moment later: what it returned, or raised."""
    other = psycopg.connect(pg_dsn)
    other.execute(f"CREATE TABLE {name} (key TEXT PRIMARY KEY)")
    box: dict[str, Any] = {}

    def opening() -> None:
        try:
            box["store"] = open_store()
        except BaseException as exc:
            box["store"] = exc

    opener = threading.Thread(target=opening)
    opener.start()
    time.sleep(0.5)  # its CREATE ... IF NOT EXISTS waits for the other session's
    other.commit()
    other.close()
    opener.join()
    return box["store"]


def test_a_ledger_table_made_meanwhile_by_another_session_is_found(
    pg_dsn: str, table: Callable[[], str]
) -> None:
    """Another session (an older tether in a rolling deploy, a migration) creates the ledger's
    table at the same moment, without tether's schema lock: the ledger opens (before:
    psycopg's UniqueViolation on pg_type_typname_nsp_index)."""
    name = table()
    opened = _made_meanwhile(pg_dsn, name, lambda: Ledger.postgres(pg_dsn, table=name))
    assert isinstance(opened, Ledger), opened
    opened.close()


def test_a_documents_table_made_meanwhile_by_another_session_is_found(
    pg_dsn: str, table: Callable[[], str]
) -> None:
    """The same for the documents (checkpoints, records): the store opens."""
    name = table()
    opened = _made_meanwhile(pg_dsn, name, lambda: Checkpoints.postgres(pg_dsn, table=name))
    assert isinstance(opened, Checkpoints), opened
    opened.close()


def test_a_schema_lock_that_times_out_is_store_unavailable(
    pg_dsn: str, table: Callable[[], str]
) -> None:
    """The server's lock_timeout runs out while another worker holds the schema lock: the
    documents store says so as StoreUnavailable (before: psycopg's LockNotAvailable); the
    ledger, which said the server "did not answer", says it refused."""
    holder = psycopg.connect(pg_dsn, autocommit=True)
    holder.execute("SELECT pg_advisory_lock(%s)", (SCHEMA_LOCK,))
    try:
        timing_out = with_setting(pg_dsn, "lock_timeout=200")
        with pytest.raises(StoreUnavailable, match="lock_timeout ran out") as documents:
            Checkpoints.postgres(timing_out, table=table())
        with pytest.raises(StoreUnavailable, match="lock_timeout ran out") as ledger:
            Ledger.postgres(timing_out, table=table())
    finally:
        holder.execute("SELECT pg_advisory_unlock(%s)", (SCHEMA_LOCK,))
        holder.close()
    assert "LockNotAvailable" in str(documents.value)
    assert "did not answer" not in str(ledger.value)


def test_a_claim_whose_row_lock_times_out_says_so(pg_dsn: str, table: Callable[[], str]) -> None:
    """Another worker holds the effect's row while the server's lock_timeout runs out: the
    claim is StoreUnavailable saying the server refused it (a lock), not that it did not
    answer; nothing runs."""
    name = table()
    with Ledger.postgres(pg_dsn, table=name) as ledger:
        ledger.once("refund-A-1", lambda: "first")
    holder = psycopg.connect(pg_dsn)
    holder.execute(f"SELECT key FROM {name} FOR UPDATE")
    ran: list[int] = []
    try:
        timing_out = Ledger.postgres(with_setting(pg_dsn, "lock_timeout=200"), table=name)
        with timing_out, pytest.raises(StoreUnavailable, match="refused the statement") as refused:
            timing_out.once("refund-A-1", lambda: ran.append(1))
    finally:
        holder.rollback()
        holder.close()
    assert ran == []
    assert "LockNotAvailable" in str(refused.value)
