"""The runs of a records database, indexed for ``tether serve``: one row per run (end
time, status, stop reason, task, cost, steps, open issues) in a table of its own, and per
tool the calls and failures, so that runs are filtered, counted, paged and searched in SQL
over all of them, on SQLite and PostgreSQL alike (:class:`Runs`, ``records.runs``).
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tether.records._collections import _Collection
from tether.stores._documents import DocKind, PostgresDocuments, SqliteDocuments
from tether.stores._sql import DIALECTS, Dialect

__all__ = ["DAY", "Overview", "RunPage", "Runs", "Tables", "portable"]

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

    @property
    def incidents(self) -> str:
        """The table of each dependency's open incident (records/_incidents.py)."""
        return self.runs.removesuffix("runs") + "incidents"

    @property
    def sql(self) -> Dialect:
        """The dialect's differences (stores/_sql.py)."""
        return DIALECTS[self.dialect]

    def field(self, name: str) -> str:
        """A document's top-level JSON field, as text (``name`` is one of ours, never input)."""
        return self.sql.field(name)

    @property
    def day(self) -> str:
        """The UTC day (days since the epoch) of ``ended_at``."""
        return self.sql.day("ended_at")

    def schema(self) -> list[str]:
        real = "DOUBLE PRECISION"  # on SQLite too: the type these tables were made with
        return [
            f"CREATE TABLE IF NOT EXISTS {self.runs} (run_id TEXT PRIMARY KEY, "
            f"ended_at {real} NOT NULL, status TEXT NOT NULL, reason TEXT NOT NULL, "
            f"task TEXT NOT NULL, cost_usd {real} NOT NULL, steps INTEGER NOT NULL, "
            f"seconds {real} NOT NULL, open_issues INTEGER NOT NULL, "
            "checkpoint_id TEXT, handoff_id TEXT)",
            # newest first for the pages; covering what the overview counts by day
            f"DROP INDEX IF EXISTS {self.runs}_by_end",
            f"CREATE INDEX IF NOT EXISTS {self.runs}_by_time ON {self.runs} "
            "(ended_at, run_id, status, reason, cost_usd)",
            f"CREATE INDEX IF NOT EXISTS {self.runs}_by_status ON {self.runs} (status, ended_at)",
            f"CREATE INDEX IF NOT EXISTS {self.runs}_by_reason ON {self.runs} (reason, ended_at)",
            f"CREATE TABLE IF NOT EXISTS {self.tools} (run_id TEXT NOT NULL, tool TEXT NOT NULL, "
            f"calls INTEGER NOT NULL, failures INTEGER NOT NULL, ended_at {real} NOT NULL, "
            "PRIMARY KEY (run_id, tool))",
            f"DROP INDEX IF EXISTS {self.tools}_by_tool",
            f"CREATE INDEX IF NOT EXISTS {self.tools}_by_tool_time ON {self.tools} (tool, ended_at, run_id)",
            f"DROP INDEX IF EXISTS {self.tools}_by_end",
            f"CREATE INDEX IF NOT EXISTS {self.tools}_by_time ON {self.tools} "
            "(ended_at, tool, calls, failures)",
            f"CREATE TABLE IF NOT EXISTS {self.decisions} (approval_id TEXT PRIMARY KEY, "
            f"run_id TEXT NOT NULL, worker TEXT NOT NULL, taken_at {real} NOT NULL, "
            f"lease_until {real} NOT NULL, done_at {real})",
            f"CREATE INDEX IF NOT EXISTS {self.decisions}_by_run ON {self.decisions} (run_id)",
            # one row per dependency: the case of its open incident (the runs an outage stopped)
            f"CREATE TABLE IF NOT EXISTS {self.incidents} (dependency TEXT PRIMARY KEY, "
            f"handoff_id TEXT NOT NULL, opened_at {real} NOT NULL, last_at {real} NOT NULL, "
            "runs INTEGER NOT NULL)",
            f"CREATE INDEX IF NOT EXISTS {self.runs}_by_case ON {self.runs} (handoff_id)",
            # the inbox and the workers ask for approvals and cases by state
            f"CREATE INDEX IF NOT EXISTS {self.docs}_approval_state ON {self.docs} "
            f"({self.field('status')}, created_at) WHERE kind = '{DocKind.APPROVAL}'",
            f"CREATE INDEX IF NOT EXISTS {self.docs}_handoff_state ON {self.docs} "
            f"({self.field('state')}, created_at) WHERE kind = '{DocKind.HANDOFF}'",
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

    kind = DocKind.RUN

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
        # a tool: the runs that called it, through its index (tool, ended_at), newest first
        source, by = (
            (f"{t.tools} u JOIN {t.runs} r ON r.run_id = u.run_id", "u")
            if tool
            else (f"{t.runs} r", "r")
        )
        if tool:
            where.append("u.tool = ?")
            params.append(tool)
        if reason:
            where.append("r.reason = ?")
            params.append(reason)
        if text and text.strip():
            words = text.strip().lower()
            like = t.sql.like
            where.append(f"(r.run_id LIKE ? ESCAPE '\\' OR r.task {like} ? ESCAPE '\\')")
            params += [_like(text.strip()) + "%", f"%{_like(words)}%"]
        if since is not None:
            where.append(f"{by}.ended_at >= ?")
            params.append(float(since))
        if until is not None:
            where.append(f"{by}.ended_at < ?")
            params.append(float(until))
        clause = " AND ".join(where) or "1 = 1"
        columns = ", ".join(f"r.{c}" for c in _RUN_COLUMNS)
        with self.store.sql() as sql:
            counts = sql.rows(
                f"SELECT r.status, COUNT(*) FROM {source} WHERE {clause} GROUP BY r.status", params
            )
            by_status = {str(s): int(n) for s, n in counts}
            if status:
                clause += " AND r.status = ?"
                params.append(status)
            rows = sql.rows(
                f"SELECT {columns} FROM {source} WHERE {clause} "
                f"ORDER BY {by}.ended_at DESC, {by}.run_id DESC LIMIT ? OFFSET ?",
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
        with self.store.sql() as sql:  # two index counts: cheap when there is nothing to do
            (filed,) = sql.rows(f"SELECT COUNT(*) FROM {t.docs} WHERE kind = 'run'")[0]
            (indexed,) = sql.rows(f"SELECT COUNT(*) FROM {t.runs}")[0]
        if int(filed) <= int(indexed):
            return 0
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
