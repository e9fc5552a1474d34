"""RetryPolicy and @retry: waits, attempts, deadlines, one retry layer."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

import tether
from tether import DeadlineExceeded, Kind, RetryEvent, RetryPolicy, Verdict, VirtualClock
from tether.testing import capture_logs


class Flaky:
    """Fails with the given errors in turn, then returns "ok"."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


class HTTPError(Exception):
    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"HTTP {status}")
        self.status_code = status
        self.headers = headers or {}


def waits_of(policy_kwargs: dict[str, Any], errors: list[BaseException]) -> list[float]:
    clock = VirtualClock()
    events: list[RetryEvent] = []
    policy = RetryPolicy(clock=clock, on_retry=events.append, **policy_kwargs)
    fn = Flaky(*errors)
    try:
        policy.call(fn)
    except Exception:
        pass
    return [e.delay for e in events]


def test_no_jitter_schedule() -> None:
    """jitter="none" waits base, 2*base, 4*base ... capped at cap."""
    errors = [ConnectionResetError() for _ in range(6)]
    assert waits_of({"max_attempts": 6, "base": 1.0, "cap": 5.0, "jitter": "none"}, errors) == [
        1.0,
        2.0,
        4.0,
        5.0,
        5.0,
    ]


def test_no_sleep_after_last_attempt() -> None:
    """Exhaustion sleeps max_attempts - 1 times, never after the last attempt."""
    clock = VirtualClock()
    fn = Flaky(*[ConnectionResetError() for _ in range(3)])
    with pytest.raises(ConnectionResetError):
        RetryPolicy(max_attempts=3, jitter="none", base=1.0, clock=clock).call(fn)
    assert (fn.calls, clock.sleeps, clock.now()) == (3, 2, 3.0)


def test_exhaustion_reraises_the_last_error_itself() -> None:
    """After the last attempt the caller gets the last error object, not a wrapper."""
    last = ConnectionResetError("third")
    fn = Flaky(ConnectionResetError("first"), TimeoutError("second"), last)
    with pytest.raises(ConnectionResetError) as info:
        RetryPolicy(max_attempts=3, clock=VirtualClock()).call(fn)
    assert last is info.value


@pytest.mark.parametrize(
    "error",
    [ValueError("bad"), HTTPError(400), HTTPError(404), HTTPError(401),
     HTTPError(429, {}).__class__(402)],
)  # fmt: skip
def test_permanent_is_raised_after_one_call(error: BaseException) -> None:
    """A permanent failure is raised at once, after exactly one call."""
    clock = VirtualClock()
    fn = Flaky(error, error, error)
    with pytest.raises(type(error)):
        RetryPolicy(clock=clock).call(fn)
    assert (fn.calls, clock.now()) == (1, 0.0)


def test_quota_is_raised_after_one_call() -> None:
    """A spend-limit 429 is not retried."""

    class QuotaError(Exception):
        status_code = 429
        body = {"error": {"code": "insufficient_quota"}}

    fn = Flaky(QuotaError(), QuotaError())
    with pytest.raises(QuotaError):
        RetryPolicy(clock=VirtualClock()).call(fn)
    assert fn.calls == 1


def test_success_after_failures_and_statistics() -> None:
    """Statistics of the last call: attempts, total wait, last verdict."""
    clock = VirtualClock()
    policy = RetryPolicy(jitter="none", base=0.5, clock=clock)
    assert policy.call(Flaky(TimeoutError(), TimeoutError())) == "ok"
    stats = policy.statistics
    assert (stats.attempts, stats.total_wait, stats.retries) == (3, 1.5, 2)
    assert stats.last_verdict is not None and stats.last_verdict.kind is Kind.TRANSIENT


def test_retry_after_is_a_floor_capped_by_retry_after_cap() -> None:
    """A Retry-After longer than the backoff is waited; a huge one is capped."""
    assert waits_of(
        {"max_attempts": 2, "jitter": "none"}, [HTTPError(429, {"retry-after": "7"})]
    ) == [7.0]
    assert waits_of(
        {"max_attempts": 2, "jitter": "none"}, [HTTPError(503, {"retry-after": "3600"})]
    ) == [60.0]
    assert waits_of(
        {"max_attempts": 2, "jitter": "none", "retry_after_cap": 10.0},
        [HTTPError(429, {"retry-after": "3600"})],
    ) == [10.0]


def test_two_tier_schedule() -> None:
    """Rate limits and server errors progress on their own schedules."""
    errors: list[BaseException] = [HTTPError(503), HTTPError(503), HTTPError(429), HTTPError(503)]
    waits = waits_of(
        {"max_attempts": 5, "jitter": "none", "base": 10.0, "cap": 20.0,
         "rate_limit_base": 1.0, "rate_limit_cap": 4.0},
        errors,
    )  # fmt: skip
    assert waits == [10.0, 20.0, 1.0, 20.0]


