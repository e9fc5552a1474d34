"""The Redis store's scripts when Redis stalls past the socket timeout: a script runs, its
reply comes too late, and the client gives up on it. Each script must count once: the
store's clients never send a script again (redis-py sends a timed-out command again on its
own, ten times by default, and a breaker's failure, a probe's slot, a retry budget's spend
or a limiter's slot then counted once per copy), and the ledger's scripts answer a copy as
they answered the first."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from test_tokens_hostile import Proxy, hold_replies
from tether.stores import RedisStore
from tether.stores._ledger_logic import Completion, Record, Settlement, State
from tether.stores._logic import BreakerConfig, LimiterConfig
from tether.stores.redis._ledger import CLAIM, UPDATE, RedisLedgerBackend
from tether.stores.redis._scripts import SCRIPTS

CFG = BreakerConfig(failure_threshold=4, cooldown=30.0, half_open_max_calls=2, window=0,
                    min_calls=0, failure_rate=1.0)  # fmt: skip


@pytest.fixture
def stalling(redis_url: str) -> Iterator[tuple[Proxy, RedisStore, RedisStore]]:
    """A store that reaches Redis through a proxy whose replies can be held, and one that
    reads the same keys directly."""
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy, prefix = Proxy(port), f"tether-test-{uuid.uuid4().hex[:8]}"
    store = RedisStore(f"redis://127.0.0.1:{proxy.port}/0", prefix=prefix, server_time=False,
                       socket_timeout=0.2, reconnect_interval=0.05)  # fmt: skip
    direct = RedisStore(redis_url, prefix=prefix, server_time=False)
    for source in SCRIPTS.values():  # known to the server: no NOSCRIPT reply to wait for
        direct.client.script_load(source)
    yield proxy, store, direct
    store.close()
    direct.reset()
    direct.close()


def stalled(proxy: Proxy, store: RedisStore, drive: str, call: Callable[[], Any]) -> None:
    """``call`` (a store method: sync, or a coroutine function under ``drive="async"``) while
    Redis holds its replies past the store's socket timeout, then wait until Redis answers."""
    if drive == "sync":
        store.client.ping()  # connected before the stall
        hold_replies(proxy, 0.5)
        call()
    else:

        async def main() -> None:
            await store.abudget_spend("warm", 10.0, 0.0)  # the loop's client connects first
            hold_replies(proxy, 0.5)
            await call()
            await store.aclose()

        asyncio.run(main())
    assert store.degraded  # the call timed out: the store fell back
    proxy.replies.wait()
    time.sleep(0.3)  # the held replies are through; anything sent again has run


@pytest.mark.parametrize("drive", ["sync", "async"])
def test_a_retry_budget_spend_whose_reply_timed_out_counts_once(
    stalling: tuple[Proxy, RedisStore, RedisStore], drive: str
) -> None:
    proxy, store, direct = stalling
    direct.budget_spend("pay", 100.0, 10.0)
    spend = (lambda: store.abudget_spend("pay", 100.0, 10.0)) if drive == "async" else (
        lambda: store.budget_spend("pay", 100.0, 10.0))  # fmt: skip
    stalled(proxy, store, drive, spend)
    assert direct.budget_tokens("pay", 100.0) == pytest.approx(80.0)  # was 70, 60, ...


@pytest.mark.parametrize("drive", ["sync", "async"])
def test_a_breaker_failure_whose_reply_timed_out_counts_once(
    stalling: tuple[Proxy, RedisStore, RedisStore], drive: str
) -> None:
    proxy, store, direct = stalling
    for _ in range(2):
        direct.breaker_record("dep", 0.0, "call", True, CFG)
    record = (lambda: store.abreaker_record("dep", 0.0, "call", True, CFG)) if (
        drive == "async") else (lambda: store.breaker_record("dep", 0.0, "call", True, CFG))  # fmt: skip
    stalled(proxy, store, drive, record)
    # three failures of a threshold of four: still closed (a copy tripped it)
    assert direct.breaker_record("dep", 0.0, "call", False, CFG)[1] == "closed"
    assert direct.client.hget(direct._key("breaker", "dep"), "failures") == b"0"


@pytest.mark.parametrize("drive", ["sync", "async"])
def test_a_probe_slot_whose_reply_timed_out_is_taken_once(
    stalling: tuple[Proxy, RedisStore, RedisStore], drive: str
) -> None:
    proxy, store, direct = stalling
    direct.breaker_force("dep", "open", 1.0)
    direct.client.hset(direct._key("breaker", "dep"), "retry_at", "0")  # the probe is due
    acquire = (lambda: store.abreaker_acquire("dep", 100.0, CFG)) if drive == "async" else (
        lambda: store.breaker_acquire("dep", 100.0, CFG))  # fmt: skip
    stalled(proxy, store, drive, acquire)
    # one probe slot taken in Redis, the lost answer's (a copy took a second one)
    assert direct.client.hget(direct._key("breaker", "dep"), "inflight") == b"1"


