"""The token budget against a loopback provider that enforces RPM / ITPM / OTPM (Anthropic) or
RPM / TPM (OpenAI) as token buckets and answers with the real header shapes, through the
real ``anthropic`` and ``openai`` SDKs: sync and async, one process and real processes
sharing Redis, with the configured limits wrong by 2x either way.

Time runs SCALE times faster than the wall clock for the provider and the clients alike
(a minute of limits in a couple of real seconds).
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import threading
import time
import uuid
from typing import Any

import anthropic
import openai
import pytest

import tether
from scripted_server import Reply, ScriptedServer, Seen
from tether.bench._provider import Limits, SimulatedProvider
from tether.integrations import anthropic as tanthropic
from tether.integrations import openai as topenai

SCALE = 15.0
START = time.time()


class FastClock:
    """Wall time SCALE times faster (the same in every process started with ``start``).

    It keeps the (wall) times its callers slept: the budget's waits and the retries', the
    times the fleet had a call waiting to go out (see :func:`utilisation`)."""

    def __init__(self, start: float = START) -> None:
        self.start = start
        self.slept: list[tuple[float, float]] = []

    def now(self) -> float:
        return (time.time() - self.start) * SCALE

    def wall(self) -> float:
        return 1_700_000_000.0 + self.now()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            began = self.wall()
            time.sleep(seconds / SCALE)
            self.slept.append((began, self.wall()))

    async def asleep(self, seconds: float) -> None:
        began = self.wall()
        await asyncio.sleep(max(0.0, seconds) / SCALE)
        self.slept.append((began, self.wall()))


LIMITS = {
    "anthropic": Limits(requests=600, input=40_000, output=12_000),
    "openai": Limits(requests=600, tokens=24_000),
}


def tokenizer(body: dict[str, Any]) -> int:
    """The provider's own count of a prompt: a bit more than the clients' estimate."""
    text = json.dumps([body.get("system"), body.get("messages"), body.get("tools")])
    return math.ceil(len(text) / 3.5)


def output_of(body: dict[str, Any]) -> int:
    """How much of max_tokens the model generates: 20% to 100%, fixed by the prompt."""
    text = json.dumps(body.get("messages"))
    return max(1, int(body["max_tokens"] * (0.2 + 0.8 * (sum(map(ord, text)) % 97) / 96)))


class Provider:
    """The loopback provider: the simulated buckets behind a scripted HTTP server."""

    def __init__(self, style: str, clock: Any) -> None:
        self.style, self.clock = style, clock
        self.sim = SimulatedProvider(style, LIMITS[style], clock.wall())

    def __call__(self, seen: Seen) -> Reply:
        body = seen.body
        if self.style == "openai":
            body = dict(body, max_tokens=body.get("max_completion_tokens") or body["max_tokens"])
        used_in, max_out = tokenizer(body), int(body["max_tokens"])
        ok, headers = self.sim.admit(self.clock.wall(), used_in, max_out)
        if not ok:
            error = {"type": "rate_limit_error", "message": "rate limited"}
            if self.style == "openai":
                error = {"message": "rate limited", "type": "tokens", "code": "rate_limit_exceeded"}
            return Reply(429, {"type": "error", "error": error}, headers=headers)
        used_out = output_of(body)
        self.sim.finish(self.clock.wall(), used_in, used_out, max_out)
        if self.style == "anthropic":
            reply = {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": body["model"],
                "content": [{"type": "text", "text": "ok"}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": used_in, "output_tokens": used_out},
            }
        else:
            reply = {
                "id": "c1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "ok"},
                    }
                ],
                "usage": {
                    "prompt_tokens": used_in,
                    "completion_tokens": used_out,
                    "total_tokens": used_in + used_out,
                },
            }
        return Reply(200, reply, headers=headers)


MODEL = {"anthropic": "claude-sonnet-5-5", "openai": "gpt-4o-mini"}


def prompt(i: int) -> list[dict[str, Any]]:
    """Varied prompt sizes: 30 to 900 characters."""
    return [{"role": "user", "content": f"question {i}: " + "lorem ipsum " * (2 + (i * 37) % 75)}]


def make_client(
    style: str, url: str, asynchronous: bool, budget: tether.TokenBudget, clock: Any
) -> Any:
    policy = tether.RetryPolicy(max_attempts=6, clock=clock, base=0.5)
    if style == "anthropic":
        cls = anthropic.AsyncAnthropic if asynchronous else anthropic.Anthropic
        return tanthropic.guarded(
            cls(api_key="t", base_url=url), policy=policy, token_budget=budget
        )
    cls = openai.AsyncOpenAI if asynchronous else openai.OpenAI
    return topenai.guarded(
        cls(api_key="t", base_url=url + "/v1"), policy=policy, token_budget=budget
    )


def call(style: str, client: Any, i: int) -> Any:
    if style == "anthropic":
        return client.messages.create(
            model=MODEL[style], max_tokens=200 + (i * 13) % 300, messages=prompt(i)
        )
    return client.chat.completions.create(
        model=MODEL[style], max_tokens=200 + (i * 13) % 300, messages=prompt(i)
    )


def configured(style: str, factor: float) -> dict[str, Any]:
    return LIMITS[style].scaled(factor).as_budget()


def waiting_minutes(slept: list[tuple[float, float]], start: float, end: float) -> float:
    """How long, between ``start`` and ``end``, at least one caller waited (the union of
    their sleeps), in minutes."""
    total, reached = 0.0, start
    for began, ended in sorted(slept):
        began, ended = max(began, reached), min(ended, end)
        if ended > began:
            total += ended - began
            reached = ended
    return total / 60.0


def utilisation(sim: SimulatedProvider, slept: list[tuple[float, float]]) -> float:
    """Tokens served as a share of what the binding bucket allowed (its full start plus its
    refill) while a caller waited to send: a budget that holds calls back with the limit
    unused counts its whole wait; minutes in which no caller waited (the clients busy on a
    loaded machine, time running on at SCALE) are not the budget's."""
    s = sim.stats
    minutes = waiting_minutes(slept, s.first_at or s.last_at, s.last_at)
    if sim.style == "anthropic":
        cap = sim.limits.output
        return s.served_output / (cap + cap * minutes)
    cap = sim.limits.tokens
    # OpenAI admits by prompt + max_tokens: the estimate, not the usage, binds it
    return (s.served_input + s.served_output) / (cap + cap * minutes)


