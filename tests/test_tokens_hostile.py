"""The fleet's token budget under hostile and unlucky conditions: hosts whose clocks are
wrong, replies that say what cannot be true, settlements repeated or invented."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tether import AdaptiveLimiter, LimiterTimeout, TokenBudget
from tether.clock import SystemClock
from tether.stores import RedisStore


class SkewedClock(SystemClock):
    """The real clock, its wall time ``skew`` seconds off (a host whose NTP is broken)."""

    def __init__(self, skew: float) -> None:
        self.skew = skew

    def wall(self) -> float:
        return super().wall() + self.skew


@pytest.fixture
def redis_store(redis_url: str) -> Iterator[RedisStore]:
    s = RedisStore(redis_url, prefix=f"tether-test-{uuid.uuid4().hex[:8]}")
    yield s
    assert not s.degraded, "the Redis store fell back to memory: a script failed"
    s.reset()
    s.close()


def openai_budget(store: Any, clock: Any) -> TokenBudget:
    return TokenBudget(
        "openai",
        "gpt-4o",
        store=store,
        clock=clock,
        requests_per_minute=10_000,
        tokens_per_minute=6_000,
    )


def take_all(b: TokenBudget, each: int) -> int:
    """Reserve ``each`` tokens until the budget refuses a call that would wait; the total."""
    taken = 0
    for _ in range(100):
        try:
            b.reserve(estimated_input_tokens=0, max_output_tokens=each, max_wait=0.0)
        except LimiterTimeout:
            return taken
        taken += each
    return taken


# --- case 3: one clock for the fleet, the store's ----------------------------------------


def test_a_host_whose_clock_is_ahead_takes_no_more_than_the_limit(
    redis_store: RedisStore,
) -> None:
    """A host 60 s ahead finds the bucket a correct host emptied still empty (the store's
    clock, Redis TIME, not the host's), and the correct hosts are not refused afterwards."""
    correct, ahead = SystemClock(), SkewedClock(60.0)
    mine, theirs = openai_budget(redis_store, correct), openai_budget(redis_store, ahead)
    first = mine.reserve(estimated_input_tokens=0, max_output_tokens=0)
    mine.settle(first, input_tokens=0, output_tokens=0, status=200)
    taken = take_all(mine, 500)
    assert taken >= 5_500
    taken += take_all(theirs, 500)
    # the refill of the few seconds this takes is at most one more call's 500
    assert taken <= 6_500
    # another correct host waits for the refill of its own need (100 tokens/s), not a minute
    assert mine.view()["line"] < 1.0
    other = openai_budget(redis_store, SystemClock())
    r = other.reserve(estimated_input_tokens=0, max_output_tokens=50, max_wait=3.0)
    assert r.waited <= 3.0


def test_a_pause_from_a_host_whose_clock_is_ahead_lasts_its_retry_after(
    redis_store: RedisStore,
) -> None:
    """A 429's Retry-After: 1 settled by a host 60 s ahead pauses the fleet for 1 s, not 61."""
    correct, ahead = SystemClock(), SkewedClock(60.0)
    mine, theirs = openai_budget(redis_store, correct), openai_budget(redis_store, ahead)
    first = mine.reserve(estimated_input_tokens=0, max_output_tokens=0)
    mine.settle(first, input_tokens=0, output_tokens=0, status=200)
    r = theirs.reserve(estimated_input_tokens=10, max_output_tokens=10)
    theirs.settle(r, headers={"retry-after": "1"}, status=429)
    assert 0.0 < mine.view()["paused_for"] <= 1.0
    after = mine.reserve(estimated_input_tokens=10, max_output_tokens=10, max_wait=3.0)
    assert 0.0 < after.waited <= 1.5


def test_a_limiter_host_whose_clock_is_ahead_does_not_hold_the_fleet_back(
    redis_store: RedisStore,
) -> None:
    """The adaptive limiter's line is on the store's clock too: slots a host 60 s ahead
    takes are slots now, and a correct host after it is admitted at once."""
    ahead = AdaptiveLimiter("llm", store=redis_store, clock=SkewedClock(60.0), initial_rate=10)
    here = AdaptiveLimiter("llm", store=redis_store, clock=SystemClock(), initial_rate=10)
    assert ahead.try_acquire()[1]
    wait, admitted = here.try_acquire()
    assert admitted
    assert wait <= 0.2
