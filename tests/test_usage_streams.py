"""A reply read whole and the same reply streamed give one usage and one price, for every
provider shape the guarded clients read (the real SDKs against a loopback server), sync and
async."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anthropic
import openai
import pytest

import tether
from scripted_server import Reply, ScriptedServer
from tether.integrations import anthropic as t_anthropic
from tether.integrations import openai as t_openai

MODEL_CLAUDE = "claude-haiku-4-5"
MODEL_GPT = "gpt-6.1-terra"


def _sse(events: list[dict[str, Any]], named: bool = True, done: bool = False) -> bytes:
    text = "".join(
        (f"event: {e['type']}\n" if named else "") + f"data: {json.dumps(e)}\n\n" for e in events
    )
    return (text + ("data: [DONE]\n\n" if done else "")).encode()


# --- the three shapes: (whole reply, streamed reply, the usage both must give) ----------

CLAUDE_USAGE = {"input_tokens": 2000, "cache_creation_input_tokens": 500,
                "cache_read_input_tokens": 8000, "output_tokens": 200}  # fmt: skip
CLAUDE_WHOLE = {"id": "msg_1", "type": "message", "role": "assistant", "model": MODEL_CLAUDE,
                "content": [{"type": "text", "text": "Hi"}], "stop_reason": "end_turn",
                "stop_sequence": None, "usage": CLAUDE_USAGE}  # fmt: skip
CLAUDE_STREAM = [
    {"type": "message_start", "message": {**CLAUDE_WHOLE, "content": [], "stop_reason": None,
                                          "usage": {**CLAUDE_USAGE, "output_tokens": 1}}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
     "usage": {"output_tokens": 200}},
    {"type": "message_stop"},
]  # fmt: skip

CHAT_USAGE = {"prompt_tokens": 10000, "completion_tokens": 200, "total_tokens": 10200,
              "prompt_tokens_details": {"cached_tokens": 8000}}  # fmt: skip
CHAT_WHOLE = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": MODEL_GPT,
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"},
                           "finish_reason": "stop"}], "usage": CHAT_USAGE}  # fmt: skip
CHAT_STREAM = [
    {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": MODEL_GPT,
     "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}, "finish_reason": None}]},
    {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": MODEL_GPT,
     "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": MODEL_GPT,
     "choices": [], "usage": CHAT_USAGE},
]  # fmt: skip

RESP_USAGE = {"input_tokens": 10000, "input_tokens_details": {"cached_tokens": 8000},
              "output_tokens": 200, "output_tokens_details": {"reasoning_tokens": 0},
              "total_tokens": 10200}  # fmt: skip
RESP_WHOLE = {"id": "resp_1", "object": "response", "created_at": 0, "model": MODEL_GPT,
              "status": "completed", "parallel_tool_calls": True, "tool_choice": "auto",
              "tools": [], "output": [{"type": "message", "id": "m1", "role": "assistant",
                                       "status": "completed", "content": [
                                           {"type": "output_text", "text": "Hi", "annotations": []}]}],
              "usage": RESP_USAGE}  # fmt: skip
RESP_STREAM = [
    {"type": "response.created", "sequence_number": 0,
     "response": {**RESP_WHOLE, "status": "in_progress", "output": [], "usage": None}},
    {"type": "response.output_text.delta", "sequence_number": 1, "item_id": "m1",
     "output_index": 0, "content_index": 0, "delta": "Hi", "logprobs": []},
    {"type": "response.completed", "sequence_number": 2, "response": RESP_WHOLE},
]  # fmt: skip

# what the price reads: (uncached input, output, cache write, cache read)
WANT = {
    "anthropic": (MODEL_CLAUDE, (2000, 200, 500, 8000)),
    "chat": (MODEL_GPT, (2000, 200, 0, 8000)),
    "responses": (MODEL_GPT, (2000, 200, 0, 8000)),
}
WHOLE = {"anthropic": CLAUDE_WHOLE, "chat": CHAT_WHOLE, "responses": RESP_WHOLE}
STREAMED = {
    "anthropic": _sse(CLAUDE_STREAM),
    "chat": _sse(CHAT_STREAM, named=False, done=True),
    "responses": _sse(RESP_STREAM),
}


def _request(client: Any, shape: str, stream: bool) -> Any:
    if shape == "anthropic":
        return client.messages.create(model=MODEL_CLAUDE, max_tokens=300, stream=stream,
                                      messages=[{"role": "user", "content": "hi"}])  # fmt: skip
    if shape == "chat":
        return client.chat.completions.create(model=MODEL_GPT, max_completion_tokens=300,
                                              stream=stream, messages=[{"role": "user", "content": "hi"}])  # fmt: skip
    return client.responses.create(
        model=MODEL_GPT, input="hi", max_output_tokens=300, stream=stream
    )


def _raw(server: ScriptedServer, shape: str, is_async: bool) -> Any:
    if shape == "anthropic":
        kind: Any = anthropic.AsyncAnthropic if is_async else anthropic.Anthropic
        return kind(api_key="test", base_url=server.url, max_retries=0)
    kind = openai.AsyncOpenAI if is_async else openai.OpenAI
    return kind(api_key="test", base_url=server.url + "/v1", max_retries=0)


def _usage(outcome: tether.Outcome) -> tuple[int, int, int, int, int, float | None]:
    u = outcome.usage
    return (u.model_calls, u.input_tokens, u.output_tokens, u.cache_write_tokens,
            u.cache_read_tokens, u.cost_usd)  # fmt: skip


def _sync(server: ScriptedServer, shape: str, stream: bool) -> tether.Outcome:
    provider = t_anthropic if shape == "anthropic" else t_openai
    raw = _raw(server, shape, False)
    with raw, tether.Guard().start(task="t") as run:
        reply = _request(provider.guarded(raw, run=run), shape, stream)
        if stream:
            for _ in reply:
                pass
        run.succeed("done")
    return run.outcome


def _async(server: ScriptedServer, shape: str, stream: bool) -> tether.Outcome:
    provider = t_anthropic if shape == "anthropic" else t_openai

    async def main() -> tether.Outcome:
        raw = _raw(server, shape, True)
        async with raw, tether.Guard().start(task="t") as run:
            reply = await _request(provider.guarded(raw, run=run), shape, stream)
            if stream:
                async for _ in reply:
                    pass
            run.succeed("done")
        return run.outcome

    return asyncio.run(main())


@pytest.mark.parametrize("shell", [_sync, _async], ids=["sync", "async"])
@pytest.mark.parametrize("shape", ["anthropic", "chat", "responses"])
def test_a_streamed_reply_costs_what_the_whole_reply_costs(
    server: ScriptedServer, shape: str, shell: Any
) -> None:
    """Same usage, same price, streamed or not: cached tokens priced as cached (OpenAI's sit
    inside its prompt count), a Responses stream counted from its response.completed event."""
    model, (inp, out, cw, cr) = WANT[shape]
    price = tether.PriceTable().cost(model, inp, out, cw, cr)
    want = (1, inp, out, cw, cr, pytest.approx(price))
    server.script = [Reply(200, WHOLE[shape])]
    assert _usage(shell(server, shape, False)) == want
    server.script = [Reply(200, raw=STREAMED[shape], content_type="text/event-stream")]
    assert _usage(shell(server, shape, True)) == want


# --- a request priced before it is sent ------------------------------------------------


def _spend(run: tether.Run, usd: float) -> None:
    """Count a model call of ``usd`` (gpt-6.1-terra's output price: $5 a million)."""
    run.record_model_call(model=MODEL_GPT, output_tokens=round(usd / 5.0 * 1_000_000))


def test_a_request_whose_max_tokens_could_pass_the_cost_budget_is_not_sent(
    server: ScriptedServer, tmp_path: Any
) -> None:
    """$0.04 of $0.05 spent, then paused; resumed from its checkpoint (no earlier calls to
    extrapolate from), a request with max_tokens=4000 (up to $0.02) stops MAX_COST unsent;
    one with max_tokens=1000 (up to $0.005) is sent."""
    server.default = Reply(
        200, CHAT_WHOLE | {"usage": {"prompt_tokens": 10, "completion_tokens": 10}}
    )
    guard = tether.Guard(budget=tether.Budget(max_cost_usd=0.05),
                         checkpoints=tether.Checkpoints.sqlite(str(tmp_path / "runs.db")))  # fmt: skip
    with guard.start(task="t") as run:
        _spend(run, 0.04)  # and the run ends unfinished: a checkpoint to resume from
    ckpt = run.outcome.checkpoint_id
    assert ckpt is not None
    raw = openai.OpenAI(api_key="test", base_url=server.url + "/v1", max_retries=0)
    with raw, guard.resume(ckpt) as resumed:
        client = t_openai.guarded(raw, run=resumed)
        client.chat.completions.create(model=MODEL_GPT, max_completion_tokens=1000,
                                       messages=[{"role": "user", "content": "hi"}])  # fmt: skip
        with pytest.raises(tether.Stopped):
            client.chat.completions.create(model=MODEL_GPT, max_completion_tokens=4000,
                                           messages=[{"role": "user", "content": "hi"}])  # fmt: skip
    assert len(server.requests) == 1
    assert resumed.outcome.stopped_because is tether.StopReason.MAX_COST
    assert "could cost up to $0.0200" in resumed.outcome.detail


def test_a_priced_request_is_checked_in_the_async_shell_too(server: ScriptedServer) -> None:
    """The async guarded client: the run's first request, priced past the budget, is not sent."""

    async def main() -> tether.Outcome:
        raw = openai.AsyncOpenAI(api_key="test", base_url=server.url + "/v1", max_retries=0)
        guard = tether.Guard(budget=tether.Budget(max_cost_usd=0.01))
        async with raw, guard.start(task="t") as run:
            client = t_openai.guarded(raw, run=run)
            with pytest.raises(tether.Stopped):
                await client.responses.create(model=MODEL_GPT, input="hi", max_output_tokens=4000)
        return run.outcome

    outcome = asyncio.run(main())
    assert server.requests == []
    assert outcome.stopped_because is tether.StopReason.MAX_COST