@pytest.mark.parametrize(
    ("style", "asynchronous", "factor"),
    [
        ("anthropic", False, 2.0),
        ("anthropic", True, 0.5),
        ("openai", False, 0.5),
        ("openai", True, 2.0),
    ],
)
def test_a_fleet_of_agents_meets_the_real_limit_with_no_429(
    style: str, asynchronous: bool, factor: float
) -> None:
    """Eight concurrent agents, limits configured 2x wrong: at most one 429 and the real
    limit's tokens served, learned from the headers."""
    clock = FastClock(time.time())
    provider = Provider(style, clock)
    calls = 120
    with ScriptedServer() as server:
        server.handler = provider
        budget = tether.TokenBudget(
            style, MODEL[style][:6], clock=clock, **configured(style, factor)
        )
        client = make_client(style, server.url, asynchronous, budget, clock)
        if asynchronous:

            async def agent(k: int) -> None:
                for i in range(k, calls, 8):
                    await call(style, client, i)

            async def main() -> None:
                await asyncio.gather(*(agent(k) for k in range(8)))
                await client.close()

            asyncio.run(main())
        else:
            threads = [
                threading.Thread(
                    target=lambda k=k: [call(style, client, i) for i in range(k, calls, 8)]
                )
                for k in range(8)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            client.close()
    stats = provider.sim.stats
    assert stats.requests - stats.throttled == calls
    assert stats.throttled <= 1
    assert budget.view()["limits"] == {
        k: v
        for k, v in zip(
            ("requests", "input", "output", "tokens"),
            (
                LIMITS[style].requests,
                LIMITS[style].input,
                LIMITS[style].output,
                LIMITS[style].tokens,
            ),
            strict=True,
        )
        if v
    }
    assert utilisation(provider.sim, clock.slept) >= 0.75


def _worker(
    style: str,
    url: str,
    redis_url: str,
    prefix: str,
    start: float,
    k: int,
    n: int,
    calls: int,
    factor: float,
    ready: Any,
    slept: Any,
) -> None:
    clock = FastClock(start)
    store = tether.stores.RedisStore(redis_url, prefix=prefix, server_time=False)
    budget = tether.TokenBudget(
        style, MODEL[style][:6], clock=clock, store=store, **configured(style, factor)
    )
    client = make_client(style, url, False, budget, clock)
    ready.wait()  # every process imported and connected: they start together
    for i in range(k, calls, n):
        call(style, client, i)
    client.close()
    budget.flush()
    store.close()
    slept.put(clock.slept)


@pytest.mark.parametrize(("style", "factor"), [("anthropic", 2.0), ("openai", 0.5)])
def test_real_processes_share_one_budget_through_redis(
    redis_url: str, style: str, factor: float
) -> None:
    """Four processes on one Redis budget: no more 429s than one, the real limit served."""
    clock = FastClock(time.time())
    provider = Provider(style, clock)
    prefix = f"tether-test-{uuid.uuid4().hex[:8]}"
    calls, n = 120, 4
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Barrier(n)
    slept_out = ctx.Queue()
    with ScriptedServer() as server:
        server.handler = provider
        procs = [
            ctx.Process(
                target=_worker,
                args=(
                    style,
                    server.url,
                    redis_url,
                    prefix,
                    clock.start,
                    k,
                    n,
                    calls,
                    factor,
                    ready,
                    slept_out,
                ),
            )
            for k in range(n)
        ]
        for p in procs:
            p.start()
        slept = [interval for _ in procs for interval in slept_out.get(timeout=120)]
        for p in procs:
            p.join(timeout=120)
            assert p.exitcode == 0
    tether.stores.RedisStore(redis_url, prefix=prefix).reset()
    stats = provider.sim.stats
    assert stats.requests - stats.throttled == calls
    assert stats.throttled <= 1
    assert utilisation(provider.sim, slept) >= 0.75


def emptied_budget(clock: tether.VirtualClock, output_per_minute: int) -> tether.TokenBudget:
    """A calibrated budget whose output bucket a call outside the test has just emptied."""
    budget = tether.TokenBudget(
        "anthropic", "claude", clock=clock, output_tokens_per_minute=output_per_minute
    )
    r = budget.reserve(estimated_input_tokens=0, max_output_tokens=0)
    budget.settle(r, input_tokens=0, output_tokens=0, status=200)
    budget.reserve(estimated_input_tokens=10, max_output_tokens=output_per_minute)
    return budget


def test_a_wait_past_the_runs_time_stops_it_timeout_before_the_request() -> None:
    """run_agent under a 20 s time budget, the output bucket empty for a minute: the run
    stops TIMEOUT and the provider never sees the request."""
    clock = tether.VirtualClock()
    provider = Provider("anthropic", FastClock())
    with ScriptedServer() as server:
        server.handler = provider
        budget = emptied_budget(clock, 600)
        guard = tether.Guard(budget=tether.Budget(max_seconds=20), clock=clock, token_budget=budget)
        with anthropic.Anthropic(api_key="t", base_url=server.url) as client:
            outcome = tanthropic.run_agent(
                client, model="claude-sonnet-5-5", messages=prompt(1), guard=guard, max_tokens=300
            )
    assert outcome.stopped_because is tether.StopReason.TIMEOUT
    assert "token budget 'anthropic:claude'" in outcome.detail
    assert server.requests == []
    assert clock.now() < 20.0


async def _arun(guard: tether.Guard, url: str) -> tether.Outcome:
    async with anthropic.AsyncAnthropic(api_key="t", base_url=url) as client:
        return await tanthropic.arun_agent(
            client, model="claude-sonnet-5-5", messages=prompt(2), guard=guard, max_tokens=300
        )


def test_the_async_run_waits_for_its_place_and_the_wait_counts_against_its_time() -> None:
    """arun_agent waits 15 s for the output bucket (within a 60 s budget): the run succeeds,
    and the 15 s are part of its elapsed time."""
    clock = tether.VirtualClock()
    provider = Provider("anthropic", FastClock())
    with ScriptedServer() as server:
        server.handler = provider
        budget = emptied_budget(clock, 1200)
        guard = tether.Guard(budget=tether.Budget(max_seconds=60), clock=clock, token_budget=budget)
        outcome = asyncio.run(_arun(guard, server.url))
    assert outcome.status == "success"
    assert clock.now() == pytest.approx(15.0, abs=0.5)
    assert len(server.requests) == 1


def _two_calls(
    clock: tether.VirtualClock, budget: tether.TokenBudget, url: str, asynchronous: bool
) -> tether.Outcome:
    """A run of 15 s, in its own loop, two calls through a guarded client: the first waits
    10 s for its output tokens, the second would wait at least 7 s more."""
    guard = tether.Guard(budget=tether.Budget(max_seconds=15), clock=clock, token_budget=budget)

    def kw(max_tokens: int) -> dict[str, Any]:
        return {"model": "claude-sonnet-5-5", "max_tokens": max_tokens, "messages": prompt(3)}

    if asynchronous:

        async def main() -> tether.Outcome:
            async with guard.start(task="two calls") as run:
                client = tanthropic.guarded(
                    anthropic.AsyncAnthropic(api_key="t", base_url=url), run=run
                )
                await client.messages.create(**kw(100))
                await client.messages.create(**kw(150))
                run.succeed("both answered")
            await client.close()
            return run.outcome

        return asyncio.run(main())
    with guard.start(task="two calls") as run:
        client = tanthropic.guarded(anthropic.Anthropic(api_key="t", base_url=url), run=run)
        client.messages.create(**kw(100))
        client.messages.create(**kw(150))
        run.succeed("both answered")
    client.close()
    return run.outcome


@pytest.mark.parametrize("asynchronous", [False, True])
def test_the_token_wait_counts_against_the_run_and_stops_it_before_the_request(
    asynchronous: bool,
) -> None:
    """Sync and async alike: the first call's 10 s wait is the run's time, so the second
    call, whose wait would outlast the 5 s left, stops the run TIMEOUT before its request
    (the provider sees one request), without waiting it out. The provider's limit is the
    budget's (600 output tokens a minute), on the run's clock."""
    clock = tether.VirtualClock()
    provider = Provider("anthropic", clock)
    provider.sim = SimulatedProvider("anthropic", Limits(600, 40_000, 600), clock.wall())
    with ScriptedServer() as server:
        server.handler = provider
        budget = emptied_budget(clock, 600)
        outcome = _two_calls(clock, budget, server.url, asynchronous)
    assert outcome.stopped_because is tether.StopReason.TIMEOUT
    assert "token budget 'anthropic:claude'" in outcome.detail
    assert len(server.requests) == 1
    assert 10.0 <= clock.now() < 15.0
