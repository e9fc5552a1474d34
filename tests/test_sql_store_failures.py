"""Every SQL store fails closed with tether's error (on the real PostgreSQL, TETHER_PG_DSN, and
on SQLite files): a database that cannot be used now (a server gone mid-statement, read-only
after a failover, ``lock_timeout`` run out, a SQLite file locked past its timeout) is
:class:`tether.StoreUnavailable` naming the store, where it is and the SQLSTATE; a programming
error stays the driver's, with a note naming the store; a transaction the server rolled back
to keep SERIALIZABLE transactions serialisable is run again, never applied twice. (Before:
psycopg's and sqlite3's own errors escaped the documents and the SQLite ledger, and a
serialization failure in the ledger was StoreUnavailable at once.)"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import tether
from pg_sessions import with_setting
from tether import Checkpoints, Ledger, StoreUnavailable
from tether.stores._ledger_logic import Record, State

SHELLS = ["sync", "async"]


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """``fn()`` started in a thread; the box gets what it returned or raised."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, box


def _waiting_on(pg_dsn: str, holder: psycopg.Connection[Any]) -> int:
    """The backend pid of the session that waits for one of ``holder``'s locks (waited for)."""
    holder_pid = holder.info.backend_pid
    with psycopg.connect(pg_dsn, autocommit=True) as monitor:
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline:
            row = monitor.execute(
                "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                (holder_pid,),
            ).fetchone()
            if row:
                return int(row[0])
            time.sleep(0.02)
    raise AssertionError("no session waited on the holder's lock")


def _sql_read(checkpoints: Checkpoints) -> Any:
    with checkpoints.store.sql() as sql:  # type: ignore[attr-defined]
        return sql.rows(f"SELECT count(*) FROM {checkpoints.store.table}")  # type: ignore[attr-defined]


def _sql_write(checkpoints: Checkpoints) -> Any:
    with checkpoints.store.sql(write=True) as sql:  # type: ignore[attr-defined]
        return sql.run(f"DELETE FROM {checkpoints.store.table} WHERE id = ?", ["ckpt_gone"])  # type: ignore[attr-defined]


#: the documents store's operations, through the checkpoints that use them
OPS: dict[str, Callable[[Checkpoints], Any]] = {
    "put": lambda c: c.save({"run_id": "run-1"}, 1.0),
    "get": lambda c: c.load("ckpt_missing"),
    "list": lambda c: c.list(),
    "delete": lambda c: c.store.delete("checkpoint", "ckpt_missing"),
    "sql": _sql_read,
    "sql-write": _sql_write,
}
WRITES = ["put", "delete", "sql-write"]


@pytest.mark.parametrize("op", list(OPS))
def test_documents_whose_lock_times_out_are_store_unavailable(
    pg_dsn: str, table: Callable[[], str], op: str
) -> None:
    """Another session holds the documents' table while lock_timeout runs out: every
    operation is StoreUnavailable naming the documents' table, the DSN and SQLSTATE 55P03
    (before: psycopg's LockNotAvailable)."""
    name = table()
    Checkpoints.postgres(pg_dsn, table=name).close()
    holder = psycopg.connect(pg_dsn)
    holder.execute(f"LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE")
    try:
        timing_out = Checkpoints.postgres(with_setting(pg_dsn, "lock_timeout=200"), table=name)
        with timing_out, pytest.raises(StoreUnavailable) as failed:
            OPS[op](timing_out)
    finally:
        holder.rollback()
        holder.close()
    said = str(failed.value)
    assert "SQLSTATE 55P03" in said
    assert f"table {name}" in said
    assert "127.0.0.1:5432" in said
    assert tether.classify(failed.value).kind is tether.Kind.TRANSIENT


@pytest.mark.parametrize("op", list(OPS))
def test_documents_whose_server_ends_the_session_are_store_unavailable(
    pg_dsn: str, table: Callable[[], str], op: str
) -> None:
    """The server ends the store's session while its statement runs (a restart, a failover,
    pg_terminate_backend): StoreUnavailable, not psycopg's AdminShutdown / OperationalError;
    the store works again once the server does."""
    name = table()
    store = Checkpoints.postgres(pg_dsn, table=name)
    holder = psycopg.connect(pg_dsn)
    holder.execute(f"LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE")
    try:
        thread, box = _in_thread(lambda: OPS[op](store))
        pid = _waiting_on(pg_dsn, holder)
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        thread.join(30)
    finally:
        holder.rollback()
        holder.close()
    with store:
        assert isinstance(box.get("error"), StoreUnavailable), box
        assert store.list() == []  # a fresh connection of the pool