def test_deadline_is_never_overslept() -> None:
    """If the next wait would cross the deadline, DeadlineExceeded is raised at once."""
    clock = VirtualClock()
    fn = Flaky(*[ConnectionResetError() for _ in range(10)])
    policy = RetryPolicy(max_attempts=10, jitter="none", base=1.0, deadline=5.0, clock=clock)
    with pytest.raises(DeadlineExceeded) as info:
        policy.call(fn)
    assert isinstance(info.value, TimeoutError)
    assert isinstance(info.value.__cause__, ConnectionResetError)
    # waits 1 + 2 = 3; the next (4) would end at 7 > 5: stop at t=3 without sleeping
    assert (fn.calls, clock.now()) == (3, 3.0)


def test_deadline_bounds_the_attempt_in_progress_async() -> None:
    """Async: the attempt's timeout is the smaller of attempt_timeout and the time left."""
    clock = VirtualClock()
    calls = 0

    async def slow() -> str:
        nonlocal calls
        calls += 1
        await clock.asleep(100.0)
        return "late"

    policy = RetryPolicy(max_attempts=3, deadline=10.0, attempt_timeout=4.0, jitter="none",
                         base=1.0, clock=clock)  # fmt: skip
    with pytest.raises(DeadlineExceeded):
        asyncio.run(policy.acall(slow))
    # attempt 1 times out at 4, wait 1, attempt 2 times out at 9, wait 2 would cross 10
    assert (calls, clock.now()) == (2, 9.0)


def test_async_attempt_timeout_on_real_time() -> None:
    """A hanging async attempt is cancelled after attempt_timeout (real clock)."""
    calls = 0

    async def hang() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.sleep(10)
        return "ok"

    started = time.monotonic()
    policy = RetryPolicy(max_attempts=2, attempt_timeout=0.05, base=0.0, cap=0.0)
    assert asyncio.run(policy.acall(hang)) == "ok"
    assert time.monotonic() - started < 2.0


def test_sync_attempt_timeout_on_real_time() -> None:
    """A hanging sync attempt is abandoned after attempt_timeout and counted as hung."""
    release = threading.Event()
    calls = 0

    def hang() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            release.wait(5)
        return "ok"

    policy = RetryPolicy(max_attempts=2, attempt_timeout=0.05, base=0.0, cap=0.0)
    started = time.monotonic()
    assert policy.call(hang) == "ok"
    assert time.monotonic() - started < 2.0
    assert tether.clock.hung_threads() >= 1
    release.set()


def test_virtual_attempt_timeout_sync() -> None:
    """On a VirtualClock a sync attempt that sleeps past its timeout times out."""
    clock = VirtualClock()
    calls = 0

    def slow() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            clock.sleep(30.0)
        return "ok"

    policy = RetryPolicy(max_attempts=2, attempt_timeout=15.0, jitter="none", base=1.0, clock=clock)
    assert policy.call(slow) == "ok"
    assert clock.now() == 16.0


def test_retry_at_one_layer_only() -> None:
    """A policy inside another makes one attempt: attempts do not multiply."""
    clock = VirtualClock()
    fn = Flaky(*[HTTPError(529) for _ in range(20)])
    inner = RetryPolicy(max_attempts=3, clock=clock)
    outer = RetryPolicy(max_attempts=3, clock=clock)
    with pytest.raises(HTTPError):
        outer.call(lambda: inner.call(fn))
    assert fn.calls == 3


def test_retry_at_one_layer_only_async() -> None:
    """The same across await."""
    clock = VirtualClock()
    fn = Flaky(*[HTTPError(529) for _ in range(20)])
    inner = RetryPolicy(max_attempts=3, clock=clock)
    outer = RetryPolicy(max_attempts=4, clock=clock)

    async def inner_call() -> str:
        async def once() -> str:
            return fn()

        return await inner.acall(once)

    with pytest.raises(HTTPError):
        asyncio.run(outer.acall(inner_call))
    assert fn.calls == 4


def test_separate_threads_do_not_share_the_layer() -> None:
    """Two threads each get their own attempts."""
    clock = VirtualClock()
    policy = RetryPolicy(max_attempts=2, clock=clock)
    results = []

    def work() -> None:
        results.append(policy.call(Flaky(TimeoutError())))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["ok"] * 4


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(1)])
def test_cancellation_propagates_at_once(error: BaseException) -> None:
    """KeyboardInterrupt and SystemExit are never retried."""
    fn = Flaky(error)
    with pytest.raises(type(error)):
        RetryPolicy(clock=VirtualClock()).call(fn)
    assert fn.calls == 1


def test_async_cancellation_propagates() -> None:
    """asyncio.CancelledError inside an attempt is not retried."""
    calls = 0

    async def cancelled() -> None:
        nonlocal calls
        calls += 1
        raise asyncio.CancelledError

    async def main() -> None:
        await RetryPolicy(clock=VirtualClock()).acall(cancelled)

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())
    assert calls == 1


