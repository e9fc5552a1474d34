"""A guarded SDK client in the user's own loop: ``tether.integrations.openai.guarded(client,
run=run)`` (the real OpenAI SDK over loopback), ``run.proceed()`` before each request and
``run.call_tool`` for each tool call, as docs/run.md writes the loop; replies read whole or
streamed (``stream=True``, usage in the last chunk)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

from conformance.adapters.sdk_loop import OpenAILoop
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

    def options(self, tool: Tool) -> dict[str, Any]:
        return {"idempotent": tool.idempotent, "requires_approval": tool.requires_approval,
                "hands_over": tool.hands_over}  # fmt: skip

    def sync(self, run: Run, client: Any, stream: bool) -> None:
        while run.proceed():
            if stream:
                said: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": []}
                for chunk in client.chat.completions.create(**self.ask(True)):
                    self.add(said, chunk)
            else:
                said = self.read(client.chat.completions.create(**self.ask(False)))
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
                async for chunk in await client.chat.completions.create(**self.ask(True)):
                    self.add(said, chunk)
            else:
                said = self.read(await client.chat.completions.create(**self.ask(False)))
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


class GuardedClient(Adapter):
    id = "openai-guarded"
    name = "OpenAI SDK guarded client in your own loop: `openai.guarded(client, run=run)`"
    reasks_after_resume = True  # a resumed run is a new loop: the model asks again
    not_applicable: ClassVar[dict[Cell, str]] = {
        Cell.NESTED: "a guarded client is one model's requests: the SDK has no handoff or "
        "nested agent (a second loop under the same run counts in it as any request)",
    }

    def _go(self, world: World, guard: Guard, mode: Mode, rules: dict[str, Any],
            resume: str | None = None) -> Any:  # fmt: skip
        import openai

        from tether.integrations import openai as t_openai

        stream = mode == "stream"

        def answer(seen: Any) -> Reply:
            if not stream:
                return answered(world, OpenAILoop().reply)
            try:
                return Reply(200, raw=_sse(world.next_turn()), content_type="text/event-stream")
            except Overloaded:
                return Reply(503, {"error": {"type": "overloaded_error", "message": "overloaded"}})

        loop = _Loop(world, rules, mode == "async")
        if resume is not None:
            loop.messages = list(self.messages)
        self.loop = loop
        with ScriptedServer() as server:
            server.handler = answer
            url = server.url + "/v1"

            def start() -> Any:
                if resume:
                    return guard.resume(resume)
                return guard.start("refund A-1", key=rules.get("key"))

            if mode != "async":
                with openai.OpenAI(api_key="t", base_url=url) as raw, start() as run:
                    loop.sync(run, t_openai.guarded(raw, run=run), stream)
            else:

                async def main() -> Run:
                    async with openai.AsyncOpenAI(api_key="t", base_url=url) as raw, start() as run:
                        await loop.asynchronous(run, t_openai.guarded(raw, run=run), False)
                    return run

                run = asyncio.run(main())
        self.messages = loop.messages
        return run.outcome

    def run(self, world: World, guard: Guard, mode: Mode, **rules: Any) -> Any:
        return self._go(world, guard, mode, rules)

    def resume(self, world: World, guard: Guard, paused: Any, mode: Mode, **rules: Any) -> Any:
        return self._go(world, guard, mode, rules, resume=paused.checkpoint_id)
