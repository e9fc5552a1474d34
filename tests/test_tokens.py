"""The token budget: reserve, refund, calibrate, pause, priority; in memory, Redis and Redis Cluster."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tether
from tether import LimiterTimeout, TokenBudget, VirtualClock
from tether.guards._token_calibration import Estimator
from tether.guards._tokens import estimate_tokens, pick, rate_limit_headers
from tether.stores import MemoryStore, RedisStore
from tether.stores._tokens import (
    Settlement,
    TokenAsk,
    TokenConfig,
    tokens_reserve,
    tokens_settle,
)


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
        s = RedisStore(request.getfixturevalue("redis_url"), prefix=prefix, server_time=False)
    yield s
    assert not s.degraded, "the Redis store fell back to memory: a script failed"
    s.reset()
    s.close()


def budget(store: Any, clock: VirtualClock, **kw: Any) -> TokenBudget:
    limits = {
        "requests_per_minute": 60,
        "input_tokens_per_minute": 6000,
        "output_tokens_per_minute": 1200,
    } | kw
    return TokenBudget("anthropic", "claude-sonnet-5", store=store, clock=clock, **limits)


ANTHROPIC = {
    "anthropic-ratelimit-requests-limit": "60",
    "anthropic-ratelimit-requests-remaining": "59",
    "anthropic-ratelimit-requests-reset": "2026-12-01T12:00:01Z",
    "anthropic-ratelimit-input-tokens-limit": "6000",
    "anthropic-ratelimit-input-tokens-remaining": "5000",
    "anthropic-ratelimit-input-tokens-reset": "2026-12-01T12:00:10Z",
    "anthropic-ratelimit-output-tokens-limit": "1200",
    "anthropic-ratelimit-output-tokens-remaining": "1100",
    "anthropic-ratelimit-output-tokens-reset": "2026-12-01T12:00:05Z",
    "anthropic-ratelimit-tokens-limit": "1200",
    "anthropic-ratelimit-tokens-remaining": "1100",
    "anthropic-ratelimit-tokens-reset": "2026-12-01T12:00:05Z",
}
OPENAI = {
    "x-ratelimit-limit-requests": "500",
    "x-ratelimit-remaining-requests": "499",
    "x-ratelimit-reset-requests": "120ms",
    "x-ratelimit-limit-tokens": "30000",
    "x-ratelimit-remaining-tokens": "29000",
    "x-ratelimit-reset-tokens": "2s",
}


def calibrated(b: TokenBudget, **headers: str) -> None:
    """Send the family's first call and settle it: the budget now knows the provider."""
    r = b.reserve(estimated_input_tokens=0, max_output_tokens=0)
    b.settle(r, input_tokens=0, output_tokens=0, headers=headers or None, status=200)


# --- the headers -----------------------------------------------------------------------


def test_the_headers_of_both_providers_are_read_per_bucket() -> None:
    """Anthropic's requests / input / output buckets (RFC 3339 resets), OpenAI's requests /
    tokens (duration resets): limits, remaining and resets in seconds."""
    now = 1796126400.0  # 2026-12-01T12:00:00Z
    limits, remaining, resets = rate_limit_headers(ANTHROPIC, now)
    assert limits == [60.0, 6000.0, 1200.0, 0.0]
    assert remaining == [59.0, 5000.0, 1100.0, -1.0]
    assert resets == [1.0, 10.0, 5.0, None]
    limits, remaining, resets = rate_limit_headers(OPENAI, now)
    assert limits == [500.0, 0.0, 0.0, 30000.0]
    assert remaining == [499.0, -1.0, -1.0, 29000.0]
    assert resets == [pytest.approx(0.12), None, None, 2.0]
    assert rate_limit_headers({"x-ratelimit-limit-tokens": "lots"}, now)[0] == [0.0] * 4


def test_estimate_counts_about_four_characters_a_token() -> None:
    """The estimate of a prompt without a tokenizer."""
    assert estimate_tokens("x" * 400) == 100
    assert estimate_tokens([{"role": "user", "content": "hi"}], None) >= 1