def test_on_retry_hook_gets_a_frozen_event() -> None:
    """The hook sees attempt, verdict and delay; the event cannot be changed."""
    events: list[RetryEvent] = []
    RetryPolicy(jitter="none", clock=VirtualClock(), on_retry=events.append, name="search").call(
        Flaky(TimeoutError())
    )
    (event,) = events
    assert (event.name, event.attempt, event.delay, event.verdict.kind) == (
        "search",
        1,
        0.5,
        Kind.TRANSIENT,
    )
    with pytest.raises(AttributeError):
        event.delay = 3.0  # type: ignore[misc]


def test_a_failing_hook_never_breaks_the_call() -> None:
    """A hook that raises is logged and ignored."""

    def bad(event: RetryEvent) -> None:
        raise RuntimeError("hook bug")

    assert RetryPolicy(clock=VirtualClock(), on_retry=bad).call(Flaky(TimeoutError())) == "ok"


def test_logging_one_info_line_per_retry_and_silence_on_success() -> None:
    """One INFO line per retry with attempt, verdict and delay; nothing on success."""
    with capture_logs() as records:
        RetryPolicy(jitter="none", clock=VirtualClock()).call(Flaky(TimeoutError(), TimeoutError()))
    retries = [r for r in records if r.levelno == logging.INFO]
    assert len(retries) == 2
    assert "attempt 1" in retries[0].getMessage() and "transient" in retries[0].getMessage()
    with capture_logs() as records:
        RetryPolicy(clock=VirtualClock()).call(Flaky())
    assert records == []


def test_decorators() -> None:
    """@retry with and without settings, sync and async."""
    clock = VirtualClock()
    fn = Flaky(TimeoutError())

    @tether.retry(max_attempts=2, clock=clock)
    def sync_call() -> str:
        return fn()

    @tether.retry
    def plain() -> str:
        return "plain"

    afn = Flaky(TimeoutError())

    @tether.retry(max_attempts=2, clock=clock)
    async def async_call() -> str:
        return afn()

    assert (sync_call(), plain(), asyncio.run(async_call())) == ("ok", "plain", "ok")
    assert isinstance(sync_call.retry_policy, RetryPolicy)  # type: ignore[attr-defined]


def test_seed_makes_waits_reproducible() -> None:
    """The same seed gives the same jittered waits."""
    errors = [TimeoutError() for _ in range(4)]
    a = waits_of({"seed": 42, "max_attempts": 5}, list(errors))
    b = waits_of({"seed": 42, "max_attempts": 5}, list(errors))
    assert a == b and len(a) == 4


@pytest.mark.parametrize("jitter", ["full", "equal", "decorrelated"])
def test_jitters_stay_within_cap(jitter: str) -> None:
    """Every jitter's waits stay within [0, cap]."""
    waits = waits_of({"max_attempts": 12, "jitter": jitter, "seed": 1, "cap": 3.0},
                     [TimeoutError() for _ in range(12)])  # fmt: skip
    assert len(waits) == 11 and all(0 <= w <= 3.0 for w in waits)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be >= 1, got 0"),
        ({"base": -1.0}, "base must be >= 0, got -1.0"),
        ({"base": 5.0, "cap": 1.0}, "cap must be >= base"),
        ({"jitter": "random"}, "jitter must be one of"),
        ({"deadline": 0}, "deadline must be > 0"),
        ({"attempt_timeout": -1}, "attempt_timeout must be > 0"),
        ({"retry_after_cap": -1}, "retry_after_cap must be >= 0"),
        (
            {"rate_limit_base": 5.0, "rate_limit_cap": 1.0},
            "rate_limit_cap must be >= rate_limit_base",
        ),
    ],
)
def test_invalid_configuration_names_the_field(kwargs: dict[str, Any], message: str) -> None:
    """Bad settings fail at construction, naming the field and the value."""
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        RetryPolicy(**kwargs)


def test_max_attempts_must_be_an_int() -> None:
    """A float max_attempts is a type error."""
    with pytest.raises(TypeError, match="max_attempts must be an int"):
        RetryPolicy(max_attempts=2.5)  # type: ignore[arg-type]


def test_replace() -> None:
    """replace() copies with changes, validated again."""
    policy = RetryPolicy(max_attempts=3).replace(deadline=10.0)
    assert (policy.max_attempts, policy.deadline) == (3, 10.0)
    with pytest.raises(TypeError, match="unknown RetryPolicy setting"):
        RetryPolicy().replace(attempts=3)


def test_custom_classifier() -> None:
    """A policy-level classifier replaces the global one."""
    fn = Flaky(ValueError("treat as transient"))
    policy = RetryPolicy(clock=VirtualClock(), classifier=lambda e: Verdict(Kind.TRANSIENT, "mine"))
    assert policy.call(fn) == "ok"
