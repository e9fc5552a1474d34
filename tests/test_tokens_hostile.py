"""The fleet's token budget under hostile and unlucky conditions: hosts whose clocks are
wrong, replies that say what cannot be true, settlements repeated or invented."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tether import AdaptiveLimiter, LimiterTimeout, TokenBudget, VirtualClock
from tether._sansio import Call
from tether.clock import SystemClock
from tether.guards._tokens import Reservation, adrive_for, reserve_plan
from tether.stores import MemoryStore, RedisStore
from tether.stores.redis import _tokens as redis_tokens


class SkewedClock(SystemClock):
    """The real clock, its wall time ``skew`` seconds off (a host whose NTP is broken)."""

    def __init__(self, skew: float) -> None:
        self.skew = skew

    def wall(self) -> float:
        return super().wall() + self.skew


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A store on a VirtualClock's time: this process's memory, or Redis."""
    if request.param == "memory":
        yield MemoryStore()
        return
    prefix = f"tether-test-{uuid.uuid4().hex[:8]}"
    s = RedisStore(request.getfixturevalue("redis_url"), prefix=prefix, server_time=False)
    yield s
    assert not s.degraded, "the Redis store fell back to memory: a script failed"
    s.reset()
    s.close()


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


# --- case 4: what a reply says, as what can be true ---------------------------------------


def calibrated(store: Any, clock: Any) -> TokenBudget:
    b = openai_budget(store, clock)
    first = b.reserve(estimated_input_tokens=0, max_output_tokens=0)
    b.settle(first, input_tokens=0, output_tokens=0, status=200)
    return b


def test_a_usage_of_a_trillion_tokens_counts_as_the_requests_maximum(store: Any) -> None:
    """A usage report of 10^12 tokens counts as what the request could use (four times its
    prompt's estimate and 1,024, its max_tokens): the next call waits seconds, not 10^9 s."""
    clock = VirtualClock()
    b = calibrated(store, clock)
    r = b.reserve(estimated_input_tokens=100, max_output_tokens=100)
    b.settle(r, input_tokens=10**12, output_tokens=10**12, status=200)
    b.flush()
    # at most 4 x 100 + 1,024 in and 100 out were used: 6,000 - 1,524 left
    assert b.view()["levels"]["tokens"] == pytest.approx(6_000 - 1_524, abs=1.0)
    start = clock.now()
    b.reserve(estimated_input_tokens=100, max_output_tokens=100, max_wait=60.0)
    assert clock.now() - start < 1.0


def test_a_retry_after_of_a_day_pauses_the_fleet_for_the_policys_cap(store: Any) -> None:
    """Retry-After: 86400 on one 429 pauses every process for retry_after_cap (60 s), not
    a day."""
    clock = VirtualClock()
    mine, theirs = calibrated(store, clock), openai_budget(store, clock)
    r = mine.reserve(estimated_input_tokens=10, max_output_tokens=10)
    mine.settle(r, headers={"retry-after": "86400"}, status=429)
    assert 59.0 <= theirs.view()["paused_for"] <= 60.0
    start = clock.now()
    theirs.reserve(estimated_input_tokens=10, max_output_tokens=10, max_wait=120.0)
    assert clock.now() - start == pytest.approx(60.0, abs=0.5)


