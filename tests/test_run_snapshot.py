"""A run as plain data (run.snapshot() / guard.restore()), a framework's control flow through
call_tool (passthrough=), a per-call repeat cap (allow_repeat=)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import tether
from tether import Guard, Stopped, StopReason


def test_a_restored_run_goes_on_where_it_was() -> None:
    """Two searches, a snapshot through JSON, a new process's guard: the third identical
    search never runs, and the usage counts from before the snapshot."""
    searched: list[str] = []

    def search(q: str) -> str:
        searched.append(q)
        return "no result"

    run = Guard(budget=tether.Budget(max_steps=10)).start(task="find 99", key="ticket-1")
    for _ in range(2):
        assert run.proceed()
        run.record_model_call(input_tokens=10, output_tokens=2)
        run.call_tool("search", search, {"q": "99"})
    doc = json.loads(json.dumps(run.snapshot()))
    again = Guard(budget=tether.Budget(max_steps=10)).restore(doc)
    assert (again.run_id, again.key) == (run.run_id, "ticket-1")
    assert again.proceed()
    with pytest.raises(Stopped) as stop:
        again.call_tool("search", search, {"q": "99"})
    assert stop.value.reason is StopReason.REPEATED_ACTION and searched == ["99", "99"]
    usage = again.outcome.usage
    assert (usage.steps, usage.model_calls, usage.tool_calls, usage.input_tokens) == (3, 2, 2, 20)


def test_a_restored_run_keeps_its_request_for_the_ledger() -> None:
    """A payment done before the snapshot is not done again by the restored run."""
    paid: list[str] = []
    guard = Guard()
    run = guard.start(task="pay")
    run.proceed()
    run.call_tool("pay", lambda order: paid.append(order) or "ok", {"order": "A"}, idempotent=False)
    again = guard.restore(json.loads(json.dumps(run.snapshot())))
    again.proceed()
    result = again.call_tool(
        "pay", lambda order: paid.append(order) or "ok", {"order": "A"}, idempotent=False
    )
    assert (paid, result) == (["A"], "ok")


@pytest.mark.parametrize("bad", [None, {"version": 99}, {"version": 1, "run_id": 3}])
def test_a_bad_snapshot_is_refused_by_name(bad: Any) -> None:
    """A snapshot that is not one, or of another version, or with a bad field: CheckpointError."""
    with pytest.raises(tether.CheckpointError, match="snapshot"):
        Guard().restore(bad)


class Pause(Exception):
    """A framework's control flow (as LangGraph's GraphInterrupt, an Exception)."""


@pytest.mark.parametrize("idempotent", [True, False])
@pytest.mark.parametrize("shell", ["sync", "async"])
def test_passthrough_leaves_untouched_and_the_call_is_not_made(
    idempotent: bool, shell: str
) -> None:
    """A passthrough exception leaves call_tool as it is (not retried, not recorded, the ledger
    claim given back); the call made again after it runs for real, once."""
    done: list[str] = []
    paused = [True]

    def book(hotel: str) -> str:
        if paused[0]:
            raise Pause("ask a person")
        done.append(hotel)
        return "booked"

    async def abook(hotel: str) -> str:
        return book(hotel)

    run = Guard().start(task="book")
    run.proceed()

    def call() -> Any:
        if shell == "async":
            return asyncio.run(
                run.acall_tool(
                    "book", abook, {"hotel": "H"}, idempotent=idempotent, passthrough=(Pause,)
                )
            )
        return run.call_tool(
            "book", book, {"hotel": "H"}, idempotent=idempotent, passthrough=(Pause,)
        )

    with pytest.raises(Pause, match="ask a person"):
        call()
    assert (run.tool_calls, run.retries, list(run.transcript), run.stopped) == (0, 0, [], None)
    paused[0] = False
    assert call() == "booked" and done == ["H"]


def test_passthrough_must_be_exception_types() -> None:
    """passthrough= names exception types, in a tuple."""
    run = Guard().start(task="t")
    run.proceed()
    with pytest.raises(TypeError, match="passthrough"):
        run.call_tool("t", lambda: 1, {}, passthrough=[Pause])  # type: ignore[arg-type]


def test_a_per_call_repeat_cap_lets_a_read_poll() -> None:
    """allow_repeat=10 on the call: 6 identical polls run; without it the 3rd is a repeat."""
    polls: list[int] = []
    run = Guard().start(task="poll")
    for _ in range(6):
        run.proceed()
        run.call_tool(
            "check", lambda job: polls.append(1) or "running", {"job": "j"}, allow_repeat=10
        )
    assert len(polls) == 6 and run.stopped is None
    other = Guard().start(task="poll")
    with pytest.raises(Stopped):
        for _ in range(6):
            other.proceed()
            other.call_tool("check", lambda job: "running", {"job": "j"})
    assert other.stopped is StopReason.REPEATED_ACTION
    with pytest.raises(ValueError, match="allow_repeat"):
        run.call_tool("check", lambda job: "x", {"job": "j"}, allow_repeat=0)


def test_a_run_restored_many_times_keeps_its_calls_as_they_were() -> None:
    """A framework snapshots and restores a run at every hook: the calls recorded before
    come back the same each time (an argument whose name starts with ``$`` gained one more
    escape per cycle), and the outcome reads them as that of a run restored once."""
    guard = Guard()

    def play(cycles: int) -> tuple[list[Any], tether.Outcome]:
        run = guard.start(task="lookup")
        run.proceed()
        run.call_tool("lookup", lambda **a: {"$ref": "A-1"}, {"$filter": "open", "q": "99"})
        seen = []
        for _ in range(cycles):
            doc = json.loads(json.dumps(run.snapshot()))
            seen.append(doc["partial"]["entries"])
            run = guard.restore(doc)
        run.succeed("done")
        run.__exit__(None, None, None)
        return seen, run.outcome

    (first,), once = play(1)
    seen, many = play(5)
    assert seen == [first] * 5
    assert [(e["args"], e["result"]) for e in many.partial] == [
        (e["args"], e["result"]) for e in once.partial
    ]


def _normal(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` without its time, its entries as their sums (each copy of a run counts under
    a writer id of its own: a run continued and a run rebuilt count the same in other rows)."""
    rows = list(doc["counts"].values())
    sums = [round(sum(r[i] for r in rows), 9) for i in range(1, len(rows[0]))] if rows else []
    return {k: v for k, v in doc.items() if k not in ("elapsed", "counts")} | {"counts": sums}


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_restore_reusing_the_run_is_restore(shell: str) -> None:
    """``guard.restore(doc, reuse=run)`` with the run ``doc`` was just taken of: that run,
    and from there on the same snapshots and the same behaviour as a rebuilt run (a
    repeated search stopped, the usage counted on), in both shells."""
    guard = Guard(budget=tether.Budget(max_steps=10))
    searched: list[str] = []

    def search(q: str) -> str:
        searched.append(q)
        return "no result"

    async def asearch(q: str) -> str:
        return search(q)

    def go_on(run: tether.Run) -> tuple[Any, ...]:
        assert run.proceed()
        run.record_model_call(input_tokens=10, output_tokens=2)
        with pytest.raises(Stopped) as stop:
            if shell == "sync":
                run.call_tool("search", search, {"q": "99"})
            else:
                asyncio.run(run.acall_tool("search", asearch, {"q": "99"}))
        outcome = run.outcome
        return (_normal(run.snapshot()), stop.value.reason, outcome.status, outcome.usage.steps)

    run = guard.start(task="find 99")
    for _ in range(2):
        assert run.proceed()
        run.record_model_call(input_tokens=10, output_tokens=2)
        run.call_tool("search", search, {"q": "99"})
    doc = run.snapshot()
    rebuilt = guard.restore(doc)
    reused = guard.restore(doc, reuse=run)
    assert reused is run and _normal(reused.snapshot()) == _normal(rebuilt.snapshot())
    assert go_on(reused) == go_on(rebuilt)
    assert searched == ["99", "99"]


