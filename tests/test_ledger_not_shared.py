"""A run restored where its ledger cannot see its effects says so once, loudly (#38, case 7):
the restoring guard's ledger is this process's memory, and the effects were made by another
worker (here: another guard, with a ledger of its own, as another process has). With one
ledger for both, nothing is said and the effect is not made again."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import pytest

import tether
from tether import Guard, Ledger


def _first_worker(guard: Guard, paid: list[str]) -> dict[str, Any]:
    """A run that refunds A-1, then pauses: its document, as a checkpoint would keep it."""

    def refund(order: str) -> str:
        paid.append(order)
        return f"re_{len(paid)}"

    with guard.start("refund A-1") as run:
        run.call_tool("refund", refund, {"order": "A-1"}, idempotent=False)
        document = dict(run.snapshot())
    return document


def _second_worker(guard: Guard, document: dict[str, Any], paid: list[str]) -> None:
    """The run restored elsewhere (a fork replayed, a thread picked up by another worker),
    asking for the refund again."""

    def refund(order: str) -> str:
        paid.append(order)
        return f"re_{len(paid)}"

    with guard.restore(document) as run:
        run.call_tool("refund", refund, {"order": "A-1"}, idempotent=False)


def test_a_restore_on_an_in_process_ledger_that_cannot_see_the_effects_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    paid: list[str] = []
    document = _first_worker(Guard(), paid)
    elsewhere = Guard()  # another worker: its ledger is its own process's memory
    with caplog.at_level(logging.ERROR, logger="tether"):
        with pytest.warns(tether.LedgerNotShared, match="same ledger") as said:
            _second_worker(elsewhere, document, paid)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once: a second restore of the run says nothing
            elsewhere.restore(document)
    assert len(said) == 1
    assert "refund" in str(said[0].message) and "Ledger.postgres" in str(said[0].message)
    assert [r.levelname for r in caplog.records if "cannot see" in r.getMessage()] == ["ERROR"]
    assert paid == ["A-1", "A-1"]  # what the warning says: the refund ran again


def test_one_ledger_for_both_workers_says_nothing_and_pays_once(tmp_path: Path) -> None:
    paid: list[str] = []
    path = str(tmp_path / "ledger.db")
    document = _first_worker(Guard(ledger=Ledger.sqlite(path)), paid)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _second_worker(Guard(ledger=Ledger.sqlite(path)), document, paid)
    assert paid == ["A-1"]


def test_the_same_guard_in_the_same_process_says_nothing() -> None:
    paid: list[str] = []
    guard = Guard()
    document = _first_worker(guard, paid)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _second_worker(guard, document, paid)
    assert paid == ["A-1"]


# --- LangGraph time travel: a fork replayed on another worker -------------------------------


def _fork_replayed_elsewhere(first: Guard, second: Guard) -> tuple[list[str], list[Any]]:
    """Worker 1 runs a turn (the refund, then the answer) on a thread whose checkpoints are
    shared (as a PostgreSQL checkpointer is); worker 2 replays a fork of the thread from the
    checkpoint before the tools ran (LangGraph's time travel). The refunds made, and what
    worker 2 was warned of."""
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver

    from tether.integrations.langchain import TetherMiddleware

    class Model(GenericFakeChatModel):
        model_name: str = "fake-model"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    paid: list[str] = []

    @tool
    def refund(order: str) -> str:
        """Refund an order."""
        paid.append(order)
        return f"refunded {order}"

    usage = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
    saver = InMemorySaver()  # shared by the workers, as a database checkpointer is
    config: Any = {"configurable": {"thread_id": "ticket-9"}}

    def worker(guard: Guard, replies: list[AIMessage]) -> Any:
        return create_agent(
            Model(messages=iter(replies)),
            tools=[refund],
            middleware=[TetherMiddleware(guard, side_effects=["refund"])],
            checkpointer=saver,
        )

    asks = AIMessage(
        "", tool_calls=[{"name": "refund", "args": {"order": "A-1"}, "id": "r1"}],
        usage_metadata=usage,
    )  # fmt: skip
    worker(first, [asks, AIMessage("Refunded.", usage_metadata=usage)]).invoke(
        {"messages": [("user", "refund A-1")]}, config
    )
    assert paid == ["A-1"]
    agent = worker(second, [AIMessage("Refunded.", usage_metadata=usage)])
    fork = next(s for s in agent.get_state_history(config) if s.next == ("tools",))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        agent.invoke(None, fork.config)
    return paid, [w for w in said if issubclass(w.category, tether.LedgerNotShared)]


def test_a_langgraph_fork_on_a_shared_ledger_pays_once(tmp_path: Path) -> None:
    """The fork's run serves the thread's first run's request: with one ledger for the
    workers, the refund it asks for again is the one already made (each worker on its own
    in-memory ledger: 2 refunds)."""
    path = str(tmp_path / "ledger.db")
    paid, said = _fork_replayed_elsewhere(
        Guard(ledger=Ledger.sqlite(path)), Guard(ledger=Ledger.sqlite(path))
    )
    assert paid == ["A-1"]
    assert said == []


def test_a_langgraph_fork_from_before_the_effect_on_in_process_ledgers_says_so_once() -> None:
    """The fork is replayed from the checkpoint before the refund: its run document names no
    effect, so nothing could be seen missing, and the refund ran twice in silence. The
    document names the in-process ledger it was written on: the second worker is told, once,
    at the refund (which still runs: that is what the warning says)."""
    paid, said = _fork_replayed_elsewhere(Guard(), Guard())
    assert paid == ["A-1", "A-1"]
    assert len(said) == 1
    text = str(said[0].message)
    assert "fork" in text and "refund" in text and "Ledger.postgres" in text


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_document_from_before_the_effect_restored_on_another_ledger_says_so(shell: str) -> None:
    """A snapshot taken before any effect, restored under another guard whose ledger is its
    own process memory: its first effect says so, once; a read-only call says nothing."""
    import asyncio

    run = Guard().start("refund A-1")
    run.proceed()
    document = run.snapshot()
    elsewhere = Guard()
    paid: list[str] = []

    def refund(order: str) -> str:
        paid.append(order)
        return "ok"

    async def arefund(order: str) -> str:
        return refund(order)

    def call(again: tether.Run, args: dict[str, Any], idempotent: bool) -> None:
        if shell == "sync":
            again.call_tool("refund", refund, args, idempotent=idempotent)
        else:
            asyncio.run(again.acall_tool("refund", arefund, args, idempotent=idempotent))

    again = elsewhere.restore(document)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again.proceed()
        call(again, {"order": "lookup"}, True)  # not an effect: nothing said
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for order in ("A-1", "A-2"):
            again.proceed()
            call(again, {"order": order}, False)
    said = [w for w in said if issubclass(w.category, tether.LedgerNotShared)]
    assert "another in-process ledger" in str(said[0].message)
    assert len(said) == 1 and paid == ["lookup", "A-1", "A-2"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the guard whose ledger wrote it: nothing said
        same = Guard()
        mine = same.start("t")
        mine.proceed()
        doc = mine.snapshot()
        restored = same.restore(doc)
        restored.proceed()
        restored.call_tool("refund", refund, {"order": "A-3"}, idempotent=False)
