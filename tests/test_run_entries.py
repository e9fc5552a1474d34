"""A run's counts are entries (#38, case 5): each copy of a run counts in a row of its own,
the totals are their sums, and two copies of one run merge by the union of their entries:
parallel tool calls, ``Send`` branches and two workers on one thread lose no count, and a
copy merged again (a replayed update, a redelivered hook) counts nothing twice."""

from __future__ import annotations

import asyncio
import operator
import threading
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

import tether
from tether import Guard
from tether.integrations.langchain import TetherMiddleware, _newest

USAGE = {"input_tokens": 100, "output_tokens": 10, "total_tokens": 110}


def counted(guard: Guard, doc: Any) -> tuple[int, int, int, int]:
    """What a run read back from ``doc`` counts: steps, model calls, tool calls, tokens in."""
    run = guard.restore(doc)
    return run.steps, run.model_calls, run.tool_calls, run._state.input_tokens


def two_copies(guard: Guard) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A run's snapshot after a model call, and two copies read from it, each after a tool
    call of its own (two workers, two branches)."""
    run = guard.start(task="t")
    run.proceed()
    run.record_model_call(input_tokens=100, output_tokens=10)
    doc = run.snapshot()
    copies = []
    for q in ("A-1", "A-2"):
        copy = guard.restore(doc)
        copy.call_tool("lookup", lambda q: "found", {"q": q})
        copies.append(copy.snapshot())
    return doc, copies[0], copies[1]


@pytest.mark.parametrize("key", [None, "k" * 32])
def test_two_copies_from_one_snapshot_merged_count_both_calls(key: str | None) -> None:
    """Two copies read from one snapshot each run a tool: merged (the graph state's reducer),
    both calls count (before: one copy's counts were kept, 1 call), and the model call
    before them counts once; signed or not."""
    guard = Guard(signing_key=key)
    doc, a, b = two_copies(guard)
    merged = _newest(_newest(doc, a), b)
    assert counted(guard, merged) == (1, 1, 2, 100)
    assert counted(guard, _newest(_newest(doc, b), a)) == (1, 1, 2, 100)


def test_the_same_entry_merged_twice_counts_once() -> None:
    """A copy merged again (an engine's recovery replays the update, a hook redelivered)
    counts nothing twice, in any order; the merge of what is merged already is itself."""
    guard = Guard()
    doc, a, b = two_copies(guard)
    merged = _newest(_newest(doc, a), b)
    for again in (a, b, doc, merged):
        assert counted(guard, _newest(merged, again)) == (1, 1, 2, 100)
        assert counted(guard, _newest(again, merged)) == (1, 1, 2, 100)
    assert _newest(merged, a) is merged and _newest(a, a) is a


def test_a_merged_copy_goes_on_counting_from_the_union() -> None:
    """A run read back from the merged document counts on from both copies' calls (its
    budgets see them): under max_tool_calls=3, one more call runs, the next is stopped."""
    guard = Guard(budget=tether.Budget(max_tool_calls=3))
    doc, a, b = two_copies(guard)
    run = guard.restore(_newest(_newest(doc, a), b))
    ran: list[str] = []
    run.call_tool("lookup", lambda q: ran.append(q), {"q": "A-3"})
    with pytest.raises(tether.Stopped):
        run.call_tool("lookup", lambda q: ran.append(q), {"q": "A-4"})
    assert ran == ["A-3"] and run.tool_calls == 3


def test_a_merged_copy_altered_is_refused() -> None:
    """With a signing key, each copy in a merged document is checked as its writer signed
    it: a copy whose counts were lowered is refused."""
    guard = Guard(signing_key="k" * 32)
    doc, a, b = two_copies(guard)
    merged = _newest(_newest(doc, a), b)
    assert merged.get("merged")
    merged["merged"][0]["counts"] = {w: [9, *[0] * 10] for w in merged["merged"][0]["counts"]}
    with pytest.raises(tether.RunDocumentError):
        guard.restore(merged)


def test_a_document_of_version_2_is_one_row_of_entries() -> None:
    """A snapshot written by tether before entries (version 2) is read as one row: its
    totals; two copies read from it and merged count its calls once and theirs each."""
    guard = Guard()
    run = guard.start(task="t")
    run.proceed()
    run.call_tool("lookup", lambda q: "found", {"q": "A-0"})
    old = run.snapshot()
    old["version"] = 2
    del old["counts"]
    copies = []
    for q in ("A-1", "A-2"):
        copy = guard.restore(old)
        copy.call_tool("lookup", lambda q: "found", {"q": q})
        copies.append(copy.snapshot())
    assert counted(guard, old)[2] == 1
    assert counted(guard, _newest(_newest(old, copies[0]), copies[1]))[2] == 3


# --- case 5 through TetherMiddleware: each call rebuilds the run from the thread's state ----

RAN: list[str] = []
GATE: list[threading.Barrier | None] = [None]


@tool
def lookup(q: str) -> str:
    """Look an order up."""
    RAN.append(q)
    return "found"


class Model(GenericFakeChatModel):
    """LangChain's fake chat model, bindable to tools."""

    model_name: str = "fake-model"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def parallel_turn(n: int, shell: str, budget: tether.Budget) -> tether.Outcome:
    """One model turn asking ``n`` lookups at once, paused before the tools run
    (``interrupt_before``) and resumed from the checkpointer: every call reads the run
    from the checkpoint's plain copy of the state (none is the live run), as in another
    worker."""
    RAN.clear()
    calls = [{"name": "lookup", "args": {"q": f"A-{i}"}, "id": f"c{i}"} for i in range(n)]
    replies = iter([AIMessage("", tool_calls=calls, usage_metadata=USAGE),
                    AIMessage("done", usage_metadata=USAGE)])  # fmt: skip
    agent = create_agent(
        Model(messages=replies),
        tools=[lookup],
        middleware=[TetherMiddleware(Guard(budget=budget))],
        checkpointer=InMemorySaver(),
        interrupt_before=["tools"],
    )
    config = {"configurable": {"thread_id": f"t-{shell}-{n}"}}

    def go(value: Any) -> dict[str, Any]:
        if shell == "ainvoke":
            return dict(asyncio.run(agent.ainvoke(value, config)))  # type: ignore[arg-type]
        return dict(agent.invoke(value, config))  # type: ignore[arg-type]

    go({"messages": [("user", "look them up")]})
    state = go(None)
    outcome: tether.Outcome = state["tether_outcome"]
    return outcome


@pytest.mark.parametrize("shell", ["invoke", "ainvoke"])
def test_parallel_calls_each_rebuilding_the_run_are_all_counted(shell: str) -> None:
    """12 calls of one model turn, each reading the run from the thread's checkpoint: every
    call that ran is counted in the outcome (before: the state kept one call's copy, and
    the outcome counted 1-2 of 12 sync, 10-12 async)."""
    outcome = parallel_turn(12, shell, tether.Budget())
    assert outcome.usage.tool_calls == len(RAN) == 12
    assert outcome.usage.model_calls == 2 and outcome.status == "success"


@pytest.mark.parametrize("shell", ["invoke", "ainvoke"])
def test_parallel_calls_each_rebuilding_the_run_keep_max_tool_calls(shell: str) -> None:
    """Under max_tool_calls=3: 3 calls run, the outcome counts 3 and the run stops at its
    limit (before, sync: 12 ran, 1-2 counted, goal_reached)."""
    outcome = parallel_turn(12, shell, tether.Budget(max_tool_calls=3))
    assert outcome.usage.tool_calls == len(RAN) == 3
    assert outcome.stopped_because is tether.StopReason.MAX_TOOL_CALLS


# --- a hook writes what is new: its cost does not grow with the run ------------------------


def test_a_snapshot_makes_only_the_new_entries_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of 900 calls snapshotted at each hook (restored with ``reuse=``): a snapshot
    makes JSON of the entries appended since the last one only, and a restore takes only
    those as the snapshot's (before: every entry of both tails, at every hook)."""
    from tether.run import _snapshot

    guard = Guard(loops=tether.LoopPolicy(max_no_progress=None))
    run = guard.start(task="t")
    for i in range(900):
        run.proceed()
        run.call_tool("lookup", lambda q: "found", {"q": str(i)})
    run = guard.restore(run.snapshot(), reuse=run)
    made: list[Any] = []
    flat = _snapshot._flat
    monkeypatch.setattr(_snapshot, "_flat", lambda e: made.append(e) or flat(e))
    docs = [run.snapshot()]
    for q in ("x-1", "x-2"):
        run.proceed()
        run.call_tool("lookup", lambda q: "found", {"q": q})
        before = len(made)
        doc = run.snapshot()
        assert len(made) - before == 1  # the new call's line of the transcript, only
        for tail in ("partial", "transcript"):  # the entries written before: made once
            was, now = docs[-1][tail]["entries"], doc[tail]["entries"]
            assert len(now) == len(was) + 1 and all(map(operator.is_, was, now))
        assert guard.restore(doc, reuse=run) is run
        docs.append(doc)
    assert len(doc["transcript"]["entries"]) == 902
