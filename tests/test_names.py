"""One name, one breaker (budget, limiter), one configuration, in memory and in real Redis.

Objects with the same name and settings in one store share their state: that is how a
fleet on one RedisStore shares a breaker. An object made with a name the store holds with
other settings is refused, naming both; an unnamed budget shares with nobody.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import tether
from tether import (
    AdaptiveLimiter,
    CircuitBreaker,
    CircuitOpenError,
    Guard,
    RetryBudget,
    RetryPolicy,
    VirtualClock,
)
from tether.stores import MemoryStore, RedisStore


@pytest.fixture(params=["memory", "redis"])
def stores(request: pytest.FixtureRequest) -> Iterator[Callable[[], Any]]:
    """Stores of one place: the same MemoryStore, or a RedisStore per "process" on one
    Redis prefix (each call makes another client, as another process would)."""
    if request.param == "memory":
        shared = MemoryStore()
        yield lambda: shared
        return
    url, prefix = request.getfixturevalue("redis_url"), f"tether-test-{uuid.uuid4().hex[:8]}"
    made: list[RedisStore] = []

    def make() -> RedisStore:
        made.append(RedisStore(url, prefix=prefix, cache_ttl=0.0, server_time=False))
        return made[-1]

    yield make
    made[0].reset()
    for store in made:
        store.close()


class Down(ConnectionError):
    """A retryable failure."""


def down() -> None:
    raise Down()


async def adown() -> None:
    raise Down()


def attempts(policy: RetryPolicy, shell: str) -> int:
    """How many attempts a policy makes against a dependency that is down."""
    calls = [0]

    def fn() -> None:
        calls[0] += 1
        down()

    async def afn() -> None:
        calls[0] += 1
        await adown()

    async def main() -> None:
        try:
            await policy.acall(afn)
        finally:  # the asyncio clients of this event loop
            for part in (policy.budget, policy.breaker):
                store = getattr(part, "store", None)
                if isinstance(store, RedisStore):
                    await store.aclose()

    with pytest.raises(Down):
        if shell == "sync":
            policy.call(fn)
        else:
            asyncio.run(main())
    return calls[0]


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_two_unnamed_budgets_do_not_share_a_pot(stores: Any, shell: str) -> None:
    """RetryBudget(capacity=10) twice: each pays its own retries."""
    first, second = (
        RetryBudget(capacity=10, store=stores()),
        RetryBudget(capacity=10, store=stores()),
    )
    assert first.name != second.name
    clock = VirtualClock()
    assert attempts(RetryPolicy(max_attempts=10, budget=first, clock=clock), shell) == 3
    assert second.tokens == 10.0  # untouched by the first one's retries
    assert attempts(RetryPolicy(max_attempts=10, budget=second, clock=clock), shell) == 3
    assert first.name.startswith("unnamed-") and "unnamed-" in repr(first)


def test_a_budget_named_like_another_with_other_settings_is_refused(stores: Any) -> None:
    """RetryBudget("payments", capacity=10) after a spent RetryBudget("payments"): refused,
    naming both configurations (it read 410 tokens and allowed 10 attempts instead of 3)."""
    old = RetryBudget("payments", store=stores())
    for _ in range(18):
        assert old.try_spend()
    assert old.tokens == 410.0
    with pytest.raises(ValueError) as error:
        RetryBudget("payments", capacity=10, store=stores())
    said = str(error.value)
    assert "a retry budget named 'payments' already exists" in said
    assert "capacity=500.0, retry_cost=5.0, timeout_cost=10.0, refund=1.0" in said
    assert "this one asks capacity=10.0, retry_cost=5.0" in said
    assert "store.reset('payments')" in said


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_budget_with_the_same_name_and_settings_is_shared(stores: Any, shell: str) -> None:
    """The fleet feature: every process with the same store and name pays from one pot."""
    here = RetryBudget("shared", capacity=10, store=stores())
    there = RetryBudget("shared", capacity=10, store=stores())
    clock = VirtualClock()
    assert attempts(RetryPolicy(max_attempts=10, budget=here, clock=clock), shell) == 3
    assert there.tokens == 0.0
    assert attempts(RetryPolicy(max_attempts=10, budget=there, clock=clock), shell) == 1


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_breakers_with_one_name_and_other_thresholds_are_refused(stores: Any, shell: str) -> None:
    """CircuitBreaker("payments", failure_threshold=3) after one with 5: refused; one with
    the same settings shares the state (one trips it, the other is open)."""
    clock = VirtualClock()
    first = CircuitBreaker("payments", failure_threshold=3, store=stores(), clock=clock)
    with pytest.raises(ValueError, match=r"a circuit breaker named 'payments' already exists") as e:
        CircuitBreaker("payments", failure_threshold=5, store=stores(), clock=clock)
    assert "failure_threshold=3, cooldown=30.0" in str(e.value)
    assert "this one asks failure_threshold=5, cooldown=30.0" in str(e.value)
    twin = CircuitBreaker("payments", failure_threshold=3, store=stores(), clock=clock)
    attempts(RetryPolicy(max_attempts=3, base=0.01, breaker=first, clock=clock), shell)
    assert twin.state == "open"
    with pytest.raises(CircuitOpenError):
        twin.call(lambda: "ok")


def test_limiters_with_one_name_and_other_settings_are_refused(stores: Any) -> None:
    """AdaptiveLimiter: the same rule; the same settings share one rate."""
    clock = VirtualClock()
    AdaptiveLimiter("search-api", store=stores(), clock=clock, initial_rate=10.0)
    with pytest.raises(ValueError, match="a limiter named 'search-api' already exists") as e:
        AdaptiveLimiter("search-api", store=stores(), clock=clock, initial_rate=50.0)
    assert "initial_rate=10.0" in str(e.value) and "initial_rate=50.0" in str(e.value)
    AdaptiveLimiter("search-api", store=stores(), clock=clock, initial_rate=10.0)


def test_reset_lets_a_name_take_other_settings(stores: Any) -> None:
    """store.reset(name) forgets the old state and its settings; an object's own reset()
    keeps its name bound to its settings."""
    store = stores()
    old = RetryBudget("payments", capacity=500, store=store)
    old.try_spend()
    old.reset()
    assert old.tokens == 500.0
    with pytest.raises(ValueError):
        RetryBudget("payments", capacity=10, store=stores())
    store.reset("payments")
    new = RetryBudget("payments", capacity=10, store=stores())
    assert new.tokens == 10.0


def test_the_same_name_in_other_stores_is_another_object() -> None:
    """A name is one object per store: another MemoryStore holds another breaker."""
    CircuitBreaker("payments", failure_threshold=3, store=MemoryStore())
    CircuitBreaker("payments", failure_threshold=5, store=MemoryStore())


def test_the_registry_refuses_other_settings_for_a_name() -> None:
    """tether.breakers.get(name, ...) asked again with other settings says so."""
    first = tether.breakers.get("stripe", failure_threshold=2)
    assert tether.breakers.get("stripe") is first
    assert tether.breakers.get("stripe", failure_threshold=2) is first
    with pytest.raises(ValueError, match=r"breakers\['stripe'\] exists with failure_threshold=2"):
        tether.breakers.get("stripe", failure_threshold=3)


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_guards_with_other_breaker_settings_keep_breakers_of_their_own(shell: str) -> None:
    """Two guards in one process, one tool name: a guard's breakers follow its settings
    (one that trips after 1 failure does not open the other's); the same settings share."""
    clock = VirtualClock()
    strict = Guard(breaker_threshold=1, clock=clock, retry=RetryPolicy(max_attempts=1))
    usual, same = Guard(clock=clock), Guard(clock=clock)

    def search(q: str) -> str:
        raise Down()

    async def asearch(q: str) -> str:
        raise Down()

    def sync_run() -> None:
        with strict.start(task="search") as run:
            run.proceed()
            with pytest.raises(tether.ToolError):
                run.call_tool("search", search, {"q": "x"})

    async def async_run() -> None:
        async with strict.start(task="search") as run:
            run.proceed()
            with pytest.raises(tether.ToolError):
                await run.acall_tool("search", asearch, {"q": "x"})

    if shell == "sync":
        sync_run()
    else:
        asyncio.run(async_run())
    assert strict.breaker("search").state == "open"
    assert usual.breaker("search").state == "closed"
    assert same.breaker("search").name == usual.breaker("search").name == "tool:search"
    assert strict.breaker("search").name == "tool:search[failure_threshold=1, cooldown=30]"
