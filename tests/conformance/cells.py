"""The cells: what must hold for every adapter. A test module imports them and parametrises
``adapter`` with :func:`parametrize` (the adapters of its venv, minus each one's
``not_applicable`` cells, which the table shows with their reason)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from conformance.registry import ADAPTERS
from conformance.suite import BUSY, Adapter, Cell, Mode, World, ask, guard
from tether import Budget, StopReason

F = TypeVar("F", bound=Callable[..., Any])


def cell(which: Cell) -> Callable[[F], F]:
    def mark(fn: F) -> F:
        fn.cell = which  # type: ignore[attr-defined]
        return fn

    return mark


def parametrize(metafunc: pytest.Metafunc, venv: str) -> None:
    """``pytest_generate_tests`` of a test module: its cells over the venv's adapters."""
    which = getattr(metafunc.function, "cell", None)
    if which is None or "adapter" not in metafunc.fixturenames:
        return
    adapters = [a for a in ADAPTERS if a.venv == venv and which not in a.not_applicable]
    metafunc.parametrize("adapter", adapters, ids=[a.id for a in adapters])


# --- the stories ------------------------------------------------------------------------

#: a cell run through both the sync and the async entry point (one behaviour)
SHELLS = pytest.mark.parametrize("shell", ["sync", "async"])

#: search, then refund (a side effect), then answer
REFUND = [ask(("search", {"q": "A-1"})), ask(("issue_refund", {"order": "A-1"})), "Refunded A-1."]


def _done(adapter: Adapter, tmp_path: Path, mode: Mode) -> None:
    world = World(list(REFUND))
    out = adapter.run(world, guard(tmp_path), mode, side_effects=["issue_refund"])
    assert (out.status, out.stopped_because) == ("success", StopReason.GOAL_REACHED)
    assert dict(world.ran) == {"search": 1, "issue_refund": 1}
    assert world.requests == 3
    assert (out.usage.model_calls, out.usage.tool_calls) == (3, 2)  # every turn counted
    if mode != "stream" or adapter.streamed_usage_exact:
        assert (out.usage.input_tokens, out.usage.output_tokens) == (30, 15)
    else:  # counted, as the fake model estimated them
        assert out.usage.input_tokens > 0 and out.usage.output_tokens > 0


@cell(Cell.SYNC)
def test_sync(adapter: Adapter, tmp_path: Path) -> None:
    """A search, a refund, an answer through the sync entry point: success, each tool once,
    every model turn and tool call counted."""
    _done(adapter, tmp_path, "sync")


@cell(Cell.ASYNC)
def test_async(adapter: Adapter, tmp_path: Path) -> None:
    """The same through the async entry point: the same outcome and counts."""
    _done(adapter, tmp_path, "async")


@cell(Cell.STREAMING)
def test_streaming(adapter: Adapter, tmp_path: Path) -> None:
    """The same through the streaming entry point, read to its end: the same outcome and
    counts."""
    _done(adapter, tmp_path, "stream")


@cell(Cell.PARALLEL)
@SHELLS
def test_parallel_tool_calls_hold_the_cap(adapter: Adapter, tmp_path: Path, shell: Mode) -> None:
    """One turn asks for 6 searches at once under ``max_tool_calls=3``: 3 run, 3 are counted,
    the run stops MAX_TOOL_CALLS (async tools yield, so the calls really interleave; a sync
    framework may run them in threads)."""
    world = World([ask(*[("search", {"q": f"A-{i}"}) for i in range(6)]), "Found them."])
    out = adapter.run(world, guard(tmp_path, budget=Budget(max_tool_calls=3)), shell)
    assert world.ran["search"] == 3
    assert out.usage.tool_calls == 3
    assert out.stopped_because is StopReason.MAX_TOOL_CALLS
    assert out.status == "partial"


@cell(Cell.PAUSE_RESUME)
@SHELLS
def test_pause_for_approval_then_resume(adapter: Adapter, tmp_path: Path, shell: Mode) -> None:
    """A refund that needs approval pauses the run (nothing refunded, a checkpoint); once a
    person approves, the resumed run refunds exactly once and succeeds."""
    turns: list[Any] = [ask(("issue_refund", {"order": "A-1"}))]
    if adapter.reasks_after_resume:
        turns.append(ask(("issue_refund", {"order": "A-1"})))
    world = World([*turns, "Refunded A-1."])
    rules = {"side_effects": ["issue_refund"], "requires_approval": {"issue_refund": True}}
    first = adapter.run(world, guard(tmp_path), shell, **rules)
    assert first.stopped_because is StopReason.AWAITING_APPROVAL
    assert first.status == "awaiting_approval" and first.checkpoint_id
    assert world.ran["issue_refund"] == 0
    later = guard(tmp_path)  # another process: the records hold the paused run
    later.approve(first.checkpoint_id, by="alice")
    second = adapter.resume(world, later, first, shell, **rules)
    assert world.ran["issue_refund"] == 1
    assert (second.status, second.stopped_because) == ("success", StopReason.GOAL_REACHED)


@cell(Cell.HAND_OVER)
@SHELLS
def test_hand_over_to_a_person(adapter: Adapter, tmp_path: Path, shell: Mode) -> None:
    """``hand_over=["transfer_to_human"]``: the tool runs, the model is not asked again, the
    run ends escalated (HANDED_OVER) with a case filed."""
    world = World([ask(("transfer_to_human", {"reason": "asked for one"})), "Passed on."])
    g = guard(tmp_path)
    out = adapter.run(world, g, shell, hand_over=["transfer_to_human"])
    assert (out.status, out.stopped_because) == ("escalated", StopReason.HANDED_OVER)
    assert world.ran["transfer_to_human"] == 1 and world.requests == 1
    assert g.records is not None and len(g.records.handoffs.list()) == 1


