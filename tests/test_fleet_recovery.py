"""Recovery that follows the dependency: the job helper, and a quiet shared store."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from tether import CircuitBreaker, CircuitOpenError, RetryPolicy, VirtualClock
from tether.bench._fleet import FLEET_SCENARIOS, lower_bounds, run_fleet
from tether.stores import RedisStore


class Down(Exception):
    status_code = 503


class Dependency:
    """Down until ``up_at`` on ``clock``; counts calls."""

    def __init__(self, clock: VirtualClock, up_at: float) -> None:
        self.clock, self.up_at, self.calls = clock, up_at, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.clock.now() < self.up_at:
            raise Down()
        return "ok"


def test_call_job_waits_for_the_probe_and_finishes_when_the_dependency_is_back() -> None:
    """A job against a 12 s outage: done soon after it ends, with a handful of calls."""
    clock = VirtualClock()
    dep = Dependency(clock, up_at=12.0)
    breaker = CircuitBreaker("job-dep", failure_threshold=3, clock=clock)
    policy = RetryPolicy(max_attempts=3, base=0.2, breaker=breaker, clock=clock, seed=1)
    assert policy.call_job(dep) == "ok"
    assert 12.0 <= clock.now() < 12.0 * 1.15 + 1.5
    assert dep.calls < 20


def test_call_job_gives_up_at_its_deadline_and_on_permanent_failures() -> None:
    """give_up_after bounds the job; a permanent failure is raised at once."""
    clock = VirtualClock()
    dep = Dependency(clock, up_at=1e9)
    policy = RetryPolicy(max_attempts=2, base=0.1, clock=clock, seed=1,
                         breaker=CircuitBreaker("never-up", failure_threshold=2, clock=clock))  # fmt: skip
    with pytest.raises((Down, CircuitOpenError)):
        policy.call_job(dep, give_up_after=30.0)
    assert clock.now() <= 30.0
    calls = []

    def rejected() -> None:
        calls.append(1)
        raise ValueError("no such order")

    with pytest.raises(ValueError):
        RetryPolicy(clock=clock).call_job(rejected)
    assert calls == [1]


def test_acall_job() -> None:
    """The async form, on the same clock."""
    clock = VirtualClock()
    dep = Dependency(clock, up_at=3.0)

    async def call() -> str:
        return dep()

    policy = RetryPolicy(max_attempts=2, base=0.1, clock=clock, seed=2,
                         breaker=CircuitBreaker("async-dep", failure_threshold=2, clock=clock))  # fmt: skip
    assert asyncio.run(policy.acall_job(call)) == "ok"
    assert 3.0 <= clock.now() < 6.0


@pytest.mark.parametrize("scenario", [s for s in FLEET_SCENARIOS if s != "brownout"])
def test_fleet_recovery_follows_the_outage(scenario: str) -> None:
    """1,000 clients: every outage length within 1.3x of the bounds, load within 1.3x capacity."""
    calls, seconds = lower_bounds(scenario, 1000, 100)
    cell = run_fleet(scenario, "tether")
    assert cell["success"] == 1.0
    assert cell["completion_s"] <= 1.3 * seconds
    assert cell["total_calls"] <= 1.3 * calls
    assert cell["peak_load_ratio"] <= 1.3


def test_brownout_bounds_and_goal() -> None:
    """Half the calls failing for a minute: 2,000 calls and 20 s at best; tether within goals."""
    assert lower_bounds("brownout", 1000, 100) == (2000, 20.0)
    cell = run_fleet("brownout", "tether")
    assert cell["completion_s"] <= 1.5 * 20.0
    assert cell["total_calls"] <= 1.25 * 2000


def test_an_open_breaker_costs_the_redis_store_nothing_until_its_probe(redis_url: str) -> None:
    """While open, refusals are answered from the cache: no round trip, no write."""
    store = RedisStore(
        redis_url, prefix=f"tether-test-{uuid.uuid4().hex[:8]}", cache_ttl=1.0, server_time=False
    )
    clock = VirtualClock()
    breaker = CircuitBreaker("quiet", failure_threshold=1, cooldown=30.0, store=store, clock=clock)
    with pytest.raises(Down):
        breaker.call(Dependency(clock, 1e9))
    before = store.round_trips
    for _ in range(1000):
        with pytest.raises(CircuitOpenError):
            breaker.call(lambda: "x")
    assert store.round_trips == before
    clock.advance(1.0)  # the probe is due: one round trip to claim it
    assert breaker.call(lambda: "ok") == "ok"
    assert store.round_trips - before <= 2
    store.reset()


def test_transitions_made_elsewhere_reach_this_process(redis_url: str) -> None:
    """Another process opens the breaker: this one's hooks hear of it at its next refresh."""
    prefix = f"tether-test-{uuid.uuid4().hex[:8]}"
    clock = VirtualClock()
    here = RedisStore(redis_url, prefix=prefix, cache_ttl=0.0, server_time=False)
    there = RedisStore(redis_url, prefix=prefix, cache_ttl=0.0, server_time=False)
    seen: list[Any] = []
    mine = CircuitBreaker(
        "shared", failure_threshold=1, store=here, clock=clock, on_change=seen.append
    )
    theirs = CircuitBreaker("shared", failure_threshold=1, store=there, clock=clock)
    assert mine.call(lambda: "ok") == "ok"  # this process knows it closed
    with pytest.raises(Down):
        theirs.call(Dependency(clock, 1e9))
    with pytest.raises(CircuitOpenError):
        mine.call(lambda: "x")
    assert [(e.old, e.new) for e in seen] == [("closed", "open")]
    assert seen[0].reason == "seen in the shared store"
    here.reset()


