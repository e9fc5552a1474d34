"""``run_agent`` / ``arun_agent`` of tether.integrations.anthropic and .openai: the real SDK
clients, over loopback to a server answering from the script."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, ClassVar

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
from tether import Guard, Tool

NO_STREAM = (
    "run_agent has no streaming entry point: it reads whole replies (streamed replies of a "
    "guarded client are counted alike: the guarded client's row)"
)
NO_NESTING = "run_agent is one model's loop: the SDKs have no handoff or nested agent"


def tools(world: World, asynchronous: bool, rules: dict[str, Any]) -> list[Tool]:
    """The world's tools as ``tether.Tool`` (run_agent's per-tool options live on them)."""
    effects = set(rules.get("side_effects") or ())
    approval = dict(rules.get("requires_approval") or {})
    handing = set(rules.get("hand_over") or ())
    return [
        Tool(
            fn.__name__,
            fn,
            idempotent=fn.__name__ not in effects,
            requires_approval=approval.get(fn.__name__, False),
            hands_over=fn.__name__ in handing,
        )
        for fn in world.tools(asynchronous)
    ]


def answer(world: World, reply: Callable[[Turn], dict[str, Any]]) -> Reply:
    """The loopback server's answer to a request: the next turn, or a 503 when it is busy."""
    try:
        return Reply(200, reply(world.next_turn()))
    except Overloaded:
        return Reply(503, {"error": {"type": "overloaded_error", "message": "overloaded"}})


class _Loop(Adapter):
    not_applicable: ClassVar[dict[Cell, str]] = {
        Cell.STREAMING: NO_STREAM,
        Cell.NESTED: NO_NESTING,
    }
    model: ClassVar[str] = ""

    def reply(self, turn: Turn) -> dict[str, Any]:
        raise NotImplementedError

    def client(self, url: str, asynchronous: bool) -> Any:
        raise NotImplementedError

    def module(self) -> Any:
        raise NotImplementedError

    def _go(self, world: World, guard: Guard, mode: Mode, rules: dict[str, Any],
            **more: Any) -> Any:  # fmt: skip
        with ScriptedServer() as server:
            server.handler = lambda seen: answer(world, self.reply)
            ask = {"model": self.model, "guard": guard, "max_tokens": 256,
                   "tools": tools(world, mode == "async", rules),
                   "messages": more.pop("messages", [{"role": "user", "content": "refund A-1"}]),
                   "key": rules.get("key"),
                   **more}  # fmt: skip
            module = self.module()
            if mode == "sync":
                with self.client(server.url, False) as raw:
                    return module.run_agent(raw, **ask)

            async def main() -> Any:
                async with self.client(server.url, True) as raw:
                    return await module.arun_agent(raw, **ask)

            return asyncio.run(main())

    def run(self, world: World, guard: Guard, mode: Mode, **rules: Any) -> Any:
        return self._go(world, guard, mode, rules)

    def resume(self, world: World, guard: Guard, paused: Any, mode: Mode, **rules: Any) -> Any:
        return self._go(world, guard, mode, rules, messages=list(paused.messages),
                        resume=paused.checkpoint_id)  # fmt: skip


class AnthropicLoop(_Loop):
    id = "anthropic"
    name = "Anthropic SDK: `anthropic.run_agent` / `arun_agent`"
    model = "claude-haiku-4-5"

    def module(self) -> Any:
        from tether.integrations import anthropic

        return anthropic

    def client(self, url: str, asynchronous: bool) -> Any:
        import anthropic

        kind = anthropic.AsyncAnthropic if asynchronous else anthropic.Anthropic
        return kind(api_key="t", base_url=url)

    def reply(self, turn: Turn) -> dict[str, Any]:
        if isinstance(turn, str):
            content: list[dict[str, Any]] = [{"type": "text", "text": turn}]
        else:
            content = [{"type": "tool_use", "id": f"tu_{i}", "name": c.name, "input": dict(c.args)}
                       for i, c in enumerate(turn)]  # fmt: skip
        return {"id": "msg_1", "type": "message", "role": "assistant", "model": self.model,
                "content": content, "stop_reason": "end_turn" if isinstance(turn, str) else "tool_use",
                "stop_sequence": None,
                "usage": {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS}}  # fmt: skip


class OpenAILoop(_Loop):
    id = "openai"
    name = "OpenAI SDK (chat): `openai.run_agent` / `arun_agent`"
    model = "gpt-4o-mini"

    def module(self) -> Any:
        from tether.integrations import openai

        return openai

    def client(self, url: str, asynchronous: bool) -> Any:
        import openai

        kind = openai.AsyncOpenAI if asynchronous else openai.OpenAI
        return kind(api_key="t", base_url=url + "/v1")

    def reply(self, turn: Turn) -> dict[str, Any]:
        if isinstance(turn, str):
            message: dict[str, Any] = {"role": "assistant", "content": turn}
        else:
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{i}", "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(dict(c.args))}}
                for i, c in enumerate(turn)]}  # fmt: skip
        return {"id": "c", "object": "chat.completion", "created": 0, "model": self.model,
                "choices": [{"index": 0, "message": message,
                             "finish_reason": "stop" if isinstance(turn, str) else "tool_calls"}],
                "usage": {"prompt_tokens": INPUT_TOKENS, "completion_tokens": OUTPUT_TOKENS,
                          "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS}}  # fmt: skip
