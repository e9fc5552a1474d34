"""A fleet starting cold: workers that open the same store at the same moment on a fresh
database all start (PostgreSQL's ``CREATE TABLE IF NOT EXISTS`` raced: UniqueViolation on
``pg_type_typname_nsp_index``); the tables made by one of them under an advisory lock, and
a warm start takes no lock. Every PostgreSQL store, and SQLite's on one new file (its
switch to WAL mode refused now and then: "database is locked")."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

import tether
from tether.effects._ledger import Ledger
from tether.stores._documents import PostgresDocuments
from tether.stores._schema import SCHEMA_LOCK

WORKERS = 8
TRIALS = 3


def fresh_schema(pg_dsn: str, **options: str) -> tuple[str, Callable[[], None]]:
    """A new, empty PostgreSQL schema: a DSN whose sessions use it, and its dropping."""
    import psycopg

    name = f"t_cold_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    settings = " ".join(f"-c{k}={v}" for k, v in {"search_path": name, **options}.items())
    dsn = f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}options={quote(settings)}"

    def drop() -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")

    return dsn, drop


def _records_with_scopes(where: str) -> Any:
    records = tether.Records.open(where)
    records.scopes()
    records.ledger()  # what a Guard given the records uses
    return records


#: each store as a fleet's worker opens it (a DSN or a SQLite path in, something to close out)
OPENERS: dict[str, Callable[[str], Any]] = {
    "ledger": lambda where: Ledger.postgres(where),
    "replays ledger": lambda where: Ledger.postgres(where, table="tether_replays"),
    "documents": lambda where: PostgresDocuments(where),
    "records": lambda where: tether.Records.open(where),
    "records, scopes and ledger": _records_with_scopes,
    "guard with records": lambda where: _guarded(where),
}


def _guarded(where: str) -> Any:
    records = tether.Records.open(where)
    tether.Guard(records=records)
    return records


def at_once(open_store: Callable[[str], Any], where: str) -> list[BaseException]:
    """``WORKERS`` threads open the store at ``where`` at the same moment; what they raised."""
    barrier = threading.Barrier(WORKERS, timeout=60)
    errors: list[BaseException] = []
    opened: list[Any] = []

    def worker() -> None:
        barrier.wait()
        try:
            opened.append(open_store(where))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for store in opened:
        store.close()
    return errors


@pytest.mark.parametrize("store", OPENERS)
def test_workers_opening_a_fresh_postgres_database_at_once_all_start(
    pg_dsn: str, store: str
) -> None:
    """8 workers open the store on a fresh schema at the same moment: none fails (3 trials)."""
    failed = []
    for _ in range(TRIALS):
        dsn, drop = fresh_schema(pg_dsn)
        try:
            errors = at_once(OPENERS[store], dsn)
            failed += [f"{type(e).__name__}: {e}" for e in errors]
        finally:
            drop()
    assert failed == []


@pytest.mark.parametrize("store", ["records, scopes and ledger", "guard with records"])
def test_workers_opening_a_fresh_sqlite_file_at_once_all_start(tmp_path: Path, store: str) -> None:
    """8 workers (connections of their own) open one new SQLite file at once: none fails
    (switching the file to WAL mode was refused now and then: "database is locked")."""
    for trial in range(10 * TRIALS):
        path = str(tmp_path / f"cold{trial}.db")
        assert at_once(OPENERS[store], path) == []


@pytest.fixture
def warm(pg_dsn: str) -> Iterator[str]:
    """A schema whose tables exist, and a DSN for it whose sessions wait for no lock (a
    lock not granted at once is an error)."""
    dsn, drop = fresh_schema(pg_dsn, lock_timeout="100")
    try:
        _records_with_scopes(dsn).close()
        Ledger.postgres(dsn, table="tether_replays").close()
        yield dsn
    finally:
        drop()


@pytest.mark.parametrize("store", OPENERS)
def test_a_warm_start_takes_no_lock(pg_dsn: str, warm: str, store: str) -> None:
    """The tables there: a store opens while another session holds the schema lock."""
    import psycopg

    with psycopg.connect(pg_dsn, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (SCHEMA_LOCK,))
        OPENERS[store](warm).close()


def test_a_cold_start_waits_for_the_schema_lock(pg_dsn: str) -> None:
    """The tables missing: a store waits for the worker holding the lock (here, times out:
    tether's StoreUnavailable saying so, never the driver's LockNotAvailable)."""
    import psycopg

    from tether import StoreUnavailable

    dsn, drop = fresh_schema(pg_dsn, lock_timeout="100")
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s)", (SCHEMA_LOCK,))
            with pytest.raises(StoreUnavailable, match="lock_timeout ran out") as refused:
                PostgresDocuments(dsn).close()
            assert isinstance(refused.value.__cause__, psycopg.errors.LockNotAvailable)
    finally:
        drop()


def test_create_schema_runs_only_what_is_missing(pg_dsn: str) -> None:
    """Cold: the statements run (True); warm: one query, nothing run (False); a statement
    whose effect cannot be checked always runs, under the lock."""
    import psycopg

    from tether.stores._schema import create_schema

    dsn, drop = fresh_schema(pg_dsn)
    made = ["CREATE TABLE IF NOT EXISTS t (a INT)", "CREATE INDEX IF NOT EXISTS t_a ON t (a)"]
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert [create_schema(conn, made), create_schema(conn, made)] == [True, False]
            assert create_schema(conn, ["DROP INDEX IF EXISTS t_a"]) is True
            assert create_schema(conn, made) is True  # the index dropped: made again
            assert create_schema(conn, [*made, "COMMENT ON TABLE t IS 'x'"]) is True
            assert create_schema(conn, [*made, "COMMENT ON TABLE t IS 'x'"]) is True
    finally:
        drop()
