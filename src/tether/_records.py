"""One place for a guard's records: run outcomes, checkpoints, approvals, handoffs and
dead letters in one database (SQLite file or PostgreSQL), what ``tether serve`` shows."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tether._governance import Approvals
from tether._persist import (
    Checkpoints,
    DeadLetters,
    DocumentStore,
    Handoffs,
    MemoryDocuments,
    PostgresDocuments,
    SqliteDocuments,
    _Collection,
)

if TYPE_CHECKING:
    from tether._effects import Ledger
    from tether.clock import Clock

__all__ = ["Records", "Runs"]


class Runs(_Collection):
    """Every ended run's outcome (status, reason, usage, cost, duration, task, open issues,
    the customer message, its tool calls and steps), one record per run, the latest state."""

    kind = "run"

    def save(self, doc: dict[str, Any], at: float) -> None:
        self.store.put(self.kind, str(doc["run_id"]), doc, at)

    def get(self, run_id: str) -> dict[str, Any] | None:
        text = self.store.get(self.kind, run_id)
        return None if text is None else dict(json.loads(text))

    def list(self, limit: int = 200) -> list[dict[str, Any]]:
        """The newest runs first."""
        rows = [json.loads(text) for _, text in self.store.list(self.kind, limit)]
        return sorted(rows, key=lambda d: d.get("ended_at") or 0.0, reverse=True)


class Records:
    """Where a guard's runs leave their records: ``Guard(records=Records.sqlite(path))``.

    One database holds the run outcomes (:attr:`runs`), :attr:`checkpoints`,
    :attr:`approvals`, :attr:`handoffs` and :attr:`dead_letters`; a guard given records
    uses them for whichever of ``checkpoints=``/``dead_letters=`` it was not given, and
    files every handoff in :attr:`handoffs` (besides an escalation sink of its own).
    ``tether serve --db`` shows the same database.
    """

    def __init__(self, store: DocumentStore) -> None:
        self.store = store
        self.runs = Runs(store)
        self.checkpoints = Checkpoints(store)
        self.approvals = Approvals(store)
        self.handoffs = Handoffs(store)
        self.dead_letters = DeadLetters(store)
        self._ledgers: list[Ledger] = []

    def __repr__(self) -> str:
        return f"Records({type(self.store).__name__})"

    @classmethod
    def memory(cls) -> Records:
        return cls(MemoryDocuments())

    @classmethod
    def sqlite(cls, path: str) -> Records:
        return cls(SqliteDocuments(path))

    @classmethod
    def postgres(cls, dsn: str, table: str = "tether_documents") -> Records:
        return cls(PostgresDocuments(dsn, table))

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
        from tether._effects import Ledger

        settings: dict[str, Any] = {} if clock is None else {"clock": clock}
        store = self.store
        if isinstance(store, SqliteDocuments):
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

    def close(self) -> None:
        for ledger in self._ledgers:
            ledger.close()
        self.dead_letters.close()  # its replay ledger, then the shared connection

    def __enter__(self) -> Records:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
