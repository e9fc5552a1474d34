"""The τ² suite: every task of a τ²-bench domain, under every policy, at each fault rate λ.

Each episode is graded as τ²-bench grades it, by the database: reward 1 iff the final
database hash equals the golden replay's (the task's golden actions run on a fresh
database, no faults). Besides:

* ``duplicate_effects``: money moved more often than the golden replay moved it (a
  transaction in the final database beyond the golden one's count, and beyond one);
* ``dishonest_endings``: the customer was told a write was done when the domain has no
  record of it, or told it failed (explicitly, or by an error message) when it committed;
* ``tool_executions`` (attempts that reached a tool), ``model_calls`` (requests that
  reached the model endpoint, refused ones included), tokens and ``cost_usd`` (answered
  requests, at :data:`PRICE`), p50/p95 of the episode's virtual time.

pass^k (τ-bench): per task, with c successes in n seeds, C(c, k) / C(n, k); averaged
over the tasks. At λ = 0 no fault is drawn and the model draws nothing, so the n seeds are
one episode: it runs once and stands for the n (a test checks that two seeds agree there).
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import tether
from tether.bench._interrupt import ignore_interrupt
from tether.bench._tau_domain import WRITES, RetailData, RetailDB, domain_of, load_tasks, target_of
from tether.bench._tau_model import claims_of
from tether.bench._tau_world import MODEL, PRICE, Episode, set_current

__all__ = ["LAMBDAS", "PRICE", "TAU_DATA_ENV", "TauData", "pass_hat_k", "resolve_folder", "run_tau"]

LAMBDAS = (0.0, 0.1, 0.2, 0.5)
SEEDS = 4
TAU_DATA_ENV = "TETHER_TAU_DATA"
REQUIRED = ("db.json", "tasks.json", "policy.md")


def resolve_folder(folder: str | None) -> str:
    """The τ² domain folder: ``folder``, else ``$TETHER_TAU_DATA``; a clear error when it
    is missing or is not a τ²-bench retail folder."""
    chosen = folder or os.environ.get(TAU_DATA_ENV)
    if not chosen:
        raise ValueError(
            "the tau suite needs a τ²-bench domain folder: pass --tau-data DIR (e.g. a clone's "
            f"data/tau2/domains/retail) or set {TAU_DATA_ENV}"
        )
    missing = [name for name in REQUIRED if not os.path.isfile(os.path.join(chosen, name))]
    if missing:
        raise ValueError(
            f"--tau-data {chosen}: not a τ²-bench domain folder (missing {', '.join(missing)}); "
            f"point --tau-data (or {TAU_DATA_ENV}) at tau2-bench's data/tau2/domains/retail"
        )
    return chosen


@dataclass(frozen=True, slots=True)
class _Golden:
    hash: str
    added: dict[str, Counter[str]]  # order id -> transactions the golden replay added


class TauData:
    """A domain folder loaded once per process: the data, the tasks, their golden replays."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.data = RetailData(folder)
        self.tasks = load_tasks(folder)
        self.golden: dict[str, _Golden] = {}
        for task in self.tasks:
            db = RetailDB(self.data)
            for action in task["actions"]:
                db.call(action["name"], action["arguments"])
            self.golden[task["id"]] = _Golden(db.db_hash(), _added(db))

    def episode(self, task: Mapping[str, Any], lam: float, seed: int) -> Episode:
        return Episode(self.data, task, lam, seed)


def _added(db: RetailDB) -> dict[str, Counter[str]]:
    """The transactions each written order gained over the loaded data."""
    out: dict[str, Counter[str]] = {}
    for order_id, order in db.tables.orders.items():
        base = len(db.data.orders[order_id]["payment_history"])
        out[order_id] = Counter(repr(sorted(p.items())) for p in order["payment_history"][base:])
    return out


def duplicates(final: dict[str, Counter[str]], golden: dict[str, Counter[str]]) -> int:
    """Transactions applied more often than the golden replay applied them (and than once)."""
    count = 0
    for order_id, added in final.items():
        expected = golden.get(order_id, Counter())
        count += sum(max(0, n - max(expected[t], 1)) for t, n in added.items())
    return count