def test_the_longest_matching_family_counts_a_model() -> None:
    """A family is a model name prefix; the most specific budget wins, per provider."""
    general = TokenBudget("anthropic", requests_per_minute=10)
    sonnet = TokenBudget("anthropic", "claude-sonnet", requests_per_minute=10)
    gpt = TokenBudget("openai", "gpt-4o", requests_per_minute=10)
    budgets = (general, sonnet, gpt)
    assert pick(budgets, "anthropic", "claude-sonnet-5-5") is sonnet
    assert pick(budgets, "anthropic", "claude-haiku-4-5") is general
    assert pick(budgets, "openai", "gpt-4o-mini") is gpt
    assert pick(budgets, "openai", "o3") is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("requests_per_minute", 0),
        ("input_tokens_per_minute", -5),
        ("output_tokens_per_minute", float("inf")),
        ("tokens_per_minute", "many"),
    ],
)
def test_bad_limits_are_refused_naming_the_field(field: str, value: Any) -> None:
    """A limit must be a positive finite number or None."""
    with pytest.raises(ValueError, match=field):
        TokenBudget("openai", **{field: value})


def test_a_name_reused_with_other_limits_is_refused(store: Any) -> None:
    """One name is one budget in a store: other limits under it are an error naming both."""
    TokenBudget("openai", "gpt-4o", tokens_per_minute=30_000, store=store)
    with pytest.raises(ValueError, match="token budget named 'openai:gpt-4o'"):
        TokenBudget("openai", "gpt-4o", tokens_per_minute=60_000, store=store)


# --- reserve, refund -------------------------------------------------------------------


def test_the_first_call_probes_alone_until_its_headers_arrive(store: Any) -> None:
    """Until the family's first response is settled, a second caller waits for it."""
    clock = VirtualClock()
    b = budget(store, clock)
    first = b.reserve(estimated_input_tokens=100, max_output_tokens=100)
    cfg, need = b.config, (1.0, 10.0, 10.0, 20.0)
    admitted, _, retry_in = b._ops.exchange(TokenAsk(b.name, clock.wall(), cfg, None, need, 10.0))
    assert (admitted, retry_in) == (False, 0.25)
    b.settle(first, input_tokens=100, output_tokens=50, headers=ANTHROPIC, status=200)
    assert b._ops.exchange(TokenAsk(b.name, clock.wall(), cfg, None, need, 10.0))[0] is True


def test_usage_refunds_what_the_reservation_did_not_use(store: Any) -> None:
    """The reservation takes the estimate and max_tokens; the settle gives the rest back."""
    clock = VirtualClock()
    b = budget(store, clock)
    calibrated(b)
    r = b.reserve(estimated_input_tokens=1000, max_output_tokens=1000)
    levels = b.view()["levels"]
    assert (levels["input"], levels["output"]) == (5000.0, 200.0)
    b.settle(r, input_tokens=800, output_tokens=100)
    b.flush()
    levels = b.view()["levels"]
    assert (levels["input"], levels["output"]) == (5200.0, 1100.0)


def test_output_and_input_are_separate_buckets(store: Any) -> None:
    """An empty output bucket makes a call wait though input tokens are plentiful."""
    clock = VirtualClock()
    b = budget(store, clock)
    calibrated(b)
    b.reserve(estimated_input_tokens=10, max_output_tokens=1200)  # all the output per minute
    start = clock.now()
    b.reserve(estimated_input_tokens=10, max_output_tokens=600, urgency=1.0)
    assert clock.now() - start == pytest.approx(30.0, abs=0.01)  # 600 tokens at 20 a second


def test_a_call_waits_exactly_until_its_tokens_have_accrued(store: Any) -> None:
    """Over a minute, admissions never exceed the limit plus the bucket's start."""
    clock = VirtualClock()
    b = budget(store, clock, output_tokens_per_minute=600)
    calibrated(b)
    start = clock.now()
    served = 0
    while clock.now() - start < 60.0:
        b.reserve(estimated_input_tokens=1, max_output_tokens=100, urgency=1.0)
        served += 100
    assert served <= 600 + 600 + 100  # the full bucket, a minute's refill, the last call
    assert served >= 600 + 500


