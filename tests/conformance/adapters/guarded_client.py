"""A guarded SDK client in the user's own loop: ``tether.integrations.openai.guarded(client,
run=run)`` (the real OpenAI SDK over loopback), ``run.proceed()`` before each request and
``run.call_tool`` for each tool call, as docs/run.md writes the loop; replies read whole or
streamed (``stream=True``, usage in the last chunk)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

from conformance.adapters.sdk_loop import AnthropicLoop, OpenAILoop
from conformance.adapters.sdk_loop import answer as answered
from conformance.suite import (
    INPUT_TOKENS,
    OUTPUT_TOKENS,
    Adapter,
    Cell,
    Mode,
    Overloaded,
    Turn,
    World,
)
from scripted_server import Reply, ScriptedServer
from tether import Guard, Run, Stopped, Tool, ToolError

MODEL = "gpt-4o-mini"


def _sse(turn: Turn) -> bytes:
    """The reply as OpenAI streams it: deltas, the finish, then a chunk with the usage."""
    head = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
    if isinstance(turn, str):
        delta: dict[str, Any] = {"role": "assistant", "content": turn}
    else:
        delta = {"role": "assistant", "tool_calls": [
            {"index": i, "id": f"call_{i}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(dict(c.args))}}
            for i, c in enumerate(turn)]}  # fmt: skip
    finish = "stop" if isinstance(turn, str) else "tool_calls"
    usage = {"prompt_tokens": INPUT_TOKENS, "completion_tokens": OUTPUT_TOKENS,
             "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS}  # fmt: skip
    chunks = [{**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
              {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
              {**head, "choices": [], "usage": usage}]  # fmt: skip
    return (
        b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    )


def _claude_sse(turn: Turn) -> bytes:
    """The reply as Anthropic streams it: message_start (input tokens), the blocks, then
    message_delta with the output tokens."""
    whole = AnthropicLoop().reply(turn)
    start = {**whole, "content": [], "stop_reason": None,
             "usage": {"input_tokens": INPUT_TOKENS, "output_tokens": 1}}  # fmt: skip
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for i, block in enumerate(whole["content"]):
        if block["type"] == "text":
            opened, delta = (
                {"type": "text", "text": ""},
                {"type": "text_delta", "text": block["text"]},
            )
        else:
            opened = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events += [{"type": "content_block_start", "index": i, "content_block": opened},
                   {"type": "content_block_delta", "index": i, "delta": delta},
                   {"type": "content_block_stop", "index": i}]  # fmt: skip
    events += [{"type": "message_delta", "delta": {"stop_reason": whole["stop_reason"],
                                                   "stop_sequence": None},
                "usage": {"output_tokens": OUTPUT_TOKENS}},
               {"type": "message_stop"}]  # fmt: skip
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


class _Loop:
    """The user's loop over one run: the tools as ``tether.Tool`` (their options on them)."""

    def __init__(self, world: World, rules: dict[str, Any], asynchronous: bool) -> None:
        from conformance.adapters.sdk_loop import tools

        self.tools = {t.name: t for t in tools(world, asynchronous, rules)}
        self.schemas = [{"type": "function", "function": {"name": t.name, "description": "",
                         "parameters": t.schema}} for t in self.tools.values()]  # fmt: skip
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": "refund A-1"}]

    def ask(self, stream: bool) -> dict[str, Any]:
        ask: dict[str, Any] = {"model": MODEL, "messages": self.messages, "tools": self.schemas}
        if stream:
            ask.update(stream=True, stream_options={"include_usage": True})
        return ask

    @staticmethod
    def read(reply: Any) -> dict[str, Any]:
        message = reply.choices[0].message
        calls = [{"id": c.id, "type": "function",
                  "function": {"name": c.function.name, "arguments": c.function.arguments}}
                 for c in message.tool_calls or ()]  # fmt: skip
        return {"role": "assistant", "content": message.content, "tool_calls": calls}

    @staticmethod
    def add(said: dict[str, Any], chunk: Any) -> None:
        for choice in chunk.choices:
            said["content"] = (said["content"] or "") + (choice.delta.content or "") or None
            for c in choice.delta.tool_calls or ():
                while len(said["tool_calls"]) <= c.index:
                    said["tool_calls"].append({"id": "", "type": "function",
                                               "function": {"name": "", "arguments": ""}})  # fmt: skip
                into = said["tool_calls"][c.index]
                into["id"] = c.id or into["id"]
                into["function"]["name"] += c.function.name or ""
                into["function"]["arguments"] += c.function.arguments or ""

    def answered(self, run: Run, said: dict[str, Any]) -> bool:
        """The reply joins the conversation; True when it is the answer (the run succeeds)."""
        if not said["tool_calls"]:
            run.succeed(said["content"])
            return True
        self.messages.append(said)
        return False

    def told(self, call: dict[str, Any], result: Any) -> None:
        self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(result)})

    def create(self, client: Any) -> Any:
        return client.chat.completions.create

    def options(self, tool: Tool) -> dict[str, Any]:
        return {"idempotent": tool.idempotent, "requires_approval": tool.requires_approval,
                "hands_over": tool.hands_over}  # fmt: skip

    def sync(self, run: Run, client: Any, stream: bool) -> None:
        while run.proceed():
            if stream:
                said: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": []}
                for chunk in self.create(client)(**self.ask(True)):
                    self.add(said, chunk)
            else:
                said = self.read(self.create(client)(**self.ask(False)))
            if self.answered(run, said):
                return
            for call in said["tool_calls"]:
                tool = self.tools[call["function"]["name"]]
                args = json.loads(call["function"]["arguments"])
                try:
                    result = run.call_tool(tool.name, tool.fn, args, **self.options(tool))
                except ToolError as exc:
                    result = exc.model_message
                self.told(call, result)

    async def asynchronous(self, run: Run, client: Any, stream: bool) -> None:
        while run.proceed():
            if stream:
                said: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": []}
                async for chunk in await self.create(client)(**self.ask(True)):
                    self.add(said, chunk)
            else:
                said = self.read(await self.create(client)(**self.ask(False)))
            if self.answered(run, said):
                return

            async def one(call: dict[str, Any]) -> Any:
                tool = self.tools[call["function"]["name"]]
                args = json.loads(call["function"]["arguments"])
                try:
                    return await run.acall_tool(tool.name, tool.fn, args, **self.options(tool))
                except ToolError as exc:
                    return exc.model_message

            calls = said["tool_calls"]  # in parallel, as the model asked
            results = await asyncio.gather(*map(one, calls), return_exceptions=True)
            for call, result in zip(calls, results, strict=True):
                if isinstance(result, Stopped):
                    raise result
                self.told(call, result)


