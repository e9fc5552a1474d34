"""The real anthropic and openai SDKs, guarded, against a scripted API on loopback."""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any

import anthropic
import openai
import pytest

import tether
from scripted_server import Reply, ScriptedServer, Seen
from tether import Budget, Guard, RetryPolicy, StopReason, Tool, VirtualClock
from tether.integrations import anthropic as t_anthropic
from tether.integrations import openai as t_openai


def claude_message(
    content: list[dict[str, Any]], stop: str = "end_turn", usage: tuple[int, int] = (100, 20)
) -> dict[str, Any]:
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
            "content": content, "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1]}}  # fmt: skip


def gpt_completion(
    message: dict[str, Any], finish: str = "stop", usage: tuple[int, int] = (100, 20)
) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "gpt-4o-mini",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}}  # fmt: skip


def search_call_claude(i: int = 1) -> dict[str, Any]:
    return claude_message([{"type": "tool_use", "id": f"tu_{i}", "name": "search", "input": {"q": "invoice 99"}}],
                          stop="tool_use")  # fmt: skip


def search_call_gpt(i: int = 1, arguments: str = '{"q": "invoice 99"}') -> dict[str, Any]:
    return gpt_completion({"content": None, "tool_calls": [{"id": f"call_{i}", "type": "function",
                           "function": {"name": "search", "arguments": arguments}}]}, finish="tool_calls")  # fmt: skip


def claude(server: ScriptedServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="test", base_url=server.url)


def gpt(server: ScriptedServer) -> openai.OpenAI:
    return openai.OpenAI(api_key="test", base_url=server.url + "/v1")


def fast_guard(**kw: Any) -> Guard:
    kw.setdefault("clock", VirtualClock())
    return Guard(retry=RetryPolicy(max_attempts=3, base=0.01, cap=0.05), **kw)


# --- one retry layer ---------------------------------------------------------------------


def test_three_attempts_make_three_requests_not_nine(server: ScriptedServer) -> None:
    """The SDK's own retries are off: 3 attempts against a 529 wall are 3 HTTP requests."""
    server.default = Reply(
        529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    )
    with claude(server) as raw:
        client = t_anthropic.guarded(raw, policy=RetryPolicy(max_attempts=3, clock=VirtualClock()))
        with pytest.raises(anthropic.APIStatusError):
            client.messages.create(
                model="claude-haiku-4-5",
                max_tokens=10,
                messages=[{"role": "user", "content": "hi"}],
            )
    assert len(server.requests) == 3
    keys = {r.headers.get("idempotency-key") for r in server.requests}
    assert len(keys) == 1
    assert None not in keys


