"""LangChain v1 agents and LangGraph graphs under tether, with a fake tool-calling model."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool

import tether
from tether import Budget, Guard, LoopPolicy, Price, PriceTable, StopReason
from tether.integrations.langchain import TetherMiddleware


class FakeToolModel(GenericFakeChatModel):
    """LangChain's fake chat model, able to be bound to tools (it ignores them)."""

    model_name: str = "fake-model"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def calls(name: str, args: Any, usage: int = 1000) -> Iterator[AIMessage]:
    """A model that asks for the same tool forever (``args`` may be a function of i)."""
    for i in itertools.count():
        yield AIMessage(content="", tool_calls=[{"name": name, "args": args(i) if callable(args) else args,
                                                 "id": f"call_{i}"}],
                        usage_metadata={"input_tokens": usage, "output_tokens": 100, "total_tokens": usage + 100})  # fmt: skip


def then_answer(first: Iterator[AIMessage], n: int, answer: str) -> Iterator[AIMessage]:
    yield from itertools.islice(first, n)
    yield AIMessage(
        content=answer, usage_metadata={"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
    )


USER = {"messages": [("user", "find invoice 99")]}


def search_tool() -> tuple[Any, list[str]]:
    """A search tool that finds nothing, and the list of the queries it ran."""
    searched: list[str] = []

    @tool
    def search(q: str) -> str:
        """Search invoices."""
        searched.append(q)
        return "no result"

    return search, searched


def test_a_stuck_agent_runs_its_search_twice() -> None:
    """search(q="invoice 99") forever: 2 executions, REPEATED_ACTION, the customer message last."""
    search, searched = search_tool()

    agent = create_agent(FakeToolModel(messages=calls("search", {"q": "invoice 99"})), tools=[search],
                         middleware=[TetherMiddleware(Guard(budget=Budget(max_steps=30)))])  # fmt: skip
    state = agent.invoke(USER)
    outcome = state["tether_outcome"]
    assert searched == ["invoice 99", "invoice 99"]
    assert outcome.stopped_because is StopReason.REPEATED_ACTION
    assert state["messages"][-1].content == outcome.customer_message
    assert outcome.usage.model_calls == 3


def test_the_same_through_ainvoke() -> None:
    """ainvoke: the same stop, async tools awaited."""
    searched: list[str] = []

    @tool
    async def search(q: str) -> str:
        """Search invoices."""
        searched.append(q)
        return "no result"

    agent = create_agent(FakeToolModel(messages=calls("search", {"q": "invoice 99"})), tools=[search],
                         middleware=[TetherMiddleware(Guard(budget=Budget(max_steps=30)))])  # fmt: skip
    state = asyncio.run(agent.ainvoke(USER))
    assert searched == ["invoice 99", "invoice 99"]
    assert state["tether_outcome"].stopped_because is StopReason.REPEATED_ACTION


def test_a_refund_re_requested_with_a_fresh_uuid_runs_once() -> None:
    """The refund commits then times out; the model asks again with a new uuid: 1 execution,
    settled through the lookup."""
    provider: dict[str, dict[str, Any]] = {}

    @tool
    def issue_refund(order: str, uuid: str) -> str:
        """Refund an order."""
        provider[order] = {"id": f"re_{len(provider) + 1}", "order": order}
        raise TimeoutError("read timed out")

    def lookup(key: str) -> Any:
        return provider.get("A-1")

    model = FakeToolModel(messages=then_answer(
        calls("issue_refund", lambda i: {"order": "A-1", "uuid": uuid.uuid4().hex}), 2, "Refunded."))  # fmt: skip
    guard = Guard(
        retry=tether.RetryPolicy(base=0.01, cap=0.02), loops=LoopPolicy(max_no_progress=None)
    )
    agent = create_agent(model, tools=[issue_refund],
                         middleware=[TetherMiddleware(guard, side_effects={"issue_refund": lookup})])  # fmt: skip
    state = agent.invoke({"messages": [("user", "refund order A-1")]})
    assert list(provider) == ["A-1"] and provider["A-1"]["id"] == "re_1"
    replies = [m.content for m in state["messages"] if m.type == "tool"]
    assert all('"re_1"' in r for r in replies) and len(replies) == 2
    assert state["tether_outcome"].status == "success"


def test_a_cost_budget_stops_before_the_call_that_would_pass_it() -> None:
    """$0.01 a call (priced for the fake model), a $0.025 budget: two calls, never a third."""
    prices = PriceTable({"fake-model": Price(input=10.0, output=0.0)})
    guard = Guard(
        budget=Budget(max_cost_usd=0.025), prices=prices, loops=LoopPolicy(max_repeats=None)
    )
    seen: list[int] = []

    @tool
    def page(n: int) -> str:
        """Read a page."""
        seen.append(n)
        return f"page {n}"

    agent = create_agent(FakeToolModel(messages=calls("page", lambda i: {"n": i})), tools=[page],
                         middleware=[TetherMiddleware(guard)])  # fmt: skip
    outcome = agent.invoke(USER)["tether_outcome"]
    assert outcome.stopped_because is StopReason.MAX_COST
    assert outcome.usage.model_calls == 2 and outcome.usage.cost_usd <= 0.025


def test_a_polling_tool_is_not_stopped() -> None:
    """job_status is allowed to repeat: 6 identical polls, then the answer."""
    polled: list[str] = []

    @tool
    def job_status(job: str) -> str:
        """Poll a job."""
        polled.append(job)
        return "done" if len(polled) == 6 else "running"

    model = FakeToolModel(
        messages=then_answer(calls("job_status", {"job": "j-1"}), 6, "The job is done.")
    )
    agent = create_agent(model, tools=[job_status], middleware=[TetherMiddleware(Guard())])
    state = agent.invoke(USER)
    assert len(polled) == 6
    assert (
        state["tether_outcome"].status == "success"
        and state["tether_outcome"].result == "The job is done."
    )


def test_a_hand_built_graph_with_a_guarded_tool_node() -> None:
    """A StateGraph whose ToolNode runs through a run: the stuck search stops at 2."""
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    from tether.integrations import langgraph as ta_langgraph

    search, searched = search_tool()

    model = FakeToolModel(messages=calls("search", {"q": "invoice 99"}))

    with Guard().start(task="find invoice 99") as run:

        def think(state: MessagesState) -> dict[str, Any]:  # one model call is one step
            return {"messages": [model.invoke(state["messages"])]} if run.proceed() else {}

        graph = StateGraph(MessagesState)
        graph.add_node("model", think)
        graph.add_node("tools", ToolNode([search], wrap_tool_call=ta_langgraph.tool_wrapper(run)))
        graph.add_edge(START, "model")
        graph.add_conditional_edges("model", lambda state: END if run.stopped else "tools")
        graph.add_conditional_edges("tools", lambda state: END if run.stopped else "model")
        graph.compile().invoke(USER)
    assert searched == ["invoice 99", "invoice 99"]
    assert run.outcome.stopped_because is StopReason.REPEATED_ACTION


def test_langgraph_retry_policy_uses_tether_classify() -> None:
    """retry_on follows tether.classify: a 503 yes, a quota no, a ValueError no."""
    from tether.integrations.langgraph import retry_policy

    class Busy(Exception):
        status_code = 503

    class Quota(Exception):
        status_code = 429
        body = {"error": {"code": "insufficient_quota"}}

    policy = retry_policy(max_attempts=4)
    assert policy.max_attempts == 4
    assert (policy.retry_on(Busy()), policy.retry_on(Quota()), policy.retry_on(ValueError())) == (
        True,
        False,
        False,
    )


class Overloaded(Exception):
    status_code = 529


def test_model_failures_are_retried_at_one_layer_then_end_the_run_gracefully() -> None:
    """Two 529s then an answer: retried by tether; always 529: the run stops ERROR and the
    customer message ends the conversation (no exception out of invoke)."""

    class Replies:
        """Fails ``failures`` times (an overloaded provider), then answers."""

        def __init__(self, failures: int) -> None:
            self.failures = failures

        def __iter__(self) -> Replies:
            return self

        def __next__(self) -> AIMessage:
            if self.failures > 0:
                self.failures -= 1
                raise Overloaded("overloaded")
            return AIMessage(content="all good", usage_metadata={"input_tokens": 1, "output_tokens": 1,
                                                                 "total_tokens": 2})  # fmt: skip

    guard = Guard(retry=tether.RetryPolicy(base=0.001, cap=0.002))
    agent = create_agent(
        FakeToolModel(messages=Replies(2)), tools=[], middleware=[TetherMiddleware(guard)]
    )
    state = agent.invoke(USER)
    assert (
        state["tether_outcome"].status == "success" and state["tether_outcome"].usage.retries == 2
    )

    agent = create_agent(
        FakeToolModel(messages=Replies(10**6)), tools=[], middleware=[TetherMiddleware(guard)]
    )
    state = agent.invoke(USER)
    outcome = state["tether_outcome"]
    assert outcome.stopped_because is StopReason.ERROR
    assert state["messages"][-1].content == outcome.customer_message


@pytest.mark.parametrize("shell", ["invoke", "ainvoke"])
def test_a_models_programming_error_is_raised_after_the_run_is_filed(
    shell: str, tmp_path: Any
) -> None:
    """#40 case 7: a model call that fails with a programming error (a TypeError of a bad
    call) is tried once and raised out of invoke, the run ended and filed first; never the
    customer's "try again later"."""
    tries: list[int] = []

    class Buggy(FakeToolModel):
        def _generate(self, *args: Any, **kwargs: Any) -> Any:
            tries.append(1)
            raise TypeError("create() got an unexpected keyword argument 'temprature'")

    records = tether.Records.sqlite(str(tmp_path / "records.db"))
    guard = Guard(records=records, retry=tether.RetryPolicy(base=0.001, cap=0.002))
    agent = create_agent(Buggy(messages=iter([])), tools=[], middleware=[TetherMiddleware(guard)])
    with pytest.raises(TypeError, match="temprature"):
        agent.invoke(USER) if shell == "invoke" else asyncio.run(agent.ainvoke(USER))
    assert [r["reason"] for r in records.runs.list()] == ["permanent_error"] and tries == [1]


def test_a_guard_stop_drains_the_graph_with_a_resumable_checkpoint() -> None:
    """With LangGraph's RunControl, the stop drains the run: GraphDrained, checkpoint saved."""
    import pytest
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.errors import GraphDrained
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode
    from langgraph.runtime import RunControl

    from tether.integrations import langgraph as ta_langgraph

    search, searched = search_tool()

    model = FakeToolModel(messages=calls("search", {"q": "invoice 99"}))
    control = RunControl()
    with Guard().start(task="find invoice 99") as run:

        def think(state: MessagesState) -> dict[str, Any]:
            run.proceed()
            return {"messages": [model.invoke(state["messages"])]}

        graph = StateGraph(MessagesState)
        graph.add_node("model", think)
        graph.add_node(
            "tools",
            ToolNode([search], wrap_tool_call=ta_langgraph.tool_wrapper(run, control=control)),
        )
        graph.add_edge(START, "model")
        graph.add_edge("model", "tools")
        graph.add_edge("tools", "model")
        app = graph.compile(checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": "t-1"}}
        with pytest.raises(GraphDrained, match="tether: repeated_action"):
            app.invoke(USER, config, control=control)
    assert searched == ["invoice 99", "invoice 99"]
    saved = app.get_state(config)
    assert saved.values["messages"] and saved.next  # a checkpoint to resume from


def test_tool_guard_keeps_its_positional_rules() -> None:
    """``ToolGuard(side_effects, timeouts, requires_approval, compensate)`` as documented."""
    from tether.integrations.langchain import ToolGuard

    undo = {"refund": lambda result: None}
    tools = ToolGuard({"refund": False}, {"refund": 2.0}, {"refund": True}, undo)
    assert tools.timeouts == {"refund": 2.0}
    assert tools.rules.needing_approval() == ["refund"]
