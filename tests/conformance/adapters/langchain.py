"""LangChain ``create_agent`` with ``TetherMiddleware``, and a hand-built LangGraph graph
with ``GraphGuard``: real graphs, LangChain's own ``GenericFakeChatModel`` fed by the script."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

from conformance.suite import INPUT_TOKENS, OUTPUT_TOKENS, Adapter, Mode, Turn, World, ask
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

    class Replies:
        """The model's replies, taken from the world when asked (an iterator that a busy
        turn's exception does not end, as it would a generator)."""

        def __iter__(self) -> Iterator[Any]:
            return self

        def __next__(self) -> Any:
            return message(world.next_turn())

    return FakeToolModel(messages=Replies())


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

    reasks_after_resume = True  # the approved call runs when the model asks for it again
    raises_tool_errors = True  # ToolNode's default handle_tool_errors raises it

    def agent(self, world: World, guard: Guard, asynchronous: bool, **rules: Any) -> Any:
        from langchain.agents import create_agent

        from tether.integrations.langchain import TetherMiddleware

        return create_agent(model(world), tools=tools(world, asynchronous),
                            middleware=[TetherMiddleware(guard, **rules)])  # fmt: skip

    def nested(self, world: World, guard: Guard, mode: Mode) -> Any:
        """A sub-agent that a tool runs (LangChain's subagents: create_agent has no handoff),
        built with its own middleware on the same guard: it joins the caller's run."""
        from langchain.agents import create_agent
        from langchain_core.tools import StructuredTool

        from tether.integrations.langchain import TetherMiddleware

        inner = self.agent(world, guard, mode == "async")

        def ask_refunds(question: str) -> str:
            """Ask the refunds agent."""
            return str(inner.invoke({"messages": [("user", question)]})["messages"][-1].content)

        async def aask_refunds(question: str) -> str:
            """Ask the refunds agent."""
            state = await inner.ainvoke({"messages": [("user", question)]})
            return str(state["messages"][-1].content)

        tool = StructuredTool.from_function(ask_refunds, coroutine=aask_refunds)
        outer = create_agent(model(world), tools=[tool], middleware=[TetherMiddleware(guard)])
        world.turns = [ask(("ask_refunds", {"question": "refund A-1"})),
                       *[ask(("search", {"q": f"A-{i}"})) for i in range(10)]]  # fmt: skip
        return drive(outer, {"messages": [("user", "refund A-1")]}, mode)["tether_outcome"]

    def run(self, world: World, guard: Guard, mode: Mode, **rules: Any) -> Any:
        agent = self.agent(world, guard, mode == "async", **rules)
        state = drive(agent, {"messages": [("user", "refund A-1")]}, mode)
        self.messages = state["messages"]
        return state["tether_outcome"]

    def resume(self, world: World, guard: Guard, paused: Any, mode: Mode, **rules: Any) -> Any:
        agent = self.agent(world, guard, mode == "async", **rules)
        given = {"messages": list(self.messages), "tether_resume": paused.checkpoint_id}
        return drive(agent, given, mode)["tether_outcome"]


class Graph(Adapter):
    id = "langgraph"
    name = "LangGraph hand-built graph + `GraphGuard`"
    reasks_after_resume = True  # the approved call runs when the model asks for it again
    raises_tool_errors = True  # ToolNode's default handle_tool_errors raises it

    def app(self, world: World, guard: Guard, asynchronous: bool, **rules: Any) -> Any:
        from langgraph.graph import END, START, MessagesState, StateGraph
        from langgraph.prebuilt import ToolNode, tools_condition

        from tether.integrations import langgraph as ta_langgraph

        class State(MessagesState, ta_langgraph.TetherFields):
            """The graph's state with tether's fields."""

        guarded = ta_langgraph.GraphGuard(guard, model="fake-model", **rules)
        chat = model(world)

        def call_model(state: State) -> dict[str, Any]:
            return {"messages": [chat.invoke(state["messages"])]}

        async def acall_model(state: State) -> dict[str, Any]:
            return {"messages": [await chat.ainvoke(state["messages"])]}

        builder = StateGraph(State)
        builder.add_node("model", guarded.model_node(acall_model if asynchronous else call_model))
        builder.add_node("tools", ToolNode(tools(world, asynchronous),
                                           wrap_tool_call=guarded.tool_wrapper,
                                           awrap_tool_call=guarded.atool_wrapper))  # fmt: skip
        builder.add_edge(START, "model")
        builder.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
        builder.add_edge("tools", "model")
        return builder.compile()

    def nested(self, world: World, guard: Guard, mode: Mode) -> Any:
        """The guarded agent graph as a subgraph: a parent graph's triage node, then the agent
        (LangGraph's nesting; it has no handoff), one run for the thread."""
        from langgraph.graph import START, MessagesState, StateGraph

        from tether.integrations import langgraph as ta_langgraph

        class State(MessagesState, ta_langgraph.TetherFields):
            """The parent's state: the subgraph's keys, shared."""

        world.turns = [ask(("search", {"q": f"A-{i}"})) for i in range(10)]
        parent = StateGraph(State)
        parent.add_node("triage", lambda state: {"messages": [("user", "it is about A-1")]})
        parent.add_node("agent", self.app(world, guard, mode == "async"))
        parent.add_edge(START, "triage")
        parent.add_edge("triage", "agent")
        state = drive(parent.compile(), {"messages": [("user", "refund A-1")]}, mode)
        return state["tether_outcome"]

    def run(self, world: World, guard: Guard, mode: Mode, **rules: Any) -> Any:
        app = self.app(world, guard, mode == "async", **rules)
        state = drive(app, {"messages": [("user", "refund A-1")]}, mode)
        self.messages = state["messages"]
        return state["tether_outcome"]

    def resume(self, world: World, guard: Guard, paused: Any, mode: Mode, **rules: Any) -> Any:
        app = self.app(world, guard, mode == "async", **rules)
        given = {"messages": list(self.messages), "tether_resume": paused.checkpoint_id}
        return drive(app, given, mode)["tether_outcome"]
