"""``tether bench``: the fault-injection benchmark (agents, fleet, overhead).

Everything runs through the real library objects; the agent and fleet suites run on
virtual time and are deterministic for a seed; the overhead suite runs on real time.

>>> results = run(suites=["agents"], tasks=20, scenarios=["stuck-search"])  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from tether.bench._agents import POLICIES, run_cell
from tether.bench._fleet import FLEET_POLICIES, FLEET_SCENARIOS, contention, lower_bounds, run_fleet
from tether.bench._worlds import SCENARIOS

__all__ = ["FLEET_POLICIES", "FLEET_SCENARIOS", "POLICIES", "SCENARIOS", "SUITES", "run"]

SUITES = ("agents", "fleet", "overhead")
#: Suites that run only when named: ``fleet-live`` needs Redis and a minute or two of real time;
#: ``serve`` fills records databases with real runs and times the operator page over HTTP.
EXTRA_SUITES = ("fleet-live", "serve")
CLIENTS, CAPACITY = 1000, 100


def _agents_job(job: tuple[str, str, int, int]) -> tuple[str, str, dict[str, Any]]:
    logging.getLogger("tether").setLevel(logging.ERROR)
    scenario, policy, tasks, seed = job
    return scenario, policy, run_cell(scenario, policy, tasks, seed)


def _fleet_job(job: tuple[str, str, int]) -> tuple[str, str, dict[str, Any]]:
    logging.getLogger("tether").setLevel(logging.ERROR)
    scenario, policy, seed = job
    return (
        scenario,
        policy,
        run_fleet(scenario, policy, clients=CLIENTS, capacity=CAPACITY, seed=seed),
    )


def run(
    suites: Iterable[str] = SUITES,
    *,
    tasks: int = 1000,
    seed: int = 7,
    scenarios: Sequence[str] | None = None,
    workers: int | None = None,
    quick_overhead: bool = False,
    progress: Callable[[str, int], None] | None = None,
    serve_runs: Sequence[int] | None = None,
    serve_pg: str | None = None,
) -> dict[str, Any]:
    """Run the chosen suites; returns the DESIGN.md JSON layout (plus series for plots)."""
    suites = list(suites)
    unknown = [s for s in suites if s not in SUITES + EXTRA_SUITES]
    if unknown:
        raise ValueError(
            f"unknown suite(s) {', '.join(unknown)}; choose from {', '.join(SUITES + EXTRA_SUITES)}"
        )
    if tasks < 1:
        raise ValueError(f"tasks must be >= 1, got {tasks}")
    valid = list(dict.fromkeys([*SCENARIOS, *FLEET_SCENARIOS]))  # once each, in order
    bad = [s for s in scenarios or () if s not in valid]
    if bad:
        raise ValueError(
            f"unknown scenario(s) {', '.join(bad)}; agents: {', '.join(SCENARIOS)}; "
            f"fleet: {', '.join(FLEET_SCENARIOS)}"
        )
    workers = workers or min(2, os.cpu_count() or 1)
    note = progress or (lambda message, total: None)
    out: dict[str, Any] = {"seed": seed, "suites": {}}
    if "overhead" in suites:  # first, on a quiet machine: it measures real time
        from tether.bench._overhead import run_overhead

        out["suites"]["overhead"] = run_overhead(quick=quick_overhead)
        note("overhead", 0)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        agent_jobs = []
        if "agents" in suites:
            names = [s for s in SCENARIOS if not scenarios or s in scenarios]
            agent_jobs = [(s, p, tasks, seed) for s in names for p in POLICIES]
        fleet_jobs = []
        if "fleet" in suites:
            names = [s for s in FLEET_SCENARIOS if not scenarios or s in scenarios]
            fleet_jobs = [(s, p, seed) for s in names for p in FLEET_POLICIES]
        # the slowest cells first, so that both workers finish together
        total = len(agent_jobs) + len(fleet_jobs)
        fleet_futures = [pool.submit(_fleet_job, j) for j in fleet_jobs]
        agent_futures = [pool.submit(_agents_job, j) for j in agent_jobs]
        if agent_jobs:
            cells: dict[str, Any] = {}
            for fut in agent_futures:
                scenario, policy, cell = fut.result()
                cells.setdefault(scenario, {"policies": {}})["policies"][policy] = cell
                note(f"agents {scenario} / {policy}", total)
            out["suites"]["agents"] = {"scenarios": cells}
        if fleet_jobs:
            fleet: dict[str, Any] = {}
            for fut in fleet_futures:
                scenario, policy, cell = fut.result()
                shape = FLEET_SCENARIOS[scenario]
                calls, seconds = lower_bounds(scenario, CLIENTS, CAPACITY)
                entry = fleet.setdefault(scenario, {
                    "clients": CLIENTS, "capacity_rps": CAPACITY, "outage_s": shape["outage_s"],
                    "brownout_s": shape["brownout_s"], "lower_bound_calls": calls,
                    "lower_bound_s": seconds, "policies": {},
                })  # fmt: skip
                entry["policies"][policy] = cell
                note(f"fleet {scenario} / {policy}", total)
            out["suites"]["fleet"] = {
                "scenarios": fleet,
                "contention": {
                    j: contention(j, seed=seed) for j in ("none", "full", "equal", "decorrelated")
                },
            }
    if "fleet-live" in suites:
        from tether.bench._live import LIVE_SCENARIOS, measure_shard, projection, run_live

        live = {}
        for name, outage in LIVE_SCENARIOS.items():
            live[name] = run_live(outage, seed=seed)
            note(f"fleet-live {name}", 0)
        shard = measure_shard()
        note("fleet-live shard capacity", 0)
        out["suites"]["fleet-live"] = {"scenarios": live, "redis_load": projection(live, shard)}
    if "serve" in suites:
        from tether.bench._serve import SIZES, run_serve

        out["suites"]["serve"] = run_serve(
            serve_runs or SIZES, pg_dsn=serve_pg, progress=lambda message: note(message, 0)
        )
    return out