class _ClaudeLoop(_Loop):
    """The same loop in Anthropic's message format: content blocks, tool results in a user
    message; its replies read into the same shape as OpenAI's."""

    def __init__(self, world: World, rules: dict[str, Any], asynchronous: bool) -> None:
        super().__init__(world, rules, asynchronous)
        self.schemas = [{"name": t.name, "description": "", "input_schema": t.schema}
                        for t in self.tools.values()]  # fmt: skip

    def ask(self, stream: bool) -> dict[str, Any]:
        ask = {"model": "claude-haiku-4-5", "max_tokens": 256, "messages": self.messages,
               "tools": self.schemas}  # fmt: skip
        return {**ask, "stream": True} if stream else ask

    @staticmethod
    def read(reply: Any) -> dict[str, Any]:
        text = "".join(b.text for b in reply.content if b.type == "text") or None
        calls = [{"id": b.id, "type": "function",
                  "function": {"name": b.name, "arguments": json.dumps(b.input)}}
                 for b in reply.content if b.type == "tool_use"]  # fmt: skip
        return {"role": "assistant", "content": text, "tool_calls": calls}

    @staticmethod
    def add(said: dict[str, Any], event: Any) -> None:
        if event.type == "content_block_start" and event.content_block.type == "tool_use":
            said["tool_calls"].append({"id": event.content_block.id, "type": "function",
                                       "function": {"name": event.content_block.name,
                                                    "arguments": ""}})  # fmt: skip
        elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
            said["tool_calls"][-1]["function"]["arguments"] += event.delta.partial_json
        elif event.type == "content_block_delta" and event.delta.type == "text_delta":
            said["content"] = (said["content"] or "") + event.delta.text

    def answered(self, run: Run, said: dict[str, Any]) -> bool:
        if not said["tool_calls"]:
            run.succeed(said["content"])
            return True
        blocks = [{"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                   "input": json.loads(c["function"]["arguments"] or "{}")}
                  for c in said["tool_calls"]]  # fmt: skip
        self.messages.append({"role": "assistant", "content": blocks})
        return False

    def told(self, call: dict[str, Any], result: Any) -> None:
        block = {"type": "tool_result", "tool_use_id": call["id"], "content": str(result)}
        last = self.messages[-1]
        if last["role"] == "user" and isinstance(last["content"], list):
            last["content"].append(block)  # the turn's results, in one message
        else:
            self.messages.append({"role": "user", "content": [block]})

    def create(self, client: Any) -> Any:
        return client.messages.create


class GuardedClient(Adapter):
    id = "openai-guarded"
    name = "OpenAI SDK guarded client in your own loop: `openai.guarded(client, run=run)`"
    reasks_after_resume = True  # a resumed run is a new loop: the model asks again
    not_applicable: ClassVar[dict[Cell, str]] = {
        Cell.NESTED: "a guarded client is one model's requests: the SDK has no handoff or "
        "nested agent (a second loop under the same run counts in it as any request)",
    }

    def provider(self) -> tuple[Any, Any, Any, Any, type[_Loop]]:
        """The SDK's sync and async clients, tether's module, the reply maker and the loop."""
        import openai

        from tether.integrations import openai as t_openai

        return openai.OpenAI, openai.AsyncOpenAI, t_openai, OpenAILoop().reply, _Loop

    def stream(self, turn: Turn) -> bytes:
        return _sse(turn)

    def base_url(self, url: str) -> str:
        return url + "/v1"

    def _go(self, world: World, guard: Guard, mode: Mode, rules: dict[str, Any],
            resume: str | None = None) -> Any:  # fmt: skip
        client, aclient, module, reply, kind = self.provider()
        stream = mode == "stream"

        def answer(seen: Any) -> Reply:
            if not stream:
                return answered(world, reply)
            try:
                return Reply(
                    200, raw=self.stream(world.next_turn()), content_type="text/event-stream"
                )
            except Overloaded:
                return Reply(503, {"error": {"type": "overloaded_error", "message": "overloaded"}})

        loop = kind(world, rules, mode == "async")
        if resume is not None:
            loop.messages = list(self.messages)
        with ScriptedServer() as server:
            server.handler = answer
            url = self.base_url(server.url)

            def start() -> Any:
                if resume:
                    return guard.resume(resume)
                return guard.start("refund A-1", key=rules.get("key"))

            if mode != "async":
                with client(api_key="t", base_url=url) as raw, start() as run:
                    loop.sync(run, module.guarded(raw, run=run), stream)
            else:

                async def main() -> Run:
                    async with aclient(api_key="t", base_url=url) as raw, start() as run:
                        await loop.asynchronous(run, module.guarded(raw, run=run), False)
                    return run

                run = asyncio.run(main())
        self.messages = loop.messages
        return run.outcome

    def run(self, world: World, guard: Guard, mode: Mode, **rules: Any) -> Any:
        return self._go(world, guard, mode, rules)

    def resume(self, world: World, guard: Guard, paused: Any, mode: Mode, **rules: Any) -> Any:
        return self._go(world, guard, mode, rules, resume=paused.checkpoint_id)


class GuardedClaude(GuardedClient):
    id = "anthropic-guarded"
    name = "Anthropic SDK guarded client in your own loop: `anthropic.guarded(client, run=run)`"

    def provider(self) -> tuple[Any, Any, Any, Any, type[_Loop]]:
        import anthropic

        from tether.integrations import anthropic as t_anthropic

        return (
            anthropic.Anthropic,
            anthropic.AsyncAnthropic,
            t_anthropic,
            AnthropicLoop().reply,
            _ClaudeLoop,
        )

    def stream(self, turn: Turn) -> bytes:
        return _claude_sse(turn)

    def base_url(self, url: str) -> str:
        return url
