"""Honest endings for what a new user's first agent does: a side effect that fails for good, and
a side-effect tool left ``idempotent=True``. The customer is told "try again later" only when
trying again can help and nothing ran; the operator reads how often a tool ran and how often the
ledger only gave its failure back. Each through ``call_tool``, ``acall_tool`` and the
``run_agent`` / ``arun_agent`` loops (the real SDK over loopback)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import tether
from scripted_server import Reply, ScriptedServer, run_claude
from tether import Guard, StopReason, Tool, VirtualClock

SAID = tether.CustomerMessages()
NEEDS_ATTENTION = SAID.needs_attention.format(done="")
ACTED = SAID.acted.format(done="")
TRY_AGAIN = SAID.failed.format(done="")
REFUND = {"order": "A-1", "amount": 4999}


def loop(run: tether.Run, shell: str, fn: Callable[..., Any], times: int, **options: Any) -> None:
    """The model asks for the same call ``times`` times, through ``shell``; what the model
    reads of a failure is ignored."""

    async def aloop() -> None:
        for _ in range(times):
            if not run.proceed():
                return
            try:
                await run.acall_tool("issue_refund", fn, REFUND, **options)
            except tether.ToolError:
                pass

    if shell != "sync":
        asyncio.run(aloop())
        return
    for _ in range(times):
        if not run.proceed():
            return
        try:
            run.call_tool("issue_refund", fn, REFUND, **options)
        except tether.ToolError:
            pass


def closed_account(ran: list[int], shell: str) -> Callable[..., Any]:
    """A refund that fails for good, counting its executions (a coroutine for "async")."""

    def refund(order: str, amount: int) -> dict[str, str]:
        ran.append(1)
        raise PermissionError("card account closed")

    async def arefund(order: str, amount: int) -> dict[str, str]:
        return refund(order, amount)

    return arefund if shell == "async" else refund


@pytest.mark.parametrize("shell", ["sync", "async", "async-sync-tool"])
def test_a_permanent_failure_asked_three_times_ran_once_and_needs_a_person(shell: str) -> None:
    """A side effect that fails for good, asked 3 times: it ran once, the ledger gave its failure
    back twice, and the operator reads exactly that; the customer is not told to try again."""
    ran: list[int] = []
    with Guard(clock=VirtualClock()).start(task="refund A-1") as run:
        loop(run, shell, closed_account(ran, shell), 3, idempotent=False, label="refund")
    out = run.outcome
    assert len(ran) == 1
    assert (out.status, out.stopped_because) == ("failed", StopReason.IDENTICAL_FAILURES)
    assert out.detail == (
        "issue_refund ran once and failed (PermissionError); the model asked 2 more times and "
        "was given the same failure from the ledger, without running it again"
    )
    assert out.open_issues[0] == f"stopped: identical_failures ({out.detail})"
    assert out.customer_message == NEEDS_ATTENTION
    assert "try again" not in out.customer_message.lower()


def test_a_permanent_failure_recorded_before_is_said_not_run() -> None:
    """A second run of the same request: the ledger holds the failure, the tool never runs."""
    ran: list[int] = []
    guard = Guard(clock=VirtualClock())
    for _ in range(2):
        with guard.start(task="refund A-1", key="req-1") as run:
            loop(run, "sync", closed_account(ran, "sync"), 3, idempotent=False)
    assert len(ran) == 1
    assert run.outcome.detail == (
        "issue_refund was not run: the model asked 3 times and was given the failure "
        "(PermissionError) the ledger holds from an earlier attempt each time"
    )


def test_a_transient_failure_three_times_still_says_three_times() -> None:
    """An idempotent tool that really ran each time: the words are as before."""
    ran: list[int] = []

    def down(order: str, amount: int) -> None:
        ran.append(1)
        raise ConnectionError("reset")

    guard = Guard(clock=VirtualClock(), retry=tether.RetryPolicy(max_attempts=1))
    with guard.start(task="refund A-1") as run:
        loop(run, "sync", down, 3)
    assert len(ran) == 3
    assert run.outcome.detail == "issue_refund failed 3 times the same way (ConnectionError)"


def claude(content: list[dict[str, Any]], stop: str) -> Reply:
    return Reply(200, {"id": "msg_1", "type": "message", "role": "assistant",
                       "model": "claude-haiku-4-5", "content": content, "stop_reason": stop,
                       "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 5}})  # fmt: skip


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_run_agent_ends_a_permanent_failure_without_try_again(shell: str) -> None:
    """run_agent / arun_agent: the model asks 3 times for a refund that fails for good; one
    execution, the same words and the same customer message as call_tool's."""
    ran: list[int] = []
    use = {"type": "tool_use", "id": "tu_1", "name": "issue_refund", "input": REFUND}
    tools = [Tool("issue_refund", closed_account(ran, "sync"), idempotent=False, label="refund")]
    ask = {"model": "claude-haiku-4-5", "messages": [{"role": "user", "content": "refund A-1"}],
           "tools": tools, "guard": Guard(clock=VirtualClock()), "max_tokens": 256}  # fmt: skip
    with ScriptedServer() as server:
        server.script = [claude([use], "tool_use")] * 3 + [
            claude([{"type": "text", "text": "Sorry."}], "end_turn")
        ]
        out = run_claude(shell, server.url, ask)
    assert len(ran) == 1
    assert out.stopped_because is StopReason.IDENTICAL_FAILURES
    assert "ran once and failed (PermissionError); the model asked 2 more times" in out.detail
    assert out.customer_message == NEEDS_ATTENTION


