"""A tool that hangs: the run hands over in seconds, holds few threads, never overruns its time.

The tool never answers; the customer waits. Measured before this guard: a sync run held
5 hung threads and ended "Please try again later" with no handoff; an async run started
the tool 18 times and ended at 57 of its 60 seconds waiting for the breaker's probes.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import anthropic
import pytest

import tether
from scripted_server import Reply, ScriptedServer, Seen
from tether import Budget, Guard, RetryPolicy, StopReason, Tool, ToolError
from tether.integrations import anthropic as t_anthropic
from tether.stores import MemoryStore

TIMEOUT = 0.05


def _guard(**kw: Any) -> Guard:
    kw.setdefault("budget", Budget(max_seconds=30))
    kw.setdefault("store", MemoryStore())  # breakers of this test only
    return Guard(retry=RetryPolicy(max_attempts=3, base=0.01, cap=0.02), **kw)


class Hanging:
    """A read-only lookup that never answers (sync: a thread waits; async: a task sleeps)."""

    def __init__(self) -> None:
        self.starts = 0
        self.release = threading.Event()

    def search_order(self, order_id: str) -> dict[str, Any]:
        self.starts += 1
        self.release.wait(30)
        return {"order_id": order_id}

    async def asearch_order(self, order_id: str) -> dict[str, Any]:
        self.starts += 1
        await asyncio.sleep(30)
        return {"order_id": order_id}


def _loop(run: tether.Run, fn: Any, told: list[str]) -> None:
    while run.proceed():
        try:
            run.call_tool("search_order", fn, {"order_id": "W1"}, timeout=TIMEOUT)
        except ToolError as exc:
            told.append(exc.model_message)


async def _aloop(run: tether.Run, fn: Any, told: list[str]) -> None:
    while run.proceed():
        try:
            await run.acall_tool("search_order", fn, {"order_id": "W1"}, timeout=TIMEOUT)
        except ToolError as exc:
            told.append(exc.model_message)


@pytest.mark.parametrize("shell", ["sync", "async-sync-tool"])
def test_a_hung_sync_tool_holds_two_threads_then_the_run_hands_over(shell: str) -> None:
    tool, told = Hanging(), []
    started = time.monotonic()
    try:
        with _guard().start(task="where is my order W1?") as run:
            if shell == "sync":
                _loop(run, tool.search_order, told)
            else:
                asyncio.run(_aloop(run, tool.search_order, told))
        out = run.outcome
        assert tool.starts == 2  # the third attempt was not started: two threads hang
        assert (out.status, out.stopped_because) == ("escalated", StopReason.HUNG_TOOLS)
        assert "2 of its calls still hang in worker threads" in out.detail
        assert any("not started again" in issue for issue in out.open_issues)
        assert out.handoff is not None
        assert "try again later" in out.customer_message.lower()  # nobody has the case
        assert "member of our team" not in out.customer_message
        assert time.monotonic() - started < 5.0
    finally:
        tool.release.set()


def test_a_hung_async_tool_hands_over_when_its_breaker_opens_not_after_probes() -> None:
    tool, told = Hanging(), []
    started = time.monotonic()
    guard = _guard(budget=Budget(max_seconds=60))
    with guard.start(task="where is my order W1?") as run:
        asyncio.run(_aloop(run, tool.asearch_order, told))
    out = run.outcome
    assert (out.status, out.stopped_because) == ("escalated", StopReason.CIRCUIT_OPEN)
    assert "is not answering" in out.detail
    assert tool.starts == guard.breaker_threshold  # no probe of the open breaker was waited for
    assert told and all("temporarily unavailable" in t for t in told)
    assert time.monotonic() - started < 10.0


def test_tell_model_reports_the_tool_unavailable_and_never_starts_it_again() -> None:
    tool, told = Hanging(), []
    try:
        with _guard(on_hung_tool="tell_model").start() as run:
            for _ in range(4):
                run.proceed()
                try:
                    run.call_tool(
                        "search_order", tool.search_order, {"order_id": "W1"}, timeout=TIMEOUT
                    )
                except ToolError as exc:
                    told.append(exc.model_message)
            run.succeed("told the customer the order system is down")
        assert tool.starts == 2
        assert (
            told
            == ["unavailable: it is not answering; do not call it again in this conversation"] * 4
        )
        assert run.outcome.status == "success"
    finally:
        tool.release.set()


def test_wait_keeps_the_old_retries_within_the_time_budget() -> None:
    tool, told = Hanging(), []
    started = time.monotonic()
    with _guard(on_hung_tool="wait", budget=Budget(max_seconds=2.0)).start() as run:
        asyncio.run(_aloop(run, tool.asearch_order, told))
    assert tool.starts > 2
    assert time.monotonic() - started < 2.5  # the budget, not a probe, ends it


def test_on_hung_tool_is_checked_at_construction() -> None:
    with pytest.raises(ValueError, match="on_hung_tool must be one of 'hand_over'"):
        Guard(on_hung_tool="later")  # type: ignore[arg-type]


def test_a_flaky_tool_that_sometimes_times_out_is_still_retried() -> None:
    """Two timeouts while the breaker stays closed: the tool answers on the third attempt."""
    calls = []

    def lookup(order_id: str) -> dict[str, Any]:
        calls.append(order_id)
        if len(calls) <= 2:
            time.sleep(TIMEOUT * 3)
        return {"order_id": order_id}

    with _guard().start() as run:
        run.proceed()
        result = run.call_tool("search_order", lookup, {"order_id": "W1"}, timeout=TIMEOUT * 2)
        run.succeed(result)
    assert run.outcome.status == "success" and len(calls) == 3


# --- through an agent loop, as a customer meets it -------------------------------------


def _claude_turns(seen: Seen) -> Reply:
    n = len(seen.body["messages"])
    return Reply(
        200,
        {
            "id": f"m{n}",
            "type": "message",
            "role": "assistant",
            "model": "claude-haiku-4-5",
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "content": [
                {
                    "type": "tool_use",
                    "id": f"tu_{n}",
                    "name": "search_order",
                    "input": {"order_id": "W1"},
                }
            ],
            "usage": {"input_tokens": 10, "output_tokens": 5},
        },
    )


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_run_agent_with_a_hung_tool_hands_over_within_its_budget(
    server: ScriptedServer, shell: str
) -> None:
    server.handler = _claude_turns
    tool = Hanging()
    guard = _guard(budget=Budget(max_seconds=20))
    messages = [{"role": "user", "content": "where is my order W1?"}]
    started = time.monotonic()
    try:
        if shell == "sync":
            fn = Tool("search_order", tool.search_order, timeout=TIMEOUT)
            with anthropic.Anthropic(api_key="k", base_url=server.url) as raw:
                out = t_anthropic.run_agent(
                    raw, model="claude-haiku-4-5", messages=messages, tools=[fn], guard=guard
                )
        else:
            fn = Tool("search_order", tool.asearch_order, timeout=TIMEOUT)

            async def main() -> tether.Outcome:
                async with anthropic.AsyncAnthropic(api_key="k", base_url=server.url) as raw:
                    return await t_anthropic.arun_agent(
                        raw, model="claude-haiku-4-5", messages=messages, tools=[fn], guard=guard
                    )

            out = asyncio.run(main())
    finally:
        tool.release.set()
    assert out.status == "escalated" and out.handoff is not None
    assert out.stopped_because in (StopReason.HUNG_TOOLS, StopReason.CIRCUIT_OPEN)
    assert tool.starts <= guard.breaker_threshold
    assert time.monotonic() - started < 10.0
