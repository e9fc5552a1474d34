"""Creating tether's tables in PostgreSQL when a fleet starts cold: one helper for every
store (the ledger, the documents, the records' runs and incidents, the budget scopes).

``CREATE TABLE IF NOT EXISTS`` is not safe against itself in PostgreSQL: two sessions that
create the same table at the same moment both find it missing, and the second to commit
fails on the catalog's unique index (``pg_type_typname_nsp_index``, or
``pg_class_relname_nsp_index`` for an index). :func:`create_schema` runs the statements in
one transaction that first takes a transaction-level advisory lock (one fixed key for all
of tether's tables), so workers starting together create them one after another, each
later one finding them made. A warm start takes no lock: one query first asks whether
every table and index the statements create already exists (and none they drop), and
nothing more is sent when so.

SQLite serialises its writers by the file's locks, but a connection switching a new file to
WAL mode (:func:`sqlite_wal`) may be answered "database is locked" at once, without waiting
out its busy timeout, while other connections open the same file: that switch is tried
again until the timeout; the tables are then made in one ``BEGIN IMMEDIATE`` transaction
(:func:`sqlite_create`: it waits for the file's write lock, where a lone ``CREATE`` may
be refused at once).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from tether._errors import StoreUnavailable
from tether.clock import SystemClock

__all__ = ["SCHEMA_LOCK", "create_schema", "sqlite_create", "sqlite_immediate", "sqlite_wal"]

#: the advisory lock key taken while tether creates its tables (a fixed 64-bit number:
#: ``int.from_bytes(b"tetherDB", "big") >> 1``)
SCHEMA_LOCK = 4193618936387412513
_MADE = re.compile(r"CREATE (?:UNIQUE )?(?:TABLE|INDEX) IF NOT EXISTS (\w+)", re.IGNORECASE)
_DROPPED = re.compile(r"DROP (?:TABLE|INDEX) IF EXISTS (\w+)", re.IGNORECASE)
_READY = (
    "SELECT (SELECT count(*) FROM unnest(%s::text[]) AS n WHERE to_regclass(n) IS NOT NULL) = %s "
    "AND NOT EXISTS (SELECT 1 FROM unnest(%s::text[]) AS n WHERE to_regclass(n) IS NOT NULL)"
)


def _objects(statements: Sequence[str]) -> tuple[list[str], list[str]] | None:
    """The tables and indexes the statements create, and those they drop; None when a
    statement is neither (its effect cannot be checked: the statements always run)."""
    made: list[str] = []
    dropped: list[str] = []
    for statement in statements:
        if found := _MADE.match(statement.strip()):
            made.append(found[1])
        elif found := _DROPPED.match(statement.strip()):
            dropped.append(found[1])
        else:
            return None
    return made, dropped


def create_schema(conn: Any, statements: Sequence[str]) -> bool:
    """Run ``statements`` (each ``CREATE ... IF NOT EXISTS`` or ``DROP ... IF EXISTS``) on
    ``conn``, an autocommit psycopg connection, safely beside other workers doing the same;
    True when they ran, False when everything was there already (no lock taken).

    Objects made at the same moment by a session that does not take tether's lock (an
    older tether in a rolling deploy, a migration tool) fail the creation on the catalog's
    unique index: it is tried again once, and finds them made. Any other refusal of the
    server (the role may not create tables, ``lock_timeout`` ran out while another worker
    held the lock, a read-only standby) is :class:`tether.StoreUnavailable` saying so; a
    connection that broke is the caller's (its error has no SQLSTATE)."""
    try:
        return _create(conn, statements)
    except Exception as exc:
        if getattr(exc, "sqlstate", None) not in _MADE_MEANWHILE:
            raise _refused(exc, statements) from exc
    try:
        return _create(conn, statements)
    except Exception as exc:
        raise _refused(exc, statements) from exc


#: SQLSTATEs of objects another session made meanwhile: unique_violation (the catalog's
#: index), duplicate_table, duplicate_object
_MADE_MEANWHILE = frozenset({"23505", "42P07", "42710"})


def _refused(exc: Exception, statements: Sequence[str]) -> Exception:
    """What to raise for ``exc``, raised while creating tether's tables: the error itself when
    the connection broke (no answer, no SQLSTATE: the caller's to try again), else
    :class:`tether.StoreUnavailable` naming the tables and what the server said."""
    state = getattr(exc, "sqlstate", None)
    if state is None:
        return exc
    names = ", ".join((_objects(statements) or ([], []))[0]) or "its tables"
    why = {
        "55P03": "lock_timeout ran out while another worker was creating them",
        "42501": "the role may not create them (create them beforehand, or grant CREATE)",
        "25006": "the database is read-only (a standby?)",
    }.get(state, "the server refused the statement")
    said = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return StoreUnavailable(
        f"tether's tables in PostgreSQL ({names}) could not be created: {why} "
        f"({type(exc).__name__}, SQLSTATE {state}: {said}); nothing was written"
    )


def _create(conn: Any, statements: Sequence[str]) -> bool:
    objects = _objects(statements)
    if objects is not None:
        made, dropped = objects
        ready = conn.execute(_READY, (made, len(made), dropped)).fetchone()
        if ready is not None and ready[0]:
            return False
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        for statement in statements:
            conn.execute(statement)
    return True


def sqlite_wal(db: Any, timeout: float) -> None:
    """Put the SQLite connection ``db``'s file in WAL mode, tried again for up to ``timeout``
    seconds while another connection holds the file ("database is locked")."""
    import sqlite3

    clock = SystemClock()
    deadline = clock.now() + timeout
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or clock.now() >= deadline:
                raise
        clock.sleep(0.005)


def sqlite_create(db: Any, statements: Sequence[str]) -> None:
    """Run ``statements`` on the SQLite connection ``db`` (autocommit) in one write
    transaction taken at once (``BEGIN IMMEDIATE``: one connection at a time)."""
    with sqlite_immediate(db):
        for statement in statements:
            db.execute(statement)


@contextmanager
def sqlite_immediate(db: Any) -> Iterator[None]:
    """One write transaction on the SQLite connection ``db`` (autocommit), taken at once
    (``BEGIN IMMEDIATE``): committed when the block ends, rolled back when it raises or its
    ``COMMIT`` fails. What failed first is what is raised: a ``COMMIT`` refused by a full
    disk or an I/O error (SQLite may have rolled the transaction back itself) whose
    ``ROLLBACK`` then fails raises the ``COMMIT``'s error, the file that cannot be used now
    (``stores/_sqlfailures.py``), with the ``ROLLBACK``'s noted; not the ``ROLLBACK``'s
    "no transaction is active", a programming error."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException as exc:
        if db.in_transaction:
            try:
                db.execute("ROLLBACK")
            except Exception as undo:
                exc.add_note(f"its ROLLBACK failed too: {type(undo).__name__}: {undo}")
        raise