@pytest.mark.parametrize("op", WRITES)
def test_documents_on_a_read_only_database_are_store_unavailable(
    pg_dsn: str, table: Callable[[], str], op: str
) -> None:
    """The database turned read-only (a standby after a failover): a write is
    StoreUnavailable saying so, with SQLSTATE 25006 (before: ReadOnlySqlTransaction,
    classified permanent)."""
    name = table()
    Checkpoints.postgres(pg_dsn, table=name).close()
    ro = Checkpoints.postgres(with_setting(pg_dsn, "default_transaction_read_only=on"), table=name)
    with ro, pytest.raises(StoreUnavailable, match="SQLSTATE 25006") as refused:
        OPS[op](ro)
    assert "read-only" in str(refused.value)


def test_a_password_is_never_said(pg_dsn: str, table: Callable[[], str]) -> None:
    """The DSN in the error has no password (as a URL, or as keywords)."""
    name = table()
    Checkpoints.postgres(pg_dsn, table=name).close()
    ro = with_setting(
        pg_dsn.replace("postgres@", "postgres:hunter2@"), "default_transaction_read_only=on"
    )
    with Checkpoints.postgres(ro, table=name) as store, pytest.raises(StoreUnavailable) as failed:
        store.save({"run_id": "run-1"}, 1.0)
    assert "hunter2" not in str(failed.value)


def test_a_programming_error_stays_the_drivers_with_a_note(
    pg_dsn: str, table: Callable[[], str]
) -> None:
    """A table dropped under the store is a programming error: psycopg's UndefinedTable,
    permanent, with a note naming the documents' table (before: no note)."""
    name = table()
    with Checkpoints.postgres(pg_dsn, table=name) as store:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE {name}")
        with pytest.raises(psycopg.errors.UndefinedTable) as wrong:
            store.save({"run_id": "run-1"}, 1.0)
    assert any(f"table {name}" in note for note in wrong.value.__notes__)
    assert tether.classify(wrong.value).kind is tether.Kind.PERMANENT


# --- the ledger: a transaction rolled back by the server is run again ------------------------


@pytest.mark.parametrize("shell", SHELLS)
def test_a_ledger_whose_table_is_gone_raises_the_drivers_error_and_runs_nothing(
    pg_dsn: str, table: Callable[[], str], shell: str
) -> None:
    """The ledger's table dropped under it is a programming error, not an outage: psycopg's
    UndefinedTable, permanent, with a note naming the ledger; the effect does not run
    (before: StoreUnavailable, transient, retried as if the server would come back)."""
    name = table()
    ran: list[int] = []
    with Ledger.postgres(pg_dsn, table=name) as ledger:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE {name}")
        with pytest.raises(psycopg.errors.UndefinedTable) as wrong:
            _once(ledger, shell, "refund-A-1", lambda: ran.append(1))
    assert ran == []
    assert any("the ledger's PostgreSQL" in note for note in wrong.value.__notes__)
    assert tether.classify(wrong.value).kind is tether.Kind.PERMANENT


def _once(ledger: Ledger, shell: str, key: str, fn: Callable[[], Any]) -> Any:
    if shell == "sync":
        return ledger.once(key, fn)

    async def afn() -> Any:
        return fn()

    return asyncio.run(ledger.aonce(key, afn))


def _serializable(dsn: str) -> str:
    return with_setting(dsn, "default_transaction_isolation=serializable")


def _conflicting_update(pg_dsn: str, name: str) -> tuple[psycopg.Connection[Any], threading.Thread]:
    """A SERIALIZABLE transaction that updates every row of ``name`` and commits as soon as
    another session waits for its lock: that session's statement, whose snapshot is older,
    fails with SQLSTATE 40001 (could not serialize access due to concurrent update)."""
    holder = psycopg.connect(pg_dsn)
    holder.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
    holder.execute(f"UPDATE {name} SET detail = 'touched'")

    def commit_when_waited_on() -> None:
        _waiting_on(pg_dsn, holder)
        holder.commit()

    committer = threading.Thread(target=commit_when_waited_on)
    committer.start()
    return holder, committer


