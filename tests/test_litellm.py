"""LiteLLM under tether: the real ``litellm.completion`` and ``Router`` against a scripted
loopback OpenAI-compatible provider, whose requests count the attempts."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of the cost map

import litellm
from litellm import Router

from scripted_server import Reply, ScriptedServer
from tether import (
    Budget,
    CircuitOpenError,
    Guard,
    Price,
    PriceTable,
    RetryPolicy,
    Stopped,
    StopReason,
    TokenBudget,
    VirtualClock,
    classify,
)
from tether.integrations.litellm import (
    TetherLogger,
    acompletion,
    completion,
    guarded_router,
    litellm_usage,
)
from tether.stores import MemoryStore

#: LiteLLM's own types make pydantic warn (TypedDicts with ReadOnly items) on first use: not
#: this code's warnings
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*ReadOnly. qualifier:UserWarning"),
    # LiteLLM's sync calls leave event loops and sockets of their own unclosed (its logging
    # worker's), collected whenever the GC runs, in any test: LiteLLM's, not this code's
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in:pytest.PytestUnraisableExceptionWarning"
    ),
    # LiteLLM's stream reader reads a field pydantic 2.11 deprecated: its warning, not ours
    pytest.mark.filterwarnings(
        "ignore:Accessing the 'model_(computed_)?fields' attribute:DeprecationWarning"
    ),
]

MODEL = "gpt-6.1-terra"
PRICES = PriceTable({MODEL: Price(input=2.0, output=8.0, cache_read=0.2)})
HI = [{"role": "user", "content": "hi"}]
POLICY = RetryPolicy(max_attempts=4, base=0.001, cap=0.002)


def ok(model: str = MODEL) -> Reply:
    return Reply(
        body={
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "hello"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": 1000,
                "completion_tokens": 100,
                "total_tokens": 1100,
                "prompt_tokens_details": {"cached_tokens": 400},
            },
        }
    )


def overloaded() -> Reply:
    return Reply(503, {"error": {"message": "overloaded", "type": "server_error"}})


@pytest.fixture(autouse=True, scope="module")
def _litellm_s_own_loops() -> Iterator[None]:
    """LiteLLM's sync calls leave an event loop of its own unclosed (its logging worker's):
    collected here, its ResourceWarning LiteLLM's, not this code's."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as s:
        yield s


def attempts(server: ScriptedServer) -> int:
    return sum(1 for r in server.requests if r.path.endswith("/chat/completions"))


def failing_then_ok(server: ScriptedServer, failures: int) -> None:
    count = {"i": 0}

    def handler(seen: Any) -> Reply:
        count["i"] += 1
        return overloaded() if count["i"] <= failures else ok()

    server.handler = handler


def direct(server: ScriptedServer) -> dict[str, Any]:
    return {"model": f"openai/{MODEL}", "api_base": server.url + "/v1", "api_key": "k"}


def router(server: ScriptedServer, **options: Any) -> Any:
    deployment = {"model_name": MODEL, "litellm_params": direct(server)}
    return Router(model_list=[deployment], retry_after=0, **options)


def guard(**budget: Any) -> Guard:
    return Guard(budget=Budget(max_steps=30, **budget), prices=PRICES)


CALLS: dict[str, Callable[..., Any]] = {
    "sync": lambda run, **kw: completion(run, **kw),
    "async": lambda run, **kw: asyncio.run(acompletion(run, **kw)),
}
ROUTED: dict[str, Callable[..., Any]] = {
    "sync": lambda r, **kw: r.completion(**kw),
    "async": lambda r, **kw: asyncio.run(r.acompletion(**kw)),
}


@pytest.mark.parametrize("shell", CALLS)
def test_completion_is_one_turn_with_its_usage_priced(server: ScriptedServer, shell: str) -> None:
    """One reply: one model call, 600 uncached + 400 cached input tokens, tether's price."""
    server.handler = lambda seen: ok()
    with guard().start("hi") as run:
        reply = CALLS[shell](run, messages=HI, policy=POLICY, **direct(server))
    assert reply.choices[0].message.content == "hello"
    usage = run.outcome.usage
    assert (usage.model_calls, usage.input_tokens, usage.cache_read_tokens) == (1, 600, 400)
    assert usage.cost_usd == pytest.approx((600 * 2.0 + 400 * 0.2 + 100 * 8.0) / 1e6)


