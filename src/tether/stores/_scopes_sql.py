"""Budget scopes shared by a fleet through SQL (PostgreSQL, or a SQLite file): the SQL shell
of the state machine of :mod:`tether.stores._scopes`.

Three tables beside a :class:`tether.Records` database's own: ``<prefix>scopes`` (one row
per scope: its fields as JSON), ``<prefix>scope_calls`` (each call id's state: reserved or
settled, and when) and ``<prefix>scope_waiting`` (the runs paused on a scope). Every
operation is one transaction: a reservation locks the rows of all of the call's scopes at
once (an upsert of them all, in the order of their names, so that two calls never wait on
each other), runs the pure state machine on them and writes back what it changed; on
SQLite the transaction is ``BEGIN IMMEDIATE`` (one writer at a time).

When the database cannot be reached the scopes fail closed: the call is refused with
:class:`tether.StoreUnavailable`, never counted in this process's memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

from tether._errors import StoreUnavailable
from tether.clock import SystemClock
from tether.stores._documents import PostgresDocuments, Sql, SqliteDocuments
from tether.stores._scopes import (
    Answer,
    Fields,
    Four,
    ScopeLimits,
    scope_limit,
    scope_view,
    scopes_release,
    scopes_reserve,
    scopes_settle,
)
from tether.stores._sqlfailures import TX_ATTEMPTS, retried, tx_backoff

__all__ = ["SqlScopes"]


class SqlScopes:
    """The budget scope operations of a :class:`tether.Records` database (see the module)."""

    def __init__(
        self,
        store: SqliteDocuments | PostgresDocuments,
        prefix: str,
        *,
        lease: float = 600.0,
        retention: float = 7 * 86_400.0,
    ) -> None:
        self.store = store
        self.lease, self.retention = float(lease), float(retention)
        self.scopes_table = f"{prefix}scopes"
        self.calls_table = f"{prefix}scope_calls"
        self.waiting_table = f"{prefix}scope_waiting"
        #: transactions run (one per operation)
        self.transactions = 0
        with self._reachable():  # workers starting at once: made by one (stores/_schema.py)
            store.create_schema(
                [
                    f"CREATE TABLE IF NOT EXISTS {self.scopes_table} "
                    "(name TEXT PRIMARY KEY, fields TEXT NOT NULL)",
                    f"CREATE TABLE IF NOT EXISTS {self.calls_table} "
                    "(id TEXT PRIMARY KEY, state TEXT NOT NULL, at DOUBLE PRECISION NOT NULL)",
                    f"CREATE INDEX IF NOT EXISTS {self.calls_table}_at ON {self.calls_table} (at)",
                    f"CREATE TABLE IF NOT EXISTS {self.waiting_table} (name TEXT NOT NULL, "
                    "run_id TEXT NOT NULL, checkpoint_id TEXT NOT NULL, "
                    "PRIMARY KEY (name, run_id))",
                ]
            )

    def _errors(self) -> tuple[type[BaseException], ...]:
        if isinstance(self.store, PostgresDocuments):
            import psycopg

            return (psycopg.OperationalError, *self.store._errors)
        import sqlite3

        return (sqlite3.OperationalError,)

    @contextmanager
    def _tx(self) -> Iterator[Sql]:
        """One transaction; the database unreachable: :class:`StoreUnavailable`."""
        self.transactions += 1
        with self._reachable(), self.store.sql(write=True) as sql:
            yield sql

    @contextmanager
    def _reachable(self) -> Iterator[None]:
        """The database unreachable or refusing: :class:`StoreUnavailable` saying what the
        store said (its SQLSTATE, or the SQLite file's error)."""
        errors: tuple[type[BaseException], ...] = (StoreUnavailable, *self._errors())
        try:
            yield
        except errors as exc:
            said = str(exc) if isinstance(exc, StoreUnavailable) else f"{type(exc).__name__}: {exc}"
            raise StoreUnavailable(
                f"the budget scopes' database ({self.store.dialect}) could not be used "
                f"({said}): the budget scopes cannot be checked, so no request was sent"
            ) from exc

    # --- reading and writing the state machine's mappings -----------------------------------

    def _scopes(self, sql: Sql, names: Sequence[str]) -> list[tuple[str, Fields]]:
        """The scopes ``names`` (made when new), their rows locked until the transaction
        ends: one upsert of them all, in the order of their names."""
        if not names:
            return []
        ordered = sorted(set(names))
        rows = sql.rows(
            f"INSERT INTO {self.scopes_table} (name, fields) VALUES "
            + ", ".join("(?, '{}')" for _ in ordered)
            + " ON CONFLICT (name) DO UPDATE SET fields = "
            f"{self.scopes_table}.fields RETURNING name, fields",
            ordered,
        )
        found: dict[str, Fields] = {str(r[0]): json.loads(r[1]) for r in rows}
        return [(n, found[n]) for n in names]

    def _calls(self, sql: Sql, call_id: str) -> Fields:
        rows = sql.rows(f"SELECT state FROM {self.calls_table} WHERE id = ?", [call_id])
        return {call_id: str(rows[0][0])} if rows else {}

    def _write(
        self,
        sql: Sql,
        scopes: Sequence[tuple[str, Fields]],
        before: Sequence[str],
        calls: Fields,
        calls_before: Fields,
    ) -> None:
        """What the state machine changed: the scopes' fields, the calls' states."""
        changed = [
            (text, name)
            for (name, f), old in zip(scopes, before, strict=True)
            if (text := json.dumps(f)) != old
        ]
        sql.many(f"UPDATE {self.scopes_table} SET fields = ? WHERE name = ?", changed)
        sql.many(
            f"INSERT INTO {self.calls_table} (id, state, at) VALUES (?, ?, ?) ON CONFLICT (id) "
            "DO UPDATE SET state = EXCLUDED.state, at = EXCLUDED.at",
            [
                (call_id, state, float(str(state).split()[1]))
                for call_id, state in calls.items()
                if calls_before.get(call_id) != state
            ],
        )
        sql.many(
            f"DELETE FROM {self.calls_table} WHERE id = ?",
            [(call_id,) for call_id in calls_before if call_id not in calls],
        )

    def _apply(self, names: Sequence[str], call_id: str, step: Any) -> Any:
        """Run ``step(calls, scopes)`` on the scopes ``names`` in one transaction, run again
        from the start when the server rolled it back (a serialization failure or a
        deadlock: nothing of it was kept), :data:`TX_ATTEMPTS` attempts in all."""
        for attempt in range(1, TX_ATTEMPTS + 1):
            try:
                with self._tx() as sql:
                    scopes = self._scopes(sql, names)
                    before = [json.dumps(f) for _, f in scopes]
                    calls = self._calls(sql, call_id) if call_id else {}
                    calls_before = dict(calls)
                    result = step(calls, scopes, sql)
                    self._write(sql, scopes, before, calls, calls_before)
                    return result
            except StoreUnavailable as exc:
                if attempt == TX_ATTEMPTS or not retried(exc):
                    raise
                SystemClock().sleep(tx_backoff(attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    # --- the operations (ScopeOps) ----------------------------------------------------------

    def limit(self, name: str, limits: ScopeLimits, now: float) -> None:
        self._apply([name], "", lambda calls, scopes, sql: scope_limit(scopes[0][1], limits, now))

    def reserve(
        self,
        names: Sequence[str],
        call_id: str,
        need: tuple[float | None, float, float, float],
        now: float,
    ) -> Answer:
        answer: Answer = self._apply(
            names,
            call_id,
            lambda calls, scopes, sql: scopes_reserve(
                calls, scopes, call_id, need, now, self.lease
            ),
        )
        return answer

    async def areserve(
        self,
        names: Sequence[str],
        call_id: str,
        need: tuple[float | None, float, float, float],
        now: float,
    ) -> Answer:
        import asyncio  # only when an async run asks: a sync run loads no asyncio

        return await asyncio.to_thread(self.reserve, names, call_id, need, now)

    def settle(self, names: Sequence[str], call_id: str, used: Four, now: float) -> bool:
        def step(calls: Fields, scopes: list[tuple[str, Fields]], sql: Sql) -> bool:
            counted = scopes_settle(calls, scopes, call_id, used, now)
            sql.run(
                f"DELETE FROM {self.calls_table} WHERE at < ? AND substr(state, 1, 1) = 'd' AND id <> ?",
                [now - self.retention, call_id],
            )
            return counted

        counted: bool = self._apply(names, call_id, step)
        return counted

    async def asettle(self, names: Sequence[str], call_id: str, used: Four, now: float) -> bool:
        import asyncio

        return await asyncio.to_thread(self.settle, names, call_id, used, now)

    def release(self, names: Sequence[str], call_id: str) -> None:
        self._apply(
            names, call_id, lambda calls, scopes, sql: scopes_release(calls, scopes, call_id)
        )

    def view(self, name: str, now: float) -> dict[str, Any]:
        with self._tx() as sql:
            rows = sql.rows(
                f"SELECT fields FROM {self.scopes_table} WHERE name = ?"
                + (" FOR UPDATE" if self.store.dialect == "postgres" else ""),
                [name],
            )
            if not rows:
                return scope_view({}, now, self.lease, {})
            f: Fields = json.loads(rows[0][0])
            before, calls = json.dumps(f), cast(Fields, {})
            v = scope_view(f, now, self.lease, calls)
            self._write(sql, [(name, f)], [before], calls, {})
            return v

    def names(self) -> list[str]:
        with self._tx() as sql:
            rows = sql.rows(f"SELECT name FROM {self.scopes_table} ORDER BY name")
        return [str(r[0]) for r in rows]

    def wait(self, name: str, run_id: str, checkpoint_id: str) -> None:
        with self._tx() as sql:
            sql.run(
                f"INSERT INTO {self.waiting_table} (name, run_id, checkpoint_id) "
                "VALUES (?, ?, ?) ON CONFLICT (name, run_id) "
                "DO UPDATE SET checkpoint_id = EXCLUDED.checkpoint_id",
                [name, run_id, checkpoint_id],
            )

    def unwait(self, names: Sequence[str], run_id: str) -> None:
        with self._tx() as sql:
            sql.many(
                f"DELETE FROM {self.waiting_table} WHERE name = ? AND run_id = ?",
                [(name, run_id) for name in names],
            )

    def waiting(self, name: str) -> dict[str, str]:
        with self._tx() as sql:
            rows = sql.rows(
                f"SELECT run_id, checkpoint_id FROM {self.waiting_table} WHERE name = ? "
                "ORDER BY run_id",
                [name],
            )
        return {str(r[0]): str(r[1]) for r in rows}

    def reset(self) -> None:
        """Forget every scope, call and waiting run of these tables."""
        with self._tx() as sql:
            for table in (self.scopes_table, self.calls_table, self.waiting_table):
                sql.run(f"DELETE FROM {table}")