def test_retry_after_ms_is_honoured(server: ScriptedServer) -> None:
    """A 429 with retry-after-ms is waited (on the policy's clock), then the call succeeds."""
    server.script = [Reply(429, {"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}},
                           {"retry-after-ms": "2500"}),
                     Reply(200, claude_message([{"type": "text", "text": "hello"}]))]  # fmt: skip
    clock = VirtualClock()
    with claude(server) as raw:
        client = t_anthropic.guarded(raw, policy=RetryPolicy(jitter="none", base=0.1, clock=clock))
        reply = client.messages.create(
            model="claude-haiku-4-5", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    assert reply.content[0].text == "hello"
    assert clock.now() == pytest.approx(2.5)


def test_quota_is_not_retried(server: ScriptedServer) -> None:
    """A spend limit is raised after one request."""
    server.default = Reply(
        429,
        {"error": {"message": "quota", "type": "insufficient_quota", "code": "insufficient_quota"}},
    )
    with gpt(server) as raw:
        client = t_openai.guarded(raw, policy=RetryPolicy(clock=VirtualClock()))
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
            )
    assert len(server.requests) == 1


def test_usage_is_counted_into_the_run(server: ScriptedServer) -> None:
    """Input, output and cache tokens go into the run's budget, priced by model."""
    server.default = Reply(200, claude_message([{"type": "text", "text": "ok"}], usage=(1000, 200)))
    guard = fast_guard()
    with claude(server) as raw, guard.start() as run:
        client = t_anthropic.guarded(raw, run=run)
        run.proceed()
        client.messages.create(
            model="claude-haiku-4-5", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
        run.succeed()
    usage = run.outcome.usage
    assert (usage.model_calls, usage.input_tokens, usage.output_tokens) == (1, 1000, 200)
    assert usage.cost_usd == pytest.approx((1000 * 1 + 200 * 5) / 1e6)


# --- the stuck agent -----------------------------------------------------------------------


def test_stuck_agent_through_claude_stops_after_two_executions(server: ScriptedServer) -> None:
    """The model asks for search("invoice 99") every turn: two executions, then REPEATED_ACTION."""
    server.handler = lambda seen: Reply(200, search_call_claude(len(server.requests)))
    executed = []

    def search(q: str) -> dict[str, Any]:
        """Search the invoices."""
        executed.append(q)
        return {"results": []}

    with claude(server) as raw:
        outcome = t_anthropic.run_agent(raw, model="claude-haiku-4-5", messages=[{"role": "user", "content": "find invoice 99"}],
                                        tools=[Tool("search", search)], guard=fast_guard())  # fmt: skip
    assert executed == ["invoice 99", "invoice 99"]
    assert outcome.stopped_because is StopReason.REPEATED_ACTION
    second = server.requests[1].body
    results = second["messages"][-1]["content"]
    assert results[0]["type"] == "tool_result"
    assert json.loads(results[0]["content"]) == {"results": []}
    assert server.requests[0].body["tools"][0]["input_schema"]["properties"] == {
        "q": {"type": "string"}
    }


def test_stuck_agent_through_gpt_stops_after_two_executions(server: ScriptedServer) -> None:
    """The same through the OpenAI SDK."""
    server.handler = lambda seen: Reply(200, search_call_gpt(len(server.requests)))
    executed = []

    def search(q: str) -> dict[str, Any]:
        executed.append(q)
        return {"results": []}

    with gpt(server) as raw:
        outcome = t_openai.run_agent(raw, model="gpt-4o-mini", messages=[{"role": "user", "content": "find invoice 99"}],
                                     tools=[Tool("search", search)], guard=fast_guard())  # fmt: skip
    assert executed == ["invoice 99", "invoice 99"]
    assert outcome.stopped_because is StopReason.REPEATED_ACTION
    tool_msg = server.requests[1].body["messages"][-1]
    assert tool_msg == {"role": "tool", "tool_call_id": "call_1", "content": '{"results": []}'}


def test_agent_finishes_with_an_answer(server: ScriptedServer) -> None:
    """A tool call, then a reply with no tool use: success with the text."""
    server.script = [Reply(200, search_call_claude()),
                     Reply(200, claude_message([{"type": "text", "text": "Invoice 99 is paid."}]))]  # fmt: skip
    with claude(server) as raw:
        outcome = t_anthropic.run_agent(raw, model="claude-haiku-4-5", messages=[{"role": "user", "content": "x"}],
                                        tools=[Tool("search", lambda q: {"paid": True})], guard=fast_guard())  # fmt: skip
    assert (outcome.status, outcome.result) == ("success", "Invoice 99 is paid.")
    assert outcome.usage.model_calls == 2


def test_run_agent_takes_its_client_by_keyword_too(server: ScriptedServer) -> None:
    """``run_agent(client=..., ...)`` works as ``run_agent(client, ...)`` does."""
    server.script = [Reply(200, claude_message([{"type": "text", "text": "done"}]))]
    with claude(server) as raw:
        outcome = t_anthropic.run_agent(
            client=raw,
            model="claude-haiku-4-5",
            messages=[{"role": "user", "content": "x"}],
            guard=fast_guard(),
        )
    assert (outcome.status, outcome.result) == ("success", "done")
    assert list(inspect.signature(t_openai.arun_agent).parameters)[:2] == ["client", "model"]


def test_max_tokens_is_never_an_answer(server: ScriptedServer) -> None:
    """Cut at max_tokens: one retry with twice the limit, then TRUNCATED."""
    server.default = Reply(
        200, claude_message([{"type": "text", "text": "The answer is"}], stop="max_tokens")
    )
    with claude(server) as raw:
        outcome = t_anthropic.run_agent(raw, model="claude-haiku-4-5", messages=[{"role": "user", "content": "x"}],
                                        guard=fast_guard(), max_tokens=100)  # fmt: skip
    assert outcome.stopped_because is StopReason.TRUNCATED
    assert [r.body["max_tokens"] for r in server.requests] == [100, 200]


def test_length_and_content_filter_through_gpt(server: ScriptedServer) -> None:
    """finish_reason length is TRUNCATED, content_filter is REFUSED."""
    server.default = Reply(200, gpt_completion({"content": "partial"}, finish="length"))
    with gpt(server) as raw:
        out = t_openai.run_agent(
            raw,
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "x"}],
            guard=fast_guard(),
        )
    assert out.stopped_because is StopReason.TRUNCATED
    server.default = Reply(200, gpt_completion({"content": None}, finish="content_filter"))
    with gpt(server) as raw:
        out = t_openai.run_agent(
            raw,
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "x"}],
            guard=fast_guard(),
        )
    assert out.stopped_because is StopReason.REFUSED


