"""One place for a guard's records: run outcomes, checkpoints, approvals, handoffs and
dead letters in one database (SQLite file or PostgreSQL), what ``tether serve`` shows.

Besides its document, every run has a row in a table of its own (end time, status, stop
reason, task, cost, steps, and per tool the calls and failures), so that runs are
filtered, counted, paged and searched in SQL over all of them, on SQLite and PostgreSQL
alike. Decided approvals go to the agent's own workers through :meth:`Records.decisions`
(each to one worker, claimed in SQL); :meth:`Records.prune` bounds what is kept.
"""

from __future__ import annotations

import builtins
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from tether._governance import APPROVED, REJECTED, Approvals
from tether._persist import (
    Checkpoints,
    DeadLetters,
    Handoffs,
    PostgresDocuments,
    SqliteDocuments,
    _Collection,
)

if TYPE_CHECKING:
    from tether._effects import Ledger
    from tether.clock import Clock

__all__ = [
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
#: how long a worker holds a decision it took before another worker may take it
DECISION_LEASE = 900.0
DAY = 86_400.0
_RUN_COLUMNS = (
    "run_id",
    "ended_at",
    "status",
    "reason",
    "task",
    "cost_usd",
    "steps",
    "seconds",
    "open_issues",
    "checkpoint_id",
    "handoff_id",
)


@dataclass(frozen=True, slots=True)
class Tables:
    """The table names of one records database, and its dialect's few differences."""

    docs: str
    runs: str
    tools: str
    decisions: str
    dialect: str

    @classmethod
    def of(cls, store: Any) -> Tables:
        docs = str(store.table)
        prefix = "tether_" if docs == "tether_documents" else f"{docs}_"
        return cls(
            docs, f"{prefix}runs", f"{prefix}run_tools", f"{prefix}decisions", str(store.dialect)
        )

    @property
    def ledgers(self) -> tuple[str, ...]:
        """The ledger tables this database may hold: the guard's (``Records.ledger()``) and
        the dead letters' replays."""
        if self.dialect == "postgres":
            return (self.runs.removesuffix("runs") + "ledger", "tether_replays")
        return ("tether_ledger",)

    def field(self, name: str) -> str:
        """A document's top-level JSON field, as text (``name`` is one of ours, never input)."""
        if self.dialect == "postgres":
            return f"(body::jsonb ->> '{name}')"
        return f"json_extract(body, '$.{name}')"

    @property
    def day(self) -> str:
        """The UTC day (days since the epoch) of ``ended_at``."""
        if self.dialect == "postgres":
            return "CAST(FLOOR(ended_at / 86400) AS BIGINT)"
        return "CAST(ended_at / 86400 AS INTEGER)"

    def schema(self) -> list[str]:
        real = "DOUBLE PRECISION"
        return [
            f"CREATE TABLE IF NOT EXISTS {self.runs} (run_id TEXT PRIMARY KEY, "
            f"ended_at {real} NOT NULL, status TEXT NOT NULL, reason TEXT NOT NULL, "
            f"task TEXT NOT NULL, cost_usd {real} NOT NULL, steps INTEGER NOT NULL, "
            f"seconds {real} NOT NULL, open_issues INTEGER NOT NULL, "
            "checkpoint_id TEXT, handoff_id TEXT)",
            f"CREATE INDEX IF NOT EXISTS {self.runs}_by_end ON {self.runs} (ended_at, run_id)",
            f"CREATE INDEX IF NOT EXISTS {self.runs}_by_status ON {self.runs} (status, ended_at)",
            f"CREATE INDEX IF NOT EXISTS {self.runs}_by_reason ON {self.runs} (reason, ended_at)",
            f"CREATE TABLE IF NOT EXISTS {self.tools} (run_id TEXT NOT NULL, tool TEXT NOT NULL, "
            f"calls INTEGER NOT NULL, failures INTEGER NOT NULL, ended_at {real} NOT NULL, "
            "PRIMARY KEY (run_id, tool))",
            f"CREATE INDEX IF NOT EXISTS {self.tools}_by_tool ON {self.tools} (tool, ended_at)",
            f"CREATE INDEX IF NOT EXISTS {self.tools}_by_end ON {self.tools} (ended_at)",
            f"CREATE TABLE IF NOT EXISTS {self.decisions} (approval_id TEXT PRIMARY KEY, "
            f"run_id TEXT NOT NULL, worker TEXT NOT NULL, taken_at {real} NOT NULL, "
            f"lease_until {real} NOT NULL, done_at {real})",
            f"CREATE INDEX IF NOT EXISTS {self.decisions}_by_run ON {self.decisions} (run_id)",
        ]


@dataclass(frozen=True, slots=True)
class RunPage:
    """One page of runs, newest first, and how many match in all."""

    runs: tuple[dict[str, Any], ...]  # run_id, ended_at, status, reason, task, cost_usd, ...
    total: int
    by_status: Mapping[str, int]  # the matching runs by status, whatever the status filter
    offset: int
    limit: int


@dataclass(frozen=True, slots=True)
class Overview:
    """Runs per UTC day (by status, by stop reason), cost per day, the tools that fail most."""

    since: float
    until: float
    days: tuple[float, ...]  # each day's start (epoch seconds, UTC), oldest first
    by_status: Mapping[float, Mapping[str, int]]
    by_reason: Mapping[float, Mapping[str, int]]
    cost_usd: Mapping[float, float]
    failing_tools: tuple[tuple[str, int, int], ...]  # (tool, failures, calls), most failures first


def portable(messages: Any) -> Any:
    """A conversation as plain JSON that a worker in another process hands back to its
    framework: as it is when it is JSON already (the SDKs' dicts, the Agents SDK's input
    items), else pydantic's JSON form of it (PydanticAI's and LangChain's messages, read
    back with ``ModelMessagesTypeAdapter.validate_python`` / ``convert_to_messages``);
    None when it is neither."""
    try:
        return json.loads(json.dumps(messages))
    except (TypeError, ValueError):
        pass
    try:
        from pydantic_core import to_jsonable_python
    except ImportError:  # pragma: no cover - pydantic comes with every framework that needs it
        return None
    try:
        return json.loads(json.dumps(to_jsonable_python(messages)))
    except Exception:
        return None


def _like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _run_row(doc: Mapping[str, Any], at: float) -> tuple[tuple[Any, ...], dict[str, list[int]]]:
    tools: dict[str, list[int]] = {}
    for entry in doc.get("transcript") or ():
        if isinstance(entry, Mapping) and "tool" in entry:
            counts = tools.setdefault(str(entry["tool"])[:200], [0, 0])
            counts[0] += 1
            counts[1] += 0 if entry.get("ok") else 1

    def number(name: str) -> float:
        value = doc.get(name)
        return float(value) if isinstance(value, int | float) and value == value else 0.0

    row = (
        str(doc["run_id"]),
        float(doc.get("ended_at") or at),
        str(doc.get("status") or ""),
        str(doc.get("reason") or ""),
        str(doc.get("task") or "")[:500],
        number("cost_usd"),
        int(number("steps")),
        number("seconds"),
        len(doc.get("open_issues") or ()),
        doc.get("checkpoint_id"),
        doc.get("handoff_id"),
    )
    return row, tools


class Runs(_Collection):
    """Every ended run's outcome (status, reason, usage, cost, duration, task, open issues,
    the customer message, its tool calls and steps), one record per run, the latest state."""

    kind = "run"

    def __init__(
        self, store: SqliteDocuments | PostgresDocuments, tables: Tables | None = None
    ) -> None:
        super().__init__(store)
        self.store: SqliteDocuments | PostgresDocuments = store
        self.tables = tables or Tables.of(store)

    def save(self, doc: dict[str, Any], at: float) -> None:
        """File (or refile: a resumed run keeps its id) a run's record and its index row."""
        t = self.tables
        row, tools = _run_row(doc, at)
        body = json.dumps(doc, default=str)
        marks = ", ".join("?" * len(_RUN_COLUMNS))
        updates = ", ".join(f"{c} = excluded.{c}" for c in _RUN_COLUMNS[1:])
        with self.store.sql(write=True) as sql:
            sql.run(
                f"INSERT INTO {t.docs} (kind, id, created_at, body) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (kind, id) DO UPDATE SET created_at = excluded.created_at, "
                "body = excluded.body",
                (self.kind, row[0], row[1], body),
            )
            sql.run(
                f"INSERT INTO {t.runs} ({', '.join(_RUN_COLUMNS)}) VALUES ({marks}) "
                f"ON CONFLICT (run_id) DO UPDATE SET {updates}",
                row,
            )
            sql.run(f"DELETE FROM {t.tools} WHERE run_id = ?", (row[0],))
            sql.many(
                f"INSERT INTO {t.tools} VALUES (?, ?, ?, ?, ?)",
                [(row[0], name, c[0], c[1], row[1]) for name, c in tools.items()],
            )
            # the run ended after a worker took its decision: that decision is done
            sql.run(
                f"UPDATE {t.decisions} SET done_at = ? WHERE run_id = ? AND done_at IS NULL "
                "AND taken_at <= ?",
                (row[1], row[0], row[1]),
            )

    def get(self, run_id: str) -> dict[str, Any] | None:
        text = self.store.get(self.kind, run_id)
        return None if text is None else dict(json.loads(text))

    def list(self, limit: int = 200) -> list[dict[str, Any]]:
        """The newest runs' records first."""
        page = self.search(limit=limit)
        found = [self.get(r["run_id"]) for r in page.runs]
        return [doc for doc in found if doc is not None]

    def search(
        self,
        *,
        status: str | None = None,
        reason: str | None = None,
        tool: str | None = None,
        text: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> RunPage:
        """Runs that match every filter given, newest first: ``status``, stop ``reason``, a
        ``tool`` they called, ``text`` (the start of a run id, or words of the task, any
        case), and an end time in ``[since, until)`` (epoch seconds); one page of ``limit``
        from ``offset``, with the number that match and their count by status."""
        if not 1 <= limit <= 1000 or offset < 0:
            raise ValueError(f"limit must be 1..1000 and offset >= 0, got {limit}, {offset}")
        t = self.tables
        where: list[str] = []
        params: list[Any] = []
        if reason:
            where.append("reason = ?")
            params.append(reason)
        if tool:
            where.append(f"run_id IN (SELECT run_id FROM {t.tools} WHERE tool = ?)")
            params.append(tool)
        if text and text.strip():
            words = text.strip().lower()
            where.append("(run_id LIKE ? ESCAPE '\\' OR LOWER(task) LIKE ? ESCAPE '\\')")
            params += [_like(text.strip()) + "%", f"%{_like(words)}%"]
        if since is not None:
            where.append("ended_at >= ?")
            params.append(float(since))
        if until is not None:
            where.append("ended_at < ?")
            params.append(float(until))
        clause = " AND ".join(where) or "1 = 1"
        with self.store.sql() as sql:
            counts = sql.rows(
                f"SELECT status, COUNT(*) FROM {t.runs} WHERE {clause} GROUP BY status", params
            )
            by_status = {str(s): int(n) for s, n in counts}
            if status:
                clause += " AND status = ?"
                params.append(status)
            rows = sql.rows(
                f"SELECT {', '.join(_RUN_COLUMNS)} FROM {t.runs} WHERE {clause} "
                "ORDER BY ended_at DESC, run_id DESC LIMIT ? OFFSET ?",
                [*params, limit, offset],
            )
        total = by_status.get(status, 0) if status else sum(by_status.values())
        runs = tuple(dict(zip(_RUN_COLUMNS, r, strict=True)) for r in rows)
        return RunPage(runs, total, by_status, offset, limit)

    def tool_names(self, limit: int = 200) -> builtins.list[str]:
        """The names of the tools runs called (for a filter), in order."""
        with self.store.sql() as sql:
            rows = sql.rows(
                f"SELECT DISTINCT tool FROM {self.tables.tools} ORDER BY tool LIMIT ?", (limit,)
            )
        return [str(r[0]) for r in rows]

    def overview(self, *, since: float, until: float, tools: int = 10) -> Overview:
        """Counts per UTC day over ``[since, until)``, cost per day, the failing tools."""
        t = self.tables
        window = (float(since), float(until))
        with self.store.sql() as sql:
            statuses = sql.rows(
                f"SELECT {t.day} AS day, status, COUNT(*), SUM(cost_usd) FROM {t.runs} "
                "WHERE ended_at >= ? AND ended_at < ? GROUP BY day, status",
                window,
            )
            reasons = sql.rows(
                f"SELECT {t.day} AS day, reason, COUNT(*) FROM {t.runs} WHERE ended_at >= ? "
                "AND ended_at < ? AND status <> 'success' GROUP BY day, reason",
                window,
            )
            failing = sql.rows(
                f"SELECT tool, SUM(failures) AS f, SUM(calls) FROM {t.tools} WHERE "
                "ended_at >= ? AND ended_at < ? GROUP BY tool HAVING SUM(failures) > 0 "
                "ORDER BY f DESC, tool LIMIT ?",
                (*window, tools),
            )
        by_status: dict[float, dict[str, int]] = {}
        cost: dict[float, float] = {}
        for day, status, n, usd in statuses:
            start = float(day) * DAY
            by_status.setdefault(start, {})[str(status)] = int(n)
            cost[start] = cost.get(start, 0.0) + float(usd or 0.0)
        by_reason: dict[float, dict[str, int]] = {}
        for day, reason, n in reasons:
            by_reason.setdefault(float(day) * DAY, {})[str(reason)] = int(n)
        first, last = int(window[0] // DAY), int((window[1] - 1e-9) // DAY)
        days = tuple(float(d) * DAY for d in range(first, last + 1))
        failing_tools = tuple((str(tool), int(f), int(c)) for tool, f, c in failing)
        return Overview(window[0], window[1], days, by_status, by_reason, cost, failing_tools)

    def index_missing(self) -> int:
        """Index the run records filed before runs had a table of their own; how many."""
        t = self.tables
        done = 0
        while True:
            with self.store.sql() as sql:
                batch = sql.rows(
                    f"SELECT d.id, d.body, d.created_at FROM {t.docs} d LEFT JOIN {t.runs} r "
                    "ON r.run_id = d.id WHERE d.kind = 'run' AND r.run_id IS NULL LIMIT 500"
                )
            if not batch:
                return done
            for doc_id, body, at in batch:
                try:
                    doc = json.loads(body)
                except ValueError:
                    doc = None
                if not isinstance(doc, dict):
                    doc = {"status": "unreadable", "reason": "unreadable"}
                self.save({**doc, "run_id": doc_id}, float(at))
                done += 1


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


class Records:
    """Where a guard's runs leave their records: ``Guard(records=Records.sqlite(path))``.

    One database holds the run outcomes (:attr:`runs`), :attr:`checkpoints`,
    :attr:`approvals`, :attr:`handoffs` and :attr:`dead_letters`; a guard given records
    uses them for whichever of ``checkpoints=``/``dead_letters=`` it was not given, and
    files every handoff in :attr:`handoffs` (besides an escalation sink of its own).
    ``tether serve --db`` shows the same database.
    """

    def __init__(self, store: SqliteDocuments | PostgresDocuments) -> None:
        if not isinstance(store, SqliteDocuments | PostgresDocuments):
            raise TypeError(
                "Records keeps its records in SQL: use Records.sqlite(path), "
                f"Records.postgres(dsn) or Records.memory(), got {store!r}"
            )
        self.store = store
        self.tables = Tables.of(store)
        with store.sql(write=True) as sql:
            for statement in self.tables.schema():
                sql.run(statement)
        self.runs = Runs(store, self.tables)
        self.checkpoints = Checkpoints(store)
        self.approvals = Approvals(store)
        self.handoffs = Handoffs(store)
        self.dead_letters = DeadLetters(store)
        self._ledgers: list[Ledger] = []
        self.runs.index_missing()

    def __repr__(self) -> str:
        return f"Records({type(self.store).__name__})"

    @classmethod
    def memory(cls) -> Records:
        """Records in this process's memory (an in-memory SQLite database)."""
        return cls(SqliteDocuments(":memory:"))

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
        from tether._codec import RedactingCodec
        from tether._effects import Ledger

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
        if not lease > 0:
            raise ValueError(f"lease must be > 0 seconds, got {lease!r}")
        import os
        import socket

        worker = worker or f"{socket.gethostname()}:{os.getpid()}"
        t = self.tables
        status = t.field("status")
        while True:
            now = time.time()
            with self.store.sql() as sql:
                rows = sql.rows(
                    f"SELECT id, body FROM {t.docs} d WHERE kind = 'approval' AND {status} "
                    f"IN (?, ?) AND NOT EXISTS (SELECT 1 FROM {t.decisions} c WHERE "
                    "c.approval_id = d.id AND (c.done_at IS NOT NULL OR c.lease_until > ?)) "
                    "ORDER BY created_at, id LIMIT ?",
                    (APPROVED, REJECTED, now, limit),
                )
            if not rows:
                return
            taken = 0
            for approval_id, body in rows:
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
            text = self.store.get("checkpoint", checkpoint_id)
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

    def pending(
        self, kind: str, states: tuple[str, ...], *, limit: int = 200, offset: int = 0
    ) -> tuple[list[dict[str, Any]], int]:
        """Documents of ``kind`` ("approval": by status; "handoff": by state) in
        ``states``, oldest first, and how many there are."""
        t = self.tables
        name = t.field("status" if kind == "approval" else "state")
        value = f"COALESCE({name}, 'open')" if kind == "handoff" else name
        marks = ", ".join("?" * len(states))
        where = f"kind = ? AND {value} IN ({marks})"
        with self.store.sql() as sql:
            (count,) = sql.rows(f"SELECT COUNT(*) FROM {t.docs} WHERE {where}", (kind, *states))[0]
            rows = sql.rows(
                f"SELECT body FROM {t.docs} WHERE {where} ORDER BY created_at, id LIMIT ? OFFSET ?",
                (kind, *states, limit, offset),
            )
        return [json.loads(r[0]) for r in rows], int(count)

    def recent(
        self, kind: str, states: tuple[str, ...], *, limit: int = 20
    ) -> list[dict[str, Any]]:
        """The newest documents of ``kind`` in ``states``."""
        t = self.tables
        name = t.field("status" if kind == "approval" else "state")
        marks = ", ".join("?" * len(states))
        with self.store.sql() as sql:
            rows = sql.rows(
                f"SELECT body FROM {t.docs} WHERE kind = ? AND {name} IN ({marks}) "
                "ORDER BY created_at DESC, id DESC LIMIT ?",
                (kind, *states, limit),
            )
        return [json.loads(r[0]) for r in rows]

    # --- retention -------------------------------------------------------------------------

    def prune(
        self,
        older_than: timedelta = DEFAULT_RETENTION,
        *,
        now: float | None = None,
        vacuum: bool = False,
    ) -> Pruned:
        """Remove what is older than ``older_than`` (default 30 days) and done with.

        Kept whatever its age: approvals waiting for a decision, decisions no worker has
        resumed yet, open and claimed cases, dead letters not yet replayed, the runs these
        belong to with their latest checkpoints, and ledger records inside their ttl.
        Removed when older: run records, checkpoints, used or resumed approvals, resolved
        cases, replayed dead letters, and ledger records past their ttl. ``vacuum=True``
        gives the space back to the file system (SQLite's ``VACUUM``).
        """
        from tether._retention import prune

        pruned: Pruned = prune(self, older_than, time.time() if now is None else now, vacuum)
        return pruned

    def close(self) -> None:
        for ledger in self._ledgers:
            ledger.close()
        self.dead_letters.close()  # its replay ledger, then the shared connection

    def __enter__(self) -> Records:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class Pruned:
    """What :meth:`Records.prune` removed, by kind of record."""

    runs: int = 0
    checkpoints: int = 0
    approvals: int = 0
    handoffs: int = 0
    dead_letters: int = 0
    ledger: int = 0

    @property
    def total(self) -> int:
        return (
            self.runs
            + self.checkpoints
            + self.approvals
            + self.handoffs
            + self.dead_letters
            + self.ledger
        )
