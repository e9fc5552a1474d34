"""Circuit breaker, retry budget and adaptive limiter, in memory and in real Redis."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tether
from tether import (
    AdaptiveLimiter,
    CircuitBreaker,
    CircuitOpenError,
    RetryBudget,
    RetryPolicy,
    VirtualClock,
)
from tether.stores import MemoryStore, RedisStore


class HTTPError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status_code = status


@pytest.fixture(params=["memory", "redis", "redis-cluster"])
def store(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryStore()
        return
    prefix = f"tether-test-{uuid.uuid4().hex[:8]}"
    if request.param == "redis-cluster":
        client = request.getfixturevalue("redis_cluster").client()
        s = RedisStore(client=client, prefix=prefix, cache_ttl=0.0, server_time=False)
    else:
        s = RedisStore(
            request.getfixturevalue("redis_url"), prefix=prefix, cache_ttl=0.0, server_time=False
        )
    yield s
    s.reset()
    s.close()


def fail(status: int = 503) -> Any:
    def fn() -> None:
        raise HTTPError(status)

    return fn


# --- breaker -------------------------------------------------------------------------


def test_breaker_opens_after_threshold_and_refuses_without_calling(store: Any) -> None:
    """Consecutive retryable failures open it; then the dependency is not called."""
    clock = VirtualClock()
    breaker = CircuitBreaker(
        "dep", failure_threshold=3, cooldown=10.0, store=store, clock=clock, probe_interval=None
    )
    for _ in range(3):
        with pytest.raises(HTTPError):
            breaker.call(fail())
    assert breaker.state == "open"
    calls = []
    with pytest.raises(CircuitOpenError) as info:
        breaker.call(lambda: calls.append(1))
    assert (calls, info.value.name) == ([], "dep")
    assert info.value.retry_at == pytest.approx(clock.wall() + 10.0)


def test_breaker_half_open_probe_closes(store: Any) -> None:
    """After the cooldown one probe goes through; its success closes the breaker."""
    clock = VirtualClock()
    breaker = CircuitBreaker(
        "dep", failure_threshold=2, cooldown=5.0, store=store, clock=clock, probe_interval=None
    )
    for _ in range(2):
        with pytest.raises(HTTPError):
            breaker.call(fail())
    clock.advance(5.0)
    assert breaker.state == "half_open"
    assert breaker.call(lambda: "ok") == "ok"
    assert breaker.state == "closed"


def test_breaker_failed_probe_reopens_with_cooldown_restarted(store: Any) -> None:
    """A failed probe re-opens the breaker for a whole new cooldown."""
    clock = VirtualClock()
    breaker = CircuitBreaker(
        "dep", failure_threshold=1, cooldown=5.0, store=store, clock=clock, probe_interval=None
    )
    with pytest.raises(HTTPError):
        breaker.call(fail())
    clock.advance(6.0)
    with pytest.raises(HTTPError):
        breaker.call(fail())
    assert breaker.state == "open"
    clock.advance(4.0)
    with pytest.raises(CircuitOpenError):
        breaker.call(lambda: "x")
    clock.advance(1.0)
    assert breaker.call(lambda: "ok") == "ok"


def test_breaker_half_open_admits_probes_by_slow_start(store: Any) -> None:
    """One probe at first; each success lets one more through; enough successes close it."""
    clock = VirtualClock()
    breaker = CircuitBreaker("dep", failure_threshold=1, cooldown=1.0, half_open_max_calls=3,
                             probe_interval=None, store=store, clock=clock)  # fmt: skip
    with pytest.raises(HTTPError):
        breaker.call(fail())
    clock.advance(1.0)
    with breaker, pytest.raises(CircuitOpenError):  # the first probe is still out
        breaker.call(lambda: "second")
    with breaker, breaker, pytest.raises(CircuitOpenError):  # two now, not three
        breaker.call(lambda: "third")
    assert breaker.state == "closed"  # three probes succeeded


def test_breaker_probes_follow_the_outage(store: Any) -> None:
    """Adaptive probing: 1 s after the trip, then ~15% of the time open (at most doubling,
    never above the cooldown), so a 10 s outage is noticed within about a second."""
    clock = VirtualClock()
    breaker = CircuitBreaker("dep", failure_threshold=1, cooldown=30.0, store=store, clock=clock)
    with pytest.raises(HTTPError):
        breaker.call(fail())
    waits = []
    opened = clock.now()
    while clock.now() - opened < 400:
        try:
            breaker.call(fail())
        except CircuitOpenError as exc:
            wait = exc.retry_in
            waits.append(round(wait, 2))
            clock.advance(wait)
        except HTTPError:
            pass
    assert waits[:3] == [1.0, 1.0, 1.0]
    assert max(waits) == 30.0  # the cooldown caps it
    assert all(b <= 2 * a + 1e-9 for a, b in itertools.pairwise(waits))
    assert len(waits) < 50  # probes grow rarer: a few dozen in 400 s, not 400


def test_permanent_failures_never_open_the_breaker(store: Any) -> None:
    """A 400 is the caller's fault: it never counts against the dependency."""
    breaker = CircuitBreaker("dep", failure_threshold=2, store=store, clock=VirtualClock())
    for _ in range(10):
        with pytest.raises(HTTPError):
            breaker.call(fail(400))
        with pytest.raises(ValueError):
            breaker.call(lambda: (_ for _ in ()).throw(ValueError("business rule")))
    assert breaker.state == "closed"


