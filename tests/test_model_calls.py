"""The model side of the loop, with the real SDKs against a scripted server on loopback."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import anthropic
import openai
import pytest

import tether
from scripted_server import Reply, ScriptedServer
from tether import Budget, Guard, Price, PriceTable, RetryPolicy, StopReason, Tool, VirtualClock
from tether.integrations import anthropic as t_anthropic
from tether.integrations import openai as t_openai

USER = [{"role": "user", "content": "refund order A-1"}]


def claude_reply(content: list[dict[str, Any]], stop: str = "end_turn", model: str = "claude-haiku-4-5",
                 usage: tuple[int, int] = (1000, 200)) -> dict[str, Any]:  # fmt: skip
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1]}}  # fmt: skip


def gpt_reply(message: dict[str, Any], finish: str = "stop", model: str = "gpt-6.1-sol",
              usage: tuple[int, int] = (1000, 200)) -> dict[str, Any]:  # fmt: skip
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}}  # fmt: skip


def text(answer: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": answer}]


def overloaded() -> Reply:
    return Reply(
        529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    )


def fast_guard(**kw: Any) -> Guard:
    kw.setdefault("clock", VirtualClock())
    kw.setdefault("retry", RetryPolicy(max_attempts=3, base=0.01, cap=0.05))
    return Guard(**kw)


def claude(server: ScriptedServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="test", base_url=server.url)


def gpt(server: ScriptedServer) -> openai.OpenAI:
    return openai.OpenAI(api_key="test", base_url=server.url + "/v1")


def fast_client(client: Any, provider: Any) -> Any:
    """A guarded client whose retries wait virtual time (and a breaker of its own)."""
    breaker = tether.CircuitBreaker(
        f"test:{id(client)}", failure_threshold=10, clock=VirtualClock()
    )
    return provider.guarded(client, policy=RetryPolicy(max_attempts=5, base=0.01, cap=0.05,
                                                       breaker=breaker, clock=VirtualClock()))  # fmt: skip


# --- 1. any model name -----------------------------------------------------------------

TODAY = [("claude-sonnet-4-6", "anthropic"), ("claude-opus-4-6", "anthropic"),
         ("claude-sonnet-5-5", "anthropic"), ("gpt-6.1-sol", "openai"), ("gpt-6.1-terra", "openai")]  # fmt: skip


@pytest.mark.parametrize(("model", "provider"), TODAY)
def test_todays_model_names_work(server: ScriptedServer, model: str, provider: str) -> None:
    """The models of today end in success with a priced cost (genai-prices), also without a budget."""
    if provider == "anthropic":
        server.default = Reply(200, claude_reply(text("done"), model=model))
        with claude(server) as raw:
            out = t_anthropic.run_agent(raw, model=model, messages=USER, guard=fast_guard())
    else:
        server.default = Reply(200, gpt_reply({"content": "done"}, model=model))
        with gpt(server) as raw:
            out = t_openai.run_agent(raw, model=model, messages=USER, guard=fast_guard())
    assert (out.status, out.result) == ("success", "done")
    assert out.usage.cost_usd > 0
    assert out.usage.unpriced_calls == 0


def test_an_unpriced_model_counts_tokens_not_cost(
    server: ScriptedServer, caplog: pytest.LogCaptureFixture
) -> None:
    """No price: tokens counted, cost unknown (not zero), one warning per model."""
    server.default = Reply(200, claude_reply(text("done"), model="acme-private-7"))
    with caplog.at_level(logging.WARNING, logger="tether"), claude(server) as raw:
        for _ in range(2):
            out = t_anthropic.run_agent(
                raw, model="acme-private-7", messages=USER, guard=fast_guard()
            )
    assert out.status == "success"
    assert (out.usage.input_tokens, out.usage.unpriced_calls, out.usage.cost_usd) == (1000, 1, 0.0)
    assert (
        len([r for r in caplog.records if "no price for model 'acme-private-7'" in r.getMessage()])
        == 1
    )


def test_a_cost_budget_refuses_an_unpriced_model_before_the_first_request(
    server: ScriptedServer,
) -> None:
    """max_cost_usd and a model with no price: an error naming the model, and no request sent."""
    server.default = Reply(200, claude_reply(text("done"), model="acme-private-7"))
    with (
        claude(server) as raw,
        pytest.raises(tether.UnknownModelError, match=r"acme-private-7.*PriceTable"),
    ):
        t_anthropic.run_agent(raw, model="acme-private-7", messages=USER,
                              guard=fast_guard(budget=Budget(max_cost_usd=0.5)))  # fmt: skip
    assert server.requests == []


def test_own_prices_extend_the_shipped_ones() -> None:
    """PriceTable({...}) adds to the shipped prices instead of replacing them."""
    table = PriceTable({"acme-private-7": Price(1.0, 2.0)})
    assert table.cost("acme-private-7", 1_000_000, 1_000_000) == 3.0
    assert table.cost("claude-haiku-4-5", 1_000_000, 0) == pytest.approx(1.0)


def test_prefixes_never_price_a_sibling_model() -> None:
    """The tether table matches dated snapshots, never gpt-4o-transcribe as gpt-4o."""
    table = PriceTable(source="tether", unknown="error")
    assert table.cost("claude-haiku-4-5-20251001", 1_000_000, 0) == 1.0
    assert table.cost("gpt-4o", 1_000_000, 0) == 2.5
    with pytest.raises(tether.UnknownModelError, match="gpt-4o-transcribe"):
        table.cost("gpt-4o-transcribe", 1_000_000, 0)


def test_zero_for_unknown_models_warns_under_a_cost_budget(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """unknown="zero" with a cost budget: allowed, with a warning that the budget cannot hold."""
    guard = Guard(budget=Budget(max_cost_usd=1.0), prices=PriceTable(unknown="zero"))
    with caplog.at_level(logging.WARNING, logger="tether"), guard.start() as run:
        run.check_model("acme-private-7")
        run.succeed()
    assert any("cost budget cannot hold" in r.getMessage() for r in caplog.records)


# --- 2. async agents -------------------------------------------------------------------


def test_arun_agent_awaits_async_tools_and_threads_sync_ones(server: ScriptedServer) -> None:
    """AsyncAnthropic: an async tool is awaited, a sync tool runs off the loop."""
    server.script = [Reply(200, claude_reply([{"type": "tool_use", "id": "tu_1", "name": "lookup",
                                               "input": {"order": "A-1"}},
                                              {"type": "tool_use", "id": "tu_2", "name": "refund",
                                               "input": {"order": "A-1"}}], stop="tool_use")),
                     Reply(200, claude_reply(text("refunded")))]  # fmt: skip
    seen: list[str] = []

    async def lookup(order: str) -> dict[str, str]:
        await asyncio.sleep(0)
        seen.append("lookup")
        return {"order": order, "paid": "yes"}

    def refund(order: str) -> dict[str, str]:
        seen.append(threading.current_thread().name)
        return {"id": "re_1"}

    async def main() -> tether.Outcome:
        async with anthropic.AsyncAnthropic(api_key="test", base_url=server.url) as raw:
            return await t_anthropic.arun_agent(raw, model="claude-haiku-4-5", messages=USER,
                                                tools=[Tool("lookup", lookup), Tool("refund", refund, idempotent=False)],
                                                guard=fast_guard())  # fmt: skip

    out = asyncio.run(main())
    assert (out.status, out.result) == ("success", "refunded")
    assert seen[0] == "lookup" and seen[1] != threading.main_thread().name
    results = server.requests[1].body["messages"][-1]["content"]
    assert [r["content"] for r in results] == ['{"order": "A-1", "paid": "yes"}', '{"id": "re_1"}']


def test_openai_arun_agent(server: ScriptedServer) -> None:
    """AsyncOpenAI: the same loop, async."""
    server.script = [Reply(200, gpt_reply({"content": None, "tool_calls": [{"id": "c1", "type": "function",
                           "function": {"name": "lookup", "arguments": '{"order": "A-1"}'}}]}, finish="tool_calls")),
                     Reply(200, gpt_reply({"content": "found it"}))]  # fmt: skip

    async def lookup(order: str) -> str:
        return f"order {order}: paid"

    async def main() -> tether.Outcome:
        async with openai.AsyncOpenAI(api_key="test", base_url=server.url + "/v1") as raw:
            return await t_openai.arun_agent(raw, model="gpt-6.1-sol", messages=USER, tools=[Tool("lookup", lookup)],
                                             guard=fast_guard())  # fmt: skip

    out = asyncio.run(main())
    assert (out.status, out.result) == ("success", "found it")
    assert server.requests[1].body["messages"][-1] == {"role": "tool", "tool_call_id": "c1",
                                                       "content": "order A-1: paid"}  # fmt: skip


def test_arun_agent_with_a_sync_client_says_so(server: ScriptedServer) -> None:
    """A sync client given to arun_agent is a clear TypeError."""
    with claude(server) as raw, pytest.raises(TypeError, match="AsyncAnthropic"):
        asyncio.run(t_anthropic.arun_agent(raw, model="claude-haiku-4-5", messages=USER))


# --- 3. the conversation comes back ----------------------------------------------------


def test_outcome_messages_continue_a_chat(server: ScriptedServer) -> None:
    """outcome.messages holds every turn; append the customer's next message and run again."""
    server.script = [Reply(200, claude_reply([{"type": "tool_use", "id": "tu_1", "name": "lookup",
                                               "input": {"order": "A-1"}}], stop="tool_use")),
                     Reply(200, claude_reply(text("Order A-1 was paid. Refund it?"))),
                     Reply(200, claude_reply(text("Refunded.")))]  # fmt: skip
    tools = [Tool("lookup", lambda order: {"paid": True})]
    with claude(server) as raw:
        first = t_anthropic.run_agent(
            raw, model="claude-haiku-4-5", messages=USER, tools=tools, guard=fast_guard()
        )
        roles = [m["role"] for m in first.messages]
        assert roles == ["user", "assistant", "user", "assistant"]
        nxt = [*first.messages, {"role": "user", "content": "yes please"}]
        second = t_anthropic.run_agent(
            raw, model="claude-haiku-4-5", messages=nxt, tools=tools, guard=fast_guard()
        )
    assert second.result == "Refunded."
    assert len(server.requests[2].body["messages"]) == 5
    assert [m["role"] for m in second.messages] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
    ]