def test_refusal_through_claude(server: ScriptedServer) -> None:
    """stop_reason refusal ends the run with REFUSED."""
    server.default = Reply(200, claude_message([], stop="refusal"))
    with claude(server) as raw:
        out = t_anthropic.run_agent(
            raw,
            model="claude-haiku-4-5",
            messages=[{"role": "user", "content": "x"}],
            guard=fast_guard(),
        )
    assert (out.status, out.stopped_because) == ("failed", StopReason.REFUSED)


def test_malformed_tool_arguments_become_a_tool_error(server: ScriptedServer) -> None:
    """Arguments that are not JSON go back as a tool error and count as identical failures."""
    server.handler = lambda seen: Reply(
        200, search_call_gpt(len(server.requests), arguments="{not json")
    )
    with gpt(server) as raw:
        out = t_openai.run_agent(raw, model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}],
                                 tools=[Tool("search", lambda q: q)], guard=fast_guard())  # fmt: skip
    assert out.stopped_because is StopReason.IDENTICAL_FAILURES
    assert (
        server.requests[1]
        .body["messages"][-1]["content"]
        .startswith("error: rejected: the tool arguments")
    )


def test_tool_errors_go_back_as_is_error(server: ScriptedServer) -> None:
    """A business-rule rejection reaches the model as an is_error tool result; the side
    effect was not done, so the run never ends "success" (#40: the same ending as in a
    framework that raises the tool's exception), the model's answer kept as its result."""
    server.script = [Reply(200, claude_message([{"type": "tool_use", "id": "tu_1", "name": "refund",
                                                 "input": {"order": "A-1"}}], stop="tool_use")),
                     Reply(200, claude_message([{"type": "text", "text": "I could not refund it."}]))]  # fmt: skip

    def refund(order: str) -> None:
        raise ValueError("refund exceeds the original charge")

    with claude(server) as raw:
        out = t_anthropic.run_agent(raw, model="claude-haiku-4-5", messages=[{"role": "user", "content": "x"}],
                                    tools=[Tool("refund", refund, idempotent=False)], guard=fast_guard())  # fmt: skip
    result = server.requests[1].body["messages"][-1]["content"][0]
    assert result["is_error"] is True
    assert "refund exceeds the original charge" in result["content"]
    assert (out.status, out.stopped_because) == ("failed", StopReason.PERMANENT_ERROR)
    assert out.result == "I could not refund it."
    assert out.error == "ValueError: refund exceeds the original charge"


def test_budget_stops_before_the_next_model_call(server: ScriptedServer) -> None:
    """max_model_calls: the run never makes the call that would break it."""
    server.handler = lambda seen: Reply(200, claude_message([{"type": "tool_use", "id": "tu", "name": "search",
                                                              "input": {"q": f"page {len(server.requests)}"}}],
                                                            stop="tool_use"))  # fmt: skip
    with claude(server) as raw:
        out = t_anthropic.run_agent(raw, model="claude-haiku-4-5", messages=[{"role": "user", "content": "x"}],
                                    tools=[Tool("search", lambda q: {"hit": q})],
                                    guard=fast_guard(budget=Budget(max_model_calls=3)))  # fmt: skip
    assert out.stopped_because is StopReason.MAX_MODEL_CALLS
    assert len(server.requests) == 3


def test_permanent_model_error_fails_the_run(server: ScriptedServer) -> None:
    """A 401 ends the run as failed with PERMANENT_ERROR after one request."""
    server.default = Reply(
        401, {"type": "error", "error": {"type": "authentication_error", "message": "bad key"}}
    )
    with claude(server) as raw:
        out = t_anthropic.run_agent(
            raw,
            model="claude-haiku-4-5",
            messages=[{"role": "user", "content": "x"}],
            guard=fast_guard(),
        )
    assert (out.status, out.stopped_because) == ("failed", StopReason.PERMANENT_ERROR)
    assert len(server.requests) == 1