def test_success_resets_consecutive_failures(store: Any) -> None:
    """Failures must be consecutive to trip the threshold rule."""
    breaker = CircuitBreaker("dep", failure_threshold=3, store=store, clock=VirtualClock())
    for _ in range(5):
        for _ in range(2):
            with pytest.raises(HTTPError):
                breaker.call(fail())
        breaker.call(lambda: None)
    assert breaker.state == "closed"


def test_failure_rate_window(store: Any) -> None:
    """The failure-rate rule trips on a rate over a window, after min_calls."""
    breaker = CircuitBreaker("dep", failure_threshold=100, window=10, min_calls=10,
                             failure_rate=0.5, store=store, clock=VirtualClock())  # fmt: skip
    outcomes = [True, False] * 4 + [True]  # 9 calls, 5 failures: below min_calls
    for failed in outcomes:
        if failed:
            with pytest.raises(HTTPError):
                breaker.call(fail())
        else:
            breaker.call(lambda: None)
    assert breaker.state == "closed"
    breaker.call(lambda: None)  # 10 calls, 5 failures: 50% reaches the threshold
    assert breaker.state == "open"


def test_breaker_async_and_context_manager(store: Any) -> None:
    """acall and the with-block count like call."""
    clock = VirtualClock()
    breaker = CircuitBreaker("dep", failure_threshold=2, store=store, clock=clock)

    async def bad() -> None:
        raise HTTPError(502)

    for _ in range(1):
        with pytest.raises(HTTPError):
            asyncio.run(breaker.acall(bad))
    with pytest.raises(HTTPError), breaker:
        raise HTTPError(503)
    assert breaker.state == "open"


def test_breaker_transitions_are_events() -> None:
    """Every transition reaches the on_change hook and the log."""
    clock = VirtualClock()
    events: list[tether.BreakerEvent] = []
    breaker = CircuitBreaker("dep", failure_threshold=1, cooldown=1.0, clock=clock,
                             on_change=events.append)  # fmt: skip
    with pytest.raises(HTTPError):
        breaker.call(fail())
    clock.advance(1.0)
    breaker.call(lambda: None)
    assert [(e.old, e.new) for e in events] == [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
    ]