def test_the_live_suite_runs_real_processes_against_real_redis(redis_url: str) -> None:
    """A short live run: worker processes share one RedisStore and all finish; the report
    has the live figures beside the simulated ones."""
    from tether.bench._live import run_live

    report = run_live(2.0, clients=40, capacity=20, workers=2, redis_url=redis_url)
    live, sim = report["live"], report["simulated"]
    assert live["success"] == 1.0 and sim["success"] == 1.0
    assert live["total_calls"] >= 40
    assert live["completion_s"] >= 2.0
    assert 0 < live["round_trips_per_call"] < 50
    assert set(live["round_trips_by_script"]) >= {"limiter_acquire", "breaker_record"}
    from tether.bench._fleet import CALL_CLASSES

    for run in (live, sim):  # every call in one class; one first call per job
        assert sum(run["calls_by_class"][c] for c in CALL_CLASSES) == run["total_calls"]
        assert run["calls_by_class"]["retries"] == run["total_calls"] - 40
    from tether.bench._live_report import live_tables

    tables = live_tables({"scenarios": {"outage-2": report}})
    head, rows = tables["fleet-live: where the calls went"]
    assert head[:4] == ["scenario", "run", "calls", "before the trip"]
    assert [row[:3] for row in rows] == [
        ["outage-2", "live", str(live["total_calls"])],
        ["outage-2", "simulated", str(sim["total_calls"])],
    ]


def test_acall_uses_the_asyncio_redis_client(redis_url: str) -> None:
    """Inside acall every guard operation goes through redis.asyncio: a store whose sync
    client points nowhere still shares its state, and never falls back."""
    import redis
    import redis.asyncio

    from tether import AdaptiveLimiter, RetryBudget

    prefix = f"tether-test-{uuid.uuid4().hex[:8]}"
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)

    async def main() -> tuple[str, bool]:
        store = RedisStore(client=dead, aclient=redis.asyncio.Redis.from_url(redis_url), prefix=prefix,
                           cache_ttl=0.0, server_time=False)  # fmt: skip
        clock = VirtualClock()
        policy = RetryPolicy(breaker=CircuitBreaker("async-dep", failure_threshold=1, store=store, clock=clock),
                             budget=RetryBudget("async-dep", store=store),
                             limiter=AdaptiveLimiter("async-dep", store=store, clock=clock), clock=clock)  # fmt: skip

        async def down() -> str:
            raise Down()

        with pytest.raises((Down, CircuitOpenError)):
            await policy.acall(down)
        await store.aclose()
        return store.scripts_run["breaker_record"] > 0 and "ok", store.degraded

    used, degraded = asyncio.run(main())
    assert (used, degraded) == ("ok", False)
    shared = redis.Redis.from_url(redis_url)
    assert shared.hget(f"{prefix}:breaker:async-dep", "state") == b"open"  # state is in Redis
    for key in shared.scan_iter(match=f"{prefix}:*"):
        shared.delete(key)


