"""The ledger in PostgreSQL: ``INSERT ... ON CONFLICT DO NOTHING`` and row locks.

Connections come from a pool (``psycopg_pool``). A new key costs two round trips (the
claim, then the result). The pool does not probe a connection before handing it out (that
was a round trip per checkout): a connection found broken on its first statement (the
server restarted, or killed it while it sat idle) is thrown away and the statement sent
again once on a fresh one, so a restart costs the calls in flight at that moment, not
every call after it. Every statement here may be sent twice: each is idempotent for its
owner (a repeat of the owner's own claim is claimed again, see ``decide_claim``). A step
whose transaction the server rolled back (a serialization failure under ``SERIALIZABLE`` or
``REPEATABLE READ``, a deadlock: SQLSTATE 40001/40P01) left nothing and is sent again, three
attempts in all. What a failure means (StoreUnavailable or a programming error) is
``stores/_sqlfailures.py``'s. Leases are measured on the server's clock
(``clock_timestamp()``).
"""

from __future__ import annotations

import re
import threading
from typing import Any

from tether._errors import require
from tether.clock import SystemClock
from tether.stores._documents import open_pool
from tether.stores._ledger_logic import (
    COLUMNS,
    Completion,
    Record,
    Settlement,
    State,
    decide_claim,
    decide_complete,
)
from tether.stores._schema import create_schema
from tether.stores._sqlfailures import TX_ATTEMPTS, pg_unavailable, retried, safe_dsn, tx_backoff

__all__ = ["PostgresLedgerBackend"]

_EPOCH = "extract(epoch from clock_timestamp())::float8"


class _Counting:
    """A connection that counts the statements it sends (``round_trips``) and whether one
    of them has been answered yet (``answered``: a failure before that is a broken idle
    connection, safe to try again on a fresh one)."""

    __slots__ = ("_conn", "_owner", "answered")

    def __init__(self, conn: Any, owner: Any) -> None:
        self._conn = conn
        self._owner = owner
        self.answered = False

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        with self._owner._count_lock:
            self._owner.round_trips += 1
        cur = self._conn.execute(*args, **kwargs)
        self.answered = True
        return cur

    def transaction(self) -> Any:
        with self._owner._count_lock:
            self._owner.round_trips += 2  # BEGIN and COMMIT
        return self._conn.transaction()

    @property
    def broken(self) -> bool:
        return bool(self._conn.broken or self._conn.closed)


