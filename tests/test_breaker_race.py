"""A half-open breaker under racing threads: exactly ``half_open_max_calls`` probes, in
this process's memory and in Redis."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tether import CircuitBreaker, CircuitOpenError
from tether.stores import MemoryStore, RedisStore

THREADS, TRIALS = 16, 100


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryStore()
        return
    prefix = f"tether-test-{uuid.uuid4().hex[:8]}"
    s = RedisStore(request.getfixturevalue("redis_url"), prefix=prefix, cache_ttl=0.0)
    yield s
    assert not s.degraded, "the Redis store fell back to memory: a script failed"
    s.reset()
    s.close()


def probes_until_closed(store: Any, half_open_max_calls: int) -> tuple[int, int]:
    """Trip a breaker, let its wait pass, and release THREADS threads at once on it, each
    asking again as soon as it is refused until the breaker closes. Returns (the most probes
    out at once, the probes in all)."""
    breaker = CircuitBreaker(
        f"race-{uuid.uuid4().hex[:8]}",
        failure_threshold=1,
        cooldown=10.0,  # a probe's lease: none of these outlives it
        probe_interval=0.02,
        half_open_max_calls=half_open_max_calls,
        store=store,
    )
    with pytest.raises(TimeoutError):
        breaker.call(lambda: (_ for _ in ()).throw(TimeoutError()))
    time.sleep(0.03)
    lock, closed, barrier = threading.Lock(), threading.Event(), threading.Barrier(THREADS)
    out, most, probes = 0, 0, 0

    def worker() -> None:
        nonlocal out, most, probes
        barrier.wait()
        while not closed.is_set():
            try:
                permit = breaker._acquire()
            except CircuitOpenError:
                time.sleep(0.0005)
                continue
            if permit != "probe":  # closed: the probes are done
                closed.set()
                breaker._record(permit, None)
                return
            with lock:
                out, probes = out + 1, probes + 1
                most = max(most, out)
            time.sleep(0.002)  # the dependency answers
            with lock:
                out -= 1
            breaker._record(permit, None)

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return most, probes


@pytest.mark.parametrize("half_open_max_calls", [1, 3])
def test_a_half_open_breaker_admits_exactly_its_probes_under_a_race(
    store: Any, half_open_max_calls: int
) -> None:
    """16 threads released together on a half-open breaker, 100 times: never more than
    half_open_max_calls probes out at once, and exactly that many in all before it closes."""
    seen = Counter(probes_until_closed(store, half_open_max_calls) for _ in range(TRIALS))
    assert all(most <= half_open_max_calls for most, _ in seen), seen
    assert {total for _, total in seen} == {half_open_max_calls}, seen
