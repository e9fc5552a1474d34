"""``tether bench``: the fault-injection benchmark (agents, fleet, overhead; soak, tau, fleet-live).

Everything runs through the real library objects; the agent, fleet and tau suites run on
virtual time and are deterministic for a seed; the overhead and soak suites run on real
time. The default set (``SUITES``) runs in about a minute on an idle 2-core machine; the
others run when named.

>>> results = run(suites=["agents"], tasks=20, scenarios=["stuck-search"])  # doctest: +SKIP
>>> results = run(suites=["tau"], tau_data="../tau2-bench/data/tau2/domains/retail")  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from typing import Any

from tether.bench._agents import POLICIES, run_cell
from tether.bench._fleet import FLEET_POLICIES, FLEET_SCENARIOS, contention, lower_bounds, run_fleet
from tether.bench._interrupt import ignore_interrupt
from tether.bench._tau_policies import POLICIES as _TAU_POLICIES
from tether.bench._worlds import SCENARIOS

__all__ = [
    "EXTRA_SUITES",
    "FLEET_POLICIES",
    "FLEET_SCENARIOS",
    "POLICIES",
    "SCENARIOS",
    "SUITES",
    "TAU_POLICIES",
    "run",
]

SUITES = ("agents", "fleet", "overhead")
#: Suites that run only when named: ``soak`` (10^6 guarded steps, real time), ``tau`` (a
#: τ²-bench domain folder, ``tau_data``), ``tau-live`` (the same tasks, a worker process
#: killed between a write and its record), ``fleet-live`` (Redis and a minute or two), ``serve``
#: (records databases filled with real runs, the operator page timed over HTTP).
EXTRA_SUITES = ("soak", "tau", "tau-live", "fleet-live", "serve")
#: The policies of the tau suite.
TAU_POLICIES = tuple(_TAU_POLICIES)
CLIENTS, CAPACITY = 1000, 100
#: the backoffs of the contention experiment (the AWS article's)
CONTENTION = ("none", "full", "equal", "decorrelated")


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


def _limits_job(job: tuple[str, str, int]) -> tuple[str, str, dict[str, Any]]:
    from tether.bench._provider_limits import run_provider_limits

    logging.getLogger("tether").setLevel(logging.ERROR)
    policy, misconfig, seed = job
    return policy, misconfig, run_provider_limits(policy, misconfig, seed=seed)


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
    tau_data: str | None = None,
    tau_policies: Sequence[str] | None = None,
    tau_lambdas: Sequence[float] | None = None,
    tau_tasks: Sequence[str] | None = None,
    tau_seeds: int = 4,
) -> dict[str, Any]:
    """Run the chosen suites; returns the DESIGN.md JSON layout (plus series for plots).

    ``progress(message, total)`` hears of each step: the message starts with the suite
    (``"fleet: outage / tether"``); it ends with ``" …"`` when it names the step now running,
    else a step of ``total`` has ended.
    ``tau_data`` is the τ²-bench domain folder of the tau suite (else ``$TETHER_TAU_DATA``);
    ``tau_policies``, ``tau_lambdas``, ``tau_tasks`` (task ids) and ``tau_seeds`` narrow it.
    """
    suites = list(suites)
    unknown = [s for s in suites if s not in SUITES + EXTRA_SUITES]
    if unknown:
        raise ValueError(
            f"unknown suite(s) {', '.join(unknown)}; choose from {', '.join(SUITES + EXTRA_SUITES)}"
        )
    if tasks < 1:
        raise ValueError(f"tasks must be >= 1, got {tasks}")
    tenant_scenarios = ["tenants", "tenants-redis", "tenants-postgres"]
    valid = list(
        dict.fromkeys([*SCENARIOS, *FLEET_SCENARIOS, "provider-limits", *tenant_scenarios])
    )
    bad = [s for s in scenarios or () if s not in [*valid, "litellm-router"]]
    if bad:
        raise ValueError(
            f"unknown scenario(s) {', '.join(bad)}; agents: {', '.join(SCENARIOS)}; "
            f"fleet: {', '.join([*FLEET_SCENARIOS, 'provider-limits', *tenant_scenarios])}; "
            "fleet-live: outage-10, outage-35, provider-limits, litellm-router"
        )
    if "fleet-live" in suites and "litellm-router" in (scenarios or ()):
        from tether.bench._live_litellm import litellm_missing

        if missing := litellm_missing():  # a usage error, before anything runs
            raise ValueError(missing)
    if "tau" in suites or "tau-live" in suites:  # before anything runs: a usage error
        from tether.bench._tau import check_tau, resolve_folder

        tau_data = resolve_folder(tau_data)
        # the tau-live suite's policies are its own: only its task ids are checked
        check_tau(tau_data, tau_policies if "tau" in suites else None, tau_tasks)
    workers = workers or min(2, os.cpu_count() or 1)
    note = progress or (lambda message, total: None)
    out: dict[str, Any] = {"seed": seed, "suites": {}}
    if "overhead" in suites:  # first, on a quiet machine: it measures real time
        from tether.bench._overhead import run_overhead

        out["suites"]["overhead"] = run_overhead(quick=quick_overhead, progress=note)
    if "soak" in suites:
        from tether.bench._overhead import run_soak

        out["suites"]["soak"] = run_soak(quick=quick_overhead, progress=note)
    with ProcessPoolExecutor(max_workers=workers, initializer=ignore_interrupt) as pool:
        agent_jobs = []
        if "agents" in suites:
            names = [s for s in SCENARIOS if not scenarios or s in scenarios]
            agent_jobs = [(s, p, tasks, seed) for s in names for p in POLICIES]
        fleet_jobs = []
        if "fleet" in suites:
            names = [s for s in FLEET_SCENARIOS if not scenarios or s in scenarios]
            fleet_jobs = [(s, p, seed) for s in names for p in FLEET_POLICIES]
        # provider-limits (a few minutes of CPU): only when named, --scenario provider-limits
        limit_jobs = []
        if "fleet" in suites and "provider-limits" in (scenarios or ()):
            from tether.bench._provider_limits import PROVIDER_LIMITS, PROVIDER_POLICIES

            limit_jobs = [(p, m, seed) for p in PROVIDER_POLICIES for m in PROVIDER_LIMITS]
        # the slowest cells first, so that both workers finish together
        kinds: dict[Future[tuple[str, str, dict[str, Any]]], str] = {}
        kinds.update({pool.submit(_limits_job, j): "limits" for j in limit_jobs})
        kinds.update({pool.submit(_fleet_job, j): "fleet" for j in fleet_jobs})
        kinds.update({pool.submit(_agents_job, j): "agents" for j in agent_jobs})
        done: dict[str, dict[tuple[str, str], dict[str, Any]]] = {
            "limits": {},
            "fleet": {},
            "agents": {},
        }
        tenants = [n for n in tenant_scenarios if "fleet" in suites and n in (scenarios or ())]
        fleet_total = (
            len(fleet_jobs)
            + (len(CONTENTION) if fleet_jobs else 0)
            + len(limit_jobs)
            + len(tenants)
        )
        # each suite's progress from its start (its cells are queued now: the agents' run
        # after the fleet's, and a bar that appeared only with their first cell stayed
        # hidden for minutes); then every cell reported as it ends, whichever suite it is of
        if agent_jobs:
            note(f"agents: {len(agent_jobs)} cells queued …", len(agent_jobs))
        if fleet_total:
            note(f"fleet: {fleet_total} cells queued …", fleet_total)
        for fut in as_completed(kinds):
            first, second, cell = fut.result()
            done[kinds[fut]][first, second] = cell
            if kinds[fut] == "agents":
                note(f"agents: {first} / {second}", len(agent_jobs))
            elif kinds[fut] == "fleet":
                note(f"fleet: {first} / {second}", fleet_total)
            else:
                note(f"fleet: provider-limits / {first} / {second}", fleet_total)
        if agent_jobs:
            cells: dict[str, Any] = {}
            for scenario, policy, _, _ in agent_jobs:  # in the jobs' order, as before
                cell = done["agents"][scenario, policy]
                cells.setdefault(scenario, {"policies": {}})["policies"][policy] = cell
            out["suites"]["agents"] = {"scenarios": cells}
        for name in tenants:  # seconds, in this process
            from tether.bench._tenants import TENANT_POLICIES, TENANT_STORES, run_tenants

            kind = TENANT_STORES[name]
            policies = [p for p in TENANT_POLICIES if kind == "memory" or p.startswith("tether")]
            out["suites"].setdefault("fleet", {"scenarios": {}})[name] = {
                "policies": {p: run_tenants(p, seed=seed, store=kind) for p in policies}
            }
            note(f"fleet: {name}", fleet_total)
        if fleet_jobs:
            fleet: dict[str, Any] = {}
            for scenario, policy, _ in fleet_jobs:
                cell = done["fleet"][scenario, policy]
                shape = FLEET_SCENARIOS[scenario]
                calls, seconds = lower_bounds(scenario, CLIENTS, CAPACITY)
                entry = fleet.setdefault(
                    scenario,
                    {
                        "clients": CLIENTS,
                        "capacity_rps": CAPACITY,
                        "outage_s": shape["outage_s"],
                        "brownout_s": shape["brownout_s"],
                        "lower_bound_calls": calls,
                        "lower_bound_s": seconds,
                        "policies": {},
                    },
                )
                entry["policies"][policy] = cell
            jitters = {}
            for j in CONTENTION:  # seconds each, in this process
                note(f"fleet: contention / {j} …", fleet_total)
                jitters[j] = contention(j, seed=seed)
                note(f"fleet: contention / {j}", fleet_total)
            out["suites"]["fleet"] = {
                **out["suites"].get("fleet", {}),
                "scenarios": fleet,
                "contention": jitters,
            }
        if limit_jobs:
            from tether.bench._provider_limits import AGENTS, REAL_LIMITS

            cells = {}
            for policy, misconfig, _ in limit_jobs:
                cells.setdefault(policy, {})[misconfig] = done["limits"][policy, misconfig]
            out["suites"].setdefault("fleet", {"scenarios": {}})["provider-limits"] = {
                "agents": AGENTS,
                "real_limits": {
                    "requests_per_minute": REAL_LIMITS.requests,
                    "input_tokens_per_minute": REAL_LIMITS.input,
                    "output_tokens_per_minute": REAL_LIMITS.output,
                },
                "policies": cells,
            }
    if "tau" in suites:
        from tether.bench._tau import LAMBDAS, run_tau

        out["suites"]["tau"] = run_tau(
            tau_data,
            policies=tau_policies,
            lambdas=tau_lambdas or LAMBDAS,
            tasks=tau_tasks,
            seeds=tau_seeds,
            workers=workers,
            progress=note,
        )
    if "tau-live" in suites:
        from tether.bench._tau_live import run_live_tau

        out["suites"]["tau-live"] = run_live_tau(tau_data, tasks=tau_tasks, progress=note)
    if "fleet-live" in suites:
        from tether.bench._live import run_live_suite

        out["suites"]["fleet-live"] = run_live_suite(scenarios, seed=seed, progress=note)
    if "serve" in suites:
        from tether.bench._serve import SIZES, run_serve

        out["suites"]["serve"] = run_serve(
            serve_runs or SIZES,
            pg_dsn=serve_pg,
            progress=lambda message: note(f"serve: {message.removeprefix('serve ')}", 0),
        )
    return out
