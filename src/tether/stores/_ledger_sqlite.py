"""The ledger in a SQLite file: WAL mode, ``BEGIN IMMEDIATE`` around every claim.

Safe for threads and for several processes on one machine (SQLite's file locks);
not for a network file system. For a fleet on several machines use Redis or
PostgreSQL.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from tether.clock import system_clock
from tether.stores._ledger_logic import (
    COLUMNS,
    Completion,
    Record,
    Settlement,
    State,
    decide_claim,
    decide_complete,
)

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
# a claim of a key the ledger has never seen (or has forgotten) needs no decision
_INSERT_NEW = (
    f"INSERT INTO tether_ledger ({', '.join(COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in COLUMNS)}) ON CONFLICT (key) DO NOTHING"
)


class SqliteLedgerBackend:
    def __init__(self, path: str, *, timeout: float = 30.0) -> None:
        self.path = path
        self._lock = threading.Lock()
        import sqlite3  # imported when first used: `import tether` loads no sqlite3

        try:
            self._db = sqlite3.connect(
                path, timeout=timeout, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(SCHEMA)
        except sqlite3.DatabaseError as exc:
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
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _decided(self, key: str, decide: Callable[[Record | None], T]) -> T:
        with self._immediate():
            return decide(self._select(key))

    def _put(self, record: Record) -> None:
        self._db.execute(_REPLACE, record.values())

    def claim(self, record: Record, now: float | None) -> tuple[bool, Record | None]:
        now = system_clock.wall() if now is None else now
        new = record.at(now)
        with self._lock:  # a fresh key: one statement, its own transaction
            if self._db.execute(_INSERT_NEW, new.values()).rowcount == 1:
                return True, None

        def decide(existing: Record | None) -> tuple[bool, Record | None]:
            claimed, previous, store = decide_claim(existing, new, now)
            if store is not None:
                self._put(store)
            return claimed, previous

        return self._decided(new.key, decide)

    def get(self, key: str) -> Record | None:
        with self._lock:
            return self._select(key)

    def renew(self, key: str, owner: str, lease: float, now: float | None, ttl: float) -> bool:
        until = (system_clock.wall() if now is None else now) + lease
        with self._lock:
            cur = self._db.execute(
                "UPDATE tether_ledger SET lease_until = MAX(lease_until, ?), "
                "expires_at = MAX(expires_at, MAX(lease_until, ?) + ?) "
                "WHERE key = ? AND owner = ? AND state IN ('pending', 'unknown')",
                (until, until, ttl, key, owner),
            )
            return cur.rowcount == 1

    def complete(self, s: Settlement) -> Completion:
        expires = (system_clock.wall() if s.now is None else s.now) + s.ttl
        values = (s.state.value, s.result, s.error, expires, s.key)
        with self._lock:  # the owner's live claim: one statement, its own transaction
            done = self._db.execute(
                "UPDATE tether_ledger SET state = ?, result = ?, error = ?, expires_at = ? "
                "WHERE key = ? AND owner = ? AND state IN ('pending', 'unknown')",
                (*values, s.owner),
            )
            if done.rowcount == 1:
                return Completion.RECORDED

        def decide(existing: Record | None) -> Completion:
            verdict = decide_complete(existing, s.owner)
            if verdict is Completion.RECORDED:
                self._db.execute(
                    "UPDATE tether_ledger SET state = ?, result = ?, error = ?, expires_at = ? "
                    "WHERE key = ?",
                    values,
                )
            return verdict

        return self._decided(s.key, decide)

    def mark_unknown(self, s: Settlement) -> None:
        now = system_clock.wall() if s.now is None else s.now
        with self._lock:  # the rule of unknown_at, where may_mark_unknown
            self._db.execute(
                "UPDATE tether_ledger SET state = 'unknown', detail = ?, "
                "lease_until = CASE WHEN ? THEN lease_until ELSE MIN(lease_until, ?) END, "
                "expires_at = CASE WHEN ? THEN MAX(lease_until, ?) ELSE ? END + ? "
                "WHERE key = ? AND state = 'pending' AND owner = ?",
                (s.detail, s.keep_lease, now, s.keep_lease, now, now, s.ttl, s.key, s.owner),
            )

    def release(self, key: str, owner: str) -> None:
        with self._lock:
            self._db.execute(
                "DELETE FROM tether_ledger WHERE key = ? AND state = 'pending' AND owner = ?",
                (key, owner),
            )

    def forget(self, key: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM tether_ledger WHERE key = ?", (key,))

    def records(self, state: State | None = None, limit: int = 100) -> list[Record]:
        sql = f"SELECT {', '.join(COLUMNS)} FROM tether_ledger"
        params: list[Any] = []
        if state is not None:
            sql += " WHERE state = ?"
            params.append(state.value)
        sql += " ORDER BY created_at LIMIT ?"
        params.append(limit)
        with self._lock:
            rows = self._db.execute(sql, params).fetchall()
        return [Record.from_values(row) for row in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()
