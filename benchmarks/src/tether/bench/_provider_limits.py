"""The provider-limits scenario of the fleet suite: a thousand agents under one API key's
requests, input tokens and output tokens per minute, with the limits configured 2x wrong.

The provider is :class:`tether.bench._provider.SimulatedProvider` (Anthropic's buckets and
headers) behind the real ``anthropic.AsyncAnthropic`` client's own transport seam; every
policy drives that real client on an asyncio loop whose time is a virtual clock (the
SDK's retries, tenacity and the waits all sleep on it). The agents' prompts grow turn by
turn; the provider counts tokens with its own tokenizer (2.6 to 4.6 characters a token,
by agent), so a characters/4 estimate is off by up to 35% either way.

Policies: ``sdk-default`` (the SDK's two retries with its backoff and Retry-After),
``tenacity`` (no SDK retries; tenacity's ``wait_exponential_jitter`` and 8 attempts on a
429), ``langchain-limiter`` (LangChain's ``InMemoryRateLimiter`` at the configured requests
per second in front of the SDK's retries: it counts requests, not tokens), ``router-tpm``
(a fixed one-minute window of tokens per minute in a shared counter, checked before and
added after each call, as LLM routers keep it in Redis; with the SDK's retries) and
``tether`` (``tether.TokenBudget`` with the configured limits, through the guarded client).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import math
import random
import statistics
from collections.abc import Awaitable, Callable
from typing import Any

from tether import RetryPolicy, TokenBudget, VirtualClock
from tether.bench._live_limits import message_reply
from tether.bench._provider import Limits, SimulatedProvider, share_of_limit
from tether.bench._vloop import run_virtual
from tether.stores import MemoryStore

__all__ = ["PROVIDER_LIMITS", "PROVIDER_POLICIES", "REAL_LIMITS", "run_provider_limits"]

#: the key's real limits (Anthropic's tier-4 shape, scaled down): RPM, ITPM, OTPM
REAL_LIMITS = Limits(requests=4_000, input=1_500_000, output=300_000)
#: the configured limits as a share of the real ones
PROVIDER_LIMITS = {"configured-2x-high": 2.0, "configured-2x-low": 0.5}
MODEL = "claude-sonnet-5-5"
AGENTS = 1000
#: when the busy window opens: the buckets' full start spent, before the minute's edge (a
#: router's fixed window admits its waiters at the edge, after the snapshot of the buckets)
OPENS = 59.5
_CALL: contextvars.ContextVar[dict[str, float]] = contextvars.ContextVar("call")


class _Agent:
    """One agent's conversation: its turns, prompt growth, tokenizer and output sizes."""

    def __init__(self, rng: random.Random) -> None:
        self.turns = rng.randint(2, 6)
        self.system = "s" * rng.randint(1_000, 12_000)
        self.chars_per_token = rng.uniform(2.6, 4.6)
        self.max_tokens = [rng.choice((256, 512, 1024, 2048)) for _ in range(self.turns)]
        self.used = [rng.uniform(0.1, 0.9) for _ in range(self.turns)]
        self.results = [rng.randint(400, 4_000) for _ in range(self.turns)]
        self.start = rng.uniform(0.0, 10.0)


