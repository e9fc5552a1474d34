"""One place for a guard's records: run outcomes, checkpoints, approvals, handoffs and
dead letters in one database (SQLite file or PostgreSQL), what ``tether serve`` shows.

The runs are indexed for search (:mod:`tether.records._runs`). Decided approvals go to the
agent's own workers through :meth:`Records.decisions` (each to one worker, claimed in
SQL); :meth:`Records.prune` bounds what is kept.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Self

from tether.records._approvals import Approvals
from tether.records._collections import (
    CaseState,
    Checkpoints,
    DeadLetters,
    Handoffs,
    OnDocuments,
)
from tether.records._decisions import DECISION_LEASE, Decision, Decisions
from tether.records._incidents import Incidents
from tether.records._retention import Pruned, prune
from tether.records._runs import DAY, Overview, RunPage, Runs, Tables, portable
from tether.stores._documents import DocKind, PostgresDocuments, SqliteDocuments
from tether.stores._scopes_sql import SqlScopes

if TYPE_CHECKING:
    from tether.clock import Clock
    from tether.effects._ledger import Ledger

__all__ = [
    "DAY",
    "DEFAULT_RETENTION",
    "Decision",
    "Overview",
    "Pruned",
    "RunPage",
    "Records",
    "Runs",
    "portable",
]

#: how old a record must be before ``Records.prune()`` (and ``tether records prune``) removes it
DEFAULT_RETENTION = timedelta(days=30)
#: the field that holds each kind's state (indexed: the inbox and the workers query by it)
_STATE_FIELDS: dict[str, str] = {DocKind.APPROVAL: "status", DocKind.HANDOFF: "state"}


class Records(OnDocuments):
    """Where a guard's runs leave their records: ``Guard(records=Records.sqlite(path))``.

    One database holds the run outcomes (:attr:`runs`), :attr:`checkpoints`,
    :attr:`approvals`, :attr:`handoffs` and :attr:`dead_letters`; a guard given records
    uses them for whichever of ``checkpoints=``/``dead_letters=`` it was not given, and
    files every handoff in :attr:`handoffs` (besides an escalation sink of its own).
    ``tether serve --db`` shows the same database.
    """

    store: SqliteDocuments | PostgresDocuments

    def __init__(self, store: SqliteDocuments | PostgresDocuments) -> None:
        if not isinstance(store, SqliteDocuments | PostgresDocuments):
            raise TypeError(
                "Records keeps its records in SQL: use Records.sqlite(path), "
                f"Records.postgres(dsn) or Records.memory(), got {store!r}"
            )
        self.store = store
        self.tables = Tables.of(store)
        store.create_schema(self.tables.schema())
        self.runs = Runs(store, self.tables)
        self.checkpoints = Checkpoints(store)
        self.approvals = Approvals(store)
        self.handoffs = Handoffs(store)
        self.dead_letters = DeadLetters(store)
        #: each dependency's open incident: the runs one outage stopped, one case
        self.incidents = Incidents(store, self.tables)
        self._ledgers: list[Ledger] = []
        self._decisions = Decisions(store, self.tables, self._docs)
        self._scopes: SqlScopes | None = None
        self.runs.index_missing()

    def __repr__(self) -> str:
        return f"Records({type(self.store).__name__})"

    @classmethod
    def memory(cls) -> Self:
        """Records in this process's memory (an in-memory SQLite database)."""
        return cls(SqliteDocuments(":memory:"))

    @staticmethod
    def is_dsn(where: str) -> bool:
        """A PostgreSQL DSN (``postgresql://...`` or ``host=... dbname=...``), not a path."""
        return where.startswith(("postgres://", "postgresql://")) or (
            "=" in where and " " in where.strip()
        )

    @classmethod
    def open(cls, where: str) -> Records:
        """A PostgreSQL DSN (``postgresql://...``) or a SQLite path."""
        return cls.postgres(where) if cls.is_dsn(where) else cls.sqlite(where)

    def ledger(self, *, clock: Clock | None = None) -> Ledger:
        """A ledger in this database (the same SQLite file or PostgreSQL database; memory
        for memory records): what a guard given these records and no ``ledger=`` uses, so
        that every worker on the database runs each effect once. Closed with the records."""
        from tether.effects._codec import RedactingCodec
        from tether.effects._ledger import Ledger

        # results stored redacted: no secret in the records database (a replay returns that)
        settings: dict[str, Any] = {"codec": RedactingCodec()}
        if clock is not None:
            settings["clock"] = clock
        store = self.store
        if isinstance(store, SqliteDocuments) and store.path != ":memory:":
            made = Ledger.sqlite(store.path, **settings)
        elif isinstance(store, PostgresDocuments):
            table = (
                "tether_ledger" if store.table == "tether_documents" else f"{store.table}_ledger"
            )
            made = Ledger.postgres(store.dsn, table=table, **settings)
        else:
            made = Ledger.memory(**settings)
        self._ledgers.append(made)
        return made

    def scopes(self) -> SqlScopes:
        """The budget scopes' operations in this database (what
        ``tether.BudgetScopes(store=records)`` uses): every process on the database shares
        them, one transaction per model call for all of its scopes."""
        if self._scopes is None:
            prefix = self.tables.runs.removesuffix("runs")
            self._scopes = SqlScopes(self.store, prefix)
        return self._scopes

    # --- decided approvals, for the agent's workers ----------------------------------------

    def decisions(
        self, *, worker: str = "", lease: float = DECISION_LEASE, limit: int = 100
    ) -> Iterator[Decision]:
        """The approvals decided since, each given to one worker: iterate, and resume each.

        Every decided approval (approved or rejected) whose run has not resumed is taken,
        atomically in SQL, by the first worker that reaches it; any number of workers,
        threads or processes can iterate at once and none gets a decision another holds.
        A decision is done once its resumed run ends (its run record is filed in these
        records: give the worker's guard ``records=`` this database); a worker that dies
        before that loses it after ``lease`` seconds, and the next worker gets it again (the
        ledger still runs the approved call at most once). Oldest decision first; each
        iteration looks once (loop with a pause to keep watching).

        >>> for decision in records.decisions(worker="billing-1"):   # doctest: +SKIP
        ...     with guard.resume(decision.checkpoint_id) as run:
        ...         ...   # the agent's loop, as before the stop
        """
        return self._decisions.take(worker=worker, lease=lease, limit=limit)

    def resumptions(self, approval_ids: list[str]) -> dict[str, dict[str, Any]]:
        """For each decided approval, who took it and when, and whether it is done."""
        return self._decisions.resumptions(approval_ids)

    def _parts(self, kind: str, states: tuple[str, ...]) -> list[tuple[str, list[Any]]]:
        """Documents of ``kind`` in ``states``: one condition per state, each an equality
        the partial index on the state answers (with ``IN`` or ``OR`` SQLite scans the kind
        instead); the kind written out, as a partial index needs."""
        if kind not in _STATE_FIELDS:
            raise ValueError(f"kind must be one of {sorted(_STATE_FIELDS)}, got {kind!r}")
        name = self.tables.field(_STATE_FIELDS[kind])
        parts = [(f"kind = '{kind}' AND {name} = ?", [state]) for state in states]
        if kind == DocKind.HANDOFF and CaseState.OPEN in states:  # filed before cases had one
            parts.append((f"kind = '{kind}' AND {name} IS NULL", []))
        return parts

    def _docs(
        self,
        kind: str,
        states: tuple[str, ...],
        n: int,
        *,
        newest: bool,
        extra: str = "",
        params: tuple[Any, ...] = (),
    ) -> list[tuple[float, str, str]]:
        """The first ``n`` (created_at, id, body) of each state, merged in order."""
        import heapq

        order = "DESC" if newest else ""
        found = []
        with self.store.sql() as sql:
            for where, values in self._parts(kind, states):
                found.append(
                    sql.rows(
                        f"SELECT created_at, id, body FROM {self.tables.docs} d WHERE {where}{extra} "
                        f"ORDER BY created_at {order}, id {order} LIMIT ?",
                        [*values, *params, n],
                    )
                )
        key = (lambda r: (-r[0], r[1])) if newest else (lambda r: (r[0], r[1]))
        return list(heapq.merge(*found, key=key))[:n]

    def pending(
        self, kind: str, states: tuple[str, ...], *, limit: int = 200, offset: int = 0
    ) -> tuple[list[dict[str, Any]], int]:
        """Documents of ``kind`` ("approval": by status; "handoff": by state) in
        ``states``, oldest first, and how many there are."""
        count = 0
        with self.store.sql() as sql:
            for where, values in self._parts(kind, states):
                count += int(
                    sql.rows(f"SELECT COUNT(*) FROM {self.tables.docs} WHERE {where}", values)[0][0]
                )
        rows = self._docs(kind, states, offset + limit, newest=False)[offset:]
        return [json.loads(r[2]) for r in rows], count

    def recent(
        self, kind: str, states: tuple[str, ...], *, limit: int = 20
    ) -> list[dict[str, Any]]:
        """The newest documents of ``kind`` in ``states``."""
        return [json.loads(r[2]) for r in self._docs(kind, states, limit, newest=True)]

    # --- retention -------------------------------------------------------------------------

    def prune(self, older_than: timedelta = DEFAULT_RETENTION, *, vacuum: bool = False) -> Pruned:
        """Remove what is older than ``older_than`` (default 30 days) and done with.

        Kept whatever its age: approvals waiting for a decision, decisions not yet resumed
        (a decided approval whose run has not moved past its checkpoint, or that a worker
        took and has not ended), open and claimed cases, dead letters not yet replayed, the
        runs these belong to with their checkpoints, and ledger records whose ttl ended
        after the cutoff. Removed when older: run records, checkpoints, approvals whose run
        was resumed, resolved cases, replayed dead letters. Age is judged on the database's
        clock (never this host's), and whether a decision is live on no clock at all.
        ``vacuum=True`` gives the space back to the file system (SQLite's ``VACUUM``).
        """
        return prune(self.tables, self.store, older_than, vacuum)

    def close(self) -> None:
        for ledger in self._ledgers:
            ledger.close()
        self.dead_letters.close()  # its replay ledger, then the shared connection

    def __enter__(self) -> Self:
        return self
