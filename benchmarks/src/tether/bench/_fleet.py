"""The fleet suite: a thousand clients against one dependency that had a bad minute.

Every client is a coroutine on one shared virtual clock, driven by a tiny event loop
(each in its own ``contextvars.Context``, as asyncio tasks are), and calls the
dependency through the real :class:`tether.RetryPolicy` (and, for ``tether``, the
real breaker, budget and limiter sharing one store).
"""

from __future__ import annotations

import contextvars
import heapq
import math
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any

from tether import (
    AdaptiveLimiter,
    BreakerEvent,
    CircuitBreaker,
    RetryBudget,
    RetryPolicy,
    VirtualClock,
    backoff,
)
from tether._errors import Picklable
from tether.stores import MemoryStore

__all__ = [
    "CALL_CLASSES",
    "FLEET_POLICIES",
    "FLEET_SCENARIOS",
    "calls_by_class",
    "contention",
    "lower_bounds",
    "run_fleet",
]

LATENCY = 0.05  # seconds per request
TICKS = 10  # capacity is enforced per 1/TICKS of a second
SIM_CAP = 600.0  # virtual seconds after which the simulation gives up


class _Wake:
    __slots__ = ("at",)

    def __init__(self, at: float) -> None:
        self.at = at

    def __await__(self) -> Generator[_Wake, None, None]:
        yield self


class SimClock(VirtualClock):
    """A VirtualClock whose async sleeps hand control to the simulation's event loop."""

    async def asleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.slept += max(0.0, seconds)
        await _Wake(self._now + max(0.0, seconds))

    def sleep(self, seconds: float) -> None:  # pragma: no cover - clients are async
        raise RuntimeError("fleet clients sleep asynchronously")


def drive(clock: SimClock, coros: list[Coroutine[Any, Any, Any]], cap: float = SIM_CAP) -> None:
    """Run coroutines on virtual time: always resume the one whose wake-up comes first."""
    heap: list[tuple[float, int, Coroutine[Any, Any, Any], contextvars.Context]] = []
    seq = 0
    for coro in coros:
        heap.append((clock.now(), seq, coro, contextvars.copy_context()))
        seq += 1
    heapq.heapify(heap)
    while heap:
        at, _, coro, ctx = heapq.heappop(heap)
        if at > cap:
            coro.close()
            for _, _, rest, _ in heap:
                rest.close()
            return
        clock._now = max(clock._now, at)
        try:
            wake = ctx.run(coro.send, None)
        except StopIteration:
            continue
        seq += 1
        heapq.heappush(heap, (wake.at, seq, coro, ctx))