def dishonest(text: str, task: Mapping[str, Any], db: RetailDB) -> bool:
    """The ending tells the customer something the domain's records contradict."""
    committed = {(c.tool, c.target) for c in db.commits}
    claims, rest = claims_of(text)
    for action in task["actions"]:
        if action["name"] not in WRITES:
            continue
        write = (action["name"], target_of(action["name"], action["arguments"]))
        said = claims.get(write, rest)
        if (said == "done" and write not in committed) or (said == "failed" and write in committed):
            return True
    return False


def run_episode(
    tau: TauData, policy: str, task: Mapping[str, Any], lam: float, seed: int
) -> dict[str, Any]:
    """One episode, graded."""
    from tether.bench._tau_policies import run_policy

    episode = tau.episode(task, lam, seed)
    tether.breakers.clear()  # the providers' breakers: each episode is its own timeline
    random.seed(episode.rng_seed)  # the libraries' own jitter (tenacity, LangChain, the SDKs)
    set_current(episode)
    try:
        ending = run_policy(policy, episode)
    finally:
        set_current(None)
    golden = tau.golden[task["id"]]
    return {
        "reward": int(episode.db.db_hash() == golden.hash),
        "duplicates": duplicates(_added(episode.db), golden.added),
        "dishonest": dishonest(ending.text, task, episode.db),
        "how": ending.how,
        "tool_executions": episode.tool_executions,
        "model_calls": episode.model_requests,
        "input_tokens": episode.input_tokens,
        "output_tokens": episode.output_tokens,
        "seconds": episode.clock.now(),
    }


def pass_hat_k(successes: Sequence[int], n: int, k: int) -> float:
    """τ-bench's pass^k: the chance that k trials of a task all succeed, averaged over tasks."""
    if k > n:
        raise ValueError(f"pass^{k} needs at least {k} trials per task, got {n}")
    return sum(math.comb(c, k) / math.comb(n, k) for c in successes) / len(successes)


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def summarize(episodes: Sequence[dict[str, Any]], seeds: int) -> dict[str, Any]:
    """The metrics of one policy at one λ, from its episodes (task-major, ``seeds`` each)."""
    by_task: dict[str, int] = {}
    for e in episodes:
        by_task[e["task"]] = by_task.get(e["task"], 0) + e["reward"]
    wins = list(by_task.values())
    tokens_in = sum(e["input_tokens"] for e in episodes)
    tokens_out = sum(e["output_tokens"] for e in episodes)
    seconds = [e["seconds"] for e in episodes]
    out: dict[str, Any] = {
        f"pass^{k}": round(pass_hat_k(wins, seeds, k), 4) for k in range(1, seeds + 1)
    }
    out.update(
        {
            "episodes": len(episodes),
            "tasks": len(wins),
            "duplicate_effects": sum(e["duplicates"] for e in episodes),
            "dishonest_endings": sum(int(e["dishonest"]) for e in episodes),
            "tool_executions": sum(e["tool_executions"] for e in episodes),
            "model_calls": sum(e["model_calls"] for e in episodes),
            "tokens": tokens_in + tokens_out,
            "cost_usd": round(PRICE.cost(tokens_in, tokens_out), 4),
            "p50_s": round(_percentile(seconds, 0.5), 2),
            "p95_s": round(_percentile(seconds, 0.95), 2),
            "endings": dict(Counter(e["how"] for e in episodes)),
        }
    )
    return out


#: What an episode of each policy costs, roughly (for the order of the jobs).
_COST = {
    "tether-openai": 5,
    "tether-pydantic-ai": 4,
    "tether-openai-agents": 4,
    "tether-langchain": 4,
    "langchain": 3,
    "tether": 2,
    "tether-blind-lookup": 2,
    "tether-no-lookup": 2,
}
_LOADED: dict[str, TauData] = {}
_WARM: set[str] = set()


def _loaded(folder: str) -> TauData:
    if folder not in _LOADED:
        _LOADED[folder] = TauData(folder)
    return _LOADED[folder]


def _quiet() -> None:
    logging.getLogger("tether").setLevel(logging.CRITICAL)
    for name in ("httpx", "httpx2", "openai", "anthropic", "openai.agents", "pydantic_ai",
                 "google_adk", "strands", "crewai"):  # fmt: skip
        logging.getLogger(name).setLevel(logging.CRITICAL)
    warnings.simplefilter("ignore")