class PostgresLedgerBackend:
    def __init__(self, dsn: str, *, table: str = "tether_ledger", pool_size: int = 4) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", table):
            raise ValueError(f"table must be a plain SQL identifier, got {table!r}")
        self._psycopg: Any = require("psycopg", "postgres")
        self.dsn = safe_dsn(dsn)
        self.table = table
        self.round_trips = 0  # statements sent to the server
        self._count_lock = threading.Lock()
        self.reconnects = 0  # statements sent again after a broken idle connection
        self.rollbacks = 0  # steps sent again after the server rolled their transaction back
        # no probe per checkout: a connection found broken is replaced in _exec
        self._pool, self._pool_errors = open_pool(
            dsn, f"tether-ledger-{table}", pool_size, probe=False
        )
        self._insert_claim = (
            f"INSERT INTO {table} ({', '.join(COLUMNS)}) SELECT %s, 'pending', "
            "%s, %s, n + %s, n + %s, n, NULL, NULL, '', 1 "
            f"FROM (SELECT COALESCE(%s::float8, {_EPOCH}) AS n) AS t "
            "ON CONFLICT (key) DO NOTHING RETURNING key"
        )
        schema = f"""CREATE TABLE IF NOT EXISTS {table} (
            key TEXT PRIMARY KEY, state TEXT NOT NULL, payload_hash TEXT,
            owner TEXT NOT NULL, lease_until DOUBLE PRECISION NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL, created_at DOUBLE PRECISION NOT NULL,
            result TEXT, error TEXT, detail TEXT NOT NULL DEFAULT '',
            attempts INTEGER NOT NULL DEFAULT 1)"""
        # workers starting at once on a fresh database: made by one of them (stores/_schema.py)
        try:
            self._exec(lambda c: create_schema(c, [schema]))
        except BaseException:
            self._pool.close()
            raise

    def __repr__(self) -> str:
        return f"PostgresLedgerBackend({self.dsn!r}, table={self.table!r})"

    def _exec(self, fn: Any) -> Any:
        """``fn(conn)`` on a connection of the pool, sent again (on a fresh connection) when
        it broke before answering anything (it had died while idle), or when the server
        rolled its transaction back (a serialization failure or a deadlock, SQLSTATE
        40001/40P01: :data:`TX_ATTEMPTS` attempts in all; each step of ``fn`` that had
        committed is idempotent for its owner, and the one that failed left nothing). The
        database that cannot be used: :class:`StoreUnavailable`; a programming error is
        psycopg's own, with a note."""
        lost = (self._psycopg.OperationalError, self._psycopg.InterfaceError)
        reconnected, rolled_back = False, 0
        while True:
            counting = None
            try:
                with self._pool.connection(timeout=10.0) as conn:
                    counting = _Counting(conn, self)
                    return fn(counting)
            except self._psycopg.Error as exc:  # the pool's errors are psycopg's too
                if (
                    not reconnected
                    and isinstance(exc, lost)
                    and counting is not None
                    and not counting.answered
                    and counting.broken
                ):
                    reconnected = True
                    self.reconnects += 1
                    continue
                if retried(exc) and rolled_back < TX_ATTEMPTS - 1:
                    rolled_back += 1
                    self.rollbacks += 1
                    SystemClock().sleep(tx_backoff(rolled_back))
                    continue
                failure = pg_unavailable(exc, "the ledger", self.dsn, attempts=rolled_back + 1)
                if failure is None:
                    raise
                raise failure from exc

    @staticmethod
    def _row(row: Any) -> Record | None:
        return None if row is None else Record.from_values(row)

    def claim(self, record: Record, now: float | None) -> tuple[bool, Record | None]:
        cols = ", ".join(COLUMNS)
        # positional parameters, in the order of the statement (cheaper for psycopg than names)
        params = (
            record.key,
            record.payload_hash,
            record.owner,
            record.lease_until,
            record.expires_at,
            now,
        )
        insert = self._insert_claim

        def run(conn: Any) -> tuple[bool, Record | None]:
            while True:
                # a fresh key: one atomic statement, one round trip (autocommit)
                inserted = conn.execute(insert, params).fetchone()
                if inserted:
                    return True, None
                with conn.transaction():  # the key exists: decide under a row lock
                    row = conn.execute(
                        f"SELECT {cols}, COALESCE(%s::float8, {_EPOCH}) FROM {self.table} "
                        "WHERE key = %s FOR UPDATE",
                        (now, record.key),
                    ).fetchone()
                    if row is None:
                        continue  # released in between: try the insert again
                    existing, at = self._row(row[:-1]), float(row[-1])
                    new = record.at(at)
                    claimed, previous, store = decide_claim(existing, new, at)
                    if store is not None:
                        sets = ", ".join(f"{c} = %({c})s" for c in COLUMNS if c != "key")
                        put = store.to_row()
                        conn.execute(f"UPDATE {self.table} SET {sets} WHERE key = %(key)s", put)
                    return claimed, previous

        result: tuple[bool, Record | None] = self._exec(run)
        return result

    def get(self, key: str) -> Record | None:
        cols = ", ".join(COLUMNS)
        return self._exec(  # type: ignore[no-any-return]
            lambda c: self._row(
                c.execute(f"SELECT {cols} FROM {self.table} WHERE key = %s", (key,)).fetchone()
            )
        )

    def renew(self, key: str, owner: str, lease: float, now: float | None, ttl: float) -> bool:
        cur = self._exec(  # the rule of renewed (SET reads the row's old values)
            lambda c: c.execute(
                f"UPDATE {self.table} SET lease_until = GREATEST(lease_until, n + %s), "
                "expires_at = GREATEST(expires_at, GREATEST(lease_until, n + %s) + %s) "
                f"FROM (SELECT COALESCE(%s::float8, {_EPOCH}) AS n) AS t "
                "WHERE key = %s AND owner = %s AND state IN ('pending', 'unknown')",
                (lease, lease, ttl, now, key, owner),
            )
        )
        return bool(cur.rowcount == 1)

    def complete(self, s: Settlement) -> Completion:
        def run(conn: Any) -> Completion:
            done = conn.execute(
                f"UPDATE {self.table} SET state = %s, result = %s, error = %s, "
                f"expires_at = COALESCE(%s::float8, {_EPOCH}) + %s "
                "WHERE key = %s AND owner = %s AND state IN ('pending', 'unknown') RETURNING key",
                (s.state.value, s.result, s.error, s.now, s.ttl, s.key, s.owner),
            ).fetchone()
            if done:
                return Completion.RECORDED
            cols = ", ".join(COLUMNS)
            row = conn.execute(f"SELECT {cols} FROM {self.table} WHERE key = %s", (s.key,))
            return decide_complete(self._row(row.fetchone()), s.owner)

        verdict: Completion = self._exec(run)
        return verdict

    def mark_unknown(self, s: Settlement) -> None:
        self._exec(  # the rule of unknown_at, where may_mark_unknown
            lambda c: c.execute(
                f"UPDATE {self.table} SET state = 'unknown', detail = %s, lease_until = CASE "
                "WHEN %s THEN lease_until ELSE LEAST(lease_until, n) END, "
                "expires_at = CASE WHEN %s THEN GREATEST(lease_until, n) ELSE n END + %s "
                f"FROM (SELECT COALESCE(%s::float8, {_EPOCH}) AS n) AS t "
                "WHERE key = %s AND state = 'pending' AND owner = %s",
                (s.detail, s.keep_lease, s.keep_lease, s.ttl, s.now, s.key, s.owner),
            )
        )

    def release(self, key: str, owner: str) -> None:
        self._exec(
            lambda c: c.execute(
                f"DELETE FROM {self.table} WHERE key = %s AND state = 'pending' AND owner = %s",
                (key, owner),
            )
        )

    def forget(self, key: str) -> None:
        self._exec(lambda c: c.execute(f"DELETE FROM {self.table} WHERE key = %s", (key,)))

    def records(self, state: State | None = None, limit: int = 100) -> list[Record]:
        cols = ", ".join(COLUMNS)
        if state is None:
            sql, params = f"SELECT {cols} FROM {self.table} ORDER BY created_at LIMIT %s", (limit,)
        else:
            sql = f"SELECT {cols} FROM {self.table} WHERE state = %s ORDER BY created_at LIMIT %s"
            params = (state.value, limit)  # type: ignore[assignment]
        rows = self._exec(lambda c: c.execute(sql, params).fetchall())
        return [Record.from_values(row) for row in rows]

    def close(self) -> None:
        self._pool.close()
