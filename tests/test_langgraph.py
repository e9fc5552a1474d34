"""LangGraph's ToolNode under tether's wrapper: the node's own contract holds.

What LangGraph promises a ToolNode user (its error handling, a tool's ``Command`` and list
returns, injected state and store, ``interrupt()``) must hold the same with
``tool_wrapper(run)`` as without it; tether adds its guards and nothing else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any, NotRequired

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import InjectedState, InjectedStore, ToolNode
from langgraph.types import Command

import tether
from tether import Guard, Run
from tether.integrations import langgraph as ta_langgraph


def asks(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """The state ToolNode reads: an AI message asking for ``calls``."""
    return {
        "messages": [
            AIMessage(
                "",
                tool_calls=[
                    {"name": n, "args": a, "id": f"c{i}"} for i, (n, a) in enumerate(calls)
                ],
            )
        ]
    }


def open_run() -> Run:
    run = Guard().start(task="tool node")
    run.__enter__()
    run.proceed()
    return run


def node(tools: list[Any], mode: str, **kwargs: Any) -> ToolNode:
    """A ToolNode without tether (``alone``) or with its wrapper (``sync`` / ``async``)."""
    if mode == "alone":
        return ToolNode(tools, **kwargs)
    run = open_run()
    return ToolNode(
        tools,
        wrap_tool_call=ta_langgraph.tool_wrapper(run),
        awrap_tool_call=ta_langgraph.atool_wrapper(run),
        **kwargs,
    )


class State(MessagesState):
    plan: NotRequired[str]
    user: NotRequired[str]


def invoke(tool_node: ToolNode, state: Any, shell: str, store: Any = None) -> Any:
    """Run ``tool_node`` as the one node of a graph (how LangGraph runs it); the final state."""
    graph = StateGraph(State)
    graph.add_node("tools", tool_node)
    graph.add_edge(START, "tools")
    app = graph.compile(store=store)
    if shell == "ainvoke":
        return asyncio.run(app.ainvoke(state))
    return app.invoke(state)


MODES = ["alone", "tether"]
SHELLS = ["invoke", "ainvoke"]


@tool
def divide(a: int, b: int) -> float:
    """Divide a by b."""
    return a / b


@tool
def broken(q: str) -> str:
    """Always raises a programming error."""
    raise ValueError("bad input: " + q)


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("mode", MODES)
def test_handle_tool_errors_false_raises_the_tools_error(mode: str, shell: str) -> None:
    """handle_tool_errors=False: the tool's own exception leaves the node, as LangGraph says."""
    with pytest.raises(ZeroDivisionError):
        invoke(
            node([divide], mode, handle_tool_errors=False),
            asks(("divide", {"a": 1, "b": 0})),
            shell,
        )


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("mode", MODES)
def test_the_default_re_raises_a_tools_error(mode: str, shell: str) -> None:
    """The default handler re-raises what is not an invocation error (the tutorial's fallback
    fires on it)."""
    with pytest.raises(ValueError, match="bad input: x"):
        invoke(node([broken], mode), asks(("broken", {"q": "x"})), shell)


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("mode", MODES)
def test_a_custom_handler_writes_the_message(mode: str, shell: str) -> None:
    """handle_tool_errors=callable: its text is the tool message, for the types it names."""

    def explain(e: ValueError) -> str:
        return f"handled: {e}"

    out = invoke(
        node([broken], mode, handle_tool_errors=explain), asks(("broken", {"q": "y"})), shell
    )
    message = out["messages"][-1]
    assert (message.content, message.status) == ("handled: bad input: y", "error")


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("mode", MODES)
def test_handle_tool_errors_true_and_a_string(mode: str, shell: str) -> None:
    """True: LangGraph's template with the error; a string: that string."""
    out = invoke(node([broken], mode, handle_tool_errors=True), asks(("broken", {"q": "z"})), shell)
    assert "bad input: z" in out["messages"][-1].content
    out = invoke(
        node([broken], mode, handle_tool_errors="nope"), asks(("broken", {"q": "z"})), shell
    )
    assert out["messages"][-1].content == "nope"