@pytest.mark.parametrize("drive", ["sync", "async"])
def test_a_limiter_slot_whose_reply_timed_out_is_taken_once(
    stalling: tuple[Proxy, RedisStore, RedisStore], drive: str
) -> None:
    proxy, store, direct = stalling
    cfg = LimiterConfig(initial_rate=1.0, min_rate=1.0, max_rate=1.0, burst=1.0, horizon=5.0,
                        beta=0.5, increase=0.1, decrease_interval=1.0)  # fmt: skip
    acquire = (lambda: store.alimiter_acquire("llm", 100.0, cfg)) if drive == "async" else (
        lambda: store.limiter_acquire("llm", 100.0, cfg))  # fmt: skip
    stalled(proxy, store, drive, acquire)
    # the lost answer's slot is at 100; the next is at 101 (a copy took it: 102)
    wait, admitted = direct.limiter_acquire("llm", 100.0, cfg)
    assert (admitted, wait) == (True, pytest.approx(1.0))


def test_a_ledger_completion_sent_again_is_recorded_not_final(redis_url: str) -> None:
    """The ledger's client sends a timed-out script again (its claims fail closed and are
    owner-fenced, so it keeps redis-py's retries): a copy of a completion that ran answers
    as the first did, "recorded", not "final" (the recorder then logged that someone else
    had settled the effect while it ran)."""
    import redis

    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy, prefix = Proxy(port), f"tether-test-{uuid.uuid4().hex[:8]}"
    client = redis.Redis(port=proxy.port, socket_timeout=0.2, socket_connect_timeout=0.2)
    ledger = RedisLedgerBackend(client=client, prefix=prefix, assume_durable=True)
    for source in (CLAIM, UPDATE):
        client.script_load(source)
    try:
        rec = Record(key="k", state=State.PENDING, payload_hash=None, owner="me",
                     lease_until=60.0, expires_at=3600.0, created_at=0.0)  # fmt: skip
        assert ledger.claim(rec, 0.0)[0]
        done = Settlement("k", "me", State.DONE, 1.0, 60.0, "42")
        hold_replies(proxy, 0.5)
        assert ledger.complete(done) is Completion.RECORDED  # a copy's answer, after the stall
        assert proxy.replies.is_set()  # (the stall was past the timeout: a copy was sent)
        other = Settlement("k", "me", State.FAILED, 1.0, 60.0, None, "boom")
        assert ledger.complete(other) is Completion.FINAL
        stranger = Settlement("k", "you", State.DONE, 1.0, 60.0, "42")
        assert ledger.complete(stranger) is Completion.LOST
        assert ledger.get("k").result == "42"  # type: ignore[union-attr]
    finally:
        ledger.forget("k")
        ledger.close()


def test_the_stores_cluster_client_sends_a_script_once(redis_cluster: Any) -> None:
    """The client a store makes from a ``redis+cluster://`` URL sent a timed-out script again
    on its own, ten times (redis-py's cluster retries); now it sends it once."""
    store = RedisStore(f"redis+cluster://127.0.0.1:{redis_cluster.ports[0]}",
                       prefix=f"tether-test-{uuid.uuid4().hex[:8]}")  # fmt: skip
    try:
        assert store.client.retry.get_retries() == 0

        async def main() -> None:
            await store.abudget_spend("pay", 10.0, 1.0)
            assert store._conn._aclient_made.retry.get_retries() == 0
            await store.aclose()

        asyncio.run(main())
    finally:
        store.reset()
        store.close()


@pytest.mark.parametrize("retries", [None, 0])
def test_a_given_client_that_sends_a_script_again_is_named_in_a_warning(
    redis_url: str, retries: int | None, caplog: pytest.LogCaptureFixture
) -> None:
    """A client made with ``redis.Redis(host=...)`` retries a timed-out command ten times:
    given to a store, a retry budget's spend counts once per copy that ran. The store says
    so when it is given one (it cannot change your client), and not for a client that sends
    once."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy, prefix = Proxy(port), f"tether-test-{uuid.uuid4().hex[:8]}"
    settings: dict[str, Any] = {} if retries is None else {"retry": Retry(NoBackoff(), retries)}
    client = redis.Redis(port=proxy.port, socket_timeout=0.2, **settings)
    with caplog.at_level("WARNING", logger="tether"):
        store = RedisStore(client=client, prefix=prefix, server_time=False, reconnect_interval=0.05)
    direct = RedisStore(redis_url, prefix=prefix, server_time=False)
    try:
        warned = [r for r in caplog.records if "sends a timed-out command again" in r.message]
        direct.client.script_load(SCRIPTS["budget_spend"])
        client.ping()
        hold_replies(proxy, 0.5)
        store.budget_spend("pay", 100.0, 10.0)
        proxy.replies.wait()
        time.sleep(0.3)
        left = direct.budget_tokens("pay", 100.0)
        if retries is None:  # the copies ran: the warning names the client's retries
            assert left < 90.0
            assert len(warned) == 1 and "10 retries" in warned[0].message
        else:
            assert left == pytest.approx(90.0)
            assert not warned
    finally:
        store.close()
        direct.reset()
        direct.close()