def test_open_breaker_ends_the_retry_loop_at_once(store: Any) -> None:
    """RetryPolicy(breaker=...) stops, without sleeping, once the breaker opens."""
    clock = VirtualClock()
    breaker = CircuitBreaker(
        "dep", failure_threshold=2, cooldown=30.0, store=store, clock=clock, probe_interval=None
    )
    calls = 0

    def down() -> None:
        nonlocal calls
        calls += 1
        raise HTTPError(503)

    policy = RetryPolicy(max_attempts=10, jitter="none", base=1.0, breaker=breaker, clock=clock)
    with pytest.raises(CircuitOpenError) as info:
        policy.call(down)
    assert (calls, clock.now()) == (2, 1.0)
    assert isinstance(info.value.__cause__, HTTPError)
    with pytest.raises(CircuitOpenError):
        policy.call(down)
    assert calls == 2


def test_breaker_registry() -> None:
    """tether.breakers gives one breaker per dependency name."""
    a = tether.breakers.get("stripe", failure_threshold=2)
    assert a is tether.breakers.get("stripe")
    assert a is not tether.breakers.get("github")
    assert a.failure_threshold == 2 and "stripe" in tether.breakers


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"failure_threshold": 0}, "failure_threshold must be >= 1"),
        ({"cooldown": -1}, "cooldown must be >= 0"),
        ({"half_open_max_calls": 0}, "half_open_max_calls must be >= 1"),
        ({"window": 5, "min_calls": 6}, "min_calls must be between 1 and window"),
        ({"failure_rate": 1.5}, "failure_rate must be in"),
    ],
)
def test_breaker_invalid_configuration(kwargs: dict[str, Any], message: str) -> None:
    """Bad breaker settings fail at construction, naming the field."""
    with pytest.raises(ValueError, match=message):
        CircuitBreaker("x", **kwargs)


# --- budget --------------------------------------------------------------------------


def test_budget_refuses_retries_when_spent(store: Any) -> None:
    """An empty budget ends the retry loop with the last error; first attempts go on."""
    clock = VirtualClock()
    budget = RetryBudget("dep", capacity=10, retry_cost=5, store=store)
    calls = 0

    def down() -> None:
        nonlocal calls
        calls += 1
        raise HTTPError(503)

    policy = RetryPolicy(max_attempts=10, budget=budget, clock=clock)
    with pytest.raises(HTTPError):
        policy.call(down)
    assert calls == 3  # first attempt + 2 paid retries
    with pytest.raises(HTTPError):
        policy.call(down)
    assert calls == 4  # a first attempt is always allowed
    assert budget.tokens == 0


def test_budget_timeouts_cost_more_and_success_refunds(store: Any) -> None:
    """A retry after a timeout costs timeout_cost; a success refunds."""
    budget = RetryBudget("dep", capacity=20, retry_cost=5, timeout_cost=10, refund=1, store=store)
    assert budget.try_spend(timeout=True)
    assert budget.tokens == 10
    budget.on_success()
    assert budget.tokens == 11
    for _ in range(20):
        budget.on_success()
    assert budget.tokens == 20


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["spend", "timeout", "refund"]), st.booleans()), max_size=80)
)
def test_budget_conservation(ops: list[tuple[str, bool]]) -> None:
    """Tokens are conserved and stay within [0, capacity]."""
    budget = RetryBudget("prop", capacity=50, retry_cost=5, timeout_cost=10, refund=1,
                         store=MemoryStore())  # fmt: skip
    expected = 50.0
    for op, _ in ops:
        if op == "refund":
            budget.on_success()
            expected = min(50.0, expected + 1)
        else:
            cost = 10.0 if op == "timeout" else 5.0
            ok = budget.try_spend(timeout=op == "timeout")
            assert ok == (expected >= cost)
            if ok:
                expected -= cost
        assert expected == budget.tokens
        assert 0.0 <= budget.tokens <= 50.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"capacity": 0}, "capacity must be > 0"), ({"retry_cost": 0}, "retry_cost must be > 0"),
     ({"capacity": 5, "retry_cost": 6}, "retry_cost must be <= capacity"),
     ({"refund": -1}, "refund must be >= 0")],
)  # fmt: skip
def test_budget_invalid_configuration(kwargs: dict[str, Any], message: str) -> None:
    """Bad budget settings fail at construction."""
    with pytest.raises(ValueError, match=message):
        RetryBudget(**kwargs)