class _Counter:
    """A router-style fixed window: tokens used in the current minute, per deployment."""

    def __init__(self, limit: float) -> None:
        self.limit, self.window, self.used, self.trips = limit, -1, 0.0, 0

    def room(self, now: float, need: float) -> float:
        """Seconds until ``need`` fits in a window (0: now)."""
        self.trips += 1
        window = int(now // 60)
        if window != self.window:
            self.window, self.used = window, 0.0
        return 0.0 if self.used + need <= self.limit else (window + 1) * 60.0 - now

    def add(self, now: float, tokens: float) -> None:
        self.trips += 1
        if int(now // 60) == self.window:
            self.used += tokens


def _transport(provider: SimulatedProvider, clock: VirtualClock, agents: dict[str, _Agent]) -> Any:
    import httpx2

    async def handle(request: Any) -> Any:
        body = json.loads(request.content)
        agent = agents[body["metadata"]["user_id"]]
        chars = len(json.dumps([body.get("system"), body["messages"]]))
        used_in = math.ceil(chars / agent.chars_per_token)
        max_out = int(body["max_tokens"])
        ok, headers = provider.admit(clock.wall(), used_in, max_out)
        if not ok:
            error = {"type": "rate_limit_error", "message": "rate limit exceeded"}
            return httpx2.Response(429, json={"type": "error", "error": error}, headers=headers)
        call = _CALL.get(None)
        if call is not None:
            call.setdefault("admitted", clock.now())
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        out = max(1, int(max_out * agent.used[turn]))
        await asyncio.sleep(0.5 + out / 80.0)  # time to first token, then 80 tokens a second
        provider.finish(clock.wall(), used_in, out, max_out)
        return httpx2.Response(200, json=message_reply(out, used_in, MODEL), headers=headers)

    return httpx2.MockTransport(handle)


def _client(transport: Any, retries: int) -> Any:
    import anthropic
    import httpx2

    return anthropic.AsyncAnthropic(
        api_key="bench",
        base_url="http://model.bench",
        max_retries=retries,
        http_client=httpx2.AsyncClient(transport=transport),
    )


Send = Callable[[dict[str, Any]], Awaitable[Any]]


def _policy(
    name: str, transport: Any, clock: VirtualClock, configured: Limits, shared: dict[str, Any]
) -> Send:
    if name == "sdk-default":
        client = _client(transport, 2)
        return lambda kw: client.messages.create(**kw)
    if name == "tenacity":
        import anthropic
        from tenacity import (
            AsyncRetrying,
            retry_if_exception_type,
            stop_after_attempt,
            wait_exponential_jitter,
        )

        client = _client(transport, 0)

        async def tenacious(kw: dict[str, Any]) -> Any:
            async for attempt in AsyncRetrying(
                wait=wait_exponential_jitter(initial=1, max=60),
                stop=stop_after_attempt(8),
                retry=retry_if_exception_type(anthropic.RateLimitError),
                reraise=True,
            ):
                with attempt:
                    return await client.messages.create(**kw)
            raise AssertionError("unreachable")

        return tenacious
    if name == "langchain-limiter":
        limiter = shared["limiter"]
        client = _client(transport, 2)

        async def limited(kw: dict[str, Any]) -> Any:
            await limiter.aacquire()
            return await client.messages.create(**kw)

        return limited
    if name == "router-tpm":
        counter = shared["counter"]
        client = _client(transport, 2)

        async def routed(kw: dict[str, Any]) -> Any:
            need = len(json.dumps([kw.get("system"), kw["messages"]])) / 4 + kw["max_tokens"]
            while (wait := counter.room(clock.now(), need)) > 0:
                await asyncio.sleep(wait)
            reply = await client.messages.create(**kw)
            counter.add(clock.now(), reply.usage.input_tokens + reply.usage.output_tokens)
            return reply

        return routed
    if name == "tether":
        from tether.integrations import anthropic as tanthropic

        client = tanthropic.guarded(
            _client(transport, 0), policy=RetryPolicy(clock=clock), token_budget=shared["budget"]
        )
        return lambda kw: client.messages.create(**kw)
    raise ValueError(f"unknown policy {name!r}")


PROVIDER_POLICIES = ("sdk-default", "tenacity", "langchain-limiter", "router-tpm", "tether")


class _VirtualTime:
    """``time`` as LangChain's limiter reads it, on the virtual clock (as freezegun would)."""

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock

    def monotonic(self) -> float:
        return self._clock.now()

    def time(self) -> float:
        return self._clock.wall()

    def sleep(self, seconds: float) -> None:
        self._clock.advance(max(0.0, seconds))


class _CountingStore(MemoryStore):
    """The memory store, counting the token operations a RedisStore would make round trips of."""

    def __init__(self) -> None:
        super().__init__()
        self.trips = 0
        inner = self.tokens()
        outer = self

        class Counted:
            def __getattr__(self, name: str) -> Any:
                fn = getattr(inner, name)
                if name in ("exchange", "aexchange"):
                    outer_fn = fn

                    def counted(*a: Any, **kw: Any) -> Any:
                        outer.trips += 1
                        return outer_fn(*a, **kw)

                    return counted
                return fn

        self._counted = Counted()

    def tokens(self) -> Any:
        counted = getattr(self, "_counted", None)
        return counted if counted is not None else super().tokens()


def run_provider_limits(
    policy: str,
    misconfig: str,
    *,
    agents: int = AGENTS,
    seed: int = 7,
    real: Limits = REAL_LIMITS,
) -> dict[str, Any]:
    """One cell: ``agents`` agents under ``policy``, the key's limits ``real``, configured
    per ``misconfig``."""
    import logging

    from langchain_core import rate_limiters

    logging.getLogger("anthropic").setLevel(logging.ERROR)
    logging.getLogger("httpx").setLevel(logging.ERROR)
    clock = VirtualClock(wall_start=1_800_000_000.0)  # its asleep: a timer of the loop
    rng = random.Random(f"{seed}:provider-limits")  # the same agents for every policy
    people = {f"a{i}": _Agent(rng) for i in range(agents)}
    provider = SimulatedProvider("anthropic", real, clock.wall())
    transport = _transport(provider, clock, people)
    configured = real.scaled(PROVIDER_LIMITS[misconfig])
    store = _CountingStore()
    shared: dict[str, Any] = {
        "limiter": rate_limiters.InMemoryRateLimiter(
            requests_per_second=configured.requests / 60.0,
            check_every_n_seconds=0.05,
            max_bucket_size=configured.requests / 60.0,
        ),
        "counter": _Counter(configured.input + configured.output),
        "budget": TokenBudget(
            "anthropic", "claude", store=store, clock=clock, **configured.as_budget()
        ),
    }
    send = _policy(policy, transport, clock, configured, shared)
    finished: list[float] = []
    waits: list[float] = []
    failed = 0

    async def agent(key: str, a: _Agent) -> None:
        nonlocal failed
        await asyncio.sleep(a.start)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "q" * 400}]
        for turn in range(a.turns):
            call = {"asked": clock.now()}
            token = _CALL.set(call)
            try:
                reply = await send(
                    {
                        "model": MODEL,
                        "max_tokens": a.max_tokens[turn],
                        "system": a.system,
                        "messages": messages,
                        "metadata": {"user_id": key},
                    }
                )
            except Exception:
                failed += 1
                ended.append(clock.now())
                return
            finally:
                _CALL.reset(token)
            waits.append(call.get("admitted", clock.now()) - call["asked"])
            messages = [
                *messages,
                {"role": "assistant", "content": reply.content[0].text},
                {"role": "user", "content": "t" * a.results[turn]},
            ]
        finished.append(clock.now())
        ended.append(clock.now())

    ended: list[float] = []  # every agent's end, done or failed
    at_start: dict[str, float] = {}

    async def snapshot() -> None:  # what the buckets hold when the busy window opens
        await asyncio.sleep(OPENS)  # just before a minute's edge: a fixed window's start
        with provider._lock:
            for name, bucket in provider.buckets.items():
                bucket.refill(clock.wall())
                at_start[name] = max(0.0, bucket.level)

    async def main() -> None:
        await asyncio.gather(snapshot(), *(agent(k, a) for k, a in people.items()))

    real_time = vars(rate_limiters)["time"]
    setattr(rate_limiters, "time", _VirtualTime(clock))  # noqa: B010 - the limiter's clock
    try:
        run_virtual(clock, main())
    finally:
        setattr(rate_limiters, "time", real_time)  # noqa: B010
    s = provider.stats
    # the busy minutes: after the first (the buckets' full start), until 90% of the agents
    # have ended (after that, fewer agents than the limit can serve are left); a fleet that
    # ended within two minutes (its runs failed) over its whole time, its full start counted
    t0 = clock.wall() - clock.now()
    end = _quantile(ended, 0.9) if ended else 0.0
    start = OPENS if end > 120.0 else 0.0
    held = at_start if start else {"input": real.input, "output": real.output}
    busy_end = t0 + end
    admitted = s.requests - s.throttled
    trips = {"tether": store.trips, "router-tpm": shared["counter"].trips}.get(policy, 0)
    return {
        "agents": agents,
        "success": round(len(finished) / agents, 4),
        "requests": s.requests,
        "throttled_per_1000": round(1000.0 * s.throttled / max(1, s.requests), 2),
        "input_share_of_limit": round(
            share_of_limit(s, real.input, t0 + start, busy_end, 1, held.get("input", 0.0)),
            3,
        ),
        "output_share_of_limit": round(
            share_of_limit(s, real.output, t0 + start, busy_end, 2, held.get("output", 0.0)),
            3,
        ),
        "p50_completion_s": round(statistics.median(finished), 1) if finished else None,
        "p95_completion_s": round(_quantile(finished, 0.95), 1) if finished else None,
        "longest_wait_s": round(max(waits, default=0.0), 1),
        "store_round_trips_per_call": round(trips / max(1, admitted), 2),
    }


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