CHANGES = {
    "a step": lambda run: run.proceed(),
    "a model call": lambda run: run.record_model_call(input_tokens=1, output_tokens=1),
    "a tool call": lambda run: run.call_tool("search", lambda q: "x", {"q": "1"}),
    "a retry counted": lambda run: run.count_retries(),
    "a failure": lambda run: run.fail("enough"),
    "an escalation": lambda run: run.escalate("a person decides"),
    "a success": lambda run: run.succeed("done"),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_restore_does_not_reuse_a_run_that_changed_since(change: str) -> None:
    """A run changed after its snapshot (a step, a call, a record, an end): restore rebuilds
    the run the snapshot describes, as if no run were offered; so it does for another
    guard's run, another run, a run with an effect done (a snapshot keeps its arguments
    redacted)."""
    guard = Guard()
    run = guard.start(task="t")
    run.proceed()
    doc = run.snapshot()
    try:
        CHANGES[change](run)
    except Stopped:  # fail() and escalate() end the run by raising
        pass
    again = guard.restore(doc, reuse=run)
    assert again is not run and _normal(again.snapshot()) == _normal(guard.restore(doc).snapshot())
    fresh = guard.start(task="t")
    fresh.proceed()
    assert Guard().restore(fresh.snapshot(), reuse=fresh) is not fresh
    assert guard.restore(fresh.snapshot(), reuse=run) is not run
    fresh.call_tool("pay", lambda order: "ok", {"order": "A"}, idempotent=False)
    assert guard.restore(fresh.snapshot(), reuse=fresh) is not fresh


@pytest.mark.parametrize(
    "entry",
    [
        {"step": 1, "model": "m", "cost_usd": 0.0009, "input_tokens": 200, "output_tokens": 20},
        {"step": 2, "tool": "lookup", "ok": True, "note": None, "x": -0.0, "big": 1e300},
        {"b": 1, "a": 2},
        {"$ref": 1},
        {"tool": "café"},
        {"cost": float("inf")},
        {"args": {"q": 1}},
        {"n": 2**60},
        {1: "a"},
        {},
    ],
)
def test_a_snapshot_writes_each_transcript_line_as_its_canonical_json(entry: Any) -> None:
    """A transcript line that is its own JSON is written without being encoded; every line
    reads as ``jsonable`` makes it, in the same key order (the snapshot's text is the same)."""
    from tether.effects._canonical import jsonable

    run = Guard().start(task="t")
    run.transcript.append(entry)
    written = run.snapshot()["transcript"]["entries"][-1]
    expected = jsonable(entry)
    assert written == expected and json.dumps(written) == json.dumps(expected)
