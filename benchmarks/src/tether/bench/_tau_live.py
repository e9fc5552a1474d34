"""The tau suite's live mode: a worker process killed between a write and its record.

For each task with a write, a first worker process serves the customer's request and is
killed (``os._exit``) the moment the domain has committed the task's first write, before
anything could record it; a second worker process serves the same request again (a queue
redelivers it: the same request key), from the start. The domain's database and its
records of each request live in one SQLite file the two processes share, and tether's
ledger in another (``tether.Ledger.sqlite``, a lease of :data:`LEASE` seconds). Real
processes, real time.

Policies: ``naive`` (the second worker runs every call again), ``tether`` (a ``Guard`` over
the SQLite ledger, ``guard.start(key=request)``, the writes with a lookup that reads the
domain's records of the effect's idempotency key), ``tether-no-lookup`` (the writes
declared, no lookup: the second worker stops on the unknown outcome and says so).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tether
from tether.bench._interrupt import interrupt_ignored
from tether.bench._tau_domain import WRITES, Commit, RetailData, RetailDB
from tether.bench._tau_model import Answer, ScriptedModel
from tether.bench._tau_tools import describe_effect

__all__ = ["LEASE", "LIVE_POLICIES", "run_live_tau"]

LEASE = 0.5
LIVE_POLICIES = ("naive", "tether", "tether-no-lookup")
CRASH = "Sorry, something went wrong on our side. Please try again."


class SharedRetailDB(RetailDB):
    """A :class:`RetailDB` whose changed records and commits live in a SQLite file, so that
    several processes act on one database (each call in one immediate transaction)."""

    def __init__(
        self, data: RetailData, path: str, on_commit: Callable[[], None] | None = None
    ) -> None:
        super().__init__(data)
        self.path = path
        self.on_commit = on_commit
        with sqlite3.connect(path) as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS state (id INTEGER PRIMARY KEY CHECK (id = 1), doc TEXT)"
            )

    def _load(self, db: sqlite3.Connection) -> None:
        row = db.execute("SELECT doc FROM state WHERE id = 1").fetchone()
        doc = json.loads(row[0]) if row else {"users": {}, "orders": {}, "commits": []}
        self.tables.users, self.tables.orders = doc["users"], doc["orders"]
        self.commits = [Commit(**c) for c in doc["commits"]]

    def _save(self, db: sqlite3.Connection) -> None:
        commits = [
            {
                "tool": c.tool,
                "target": c.target,
                "args": c.args,
                "request_id": c.request_id,
                "result": c.result,
            }
            for c in self.commits
        ]
        tables = self.tables
        doc = json.dumps({"users": tables.users, "orders": tables.orders, "commits": commits})
        db.execute("INSERT OR REPLACE INTO state (id, doc) VALUES (1, ?)", (doc,))

    def call(self, tool: str, args: dict[str, Any], request_id: str | None = None) -> str:
        db = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
        try:
            db.execute("BEGIN IMMEDIATE")
            self._load(db)
            before = len(self.commits)
            result = super().call(tool, args, request_id)
            self._save(db)
            db.execute("COMMIT")
        finally:
            db.close()
        if len(self.commits) > before and self.on_commit is not None:
            self.on_commit()  # the effect is in the database; nothing has recorded it yet
        return result

    def request(self, request_id: str) -> str | None:
        with sqlite3.connect(self.path) as db:
            self._load(db)
        return super().request(request_id)

    def snapshot(self) -> RetailDB:
        """The database as the file holds it now."""
        with sqlite3.connect(self.path) as db:
            self._load(db)
        return self


def _serve(
    folder: str,
    task: Mapping[str, Any],
    policy: str,
    db_path: str,
    ledger_path: str,
    die_after_write: bool,
) -> str:
    """One worker's handling of the request: the scripted model's calls, under ``policy``."""
    data = RetailData(folder)

    def die() -> None:
        if die_after_write:
            os._exit(137)  # killed between the effect and its record

    db = SharedRetailDB(data, db_path, on_commit=die)
    model = ScriptedModel(task["actions"], f"live|{task['id']}")

    def tool(name: str) -> Callable[..., str]:
        return lambda **args: db.call(name, args, tether.current_idempotency_key())

    if policy == "naive":
        results: dict[str, tuple[str, bool]] = {}
        for _ in range(40):
            turn = model.decide(results)
            if isinstance(turn, Answer):
                return turn.text
            try:
                results = {turn.id: (tool(turn.name)(**turn.args), False)}
            except Exception as exc:
                results = {turn.id: (f"{type(exc).__name__}: {exc}", True)}
        return CRASH
    ledger = tether.Ledger.sqlite(ledger_path, lease=LEASE, wait=4 * LEASE)
    guard = tether.Guard(
        ledger=ledger, budget=tether.Budget(max_steps=40), describe_effect=describe_effect
    )
    lookup = (lambda key: db.request(key)) if policy == "tether" else None
    results = {}
    with guard.start(task=f"τ² task {task['id']}", key=f"request-{task['id']}") as run:
        while run.proceed():
            turn = model.decide(results)
            if isinstance(turn, Answer):
                run.succeed(turn.text)
                break
            write = turn.name in WRITES
            try:
                out = run.call_tool(
                    turn.name,
                    tool(turn.name),
                    turn.args,
                    idempotent=not write,
                    lookup=lookup if write else None,
                )
                results = {turn.id: (str(out), False)}
            except tether.ToolError as exc:
                results = {turn.id: (exc.model_message, True)}
    ledger.close()
    outcome = run.outcome
    return str(outcome.result) if outcome.status == "success" else outcome.customer_message


def _worker(args: tuple[Any, ...], out: str) -> None:
    text = _serve(*args)
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)


def _episode(tau: Any, task: Mapping[str, Any], policy: str, folder: str) -> dict[str, Any]:
    from tether.bench._tau import _added, dishonest, duplicates

    context = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="tau-live-") as tmp:
        db_path, ledger_path = os.path.join(tmp, "domain.db"), os.path.join(tmp, "ledger.db")
        out = os.path.join(tmp, "ending.txt")
        SharedRetailDB(tau.data, db_path)
        started = time.perf_counter()
        first = context.Process(
            target=_worker, args=((folder, task, policy, db_path, ledger_path, True), out)
        )
        with interrupt_ignored():
            first.start()
        first.join()
        killed = first.exitcode == 137
        second = context.Process(
            target=_worker, args=((folder, task, policy, db_path, ledger_path, False), out)
        )
        with interrupt_ignored():
            second.start()
        second.join()
        text = CRASH  # a second worker that died too: the customer saw an error
        if os.path.exists(out):
            with open(out, encoding="utf-8") as f:
                text = f.read()
        db = SharedRetailDB(tau.data, db_path).snapshot()
        first_write = next(a for a in task["actions"] if a["name"] in WRITES)
        executions = sum(
            1
            for c in db.commits
            if c.tool == first_write["name"] and c.args == first_write["arguments"]
        )
        golden = tau.golden[task["id"]]
        return {
            "reward": int(db.db_hash() == golden.hash),
            "duplicates": duplicates(_added(db), golden.added),
            "dishonest": dishonest(text, task, db),
            "killed": killed,
            "executions": executions,
            "seconds": time.perf_counter() - started,
        }


def run_live_tau(
    folder: str | None,
    *,
    tasks: Sequence[str] | None = None,
    limit: int = 20,
    policies: Sequence[str] = LIVE_POLICIES,
    progress: Callable[[str, int], None] | None = None,
) -> dict[str, Any]:
    """The live mode over the first ``limit`` tasks with a write (or the ``tasks`` named)."""
    from tether.bench._tau import TauData, resolve_folder
    from tether.bench._tau_domain import domain_of

    folder = resolve_folder(folder)
    unknown = [p for p in policies if p not in LIVE_POLICIES]
    if unknown:
        raise ValueError(
            f"unknown tau-live policy(s) {', '.join(unknown)}; choose from {', '.join(LIVE_POLICIES)}"
        )
    tau = TauData(folder)
    chosen = [t for t in tau.tasks if any(a["name"] in WRITES for a in t["actions"])]
    chosen = [t for t in chosen if t["id"] in tasks] if tasks else chosen[:limit]
    note = progress or (lambda message, total: None)
    out: dict[str, Any] = {}
    note(f"tau-live: {len(chosen)} tasks x {len(policies)} policies", len(policies) + 1)
    for policy in policies:
        episodes = [_episode(tau, task, policy, folder) for task in chosen]
        out[policy] = {
            "tasks": len(episodes),
            "pass": round(sum(e["reward"] for e in episodes) / len(episodes), 4),
            "killed": sum(e["killed"] for e in episodes),
            "duplicate_effects": sum(e["duplicates"] for e in episodes),
            "dishonest_endings": sum(int(e["dishonest"]) for e in episodes),
            "writes_executed_twice": sum(int(e["executions"] > 1) for e in episodes),
            "p50_s": round(sorted(e["seconds"] for e in episodes)[len(episodes) // 2], 2),
        }
        note(f"tau-live: {policy}", len(policies) + 1)
    return {
        "scenarios": {domain_of(folder): {"tasks": len(chosen), "lease_s": LEASE, "policies": out}}
    }
