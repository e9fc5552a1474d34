"""The run document (#38): what a framework's state, a checkpoint or a record holds of a run
is refused when it cannot be read or trusted, before any tool runs; limits come from the
guard; the document is bound to its run and request, signed, redacted once, and keeps its
effects."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

import tether
from tether import Checkpoints, Guard, Ledger
from tether.integrations import langgraph as ta_langgraph
from tether.integrations.langchain import TetherMiddleware


class Model(GenericFakeChatModel):
    """LangChain's fake chat model, bindable to tools."""

    model_name: str = "fake-model"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def ask(name: str, args: dict[str, Any], i: int) -> AIMessage:
    return AIMessage(
        "",
        tool_calls=[{"name": name, "args": args, "id": f"{name}_{i}"}],
        usage_metadata={"input_tokens": 100, "output_tokens": 10, "total_tokens": 110},
    )


def answer(text: str) -> AIMessage:
    return AIMessage(
        text, usage_metadata={"input_tokens": 100, "output_tokens": 10, "total_tokens": 110}
    )


REFUNDS: list[str] = []


@pytest.fixture(autouse=True)
def _fresh() -> None:
    REFUNDS.clear()


@tool
def refund(order: str) -> str:
    """Refund an order."""
    REFUNDS.append(order)
    return f"re_{len(REFUNDS)}"


def stores(tmp_path: Path) -> dict[str, Any]:
    db = str(tmp_path / "tether.db")
    return {"ledger": Ledger.sqlite(db), "checkpoints": Checkpoints.sqlite(db)}


def run_to_end(app: Any, value: Any, config: Any, shell: str) -> dict[str, Any]:
    if shell == "ainvoke":
        return dict(asyncio.run(app.ainvoke(value, config)))
    return dict(app.invoke(value, config))


SHELLS = ["invoke", "ainvoke"]

#: what a run document may be replaced by in a thread's state: a newer tether's, None, the
#: wrong type, a corrupt one
UNREADABLE: dict[str, Any] = {
    "newer": lambda doc: {**doc, "version": 99},
    "none": lambda doc: None,
    "wrong type": lambda doc: "a run",
    "corrupt": lambda doc: {**doc, "steps": "many"},
}


# --- case 1: an unreadable document runs nothing ----------------------------------------


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("how", list(UNREADABLE))
def test_an_unreadable_run_in_the_thread_runs_no_tool(tmp_path: Path, shell: str, how: str) -> None:
    """A paused thread whose run document cannot be read (a newer tether wrote it, it was
    cleared, replaced or corrupted) is refused with RunDocumentError: the approval-gated
    refund never runs (it ran twice, without approval, under a WARNING)."""
    asks = [ask("refund", {"order": "A-1"}, i) for i in range(2)]
    model = Model(messages=iter([*asks, answer("Refunded.")]))
    agent = create_agent(
        model,
        tools=[refund],
        middleware=[
            TetherMiddleware(
                Guard(**stores(tmp_path)),
                side_effects=["refund"],
                requires_approval={"refund": True},
            )
        ],
        checkpointer=InMemorySaver(),
        interrupt_before=["tools"],
    )
    config = {"configurable": {"thread_id": f"unreadable-{how}-{shell}"}}
    run_to_end(agent, {"messages": [("user", "refund A-1")]}, config, shell)
    doc = agent.get_state(config).values["tether_run"]
    agent.update_state(config, {"tether_run": UNREADABLE[how](doc)})
    with pytest.raises(tether.RunDocumentError):
        for _ in range(4):
            if not agent.get_state(config).next:
                break
            run_to_end(agent, None, config, shell)
    assert REFUNDS == []


class State(MessagesState, ta_langgraph.TetherFields):
    """A hand-built graph's state with tether's fields."""


def react(guarded: ta_langgraph.GraphGuard, replies: Iterator[Any], hand_written: bool) -> Any:
    def call_model(state: State) -> dict[str, Any]:
        return {"messages": [next(replies)]}

    builder = StateGraph(State)
    builder.add_node("model", guarded.model_node(call_model))
    if hand_written:
        builder.add_node("tools", lambda state: guarded.call_tools(state, [refund]))
    else:
        builder.add_node(
            "tools",
            ToolNode(
                [refund], wrap_tool_call=guarded.tool_wrapper, awrap_tool_call=guarded.atool_wrapper
            ),
        )
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=InMemorySaver(), interrupt_before=["tools"])


@pytest.mark.parametrize("hand_written", [False, True])
@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("how", list(UNREADABLE))
def test_graph_guard_refuses_an_unreadable_run(shell: str, hand_written: bool, how: str) -> None:
    """GraphGuard: a side effect ran twice (a new run, a new request, no ledger memory) and the
    outcome said goal_reached; now the turn is refused before the tool runs."""
    replies = itertools.chain(
        [ask("refund", {"order": "A-1"}, 0), ask("refund", {"order": "A-1"}, 1)],
        itertools.repeat(answer("Refunded.")),
    )
    guarded = ta_langgraph.GraphGuard(Guard(), side_effects=["refund"], model="fake-model")
    app = react(guarded, replies, hand_written)
    config = {"configurable": {"thread_id": f"gg-{how}-{shell}-{hand_written}"}}
    run_to_end(app, {"messages": [("user", "refund A-1")]}, config, shell)
    run_to_end(app, None, config, shell)  # the first refund, once, guarded
    assert REFUNDS == ["A-1"]
    doc = app.get_state(config).values["tether_run"]
    app.update_state(config, {"tether_run": UNREADABLE[how](doc)})
    with pytest.raises(tether.RunDocumentError):
        for _ in range(4):
            if not app.get_state(config).next:
                break
            run_to_end(app, None, config, shell)
    assert REFUNDS == ["A-1"]
