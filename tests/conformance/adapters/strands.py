"""Strands Agents: ``Agent(hooks=[TetherHooks(guard)])`` on a real ``Agent`` whose model is
a Strands ``Model`` streaming the script (as Strands' tests' ``MockedModelProvider`` does).
Imported lazily: Strands lives in ``.venv-frameworks``."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncGenerator
from typing import Any

from conformance.suite import INPUT_TOKENS, OUTPUT_TOKENS, Adapter, Cell, Mode, World
from tether import Guard

_ids = itertools.count()


def _model(world: World) -> Any:
    from strands.models import Model

    class WorldModel(Model):  # type: ignore[misc]
        def __init__(self) -> None:
            self.config = {"model_id": "scripted"}

        def update_config(self, **config: Any) -> None:
            self.config.update(config)

        def get_config(self) -> Any:
            return self.config

        async def structured_output(self, *a: Any, **k: Any) -> AsyncGenerator[Any, None]:
            raise NotImplementedError
            yield  # pragma: no cover

        async def stream(self, *a: Any, **k: Any) -> AsyncGenerator[Any, None]:
            turn = world.next_turn()
            yield {"messageStart": {"role": "assistant"}}
            if isinstance(turn, str):
                yield {"contentBlockStart": {"start": {}}}
                yield {"contentBlockDelta": {"delta": {"text": turn}}}
                yield {"contentBlockStop": {}}
            else:
                for c in turn:
                    use = {"name": c.name, "toolUseId": f"t{next(_ids)}"}
                    yield {"contentBlockStart": {"start": {"toolUse": use}}}
                    delta = {"toolUse": {"input": json.dumps(dict(c.args))}}
                    yield {"contentBlockDelta": {"delta": delta}}
                    yield {"contentBlockStop": {}}
            stop = "end_turn" if isinstance(turn, str) else "tool_use"
            yield {"messageStop": {"stopReason": stop}}
            usage = {"inputTokens": INPUT_TOKENS, "outputTokens": OUTPUT_TOKENS,
                     "totalTokens": INPUT_TOKENS + OUTPUT_TOKENS}  # fmt: skip
            yield {"metadata": {"usage": usage, "metrics": {"latencyMs": 1}}}

    return WorldModel()


class Strands(Adapter):
    id = "strands"
    name = "Strands Agents: `TetherHooks` (`Agent(hooks=[...])`)"
    venv = "frameworks"
    not_applicable = {
        Cell.PAUSE_RESUME: (
            "not built yet (#42): a Strands invocation paused for a tether approval cannot be "
            "resumed from its checkpoint (Strands interrupts are not yet tether approvals)"
        ),
        Cell.NESTED: (
            "not built yet (#42): a Strands agent run inside a tool is an invocation of its "
            "own, with a run of its own (give it its own hooks); it is not counted in the caller's"
        ),
    }

    def agent(self, world: World, asynchronous: bool, hooks: list[Any]) -> Any:
        from strands import Agent, tool

        tools = [tool(fn) for fn in world.tools(asynchronous)]
        return Agent(model=_model(world), tools=tools, hooks=hooks, callback_handler=None)

    def _go(self, agent: Any, mode: Mode) -> None:
        if mode == "sync":
            agent("refund A-1")
        elif mode == "async":
            asyncio.run(agent.invoke_async("refund A-1"))
        else:

            async def read() -> None:
                async for _ in agent.stream_async("refund A-1"):
                    pass

            asyncio.run(read())

    def run(self, world: World, guard: Guard, mode: Mode, **rules: Any) -> Any:
        from tether.integrations.strands import TetherHooks

        hooks = TetherHooks(guard, **rules)
        self._go(self.agent(world, mode != "sync", [hooks]), mode)
        return hooks.last_outcome
