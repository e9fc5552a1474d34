"""The ledger in PostgreSQL: ``INSERT ... ON CONFLICT DO NOTHING`` and row locks."""

from __future__ import annotations

import re
import threading
from dataclasses import replace
from typing import Any

from tether._effects import Record, State, decide_claim
from tether._errors import StoreUnavailable, require

__all__ = ["PostgresLedgerBackend"]

COLUMNS = ("key", "state", "payload_hash", "owner", "lease_until", "expires_at", "created_at",
           "result", "error", "detail", "attempts")  # fmt: skip


class _Counting:
    """A connection that counts the statements it sends (``round_trips``)."""

    def __init__(self, conn: Any, owner: Any) -> None:
        self._conn = conn
        self._owner = owner

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        self._owner.round_trips += 1
        return self._conn.execute(*args, **kwargs)

    def transaction(self) -> Any:
        self._owner.round_trips += 2  # BEGIN and COMMIT
        return self._conn.transaction()


class PostgresLedgerBackend:
    def __init__(self, dsn: str, *, table: str = "tether_ledger") -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", table):
            raise ValueError(f"table must be a plain SQL identifier, got {table!r}")
        self._psycopg: Any = require("psycopg", "postgres")
        self.dsn = dsn
        self.table = table
        self._lock = threading.Lock()
        self._conn = self._connect()
        self.round_trips = 0  # statements sent to the server
        with self._lock, self._conn.transaction():
            self._conn.execute(
                f"""CREATE TABLE IF NOT EXISTS {table} (
                    key TEXT PRIMARY KEY, state TEXT NOT NULL, payload_hash TEXT,
                    owner TEXT NOT NULL, lease_until DOUBLE PRECISION NOT NULL,
                    expires_at DOUBLE PRECISION NOT NULL, created_at DOUBLE PRECISION NOT NULL,
                    result TEXT, error TEXT, detail TEXT NOT NULL DEFAULT '',
                    attempts INTEGER NOT NULL DEFAULT 1)"""
            )

    def _connect(self) -> Any:
        try:
            return self._psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
        except self._psycopg.OperationalError as exc:
            raise StoreUnavailable(
                f"cannot connect to the ledger's PostgreSQL ({exc}); nothing was executed. "
                "Check the DSN and that the server is up"
            ) from exc

    def _exec(self, fn: Any) -> Any:
        with self._lock:
            if self._conn.closed:
                self._conn = self._connect()
            try:
                return fn(_Counting(self._conn, self))
            except self._psycopg.OperationalError as exc:
                self._conn.close()
                raise StoreUnavailable(
                    f"the ledger's PostgreSQL connection failed ({exc}); retry when it is back"
                ) from exc

    def _row(self, row: Any) -> Record | None:
        return None if row is None else Record.from_row(dict(zip(COLUMNS, row, strict=True)))

    def claim(self, record: Record, now: float) -> tuple[bool, Record | None]:
        cols = ", ".join(COLUMNS)
        marks = ", ".join(f"%({c})s" for c in COLUMNS)

        def run(conn: Any) -> tuple[bool, Record | None]:
            while True:
                # a fresh key: one atomic statement, one round trip (autocommit)
                inserted = conn.execute(
                    f"INSERT INTO {self.table} ({cols}) VALUES ({marks}) ON CONFLICT (key) DO NOTHING RETURNING key",
                    record.to_row(),
                ).fetchone()
                if inserted:
                    return True, None
                with conn.transaction():  # the key exists: decide under a row lock
                    existing = self._row(
                        conn.execute(
                            f"SELECT {cols} FROM {self.table} WHERE key = %s FOR UPDATE",
                            (record.key,),
                        ).fetchone()
                    )
                    if existing is None:
                        continue  # released in between: try the insert again
                    return _decide(conn, existing)

        def _decide(conn: Any, existing: Record) -> tuple[bool, Record | None]:
            claimed, previous = decide_claim(existing, record, now)
            if claimed:
                row = replace(record, attempts=previous.attempts + 1 if previous else 1).to_row()
                sets = ", ".join(f"{c} = %({c})s" for c in COLUMNS if c != "key")
                conn.execute(f"UPDATE {self.table} SET {sets} WHERE key = %(key)s", row)
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

    def complete(self, key: str, owner: str, state: State, result: str | None,
                 error: str | None, now: float) -> None:  # fmt: skip
        self._exec(
            lambda c: c.execute(
                f"UPDATE {self.table} SET state = %s, result = %s, error = %s "
                "WHERE key = %s AND state IN ('pending', 'unknown')",
                (state.value, result, error, key),
            )
        )

    def mark_unknown(self, key: str, owner: str, detail: str) -> None:
        self._exec(
            lambda c: c.execute(
                f"UPDATE {self.table} SET state = 'unknown', detail = %s "
                "WHERE key = %s AND state = 'pending' AND owner = %s",
                (detail, key, owner),
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
        return [r for r in (self._row(row) for row in rows) if r is not None]

    def close(self) -> None:
        with self._lock:
            self._conn.close()