@pytest.mark.parametrize("shell", SHELLS)
def test_a_claim_rolled_back_by_a_serialization_failure_is_run_again(
    pg_dsn: str, table: Callable[[], str], shell: str
) -> None:
    """Under SERIALIZABLE, a concurrent transaction updates the effect's row while the claim
    waits for it: the claim fails with 40001 and is run again; the done effect is replayed,
    not run (before: StoreUnavailable at the first failure)."""
    name = table()
    with Ledger.postgres(pg_dsn, table=name) as ledger:
        ledger.once("refund-A-1", lambda: "first")
    ran: list[int] = []
    with Ledger.postgres(_serializable(pg_dsn), table=name) as ledger:
        holder, committer = _conflicting_update(pg_dsn, name)
        try:
            replayed = _once(ledger, shell, "refund-A-1", lambda: ran.append(1))
        finally:
            committer.join(30)
            holder.close()
        assert ledger.backend.rollbacks >= 1  # type: ignore[attr-defined]
    assert replayed == "first"
    assert ran == []


@pytest.mark.parametrize("shell", SHELLS)
def test_a_result_rolled_back_by_a_serialization_failure_is_recorded_once(
    pg_dsn: str, table: Callable[[], str], shell: str
) -> None:
    """The effect ran; recording its result meets a serialization failure (a concurrent
    SERIALIZABLE transaction updated the row): the result is recorded on the next attempt,
    the caller gets it, and a repeat replays it without running again (before:
    EffectNotRecorded, the outcome left unknown)."""
    name = table()
    ran: list[int] = []
    box: dict[str, Any] = {}

    def refund() -> str:
        ran.append(1)
        box["holder"], box["committer"] = _conflicting_update(pg_dsn, name)
        return "refunded"

    with Ledger.postgres(_serializable(pg_dsn), table=name) as ledger:
        try:
            first = _once(ledger, shell, "refund-A-1", refund)
        finally:
            if "committer" in box:
                box["committer"].join(30)
                box["holder"].close()
        again = _once(ledger, shell, "refund-A-1", refund)
        records = ledger.backend.records()  # type: ignore[attr-defined]
        assert ledger.backend.rollbacks >= 1  # type: ignore[attr-defined]
    assert (first, again, ran) == ("refunded", "refunded", [1])
    assert [(r.state, r.attempts) for r in records] == [(State.DONE, 1)]


def test_a_takeover_rolled_back_and_run_again_counts_one_attempt(
    pg_dsn: str, table: Callable[[], str]
) -> None:
    """A takeover of an expired claim that the server rolled back and that ran again is
    applied once: the record's attempts go 1 → 2, not 3, and the new owner holds it."""
    name = table()
    with Ledger.postgres(pg_dsn, table=name) as ledger:
        ledger.backend.claim(Record.claim_of("k", None, "crashed", 0.0, 3600.0), None)  # type: ignore[attr-defined]
    with Ledger.postgres(_serializable(pg_dsn), table=name) as ledger:
        backend: Any = ledger.backend
        holder, committer = _conflicting_update(pg_dsn, name)
        try:
            claimed, previous = backend.claim(Record.claim_of("k", None, "new", 60.0, 3600.0), None)
        finally:
            committer.join(30)
            holder.close()
        record = backend.get("k")
        assert backend.rollbacks >= 1
    assert claimed and previous is not None and previous.owner == "crashed"
    assert (record.owner, record.attempts) == ("new", 2)


@pytest.mark.parametrize(
    "error", [psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected]
)
def test_a_transaction_rolled_back_each_time_is_store_unavailable_after_three_attempts(
    pg_dsn: str, table: Callable[[], str], error: type[psycopg.Error]
) -> None:
    """A step the server rolls back every time (a serialization failure, a deadlock) is sent
    three times in all, then StoreUnavailable naming its SQLSTATE and the attempts (before:
    StoreUnavailable after one)."""
    sent: list[int] = []

    def rolled_back(conn: Any) -> None:
        sent.append(1)
        raise error("rolled back")

    ledger = Ledger.postgres(pg_dsn, table=table())
    with ledger, pytest.raises(StoreUnavailable, match=f"SQLSTATE {error.sqlstate}") as failed:
        ledger.backend._exec(rolled_back)  # type: ignore[attr-defined]
    assert len(sent) == 3
    assert "3 attempts" in str(failed.value)