def test_a_reset_header_of_a_day_is_capped_as_well(store: Any) -> None:
    """No Retry-After, the exhausted bucket's reset a day away: the pause is the cap too."""
    clock = VirtualClock()
    mine = calibrated(store, clock)
    r = mine.reserve(estimated_input_tokens=10, max_output_tokens=10)
    headers = {"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "24h0m0s"}
    mine.settle(r, headers=headers, status=429)
    assert mine.view()["paused_for"] <= 60.0


def level_after_settling(store: Any, times: int) -> float:
    """The tokens left after three calls of 1,000, two of them settled ``times`` times
    (one through settle, one through asettle) with no usage."""
    b = calibrated(store, VirtualClock())
    held = [b.reserve(estimated_input_tokens=0, max_output_tokens=1_000) for _ in range(3)]
    for _ in range(times):
        b.settle(held[0], input_tokens=0, output_tokens=0, status=200)
        asyncio.run(b.asettle(held[1], input_tokens=0, output_tokens=0, status=200))
    b.flush()
    level = float(b.view()["levels"]["tokens"])
    b.reset()
    return level


def test_a_reservation_settled_ten_times_counts_once(store: Any) -> None:
    """Settling one reservation ten times refunds it once (sync and async alike)."""
    once = level_after_settling(store, 1)
    assert once == pytest.approx(6_000 - 1_000, abs=1.0)
    assert level_after_settling(store, 10) == once


@pytest.mark.parametrize("made", ["by hand", "by another budget"])
def test_a_settlement_for_a_reservation_never_made_is_refused(store: Any, made: str) -> None:
    """A Reservation this budget did not make is refused (ValueError), nothing refunded."""
    clock = VirtualClock()
    b = calibrated(store, clock)
    b.reserve(estimated_input_tokens=0, max_output_tokens=1_000)
    if made == "by hand":
        forged = Reservation(b.name, (1.0, 0.0, 5_000.0, 5_000.0), 0, 5_000, 0.0)
    else:
        other = TokenBudget("openai", "gpt-4o", store=MemoryStore(), clock=clock,
                            requests_per_minute=10_000, tokens_per_minute=6_000)  # fmt: skip
        forged = other.reserve(estimated_input_tokens=0, max_output_tokens=1_000)
    with pytest.raises(ValueError, match="never made"):
        b.settle(forged, input_tokens=0, output_tokens=0, status=200)
    with pytest.raises(ValueError, match="never made"):
        asyncio.run(b.asettle(forged, input_tokens=0, output_tokens=0, status=200))
    b.flush()
    assert b.view()["levels"]["tokens"] == pytest.approx(6_000 - 1_000, abs=1.0)


# --- case 5: while Redis is away, a process admits its share ------------------------------


class Proxy:
    """A TCP proxy in front of the real Redis that can be cut (Redis away for its clients)."""

    def __init__(self, port: int = 6379) -> None:
        self.target = ("127.0.0.1", port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.cut_off = False
        #: while set, Redis's replies are held (its commands still run): a stall past the
        #: clients' socket timeout, after which the script has run and its answer is lost
        self.replies = threading.Event()
        self.replies.set()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if self.cut_off:
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            self.conns += [client, upstream]
            for a, b, gate in ((client, upstream, None), (upstream, client, self.replies)):
                threading.Thread(target=self._pipe, args=(a, b, gate), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket, gate: threading.Event | None) -> None:
        try:
            while data := a.recv(65536):
                if gate is not None:
                    gate.wait()
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def resume(self) -> None:
        """Redis is back: the proxy listens again on its port."""
        self.server = socket.create_server(("127.0.0.1", self.port))
        self.cut_off = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        """Redis is away: open connections reset, new ones refused."""
        self.cut_off = True
        for s in self.conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self.server.close()


def take_all_settled(b: TokenBudget, each: int) -> int:
    """Reserve ``each`` output tokens (settled at once, all used) until a call would wait."""
    taken = 0
    for _ in range(100):
        try:
            r = b.reserve(estimated_input_tokens=0, max_output_tokens=each, max_wait=0.0)
        except LimiterTimeout:
            return taken
        b.settle(r, input_tokens=0, output_tokens=each, status=200)
        taken += each
    return taken


def test_processes_that_lost_redis_admit_their_share_not_a_bucket_each(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four processes share a 6,000 tokens/min budget through Redis; Redis goes away: each
    starts from empty buckets (no burst), and between them they admit about one limit a
    minute from their own memories (a quarter each), not a bucket each."""
    monkeypatch.setattr(redis_tokens, "MEMBER_EVERY", 0.0, raising=False)  # each call counts
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy, prefix, clock = Proxy(port), f"tether-test-{uuid.uuid4().hex[:8]}", VirtualClock()
    url = f"redis://127.0.0.1:{proxy.port}/0"
    stores = [RedisStore(url, prefix=prefix, server_time=False, socket_timeout=0.5,
                         reconnect_interval=0.05) for _ in range(4)]  # fmt: skip
    try:
        budgets = [openai_budget(s, clock) for s in stores]
        first = budgets[0].reserve(estimated_input_tokens=0, max_output_tokens=0)
        budgets[0].settle(first, input_tokens=0, output_tokens=0, status=200)
        for b in budgets * 2:  # each process takes calls through Redis: it hears of the others
            b.settle(b.reserve(estimated_input_tokens=0, max_output_tokens=10), status=200,
                     input_tokens=0, output_tokens=10)  # fmt: skip
        proxy.cut()
        clock.advance(60.0)  # a minute later: the shared bucket would be full again
        # the processes do not know the shared levels: they start empty, no burst ...
        assert [take_all_settled(b, 100) for b in budgets] == [0, 0, 0, 0]
        assert all(s.degraded for s in stores)
        clock.advance(65.0)  # ... and after the grace, a minute of refill gives each a quarter
        taken = [take_all_settled(b, 100) for b in budgets]
        assert sum(taken) <= 6_000 + 4 * 100
        assert all(1_400 <= t <= 1_600 for t in taken), taken
        # Redis is back: the shared buckets refilled meanwhile, but what the processes took
        # from their memories is charged to them with their next calls
        proxy.resume()
        time.sleep(0.1)  # past the stores' reconnect_interval
        clock.advance(60.0)  # the shared bucket full again, the processes' lines over
        after = [take_all_settled(b, 100) for b in budgets]
        assert not any(s.degraded for s in stores)
        # the shared level counts both: a minute's 6,000 less the memories' and Redis's calls
        level = budgets[0].view()["levels"]["tokens"]
        assert level == pytest.approx(6_000 - sum(taken) - sum(after), abs=200), (level, after)
    finally:
        for s in stores:
            s.close()
        RedisStore(redis_url, prefix=prefix).reset()


def hold_replies(proxy: Proxy, seconds: float) -> None:
    """Hold Redis's replies for ``seconds`` from now (in a thread: the caller goes on)."""
    proxy.replies.clear()
    threading.Timer(seconds, proxy.replies.set).start()


def stalling_stores(redis_url: str, n: int) -> tuple[Proxy, str, list[RedisStore]]:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy, prefix = Proxy(port), f"tether-test-{uuid.uuid4().hex[:8]}"
    url = f"redis://127.0.0.1:{proxy.port}/0"
    stores = [RedisStore(url, prefix=prefix, server_time=False, socket_timeout=0.2,
                         reconnect_interval=0.05) for _ in range(n)]  # fmt: skip
    return proxy, prefix, stores


@pytest.mark.parametrize("drive", ["sync", "async"])
def test_a_refund_whose_reply_was_lost_in_a_stall_counts_once(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, drive: str
) -> None:
    """Redis stalls past the socket timeout while a refund travels: the script runs, but
    its answer comes late, so the Redis client sends it again (its own retry) or the process
    falls back to its memory. When Redis answers again the refund is in the shared buckets
    once (it used to count once per copy of the script that ran, and again with the next
    call after a fallback)."""
    monkeypatch.setattr(redis_tokens, "MEMBER_EVERY", 0.0, raising=False)
    proxy, prefix, (store,) = stalling_stores(redis_url, 1)
    try:
        b = calibrated(store, VirtualClock())
        held = [b.reserve(estimated_input_tokens=0, max_output_tokens=1_000) for _ in range(5)]
        if drive == "sync":
            b.settle(held[0], input_tokens=0, output_tokens=0, status=200)
            hold_replies(proxy, 0.4)
            b.flush()  # the refund of 1,000 reaches Redis; its answer does not (in time)
            proxy.replies.wait()
            time.sleep(0.1)  # past the store's reconnect_interval
            b.reserve(estimated_input_tokens=0, max_output_tokens=0)  # it reaches Redis
        else:

            async def main() -> None:  # one event loop: its client connected before the stall
                await b.areserve(estimated_input_tokens=0, max_output_tokens=0)
                await b.asettle(held[0], input_tokens=0, output_tokens=0, status=200)
                hold_replies(proxy, 0.4)
                await adrive_for(b, b._outbox.flush())
                await asyncio.to_thread(proxy.replies.wait)
                await asyncio.sleep(0.1)
                await b.areserve(estimated_input_tokens=0, max_output_tokens=0)
                await store.aclose()

            asyncio.run(main())
        assert not store.degraded
        # 6,000 less five calls of 1,000 with one of them refunded: 2,000, not 3,000
        assert b.view()["levels"]["tokens"] == pytest.approx(2_000, abs=1.0)
    finally:
        store.close()
        RedisStore(redis_url, prefix=prefix).reset()


def test_a_process_that_lost_redis_keeps_the_line_the_fleet_was_promised(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared buckets promised the next 30 s to a caller of another process (it was
    admitted with a 30 s wait); Redis goes away: this process's memory admits nothing until
    that line has passed, then its share of the refill (it used to admit its share from the
    moment Redis went away: 1,000 tokens in the 20 s the line had already promised)."""
    monkeypatch.setattr(redis_tokens, "MEMBER_EVERY", 0.0, raising=False)
    proxy, prefix, stores = stalling_stores(redis_url, 2)
    clock = VirtualClock()
    try:
        mine, theirs = (TokenBudget("openai", "gpt-4o", store=s, clock=clock, horizon=60.0,
                                    requests_per_minute=10_000, tokens_per_minute=6_000)
                        for s in stores)  # fmt: skip
        first = mine.reserve(estimated_input_tokens=0, max_output_tokens=0)
        mine.settle(first, input_tokens=0, output_tokens=0, status=200)
        r = mine.reserve(estimated_input_tokens=0, max_output_tokens=100)
        theirs.settle(theirs.reserve(estimated_input_tokens=0, max_output_tokens=0),
                      input_tokens=0, output_tokens=0, status=200)  # fmt: skip
        theirs.flush()
        # theirs takes the bucket and the next 30 s of its refill: its call goes out in 30 s
        theirs.reserve(estimated_input_tokens=0, max_output_tokens=5_800, max_wait=0)
        plan = reserve_plan(theirs, 0, 3_100)  # its place in line taken, its wait not slept
        step = next(plan)
        while isinstance(step, Call):  # its round trips to the store, made here
            step = plan.send(step.fn(*step.args))
        assert step.seconds == pytest.approx(30.0, abs=0.5)
        assert theirs.view()["line"] == pytest.approx(30.0, abs=0.5)
        mine.settle(r, input_tokens=0, output_tokens=100, status=200)
        mine.flush()  # mine hears of the line with its settlement
        proxy.cut()
        assert take_all_settled(mine, 100) == 0  # Redis away: mine's memory starts empty ...
        assert stores[0].degraded
        clock.advance(20.0)  # ... at the line's end: 20 s later, still nothing
        assert take_all_settled(mine, 100) == 0
        clock.advance(30.0)  # 20 s past the line: mine's half of 20 s of refill
        assert 900 <= take_all_settled(mine, 100) <= 1_100
    finally:
        for s in stores:
            s.close()
        RedisStore(redis_url, prefix=prefix).reset()


def test_a_reservation_whose_answer_was_lost_gives_its_tokens_back(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reservation runs in Redis but its answer is lost (a stall past the timeout, the
    client not retrying): the caller went on without it. When Redis answers again the store
    gives its 1,000 tokens back (they used to stay taken: nobody was left to settle them)."""
    import redis

    monkeypatch.setattr(redis_tokens, "MEMBER_EVERY", 0.0, raising=False)
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy, prefix = Proxy(port), f"tether-test-{uuid.uuid4().hex[:8]}"
    client = redis.Redis(port=proxy.port, socket_timeout=0.2, socket_connect_timeout=0.2,
                         retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0))  # fmt: skip
    store = RedisStore(client=client, prefix=prefix, server_time=False, reconnect_interval=0.05)
    try:
        b = calibrated(store, VirtualClock())
        hold_replies(proxy, 0.4)
        with pytest.raises(LimiterTimeout):  # admitted in Redis, its answer lost; refused here
            b.reserve(estimated_input_tokens=0, max_output_tokens=1_000, max_wait=0.0)
        assert store.degraded
        proxy.replies.wait()
        time.sleep(0.1)
        b.reserve(estimated_input_tokens=0, max_output_tokens=0)  # it reaches Redis
        assert not store.degraded
        assert b.view()["levels"]["tokens"] == pytest.approx(6_000, abs=1.0)
    finally:
        store.close()
        RedisStore(redis_url, prefix=prefix).reset()


def test_a_process_on_a_short_blip_admits_nothing_from_its_memory(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One process of two loses Redis for 2 s: it admits nothing from its memory meanwhile,
    its callers wait (it used to admit its half of the refill there, on top of what the
    other process, still reaching Redis, admitted from the shared buckets: a burst the
    provider refuses); after AWAY_GRACE it admits its share of the refill from then on."""
    monkeypatch.setattr(redis_tokens, "MEMBER_EVERY", 0.0, raising=False)
    proxy, prefix, (mine_store,) = stalling_stores(redis_url, 1)
    theirs_store = RedisStore(redis_url, prefix=prefix, server_time=False)
    clock = VirtualClock()
    try:
        mine, theirs = calibrated(mine_store, clock), openai_budget(theirs_store, clock)
        theirs.settle(theirs.reserve(estimated_input_tokens=0, max_output_tokens=0),
                      input_tokens=0, output_tokens=0, status=200)  # fmt: skip
        take_all_settled(theirs, 1_000)  # the shared bucket is spent
        mine.flush()
        mine.reserve(estimated_input_tokens=0, max_output_tokens=0)  # mine hears of theirs
        proxy.cut()
        assert take_all_settled(mine, 50) == 0
        clock.advance(2.0)
        assert take_all_settled(mine, 50) == 0  # a blip: nothing from its memory
        clock.advance(redis_tokens.AWAY_GRACE)  # 2 s past the grace: its half of 2 s of refill
        assert 50 <= take_all_settled(mine, 50) <= 150
    finally:
        mine_store.close()
        theirs_store.close()
        RedisStore(redis_url, prefix=prefix).reset()


@pytest.mark.parametrize("drive", ["sync", "async"])
def test_a_process_in_its_grace_goes_back_to_redis_as_soon_as_it_answers(
    redis_url: str, drive: str
) -> None:
    """A process whose Redis stalls waits for it (the grace): once Redis answers, its
    callers are admitted from the shared buckets within a fraction of a second (they used to
    wait for the store's reconnect_interval, here 5 s, admitting nothing: on a fleet whose
    Redis stalls every few seconds, a tenth of its time)."""
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy, prefix = Proxy(port), f"tether-test-{uuid.uuid4().hex[:8]}"
    store = RedisStore(f"redis://127.0.0.1:{proxy.port}/0", prefix=prefix, server_time=False,
                       socket_timeout=0.2, reconnect_interval=5.0)  # fmt: skip
    try:
        b = calibrated(store, SystemClock())
        if drive == "sync":
            hold_replies(proxy, 0.6)
            with pytest.raises(LimiterTimeout):  # Redis stalls, the grace: nothing admitted
                b.reserve(estimated_input_tokens=0, max_output_tokens=10, max_wait=0.3)
            assert store.degraded
            proxy.replies.wait()
            b.reserve(estimated_input_tokens=0, max_output_tokens=10, max_wait=1.5)
        else:

            async def main() -> None:
                await b.areserve(estimated_input_tokens=0, max_output_tokens=10)
                hold_replies(proxy, 0.6)
                with pytest.raises(LimiterTimeout):
                    await b.areserve(estimated_input_tokens=0, max_output_tokens=10, max_wait=0.3)
                assert store.degraded
                await asyncio.to_thread(proxy.replies.wait)
                await b.areserve(estimated_input_tokens=0, max_output_tokens=10, max_wait=1.5)
                await store.aclose()

            asyncio.run(main())
        assert not store.degraded
    finally:
        store.close()
        RedisStore(redis_url, prefix=prefix).reset()


def test_what_responses_said_while_redis_was_away_reaches_the_shared_buckets(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A response arrives while the process's Redis stalls: its headers say the provider has
    1,000 tokens left. When Redis answers again the shared buckets hold 1,000, not the 5,900
    they counted (the headers were applied to the process's memory only, and the other
    processes went on admitting on the shared level: 429s)."""
    monkeypatch.setattr(redis_tokens, "MEMBER_EVERY", 0.0, raising=False)
    proxy, prefix, (store,) = stalling_stores(redis_url, 1)
    try:
        b = calibrated(store, VirtualClock())
        r = b.reserve(estimated_input_tokens=0, max_output_tokens=100)
        proxy.cut()
        headers = {"x-ratelimit-limit-tokens": "6000", "x-ratelimit-remaining-tokens": "1000"}
        b.settle(r, input_tokens=0, output_tokens=100, headers=headers, status=200)
        b.flush()
        assert store.degraded
        proxy.resume()
        time.sleep(0.1)  # past the store's reconnect_interval
        b.reserve(estimated_input_tokens=0, max_output_tokens=0)
        assert not store.degraded
        assert b.view()["levels"]["tokens"] == pytest.approx(1_000, abs=1.0)
    finally:
        store.close()
        RedisStore(redis_url, prefix=prefix).reset()


def test_a_usage_above_the_reservation_reaches_the_store_at_once(store: Any) -> None:
    """A call used 1,400 tokens where 500 were reserved: the store hears of it with the
    settlement (it used to wait for this process's next call or a second: meanwhile the
    other processes admitted on a level 900 too high)."""
    b = calibrated(store, VirtualClock())
    r = b.reserve(estimated_input_tokens=400, max_output_tokens=100)
    reserved = sum(r.need[1:3])
    b.settle(r, input_tokens=1_300, output_tokens=100, status=200)
    assert b.view()["levels"]["tokens"] == pytest.approx(6_000 - 1_400, abs=1.0)
    assert reserved < 1_400


def test_what_an_ask_that_crossed_a_newer_one_says_is_not_dropped(redis_url: str) -> None:
    """Two asks of one process cross on their way to Redis (two connections, a stall): the
    older one, carrying a 429's pause, arrives second. Its refunds are in the newer one's
    total, but its pause counts (it used to be dropped with the whole settlement: a 429's
    pause, the probe's first answer, the headers)."""
    from tether.stores._tokens import Settlement, TokenAsk

    prefix = f"tether-test-{uuid.uuid4().hex[:8]}"
    store = RedisStore(redis_url, prefix=prefix, server_time=False)
    try:
        clock = VirtualClock()
        b = calibrated(store, clock)
        tokens, now = store.tokens(), clock.wall()
        paused = Settlement(seen_at=now, pause_until=now + 5.0, answered=True)
        first = tokens._p_exchange(TokenAsk(b.name, now, b.config, paused, None))
        second = tokens._p_exchange(TokenAsk(b.name, now, b.config, None, (1.0, 0, 0, 10.0)))
        older, newer = next(first), next(second)  # numbered in this order
        with contextlib.suppress(StopIteration):
            second.send(store._conn.run(*newer))  # the newer one arrives first
        with contextlib.suppress(StopIteration):
            first.send(store._conn.run(*older))
        assert b.view()["paused_for"] == pytest.approx(5.0, abs=0.01)
    finally:
        store.reset()
        store.close()


def test_a_probe_whose_answer_was_lost_does_not_hold_the_family_for_its_timeout(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The family's first call (the probe) is admitted in Redis but its answer is lost (a
    stall past the timeout): the caller never sends it. When the process reaches Redis again
    the probe's place is given back with its tokens, and another caller probes at once (the
    fleet used to wait for probe_timeout, 30 s, admitting nothing)."""
    monkeypatch.setattr(redis_tokens, "MEMBER_EVERY", 0.0, raising=False)
    proxy, prefix, (store,) = stalling_stores(redis_url, 1)
    try:
        b = openai_budget(store, VirtualClock())
        hold_replies(proxy, 0.4)
        with pytest.raises(LimiterTimeout):  # admitted in Redis as the probe, its answer lost
            b.reserve(estimated_input_tokens=0, max_output_tokens=100, max_wait=0.0)
        proxy.replies.wait()
        time.sleep(0.1)  # past the store's reconnect_interval
        b.reserve(estimated_input_tokens=0, max_output_tokens=100, max_wait=1.0)
        assert not store.degraded
    finally:
        store.close()
        RedisStore(redis_url, prefix=prefix).reset()