def paid_twice(paid: list[str], flaky: bool, shell: str) -> Callable[..., Any]:
    """A refund left idempotent=True; ``flaky``: its first reply is lost to a timeout after
    it committed."""

    def refund(order: str, amount: int) -> dict[str, str]:
        paid.append(order)
        if flaky and len(paid) == 1:
            raise TimeoutError("read timed out")
        return {"id": f"re_{len(paid)}"}

    async def arefund(order: str, amount: int) -> dict[str, str]:
        return refund(order, amount)

    return arefund if shell == "async" else refund


@pytest.mark.parametrize("flaky", [False, True], ids=["asked-twice", "reply-lost"])
@pytest.mark.parametrize("shell", ["sync", "async", "async-sync-tool"])
def test_an_unmarked_side_effect_that_ran_never_reads_as_nothing_done(
    shell: str, flaky: bool
) -> None:
    """A side-effect tool left idempotent=True ran (twice, or three times with a lost reply):
    the customer is never told to try again, and ``partial`` holds each call with the attempts
    it took."""
    paid: list[str] = []
    with Guard(clock=VirtualClock()).start(task="refund A-1") as run:
        loop(run, shell, paid_twice(paid, flaky, shell), 2, label="refund")
    out = run.outcome
    assert len(paid) == (3 if flaky else 2)
    assert out.status == "partial"
    assert out.customer_message == ACTED
    assert "try again" not in out.customer_message.lower()
    assert [e.get("attempts", 1) for e in out.partial] == ([2, 1] if flaky else [1, 1])


#: the reasons a run can stop for with nothing done and no message of their own, and
#: whether "try again later" is true for them (the cause may pass by itself)
ENDINGS = [
    (StopReason.ERROR, True),
    (StopReason.HUNG_TOOLS, True),
    (StopReason.PERMANENT_ERROR, False),
    (StopReason.IDENTICAL_FAILURES, False),
    (StopReason.UNKNOWN_OUTCOME, False),
    (StopReason.REPEATED_ACTION, False),
    (StopReason.NO_PROGRESS, False),
    (StopReason.MAX_STEPS, False),
    (StopReason.MAX_COST, False),
    (StopReason.TIMEOUT, False),
    (StopReason.TRUNCATED, False),
    (StopReason.NO_RESULT, False),
    (StopReason.FAILED, False),
]


