"""Which refusal of a tool call wins when two apply (#38): a call's checks run once, and in
this order:

1. the run's own stops, whatever the call: an earlier stop, its time budget, hung tools;
2. the call's admission, under the run's lock (the only place these are checked, as the slot
   is taken): ``max_tool_calls``, the repeat caps, ``max_identical_failures``;
3. a refusal of this call alone that lets the run go on (arguments holding the redaction
   placeholder): last, so that it never hides a stop, and the call's slot is given back.

(Before, the tool-call budget was checked first, unlocked, and again under the lock: a run out
of time or with hung tools that had also used its tool calls said ``max_tool_calls``.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import tether
from tether import Budget, Guard, StopReason, ToolError
from tether.clock import VirtualClock
from tether.run import _tooldecisions

SHELLS = ["sync", "async"]


def lookup(order: str) -> str:
    return f"order {order}"


def call(run: tether.Run, shell: str, args: dict[str, Any], **options: Any) -> Any:
    if shell == "sync":
        return run.call_tool("lookup", lookup, args, **options)

    async def through() -> Any:
        return await run.acall_tool("lookup", lookup, args, **options)

    return asyncio.run(through())


@pytest.mark.parametrize("shell", SHELLS)
def test_the_time_budget_wins_over_the_tool_budget(shell: str) -> None:
    """Out of time and out of tool calls: the run stops TIMEOUT (before: MAX_TOOL_CALLS)."""
    clock = VirtualClock()
    with Guard(Budget(max_tool_calls=1, max_seconds=10), clock=clock).start() as run:
        run.proceed()
        call(run, shell, {"order": "A-1"})
        clock.advance(11)
        with pytest.raises(tether.Stopped) as stopped:
            call(run, shell, {"order": "A-2"})
    assert stopped.value.reason is StopReason.TIMEOUT
    assert run.outcome.stopped_because is StopReason.TIMEOUT
    assert run.outcome.usage.tool_calls == 1


@pytest.mark.parametrize("shell", SHELLS)
def test_hung_tools_win_over_the_tool_budget(shell: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tools hanging in threads past the limit and out of tool calls: the run stops HUNG_TOOLS,
    which hands the customer to a person when the guard says so (before: MAX_TOOL_CALLS, the
    hung threads unsaid)."""
    guard = Guard(Budget(max_tool_calls=1, max_hung_threads=2), on_hung_tool="hand_over")
    with guard.start() as run:
        run.proceed()
        call(run, shell, {"order": "A-1"})
        hung = _tooldecisions.hung_threads()
        monkeypatch.setattr(_tooldecisions, "hung_threads", lambda: hung + 2)
        with pytest.raises(tether.Stopped) as stopped:
            call(run, shell, {"order": "A-2"})
    assert stopped.value.reason is StopReason.HUNG_TOOLS
    assert run.outcome.usage.tool_calls == 1


@pytest.mark.parametrize("shell", SHELLS)
def test_the_tool_budget_wins_over_a_placeholder_refusal(shell: str) -> None:
    """A call holding the redaction placeholder in a run out of tool calls: the run stops
    MAX_TOOL_CALLS; the placeholder's refusal (a ToolError, the run going on) does not hide it."""
    with Guard(Budget(max_tool_calls=1)).start() as run:
        run.proceed()
        call(run, shell, {"order": "A-1"})
        with pytest.raises(tether.Stopped) as stopped:
            call(run, shell, {"order": "[redacted]"})
    assert stopped.value.reason is StopReason.MAX_TOOL_CALLS


@pytest.mark.parametrize("shell", SHELLS)
def test_a_placeholder_refusal_gives_the_slot_back(shell: str) -> None:
    """Refused for its placeholder, a call is not made: it takes no tool call of the budget
    and is not under way (an identical call may run)."""
    with Guard(Budget(max_tool_calls=1)).start() as run:
        run.proceed()
        with pytest.raises(ToolError, match="redacted placeholder"):
            call(run, shell, {"order": "[redacted]"})
        assert run.usage().tool_calls == 0
        assert call(run, shell, {"order": "A-1"}) == "order A-1"
        assert run.usage().tool_calls == 1