# --- 4. the run's time budget bounds model-call retries --------------------------------


def test_a_retry_after_past_the_time_budget_stops_at_once(server: ScriptedServer) -> None:
    """max_seconds=5 and a 429 asking for 20 s: TIMEOUT now, no wait, no second request."""
    server.default = Reply(429, {"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}},
                           headers={"retry-after": "20"})  # fmt: skip
    clock = VirtualClock()
    guard = Guard(clock=clock, budget=Budget(max_seconds=5))
    with claude(server) as raw:
        client = t_anthropic.guarded(raw, policy=RetryPolicy(max_attempts=4, clock=clock))
        out = t_anthropic.run_agent(client, model="claude-haiku-4-5", messages=USER, guard=guard)
    assert out.stopped_because is StopReason.TIMEOUT
    assert len(server.requests) == 1
    assert out.usage.seconds < 5


# --- 5. the provider breaker -----------------------------------------------------------


def test_one_calls_retries_never_open_the_provider_breaker(server: ScriptedServer) -> None:
    """Five 529s inside one call: the next run against a healthy server succeeds."""
    server.script = [overloaded() for _ in range(5)]
    server.default = Reply(200, claude_reply(text("ok")))
    with claude(server) as raw:
        client = t_anthropic.guarded(raw)
        breaker = client.policy.breaker
        assert breaker is not None and breaker.name == f"anthropic:{server.url}"
        client = t_anthropic.guarded(raw, policy=client.policy.replace(base=0.001, cap=0.002))
        first = t_anthropic.run_agent(
            client, model="claude-haiku-4-5", messages=USER, guard=Guard()
        )
        second = t_anthropic.run_agent(
            client, model="claude-haiku-4-5", messages=USER, guard=Guard()
        )
    assert first.stopped_because is StopReason.ERROR
    assert len(server.requests) == 6
    assert (second.status, breaker.state) == ("success", "closed")


def test_an_open_provider_breaker_stops_circuit_open(server: ScriptedServer) -> None:
    """An open provider breaker and no time to wait for its probe: CIRCUIT_OPEN, 0 requests."""
    clock = VirtualClock()
    breaker = tether.CircuitBreaker(
        "anthropic:test-open", failure_threshold=1, cooldown=60.0, clock=clock, probe_interval=None
    )
    with pytest.raises(TimeoutError):
        breaker.call(lambda: (_ for _ in ()).throw(TimeoutError()))
    with claude(server) as raw:
        client = t_anthropic.guarded(raw, policy=RetryPolicy(breaker=breaker, clock=clock))
        out = t_anthropic.run_agent(client, model="claude-haiku-4-5", messages=USER,
                                    guard=Guard(clock=clock, budget=Budget(max_seconds=30)))  # fmt: skip
    assert out.stopped_because is StopReason.CIRCUIT_OPEN
    assert server.requests == []


def test_an_open_provider_breaker_is_waited_out_when_time_allows(server: ScriptedServer) -> None:
    """With time left and a probe within outage_wait (10 s), the run waits for the probe,
    which succeeds."""
    clock = VirtualClock()
    breaker = tether.CircuitBreaker(
        "anthropic:test-wait", failure_threshold=1, cooldown=8.0, clock=clock, probe_interval=None
    )
    with pytest.raises(TimeoutError):
        breaker.call(lambda: (_ for _ in ()).throw(TimeoutError()))
    server.default = Reply(200, claude_reply(text("ok")))
    with claude(server) as raw:
        client = t_anthropic.guarded(raw, policy=RetryPolicy(breaker=breaker, clock=clock))
        out = t_anthropic.run_agent(client, model="claude-haiku-4-5", messages=USER,
                                    guard=Guard(clock=clock, budget=Budget(max_seconds=60)))  # fmt: skip
    assert out.status == "success"
    assert 8 <= out.usage.seconds < 10
    assert len(server.requests) == 1


# --- 6. OpenAI parameters --------------------------------------------------------------


def test_openai_sends_max_completion_tokens_only(server: ScriptedServer) -> None:
    """Chat completions get max_completion_tokens (never max_tokens, never null)."""
    server.default = Reply(200, gpt_reply({"content": "ok"}))
    with gpt(server) as raw:
        t_openai.run_agent(raw, model="o3", messages=USER, guard=fast_guard())
        t_openai.run_agent(raw, model="o3", messages=USER, guard=fast_guard(), max_tokens=None)
        t_openai.run_agent(
            raw, model="o3", messages=USER, guard=fast_guard(), max_completion_tokens=50
        )
    bodies = [r.body for r in server.requests]
    assert [b.get("max_completion_tokens") for b in bodies] == [1024, None, 50]
    assert all("max_tokens" not in b for b in bodies)
    assert "max_completion_tokens" not in bodies[1]


# --- 7. counting and tracing -----------------------------------------------------------


def test_model_call_retries_are_counted(server: ScriptedServer) -> None:
    """Two 529s then an answer: usage.retries == 2."""
    server.script = [overloaded(), overloaded()]
    server.default = Reply(200, claude_reply(text("ok")))
    with claude(server) as raw:
        out = t_anthropic.run_agent(fast_client(raw, t_anthropic), model="claude-haiku-4-5",
                                    messages=USER, guard=fast_guard())  # fmt: skip
    assert (out.status, out.usage.retries) == ("success", 2)


def test_retry_policy_outside_a_run_makes_spans(otel: Any) -> None:
    """One span per call, one child per attempt, resend count and verdict as attributes."""
    exporter, _ = otel
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError()
        return "ok"

    assert (
        RetryPolicy(max_attempts=5, base=0.0, name="payments", clock=VirtualClock()).call(flaky)
        == "ok"
    )
    spans = exporter.get_finished_spans()
    call = next(s for s in spans if s.name == "tether.retry payments")
    attempts = [s for s in spans if s.name == "tether.attempt"]
    assert len(attempts) == 3
    assert all(s.parent is not None and s.parent.span_id == call.context.span_id for s in attempts)
    assert [s.attributes.get("http.request.resend_count") for s in attempts] == [None, 1, 2]
    assert attempts[0].attributes["tether.verdict"] == "transient"
    assert (call.attributes["tether.attempts"], call.attributes["http.request.resend_count"],
            call.attributes["tether.verdict"]) == (3, 2, "success")  # fmt: skip


# --- 8. the outcome mid-run, and run.fail ----------------------------------------------


def test_outcome_mid_run_is_an_error_and_fail_ends_the_run() -> None:
    """run.outcome before the run ends raises; run.fail(reason) ends it as failed."""
    with Guard().start() as run:
        run.proceed()
        with pytest.raises(RuntimeError, match="has not ended"):
            _ = run.outcome
        run.fail("the customer has no such order")
    assert (run.outcome.status, run.outcome.stopped_because) == ("failed", StopReason.FAILED)
    assert "no such order" in run.outcome.detail


def test_outcome_error_keeps_the_providers_words(server: ScriptedServer) -> None:
    """A 400 ends the run with the provider's message in outcome.error, not just "HTTP 400"."""
    server.default = Reply(400, {"type": "error", "error": {"type": "invalid_request_error",
                           "message": "Unsupported parameter: 'max_tokens'; use 'max_completion_tokens'"}})  # fmt: skip
    with claude(server) as raw:
        out = t_anthropic.run_agent(
            raw, model="claude-haiku-4-5", messages=USER, guard=fast_guard()
        )
    assert out.stopped_because is StopReason.PERMANENT_ERROR
    assert out.error is not None and "max_completion_tokens" in out.error
    assert out.error.startswith("BadRequestError")
