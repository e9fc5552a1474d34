"""LangGraph's thread is the request (#38, case 7): without ``key=``, a refund that committed
and timed out in one turn is not made again when the customer says "try again" in the next
turn of the same thread; another thread, or ``key=`` a function giving None, is a request of
its own. On the real LangChain ``create_agent`` and a hand-built LangGraph graph
(``GraphGuard``), with LangChain's fake chat model, sync and async."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from tether import Guard, LoopPolicy, RetryPolicy
from tether.integrations import langgraph as ta_langgraph
from tether.integrations.langchain import TetherMiddleware

FAST: dict[str, Any] = {
    "retry": RetryPolicy(base=0.01, cap=0.02),
    "loops": LoopPolicy(max_no_progress=None),
}
USAGE = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
SHELLS = ["invoke", "ainvoke"]


class Model(GenericFakeChatModel):
    """LangChain's fake chat model, bindable to tools."""

    model_name: str = "fake-model"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def _ask() -> AIMessage:
    """The model asks for the refund (a fresh uuid each time)."""
    asks = AIMessage(
        "",
        tool_calls=[
            {"name": "issue_refund", "args": {"order": "A-1", "uuid": uuid.uuid4().hex},
             "id": f"call_{uuid.uuid4().hex[:6]}"}
        ],
        usage_metadata=USAGE,
    )  # fmt: skip
    return asks


def _replies() -> Any:
    """Turn 1 asks for the refund (its run stops on the unknown outcome); turn 2 asks again,
    then answers."""
    return iter([_ask(), _ask(), AIMessage("Refunded.", usage_metadata=USAGE)])


def _provider() -> tuple[Any, dict[str, Any]]:
    """A refund that commits at the provider, then times out on the way back."""
    provider: dict[str, Any] = {}

    @tool
    def issue_refund(order: str, uuid: str) -> str:
        """Refund an order."""
        provider[order + uuid] = {"id": f"re_{len(provider) + 1}"}
        raise TimeoutError("read timed out")

    return issue_refund, provider


def _invoke(app: Any, text: str, thread: str, shell: str) -> Any:
    value = {"messages": [("user", text)]}
    config = {"configurable": {"thread_id": thread}}
    if shell == "ainvoke":
        return asyncio.run(app.ainvoke(value, config))
    return app.invoke(value, config)


def _agent(key: Any = None) -> tuple[Any, dict[str, Any]]:
    refund, provider = _provider()
    replies = _replies()
    middleware = TetherMiddleware(Guard(**FAST), side_effects=["issue_refund"], key=key)
    app = create_agent(
        Model(messages=replies), tools=[refund], middleware=[middleware],
        checkpointer=InMemorySaver(),
    )  # fmt: skip
    return app, provider


def _graph() -> tuple[Any, dict[str, Any]]:
    refund, provider = _provider()
    replies = _replies()
    guarded = ta_langgraph.GraphGuard(Guard(**FAST), side_effects=["issue_refund"])

    class State(MessagesState, ta_langgraph.TetherFields):
        """The graph's state with tether's fields."""

    def call_model(state: State) -> dict[str, Any]:
        return {"messages": [next(replies)]}

    builder = StateGraph(State)
    builder.add_node("model", guarded.model_node(call_model))
    builder.add_node(
        "tools",
        ToolNode([refund], wrap_tool_call=guarded.tool_wrapper,
                 awrap_tool_call=guarded.atool_wrapper),
    )  # fmt: skip
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=InMemorySaver()), provider


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("shape", ["create_agent", "GraphGuard"])
def test_try_again_in_the_same_thread_pays_once(shell: str, shape: str) -> None:
    """Turn 1: the refund commits and times out. Turn 2, same thread: "try again". Before:
    2 refunds (each turn was its own request); the thread is the request: 1."""
    app, provider = _agent() if shape == "create_agent" else _graph()
    _invoke(app, "refund order A-1", "customer-1", shell)
    assert len(provider) == 1
    _invoke(app, "try again", "customer-1", shell)
    assert len(provider) == 1


@pytest.mark.parametrize("shell", SHELLS)
def test_another_thread_is_another_request(shell: str) -> None:
    """The same refund asked in another thread (another conversation) is made: 2."""
    app, provider = _agent()
    _invoke(app, "refund order A-1", "customer-1", shell)
    _invoke(app, "refund order A-1", "customer-2", shell)
    assert len(provider) == 2


@pytest.mark.parametrize("shell", SHELLS)
def test_a_key_still_overrides_the_thread(shell: str) -> None:
    """``key=`` a function giving None makes every turn its own request again (2 refunds);
    a fixed key makes two threads one request (1)."""
    app, provider = _agent(key=lambda config: None)
    _invoke(app, "refund order A-1", "customer-1", shell)
    _invoke(app, "try again", "customer-1", shell)
    assert len(provider) == 2
    app, provider = _agent(key="ticket-7")
    _invoke(app, "refund order A-1", "customer-1", shell)
    _invoke(app, "try again", "customer-2", shell)
    assert len(provider) == 1
