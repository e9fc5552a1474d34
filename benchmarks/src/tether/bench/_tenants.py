"""The fleet suite's ``tenants`` scenario: many tenants' agents on one store, some tenants'
limits low. Each tenant runs several agents at once; every agent makes a series of model
calls (growing prompts, ``max_tokens=1024``, replies of random length) on one virtual
clock, interleaved: while one agent's request is out, the others send theirs.

Policies, side by side, each through the real library objects:

* ``tether``: ``tether.BudgetScopes`` on one store, every run in its tenant's scope: each
  call reserves its priced estimate (prompt + ``max_tokens``) before it is sent;
* ``tether-no-max-tokens``: the same, with requests that give no ``max_tokens`` (the
  reservation holds the prompt only: each run may pass the limit by its one call in flight);
* ``per-run-budget``: each run has ``Budget(max_cost_usd=<the tenant's limit>)``, no scope
  (what a user without scopes can do);
* ``after-the-call``: the tenant's spend is counted after each reply and checked before the
  next request (PydanticAI's ``cost_limit``, a gateway's budget).

Overspend per tenant = its spend past its limit. For ``tether`` the paused runs are then
resumed after their tenant's limit is raised.

The scopes live in this process's memory (``--scenario tenants``), or in a fleet's store:
real Redis (``tenants-redis``, ``TETHER_REDIS_URL``) or PostgreSQL through
``tether.Records.postgres`` (``tenants-postgres``, ``TETHER_PG_DSN``); those two run the
tether policies (the peers keep no shared state) and time each call's reservation and
settlement there.
"""

from __future__ import annotations

import heapq
import os
import random
import time
import uuid
from collections.abc import Callable, Generator
from typing import Any

import tether
from tether.stores import MemoryStore

__all__ = ["TENANT_POLICIES", "TENANT_STORES", "run_tenants"]

#: where the scopes live, by scenario: this process, or a fleet's store (tether policies)
TENANT_STORES = {"tenants": "memory", "tenants-redis": "redis", "tenants-postgres": "postgres"}

TENANT_POLICIES = ("tether", "tether-no-max-tokens", "per-run-budget", "after-the-call")
MODEL = "gpt-4o"
TENANTS, RUNS, CALLS = 40, 4, 12
LOW, HIGH = 0.25, 50.0  # every 4th tenant's limit is low
MAX_TOKENS = 1024

Step = Generator[float, None, None]


def _plan(seed: int) -> list[list[tuple[float, list[tuple[int, int, float]]]]]:
    """Per tenant, per run: its start and its calls (prompt, reply tokens, latency)."""
    rng = random.Random(f"{seed}:tenants")
    return [
        [
            (
                rng.uniform(0, 5),
                [
                    (800 + 400 * i + rng.randrange(200), rng.randrange(100, MAX_TOKENS + 1),
                     rng.uniform(1.0, 4.0))
                    for i in range(CALLS)
                ],
            )
            for _ in range(RUNS)
        ]
        for _ in range(TENANTS)
    ]  # fmt: skip


def _limit(tenant: int) -> float:
    return LOW if tenant % 4 == 0 else HIGH


def _drive(clock: tether.VirtualClock, gens: list[tuple[float, Step]]) -> None:
    heap = [(at, i, g) for i, (at, g) in enumerate(gens)]
    heapq.heapify(heap)
    seq = len(heap)
    while heap:
        at, _, gen = heapq.heappop(heap)
        if at > clock.now():
            clock.advance(at - clock.now())
        try:
            delay = next(gen)
        except StopIteration:
            continue
        heapq.heappush(heap, (clock.now() + delay, seq, gen))
        seq += 1


def _guarded(run: tether.Run, calls: list[tuple[int, int, float]], exact: bool) -> Step:
    with run:
        while run.proceed() and run.model_calls < len(calls):
            prompt, reply, latency = calls[run.model_calls]
            run.begin_model_call(
                model=MODEL,
                estimated_input_tokens=prompt,
                max_output_tokens=MAX_TOKENS if exact else None,
            )
            yield latency  # the request is out: other agents go on
            run.record_model_call(model=MODEL, input_tokens=prompt, output_tokens=reply)
            run.progress()
            yield 0.1
        if run.model_calls >= len(calls):
            run.succeed("answered")


def _after_the_call(
    spent: dict[int, float], done: list[int], tenant: int, calls: list[tuple[int, int, float]]
) -> Step:
    prices = tether.PriceTable()
    for prompt, reply, latency in calls:
        if spent[tenant] >= _limit(tenant):  # checked before, counted after the reply
            return
        yield latency
        spent[tenant] += prices.cost(MODEL, prompt, reply) or 0.0
        yield 0.1
    done.append(tenant)


def _store(kind: str) -> tuple[Any, Callable[[], object]]:
    """The scopes' store of ``kind`` and what removes it afterwards."""
    if kind == "memory":
        return MemoryStore(), lambda: None
    if kind == "redis":
        from tether.stores.redis._store import RedisStore

        url = os.environ.get("TETHER_REDIS_URL", "redis://127.0.0.1:6379/0")
        # the callers' clock (the scenario's virtual one) measures the scopes' windows
        redis = RedisStore(url, prefix=f"tether-bench-{uuid.uuid4().hex[:8]}", server_time=False)

        def drop_redis() -> None:
            redis.reset()
            redis.close()

        return redis, drop_redis
    if kind == "postgres":
        dsn = os.environ.get("TETHER_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
        table = f"tether_bench_{uuid.uuid4().hex[:8]}"
        records = tether.Records.postgres(dsn, table)

        def drop_tables() -> None:
            import psycopg

            records.close()
            with psycopg.connect(dsn, autocommit=True) as conn:
                for (name,) in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE tablename LIKE %s", [table + "%"]
                ).fetchall():
                    conn.execute(f"DROP TABLE IF EXISTS {name}")

        return records, drop_tables
    raise ValueError(f"unknown tenants store {kind!r}; choose from memory, redis, postgres")