# --- through a guarded run ------------------------------------------------------------------


@pytest.mark.parametrize("shell", SHELLS)
def test_a_guarded_refund_whose_result_meets_a_serialization_failure_runs_once(
    pg_dsn: str, table: Callable[[], str], shell: str
) -> None:
    """Guard(...).start().call_tool on a SERIALIZABLE ledger: the refund's result meets a
    serialization failure, is recorded on the next attempt and comes back; the refund ran
    once (before: the outcome unknown, the run stopped UNKNOWN_OUTCOME)."""
    name = table()
    paid: list[str] = []
    box: dict[str, Any] = {}

    def refund(order: str) -> str:
        paid.append(order)
        box["holder"], box["committer"] = _conflicting_update(pg_dsn, name)
        return "refunded"

    ledger = Ledger.postgres(_serializable(pg_dsn), table=name)
    guard = tether.Guard(ledger=ledger, retry=tether.RetryPolicy(max_attempts=1))
    try:
        with guard.start() as run:
            run.proceed()
            if shell == "sync":
                said = run.call_tool("refund", refund, {"order": "A-1"}, idempotent=False)
            else:
                said = asyncio.run(
                    run.acall_tool("refund", refund, {"order": "A-1"}, idempotent=False)
                )
    finally:
        if "committer" in box:
            box["committer"].join(30)
            box["holder"].close()
        ledger.close()
    assert (said, paid) == ("refunded", ["A-1"])


# --- SQLite: a file locked past the timeout -------------------------------------------------


def _locked(path: Path) -> sqlite3.Connection:
    """Another process's connection holding the file's write lock."""
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    return holder


@pytest.mark.parametrize("op", ["put", "delete", "sql-write"])
def test_sqlite_documents_locked_past_the_timeout_are_store_unavailable(
    tmp_path: Path, op: str
) -> None:
    """Another process holds the SQLite file's write lock past the store's timeout: a write is
    StoreUnavailable naming the file (before: sqlite3's OperationalError "database is
    locked")."""
    path = tmp_path / "records.db"
    with Checkpoints.sqlite(str(path)) as store:
        store.store._db.execute("PRAGMA busy_timeout = 100")  # type: ignore[attr-defined]  # not 30 s
        holder = _locked(path)
        try:
            with pytest.raises(StoreUnavailable, match="SQLITE_BUSY") as failed:
                OPS[op](store)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert store.list() == []  # the store works again
    assert str(path) in str(failed.value)


def test_sqlite_documents_read_only_are_store_unavailable(tmp_path: Path) -> None:
    """A SQLite file that may not be written: StoreUnavailable (SQLITE_READONLY); a statement
    that is wrong stays sqlite3's own, with a note."""
    path = tmp_path / "records.db"
    with Checkpoints.sqlite(str(path)) as store:
        store.store._db.execute("PRAGMA query_only = ON")  # type: ignore[attr-defined]
        with pytest.raises(StoreUnavailable, match="SQLITE_READONLY"):
            store.save({"run_id": "run-1"}, 1.0)
        with pytest.raises(sqlite3.OperationalError) as wrong, store.store.sql() as sql:  # type: ignore[attr-defined]
            sql.rows("SELECT nothing FROM nowhere")
    assert any("not retried" in note for note in wrong.value.__notes__)


def _sqlite_ledger(path: Path) -> Ledger:
    ledger = Ledger.sqlite(str(path))
    ledger.backend._db.execute("PRAGMA busy_timeout = 100")  # type: ignore[attr-defined]
    return ledger


def test_a_sqlite_ledger_opened_on_a_locked_file_is_store_unavailable(tmp_path: Path) -> None:
    """Another process holds the ledger's file past the timeout while a worker opens it:
    StoreUnavailable naming the file (before: sqlite3's DatabaseError, permanent)."""
    from tether.stores._ledger_sqlite import SqliteLedgerBackend

    path = tmp_path / "ledger.db"
    Ledger.sqlite(str(path)).close()
    holder = _locked(path)
    try:
        with pytest.raises(StoreUnavailable, match="SQLITE_BUSY") as failed:
            SqliteLedgerBackend(str(path), timeout=0.1)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert str(path) in str(failed.value)


