"""PydanticAI: ``pydantic_ai.run`` / ``run_sync`` (``TetherCapability``) on a real ``Agent``
whose model is PydanticAI's own ``FunctionModel``, fed by the script."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

from conformance.suite import INPUT_TOKENS, OUTPUT_TOKENS, Adapter, Mode, World, ask
from tether import Guard

_ids = itertools.count()


def _model(world: World) -> Any:
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import DeltaToolCall, FunctionModel
    from pydantic_ai.usage import RequestUsage

    def respond(messages: list[Any], info: Any) -> ModelResponse:
        turn = world.next_turn()
        usage = RequestUsage(input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS)
        if isinstance(turn, str):
            return ModelResponse(parts=[TextPart(turn)], usage=usage)
        parts = [ToolCallPart(c.name, dict(c.args), tool_call_id=f"c{next(_ids)}") for c in turn]
        return ModelResponse(parts=parts, usage=usage)

    async def stream(messages: list[Any], info: Any) -> AsyncIterator[Any]:
        import json

        turn = world.next_turn()
        if isinstance(turn, str):
            yield turn
            return
        yield {i: DeltaToolCall(name=c.name, json_args=json.dumps(dict(c.args)),
                                tool_call_id=f"c{next(_ids)}") for i, c in enumerate(turn)}  # fmt: skip

    return FunctionModel(respond, stream_function=stream, model_name="scripted")


class PydanticAI(Adapter):
    id = "pydantic-ai"
    name = "PydanticAI: `pydantic_ai.run` / `run_sync` (`TetherCapability`)"
    reasks_after_resume = True  # resumed from the conversation: the model asks again
    raises_tool_errors = True  # PydanticAI raises a tool's exception out of agent.run
    streamed_usage_exact = False  # FunctionModel estimates a streamed reply's tokens itself

    def agent(self, world: World, asynchronous: bool) -> Any:
        from pydantic_ai import Agent

        agent: Any = Agent(_model(world))
        for fn in world.tools(asynchronous):
            agent.tool_plain(fn)
        return agent

    def _go(self, agent: Any, prompt: Any, guard: Guard, mode: Mode, **options: Any) -> Any:
        from tether.integrations import pydantic_ai as ta_pydantic

        if mode == "sync":
            return ta_pydantic.run_sync(agent, prompt, guard=guard, **options)
        if mode == "stream":  # every model request streamed, its events read

            async def read(ctx: Any, events: AsyncIterator[Any]) -> None:
                async for _ in events:
                    pass

            options["event_stream_handler"] = read
        return asyncio.run(ta_pydantic.run(agent, prompt, guard=guard, **options))

    def run(self, world: World, guard: Guard, mode: Mode, **rules: Any) -> Any:
        return self._go(self.agent(world, mode != "sync"), "refund A-1", guard, mode, **rules)

    def resume(self, world: World, guard: Guard, paused: Any, mode: Mode, **rules: Any) -> Any:
        return self._go(self.agent(world, mode != "sync"), None, guard, mode,
                        resume=paused.checkpoint_id, message_history=list(paused.messages),
                        **rules)  # fmt: skip

    def nested(self, world: World, guard: Guard, mode: Mode) -> Any:
        """Agent delegation: a tool of the guarded agent runs a second agent
        (``usage=ctx.usage``), whose requests count in the same run."""
        from pydantic_ai import Agent, RunContext

        from tether.integrations import pydantic_ai as ta_pydantic

        inner: Any = Agent(_model(world), capabilities=[ta_pydantic.Delegate()])
        for fn in world.tools(True):
            inner.tool_plain(fn)
        outer: Any = Agent(_model(world))

        async def ask_refunds(ctx: RunContext[None], question: str) -> str:
            """Ask the refunds agent."""
            result = await inner.run(question, usage=ctx.usage)
            return str(result.output)

        # the annotations as objects (this module postpones them; PydanticAI reads them)
        ask_refunds.__annotations__.update(
            {"ctx": RunContext[None], "question": str, "return": str}
        )
        outer.tool(ask_refunds)

        world.turns = [ask(("ask_refunds", {"question": "refund A-1"})),
                       *[ask(("search", {"q": f"A-{i}"})) for i in range(10)]]  # fmt: skip
        return self._go(outer, "refund A-1", guard, mode)