def test_async_clients(server: ScriptedServer) -> None:
    """AsyncAnthropic and AsyncOpenAI are guarded the same way."""
    server.default = Reply(
        529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    )

    async def main() -> None:
        async with anthropic.AsyncAnthropic(api_key="t", base_url=server.url) as raw:
            client = t_anthropic.guarded(
                raw, policy=RetryPolicy(max_attempts=2, clock=VirtualClock())
            )
            with pytest.raises(anthropic.APIStatusError):
                await client.messages.create(
                    model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
                )
        server.default = Reply(200, gpt_completion({"content": "hi"}))
        async with openai.AsyncOpenAI(api_key="t", base_url=server.url + "/v1") as raw_gpt:
            gclient = t_openai.guarded(raw_gpt)
            done = await gclient.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}]
            )
            assert done.choices[0].message.content == "hi"

    asyncio.run(main())
    assert len(server.requests) == 3


def test_tool_schema_from_type_hints() -> None:
    """When input_schema is omitted it comes from the function's hints."""

    def refund(order: str, amount: int, reason: str = "", tags: list[str] | None = None) -> None:
        """Refund an order."""

    tool = Tool("refund", refund)
    assert tool.description == "Refund an order."
    assert tool.schema == {"type": "object", "required": ["order", "amount"],
                           "properties": {"order": {"type": "string"}, "amount": {"type": "integer"},
                                          "reason": {"type": "string"},
                                          "tags": {"type": "array", "items": {"type": "string"}}}}  # fmt: skip


def test_other_attributes_pass_through(server: ScriptedServer) -> None:
    """Anything but the guarded endpoints is the SDK's own."""
    with claude(server) as raw:
        client = t_anthropic.guarded(raw)
        assert client.api_key == "test"
        assert client.raw.max_retries == 0


_ = (Seen, tether)


def _sse(events: list[dict[str, Any]]) -> bytes:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


STREAM = [
    {"type": "message_start", "message": {"id": "msg_s", "type": "message", "role": "assistant",
     "model": "claude-haiku-4-5", "content": [], "stop_reason": None, "stop_sequence": None,
     "usage": {"input_tokens": 10, "output_tokens": 1}}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " there"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 5}},
    {"type": "message_stop"},
]  # fmt: skip


def test_stream_broken_before_the_first_event_is_retried(server: ScriptedServer) -> None:
    """A 529 before any event: retried; the stream then arrives whole and its usage is counted."""
    server.script = [Reply(529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
                     Reply(200, raw=_sse(STREAM), content_type="text/event-stream")]  # fmt: skip
    guard = fast_guard()
    with claude(server) as raw, guard.start() as run:
        client = t_anthropic.guarded(raw, run=run)
        run.proceed()
        stream = client.messages.create(model="claude-haiku-4-5", max_tokens=10, stream=True,
                                        messages=[{"role": "user", "content": "hi"}])  # fmt: skip
        types = [event.type for event in stream]
        run.succeed()
    assert types == [e["type"] for e in STREAM]
    assert not stream.truncated
    assert len(server.requests) == 2
    assert (run.outcome.usage.input_tokens, run.outcome.usage.output_tokens) == (10, 5)


def test_stream_broken_after_content_is_truncated_not_replayed(server: ScriptedServer) -> None:
    """The connection drops mid-stream: the reply is marked truncated, no second request."""
    body = _sse(STREAM)
    cut = body.index(b"event: content_block_stop")
    server.script = [Reply(200, raw=body, content_type="text/event-stream", cut_after=cut)]
    with claude(server) as raw:
        client = t_anthropic.guarded(raw, policy=RetryPolicy(clock=VirtualClock()))
        stream = client.messages.create(model="claude-haiku-4-5", max_tokens=10, stream=True,
                                        messages=[{"role": "user", "content": "hi"}])  # fmt: skip
        texts = [e.delta.text for e in stream if e.type == "content_block_delta"]
    assert texts == ["Hello", " there"]
    assert stream.truncated
    assert stream.error is not None
    assert len(server.requests) == 1


def test_a_guarded_client_takes_its_token_budget_in_its_old_place() -> None:
    """``GuardedAnthropic(client, policy, run, token_budget)`` as before fallbacks= came."""
    import anthropic

    from tether.integrations.anthropic import GuardedAnthropic

    budget = tether.TokenBudget("anthropic", "claude", requests_per_minute=50)
    client = GuardedAnthropic(anthropic.Anthropic(api_key="x"), None, None, budget)
    assert client.token_budgets == (budget,)