def run_tenants(policy: str, *, seed: int = 7, store: str = "memory") -> dict[str, Any]:
    """One policy over the scenario: overspend per low-limit tenant, the others' runs
    completed, and (tether) the paused runs completed after their limits were raised;
    the scopes in ``store`` (memory, redis or postgres)."""
    backing, drop = _store(store)
    try:
        return _run_tenants(policy, seed, backing, store)
    finally:
        drop()


def _run_tenants(policy: str, seed: int, backing: Any, store: str) -> dict[str, Any]:
    plan = _plan(seed)
    clock = tether.VirtualClock()
    spent: dict[int, float] = dict.fromkeys(range(TENANTS), 0.0)
    costs: dict[int, list[tether.Run]] = {t: [] for t in range(TENANTS)}
    scopes = tether.BudgetScopes(backing, clock=clock)
    started = time.perf_counter()
    gens: list[tuple[float, Step]] = []
    done: list[int] = []  # after-the-call: the tenant of each run that made all its calls
    if policy in ("tether", "tether-no-max-tokens"):
        guard = tether.Guard(scopes=scopes, clock=clock, checkpoints=tether.Checkpoints.memory())
        for t in range(TENANTS):
            scopes.limit(f"tenant:{t}", max_cost_usd=_limit(t))
            for start, calls in plan[t]:
                run = guard.start(f"tenant {t}", scopes=(f"tenant:{t}",))
                costs[t].append(run)
                gens.append((start, _guarded(run, calls, policy == "tether")))
    elif policy == "per-run-budget":
        for t in range(TENANTS):
            guard = tether.Guard(budget=tether.Budget(max_cost_usd=_limit(t)), clock=clock)
            for start, calls in plan[t]:
                run = guard.start(f"tenant {t}")
                costs[t].append(run)
                gens.append((start, _guarded(run, calls, True)))
    elif policy == "after-the-call":
        for t in range(TENANTS):
            gens.extend((start, _after_the_call(spent, done, t, calls)) for start, calls in plan[t])
    else:
        raise ValueError(f"unknown tenants policy {policy!r}; choose from {TENANT_POLICIES}")
    _drive(clock, gens)
    for t, runs in costs.items():
        spent[t] = sum(r.cost_usd for r in runs) if runs else spent[t]
    low = [t for t in range(TENANTS) if _limit(t) == LOW]
    over = {t: max(0.0, spent[t] - _limit(t)) for t in low}
    worst = max(low, key=lambda t: over[t])
    prices = tether.PriceTable()
    # the bound: one call in flight per concurrent run, each at the tenant's dearest reply
    bound = {
        t: RUNS * max(prices.cost(MODEL, p, r) or 0.0 for _, c in plan[t] for p, r, _ in c)
        for t in low
    }
    completed_high = sum(
        1
        for t in range(TENANTS)
        if _limit(t) == HIGH
        for r in costs[t]
        if r.outcome.status == "success"
    ) + sum(1 for t in done if _limit(t) == HIGH)
    cell: dict[str, Any] = {
        "store": store,
        "tenants": TENANTS,
        "runs_per_tenant": RUNS,
        "low_limit_usd": LOW,
        "low_tenants": len(low),
        "low_tenants_over": sum(1 for t in low if over[t] > 1e-12),
        "max_overspend_usd": over[worst],
        "max_overspend_pct": 100 * over[worst] / LOW,
        "total_overspend_usd": sum(over.values()),
        "within_one_call_per_run": all(over[t] <= bound[t] + 1e-12 for t in low),
        "other_tenants_runs_completed": completed_high / (RUNS * (TENANTS - len(low))),
    }
    if policy.startswith("tether"):
        waiting = sum(len(scopes.waiting(f"tenant:{t}")) for t in low)
        for t in low:
            scopes.limit(f"tenant:{t}", max_cost_usd=HIGH)
        resumed: list[tuple[float, Step]] = []
        finals: list[tether.Run] = []
        for t in low:
            for run_id, checkpoint in scopes.waiting(f"tenant:{t}").items():
                run = guard.resume(checkpoint)
                finals.append(run)
                calls = next(
                    c for r, (_, c) in zip(costs[t], plan[t], strict=True) if r.run_id == run_id
                )
                resumed.append((clock.now(), _guarded(run, calls, policy == "tether")))
        _drive(clock, resumed)
        cell["paused_runs"] = waiting
        cell["resumed_completed"] = sum(1 for r in finals if r.outcome.status == "success")
        made = sum(r.model_calls for rs in costs.values() for r in rs)
        made += sum(r.model_calls for r in finals)
        # the whole scenario's time (the agents' own work is on the virtual clock) per call
        cell["ms_per_call"] = 1000.0 * (time.perf_counter() - started) / max(1, made)
    return cell
