"""LiteLLM: ``tether.integrations.litellm.completion(run, ...)`` / ``acompletion`` in the
user's own loop (the real ``litellm.completion`` over loopback to a server answering from
the script in OpenAI's shape), ``run.proceed()`` before each request and ``run.call_tool``
for each tool call, as docs/litellm.md writes it; replies read whole or streamed
(``stream=True``: the usage in the last chunk). Imported lazily: LiteLLM lives in
``.venv-crewai``."""

from __future__ import annotations

import asyncio
import os
from typing import Any, ClassVar

from conformance.adapters.guarded_client import MODEL, _Loop, _sse
from conformance.adapters.sdk_loop import OpenAILoop
from conformance.adapters.sdk_loop import answer as answered
from conformance.suite import Adapter, Cell, Mode, Overloaded, World
from scripted_server import Reply, ScriptedServer
from tether import Guard, Run


class _Calls:
    """What the loop calls for a model request: ``completion(run, ...)`` (``acompletion``)
    with the loopback provider's address, the model under LiteLLM's ``openai/`` prefix."""

    def __init__(self, run: Run, url: str, asynchronous: bool) -> None:
        self.run, self.url, self.asynchronous = run, url, asynchronous

    def create(self, **ask: Any) -> Any:
        from tether.integrations.litellm import acompletion, completion

        ask = {**ask, "model": f"openai/{ask['model']}", "api_base": self.url, "api_key": "t"}
        return (acompletion if self.asynchronous else completion)(self.run, **ask)


class _LiteLLMLoop(_Loop):
    def create(self, client: Any) -> Any:
        return client.create


class LiteLLM(Adapter):
    id = "litellm"
    name = "LiteLLM in your own loop: `litellm.completion(run, ...)` / `acompletion`"
    venv = "crewai"
    reasks_after_resume = True  # a resumed run is a new loop: the model asks again
    not_applicable: ClassVar[dict[Cell, str]] = {
        Cell.NESTED: "LiteLLM is a model layer: it has no handoff or nested agent (a second "
        "loop under the same run counts in it as any request)",
    }

    def _go(self, world: World, guard: Guard, mode: Mode, rules: dict[str, Any],
            resume: str | None = None) -> Any:  # fmt: skip
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of prices
        stream = mode == "stream"

        def answer(seen: Any) -> Reply:
            if not stream:
                return answered(world, OpenAILoop().reply)
            try:
                return Reply(200, raw=_sse(world.next_turn()), content_type="text/event-stream")
            except Overloaded:
                return Reply(503, {"error": {"type": "server_error", "message": "overloaded"}})

        loop = _LiteLLMLoop(world, rules, mode == "async")
        if resume is not None:
            loop.messages = list(self.messages)

        def start() -> Run:
            if resume:
                return guard.resume(resume)
            return guard.start("refund A-1", key=rules.get("key"))

        with ScriptedServer() as server:
            server.handler = answer
            url = server.url + "/v1"
            if mode != "async":
                with start() as run:
                    loop.sync(run, _Calls(run, url, False), stream)
            else:

                async def main() -> Run:
                    async with start() as run:
                        await loop.asynchronous(run, _Calls(run, url, True), False)
                    return run

                run = asyncio.run(main())
        self.messages = loop.messages
        return run.outcome

    def run(self, world: World, guard: Guard, mode: Mode, **rules: Any) -> Any:
        return self._go(world, guard, mode, rules)

    def resume(self, world: World, guard: Guard, paused: Any, mode: Mode, **rules: Any) -> Any:
        return self._go(world, guard, mode, rules, resume=paused.checkpoint_id)


__all__ = ["MODEL", "LiteLLM"]