def test_breaker_cooldowns_are_measured_on_the_redis_servers_clock(redis_url: str) -> None:
    """A process whose clock runs two minutes ahead cannot probe early: the cooldown is
    measured on Redis's TIME, and its wait is translated to that process's clock."""
    from tether.clock import SystemClock

    class Ahead(SystemClock):
        def wall(self) -> float:
            return super().wall() + 120.0

    prefix = f"tether-test-{uuid.uuid4().hex[:8]}"
    here = RedisStore(redis_url, prefix=prefix, cache_ttl=0.0)
    ahead = RedisStore(redis_url, prefix=prefix, cache_ttl=0.0)
    mine = CircuitBreaker(
        "skew", failure_threshold=1, cooldown=5.0, probe_interval=None, store=here
    )
    theirs = CircuitBreaker("skew", failure_threshold=1, cooldown=5.0, probe_interval=None,
                            store=ahead, clock=Ahead())  # fmt: skip
    with pytest.raises(Down):
        mine.call(Dependency(VirtualClock(), 1e9))
    calls = []
    with pytest.raises(CircuitOpenError) as refused:
        theirs.call(lambda: calls.append(1))
    assert calls == []
    assert 4.0 < refused.value.retry_in <= 5.0
    here.reset()


def test_a_store_on_a_sync_client_still_serves_acall(redis_url: str) -> None:
    """RedisStore(client=redis.Redis(...)) has no asyncio twin: acall runs its scripts in a
    worker thread, and the state is shared as usual."""
    import redis

    prefix = f"tether-test-{uuid.uuid4().hex[:8]}"
    store = RedisStore(
        client=redis.Redis.from_url(redis_url), prefix=prefix, cache_ttl=0.0, server_time=False
    )
    breaker = CircuitBreaker("sync-client", failure_threshold=1, store=store, clock=VirtualClock())

    async def down() -> str:
        raise Down()

    with pytest.raises(Down):
        asyncio.run(RetryPolicy(max_attempts=1, breaker=breaker, clock=VirtualClock()).acall(down))
    assert not store.degraded and breaker.state == "open"
    store.reset()


def test_breaker_state_reads_the_servers_clock_too(redis_url: str) -> None:
    """breaker.state of a process whose clock is ahead: still open (not half_open early)."""
    from tether.clock import SystemClock

    class Ahead(SystemClock):
        def wall(self) -> float:
            return super().wall() + 120.0

    prefix = f"tether-test-{uuid.uuid4().hex[:8]}"
    here = RedisStore(redis_url, prefix=prefix, cache_ttl=0.0)
    mine = CircuitBreaker(
        "skew-state", failure_threshold=1, cooldown=5.0, probe_interval=None, store=here
    )
    theirs = CircuitBreaker("skew-state", failure_threshold=1, cooldown=5.0, probe_interval=None,
                            store=RedisStore(redis_url, prefix=prefix, cache_ttl=0.0), clock=Ahead())  # fmt: skip
    with pytest.raises(Down):
        mine.call(Dependency(VirtualClock(), 1e9))
    assert theirs.state == "open"
    here.reset()


@pytest.mark.parametrize("outage", [10.0, 35.0])
def test_the_live_fleets_shape_stays_within_the_call_goal(outage: float) -> None:
    """300 clients, 40 requests/s (the live suite's fleet): at most 1.3x the calls, and the
    calls by class add up; no caller goes out on a permit of before the trip beyond the few
    in flight when it tripped."""
    from tether.bench._fleet import CALL_CLASSES

    cell = run_fleet("outage", "tether", clients=300, capacity=40, outage_s=outage, by_class=True)
    assert cell["success"] == 1.0
    assert cell["total_calls"] <= 1.3 * 300
    by_class = cell["calls_by_class"]
    assert sum(by_class[c] for c in CALL_CLASSES) == cell["total_calls"]
    assert by_class["retries"] == cell["total_calls"] - 300  # one first call per job
    assert by_class["queued_permits"] <= 10
    assert 0 < by_class["probes"] <= 25