@pytest.mark.parametrize("shell", CALLS)
def test_litellm_alone_retries_and_tether_retries_once(server: ScriptedServer, shell: str) -> None:
    """503 always: LiteLLM alone makes 3 attempts (its SDK's retries); tether's policy
    around it alone would make 4 x 3; under the adapter, 4 (one layer)."""
    server.handler = lambda seen: overloaded()
    with pytest.raises(litellm.ServiceUnavailableError):
        litellm.completion(messages=HI, **direct(server))
    alone = attempts(server)
    assert alone == 3

    server.requests.clear()
    with pytest.raises(litellm.ServiceUnavailableError):
        POLICY.call(lambda: litellm.completion(messages=HI, **direct(server)))
    assert attempts(server) == 4 * alone  # two retry layers

    server.requests.clear()
    with guard().start("hi") as run, pytest.raises(Stopped):
        CALLS[shell](run, messages=HI, policy=POLICY, **direct(server))
    assert attempts(server) == 4
    assert run.outcome.stopped_because is StopReason.ERROR
    assert run.outcome.usage.retries == 3


def test_a_router_alone_retries_and_under_a_retry_policy_multiplies(
    server: ScriptedServer,
) -> None:
    """A Router with num_retries=1 (its own loop, with its own sleeps): 2 attempts alone;
    tether's policy around it, unguarded, makes two layers: 4 x 2."""
    server.handler = lambda seen: overloaded()
    with pytest.raises(litellm.ServiceUnavailableError):
        router(server, num_retries=1).completion(model=MODEL, messages=HI)
    alone = attempts(server)
    assert alone == 2

    server.requests.clear()
    r = router(server, num_retries=1)
    with pytest.raises(litellm.ServiceUnavailableError):
        POLICY.call(lambda: r.completion(model=MODEL, messages=HI))
    assert attempts(server) == 4 * alone