def test_a_wait_past_max_wait_raises_and_takes_nothing(store: Any) -> None:
    """A caller that cannot be admitted in time learns it before the call and holds no tokens."""
    clock = VirtualClock()
    b = budget(store, clock)
    calibrated(b)
    b.reserve(estimated_input_tokens=10, max_output_tokens=1200)
    before = b.view()["levels"]["output"]
    with pytest.raises(LimiterTimeout, match="anthropic:claude-sonnet-5"):
        b.reserve(estimated_input_tokens=10, max_output_tokens=600, max_wait=5.0)
    assert b.view()["levels"]["output"] == before
    assert clock.now() < 5.0


def test_areserve_and_asettle_are_the_same_behaviour(store: Any) -> None:
    """The async shell takes, waits and refunds as the sync one does."""
    clock = VirtualClock()
    b = budget(store, clock)

    async def main() -> None:
        r = await b.areserve(estimated_input_tokens=100, max_output_tokens=1200)
        spent = dict(ANTHROPIC, **{"anthropic-ratelimit-output-tokens-remaining": "0"})
        await b.asettle(r, input_tokens=100, output_tokens=1200, headers=spent, status=200)
        start = clock.now()
        r2 = await b.areserve(estimated_input_tokens=100, max_output_tokens=600, urgency=1.0)
        assert clock.now() - start == pytest.approx(30.0, abs=0.1)
        assert r2.waited == pytest.approx(30.0, abs=0.1)
        with pytest.raises(LimiterTimeout):
            await b.areserve(estimated_input_tokens=1, max_output_tokens=1200, max_wait=1.0)
        if isinstance(store, RedisStore):
            await store.aclose()

    asyncio.run(main())


# --- calibration -----------------------------------------------------------------------


@pytest.mark.parametrize("configured", [600, 2400])
def test_the_headers_limit_replaces_a_configured_one_wrong_by_two(
    store: Any, configured: float
) -> None:
    """Configured twice too low or too high: after the first response the real limit holds."""
    clock = VirtualClock()
    b = budget(store, clock, output_tokens_per_minute=configured)
    calibrated(b, **ANTHROPIC)
    assert b.view()["limits"]["output"] == 1200.0
    assert b.view()["levels"]["output"] <= 1100.0  # the provider's remaining, believed


def test_a_provider_without_headers_keeps_the_configured_limits(store: Any) -> None:
    """No headers (a proxy): the configured limits stay in force once a response came."""
    clock = VirtualClock()
    b = budget(store, clock)
    calibrated(b)
    view = b.view()
    assert view["calibrated"] is True
    assert view["limits"] == {"requests": 60.0, "input": 6000.0, "output": 1200.0}


def test_limits_nobody_configured_are_learned(store: Any) -> None:
    """A budget with no limits at all learns OpenAI's requests and tokens from the headers."""
    clock = VirtualClock()
    b = TokenBudget("openai", "gpt-4o", store=store, clock=clock)
    calibrated(b, **OPENAI)
    assert b.view()["limits"] == {"requests": 500.0, "tokens": 30000.0}
    assert b.view()["levels"]["tokens"] == 29000.0


def test_a_429_pauses_the_family_for_every_process(store: Any) -> None:
    """Retry-After pauses the family in the store: another budget object (another process)
    waits it out too, without having seen the 429."""
    clock = VirtualClock()
    mine, theirs = budget(store, clock), budget(store, clock)
    calibrated(mine)
    r = mine.reserve(estimated_input_tokens=10, max_output_tokens=10)
    mine.settle(r, headers={"retry-after": "7"}, status=429)
    start = clock.now()
    theirs.reserve(estimated_input_tokens=10, max_output_tokens=10)
    assert clock.now() - start == pytest.approx(7.0, abs=0.01)
    assert mine.throttled == 1


