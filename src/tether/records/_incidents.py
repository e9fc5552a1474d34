"""Incidents: the runs one outage stopped, filed as one case.

When a dependency is down (its breaker open: the model provider, a tool's service), every
conversation that meets it ends ``CIRCUIT_OPEN`` at about the same time. A case per run
would fill the inbox with copies of one problem; instead each such run joins the open
incident of its dependency, one case that lists the runs it stopped (their records name
it as their ``handoff_id``) and is resolved once, for all of them.

One row per dependency in the incidents table names its current case. Joining it is one
transaction: the row is read and locked (PostgreSQL: ``FOR UPDATE``; SQLite: the
database's write lock, ``BEGIN IMMEDIATE``), and a new case is made only when there is
none, when it was resolved, or when no run joined it for :data:`INCIDENT_GAP` seconds (a
later outage). Workers that file at the same moment, threads or processes, on SQLite or
PostgreSQL, therefore get one case between them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tether.records._collections import CaseState
from tether.stores._documents import DocKind

if TYPE_CHECKING:
    from tether.records._runs import Tables
    from tether.stores._documents import PostgresDocuments, SqliteDocuments

__all__ = ["INCIDENT_GAP", "Incidents"]

#: a run stopped by a dependency this long after the last run of its open incident starts
#: a new incident (seconds): the dependency recovered in between
INCIDENT_GAP = 1800.0


class Incidents:
    """The open incident of each dependency (``records.incidents``)."""

    def __init__(self, store: SqliteDocuments | PostgresDocuments, tables: Tables) -> None:
        self.store = store
        self.tables = tables

    def join(
        self, dependency: str, at: float, new_case: Callable[[], dict[str, Any]]
    ) -> tuple[str, bool]:
        """The case of ``dependency``'s open incident, and whether this call opened it
        (``new_case()`` makes the case document, filed in the same transaction)."""
        t = self.tables
        lock = " FOR UPDATE" if t.dialect == "postgres" else ""
        with self.store.sql(write=True) as sql:
            for _ in range(2):  # a second look only after another worker inserted the row
                rows = sql.rows(
                    f"SELECT handoff_id, last_at FROM {t.incidents} WHERE dependency = ?{lock}",
                    [dependency],
                )
                if rows:
                    case_id, last_at = str(rows[0][0]), float(rows[0][1])
                    body = sql.rows(
                        f"SELECT body FROM {t.docs} WHERE kind = ? AND id = ?",
                        [DocKind.HANDOFF.value, case_id],
                    )
                    state = json.loads(body[0][0]).get("state") if body else None
                    if (
                        state in (CaseState.OPEN, CaseState.CLAIMED, None)
                        and body
                        and (at - last_at <= INCIDENT_GAP)
                    ):
                        sql.run(
                            f"UPDATE {t.incidents} SET last_at = ?, runs = runs + 1 "
                            "WHERE dependency = ?",
                            [max(at, last_at), dependency],
                        )
                        return case_id, False
                    doc = new_case()
                    sql.run(
                        f"UPDATE {t.incidents} SET handoff_id = ?, opened_at = ?, last_at = ?, "
                        "runs = 1 WHERE dependency = ?",
                        [doc["id"], at, at, dependency],
                    )
                else:
                    doc = new_case()
                    added = sql.run(
                        f"INSERT INTO {t.incidents} (dependency, handoff_id, opened_at, last_at, "
                        "runs) VALUES (?, ?, ?, ?, 1) ON CONFLICT (dependency) DO NOTHING",
                        [dependency, doc["id"], at, at],
                    )
                    if not added:  # another worker opened it meanwhile: join that one
                        continue
                sql.run(  # the documents table's own upsert, in this transaction
                    t.sql.upsert.format(table=t.docs),
                    [
                        DocKind.HANDOFF.value,
                        doc["id"],
                        float(doc["at"]),
                        json.dumps(doc, default=str),
                    ],
                )
                return str(doc["id"]), True
        raise RuntimeError(f"the incident of {dependency!r} could not be joined")  # unreachable

    def runs(self, case_id: str, limit: int = 200) -> tuple[list[dict[str, Any]], int]:
        """The runs an incident's case holds (newest first), and how many in all."""
        t = self.tables
        with self.store.sql() as sql:
            total = int(
                sql.rows(f"SELECT COUNT(*) FROM {t.runs} WHERE handoff_id = ?", [case_id])[0][0]
            )
            rows = sql.rows(
                f"SELECT run_id, ended_at, status, task FROM {t.runs} WHERE handoff_id = ? "
                "ORDER BY ended_at DESC, run_id LIMIT ?",
                [case_id, limit],
            )
        runs = [{"run_id": r[0], "ended_at": r[1], "status": r[2], "task": r[3]} for r in rows]
        return runs, total
