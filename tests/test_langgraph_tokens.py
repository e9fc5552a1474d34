"""A hand-built LangGraph graph under a provider token budget (GraphGuard): the model node
reserves the state's prompt before its call, waiting or stopping the run TIMEOUT before
the call; the usage gives back what it did not use."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from tether import Budget, Guard, StopReason, TokenBudget, VirtualClock
from tether.integrations import langgraph as ta_langgraph
from tether.stores import MemoryStore

SHELLS = ["invoke", "ainvoke"]


class State(MessagesState, ta_langgraph.TetherFields):
    """The graph's state with tether's fields."""


@tool
def search(q: str) -> str:
    """Search invoices."""
    return "paid"


def app(guarded: ta_langgraph.GraphGuard, input_tokens: int, shell: str) -> tuple[Any, list[int]]:
    """LangGraph's ReAct graph: the model searches, then answers; each reply says it used
    ``input_tokens``. The list counts the model's calls."""
    made: list[int] = []
    usage = {"input_tokens": input_tokens, "output_tokens": 20, "total_tokens": input_tokens + 20}

    def reply() -> dict[str, Any]:
        made.append(1)
        if len(made) == 1:
            call = {"name": "search", "args": {"q": "99"}, "id": "c1"}
            return {"messages": [AIMessage("", tool_calls=[call], usage_metadata=usage)]}  # type: ignore[arg-type]
        return {"messages": [AIMessage("Paid.", usage_metadata=usage)]}  # type: ignore[arg-type]

    def call_model(state: State) -> dict[str, Any]:
        return reply()

    async def acall_model(state: State) -> dict[str, Any]:
        return reply()

    builder = StateGraph(State)
    builder.add_node("model", guarded.model_node(acall_model if shell == "ainvoke" else call_model))
    builder.add_node("tools", ToolNode([search], wrap_tool_call=guarded.tool_wrapper,
                                       awrap_tool_call=guarded.atool_wrapper))  # fmt: skip
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    builder.add_edge("tools", "model")
    return builder.compile(), made


def drive(shell: str, input_tokens: int, prompt: str) -> tuple[Any, list[int], TokenBudget]:
    clock = VirtualClock()
    budget = TokenBudget("openai", input_tokens_per_minute=3000, store=MemoryStore(), clock=clock)
    guard = Guard(clock=clock, token_budget=budget, budget=Budget(max_seconds=10))
    graph, made = app(ta_langgraph.GraphGuard(guard, model="gpt-6.1-terra"), input_tokens, shell)
    value = {"messages": [("user", prompt)]}
    state = asyncio.run(graph.ainvoke(value)) if shell == "ainvoke" else graph.invoke(value)
    return state, made, budget


@pytest.mark.parametrize("shell", SHELLS)
def test_the_state_s_prompt_is_reserved_before_the_model_node_calls(shell: str) -> None:
    """3,000 input tokens a minute and a prompt of 8,000 characters (~2,000 tokens, as the
    usage says): the second call, as long, would wait ~20 s, past the run's 10 s: TIMEOUT
    before the call, and the turn ends with the customer message."""
    state, made, _ = drive(shell, 2000, "find invoice 99 " + "x" * 8000)
    outcome = state["tether_outcome"]
    assert outcome.stopped_because is StopReason.TIMEOUT and "token budget" in outcome.detail
    assert len(made) == 1
    assert state["messages"][-1].content == outcome.customer_message


@pytest.mark.parametrize("shell", SHELLS)
def test_a_short_prompt_goes_through_and_its_usage_is_given_back(shell: str) -> None:
    """The same budget, a short prompt: both calls go out at once, and the bucket ends down
    by what the usage says, not by the estimate."""
    state, made, budget = drive(shell, 20, "find invoice 99")
    assert (state["tether_outcome"].status, len(made)) == ("success", 2)
    assert budget.reserved == 2 and budget.longest_wait == 0.0
    budget.flush()
    assert budget.view()["levels"]["input"] == pytest.approx(3000 - 2 * 20)
