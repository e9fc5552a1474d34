"""The run document (#38): what a framework's state, a checkpoint or a record holds of a run
is refused when it cannot be read or trusted, before any tool runs; limits come from the
guard; the document is bound to its run and request, signed, redacted once, and keeps its
effects."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
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


# --- case 2: limits from the guard; a document bound to its run and request; signed -----


SEARCHED: list[str] = []


@tool
def search(q: str) -> str:
    """Search invoices."""
    SEARCHED.append(q)
    return f"nothing for {q}"


def searching() -> Iterator[AIMessage]:
    return (ask("search", {"q": f"invoice {i}"}, i) for i in itertools.count())


@pytest.mark.parametrize("shell", SHELLS)
def test_a_forged_step_limit_is_ignored(shell: str) -> None:
    """max_steps written into the thread's run document does not widen the guard's limit: the
    search runs 3 times under max_steps=3 (it ran on past the limit)."""
    SEARCHED.clear()
    agent = create_agent(
        Model(messages=searching()),
        tools=[search],
        middleware=[TetherMiddleware(Guard(budget=tether.Budget(max_steps=3)))],
        checkpointer=InMemorySaver(),
        interrupt_before=["tools"],
    )
    config = {"configurable": {"thread_id": f"forged-steps-{shell}"}}
    state = run_to_end(agent, {"messages": [("user", "find invoices")]}, config, shell)
    doc = agent.get_state(config).values["tether_run"]
    agent.update_state(config, {"tether_run": {**doc, "max_steps": 1000}})
    for _ in range(12):
        if not agent.get_state(config).next:
            break
        state = run_to_end(agent, None, config, shell)
    assert len(SEARCHED) == 3  # one per step: the fourth is refused
    assert state["tether_outcome"].stopped_because is tether.StopReason.MAX_STEPS


def test_restore_takes_the_step_limit_from_the_guard() -> None:
    """guard.restore: a document's max_steps never widens the guard's (progress extensions
    count at most one per step taken, up to the ceiling)."""
    guard = Guard(budget=tether.Budget(max_steps=3))
    with guard.start() as run:
        run.proceed()
        doc = run.snapshot()
        run.succeed()
    assert guard.restore({**doc, "max_steps": 1000})._state._max_steps == 3
    grows = Guard(budget=tether.Budget(max_steps=3, progress_extension=2, max_steps_ceiling=9))
    assert grows.restore({**doc, "max_steps": 1000})._state._max_steps == 5  # 1 step: 1 extension
    assert grows.restore({**doc, "max_steps": 4})._state._max_steps == 3


def conversation(config: Any) -> str:
    return str(config["configurable"]["thread_id"])


@pytest.mark.parametrize("edit", ["request", "request and key"])
def test_another_conversations_request_is_refused(tmp_path: Path, edit: str) -> None:
    """A thread's run document edited to serve another conversation's request does not get
    that conversation's recorded refund back: it is refused (before: B got A's re_1 and its
    own refund never ran)."""
    guard = Guard(**stores(tmp_path))

    def agent(replies: list[AIMessage]) -> Any:
        return create_agent(
            Model(messages=iter(replies)),
            tools=[refund],
            middleware=[TetherMiddleware(guard, side_effects=["refund"], key=conversation)],
            checkpointer=saver,
            interrupt_before=["tools"],
        )

    saver = InMemorySaver()
    a, b = {"configurable": {"thread_id": "conv-a"}}, {"configurable": {"thread_id": "conv-b"}}
    first = agent([ask("refund", {"order": "A-1"}, 0), answer("Refunded.")])
    first.invoke({"messages": [("user", "refund A-1")]}, a)
    first.invoke(None, a)
    assert REFUNDS == ["A-1"]
    second = agent([ask("refund", {"order": "A-1"}, 0), answer("Refunded.")])
    second.invoke({"messages": [("user", "refund A-1")]}, b)
    doc = second.get_state(b).values["tether_run"]
    forged = {**doc, "request": "key:conv-a"}
    if edit == "request and key":
        forged["key"] = "conv-a"
    second.update_state(b, {"tether_run": forged})
    with pytest.raises(tether.RunDocumentError):
        second.invoke(None, b)
    assert REFUNDS == ["A-1"]


@pytest.mark.parametrize("signed", [False, True])
def test_another_runs_id_does_not_use_its_approval(tmp_path: Path, signed: bool) -> None:
    """A thread's run document edited to another run's id (whose refund a person approved)
    is refused: the refund does not run on that approval (before: it ran). Each turn its
    own request (``key=`` giving None): the request names the run."""
    guard = Guard(**stores(tmp_path), signing_key=b"k1" if signed else None)
    rules = {
        "side_effects": ["refund"],
        "requires_approval": {"refund": True},
        "key": lambda config: None,
    }
    saver = InMemorySaver()

    def agent(replies: list[AIMessage], **options: Any) -> Any:
        return create_agent(
            Model(messages=iter(replies)),
            tools=[refund],
            middleware=[TetherMiddleware(guard, **rules)],  # type: ignore[arg-type]
            checkpointer=saver,
            **options,
        )

    a, b = {"configurable": {"thread_id": "run-a"}}, {"configurable": {"thread_id": "run-b"}}
    asked = agent([ask("refund", {"order": "A-1"}, 0), answer("Waiting.")])
    waiting = asked.invoke({"messages": [("user", "refund A-1")]}, a)["tether_outcome"]
    assert waiting.stopped_because is tether.StopReason.AWAITING_APPROVAL
    guard.approve(waiting.checkpoint_id, by="alice")
    other = agent([ask("refund", {"order": "A-1"}, 0), answer("Refunded.")],
                  interrupt_before=["tools"])  # fmt: skip
    other.invoke({"messages": [("user", "refund A-1")]}, b)
    doc = other.get_state(b).values["tether_run"]
    forged = {**doc, "run_id": waiting.run_id}
    if signed:  # consistent with itself: only the signature tells
        forged["request"] = f"run:{waiting.run_id}"
    other.update_state(b, {"tether_run": forged})
    with pytest.raises(tether.RunDocumentError):
        other.invoke(None, b)
    assert REFUNDS == []


def test_another_runs_id_in_the_same_request_finds_no_approval(tmp_path: Path) -> None:
    """The thread is the request (the default): a document edited to another thread's run
    id, its request left as it was, finds no approval of that run (an approval is bound to
    its run's request): the refund waits for a person of its own, never runs on the other's
    approval."""
    guard = Guard(**stores(tmp_path))
    rules = {"side_effects": ["refund"], "requires_approval": {"refund": True}}
    saver = InMemorySaver()

    def agent(replies: list[AIMessage], **options: Any) -> Any:
        return create_agent(
            Model(messages=iter(replies)),
            tools=[refund],
            middleware=[TetherMiddleware(guard, **rules)],  # type: ignore[arg-type]
            checkpointer=saver,
            **options,
        )

    a, b = {"configurable": {"thread_id": "run-a"}}, {"configurable": {"thread_id": "run-b"}}
    asked = agent([ask("refund", {"order": "A-1"}, 0), answer("Waiting.")])
    waiting = asked.invoke({"messages": [("user", "refund A-1")]}, a)["tether_outcome"]
    guard.approve(waiting.checkpoint_id, by="alice")
    other = agent([ask("refund", {"order": "A-1"}, 0), answer("Refunded.")],
                  interrupt_before=["tools"])  # fmt: skip
    other.invoke({"messages": [("user", "refund A-1")]}, b)
    doc = other.get_state(b).values["tether_run"]
    assert doc["request"] == "key:run-b"
    other.update_state(b, {"tether_run": {**doc, "run_id": waiting.run_id}})
    ended = other.invoke(None, b)["tether_outcome"]
    assert ended.stopped_because is tether.StopReason.AWAITING_APPROVAL
    assert REFUNDS == []


def test_signed_documents_refuse_an_edit_an_unsigned_one_and_a_foreign_key() -> None:
    """With a signing key: the run's own document continues; altered, unsigned, or signed
    with a key the guard does not hold, it is refused; a rotated key still verifies."""
    guard = Guard(signing_key=["new", "old"])
    with Guard(signing_key="old").start() as run:
        run.proceed()
        old = run.snapshot()
        run.succeed()
    assert guard.restore(old).run_id == run.run_id  # signed with a key the guard still accepts
    with guard.start() as run:
        run.proceed()
        doc = run.snapshot()
        run.succeed()
    assert guard.restore(doc).steps == 1
    for bad in (
        {**doc, "steps": 0},
        {k: v for k, v in doc.items() if k != "signature"},
        {**doc, "signature": "hmac-sha256:" + "0" * 64},
    ):
        with pytest.raises(tether.RunDocumentError):
            guard.restore(bad)
    with pytest.raises(tether.RunDocumentError):
        Guard(signing_key="other").restore(doc)


def test_the_signing_key_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No signing_key: $TETHER_SIGNING_KEY; a bad key is refused by name."""
    monkeypatch.setenv("TETHER_SIGNING_KEY", "from-env")
    assert Guard().signing_keys == (b"from-env",)
    monkeypatch.delenv("TETHER_SIGNING_KEY")
    assert Guard().signing_keys == ()
    with pytest.raises(ValueError, match="signing_key"):
        Guard(signing_key="")


# --- case 3: no copy holds a secret in clear ----------------------------------------------

SECRETS = ("sk-live-abcdef1234567890", "4242 4242 4242 4242")


def test_a_snapshot_holds_no_secret_in_clear() -> None:
    """A non-idempotent call's API key and card number are redacted in run.snapshot()."""
    with Guard().start() as run:
        run.proceed()
        args = {"api_key": SECRETS[0], "card": SECRETS[1], "amount": 5}
        run.call_tool("charge", lambda **a: {"ok": True}, args, idempotent=False)
        text = json.dumps(run.snapshot())
        run.succeed()
    assert [s for s in SECRETS if s in text] == []


@tool
def charge(api_key: str, card: str, amount: int) -> str:
    """Charge a card."""
    REFUNDS.append(card[-4:])
    return "ch_1"


def test_the_checkpointed_graph_state_holds_no_secret_of_tethers() -> None:
    """What TetherMiddleware writes into the graph state (persisted by the checkpointer)
    holds the call's API key and card number redacted."""
    args = {"api_key": SECRETS[0], "card": SECRETS[1], "amount": 5}
    agent = create_agent(
        Model(messages=iter([ask("charge", args, 0), answer("Charged.")])),
        tools=[charge],
        middleware=[TetherMiddleware(Guard(), side_effects=["charge"])],
        checkpointer=InMemorySaver(),
        interrupt_before=["model"],
    )
    config = {"configurable": {"thread_id": "secrets"}}
    agent.invoke({"messages": [("user", "charge")]}, config)
    agent.invoke(None, config)  # the tool ran; paused before the next model call
    assert REFUNDS == ["4242"]
    text = json.dumps(agent.get_state(config).values["tether_run"])
    assert [s for s in SECRETS if s in text] == []


# --- case 4: effects travel in every form ------------------------------------------------


@tool
def issue_refund(order: str) -> str:
    """Refund an order."""
    REFUNDS.append(order)
    return f"re_{len(REFUNDS)}"


@tool
def close_ticket(ticket: str) -> str:
    """Close a ticket, once a person says yes."""
    return "closed"


@pytest.mark.parametrize("shell", SHELLS)
def test_a_run_resumed_from_its_checkpoint_tells_of_its_effects(tmp_path: Path, shell: str) -> None:
    """A LangChain turn that refunded, then waited for an approval, resumed from its checkpoint
    (tether_resume) tells the customer of the refund made before the pause, as a run restored
    from its snapshot does (the checkpoint dropped its effects)."""
    replies = [ask("issue_refund", {"order": "A-1"}, 0), ask("close_ticket", {"ticket": "T-1"}, 1),
               ask("close_ticket", {"ticket": "T-1"}, 2), answer("Done.")]  # fmt: skip
    rules = {"side_effects": ["issue_refund"], "requires_approval": {"close_ticket": True},
             "labels": {"issue_refund": "refund"}}  # fmt: skip

    def agent() -> Any:
        return create_agent(
            Model(messages=iter(replies)),
            tools=[issue_refund, close_ticket],
            middleware=[TetherMiddleware(Guard(**stores(tmp_path)), **rules)],  # type: ignore[arg-type]
        )

    first = run_to_end(agent(), {"messages": [("user", "refund A-1, close T-1")]}, None, shell)
    paused = first["tether_outcome"]
    assert paused.stopped_because is tether.StopReason.AWAITING_APPROVAL and REFUNDS == ["A-1"]
    assert "refund" in paused.customer_message
    Guard(**stores(tmp_path)).approve(paused.checkpoint_id, by="alice")
    replies[:] = replies[2:]
    resumed = run_to_end(
        agent(), {"messages": first["messages"], "tether_resume": paused.checkpoint_id}, None, shell
    )["tether_outcome"]
    assert resumed.status == "success" and REFUNDS == ["A-1"]
    assert "refund" in resumed.customer_message


# --- case 5: parallel tool calls of one model turn keep the budgets ------------------------

LOOKED: list[str] = []


PAUSE = [0.0]


@tool
def lookup(q: str) -> str:
    """Look an order up."""
    time.sleep(PAUSE[0])  # > 0: the calls of one turn overlap (ToolNode's threads)
    LOOKED.append(q)
    return "found"


def one_turn(n: int, same: bool, budget: tether.Budget, shell: str) -> tether.Outcome:
    LOOKED.clear()
    calls = [{"name": "lookup", "args": {"q": "A-1" if same else f"A-{i}"}, "id": f"c{i}"}
             for i in range(n)]  # fmt: skip
    usage = {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}
    replies = iter([AIMessage("", tool_calls=calls, usage_metadata=usage), answer("Done.")])
    agent = create_agent(
        Model(messages=replies), tools=[lookup], middleware=[TetherMiddleware(Guard(budget=budget))]
    )
    state = run_to_end(agent, {"messages": [("user", "look them up")]}, None, shell)
    outcome: tether.Outcome = state["tether_outcome"]
    return outcome


@pytest.mark.parametrize("pause", [0.0, 0.005])
@pytest.mark.parametrize("shell", SHELLS)
def test_parallel_tool_calls_respect_max_tool_calls(shell: str, pause: float) -> None:
    """12 tool calls in one model turn under max_tool_calls=3: 3 run, and the outcome counts
    3 (before: 12 ran and usage.tool_calls said 1, when each call ended before the next began)."""
    PAUSE[0] = pause
    outcome = one_turn(12, False, tether.Budget(max_tool_calls=3), shell)
    assert len(LOOKED) == 3 and outcome.usage.tool_calls == 3
    assert outcome.stopped_because is tether.StopReason.MAX_TOOL_CALLS


@pytest.mark.parametrize("shell", SHELLS)
def test_parallel_identical_calls_respect_the_repeat_cap(shell: str) -> None:
    """40 identical calls in one model turn: the repeat cap holds (2 run) and the outcome
    counts what ran (before: 16-40 ran, the outcome said 7-40)."""
    PAUSE[0] = 0.005
    outcome = one_turn(40, True, tether.Budget(), shell)
    assert len(LOOKED) == 2 and outcome.usage.tool_calls == 2
    assert outcome.stopped_because is tether.StopReason.REPEATED_ACTION


def test_identical_calls_in_flight_count_as_repeats() -> None:
    """Run level: identical calls started together (asyncio.gather) are repeats before any
    completes (before: all 10 ran)."""

    async def main() -> list[str]:
        ran: list[str] = []

        async def read(q: str) -> str:
            await asyncio.sleep(0.001)
            ran.append(q)
            return q

        with Guard().start() as run:
            run.proceed()
            results = await asyncio.gather(
                *(run.acall_tool("read", read, {"q": "A-1"}) for _ in range(10)),
                return_exceptions=True,
            )
            assert sum(not isinstance(r, BaseException) for r in results) == 2
        return ran

    assert asyncio.run(main()) == ["A-1", "A-1"]  # the third identical call is a loop