@pytest.mark.parametrize("shell", ROUTED)
def test_a_router_under_tether_makes_one_retry_layer(
    server: ScriptedServer, shell: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A Router with num_retries=3 (4 attempts alone) under the adapter: its retries are
    off (said once per Router) and tether's 4 attempts are all."""
    server.handler = lambda seen: overloaded()
    r = router(server, num_retries=3)
    with caplog.at_level(logging.WARNING, logger="tether"), guard().start("hi") as run:
        guarded = guarded_router(r, run, POLICY)
        guarded_router(r, run, POLICY)  # the warning is said once per Router
        with pytest.raises(Stopped):
            ROUTED[shell](guarded, model=MODEL, messages=HI)
    assert attempts(server) == 4
    assert run.outcome.usage.retries == 3
    assert sum("num_retries=3" in m for m in caplog.messages) == 1


@pytest.mark.parametrize("shell", ROUTED)
def test_a_router_s_transient_failure_is_retried_by_tether(
    server: ScriptedServer, shell: str
) -> None:
    """Two 503s then a reply: 3 attempts, 2 retries counted, the reply's usage counted once."""
    failing_then_ok(server, 2)
    with guard().start("hi") as run:
        reply = ROUTED[shell](
            guarded_router(router(server, num_retries=5), run, POLICY), model=MODEL, messages=HI
        )
    assert reply.choices[0].message.content == "hello"
    assert attempts(server) == 3
    assert (run.outcome.usage.retries, run.outcome.usage.model_calls) == (2, 1)


@pytest.mark.parametrize("shell", CALLS)
def test_the_cost_budget_stops_before_the_request(server: ScriptedServer, shell: str) -> None:
    """A request whose worst case passes the budget is not sent."""
    server.handler = lambda seen: ok()
    with guard(max_cost_usd=0.001).start("hi") as run, pytest.raises(Stopped):
        CALLS[shell](run, messages=HI, max_tokens=1000, **direct(server))
    assert attempts(server) == 0
    assert run.outcome.stopped_because is StopReason.MAX_COST


def test_a_model_the_guard_does_not_price_costs_litellm_s_response_cost(
    server: ScriptedServer,
) -> None:
    """No tether price, no cost budget: the cost is LiteLLM's ``response_cost``."""
    server.handler = lambda seen: ok("gpt-4o")
    with Guard(budget=Budget(max_steps=5)).start("hi") as run:
        reply = completion(
            run, messages=HI, model="openai/gpt-4o", api_base=server.url + "/v1", api_key="k"
        )
    cost = reply._hidden_params["response_cost"]
    assert cost > 0
    assert run.outcome.usage.cost_usd == pytest.approx(cost)


def test_litellm_s_exceptions_are_classified() -> None:
    """LiteLLM's exception types carry the provider's status: classified as the status says."""

    def make(cls: Any, **kw: Any) -> Any:
        return cls(message="x", llm_provider="openai", model=MODEL, **kw)

    assert classify(make(litellm.RateLimitError)).retryable
    assert classify(make(litellm.ServiceUnavailableError)).retryable
    assert classify(make(litellm.InternalServerError)).retryable
    assert not classify(make(litellm.AuthenticationError)).retryable
    assert not classify(make(litellm.NotFoundError)).retryable
    assert not classify(make(litellm.ContextWindowExceededError)).retryable


def test_the_usage_reader_reads_a_cache_write() -> None:
    """An Anthropic reply through LiteLLM: the cache write is out of the uncached input."""
    reply = litellm.ModelResponse(
        model="claude-sonnet-5-5",
        usage={
            "prompt_tokens": 1000,
            "completion_tokens": 10,
            "total_tokens": 1010,
            "cache_creation_input_tokens": 300,
            "prompt_tokens_details": {"cached_tokens": 200},
        },
    )
    usage = litellm_usage(reply)
    assert usage is not None
    assert (usage.input_tokens, usage.cache_write_tokens, usage.cache_read_tokens) == (
        500,
        300,
        200,
    )


def streamed(model: str = MODEL, usage: bool = True) -> bytes:
    """:func:`ok` as OpenAI streams it: two deltas, the finish, then (asked for) the usage."""
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": model}
    deltas = [{"role": "assistant", "content": "hel"}, {"content": "lo"}]
    chunks = [
        {**head, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas
    ]
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    if usage:
        chunks.append({**head, "choices": [], "usage": ok(model).body["usage"]})
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + (
        b"data: [DONE]\n\n"
    )


def stream_reply(model: str = MODEL, **options: Any) -> Reply:
    return Reply(200, raw=streamed(model), content_type="text/event-stream", **options)


def read(stream: Any) -> str:
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


async def aread(stream: Any) -> str:
    return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


def stream_completion(run: Any, shell: str, **kw: Any) -> Any:
    """A streamed request read to its end; the stream."""
    if shell == "sync":
        stream = completion(run, stream=True, **kw)
        assert read(stream) == "hello"
        return stream

    async def go() -> Any:
        stream = await acompletion(run, stream=True, **kw)
        assert await aread(stream) == "hello"
        return stream

    return asyncio.run(go())


def stream_routed(r: Any, shell: str, **kw: Any) -> Any:
    if shell == "sync":
        stream = r.completion(stream=True, **kw)
        assert read(stream) == "hello"
        return stream

    async def go() -> Any:
        stream = await r.acompletion(stream=True, **kw)
        assert await aread(stream) == "hello"
        return stream

    return asyncio.run(go())


@pytest.mark.parametrize("shell", CALLS)
@pytest.mark.parametrize("model", [MODEL, "gpt-4o"])
def test_a_stream_counts_the_same_usage_and_price_as_a_whole_reply(
    server: ScriptedServer, shell: str, model: str
) -> None:
    """One request read whole, one streamed: the same model call, tokens and cost (tether's
    price for a model the guard prices, LiteLLM's ``response_cost`` for one it does not);
    the stream was asked for its usage."""
    target = {"model": f"openai/{model}", "api_base": server.url + "/v1", "api_key": "k"}
    server.handler = lambda seen: ok(model)
    with guard().start("hi") as whole:
        CALLS[shell](whole, messages=HI, policy=POLICY, **target)
    server.handler = lambda seen: stream_reply(model)
    with guard().start("hi") as run:
        stream = stream_completion(run, shell, messages=HI, policy=POLICY, **target)
    assert not stream.truncated
    assert server.requests[-1].body["stream_options"] == {"include_usage": True}
    got, want = run.outcome.usage, whole.outcome.usage
    assert (got.model_calls, got.input_tokens, got.output_tokens, got.cache_read_tokens) == (
        1, 600, 100, 400,
    )  # fmt: skip
    assert (got.input_tokens, got.output_tokens) == (want.input_tokens, want.output_tokens)
    assert got.cost_usd == pytest.approx(want.cost_usd) and got.cost_usd > 0


@pytest.mark.parametrize("shell", ROUTED)
def test_a_router_s_stream_is_one_turn_with_its_usage(server: ScriptedServer, shell: str) -> None:
    """``guarded_router(...).completion(stream=True)``: counted as the whole reply would be."""
    server.handler = lambda seen: stream_reply()
    with guard().start("hi") as run:
        stream_routed(guarded_router(router(server, num_retries=2), run, POLICY), shell,
                      model=MODEL, messages=HI)  # fmt: skip
    assert attempts(server) == 1
    usage = run.outcome.usage
    assert (usage.model_calls, usage.input_tokens, usage.output_tokens) == (1, 600, 100)
    assert usage.cost_usd == pytest.approx((600 * 2.0 + 400 * 0.2 + 100 * 8.0) / 1e6)


@pytest.mark.parametrize("shell", CALLS)
def test_a_stream_refused_before_its_first_chunk_is_retried_once_by_tether(
    server: ScriptedServer, shell: str
) -> None:
    """A 503 before any chunk: tether retries (one layer: LiteLLM's retries off), the
    stream then arrives whole and is counted once."""
    failing = {"i": 0}

    def handler(seen: Any) -> Reply:
        failing["i"] += 1
        return overloaded() if failing["i"] == 1 else stream_reply()

    server.handler = handler
    with guard().start("hi") as run:
        stream_completion(run, shell, messages=HI, policy=POLICY, **direct(server))
    assert attempts(server) == 2
    usage = run.outcome.usage
    assert (usage.retries, usage.model_calls, usage.output_tokens) == (1, 1, 100)


@pytest.mark.parametrize("shell", CALLS)
def test_a_stream_that_breaks_midway_is_truncated_not_replayed(
    server: ScriptedServer, shell: str
) -> None:
    """The connection drops after the first chunk: the stream ends ``truncated`` with the
    error, no second request, and the call is counted (its usage never came: unmeasured,
    never free)."""
    body = streamed()
    server.handler = lambda seen: Reply(
        200, raw=body, content_type="text/event-stream", cut_after=body.index(b"data:", 10)
    )
    with guard().start("hi") as run:
        if shell == "sync":
            stream = completion(run, stream=True, messages=HI, policy=POLICY, **direct(server))
            text = read(stream)
        else:

            async def go() -> tuple[Any, str]:
                s = await acompletion(run, stream=True, messages=HI, policy=POLICY,
                                      **direct(server))  # fmt: skip
                return s, await aread(s)

            stream, text = asyncio.run(go())
    assert text == "hel"
    assert stream.truncated and stream.error is not None
    assert attempts(server) == 1
    assert run.outcome.usage.model_calls == 1
    assert run.outcome.usage.unpriced_calls == 1


@pytest.mark.parametrize("shell", CALLS)
def test_a_stream_s_worst_case_stops_before_the_request(server: ScriptedServer, shell: str) -> None:
    """The turn reserves before a stream is sent: a worst case past the budget sends none."""
    server.handler = lambda seen: stream_reply()
    with guard(max_cost_usd=0.001).start("hi") as run, pytest.raises(Stopped):
        stream_completion(run, shell, messages=HI, max_tokens=1000, **direct(server))
    assert attempts(server) == 0
    assert run.outcome.stopped_because is StopReason.MAX_COST


# --- TetherLogger: LiteLLM's Router as the caller ---------------------------------------------


#: one logger in LiteLLM's process-wide callbacks, as a user installs it (LiteLLM copies its
#: callbacks into lists of its own on first use: a second instance would not be called)
LOGGER = TetherLogger()


@pytest.fixture
def logger() -> TetherLogger:
    if LOGGER not in litellm.callbacks:
        litellm.callbacks = [*litellm.callbacks, LOGGER]
    manager = litellm.logging_callback_manager  # where LiteLLM's own setup registers them
    manager.add_litellm_success_callback(LOGGER)
    manager.add_litellm_async_success_callback(LOGGER)
    manager.add_litellm_failure_callback(LOGGER)
    manager.add_litellm_async_failure_callback(LOGGER)
    return LOGGER


def routed_through(
    logger: TetherLogger, run: Any, r: Any, shell: str, model: str = MODEL, **kw: Any
) -> Any:
    """``router.completion`` / ``acompletion`` inside ``logger.serving(run)``; the events
    LiteLLM logs after the reply awaited (they run after the call returns)."""
    if shell == "sync":
        with logger.serving(run):
            try:
                return r.completion(model=model, messages=HI, **kw)
            finally:
                settle(logger)

    async def go() -> Any:
        with logger.serving(run):
            try:
                return await r.acompletion(model=model, messages=HI, **kw)
            finally:
                for _ in range(200):  # LiteLLM logs in tasks of its own
                    if not logger._held:
                        break
                    await asyncio.sleep(0.01)

    return asyncio.run(go())


def settle(logger: TetherLogger) -> None:
    for _ in range(200):  # a sync call's events run in LiteLLM's logging threads
        if not logger._held:
            return
        time.sleep(0.01)


@pytest.mark.parametrize("shell", ROUTED)
def test_the_logger_counts_a_router_s_reply_at_tether_s_price(
    server: ScriptedServer, logger: TetherLogger, shell: str
) -> None:
    """A Router as the caller, the logger in its callbacks: the reply is one model call of
    the run, its usage counted and priced at tether's table."""
    server.handler = lambda seen: ok()
    with guard().start("hi") as run:
        routed_through(logger, run, router(server), shell)
    usage = run.outcome.usage
    assert (usage.model_calls, usage.input_tokens, usage.cache_read_tokens) == (1, 600, 400)
    assert usage.cost_usd == pytest.approx((600 * 2.0 + 400 * 0.2 + 100 * 8.0) / 1e6)


@pytest.mark.parametrize("shell", ROUTED)
def test_the_logger_stops_a_request_past_the_budget_before_it_is_sent(
    server: ScriptedServer, logger: TetherLogger, shell: str
) -> None:
    """A request whose worst case passes the cost budget: the Router's call raises
    ``Stopped`` from the pre-call hook and nothing reaches the provider."""
    server.handler = lambda seen: ok()
    deployment = {"model_name": MODEL, "litellm_params": {**direct(server), "max_tokens": 1000}}
    r = Router(model_list=[deployment], retry_after=0)
    with guard(max_cost_usd=0.001).start("hi") as run, pytest.raises(Stopped):
        routed_through(logger, run, r, shell, max_tokens=1000)
    assert attempts(server) == 0
    assert run.outcome.stopped_because is StopReason.MAX_COST


@pytest.mark.parametrize("shell", ROUTED)
def test_the_logger_s_failure_events_open_tether_s_breaker(
    server: ScriptedServer, logger: TetherLogger, shell: str
) -> None:
    """503 every time, the Router retrying on its own (num_retries=7: 8 attempts alone).
    Each failed attempt feeds the provider's breaker (threshold: twice the guard's 2
    attempts; the guard's clock virtual, so no probe is due). Async, an attempt's failure
    is told in the request's path: the fifth attempt is refused before it is sent (8 → 4).
    Sync, LiteLLM logs it from a thread of its own, after the Router may have retried: the
    breaker is open after the request all the same, and the next request is refused with
    nothing sent."""
    server.handler = lambda seen: overloaded()
    with pytest.raises(litellm.ServiceUnavailableError):
        router(server, num_retries=7).completion(model=MODEL, messages=HI)
    assert attempts(server) == 8  # alone

    server.requests.clear()
    g = Guard(budget=Budget(max_steps=30), prices=PRICES, retry=RetryPolicy(max_attempts=2),
              store=MemoryStore(), clock=VirtualClock())  # fmt: skip
    with g.start("hi") as run, pytest.raises(Exception):
        routed_through(logger, run, router(server, num_retries=7), shell)
    if shell == "async":
        assert attempts(server) == 4
    else:
        assert 4 <= attempts(server) <= 8
    with g.start("probe") as probe:
        assert probe.model_turn(MODEL).breaker.state == "open"
    server.requests.clear()
    with g.start("hi") as run, pytest.raises(CircuitOpenError):
        routed_through(logger, run, router(server), shell)
    assert attempts(server) == 0


@pytest.mark.parametrize("shell", ROUTED)
def test_the_logger_stops_the_run_on_a_permanent_failure(
    server: ScriptedServer, logger: TetherLogger, shell: str
) -> None:
    """A 401 (tether classifies it as permanent): the run stops with its reason."""
    server.handler = lambda seen: Reply(401, {"error": {"message": "bad key", "type": "auth"}})
    with guard().start("hi") as run, pytest.raises(litellm.AuthenticationError):
        routed_through(logger, run, router(server), shell)
    assert run.outcome.stopped_because is not None
    assert run.outcome.stopped_because is not StopReason.GOAL_REACHED


@pytest.mark.parametrize("shell", ROUTED)
def test_the_logger_reserves_the_prompt_s_estimate_before_the_request(
    server: ScriptedServer, logger: TetherLogger, shell: str
) -> None:
    """A Router's request under a fleet token budget: its prompt's estimate is reserved in
    the budget before it is sent, on a sync Router too (before: LiteLLM gives the sync
    ``pre_call_check`` the deployment only, so the turn had no estimate and the token
    budget reserved nothing; LiteLLM gives the messages to ``log_pre_api_call``, just
    before it sends the request)."""
    budget = TokenBudget("openai", store=MemoryStore(), input_tokens_per_minute=100_000)
    server.handler = lambda seen: ok()
    g = Guard(budget=Budget(max_steps=30), prices=PRICES, token_budget=budget)
    with g.start("hi") as run:
        routed_through(logger, run, router(server), shell)
    assert budget.reserved == 1  # a turn without an estimate reserves nothing in it
    assert (run.outcome.usage.model_calls, attempts(server)) == (1, 1)
