"""The live fleet suite: real worker processes sharing one Redis, against a real server.

A loopback HTTP server (its own process) answers in 50 ms, takes ``capacity`` requests
a second (more are refused with 429, counted per tenth of a second) and answers 503 for
the first ``outage`` seconds. Worker processes run ``clients`` asyncio jobs between them;
each job calls the server through a :class:`tether.RetryPolicy` whose breaker, budget
and limiter live in one :class:`tether.stores.RedisStore`, with ``acall_job``. The
suite reports calls, completion, peak load and Redis round trips per dependency call,
beside the simulation of the same scenario. Redis comes from ``TETHER_REDIS_URL``.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from tether._errors import Picklable
from tether.bench._interrupt import interrupt_ignored
from tether.bench._wire import serve_until
from tether.bench._workers import start_workers

__all__ = ["LIVE_SCENARIOS", "run_live", "run_live_suite"]

LATENCY = 0.05
TICKS = 10
#: Outages of the live suite (seconds): one short, one just past the old fixed cooldown.
LIVE_SCENARIOS = {"outage-10": 10.0, "outage-35": 35.0}


def _server_main(
    port_q: Any,
    result_q: Any,
    stop: Any,
    capacity: int,
    outage: float,
    start_at: float,
    stop_after: float,
) -> None:
    """The dependency: answers on loopback until told to stop (or ``stop_after`` seconds)."""
    load: Counter[int] = Counter()
    ticks: Counter[int] = Counter()
    total = [0]
    log: list[tuple[float, int, bool]] = []  # (sent at, status, a job's first call)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                sent, first = time.time() - start_at, True
                while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    if header.lower().startswith(b"x-call:"):
                        first = header.split(b":", 1)[1].strip() == b"1"
                await asyncio.sleep(LATENCY)
                now = time.time() - start_at
                total[0] += 1
                load[int(now)] += 1
                tick = int(now * TICKS)
                ticks[tick] += 1
                if now < outage:
                    status = b"503 Service Unavailable"
                elif ticks[tick] > capacity / TICKS:
                    status = b"429 Too Many Requests"
                else:
                    status = b"200 OK"
                log.append((sent, int(status.split()[0]), first))
                writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        await serve_until(handle, port_q, stop, start_at + stop_after)
        result_q.put({"total": total[0], "load": dict(load), "log": log})

    asyncio.run(main())


class _Status(Picklable, Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status_code = status


def _worker_main(
    redis_url: str,
    prefix: str,
    port: int,
    clients: int,
    seed: int,
    start_at: float,
    give_up: float,
    result_q: Any,
) -> None:
    """One worker process: ``clients`` jobs sharing this process's RedisStore."""
    from tether import AdaptiveLimiter, BreakerEvent, CircuitBreaker, RetryBudget, RetryPolicy
    from tether.bench._fleet import FLEET_BREAKER
    from tether.stores.redis._store import RedisStore

    store = RedisStore(redis_url, prefix=prefix)
    events: list[tuple[float, str, str, str]] = []  # the breaker's, seconds since the start

    def heard(e: BreakerEvent) -> None:
        events.append((e.at - start_at, e.old, e.new, e.reason))

    budget = RetryBudget("dep", store=store)
    breaker = CircuitBreaker("dep", store=store, on_change=heard, **FLEET_BREAKER)
    limiter = AdaptiveLimiter("dep", store=store)
    done: list[float] = []

    async def job(i: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        lock = asyncio.Lock()
        calls = 0

        async def request() -> str:
            nonlocal calls
            calls += 1
            async with lock:
                writer.write(b"GET / HTTP/1.1\r\nHost: dep\r\nX-Call: %d\r\n\r\n" % calls)
                await writer.drain()
                status = int((await reader.readline()).split()[1])
                while (await reader.readline()) not in (b"\r\n", b""):
                    pass
                await reader.readexactly(2)
            if status != 200:
                raise _Status(status)
            return "ok"

        policy = RetryPolicy(
            budget=budget, breaker=breaker, limiter=limiter, seed=seed * 100_003 + i
        )
        try:
            await policy.acall_job(request, give_up_after=give_up)
            done.append(time.time() - start_at)
        except Exception:
            pass
        finally:
            writer.close()

    timeline: list[tuple[float, int]] = []  # (seconds since the start, round trips so far)

    async def sample() -> None:
        while True:
            timeline.append((time.time() - start_at, store.round_trips))
            await asyncio.sleep(0.25)

    async def main() -> None:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        sampler = asyncio.create_task(sample())
        await asyncio.gather(*(job(i) for i in range(clients)))
        sampler.cancel()
        timeline.append((time.time() - start_at, store.round_trips))
        await store.aclose()

    asyncio.run(main())
    result_q.put(
        {
            "done": done,
            "round_trips": store.round_trips,
            "scripts": dict(store.scripts_run),
            "timeline": timeline,
            "events": events,
        }
    )


def _at(timeline: list[tuple[float, int]], t: float) -> int:
    """Round trips a worker had made by ``t`` seconds (its last sample at or before ``t``)."""
    seen = 0
    for when, count in timeline:
        if when > t:
            break
        seen = count
    return seen


def _phases(
    results: list[dict[str, Any]], outage: float, end: float, clients: int
) -> dict[str, Any]:
    """Redis round trips per second per client, during the outage and during the recovery."""
    during = sum(_at(r["timeline"], outage) for r in results)
    total = sum(r["round_trips"] for r in results)
    recovery_s = max(0.25, end - outage)
    return {
        "outage_rt_per_s_per_client": round(during / outage / clients, 4),
        "recovery_rt_per_s_per_client": round((total - during) / recovery_s / clients, 4),
        "recovery_s": round(recovery_s, 2),
    }


def _shard_worker(
    redis_url: str, prefix: str, seconds: float, start_at: float, result_q: Any
) -> None:
    """Hammer one breaker's acquire/record scripts (the guards' heaviest mix, no cache)."""
    from tether.stores._logic import BreakerConfig
    from tether.stores.redis._store import RedisStore

    store = RedisStore(redis_url, prefix=prefix, cache_ttl=0.0, server_time=False)
    cfg = BreakerConfig(
        failure_threshold=5,
        cooldown=30.0,
        half_open_max_calls=1,
        window=0,
        min_calls=0,
        failure_rate=1.0,
        probe_interval=1.0,
    )
    time.sleep(max(0.0, start_at - time.time()))
    end, n = time.time() + seconds, 0
    while time.time() < end:
        now = time.time()
        permit = store.breaker_acquire(f"b{n % 64}", now, cfg)[3]
        store.breaker_record(f"b{n % 64}", now, permit, False, cfg)
        n += 2
    store.reset()
    store.close()
    result_q.put(n)


def measure_shard(
    redis_url: str | None = None, *, seconds: float = 3.0, procs: int = 4
) -> dict[str, Any]:
    """The Lua script calls per second one Redis server answers here, from ``procs``
    processes (each one connection, one call at a time)."""
    url = redis_url or os.environ.get("TETHER_REDIS_URL", "redis://127.0.0.1:6379/0")
    ctx = multiprocessing.get_context("spawn")
    result_q = ctx.Queue()
    start_at = time.time() + 2.0
    prefix = f"tether-shard-{uuid.uuid4().hex[:8]}"
    workers = [
        ctx.Process(
            target=_shard_worker, args=(url, prefix, seconds, start_at, result_q), daemon=True
        )
        for _ in range(procs)
    ]
    for w in workers:
        w.start()
    calls = sum(result_q.get(timeout=seconds + 60) for _ in workers)
    for w in workers:
        w.join(timeout=5)
    return {
        "ops_per_s": round(calls / seconds),
        "processes": procs,
        "seconds": seconds,
        "cpus": os.cpu_count(),
    }


#: The fleets the bench projects the Redis load for, and the share of a shard's measured
#: capacity a plan should use (headroom for spikes, replication, other tenants).
FLEETS = (1_000, 10_000, 100_000)
SHARD_HEADROOM = 0.5


def projection(scenarios: dict[str, Any], shard: dict[str, Any]) -> dict[str, Any]:
    """Redis ops/s of fleets of 10^3..10^5 clients during an outage and during recovery,
    from the live runs' per-client rates, and the shards they need."""
    import math

    per_client = {
        phase: max(e["live"][f"{phase}_rt_per_s_per_client"] for e in scenarios.values())
        for phase in ("outage", "recovery")
    }
    usable = shard["ops_per_s"] * SHARD_HEADROOM
    rows = {}
    for n in FLEETS:
        outage, recovery = n * per_client["outage"], n * per_client["recovery"]
        rows[str(n)] = {
            "outage_ops_per_s": round(outage),
            "recovery_ops_per_s": round(recovery),
            "shards": max(1, math.ceil(max(outage, recovery) / usable)),
        }
    return {"per_client": per_client, "shard": shard, "headroom": SHARD_HEADROOM, "fleets": rows}


def _commands(redis_url: str) -> int:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        stats = client.info("commandstats")
        return sum(int(v.get("calls", 0)) for v in stats.values() if isinstance(v, dict))
    finally:
        client.close()


def run_live(
    outage: float,
    *,
    clients: int = 300,
    capacity: int = 40,
    workers: int = 4,
    redis_url: str | None = None,
    seed: int = 7,
) -> dict[str, Any]:
    """One live run of an ``outage`` (seconds) with real processes; the simulation of the
    same scenario beside it."""
    from tether.bench._fleet import calls_by_class, run_fleet

    url = redis_url or os.environ.get("TETHER_REDIS_URL", "redis://127.0.0.1:6379/0")
    bound_s = outage + clients / capacity
    give_up = 3.0 * bound_s + 30.0
    ctx = multiprocessing.get_context("spawn")
    port_q, server_q, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    start_at = time.time() + 3.0  # time for the processes to start
    server = ctx.Process(
        target=_server_main,
        args=(port_q, server_q, stop, capacity, outage, start_at, give_up + 5.0),
        daemon=True,
    )
    with interrupt_ignored():
        server.start()
    port = port_q.get(timeout=30)
    prefix = f"tether-live-{uuid.uuid4().hex[:8]}"
    commands_before = _commands(url)
    share = [clients // workers + (1 if i < clients % workers else 0) for i in range(workers)]
    workers_args = [
        {
            "redis_url": url,
            "prefix": prefix,
            "port": port,
            "clients": n,
            "seed": seed + i,
            "start_at": start_at,
            "give_up": give_up,
        }
        for i, n in enumerate(share)
    ]
    results = start_workers(ctx, _worker_main, workers_args).results(timeout=give_up + 60)
    stop.set()
    served = server_q.get(timeout=30)
    server.join(timeout=5)
    commands = _commands(url) - commands_before
    done = [t for r in results for t in r["done"]]
    round_trips = sum(r["round_trips"] for r in results)
    scripts: Counter[str] = Counter()
    for r in results:
        scripts.update(r["scripts"])
    total = served["total"]
    peak = max(served["load"].values(), default=0)
    sim = run_fleet(
        "outage",
        "tether",
        clients=clients,
        capacity=capacity,
        seed=seed,
        outage_s=outage,
        by_class=True,
    )
    events = sorted(e for r in results for e in r["events"])
    sim.pop("load_per_second", None)
    return {
        "clients": clients,
        "capacity_rps": capacity,
        "outage_s": outage,
        "workers": workers,
        "lower_bound_calls": clients,
        "lower_bound_s": bound_s,
        "live": {
            "success": round(len(done) / clients, 4),
            "total_calls": total,
            "completion_s": round(max(done), 2) if len(done) == clients else None,
            "peak_load_ratio": round(peak / capacity, 2),
            "redis_round_trips": round_trips,
            "redis_commands": commands,
            "round_trips_per_call": round(round_trips / max(1, total), 2),
            "round_trips_by_script": dict(scripts),
            "calls_by_class": calls_by_class(served["log"], events),
            **_phases(results, outage, max(done, default=time.time() - start_at), clients),
        },
        "simulated": sim,
    }


def run_live_suite(
    scenarios: Sequence[str] | None,
    *,
    seed: int = 7,
    progress: Callable[[str, int], None] | None = None,
) -> dict[str, Any]:
    """The fleet-live suite: each outage of LIVE_SCENARIOS (or those of ``scenarios``), the
    shard's capacity and the Redis load projected from them, and the provider-limits
    scenario (:mod:`tether.bench._live_limits`; ``scenarios`` may name it alone); the
    litellm-router scenario (:mod:`tether.bench._live_litellm`) only when named."""
    note = progress or (lambda message, total: None)
    names = [n for n in LIVE_SCENARIOS if not scenarios or n in scenarios]
    live = {}
    for name in names:
        live[name] = run_live(LIVE_SCENARIOS[name], seed=seed)
        note(f"fleet-live: {name}", len(names) + 1)
    out: dict[str, Any] = {"scenarios": live}
    if live:
        shard = measure_shard()
        note("fleet-live: shard capacity", len(names) + 1)
        out["redis_load"] = projection(live, shard)
    if not scenarios or "provider-limits" in scenarios:
        from tether.bench._live_limits import run_live_limits_suite

        out["provider-limits"] = run_live_limits_suite(seed=seed)
        note("fleet-live: provider-limits", len(names) + 1)
    if scenarios and "litellm-router" in scenarios:  # only when named: it needs LiteLLM
        from tether.bench._live_litellm import run_litellm_suite

        out["litellm-router"] = run_litellm_suite(seed=seed)
        note("fleet-live: litellm-router", len(names) + 1)
    return out