@tool
def set_plan(plan: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
    """Record a plan in the graph state."""
    return Command(
        update={"plan": plan, "messages": [ToolMessage("planned", tool_call_id=tool_call_id)]}
    )


@tool
def two_steps(x: int, tool_call_id: Annotated[str, InjectedToolCallId]) -> list[Any]:
    """Return a list: a state update and a message."""
    return [Command(update={"plan": f"step {x}"}), ToolMessage(f"x={x}", tool_call_id=tool_call_id)]


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("mode", MODES)
def test_a_command_and_a_list_keep_their_state_update(mode: str, shell: str) -> None:
    """A tool's Command (and a list of Command and ToolMessage) reach LangGraph as they are."""
    out = invoke(node([set_plan], mode), asks(("set_plan", {"plan": "fly"})), shell)
    assert (out["plan"], out["messages"][-1].content) == ("fly", "planned")
    out = invoke(node([two_steps], mode), asks(("two_steps", {"x": 2})), shell)
    assert (out["plan"], [m.content for m in out["messages"][1:]]) == ("step 2", ["x=2"])


@tool
def whoami(state: Annotated[dict[str, Any], InjectedState]) -> str:
    """Read the caller from the graph state."""
    return f"user {state['user']}"


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("mode", MODES)
def test_injected_state_and_store(mode: str, shell: str) -> None:
    """InjectedState and InjectedStore are filled by ToolNode under the wrapper too."""
    from langgraph.store.memory import InMemoryStore

    @tool
    def remember(fact: str, store: Annotated[Any, InjectedStore()]) -> str:
        """Keep a fact."""
        store.put(("facts",), fact, {"v": fact})
        return "kept"

    store = InMemoryStore()
    state = {**asks(("whoami", {}), ("remember", {"fact": "tea"})), "user": "ann"}
    out = invoke(node([whoami, remember], mode), state, shell, store)
    assert [m.content for m in out["messages"][1:]] == ["user ann", "kept"]
    assert store.get(("facts",), "tea") is not None


def interrupting_graph(mode: str, booked: list[str]) -> Any:
    """A graph whose tool asks a person with interrupt() before it books."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import interrupt

    @tool
    def book(hotel: str) -> str:
        """Book a hotel, once a person says yes."""
        answer = interrupt({"question": f"book {hotel}?"})
        if answer != "yes":
            return "not booked"
        booked.append(hotel)
        return f"booked {hotel}"

    graph = StateGraph(MessagesState)
    graph.add_node("tools", node([book], mode))
    graph.add_edge(START, "tools")
    return graph.compile(checkpointer=InMemorySaver())


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("mode", MODES)
def test_interrupt_in_a_tool_pauses_and_resume_continues(mode: str, shell: str) -> None:
    """interrupt() pauses the graph (no tool message, no 'rejected'); Command(resume=) runs
    the tool to its end, once."""
    booked: list[str] = []
    app = interrupting_graph(mode, booked)
    config: Any = {"configurable": {"thread_id": f"t-{mode}-{shell}"}}

    def call(value: Any) -> Any:
        return (
            asyncio.run(app.ainvoke(value, config))
            if shell == "ainvoke"
            else app.invoke(value, config)
        )

    first = call(asks(("book", {"hotel": "Hilton"})))
    [pause] = first["__interrupt__"]
    assert pause.value == {"question": "book Hilton?"}
    assert [m.type for m in first["messages"]] == ["ai"] and booked == []
    assert app.get_state(config).next == ("tools",)
    done = call(Command(resume="yes"))
    assert booked == ["Hilton"]
    assert [m.content for m in done["messages"] if m.type == "tool"] == ["booked Hilton"]


def test_the_wrapper_takes_the_run_s_key_and_volatile_paths() -> None:
    """tool_wrapper(..., volatile=) leaves model-made ids at a path out of a call's identity:
    the third search with a fresh nonce is a repeat, never run."""
    searched: list[str] = []

    @tool
    def search(q: str, meta: dict[str, Any]) -> str:
        """Search invoices."""
        searched.append(q)
        return "no result"

    run = open_run()
    wrapper: Callable[..., Any] = ta_langgraph.tool_wrapper(
        run, volatile={"search": ["meta.nonce"]}
    )
    for i in range(4):
        invoke(
            ToolNode([search], wrap_tool_call=wrapper),
            asks(("search", {"q": "99", "meta": {"nonce": f"n{i}"}})),
            "invoke",
        )
    assert searched == ["99", "99"]


def test_a_transient_failure_retried_to_the_end_is_told_to_the_model() -> None:
    """A read that keeps timing out: tether retries it, then the model hears it is unavailable
    (as LangChain's ToolRetryMiddleware says it), instead of the graph crashing."""
    tried: list[int] = []

    @tool
    def quote(sku: str) -> str:
        """Price a product."""
        tried.append(1)
        raise TimeoutError("read timed out")

    run = Guard(retry=tether.RetryPolicy(base=0.001, cap=0.002)).start(task="quote")
    run.__enter__()
    run.proceed()
    tools = ToolNode([quote], wrap_tool_call=ta_langgraph.tool_wrapper(run))
    out = invoke(tools, asks(("quote", {"sku": "p1"})), "invoke")
    assert "temporarily unavailable" in out["messages"][-1].content and len(tried) > 1
    with pytest.raises(TimeoutError):
        invoke(ToolNode([quote]), asks(("quote", {"sku": "p1"})), "invoke")
