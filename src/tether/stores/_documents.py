"""Document stores: where checkpoints, dead letters, handoffs, approvals and run records
are kept (this process's memory, a SQLite file, or PostgreSQL for a fleet)."""

from __future__ import annotations

import enum
import json
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from tether._errors import CheckpointError, StoreUnavailable, require
from tether.clock import SystemClock
from tether.redaction._redact import safe_url
from tether.stores._schema import create_schema, sqlite_create, sqlite_immediate, sqlite_wal
from tether.stores._sql import DIALECTS, POSTGRES, SQLITE, DocumentSql
from tether.stores._sqlfailures import (
    TX_ATTEMPTS,
    pg_unavailable,
    retried,
    safe_dsn,
    sqlite_unavailable,
    tx_backoff,
)

__all__ = [
    "DocKind",
    "DocumentStore",
    "MemoryDocuments",
    "PostgresDocuments",
    "Sql",
    "SqliteDocuments",
]

T = TypeVar("T")


class DocKind(enum.StrEnum):
    """The kinds of documents a store keeps (the ``kind`` column; the values are stored)."""

    CHECKPOINT = "checkpoint"
    APPROVAL = "approval"
    HANDOFF = "handoff"
    DEAD_LETTER = "dead_letter"
    RUN = "run"


class DocumentStore(Protocol):
    def put(self, kind: str, doc_id: str, doc: dict[str, Any], created_at: float) -> None: ...
    def get(self, kind: str, doc_id: str) -> str | None: ...
    def list(self, kind: str, limit: int) -> list[tuple[str, str]]: ...
    def delete(self, kind: str, doc_id: str) -> None: ...


class MemoryDocuments:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._docs: dict[tuple[str, str], tuple[float, str]] = {}

    def put(self, kind: str, doc_id: str, doc: dict[str, Any], created_at: float) -> None:
        with self._lock:
            self._docs[(kind, doc_id)] = (created_at, json.dumps(doc, default=str))

    def get(self, kind: str, doc_id: str) -> str | None:
        with self._lock:
            found = self._docs.get((kind, doc_id))
        return found[1] if found else None

    def list(self, kind: str, limit: int) -> list[tuple[str, str]]:
        with self._lock:
            rows = sorted((v[0], k[1], v[1]) for k, v in self._docs.items() if k[0] == kind)
        return [(doc_id, text) for _, doc_id, text in rows[-limit:]]

    def delete(self, kind: str, doc_id: str) -> None:
        with self._lock:
            self._docs.pop((kind, doc_id), None)