def test_fifty_threads_one_redis_budget_no_lost_update(redis_url: str) -> None:
    """50 threads spending one Redis budget: exactly capacity / cost retries succeed."""
    store = RedisStore(
        redis_url, prefix=f"tether-test-{uuid.uuid4().hex[:8]}", cache_ttl=0.0, server_time=False
    )
    budget = RetryBudget("shared", capacity=500, retry_cost=5, store=store)
    granted = []
    lock = threading.Lock()

    def spend() -> None:
        n = sum(budget.try_spend() for _ in range(10))
        with lock:
            granted.append(n)

    threads = [threading.Thread(target=spend) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(granted) == 100
    assert budget.tokens == 0
    store.reset()
    store.close()


# --- limiter -------------------------------------------------------------------------


def test_limiter_admits_at_its_rate(store: Any) -> None:
    """A fresh limiter hands out about initial_rate slots per second."""
    clock = VirtualClock()
    limiter = AdaptiveLimiter("dep", store=store, clock=clock, initial_rate=10.0)
    starts = []
    while True:
        wait, admitted = limiter.try_acquire()
        if not admitted:
            clock.advance(wait)
            continue
        if clock.now() + wait >= 1.0:
            break
        starts.append(clock.now() + wait)
    assert 9 <= len(starts) <= 11
    assert starts == sorted(starts)


def test_limiter_horizon_bounds_reservations(store: Any) -> None:
    """Slots are reserved at most `horizon` seconds ahead; later callers are told to come back."""
    clock = VirtualClock()
    limiter = AdaptiveLimiter("dep", store=store, clock=clock, initial_rate=4.0, horizon=0.5)
    answers = [limiter.try_acquire() for _ in range(5)]
    assert [ok for _, ok in answers] == [True, True, True, False, False]
    # the backlog past the horizon (0.25 s), plus a place in the queue of callers turned away
    assert answers[3][0] == pytest.approx(0.5)
    assert answers[4][0] >= answers[3][0] - 1e-9


def test_limiter_aimd_and_floor(store: Any) -> None:
    """A long outage cuts the rate to the floor; successes ramp it up fast; throttles cut it."""
    clock = VirtualClock()
    limiter = AdaptiveLimiter("dep", store=store, clock=clock, initial_rate=50.0, min_rate=1.0)
    down = tether.classify(status=503)
    for _ in range(400):
        limiter.record(down)
        clock.advance(0.25)
    assert limiter.rate == 1.0
    for _ in range(100):
        limiter.record(None)
    assert limiter.rate > 50.0  # slow start: an outage does not lower the threshold
    clock.advance(1.0)  # at most one cut per decrease_interval
    limiter.record(tether.classify(status=429))
    throttled = limiter.rate
    assert throttled < 101 * 0.71
    limiter.record(None)
    assert limiter.rate < throttled + 1.0  # congestion avoidance now: additive growth


def test_limiter_does_not_starve_a_brownout(store: Any) -> None:
    """Half the calls failing at random is not an outage: the rate is not cut."""
    clock = VirtualClock()
    limiter = AdaptiveLimiter("dep", store=store, clock=clock, initial_rate=50.0)
    down = tether.classify(status=503)
    for i in range(200):
        limiter.record(down if i % 2 else None)
        clock.advance(0.1)
    assert limiter.rate >= 50.0


def test_limiter_waits_within_deadline_or_raises() -> None:
    """RetryPolicy(limiter=...) waits for admission, never beyond its deadline."""
    clock = VirtualClock()
    limiter = AdaptiveLimiter("dep", store=MemoryStore(), clock=clock, initial_rate=1.0)
    policy = RetryPolicy(limiter=limiter, clock=clock, deadline=0.5)
    assert policy.call(lambda: "ok") == "ok"
    with pytest.raises(tether.LimiterTimeout):
        policy.call(lambda: "ok")
    # the first call reserved the slot at 0, so the next one starts at 1.0 s at the earliest
    started = RetryPolicy(limiter=limiter, clock=clock).call(lambda: clock.now())
    assert 1.0 - 1e-6 <= started <= 3.5  # a turned-away caller comes back after its turn


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"min_rate": 0}, "min_rate must be > 0"), ({"beta": 1.0}, "beta must be in"),
     ({"initial_rate": 0.5}, "initial_rate must be between"), ({"burst": 0.5}, "burst must be >= 1")],
)  # fmt: skip
def test_limiter_invalid_configuration(kwargs: dict[str, Any], message: str) -> None:
    """Bad limiter settings fail at construction."""
    with pytest.raises(ValueError, match=message):
        AdaptiveLimiter("x", **kwargs)