def _cell(
    job: tuple[str, str, float, tuple[str, ...] | None, int],
) -> tuple[str, float, list[dict[str, Any]], float]:
    folder, policy, lam, task_ids, seeds = job
    _quiet()
    tau = _loaded(folder)
    # a first run imports and builds what the policy uses (some of it draws random numbers):
    # made here, once per process, so that a cell's figures never depend on what ran before it
    if policy not in _WARM:
        _WARM.add(policy)
        run_episode(tau, policy, tau.tasks[0], 0.0, 0)
    started = time.process_time()  # the cell's CPU (its threads' included), not the wall's
    episodes = []
    for task in tau.tasks:
        if task_ids is not None and task["id"] not in task_ids:
            continue
        # at λ = 0 nothing is drawn: every seed is the same episode (tests check it), run once
        for seed in range(seeds if lam else 1):
            result = run_episode(tau, policy, task, lam, seed)
            result["task"] = task["id"]
            episodes.extend([result] if lam else [result] * seeds)
    return policy, lam, episodes, time.process_time() - started


def check_tau(
    folder: str, policies: Iterable[str] | None, tasks: Sequence[str] | None
) -> list[str]:
    """The policies to run; ValueError (a usage error, before anything runs) for a policy
    that does not exist or whose framework is not installed, or a task id the domain lacks."""
    from tether.bench._tau_policies import DEFAULT_POLICIES, POLICIES, installed, missing

    names = list(policies or DEFAULT_POLICIES)
    if "all" in names:
        names = list(dict.fromkeys([*installed(), *(p for p in names if p != "all")]))
    unknown = [p for p in names if p not in POLICIES]
    if unknown:
        raise ValueError(
            f"unknown tau policy(s) {', '.join(unknown)}; choose from {', '.join(POLICIES)}"
        )
    lacking = missing(names)
    if lacking:
        raise ValueError(lacking)
    if tasks:
        ids = [str(t["id"]) for t in load_tasks(folder)]
        absent = [t for t in tasks if t not in ids]
        if absent:
            raise ValueError(
                f"unknown tau task(s) {', '.join(absent)}: {domain_of(folder)} has "
                f"{len(ids)} tasks, ids {ids[0]} to {ids[-1]}"
            )
    return names


def run_tau(
    folder: str | None,
    *,
    policies: Iterable[str] | None = None,
    lambdas: Iterable[float] = LAMBDAS,
    tasks: Sequence[str] | None = None,
    seeds: int = SEEDS,
    workers: int | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> dict[str, Any]:
    """Run the suite; ``suites.tau`` of the bench's JSON."""
    folder = resolve_folder(folder)
    names = check_tau(folder, policies, tasks)
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    lams = [float(x) for x in lambdas]
    task_ids = tuple(tasks) if tasks else None
    jobs = [(folder, p, lam, task_ids, seeds) for lam in lams for p in names]
    jobs.sort(
        key=lambda j: -_COST.get(j[1], 1) * (j[2] + 0.25)
    )  # the longest first: both workers end together
    note = progress or (lambda message, total: None)
    note(
        f"tau: {len(jobs)} cells of {len(names)} policies x {len(lams)} fault rates", len(jobs) + 1
    )
    started = time.perf_counter()
    cells: dict[float, dict[str, Any]] = {lam: {} for lam in lams}
    seconds: dict[str, float] = {}
    workers = workers or min(2, os.cpu_count() or 1)
    if workers == 1:
        results: Iterable[Any] = map(_cell, jobs)
    else:
        pool = ProcessPoolExecutor(max_workers=workers, initializer=ignore_interrupt)
        results = (f.result() for f in [pool.submit(_cell, j) for j in jobs])
    try:
        for policy, lam, episodes, took in results:
            cells[lam][policy] = summarize(episodes, seeds)
            seconds[policy] = seconds.get(policy, 0.0) + took
            note(f"tau: λ={lam:g} / {policy}", len(jobs) + 1)
    finally:
        if workers != 1:
            pool.shutdown()
    cells = {lam: {p: cells[lam][p] for p in names if p in cells[lam]} for lam in lams}  # in order
    domain = domain_of(folder)
    count = len(task_ids) if task_ids else len(load_tasks(folder))
    return {
        "scenarios": {
            domain: {
                "tasks": count,
                "seeds": seeds,
                "model": MODEL,
                "price_per_mtok": [PRICE.input, PRICE.output],
                "lambda": {f"{lam:g}": {"policies": cells[lam]} for lam in lams},
            }
        },
        "wall_s": round(time.perf_counter() - started, 1),
        "policy_cpu_s": {k: round(v, 1) for k, v in seconds.items()},
    }
