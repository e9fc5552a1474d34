"""Decided approvals, for the agent's own workers (:meth:`tether.Records.decisions`): each
taken by one worker, atomically in SQL, and held for a lease until its resumed run ends."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from tether.records._approvals import APPROVED, REJECTED
from tether.records._runs import Tables
from tether.stores._documents import DocKind, PostgresDocuments, SqliteDocuments

__all__ = ["DECISION_LEASE", "Decision", "Decisions"]

#: how long a worker holds a decision it took before another worker may take it
DECISION_LEASE = 900.0
#: the documents of a kind in some states, oldest first: (created_at, id, body) rows
#: (``Records``'s query by state)
Query = Callable[..., list[tuple[float, str, str]]]


@dataclass(frozen=True, slots=True)
class Decision:
    """A person's decision on a call that waited for approval, for a worker to resume.

    ``approved`` tells which; the run resumes from ``checkpoint_id`` (``guard.resume`` or
    an adapter's ``resume=``) with ``messages`` (its conversation, when an agent loop kept
    one) and makes the approved call once, or reads the rejection."""

    approval_id: str
    run_id: str
    checkpoint_id: str
    tool: str
    args: Any  # redacted: what the approver saw
    approved: bool
    decided_by: str
    note: str
    decided_at: float
    task: str
    worker: str
    messages: tuple[Any, ...] = field(default=())


class Decisions:
    """The decided approvals of one records database, and who took each."""

    def __init__(
        self, store: SqliteDocuments | PostgresDocuments, tables: Tables, docs: Query
    ) -> None:
        self.store = store
        self.tables = tables
        self.docs = docs

    def take(self, *, worker: str, lease: float, limit: int) -> Iterator[Decision]:
        """:meth:`tether.Records.decisions`."""
        if not lease > 0:
            raise ValueError(f"lease must be > 0 seconds, got {lease!r}")
        import os
        import socket

        worker = worker or f"{socket.gethostname()}:{os.getpid()}"
        t = self.tables
        untaken = (
            f" AND NOT EXISTS (SELECT 1 FROM {t.decisions} c WHERE c.approval_id = d.id AND "
            "(c.done_at IS NOT NULL OR c.lease_until > ?))"
        )
        while True:
            rows = self.docs(
                DocKind.APPROVAL,
                (APPROVED, REJECTED),
                limit,
                newest=False,
                extra=untaken,
                params=(time.time(),),
            )
            if not rows:
                return
            taken = 0
            for _, approval_id, body in rows:
                doc = json.loads(body)
                if self._take(str(approval_id), str(doc.get("run_id") or ""), worker, lease):
                    taken += 1
                    yield self._decision(doc, worker)
            if taken == 0 or len(rows) < limit:
                return

    def _take(self, approval_id: str, run_id: str, worker: str, lease: float) -> bool:
        t, now = self.tables, time.time()
        with self.store.sql(write=True) as sql:
            changed = sql.run(
                f"INSERT INTO {t.decisions} (approval_id, run_id, worker, taken_at, lease_until, "
                "done_at) VALUES (?, ?, ?, ?, ?, NULL) ON CONFLICT (approval_id) DO UPDATE SET "
                "worker = excluded.worker, taken_at = excluded.taken_at, lease_until = "
                f"excluded.lease_until WHERE {t.decisions}.done_at IS NULL AND "
                f"{t.decisions}.lease_until <= ?",
                (approval_id, run_id, worker, now, now + lease, now),
            )
        return changed == 1

    def _decision(self, doc: Mapping[str, Any], worker: str) -> Decision:
        checkpoint_id = str(doc.get("checkpoint_id") or "")
        messages: tuple[Any, ...] = ()
        if checkpoint_id:
            text = self.store.get(DocKind.CHECKPOINT, checkpoint_id)
            stored = json.loads(text).get("messages") if text else None
            messages = tuple(stored) if isinstance(stored, list) else ()
        return Decision(
            str(doc["id"]),
            str(doc.get("run_id") or ""),
            checkpoint_id,
            str(doc.get("tool") or ""),
            doc.get("args"),
            doc.get("status") == APPROVED,
            str(doc.get("decided_by") or ""),
            str(doc.get("note") or ""),
            float(doc.get("decided_at") or 0.0),
            str(doc.get("task") or ""),
            worker,
            messages,
        )

    def resumptions(self, approval_ids: list[str]) -> dict[str, dict[str, Any]]:
        """For each decided approval, who took it and when, and whether it is done."""
        if not approval_ids:
            return {}
        t = self.tables
        marks = ", ".join("?" * len(approval_ids))
        with self.store.sql() as sql:
            rows = sql.rows(
                f"SELECT approval_id, worker, taken_at, lease_until, done_at FROM {t.decisions} "
                f"WHERE approval_id IN ({marks})",
                approval_ids,
            )
        keys = ("worker", "taken_at", "lease_until", "done_at")
        return {str(r[0]): dict(zip(keys, r[1:], strict=True)) for r in rows}