@pytest.mark.parametrize(("reason", "retry_helps"), ENDINGS, ids=[r.name for r, _ in ENDINGS])
def test_every_reason_says_try_again_only_when_it_can_help(
    reason: StopReason, retry_helps: bool
) -> None:
    """Nothing done: "try again later" for a cause that may pass, else "needs a member of our
    team"; a call that ran: never "try again"."""
    assert reason.meaning.retry_helps is retry_helps
    with Guard(clock=VirtualClock()).start(task="refund A-1") as run:
        run.proceed()
        run.stop(reason, "stopped")
    assert run.outcome.customer_message == (TRY_AGAIN if retry_helps else NEEDS_ATTENTION)
    with Guard(clock=VirtualClock()).start(task="refund A-1") as run:
        run.proceed()
        run.call_tool("search", lambda q: [], {"q": "A-1"})
        run.stop(reason, "stopped")
    assert run.outcome.customer_message == ACTED


def test_a_handoff_that_reached_no_one_does_not_say_try_again_for_a_permanent_error() -> None:
    """Escalated, but the sink failed: nobody has the case, and the permanent error is not
    "try again later"."""

    def broken(record: tether.HandoffRecord) -> None:
        raise OSError("sink down")

    ran: list[int] = []
    guard = Guard(clock=VirtualClock(), escalation=tether.Escalation(sink=broken))
    with guard.start(task="refund A-1") as run:
        loop(run, "sync", closed_account(ran, "sync"), 3, idempotent=False)
    out = run.outcome
    assert out.status == "escalated"
    assert out.customer_message == NEEDS_ATTENTION


@pytest.mark.parametrize("shell", ["sync", "async", "async-sync-tool"])
def test_a_side_effect_asked_again_is_in_partial_as_replayed(shell: str) -> None:
    """``partial`` holds one entry per completed call; the one the ledger answered without
    running the tool says ``replayed``."""
    paid: list[str] = []
    with Guard(clock=VirtualClock()).start(task="refund A-1") as run:
        loop(run, shell, paid_twice(paid, False, shell), 2, idempotent=False, label="refund")
    out = run.outcome
    assert paid == ["A-1"]
    assert [e.get("replayed", False) for e in out.partial] == [False, True]
    assert [e["result"] for e in out.partial] == [{"id": "re_1"}, {"id": "re_1"}]
    assert "Done: refund completed (reference re_1)." in out.customer_message


def test_two_calls_of_one_effect_at_once_keep_their_own_labels() -> None:
    """Two calls of one refund under way at once (threads, and tasks): the one that ran is
    not said replayed, the one that waited on its claim and was given its result is, and
    waiting is no attempt of the tool."""
    import asyncio
    import threading
    import time

    ran: list[int] = []

    def refund(order: int) -> dict[str, int]:
        ran.append(order)
        time.sleep(0.3)
        return {"refunded": order}

    with tether.Guard().start() as run:

        def one(delay: float) -> None:
            time.sleep(delay)
            run.call_tool("refund", refund, {"order": 1}, idempotent=False)

        threads = [threading.Thread(target=one, args=(d,)) for d in (0, 0.05)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    entries = sorted(run.outcome.partial, key=lambda e: bool(e.get("replayed")))
    assert ran == [1] and len(entries) == 2
    assert "replayed" not in entries[0] and entries[1]["replayed"] is True
    assert all("attempts" not in e for e in entries), entries

    async def arefund(order: int) -> dict[str, int]:
        ran.append(order)
        await asyncio.sleep(0.3)
        return {"refunded": order}

    async def both() -> tether.Outcome:
        async with tether.Guard().start() as arun:

            async def aone(delay: float) -> None:
                await asyncio.sleep(delay)
                await arun.acall_tool("refund", arefund, {"order": 2}, idempotent=False)

            await asyncio.gather(aone(0), aone(0.05))
        return arun.outcome

    outcome = asyncio.run(both())
    entries = sorted(outcome.partial, key=lambda e: bool(e.get("replayed")))
    assert ran == [1, 2] and len(entries) == 2
    assert "replayed" not in entries[0] and entries[1]["replayed"] is True
    assert all("attempts" not in e for e in entries), entries