# --- a fleet through Redis -----------------------------------------------------------

CHILD = """
import sys
import tether
from tether.stores import RedisStore

class HTTPError(Exception):
    status_code = 503

store = RedisStore(sys.argv[1], prefix=sys.argv[2], cache_ttl=0.0)
breaker = tether.CircuitBreaker("payments", failure_threshold=3, cooldown=60.0, store=store)
for _ in range(3):
    try:
        breaker.call(lambda: (_ for _ in ()).throw(HTTPError()))
    except HTTPError:
        pass
print(breaker.state)
"""


def test_two_processes_share_one_breaker(redis_url: str) -> None:
    """Failures in one OS process open the breaker for another."""
    prefix = f"tether-test-{uuid.uuid4().hex[:8]}"
    out = subprocess.run([sys.executable, "-c", CHILD, redis_url, prefix], capture_output=True,
                         text=True, timeout=60, check=True)  # fmt: skip
    assert out.stdout.strip() == "open"
    store = RedisStore(redis_url, prefix=prefix, cache_ttl=0.0, server_time=False)
    breaker = CircuitBreaker("payments", failure_threshold=3, cooldown=60.0, store=store)
    called = []
    with pytest.raises(CircuitOpenError):
        breaker.call(lambda: called.append(1))
    assert called == []
    store.reset()
    store.close()


def test_redis_success_path_round_trips(redis_url: str) -> None:
    """With the default cache a healthy breaker costs at most one round trip per call."""
    store = RedisStore(redis_url, prefix=f"tether-test-{uuid.uuid4().hex[:8]}", server_time=False)
    breaker = CircuitBreaker("dep", store=store)
    breaker.call(lambda: None)
    before = store.round_trips
    for _ in range(100):
        breaker.call(lambda: None)
    assert store.round_trips - before <= 100
    store.reset()
    store.close()


def _free_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)


