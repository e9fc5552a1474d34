"""Strands Agents: ``Agent(hooks=[TetherHooks(guard)])`` on a real ``Agent`` whose model is
a Strands ``Model`` streaming the script (as Strands' tests' ``MockedModelProvider`` does).
Imported lazily: Strands lives in ``.venv-frameworks``."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncGenerator
from typing import Any

from conformance.suite import INPUT_TOKENS, OUTPUT_TOKENS, Adapter, Mode, World, ask
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
    #: each paused run's agent and interrupt (Strands resumes the agent that was interrupted)
    paused: dict[str, tuple[Any, Any]] = {}

    def agent(self, world: World, asynchronous: bool, hooks: list[Any]) -> Any:
        from strands import Agent, tool

        tools = [tool(fn) for fn in world.tools(asynchronous)]
        return Agent(model=_model(world), tools=tools, hooks=hooks, callback_handler=None)

    def _go(self, agent: Any, mode: Mode, prompt: Any = "refund A-1") -> Any:
        if mode == "sync":
            return agent(prompt)
        if mode == "async":
            return asyncio.run(agent.invoke_async(prompt))

        async def read() -> Any:
            result = None
            async for event in agent.stream_async(prompt):
                result = event.get("result", result)
            return result

        return asyncio.run(read())

    def run(self, world: World, guard: Guard, mode: Mode, **rules: Any) -> Any:
        from tether.integrations.strands import TetherHooks

        hooks = TetherHooks(guard, **rules)
        agent = self.agent(world, mode != "sync", [hooks])
        result = self._go(agent, mode)
        outcome = hooks.last_outcome
        if outcome is not None and outcome.checkpoint_id and result.interrupts:
            self.paused[outcome.checkpoint_id] = (agent, result.interrupts[0])
        return outcome

    def nested(self, world: World, guard: Guard, mode: Mode) -> Any:
        """Agents as tools: a tool of the guarded agent runs a second agent, under hooks of
        its own on the same guard: its model turns and tool calls join the caller's run."""
        from strands import Agent, tool

        from tether.integrations.strands import TetherHooks

        inner_tools = [tool(fn) for fn in world.tools(True)]

        @tool
        async def ask_refunds(question: str) -> str:
            """Ask the refunds agent."""
            inner = Agent(model=_model(world), tools=inner_tools,
                          hooks=[TetherHooks(guard)], callback_handler=None)  # fmt: skip
            return str(await inner.invoke_async(question))

        hooks = TetherHooks(guard)
        outer = Agent(model=_model(world), tools=[ask_refunds], hooks=[hooks],
                      callback_handler=None)  # fmt: skip
        world.turns = [ask(("ask_refunds", {"question": "refund A-1"})),
                       *[ask(("search", {"q": f"A-{i}"})) for i in range(10)]]  # fmt: skip
        self._go(outer, mode)
        return hooks.last_outcome

    def resume(self, world: World, guard: Guard, paused: Any, mode: Mode, **rules: Any) -> Any:
        """The interrupted agent, rebuilt as a session manager restores it (messages, state,
        interrupt state) under hooks on ``guard``, which decided the approval already (that
        decision stands), answered (``interruptResponse``)."""
        from tether.integrations.strands import TetherHooks

        interrupted, interrupt = self.paused.pop(paused.checkpoint_id)
        hooks = TetherHooks(guard, **rules)
        agent = self.agent(world, mode != "sync", [hooks])  # the resuming process's agent,
        agent.messages = interrupted.messages  # with what a session manager restores of it
        agent.state = interrupted.state
        agent._interrupt_state = interrupted._interrupt_state
        reply = [{"interruptResponse": {"interruptId": interrupt.id, "response": "approve"}}]
        self._go(agent, mode, reply)
        return hooks.last_outcome
