"""Hand-built LangGraph graphs compiled once, guarded per thread (GraphGuard): the model node,
ToolNode's wrappers, a hand-written tool node; pauses; model failures; a cost budget."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.channels.untracked_value import UntrackedValue
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph, add_messages
from langgraph.prebuilt import ToolNode, tools_condition

import tether
from tether import Guard, Price, PriceTable, StopReason
from tether.integrations import langgraph as ta_langgraph


class State(MessagesState, ta_langgraph.TetherFields):
    """The graph's state with tether's fields."""


def ask(i: int) -> AIMessage:
    return AIMessage(
        "",
        tool_calls=[{"name": "search", "args": {"q": "99"}, "id": f"c{i}"}],
        usage_metadata={"input_tokens": 1000, "output_tokens": 100, "total_tokens": 1100},
    )


def answer(text: str) -> AIMessage:
    return AIMessage(
        text, usage_metadata={"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
    )


SEARCHED: list[str] = []


@tool
def search(q: str) -> str:
    """Search invoices."""
    SEARCHED.append(q)
    return "no result"


@pytest.fixture(autouse=True)
def _fresh() -> None:
    SEARCHED.clear()


def graph(
    guarded: ta_langgraph.GraphGuard,
    replies: Callable[[], Iterator[Any]],
    *,
    hand_written: bool = False,
    tools: tuple[Any, ...] = (search,),
    **compile_args: Any,
) -> Any:
    """The ReAct graph of LangGraph's docs, compiled once; ``replies()`` gives a thread's model."""
    models: dict[str, Iterator[Any]] = {}

    def next_reply(config: Any) -> Any:
        thread = config["configurable"].get("thread_id", "-")
        reply = next(models.setdefault(thread, replies()))
        if isinstance(reply, Exception):
            raise reply
        return reply

    def call_model(state: State, config: Any) -> dict[str, Any]:
        return {"messages": [next_reply(config)]}

    async def acall_model(state: State, config: Any) -> dict[str, Any]:
        return {"messages": [next_reply(config)]}

    builder = StateGraph(State)
    builder.add_node("model", guarded.model_node(call_model))
    builder.add_node("amodel", guarded.model_node(acall_model))
    if hand_written:
        builder.add_node("tools", lambda state: guarded.call_tools(state, tools))
    else:
        builder.add_node(
            "tools",
            ToolNode(
                list(tools),
                wrap_tool_call=guarded.tool_wrapper,
                awrap_tool_call=guarded.atool_wrapper,
            ),
        )
    builder.add_conditional_edges(START, lambda s: "amodel" if ASYNC[0] else "model")
    for name in ("model", "amodel"):
        builder.add_conditional_edges(name, tools_condition, {"tools": "tools", END: END})
    builder.add_conditional_edges("tools", lambda s: "amodel" if ASYNC[0] else "model")
    return builder.compile(**compile_args)


ASYNC = [False]


def call(app: Any, value: Any, thread: str, shell: str) -> dict[str, Any]:
    ASYNC[0] = shell == "ainvoke"
    config = {"configurable": {"thread_id": thread}}
    if shell == "ainvoke":
        return dict(asyncio.run(app.ainvoke(value, config)))
    return dict(app.invoke(value, config))


USER = {"messages": [("user", "find invoice 99")]}
SHELLS = ["invoke", "ainvoke"]


def stuck() -> Iterator[Any]:
    return (ask(i) for i in itertools.count())


@pytest.mark.parametrize("hand_written", [False, True])
@pytest.mark.parametrize("shell", SHELLS)
def test_one_compiled_graph_guards_every_thread(shell: str, hand_written: bool) -> None:
    """Compiled once, two threads: each stuck search runs twice, and the last message is the
    customer message (never 'stopped: ...')."""
    app = graph(ta_langgraph.GraphGuard(Guard()), stuck, hand_written=hand_written)
    for thread in ("t1", "t2"):
        state = call(app, USER, thread, shell)
        outcome = state["tether_outcome"]
        assert outcome.stopped_because is StopReason.REPEATED_ACTION
        assert state["messages"][-1].content == outcome.customer_message
    assert SEARCHED == ["99"] * 4


@pytest.mark.parametrize("shell", SHELLS)
def test_a_turn_that_answers_ends_in_success(shell: str) -> None:
    """The model answers after a search: the run ends with succeed(), the answer stays last."""
    app = graph(
        ta_langgraph.GraphGuard(Guard()), lambda: iter([ask(0), answer("Invoice 99 is paid.")])
    )
    state = call(app, USER, "ok", shell)
    outcome = state["tether_outcome"]
    assert (outcome.status, outcome.result) == ("success", "Invoice 99 is paid.")
    assert state["messages"][-1].content == "Invoice 99 is paid."
    assert (outcome.usage.steps, outcome.usage.model_calls, outcome.usage.tool_calls) == (2, 2, 1)


def test_a_cost_budget_holds() -> None:
    """$0.01 a call, a $0.025 budget: two model calls, never a third; usage counted."""
    guard = Guard(
        budget=tether.Budget(max_cost_usd=0.025),
        loops=tether.LoopPolicy(max_repeats=None),
        prices=PriceTable({"fake-model": Price(input=10.0, output=0.0)}),
    )
    app = graph(ta_langgraph.GraphGuard(guard, model="fake-model"), stuck)
    outcome = call(app, USER, "cost", "invoke")["tether_outcome"]
    assert outcome.stopped_because is StopReason.MAX_COST
    assert outcome.usage.model_calls == 2 and outcome.usage.cost_usd == pytest.approx(0.02)


class Overloaded(Exception):
    status_code = 529


@pytest.mark.parametrize("shell", SHELLS)
def test_model_failures_end_in_an_outcome(shell: str) -> None:
    """Two 529s then an answer: 2 retries, one step. Always 529: ERROR with the customer
    message last, no exception. A ValueError (a bug, not an outage): one attempt, PERMANENT_ERROR."""
    guarded = ta_langgraph.GraphGuard(Guard(retry=tether.RetryPolicy(base=0.001, cap=0.002)))
    app = graph(guarded, lambda: iter([Overloaded("busy"), Overloaded("busy"), answer("Done.")]))
    outcome = call(app, USER, "flaky", shell)["tether_outcome"]
    assert (outcome.status, outcome.usage.retries, outcome.usage.steps) == ("success", 2, 1)

    app = graph(guarded, lambda: itertools.repeat(Overloaded("busy")))
    state = call(app, USER, "down", shell)
    assert state["tether_outcome"].stopped_because is StopReason.ERROR
    assert state["messages"][-1].content == state["tether_outcome"].customer_message

    tries: list[int] = []

    def bug() -> Iterator[Any]:
        while True:
            tries.append(1)
            yield ValueError("bad prompt template")

    state = call(graph(guarded, bug), USER, "bug", shell)
    assert state["tether_outcome"].stopped_because is StopReason.PERMANENT_ERROR and len(tries) == 1


CALLED: list[str] = []


@tool("search")
def broken_search(q: str) -> str:
    """Search invoices (a deployment without its module)."""
    CALLED.append(q)
    import tether_no_such_module  # type: ignore[import-not-found]  # noqa: F401

    return "never"


@tool("search")
def misused_search(q: str) -> str:
    """Search invoices (a helper called with the wrong signature)."""
    CALLED.append(q)
    return str(sorted(q, q, q))  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("where", "error"),
    [
        ("model", NameError),
        ("ToolNode", ModuleNotFoundError),
        ("hand-written", ModuleNotFoundError),
        ("hand-written", TypeError),
    ],
)
@pytest.mark.parametrize("shell", SHELLS)
def test_a_programming_error_is_raised_after_the_run_is_filed(
    shell: str, where: str, error: type[Exception], tmp_path: Any
) -> None:
    """#40 case 7: a bug in the model node or a tool (an ImportError, a NameError, a TypeError
    from a bad call) is raised out of invoke, as a plain program raises it, tried once; never
    "try again later" to the customer nor a rejection to the model. The run is ended and
    filed first (permanent_error)."""
    CALLED.clear()
    records = tether.Records.sqlite(str(tmp_path / "records.db"))
    guarded = ta_langgraph.GraphGuard(Guard(records=records))
    tries: list[int] = []

    def replies() -> Iterator[Any]:
        if where == "model":
            tries.append(1)
            yield NameError("name 'prompt' is not defined")
        yield ask(0)
        yield answer("Invoice 99 is paid.")

    tool_ = misused_search if error is TypeError else broken_search
    app = graph(guarded, replies, hand_written=where == "hand-written", tools=(tool_,))
    with pytest.raises(error):
        call(app, USER, f"bug-{where}", shell)
    runs = records.runs.list()
    assert [r["reason"] for r in runs] == ["permanent_error"], runs
    assert len(tries) == 1 if where == "model" else CALLED == ["99"]


@pytest.mark.parametrize("shell", SHELLS)
def test_interrupt_before_tools_keeps_the_run(shell: str) -> None:
    """The customer-support tutorial's approval (interrupt_before=["tools"]): every
    continuation is the same run; the stuck search stops at 2."""
    app = graph(
        ta_langgraph.GraphGuard(Guard()),
        stuck,
        checkpointer=InMemorySaver(),
        interrupt_before=["tools"],
    )
    state = call(app, USER, "approve", shell)
    for _ in range(10):
        if not app.get_state({"configurable": {"thread_id": "approve"}}).next:
            break
        state = call(app, None, "approve", shell)
    assert SEARCHED == ["99", "99"]
    assert state["tether_outcome"].stopped_because is StopReason.REPEATED_ACTION


def test_the_one_run_recipe_ends_its_run_with_the_answer() -> None:
    """docs/langchain.md's per-invocation recipe: a model that answers after one search ends
    the run in success (run.succeed), not 'failed' with 'We could not complete...'."""

    class Model(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    model = Model(messages=iter([ask(0), answer("Invoice 99 is paid.")]))
    with Guard().start(task="find invoice 99") as run:

        def think(state: MessagesState) -> dict[str, Any]:
            if not run.proceed():
                return {}
            reply = model.invoke(state["messages"])
            if not reply.tool_calls:
                run.succeed(reply.content)
            return {"messages": [reply]}

        builder = StateGraph(MessagesState)
        builder.add_node("model", think)
        builder.add_node("tools", ToolNode([search], wrap_tool_call=ta_langgraph.tool_wrapper(run)))
        builder.add_edge(START, "model")
        builder.add_conditional_edges("model", lambda s: END if run.stopped else "tools")
        builder.add_conditional_edges("tools", lambda s: END if run.stopped else "model")
        builder.compile().invoke(USER)
    assert (run.outcome.status, run.outcome.result) == ("success", "Invoice 99 is paid.")


def test_a_dataclass_state_declares_the_three_fields() -> None:
    """The react-agent template's state is a dataclass: with tether's three fields (the
    reducer ta_langgraph.newest_run) the same graph is guarded."""

    @dataclass
    class DState:
        messages: Annotated[list[Any], add_messages] = field(default_factory=list)
        tether_run: Annotated[Any, ta_langgraph.newest_run] = None
        tether_outcome: Annotated[Any, UntrackedValue] = None
        tether_ended: Any = None

    replies = stuck()
    guarded = ta_langgraph.GraphGuard(Guard())
    builder = StateGraph(DState)
    builder.add_node("model", guarded.model_node(lambda state: {"messages": [next(replies)]}))
    builder.add_node("tools", ToolNode([search], wrap_tool_call=guarded.tool_wrapper))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    state = builder.compile().invoke(USER)
    assert SEARCHED == ["99", "99"]
    assert state["tether_outcome"].stopped_because is StopReason.REPEATED_ACTION


class RateLimited(Exception):
    status_code = 429
    headers = {"retry-after": "0.3"}


@pytest.mark.parametrize("shell", SHELLS)
def test_retry_policy_waits_the_retry_after(shell: str) -> None:
    """ta_langgraph.retry_policy on a node: a 429 with Retry-After 0.3 s is retried after at
    least 0.3 s (LangGraph's own interval, 0.01 s, is the floor it raises)."""
    import time

    from langgraph.graph import END as _END

    attempts: list[float] = []

    def node(state: MessagesState) -> dict[str, Any]:
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            raise RateLimited("slow down")
        return {"messages": [answer("ok")]}

    async def anode(state: MessagesState) -> dict[str, Any]:
        return node(state)

    policy = ta_langgraph.retry_policy(max_attempts=3, initial_interval=0.01, jitter=False)
    builder = StateGraph(MessagesState)
    builder.add_node("n", anode if shell == "ainvoke" else node, retry_policy=policy)
    builder.add_edge(START, "n")
    builder.add_edge("n", _END)
    app = builder.compile()
    asyncio.run(app.ainvoke(USER)) if shell == "ainvoke" else app.invoke(USER)
    assert len(attempts) == 2 and attempts[1] - attempts[0] >= 0.3


@pytest.mark.parametrize("shell", SHELLS)
def test_a_spent_budget_scope_pauses_the_turn(shell: str) -> None:
    """GraphGuard(guard, scopes=...): the tenant's scope allows 3 model calls; the 4th is
    never made, the turn's run is paused BUDGET_REACHED with the customer message last."""
    scopes = tether.BudgetScopes()
    scopes.limit("tenant:acme", max_model_calls=3)
    guard = Guard(
        scopes=scopes,
        loops=tether.LoopPolicy(max_repeats=None),
        prices=PriceTable({"fake-model": Price(input=10.0, output=0.0)}),
        checkpoints=tether.Checkpoints.memory(),
    )
    guarded = ta_langgraph.GraphGuard(guard, model="fake-model", scopes=("tenant:acme",))
    state = call(graph(guarded, stuck), USER, f"scoped-{shell}", shell)
    outcome = state["tether_outcome"]
    assert (outcome.status, outcome.stopped_because) == ("paused", StopReason.BUDGET_REACHED)
    assert outcome.usage.model_calls == 3 == scopes.spent("tenant:acme").model_calls
    assert state["messages"][-1].content == outcome.customer_message