class Sql:
    """One connection's statements, with ``?`` placeholders on every dialect (what the
    queries of :class:`tether.Records` use: runs, decisions, prune)."""

    def __init__(self, conn: Any, dialect: str) -> None:
        self._conn = conn
        self._dialect = DIALECTS[dialect]
        self._pg = self._dialect is POSTGRES

    def _sql(self, sql: str) -> str:
        return self._dialect(sql)

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return list(self._conn.execute(self._sql(sql), tuple(params)).fetchall())

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Execute; the number of rows it changed."""
        return int(self._conn.execute(self._sql(sql), tuple(params)).rowcount)

    def many(self, sql: str, seq: Iterable[Sequence[Any]]) -> None:
        rows = [tuple(p) for p in seq]
        if not rows:
            return
        if self._pg:
            with self._conn.cursor() as cursor:
                cursor.executemany(self._sql(sql), rows)
        else:
            self._conn.executemany(sql, rows)


class SqliteDocuments:
    #: the SQL dialect and documents table, for the queries of :class:`tether.Records`
    dialect = SQLITE.name
    table = "tether_documents"

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._q = DocumentSql(self.table, SQLITE)
        import sqlite3  # imported when first used: `import tether` loads no sqlite3

        try:
            self._db = sqlite3.connect(
                path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            sqlite_wal(self._db, 30.0)  # workers opening a new file at once: see _schema.py
            sqlite_create(self._db, [self._q.create])
        except sqlite3.DatabaseError as exc:
            raise CheckpointError(f"cannot open the tether database at {path!r}: {exc}") from exc

    def create_schema(self, statements: Sequence[str]) -> None:
        """Create tables and indexes (``... IF NOT EXISTS``) in one write transaction
        (``BEGIN IMMEDIATE``: one process at a time, the others wait for the file)."""
        with self._lock:
            sqlite_create(self._db, statements)

    @contextmanager
    def _file(self) -> Iterator[None]:
        """The file held (this store's lock); a file locked past the timeout, read-only, full
        or out of reach: :class:`StoreUnavailable`; a programming error is sqlite3's own."""
        import sqlite3

        with self._lock:
            try:
                yield
            except sqlite3.Error as exc:
                failure = sqlite_unavailable(exc, "the documents", self.path)
                if failure is None:
                    raise
                raise failure from exc

    def put(self, kind: str, doc_id: str, doc: dict[str, Any], created_at: float) -> None:
        with self._file():
            self._db.execute(self._q.put, (kind, doc_id, created_at, json.dumps(doc, default=str)))

    def get(self, kind: str, doc_id: str) -> str | None:
        with self._file():
            row = self._db.execute(self._q.get, (kind, doc_id)).fetchone()
        return None if row is None else str(row[0])

    def list(self, kind: str, limit: int) -> list[tuple[str, str]]:
        with self._file():
            rows = self._db.execute(self._q.list, (kind, limit)).fetchall()
        return [(str(r[0]), str(r[1])) for r in reversed(rows)]

    def delete(self, kind: str, doc_id: str) -> None:
        with self._file():
            self._db.execute(self._q.delete, (kind, doc_id))

    @contextmanager
    def sql(self, *, write: bool = False) -> Iterator[Sql]:
        """This database's connection, held; ``write=True``: one transaction. A file that
        cannot be used now: :class:`StoreUnavailable` (the transaction rolled back)."""
        with self._file():
            if not write:
                yield Sql(self._db, self.dialect)
                return
            with sqlite_immediate(self._db):
                yield Sql(self._db, self.dialect)

    def close(self) -> None:
        with self._lock:
            self._db.close()


def open_pool(
    dsn: str, name: str, size: int, *, probe: bool
) -> tuple[Any, tuple[type[BaseException], ...]]:
    """An open pool of autocommit PostgreSQL connections, and the errors the pool raises
    when no connection can be had. ``probe``: each connection is checked when it is handed
    out (one round trip more per checkout). :class:`StoreUnavailable` when the server does
    not answer within 10 s."""
    pool_mod: Any = require("psycopg_pool", "postgres")
    pool = pool_mod.ConnectionPool(
        dsn,
        min_size=1,
        max_size=size,
        open=False,
        name=name,
        timeout=10.0,
        kwargs={"autocommit": True, "connect_timeout": 10},
        check=pool_mod.ConnectionPool.check_connection if probe else None,
    )
    errors = (pool_mod.PoolTimeout, pool_mod.PoolClosed)
    try:
        pool.open(wait=True, timeout=10.0)
    except errors as exc:
        pool.close()
        raise StoreUnavailable(
            f"cannot connect to PostgreSQL ({name}) at {safe_dsn(dsn)} ({exc}); check the DSN "
            "and that the server is up"
        ) from exc
    return pool, errors


class PostgresDocuments:
    """Documents in a PostgreSQL table, over a small pool of connections (a page that
    reads a large record never holds up the others)."""

    dialect = POSTGRES.name

    def __init__(self, dsn: str, table: str = "tether_documents", *, pool_size: int = 4) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", table):
            raise ValueError(f"table must be a plain SQL identifier, got {table!r}")
        require("psycopg", "postgres")
        self.dsn = dsn
        self.table = table
        self._q = DocumentSql(table, POSTGRES)
        self._pool, self._errors = open_pool(
            dsn, f"tether-documents-{table}", pool_size, probe=True
        )
        try:
            self.create_schema([self._q.create])
        except BaseException:
            self._pool.close()
            raise

    def create_schema(self, statements: Sequence[str]) -> None:
        """Create tables and indexes (``... IF NOT EXISTS``), one worker at a time when a
        fleet starts cold (stores/_schema.py); nothing but one query when they exist. The
        server unreachable or refusing: :class:`StoreUnavailable`."""
        import psycopg

        errors: tuple[type[BaseException], ...] = (psycopg.Error, *self._errors)
        try:
            with self._pool.connection() as conn:
                create_schema(conn, statements)
        except errors as exc:
            raise StoreUnavailable(
                f"the documents' PostgreSQL at {safe_dsn(self.dsn)} could not be used to create "
                f"its tables ({type(exc).__name__}: {safe_url(str(exc))})"
            ) from exc

    def _failed(self, exc: BaseException, attempts: int = 1) -> StoreUnavailable | None:
        return pg_unavailable(
            exc, f"the documents (table {self.table})", self.dsn, attempts=attempts
        )

    def _use(self, statement: Callable[[Any], T]) -> T:
        """``statement(conn)`` on a connection of the pool (one statement, its own
        transaction): sent again when the server rolled it back (a serialization failure, a
        deadlock), :class:`StoreUnavailable` when the database cannot be used now; a
        programming error is psycopg's own."""
        import psycopg

        errors: tuple[type[BaseException], ...] = (psycopg.Error, *self._errors)
        for attempt in range(1, TX_ATTEMPTS + 1):
            try:
                with self._pool.connection() as conn:
                    return statement(conn)
            except errors as exc:
                if retried(exc) and attempt < TX_ATTEMPTS:
                    SystemClock().sleep(tx_backoff(attempt))
                    continue
                failure = self._failed(exc, attempt)
                if failure is None:
                    raise
                raise failure from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def put(self, kind: str, doc_id: str, doc: dict[str, Any], created_at: float) -> None:
        body = json.dumps(doc, default=str)
        self._use(lambda conn: conn.execute(self._q.put, (kind, doc_id, created_at, body)))

    def get(self, kind: str, doc_id: str) -> str | None:
        row = self._use(lambda conn: conn.execute(self._q.get, (kind, doc_id)).fetchone())
        return None if row is None else str(row[0])

    def list(self, kind: str, limit: int) -> list[tuple[str, str]]:
        rows = self._use(lambda conn: conn.execute(self._q.list, (kind, limit)).fetchall())
        return [(str(r[0]), str(r[1])) for r in reversed(rows)]

    def delete(self, kind: str, doc_id: str) -> None:
        self._use(lambda conn: conn.execute(self._q.delete, (kind, doc_id)))

    @contextmanager
    def sql(self, *, write: bool = False) -> Iterator[Sql]:
        """A connection of the pool; ``write=True``: one transaction. The database that
        cannot be used now: :class:`StoreUnavailable` (the transaction rolled back)."""
        import psycopg

        errors: tuple[type[BaseException], ...] = (psycopg.Error, *self._errors)
        try:
            with self._pool.connection() as conn:
                if not write:
                    yield Sql(conn, self.dialect)
                    return
                with conn.transaction():
                    yield Sql(conn, self.dialect)
        except errors as exc:
            failure = self._failed(exc)
            if failure is None:
                raise
            raise failure from exc

    def close(self) -> None:
        self._pool.close()