def test_redis_outage_falls_back_to_local_state_and_recovers(tmp_path: Any) -> None:
    """A Redis that goes away: warn once, guard locally, go back when it returns."""
    import shutil
    import time

    redis_server = shutil.which("redis-server")
    assert redis_server, (
        "redis-server must be installed for this test (Debian package redis-server)"
    )
    port = _free_port()
    cmd = [redis_server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
           "--appendonly", "no", "--dir", str(tmp_path)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        import redis

        for _ in range(100):
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        store = RedisStore(
            url, cache_ttl=0.0, reconnect_interval=0.0, socket_timeout=0.2, server_time=False
        )
        clock = VirtualClock()
        breaker = CircuitBreaker("dep", failure_threshold=2, store=store, clock=clock)
        breaker.call(lambda: None)
        assert not store.degraded
        proc.terminate()
        proc.wait(10)
        from tether.testing import capture_logs

        with capture_logs() as records:
            for _ in range(2):
                with pytest.raises(HTTPError):
                    breaker.call(fail())
            with pytest.raises(CircuitOpenError):  # the local fallback guards
                breaker.call(lambda: None)
        assert store.degraded
        warnings = [r for r in records if "is unavailable" in r.getMessage()]
        assert len(warnings) == 1
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        breaker2 = CircuitBreaker("other", store=store, clock=clock)
        assert breaker2.call(lambda: "ok") == "ok"
        assert not store.degraded
        store.close()
    finally:
        proc.terminate()
        proc.wait(10)


def test_redis_limiter_success_path_is_one_round_trip(redis_url: str) -> None:
    """A limiter-gated success costs its admission only: the success rides the next one."""
    store = RedisStore(redis_url, prefix=f"tether-test-{uuid.uuid4().hex[:8]}", server_time=False)
    clock = VirtualClock()
    limiter = AdaptiveLimiter("dep", store=store, clock=clock, initial_rate=1000.0)
    policy = RetryPolicy(limiter=limiter, clock=clock)
    policy.call(lambda: None)
    before = store.round_trips
    for _ in range(50):
        policy.call(lambda: None)
    assert store.round_trips - before <= 50
    assert limiter.rate == 1050.0  # every success counted: 50 arrived with later admissions
    store.reset()
    store.close()


class _Meanwhile(VirtualClock):
    """A clock on which something else happens during the next sleep (another process)."""

    def __init__(self) -> None:
        super().__init__()
        self.during_sleep: list[Any] = []

    def _sleep(self, seconds: float) -> None:
        while self.during_sleep:
            self.during_sleep.pop(0)()
        super()._sleep(seconds)


def _run(shell: str, policy: RetryPolicy, fn: Any) -> Any:
    if shell == "sync":
        return policy.call(fn)

    async def afn() -> Any:
        return fn()

    async def main() -> Any:
        try:
            return await policy.acall(afn)
        finally:
            aclose = getattr(policy.breaker.store if policy.breaker else None, "aclose", None)
            if aclose is not None:  # the asyncio client belongs to this event loop
                await aclose()

    return asyncio.run(main())


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_caller_queued_by_the_limiter_does_not_go_out_on_a_permit_of_before_the_trip(
    store: Any, shell: str
) -> None:
    """The breaker is asked again after each wait the limiter asks for: a caller that took
    its permit while the breaker was closed, then queued, does not call a dependency that
    another caller found down meanwhile (the extra calls of a long outage)."""
    clock = _Meanwhile()
    breaker = CircuitBreaker(
        "dep", failure_threshold=1, cooldown=30.0, probe_interval=None, store=store, clock=clock
    )
    limiter = AdaptiveLimiter("dep", store=store, clock=clock, initial_rate=1.0, min_rate=1.0)
    assert limiter.try_acquire() == (0.0, True)  # the only slot of this second is taken
    other = RetryPolicy(max_attempts=1, breaker=breaker, clock=clock)

    def trip() -> None:  # while this caller waits for its turn, another finds the dep down
        with pytest.raises(HTTPError):
            other.call(fail(503))

    clock.during_sleep.append(trip)
    calls: list[int] = []
    policy = RetryPolicy(breaker=breaker, limiter=limiter, clock=clock, seed=1)
    with pytest.raises(CircuitOpenError):
        _run(shell, policy, lambda: calls.append(1))
    assert calls == []
    assert breaker.state == "open"


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_probe_does_not_queue_behind_the_limiter(store: Any, shell: str) -> None:
    """A half-open breaker's probe goes out at once: the breaker lets one out at a time,
    and recovery is noticed when it answers, not when the limiter's queue reaches it."""
    clock = VirtualClock()
    breaker = CircuitBreaker("dep", failure_threshold=1, store=store, clock=clock)
    limiter = AdaptiveLimiter("dep", store=store, clock=clock, initial_rate=1.0, min_rate=1.0)
    with pytest.raises(HTTPError):
        RetryPolicy(max_attempts=1, breaker=breaker, clock=clock).call(fail(503))
    clock.advance(1.0)  # the probe is due (probe_interval 1 s)
    for _ in range(3):  # the limiter's queue is full
        limiter.try_acquire()
    policy = RetryPolicy(breaker=breaker, limiter=limiter, clock=clock, seed=1)
    start = clock.now()
    assert _run(shell, policy, lambda: "ok") == "ok"
    assert clock.now() == start  # no wait
    assert breaker.state == "closed"