def test_a_429_without_retry_after_waits_for_the_exhausted_buckets_reset(store: Any) -> None:
    """No Retry-After: the reset of the bucket whose remaining is 0."""
    clock = VirtualClock()
    b = TokenBudget("openai", "gpt-4o", store=store, clock=clock, tokens_per_minute=30_000)
    calibrated(b)
    r = b.reserve(estimated_input_tokens=10, max_output_tokens=10)
    headers = dict(
        OPENAI, **{"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "3s"}
    )
    b.settle(r, headers=headers, status=429)
    start = clock.now()
    b.reserve(estimated_input_tokens=10, max_output_tokens=10, urgency=1.0)
    assert clock.now() - start >= 3.0


# --- priority and bounded waits ----------------------------------------------------------


def test_an_urgent_caller_is_admitted_before_a_relaxed_one() -> None:
    """With a line longer than the default horizon, the urgent run takes a place and the
    relaxed one is told to come back."""
    f: dict[str, Any] = {}
    cfg = TokenConfig(limits=(0.0, 0.0, 600.0, 0.0))
    tokens_settle(f, 0.0, cfg, Settlement(answered=True))
    assert tokens_reserve(f, 0.0, cfg, (1, 0, 600, 0), 2.0)[0]  # the bucket is empty now
    relaxed = tokens_reserve(f, 0.0, cfg, (1, 0, 50, 0), 2.0)
    urgent = tokens_reserve(f, 0.0, cfg, (1, 0, 50, 0), 8.0)
    assert relaxed[0] is False and relaxed[2] == pytest.approx(3.0)
    assert urgent == (True, pytest.approx(5.0), 0.0)


def _large_among_small(aging: bool) -> float | None:
    """The wait of one 600-token request among 30-token requests every 10/3 s (90% of a
    600-per-minute bucket, drained at the start), the callers asking as TokenBudget does;
    None: never admitted."""
    import heapq

    cfg = TokenConfig(limits=(0.0, 0.0, 600.0, 0.0))
    f: dict[str, Any] = {}
    tokens_settle(f, 0.0, cfg, Settlement(answered=True))
    assert tokens_reserve(f, 0.0, cfg, (1, 0, 600, 0), 0.0)[0]
    horizon = TokenBudget("x", output_tokens_per_minute=1).horizon
    gap = 10.0 / 3.0
    queue = [(gap * i, i, 30.0, gap * i) for i in range(300)] + [(1.0, -1, 600.0, 1.0)]
    heapq.heapify(queue)
    while queue:
        now, who, need, first = heapq.heappop(queue)
        waited = now - first
        admitted, wait, retry = tokens_reserve(
            f, now, cfg, (1, 0, need, 0), horizon + (waited if aging else 0.0)
        )
        if not admitted:  # asks again when its horizon would have reached the wait
            heapq.heappush(queue, (now + max(retry, 0.001), who, need, first))
        elif who == -1:
            return waited + wait
    return None


def test_no_caller_waits_unboundedly_behind_a_stream_of_newcomers() -> None:
    """A large request among small ones that keep coming is admitted within about two
    minutes: its horizon grows with its wait, the newcomers' does not. Without that
    aging it would wait until the newcomers' gaps add up to a full bucket (ten minutes)."""
    waited = _large_among_small(aging=True)
    assert waited is not None and waited < 130.0
    unaged = _large_among_small(aging=False)
    assert unaged is None or unaged > 300.0


# --- conservation ----------------------------------------------------------------------


def _admit_all(
    calls: list[tuple[float, int, int, bool]], urgent_horizon: float
) -> list[tuple[float, int, int]]:
    """The calls the state machine admits (each at the end of its wait), one bucket of 1000
    input and one of 500 output tokens a minute; no level ever above its limit."""
    cfg = TokenConfig(limits=(0.0, 1000.0, 500.0, 0.0))
    f: dict[str, Any] = {}
    tokens_settle(f, 0.0, cfg, Settlement(answered=True))
    now, sent = 0.0, []
    for gap, need_in, need_out, urgent in calls:
        now += gap
        admitted, wait, _ = tokens_reserve(
            f, now, cfg, (1, need_in, need_out, 0), urgent_horizon if urgent else 2.0
        )
        if admitted:
            sent.append((now + wait, need_in, need_out))
        assert f["lvl1"] <= 1000.0 and f["lvl2"] <= 500.0
    return sent


def _arrivals(max_input: int, max_output: int) -> st.SearchStrategy[list[Any]]:
    """Calls as (gap before it, input tokens, output tokens, urgent)."""
    call = st.tuples(
        st.floats(0, 5), st.integers(0, max_input), st.integers(0, max_output), st.booleans()
    )
    return st.lists(call, min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(_arrivals(400, 400))
def test_admitted_tokens_never_exceed_the_bucket_and_its_refill(
    calls: list[tuple[float, int, int, bool]],
) -> None:
    """Whatever the arrivals, the tokens admitted by any time t (each at the end of its
    wait) stay within the capacity plus the refill: the provider would admit them."""
    sent = _admit_all(calls, 8.0)
    for t, _, _ in sent:
        upto = [s for s in sent if s[0] <= t + 1e-9]
        assert sum(s[1] for s in upto) <= 1000.0 + 1000.0 * t / 60.0 + 1e-6
        assert sum(s[2] for s in upto) <= 500.0 + 500.0 * t / 60.0 + 1e-6


# --- the fleet through Redis -------------------------------------------------------------


def test_one_round_trip_per_call_on_redis(redis_url: str) -> None:
    """Reserve and settle of an admitted call cost one script run: the settle travels with
    the next reservation."""
    clock = VirtualClock()
    store = RedisStore(redis_url, prefix=f"tether-test-{uuid.uuid4().hex[:8]}", server_time=False)
    try:
        b = budget(store, clock, output_tokens_per_minute=1_000_000, requests_per_minute=10_000)
        calibrated(b)
        before = store.scripts_run["tokens"]
        for _ in range(50):
            r = b.reserve(estimated_input_tokens=10, max_output_tokens=10)
            clock.advance(0.01)
            b.settle(r, input_tokens=10, output_tokens=5)
        assert store.scripts_run["tokens"] - before == 50
    finally:
        store.reset()
        store.close()


def test_redis_away_means_local_buckets_and_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    """An unreachable Redis: the budget keeps working on this process's memory, one warning."""
    clock = VirtualClock()
    store = RedisStore("redis://127.0.0.1:1/0", socket_timeout=0.05, server_time=False)
    with caplog.at_level(logging.WARNING, logger="tether"):
        b = budget(store, clock)
        for _ in range(5):
            r = b.reserve(estimated_input_tokens=10, max_output_tokens=10)
            b.settle(r, input_tokens=10, output_tokens=10, headers=ANTHROPIC, status=200)
    warnings = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(warnings) == 1
    assert b.reserved == 5


def test_guard_reaches_the_public_name() -> None:
    """tether.TokenBudget is exported."""
    assert tether.TokenBudget is TokenBudget


# --- the run protocol: what adapters call ------------------------------------------------


def test_begin_model_call_reserves_and_record_model_call_refunds() -> None:
    """An adapter's turn: begin_model_call with the estimate takes the place (waiting on the
    run's clock), record_model_call gives back what the call did not use."""
    clock = VirtualClock()
    b = budget(MemoryStore(), clock)
    calibrated(b)
    guard = tether.Guard(clock=clock, token_budget=b)
    with guard.start(task="t") as run:
        run.begin_model_call(
            model="claude-sonnet-5-5", estimated_input_tokens=100, max_output_tokens=1200
        )
        assert b.view()["levels"]["output"] == 0.0
        run.record_model_call(model="claude-sonnet-5-5", input_tokens=100, output_tokens=600)
        b.flush()
        assert b.view()["levels"]["output"] == 600.0
        run.begin_model_call(
            model="claude-sonnet-5-5", estimated_input_tokens=100, max_output_tokens=1200
        )
        assert clock.now() == pytest.approx(30.0, abs=0.1)  # 600 more at 20 a second
        run.succeed("done")
    assert run.outcome.status == "success"


def test_a_wait_past_the_time_budget_stops_the_run_timeout_at_once() -> None:
    """The wait would end after the run's time budget: TIMEOUT now, no waiting, no request."""
    clock = VirtualClock()
    b = budget(MemoryStore(), clock)
    calibrated(b)
    b.reserve(estimated_input_tokens=1, max_output_tokens=1200)
    guard = tether.Guard(clock=clock, token_budget=b, budget=tether.Budget(max_seconds=10))

    async def main() -> tether.Outcome:
        async with guard.start(task="t") as run:
            await run.abegin_model_call(
                model="claude-sonnet-5-5", estimated_input_tokens=10, max_output_tokens=600
            )
            run.succeed("never")
        return run.outcome

    outcome = asyncio.run(main())
    assert outcome.stopped_because is tether.StopReason.TIMEOUT
    assert clock.now() < 10.0


def test_a_model_no_budget_covers_is_not_held() -> None:
    """Another provider's model goes straight through."""
    clock = VirtualClock()
    b = budget(MemoryStore(), clock)
    guard = tether.Guard(clock=clock, token_budget=b)
    with guard.start(task="t") as run:
        run.begin_model_call(model="gpt-4o", estimated_input_tokens=10**6, max_output_tokens=10**6)
        assert b.reserved == 0


def _provider_replay(cfg: TokenConfig, sent: list[tuple[float, int, int]]) -> list[int]:
    """The calls (sent at their times, in order) a provider's capped buckets would refuse:
    each bucket holds at most its limit and refills at limit / 60 a second."""
    caps = (cfg.limits[1], cfg.limits[2])
    levels, at, refused = list(caps), 0.0, []
    for k, (t, *need) in enumerate(sorted(sent, key=lambda s: s[0])):
        for i, cap in enumerate(caps):
            levels[i] = min(cap, levels[i] + cap * (t - at) / 60.0)
        at = t
        if any(n > levels[i] + 1e-6 for i, n in enumerate(need)):
            refused.append(k)
        else:
            for i, n in enumerate(need):
                levels[i] -= n
    return refused


def test_a_bucket_waiting_for_another_does_not_count_refill_past_its_capacity() -> None:
    """A call that waits for the output bucket leaves the input bucket full meanwhile, and
    a full bucket refills no further: the input it takes is not the minute's refill, and
    the next input-heavy call waits for it (the provider would refuse it otherwise)."""
    cfg = TokenConfig(limits=(0.0, 1000.0, 500.0, 0.0))
    f: dict[str, Any] = {}
    tokens_settle(f, 0.0, cfg, Settlement(answered=True))
    sent = []
    for need_in, need_out in ((0, 500), (1000, 500), (1000, 0)):
        admitted, wait, _ = tokens_reserve(f, 0.0, cfg, (1, need_in, need_out, 0), 1000.0)
        assert admitted
        sent.append((wait, need_in, need_out))
    assert [s[0] for s in sent] == [0.0, 60.0, 120.0]
    assert _provider_replay(cfg, sent) == []


@settings(max_examples=200, deadline=None)
@given(_arrivals(1000, 500))
def test_what_the_budget_admits_a_provider_with_capped_buckets_admits(
    calls: list[tuple[float, int, int, bool]],
) -> None:
    """Whatever the arrivals, replaying the admitted calls at the end of their waits through
    the provider's own buckets (capped at the limit) refuses none of them."""
    sent = _admit_all(calls, 60.0)
    assert _provider_replay(TokenConfig(limits=(0.0, 1000.0, 500.0, 0.0)), sent) == []


def test_a_full_bucket_gains_nothing_while_the_line_waits_for_another(store: Any) -> None:
    """In every store (the Lua twin too): a call waiting a minute for output tokens takes
    a full input bucket when it goes, so the next input-heavy call waits another minute
    (counting the wait's refill as well, the provider would refuse it)."""
    clock = VirtualClock()
    b = TokenBudget(
        "anthropic",
        "claude-sonnet-5",
        input_tokens_per_minute=1000,
        output_tokens_per_minute=500,
        store=store,
        clock=clock,
    )
    calibrated(b)
    b.reserve(estimated_input_tokens=0, max_output_tokens=500)
    b.reserve(estimated_input_tokens=1000, max_output_tokens=500, urgency=1.0)
    assert clock.now() == pytest.approx(60.0, abs=0.5)
    b.reserve(estimated_input_tokens=1000, max_output_tokens=0, urgency=1.0)
    assert clock.now() == pytest.approx(120.0, abs=0.5)


def test_a_reset_budget_forgets_the_line_it_saw(store: Any) -> None:
    """After a refusal that saw a long line, reset() (the buckets full again) admits a small
    call at once: the process does not keep the line it learned before the reset."""
    clock = VirtualClock()
    b = budget(store, clock)
    calibrated(b)
    b.reserve(estimated_input_tokens=10, max_output_tokens=1200)  # the output bucket empty
    with pytest.raises(LimiterTimeout):
        b.reserve(estimated_input_tokens=10, max_output_tokens=1200, max_wait=10.0)
    b.reset()
    r = b.reserve(estimated_input_tokens=10, max_output_tokens=20, max_wait=10.0)
    assert r.waited < 10.0


# --- what the estimate and the headers say, together -----------------------------------


def test_one_under_estimate_keeps_the_reservations_large() -> None:
    """A usage of 1.5 times the estimate, after fifty exact ones: the next reservations take
    at least 1.5 times the estimate, and still 1.4 times after ten exact usages (it was 1.2
    at once: the average forgot it, the next such prompt went out short)."""
    e = Estimator()
    for _ in range(50):
        e.learn(1000, 1000)
    e.learn(1000, 1500)
    assert e.need(1000, 0)[1] >= 1500
    for _ in range(10):
        e.learn(1000, 1000)
    assert e.need(1000, 0)[1] >= 1400
    e.reset()
    assert e.need(1000, 0)[1] == 1000


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_remaining_header_does_not_count_the_padding_in_flight_twice(
    store: Any, asynchronous: bool
) -> None:
    """Two calls in flight, each reserved 1,500 for the 1,050 expected; the provider's header
    (with both at their usage) says 1,000 left. After both settle the budget holds what the
    provider holds, 1,000, not 1,450: the header's level already had the second call at its
    usage, and its refund of 450 counted again on top (the fleet's buckets above the
    provider's near an empty bucket: 429s)."""
    clock = VirtualClock()
    b = budget(store, clock)
    calibrated(b)
    learn = b.reserve(estimated_input_tokens=1000, max_output_tokens=0)
    b.settle(learn, input_tokens=1500, output_tokens=0)  # 1.5 x: the next take more
    b.flush()
    headers = {
        "anthropic-ratelimit-input-tokens-limit": "6000",
        "anthropic-ratelimit-input-tokens-remaining": "1000",
    }
    used = {"input_tokens": 1050, "output_tokens": 0, "status": 200}

    def steps() -> float:
        first = b.reserve(estimated_input_tokens=1000, max_output_tokens=0)
        second = b.reserve(estimated_input_tokens=1000, max_output_tokens=0)
        assert first.need[1] == second.need[1] > 1050  # padded: 1.5 x
        b.settle(first, headers=headers, **used)
        b.flush()
        b.settle(second, **used)
        b.flush()
        return float(b.view()["levels"]["input"])

    async def asteps() -> float:
        first = await b.areserve(estimated_input_tokens=1000, max_output_tokens=0)
        second = await b.areserve(estimated_input_tokens=1000, max_output_tokens=0)
        assert first.need[1] == second.need[1] > 1050  # padded: 1.5 x
        await b.asettle(first, headers=headers, **used)
        b.flush()
        await b.asettle(second, **used)
        b.flush()
        level = float(b.view()["levels"]["input"])
        if isinstance(store, RedisStore):
            await store.aclose()
        return level

    level = asyncio.run(asteps()) if asynchronous else steps()
    assert level == pytest.approx(1000.0, abs=1.0)