@pytest.mark.parametrize("shell", SHELLS)
def test_a_sqlite_ledger_locked_past_the_timeout_runs_nothing(tmp_path: Path, shell: str) -> None:
    """The SQLite ledger's file locked by another process past the timeout: the claim is
    StoreUnavailable ("nothing was executed"), the effect does not run (before: sqlite3's
    OperationalError, classified permanent)."""
    path = tmp_path / "ledger.db"
    ran: list[int] = []
    with _sqlite_ledger(path) as ledger:
        holder = _locked(path)
        try:
            with pytest.raises(StoreUnavailable, match="nothing was executed"):
                _once(ledger, shell, "refund-A-1", lambda: ran.append(1))
        finally:
            holder.execute("ROLLBACK")
            holder.close()
    assert ran == []


@pytest.mark.parametrize("shell", SHELLS)
def test_a_guarded_refund_on_a_locked_sqlite_ledger_never_runs(tmp_path: Path, shell: str) -> None:
    """Through a run: the refund's claim cannot be made, the refund never runs and the model
    is told the tool is unavailable (before: "rejected", a permanent failure of the tool)."""
    path = tmp_path / "ledger.db"
    paid: list[str] = []

    def refund(order: str) -> str:
        paid.append(order)
        return "refunded"

    ledger = _sqlite_ledger(path)
    guard = tether.Guard(ledger=ledger, retry=tether.RetryPolicy(max_attempts=2, base=0.001))
    holder = _locked(path)
    try:
        with guard.start() as run:
            run.proceed()
            with pytest.raises(tether.ToolError) as told:
                if shell == "sync":
                    run.call_tool("refund", refund, {"order": "A-1"}, idempotent=False)
                else:
                    asyncio.run(
                        run.acall_tool("refund", refund, {"order": "A-1"}, idempotent=False)
                    )
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        ledger.close()
    assert paid == []
    assert told.value.cause_kind == "unavailable"


# --- budget scopes on PostgreSQL --------------------------------------------------------------


@pytest.fixture
def records_table(pg_dsn: str) -> Iterator[str]:
    """A fresh records table name; every table of it dropped after the test."""
    prefix = f"fails_{uuid.uuid4().hex[:12]}"
    yield prefix
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for (name,) in conn.execute(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE %s", [prefix + "%"]
        ).fetchall():
            conn.execute(f"DROP TABLE IF EXISTS {name}")


def _scoped_call(records: tether.Records) -> Any:
    """One model call's reservation in tenant:acme's scope."""
    run = tether.Guard(scopes=tether.BudgetScopes(records)).start("t", scopes=("tenant:acme",))
    with run:
        return run.begin_model_call(model="gpt-4o", estimated_input_tokens=10, max_output_tokens=10)


def test_scopes_on_a_read_only_database_refuse_the_call(pg_dsn: str, records_table: str) -> None:
    """The scopes' database turned read-only: the reservation is StoreUnavailable with the
    SQLSTATE and no request is sent (before: psycopg's ReadOnlySqlTransaction escaped)."""
    with tether.Records.postgres(pg_dsn, records_table) as records:
        tether.BudgetScopes(records).limit("tenant:acme", max_cost_usd=1.0)
    ro = with_setting(pg_dsn, "default_transaction_read_only=on")
    records = tether.Records.postgres(ro, records_table)
    with records, pytest.raises(StoreUnavailable, match="no request was sent") as refused:
        _scoped_call(records)
    assert "SQLSTATE 25006" in str(refused.value)


def test_a_reservation_rolled_back_by_a_serialization_failure_is_run_again(
    pg_dsn: str, records_table: str
) -> None:
    """Under SERIALIZABLE, a concurrent transaction updates the tenant's scope while the
    reservation waits for it: the reservation is rolled back (40001), run again, and the call
    goes on (before: StoreUnavailable, the call refused)."""
    with tether.Records.postgres(pg_dsn, records_table) as records:
        tether.BudgetScopes(records).limit("tenant:acme", max_cost_usd=1.0)
        scopes_table = records.scopes().scopes_table
    with tether.Records.postgres(_serializable(pg_dsn), records_table) as records:
        holder = psycopg.connect(pg_dsn)
        holder.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
        holder.execute(f"UPDATE {scopes_table} SET fields = fields")

        def commit_when_waited_on() -> None:
            _waiting_on(pg_dsn, holder)
            holder.commit()

        committer = threading.Thread(target=commit_when_waited_on)
        committer.start()
        try:
            _scoped_call(records)
        finally:
            committer.join(30)
            holder.close()