@cell(Cell.NESTED)
@SHELLS
def test_a_nested_agent_is_one_run(adapter: Adapter, tmp_path: Path, shell: Mode) -> None:
    """The framework's handoff or nested agent: the second agent's model turns and tool calls
    count in the same run (the budget holds across both)."""
    world = World([])
    out = adapter.nested(world, guard(tmp_path, budget=Budget(max_model_calls=3)), shell)
    assert world.requests == 3 and out.usage.model_calls == 3
    assert out.stopped_because is StopReason.MAX_MODEL_CALLS


@cell(Cell.BUSINESS_ERROR)
@SHELLS
def test_a_business_error_ends_the_run(adapter: Adapter, tmp_path: Path, shell: Mode) -> None:
    """A side effect refused for a business reason (``ValueError("card expired")``) is not
    retried: it runs once and the run ends PERMANENT_ERROR, escalated with a case (the
    guard keeps records)."""
    world = World([ask(("charge_card", {"order": "A-1"})), "Charged."])
    g = guard(tmp_path)
    try:
        out = adapter.run(world, g, shell, side_effects=["charge_card"])
    except ValueError as exc:  # the framework raises a tool's exception, as it does alone
        assert adapter.raises_tool_errors and str(exc) == "card expired"
    else:
        assert not adapter.raises_tool_errors
        assert (out.status, out.stopped_because) == ("escalated", StopReason.PERMANENT_ERROR)
    assert world.ran["charge_card"] == 1
    # filed before the framework's ending: a person is needed, and the guard keeps a case
    assert g.records is not None
    assert [(r["status"], r["reason"]) for r in g.records.runs.list()] == [
        ("escalated", "permanent_error")
    ]
    assert len(g.records.handoffs.list()) == 1


@cell(Cell.TRANSIENT_ERROR)
@SHELLS
def test_a_transient_error_is_retried(adapter: Adapter, tmp_path: Path, shell: Mode) -> None:
    """A read whose service resets the connection once is retried by tether and the run
    succeeds; the model is asked twice, never told of the failure."""
    world = World([ask(("check_status", {"order": "A-1"})), "It has shipped."])
    out = adapter.run(world, guard(tmp_path), shell)
    assert world.ran["check_status"] == 2 and world.requests == 2
    assert (out.status, out.stopped_because) == ("success", StopReason.GOAL_REACHED)
    assert out.usage.tool_calls == 1


@cell(Cell.TRANSIENT_MODEL_ERROR)
@SHELLS
def test_a_transient_model_error_is_retried(adapter: Adapter, tmp_path: Path, shell: Mode) -> None:
    """The provider answers 503 once: the run retries the request at one layer (counted in
    ``usage.retries``) and the run succeeds; the model's turns are counted once each."""
    world = World([BUSY, ask(("search", {"q": "A-1"})), "Found it."])
    out = adapter.run(world, guard(tmp_path), shell)
    assert world.requests == 3 and world.ran["search"] == 1
    assert (out.status, out.stopped_because) == ("success", StopReason.GOAL_REACHED)
    assert (out.usage.retries, out.usage.model_calls) == (1, 2)


@cell(Cell.STOP)
@SHELLS
def test_a_budget_stops_before_the_next_request(
    adapter: Adapter, tmp_path: Path, shell: Mode
) -> None:
    """``max_model_calls=2`` under a model that would search forever: 2 requests are sent,
    the run stops MAX_MODEL_CALLS, "partial" (its searches were done), with a customer
    message."""
    world = World([ask(("search", {"q": f"A-{i}"})) for i in range(10)])
    out = adapter.run(world, guard(tmp_path, budget=Budget(max_model_calls=2)), shell)
    assert world.requests == 2 and out.usage.model_calls == 2
    assert (out.status, out.stopped_because) == ("partial", StopReason.MAX_MODEL_CALLS)
    assert out.customer_message


@cell(Cell.CONVERSATION)
@SHELLS
def test_the_conversation_is_the_request(adapter: Adapter, tmp_path: Path, shell: Mode) -> None:
    """Two turns of one conversation (``key=``) each ask for the same refund: it is made once
    (the second turn gets the first one's result); another conversation's turn makes its own."""
    g = guard(tmp_path)
    world = World([ask(("issue_refund", {"order": "A-1"})), "Refunded A-1."] * 3)
    for conversation in ("conversation-7", "conversation-7", "conversation-8"):
        out = adapter.run(world, g, shell, side_effects=["issue_refund"], key=conversation)
        assert (out.status, out.stopped_because) == ("success", StopReason.GOAL_REACHED)
    assert world.requests == 6 and world.ran["issue_refund"] == 2


CELLS = {
    fn.cell: fn  # type: ignore[attr-defined]
    for fn in (
        test_sync,
        test_async,
        test_parallel_tool_calls_hold_the_cap,
        test_pause_for_approval_then_resume,
        test_hand_over_to_a_person,
        test_a_nested_agent_is_one_run,
        test_a_business_error_ends_the_run,
        test_a_transient_error_is_retried,
        test_a_transient_model_error_is_retried,
        test_a_budget_stops_before_the_next_request,
        test_the_conversation_is_the_request,
        test_streaming,
    )
}
assert set(CELLS) == set(Cell), "every cell has its test"
