"""The OpenAI Agents SDK: ``openai_agents.run`` / ``run_sync`` / ``run_streamed`` on a real
``Agent`` whose model is the SDK's own ``agents.testing.ScriptedModel``, fed by the script."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

from conformance.suite import INPUT_TOKENS, OUTPUT_TOKENS, Adapter, Mode, Turn, World, ask
from tether import Guard

_ids = itertools.count()


def _model(world: World) -> Any:
    from agents.testing import ScriptedModel, assistant_message, function_call
    from agents.usage import Usage

    def step(turn: Turn) -> list[Any]:
        if isinstance(turn, str):
            return [assistant_message(turn)]
        return [function_call(c.name, dict(c.args), call_id=f"c{next(_ids)}") for c in turn]

    class WorldModel(ScriptedModel):
        """The SDK's scripted model, each step taken from the world when it is asked."""

        async def get_response(self, *args: Any, **kwargs: Any) -> Any:
            self.enqueue(step(world.next_turn()))
            return await super().get_response(*args, **kwargs)

        async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            self.enqueue(step(world.next_turn()))
            async for event in super().stream_response(*args, **kwargs):
                yield event

    usage = Usage(requests=1, input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS,
                  total_tokens=INPUT_TOKENS + OUTPUT_TOKENS)  # fmt: skip
    return WorldModel(default_usage=usage)


class AgentsSDK(Adapter):
    id = "openai-agents"
    name = "OpenAI Agents SDK: `openai_agents.run` / `run_sync` / `run_streamed`"
    reasks_after_resume = True  # resumed from the conversation: the model asks again

    def agent(self, world: World, asynchronous: bool, **more: Any) -> Any:
        from agents import Agent, function_tool, set_tracing_disabled

        set_tracing_disabled(True)
        tools = [function_tool(fn) for fn in world.tools(asynchronous)]
        return Agent(name="support", model=_model(world), tools=tools, **more)

    def _go(self, agent: Any, prompt: Any, guard: Guard, mode: Mode, **options: Any) -> Any:
        from tether.integrations import openai_agents as ta_agents

        if mode == "sync":
            return ta_agents.run_sync(agent, prompt, guard=guard, **options)
        if mode == "async":
            return asyncio.run(ta_agents.run(agent, prompt, guard=guard, **options))

        async def read() -> Any:
            stream = ta_agents.run_streamed(agent, prompt, guard=guard, **options)
            async for _ in stream.stream_events():
                pass
            return stream.outcome

        return asyncio.run(read())

    def run(self, world: World, guard: Guard, mode: Mode, **rules: Any) -> Any:
        agent = self.agent(world, mode != "sync")
        return self._go(agent, "refund A-1", guard, mode, **rules)

    def resume(self, world: World, guard: Guard, paused: Any, mode: Mode, **rules: Any) -> Any:
        agent = self.agent(world, mode != "sync")
        return self._go(agent, list(paused.messages), guard, mode, resume=paused.checkpoint_id,
                        **rules)  # fmt: skip

    def nested(self, world: World, guard: Guard, mode: Mode) -> Any:
        """A triage agent hands off to a refunds agent (the SDK's handoff), which searches on."""
        from agents import handoff

        refunds = self.agent(world, True, handoff_description="refunds")
        refunds.name = "refunds"
        triage = self.agent(world, True, handoffs=[handoff(refunds)])
        world.turns = [ask(("transfer_to_refunds", {})),
                       *[ask(("search", {"q": f"A-{i}"})) for i in range(10)]]  # fmt: skip
        return self._go(triage, "refund A-1", guard, mode)
