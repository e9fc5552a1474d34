"""The ledger in a SQLite file: WAL mode, ``BEGIN IMMEDIATE`` around every claim.

Safe for threads and for several processes on one machine (SQLite's file locks);
not for a network file system. For a fleet on several machines use Redis or
PostgreSQL.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from tether.stores._ledger_logic import (
    COLUMNS,
    Completion,
    Record,
    Settlement,
    State,
    decide_claim,
    decide_complete,
)
from tether.stores._schema import sqlite_create, sqlite_immediate, sqlite_wal
from tether.stores._sqlfailures import sqlite_unavailable

__all__ = ["SqliteLedgerBackend"]

T = TypeVar("T")
SCHEMA = """
CREATE TABLE IF NOT EXISTS tether_ledger (
    key TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    payload_hash TEXT,
    owner TEXT NOT NULL,
    lease_until REAL NOT NULL,
    expires_at REAL NOT NULL,
    created_at REAL NOT NULL,
    result TEXT,
    error TEXT,
    detail TEXT NOT NULL DEFAULT '',
    attempts INTEGER NOT NULL DEFAULT 1
)
"""


_REPLACE = (
    f"INSERT OR REPLACE INTO tether_ledger ({', '.join(COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in COLUMNS)})"
)
# A claim of a key the ledger has never seen (or has forgotten) needs no decision. A claim
# (Record.claim_of) is PENDING, without result, error or detail, its first attempt: those are
# written as literals, and only its six other fields are bound (each bound value costs more
# than the statement's text: 11 bound values took a fifth more than these 6).
_INSERT_NEW = (
    f"INSERT INTO tether_ledger ({', '.join(COLUMNS)}) "
    "VALUES (?, 'pending', ?, ?, ?, ?, ?, NULL, NULL, '', 1) ON CONFLICT (key) DO NOTHING"
)
# the owner's live claim settled in one statement (its own transaction): DONE, with its result
_DONE = (
    "UPDATE tether_ledger SET state = 'done', result = ?, error = NULL, expires_at = ? "
    "WHERE key = ? AND owner = ? AND state IN ('pending', 'unknown')"
)
_SETTLE = (
    "UPDATE tether_ledger SET state = ?, result = ?, error = ?, expires_at = ? "
    "WHERE key = ? AND owner = ? AND state IN ('pending', 'unknown')"
)


class _Held:
    """The connection held (the backend's lock) for one step; a file that cannot be used now
    (locked past the timeout, read-only, full): :class:`tether.StoreUnavailable`, and a
    programming error sqlite3's own (``stores/_sqlfailures.py``)."""

    __slots__ = ("_lock", "_path")

    def __init__(self, lock: threading.Lock, path: str) -> None:
        self._lock, self._path = lock, path

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        self._lock.release()
        if exc is not None:
            import sqlite3

            if isinstance(exc, sqlite3.Error):
                failure = sqlite_unavailable(exc, "the ledger", self._path)
                if failure is not None:
                    raise failure from exc


class SqliteLedgerBackend:
    def __init__(self, path: str, *, timeout: float = 30.0) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._held = _Held(self._lock, path)
        import sqlite3  # imported when first used: `import tether` loads no sqlite3

        try:
            self._db = sqlite3.connect(
                path, timeout=timeout, isolation_level=None, check_same_thread=False
            )
            sqlite_wal(self._db, timeout)  # workers opening a new file at once: _schema.py
            self._db.execute("PRAGMA synchronous=NORMAL")
            sqlite_create(self._db, [SCHEMA])
            # the success path's statements go through this one cursor (under the lock), not a
            # new cursor per statement
            self._cur = self._db.cursor()
        except sqlite3.DatabaseError as exc:
            failure = sqlite_unavailable(exc, "the ledger", path)  # locked, read-only, full
            if failure is not None:
                raise failure from exc
            raise sqlite3.DatabaseError(
                f"cannot open the tether ledger at {path!r}: {exc}; check that the path is "
                "writable and the file is a SQLite database"
            ) from exc

    def _select(self, key: str) -> Record | None:
        cur = self._db.execute(
            f"SELECT {', '.join(COLUMNS)} FROM tether_ledger WHERE key = ?", (key,)
        )
        row = cur.fetchone()
        return None if row is None else Record.from_values(row)

    @contextmanager
    def _immediate(self) -> Iterator[None]:
        """A write transaction taken at once (``BEGIN IMMEDIATE``): decide, then write."""
        with self._held, sqlite_immediate(self._db):
            yield

    def _decided(self, key: str, decide: Callable[[Record | None], T]) -> T:
        with self._immediate():
            return decide(self._select(key))

    def _put(self, record: Record) -> None:
        self._db.execute(_REPLACE, record.values())

    def claim(self, record: Record, now: float | None) -> tuple[bool, Record | None]:
        now = time.time() if now is None else now
        fresh = (
            record.key,
            record.payload_hash,
            record.owner,
            now + record.lease_until,
            now + record.expires_at,
            now,
        )
        with self._held:  # a fresh key: one statement, its own transaction
            if self._cur.execute(_INSERT_NEW, fresh).rowcount == 1:
                return True, None
        new = record.at(now)

        def decide(existing: Record | None) -> tuple[bool, Record | None]:
            claimed, previous, store = decide_claim(existing, new, now)
            if store is not None:
                self._put(store)
            return claimed, previous

        return self._decided(new.key, decide)

    def get(self, key: str) -> Record | None:
        with self._held:
            return self._select(key)

    def renew(self, key: str, owner: str, lease: float, now: float | None, ttl: float) -> bool:
        until = (time.time() if now is None else now) + lease
        with self._held:
            cur = self._db.execute(
                "UPDATE tether_ledger SET lease_until = MAX(lease_until, ?), "
                "expires_at = MAX(expires_at, MAX(lease_until, ?) + ?) "
                "WHERE key = ? AND owner = ? AND state IN ('pending', 'unknown')",
                (until, until, ttl, key, owner),
            )
            return cur.rowcount == 1

    def complete(self, s: Settlement) -> Completion:
        expires = (time.time() if s.now is None else s.now) + s.ttl
        params: tuple[Any, ...]
        if s.state is State.DONE and s.error is None:  # a result: the state is a literal
            sql, params = _DONE, (s.result, expires, s.key, s.owner)
        else:
            sql, params = _SETTLE, (s.state.value, s.result, s.error, expires, s.key, s.owner)
        with self._held:  # the owner's live claim: one statement, its own transaction
            if self._cur.execute(sql, params).rowcount == 1:
                return Completion.RECORDED

        def decide(existing: Record | None) -> Completion:
            verdict = decide_complete(existing, s.owner)
            if verdict is Completion.RECORDED:
                self._db.execute(
                    "UPDATE tether_ledger SET state = ?, result = ?, error = ?, expires_at = ? "
                    "WHERE key = ?",
                    (s.state.value, s.result, s.error, expires, s.key),
                )
            return verdict

        return self._decided(s.key, decide)

    def mark_unknown(self, s: Settlement) -> None:
        now = time.time() if s.now is None else s.now
        with self._held:  # the rule of unknown_at, where may_mark_unknown
            self._db.execute(
                "UPDATE tether_ledger SET state = 'unknown', detail = ?, "
                "lease_until = CASE WHEN ? THEN lease_until ELSE MIN(lease_until, ?) END, "
                "expires_at = CASE WHEN ? THEN MAX(lease_until, ?) ELSE ? END + ? "
                "WHERE key = ? AND state = 'pending' AND owner = ?",
                (s.detail, s.keep_lease, now, s.keep_lease, now, now, s.ttl, s.key, s.owner),
            )

    def release(self, key: str, owner: str) -> None:
        with self._held:
            self._db.execute(
                "DELETE FROM tether_ledger WHERE key = ? AND state = 'pending' AND owner = ?",
                (key, owner),
            )

    def forget(self, key: str) -> None:
        with self._held:
            self._db.execute("DELETE FROM tether_ledger WHERE key = ?", (key,))

    def records(self, state: State | None = None, limit: int = 100) -> list[Record]:
        sql = f"SELECT {', '.join(COLUMNS)} FROM tether_ledger"
        params: list[Any] = []
        if state is not None:
            sql += " WHERE state = ?"
            params.append(state.value)
        sql += " ORDER BY created_at LIMIT ?"
        params.append(limit)
        with self._held:
            rows = self._db.execute(sql, params).fetchall()
        return [Record.from_values(row) for row in rows]

    def close(self) -> None:
        with self._held:
            self._db.close()