class Overloaded(Picklable, Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status_code = status


@dataclass
class Server:
    """Fixed capacity per second; down, or failing half its calls, for a window."""

    clock: SimClock
    capacity: int
    outage_s: float
    brownout_s: float
    rng: random.Random
    total: int = 0
    #: every call as (sent at, status, a job's first call), when asked for (``calls_by_class``)
    log: list[tuple[float, int, bool]] | None = None

    def __post_init__(self) -> None:
        self.load: Counter[int] = Counter()  # calls per second
        self.ticks: Counter[int] = Counter()  # calls per tick: capacity is enforced per tick

    async def request(self, first: bool = True) -> str:
        sent = self.clock.now()
        await self.clock.asleep(LATENCY)
        now = self.clock.now()
        self.total += 1
        self.load[int(now)] += 1
        tick = int(now * TICKS)
        self.ticks[tick] += 1
        status = 200
        down = now < self.outage_s
        if down or (now < self.brownout_s and self.rng.random() < BROWNOUT_FAILURE):
            status = 503
        elif self.ticks[tick] > self.capacity / TICKS:  # a rate limiter in front of the service
            status = 429
        if self.log is not None:
            self.log.append((sent, status, first))
        if status != 200:
            raise Overloaded(status)
        return "ok"


#: the reasons of the breaker's events that end a probe (:class:`tether.BreakerEvent`)
PROBE_ENDS = ("tripped: probe failed", "probe succeeded")
#: the classes of :func:`calls_by_class`, in the order of an outage
CALL_CLASSES = (
    "before_trip",
    "probes",
    "queued_permits",
    "after_close_throttled",
    "after_close_failed",
    "after_close_ok",
)


def calls_by_class(
    calls: list[tuple[float, int, bool]], events: list[tuple[float, str, str, str]]
) -> dict[str, int]:
    """Where a fleet's calls went, by when each was sent against the shared breaker.

    ``calls``: (sent at, status, a job's first call); ``events``: the breaker's transitions
    as (at, old, new, reason), from every process (the same clock). ``before_trip``: sent
    before the breaker first opened; between the trip and the last close (the successful
    probe): ``probes`` (the probes that ended, counted from the events) and
    ``queued_permits`` (the rest: callers that took a permit before the trip and went out
    later); after the close: ``after_close_throttled`` (429), ``after_close_failed``,
    ``after_close_ok``. ``retries``: calls that were not their job's first (any class).
    """
    trip = min((at for at, _, new, _ in events if new == "open"), default=math.inf)
    close = max((at for at, _, _, why in events if why == "probe succeeded"), default=math.inf)
    probes = sum(1 for *_, why in events if why in PROBE_ENDS)
    out = dict.fromkeys(CALL_CLASSES, 0)
    for sent, status, _ in calls:
        if sent < trip:
            out["before_trip"] += 1
        elif sent < close:
            out["queued_permits"] += 1
        elif status == 200:
            out["after_close_ok"] += 1
        else:
            out["after_close_throttled" if status == 429 else "after_close_failed"] += 1
    out["probes"] = min(probes, out["queued_permits"])
    out["queued_permits"] -= out["probes"]
    out["retries"] = sum(1 for *_, first in calls if not first)
    return out


#: The breaker settings tether recommends when one breaker is shared by a fleet.
FLEET_BREAKER: dict[str, Any] = {
    "failure_threshold": 100,
    "window": 50,
    "min_calls": 20,
    "failure_rate": 0.9,
}

#: Outages of several lengths, so that no setting lines up with one of them by chance,
#: and a brownout (half the calls fail for a minute).
FLEET_SCENARIOS = {
    "outage-5": {"outage_s": 5.0, "brownout_s": 0.0},
    "outage-10": {"outage_s": 10.0, "brownout_s": 0.0},
    "outage": {"outage_s": 30.0, "brownout_s": 0.0},
    "outage-35": {"outage_s": 35.0, "brownout_s": 0.0},
    "outage-120": {"outage_s": 120.0, "brownout_s": 0.0},
    "brownout": {"outage_s": 0.0, "brownout_s": 60.0},
}
BROWNOUT_FAILURE = 0.5


def lower_bounds(scenario: str, clients: int, capacity: int) -> tuple[int, float]:
    """The fewest calls and the shortest time in which ``clients`` jobs can all succeed.

    An outage: nothing succeeds until it ends, then one call per job at full capacity.
    A brownout: each call fails with probability BROWNOUT_FAILURE while it lasts, so a
    job needs 1 / (1 - p) calls on average there; after it, one call.
    """
    shape = FLEET_SCENARIOS[scenario]
    outage, brownout = shape["outage_s"], shape["brownout_s"]
    if brownout <= outage:
        return clients, outage + clients / capacity
    ok_rate = capacity * (1.0 - BROWNOUT_FAILURE)  # successes per second in the brownout
    span = brownout - outage
    if clients <= ok_rate * span:
        return round(clients / (1.0 - BROWNOUT_FAILURE)), outage + clients / ok_rate
    rest = clients - ok_rate * span
    return round(capacity * span + rest), brownout + rest / capacity


def _retrying(jitter: str) -> Callable[[SimClock, Server, int, dict[str, Any]], Awaitable[None]]:
    async def client(clock: SimClock, server: Server, seed: int, shared: dict[str, Any]) -> None:
        policy = RetryPolicy(
            max_attempts=1_000_000, jitter=jitter, base=0.5, cap=30.0, clock=clock, seed=seed
        )
        await policy.acall(server.request)

    return client


async def _immediate(clock: SimClock, server: Server, seed: int, shared: dict[str, Any]) -> None:
    while True:
        try:
            await server.request()
            return
        except Overloaded:
            continue


async def _tether(clock: SimClock, server: Server, seed: int, shared: dict[str, Any]) -> None:
    """tether's defaults, with the budget, breaker and limiter shared by the fleet; the job
    is redelivered until it succeeds, as a queue would (``RetryPolicy.acall_job``)."""
    policy = RetryPolicy(
        budget=shared["budget"],
        breaker=shared["breaker"],
        limiter=shared["limiter"],
        clock=clock,
        seed=seed,
    )
    calls = 0

    async def request() -> str:
        nonlocal calls
        calls += 1
        return await server.request(calls == 1)

    await policy.acall_job(request)


FLEET_POLICIES: dict[str, Callable[[SimClock, Server, int, dict[str, Any]], Awaitable[None]]] = {
    "immediate": _immediate,
    "exponential": _retrying("none"),
    "full-jitter": _retrying("full"),
    "decorrelated": _retrying("decorrelated"),
    "tether": _tether,
}


def run_fleet(
    scenario: str,
    policy: str,
    *,
    clients: int = 1000,
    capacity: int = 100,
    seed: int = 7,
    outage_s: float | None = None,
    by_class: bool = False,
) -> dict[str, Any]:
    """One fleet run: total calls, peak load over capacity, completion time, success.

    ``outage_s`` replaces the scenario's outage (the live suite simulates its own);
    ``by_class`` adds ``calls_by_class`` (:func:`calls_by_class`).
    """
    clock = SimClock()
    rng = random.Random(f"{seed}:{scenario}:{policy}")
    shape = dict(FLEET_SCENARIOS[scenario])
    if outage_s is not None:
        shape["outage_s"] = outage_s
    server = Server(clock, capacity, shape["outage_s"], shape["brownout_s"], rng)
    events: list[tuple[float, str, str, str]] = []
    if by_class:
        server.log = []
    store = MemoryStore()

    def heard(e: BreakerEvent) -> None:
        events.append((clock.now(), e.old, e.new, e.reason))

    shared = {
        "budget": RetryBudget("dep", store=store),
        # a breaker shared by a fleet trips on a failure rate, not on five failures in
        # a row: a thousand clients see five overloaded calls in a row within a second
        "breaker": CircuitBreaker(
            "dep", store=store, clock=clock, on_change=heard if by_class else None, **FLEET_BREAKER
        ),
        "limiter": AdaptiveLimiter("dep", store=store, clock=clock),
    }
    done: list[float] = []
    client = FLEET_POLICIES[policy]

    async def one(i: int) -> None:
        await client(clock, server, rng.getrandbits(32), shared)
        done.append(clock.now())

    drive(clock, [one(i) for i in range(clients)])
    peak = max(server.load.values()) if server.load else 0
    per_second = [server.load.get(s, 0) for s in range(int(max(done, default=0.0)) + 1)]
    out = {
        "success": round(len(done) / clients, 4),
        "total_calls": server.total,
        "peak_load_ratio": round(peak / capacity, 2),
        "completion_s": round(max(done) if len(done) == clients else SIM_CAP, 2),
        "load_per_second": per_second,
    }
    if server.log is not None:
        out["calls_by_class"] = calls_by_class(server.log, events)
    return out


# --- the contention experiment of "Exponential Backoff and Jitter" ----------------------


def contention(
    jitter: str, *, clients: int = 100, seed: int = 7, work: float = 0.1
) -> dict[str, float]:
    """Clients contending for one optimistic-concurrency resource: calls and completion.

    Each attempt reads the version, works for ``work`` seconds and writes; the write
    fails if another client wrote in between. Failures back off with ``jitter``
    (tether's backoff functions, base 0.1 s, cap 10 s).
    """
    clock = SimClock()
    rng = random.Random(f"{seed}:contention:{jitter}")
    state = {"version": 0, "calls": 0}
    finished: list[float] = []

    async def client() -> None:
        attempt, prev = 0, 0.1
        while True:
            seen = state["version"]
            state["calls"] += 1
            await clock.asleep(work)
            if state["version"] == seen:
                state["version"] += 1
                finished.append(clock.now())
                return
            if jitter == "none":
                wait = backoff.exponential(attempt, 0.1, 10.0)
            elif jitter == "full":
                wait = backoff.full_jitter(attempt, 0.1, 10.0, rng)
            elif jitter == "equal":
                wait = backoff.equal_jitter(attempt, 0.1, 10.0, rng)
            else:
                wait = prev = backoff.decorrelated_jitter(prev, 0.1, 10.0, rng)
            attempt += 1
            await clock.asleep(wait)

    drive(clock, [client() for _ in range(clients)], cap=100_000.0)
    return {"calls": state["calls"], "completion_s": round(max(finished), 2)}
