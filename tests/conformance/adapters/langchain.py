"""LangChain ``create_agent`` with ``TetherMiddleware``, and a hand-built LangGraph graph
with ``GraphGuard``: real graphs, LangChain's own ``GenericFakeChatModel`` fed by the script."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any, ClassVar

from conformance.suite import INPUT_TOKENS, OUTPUT_TOKENS, Adapter, Cell, Mode, Turn, World
from tether import Guard

_ids = itertools.count()


def message(turn: Turn) -> Any:
    from langchain_core.messages import AIMessage

    usage = {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS,
             "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS}  # fmt: skip
    if isinstance(turn, str):
        return AIMessage(turn, usage_metadata=usage)
    calls = [{"name": c.name, "args": dict(c.args), "id": f"c{next(_ids)}"} for c in turn]
    return AIMessage("", tool_calls=calls, usage_metadata=usage)


def model(world: World) -> Any:
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    class FakeToolModel(GenericFakeChatModel):
        model_name: str = "fake-model"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    def replies() -> Iterator[Any]:
        while True:
            yield message(world.next_turn())

    return FakeToolModel(messages=replies())


def tools(world: World, asynchronous: bool) -> list[Any]:
    from langchain_core.tools import StructuredTool

    if asynchronous:
        return [StructuredTool.from_function(coroutine=fn) for fn in world.tools(True)]
    return [StructuredTool.from_function(fn) for fn in world.tools(False)]


def drive(app: Any, given: Any, mode: Mode, config: dict[str, Any] | None = None) -> Any:
    """``invoke`` / ``ainvoke`` / ``stream`` (to its end, then the thread's state) of a graph."""
    if mode == "sync":
        return app.invoke(given, config)
    if mode == "async":
        return asyncio.run(app.ainvoke(given, config))
    last = None
    for values in app.stream(given, config, stream_mode="values"):
        last = values
    return last


class Middleware(Adapter):
    id = "langchain"
    name = "LangChain `create_agent` + `TetherMiddleware`"

    not_applicable: ClassVar[dict[Cell, str]] = {
        Cell.NESTED: "create_agent has no handoff; a sub-agent is a tool whose own agent "
        "carries its own middleware (a run of its own)",
    }

    reasks_after_resume = True  # the approved call runs when the model asks for it again
    raises_tool_errors = True  # ToolNode's default handle_tool_errors raises it

    def agent(self, world: World, guard: Guard, asynchronous: bool, **rules: Any) -> Any:
        from langchain.agents import create_agent

        from tether.integrations.langchain import TetherMiddleware

        return create_agent(model(world), tools=tools(world, asynchronous),
                            middleware=[TetherMiddleware(guard, **rules)])  # fmt: skip

    def run(self, world: World, guard: Guard, mode: Mode, **rules: Any) -> Any:
        agent = self.agent(world, guard, mode == "async", **rules)
        state = drive(agent, {"messages": [("user", "refund A-1")]}, mode)
        self.messages = state["messages"]
        return state["tether_outcome"]

    def resume(self, world: World, guard: Guard, paused: Any, mode: Mode, **rules: Any) -> Any:
        agent = self.agent(world, guard, mode == "async", **rules)
        given = {"messages": list(self.messages), "tether_resume": paused.checkpoint_id}
        return drive(agent, given, mode)["tether_outcome"]