def _disk_full() -> sqlite3.OperationalError:
    """SQLite's own SQLITE_FULL ("database or disk is full"), from a database held to one page."""
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.execute("PRAGMA max_page_count = 1")
    try:
        db.execute("CREATE TABLE t (x)")
        db.execute("CREATE TABLE u (x)")
    except sqlite3.OperationalError as exc:
        assert exc.sqlite_errorname == "SQLITE_FULL"
        return exc
    finally:
        db.close()
    raise AssertionError("a one-page database took two tables")


class _FullAtCommit:
    """A SQLite connection whose first COMMIT a full disk refuses, then per ``after``:
    "sqlite rolled back" (SQLite rolled the transaction back itself: a ROLLBACK would fail
    "no transaction is active"), "rollback fails" (the transaction stays open and the
    ROLLBACK fails with sqlite3's own error, after undoing it), "open" (the ROLLBACK works)."""

    def __init__(self, db: sqlite3.Connection, after: str) -> None:
        self.db, self.after, self.commits = db, after, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)

    def execute(self, sql: str, *params: Any) -> Any:
        if sql == "COMMIT" and not self.commits:
            self.commits += 1
            if self.after == "sqlite rolled back":
                self.db.execute("ROLLBACK")
            raise _disk_full()
        if sql == "ROLLBACK" and self.after == "rollback fails":
            self.db.execute("ROLLBACK")  # then again: "no transaction is active"
        return self.db.execute(sql, *params)


@pytest.mark.parametrize("after", ["sqlite rolled back", "rollback fails"])
@pytest.mark.parametrize("shell", SHELLS)
def test_a_sqlite_ledger_whose_commit_and_rollback_fail_is_store_unavailable(
    tmp_path: Path, shell: str, after: str
) -> None:
    """A claim's COMMIT refused by a full disk, SQLite having rolled the transaction back
    itself or the ROLLBACK failing: StoreUnavailable naming SQLITE_FULL (a failed ROLLBACK
    noted on it), and the effect does not run (before: the ROLLBACK's "no transaction is
    active", SQLITE_ERROR, classified permanent)."""
    ran: list[int] = []
    with _sqlite_ledger(tmp_path / "ledger.db") as ledger:
        with pytest.raises(PermissionError):  # a FAILED record: the next claim decides on it
            _once(ledger, shell, "refund-A-1", lambda: (_ for _ in ()).throw(PermissionError()))
        backend: Any = ledger.backend
        backend._db = _FullAtCommit(backend._db, after)
        with pytest.raises(StoreUnavailable, match="SQLITE_FULL") as failed:
            _once(ledger, shell, "refund-A-1", lambda: ran.append(1))
    assert ran == []
    cause: BaseException | None = failed.value
    while cause is not None and not isinstance(cause, sqlite3.Error):
        cause = cause.__cause__
    assert cause is not None and cause.sqlite_errorname == "SQLITE_FULL"
    noted = any("ROLLBACK failed" in note for note in getattr(cause, "__notes__", ()))
    assert noted is (after == "rollback fails")


def test_a_sqlite_documents_write_whose_commit_fails_rolls_back_and_the_store_works_on(
    tmp_path: Path,
) -> None:
    """A write transaction whose COMMIT a full disk refuses is StoreUnavailable and rolled
    back: the next write works (before: the transaction stayed open, and every later write
    failed "cannot start a transaction within a transaction")."""
    with Checkpoints.sqlite(str(tmp_path / "docs.db")) as store:
        docs: Any = store.store
        real = docs._db
        docs._db = _FullAtCommit(real, "open")
        with pytest.raises(StoreUnavailable, match="SQLITE_FULL"), docs.sql(write=True) as sql:
            sql.run("CREATE TABLE lost (x)")
        assert not real.in_transaction
        with docs.sql(write=True) as sql:
            sql.run("CREATE TABLE kept (x)")
            made = sql.rows("SELECT name FROM sqlite_master WHERE name IN ('lost', 'kept')")
    assert made == [("kept",)]
