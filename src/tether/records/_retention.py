"""Retention of a records database: what :meth:`tether.Records.prune` removes and keeps.

A record older than the cutoff goes once nobody needs it: a run record once no pending
approval, live decision, open case or unreplayed dead letter points at its run; a
checkpoint unless such a run (or approval) resumes from it; an approval once its run was
resumed past it; a case once resolved; a dead letter once replayed; a ledger record once
its ttl ended before the cutoff.

One clock judges age: the database's own (SQLite's and PostgreSQL's ``now``), never the
pruning host's. Whether a decision is live is judged by no clock at all: a decided approval
is done when a worker's resumed run ended it (``records.decisions()``), or when its run's
newest record has moved past the checkpoint the approval resumes from (a resumed run files
a record with a checkpoint of its own). Comparing the approver's time of decision with the
run's time of end took an approval decided on a clock that was behind for one already
resumed, and removed it with its run and checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any

from tether.records._approvals import PENDING
from tether.records._collections import CaseState
from tether.records._runs import Tables
from tether.stores._documents import DocKind, PostgresDocuments, Sql, SqliteDocuments
from tether.stores._sql import DIALECTS

__all__ = ["Pruned", "prune"]


@dataclass(frozen=True, slots=True)
class Pruned:
    """What :meth:`Records.prune` removed, by kind of record (every count given)."""

    runs: int
    checkpoints: int
    approvals: int
    handoffs: int
    dead_letters: int
    #: ledger records past their ttl
    ledger: int

    @property
    def total(self) -> int:
        """Every record removed."""
        return sum(getattr(self, f.name) for f in fields(self))


def prune(
    t: Tables,
    store: SqliteDocuments | PostgresDocuments,
    older_than: timedelta,
    vacuum: bool,
) -> Pruned:
    if not isinstance(older_than, timedelta):
        raise TypeError(
            f"older_than must be a datetime.timedelta (e.g. timedelta(days=30)), got {older_than!r}"
        )
    if older_than < timedelta(0):
        raise ValueError(f"older_than must be >= 0, got {older_than!r}")
    with store.sql() as sql:
        now = float(sql.rows(DIALECTS[t.dialect].clock)[0][0])  # the database's clock
        cutoff = now - older_than.total_seconds()
        keep_runs, keep_checkpoints, old_approvals = _kept(t, sql, cutoff)
        old_runs = [
            str(r[0])
            for r in sql.rows(f"SELECT run_id FROM {t.runs} WHERE ended_at < ?", (cutoff,))
        ]
        latest = sql.rows(
            f"SELECT checkpoint_id FROM {t.runs} WHERE checkpoint_id IS NOT NULL AND run_id IN "
            f"(SELECT run_id FROM {t.runs} WHERE ended_at >= ?)",
            (cutoff,),
        )
        keep_checkpoints.update(str(r[0]) for r in latest)
        for run_id in keep_runs:
            row = sql.rows(f"SELECT checkpoint_id FROM {t.runs} WHERE run_id = ?", (run_id,))
            keep_checkpoints.update(str(r[0]) for r in row if r[0])
        checkpoints = _old(sql, t.docs, DocKind.CHECKPOINT, cutoff)
        handoffs = [
            i
            for i, d in _old_docs(sql, t.docs, DocKind.HANDOFF, cutoff)
            if d.get("state") == CaseState.RESOLVED
        ]
        letters = [
            i
            for i, d in _old_docs(sql, t.docs, DocKind.DEAD_LETTER, cutoff)
            if d.get("replayed") is True
        ]
        ledgers = [name for name in t.ledgers if _has_table(sql, t.dialect, name)]
    runs = [r for r in old_runs if r not in keep_runs]
    checkpoints = [c for c in checkpoints if c not in keep_checkpoints]
    ledger = 0
    with store.sql(write=True) as sql:
        for start in range(0, len(runs), 500):
            chunk = runs[start : start + 500]
            marks = ", ".join("?" * len(chunk))
            sql.run(f"DELETE FROM {t.docs} WHERE kind = 'run' AND id IN ({marks})", chunk)
            sql.run(f"DELETE FROM {t.tools} WHERE run_id IN ({marks})", chunk)
            sql.run(f"DELETE FROM {t.runs} WHERE run_id IN ({marks})", chunk)
        for kind, ids in (
            (DocKind.CHECKPOINT, checkpoints),
            (DocKind.APPROVAL, old_approvals),
            (DocKind.HANDOFF, handoffs),
            (DocKind.DEAD_LETTER, letters),
        ):
            _delete(sql, t.docs, kind, ids)
        sql.many(f"DELETE FROM {t.decisions} WHERE approval_id = ?", [(a,) for a in old_approvals])
        for name in ledgers:  # their ttl ended before the cutoff: absent to every ledger
            ledger += sql.run(
                f"DELETE FROM {name} WHERE expires_at <= ? AND created_at < ?", (cutoff, cutoff)
            )
    if vacuum and t.dialect == "sqlite":
        with store.sql() as sql:
            sql.run("VACUUM")
            sql.rows("PRAGMA wal_checkpoint(TRUNCATE)")
    return Pruned(
        runs=len(runs),
        checkpoints=len(checkpoints),
        approvals=len(old_approvals),
        handoffs=len(handoffs),
        dead_letters=len(letters),
        ledger=ledger,
    )


def _kept(t: Tables, sql: Sql, cutoff: float) -> tuple[set[str], set[str], list[str]]:
    """The runs and checkpoints that must stay, and the old approvals that may go."""
    keep_runs: set[str] = set()
    keep_checkpoints: set[str] = set()
    done = {
        str(r[0])
        for r in sql.rows(f"SELECT approval_id FROM {t.decisions} WHERE done_at IS NOT NULL")
    }
    newest: dict[str, str | None] = {
        str(r[0]): None if r[1] is None else str(r[1])
        for r in sql.rows(
            f"SELECT run_id, checkpoint_id FROM {t.runs} WHERE run_id IN "
            f"(SELECT {t.field('run_id')} FROM {t.docs} WHERE kind = '{DocKind.APPROVAL}')"
        )
    }
    removable: list[str] = []
    for doc_id, doc, at in _docs(sql, t.docs, DocKind.APPROVAL):
        run_id, checkpoint = str(doc.get("run_id") or ""), str(doc.get("checkpoint_id") or "")
        # resumed past its checkpoint: the run's newest record has another (no clock asked)
        moved_on = newest.get(run_id) not in (None, checkpoint)
        if doc.get("status") == PENDING or not (doc_id in done or moved_on):
            keep_runs.add(run_id)
            keep_checkpoints.add(checkpoint)
        elif at < cutoff:
            removable.append(doc_id)
    for _, doc, _ in _docs(sql, t.docs, DocKind.HANDOFF):
        if doc.get("state", CaseState.OPEN) != CaseState.RESOLVED:
            keep_runs.add(str(doc.get("run_id") or ""))
    for _, doc, _ in _docs(sql, t.docs, DocKind.DEAD_LETTER):
        if doc.get("replayed") is not True:
            keep_runs.add(str(doc.get("run_id") or ""))
    return keep_runs, keep_checkpoints, removable


def _docs(sql: Sql, table: str, kind: str) -> Iterable[tuple[str, dict[str, Any], float]]:
    for doc_id, body, at in sql.rows(
        f"SELECT id, body, created_at FROM {table} WHERE kind = ?", (kind,)
    ):
        try:
            doc = json.loads(body)
        except ValueError:
            continue
        if isinstance(doc, dict):
            yield str(doc_id), doc, float(at)


def _old(sql: Sql, table: str, kind: str, cutoff: float) -> list[str]:
    rows = sql.rows(f"SELECT id FROM {table} WHERE kind = ? AND created_at < ?", (kind, cutoff))
    return [str(r[0]) for r in rows]


def _old_docs(sql: Sql, table: str, kind: str, cutoff: float) -> list[tuple[str, dict[str, Any]]]:
    return [(i, d) for i, d, at in _docs(sql, table, kind) if at < cutoff]


def _delete(sql: Sql, table: str, kind: str, ids: list[str]) -> None:
    sql.many(f"DELETE FROM {table} WHERE kind = ? AND id = ?", [(kind, i) for i in ids])


def _has_table(sql: Sql, dialect: str, name: str) -> bool:
    return bool(sql.rows(DIALECTS[dialect].has_table, (name,))[0][0])
