"""One run's tool calls made from many threads at once (#38 case 5): a framework that runs one
model reply's tool calls in threads (CrewAI, LangChain's ToolNode, ...) gets the budgets a
single thread gets. Admitting a call (the run's checks, then its slot counted) is one step
among the run's threads, so max_tool_calls and the repeat caps hold exactly and the usage
counts what ran. (Before: the check and the count were apart, and 12 calls started together
under max_tool_calls=3 ran 4 to 12 of them now and then.)"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import tether
from tether import Budget, Guard, LoopPolicy
from tether.run import _tooldecisions
from tether.run._loops import LoopState

SHELLS = ["sync", "async"]
THREADS = 12


def _then_yield(fn: Callable[..., Any]) -> Callable[..., Any]:
    def widened(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            time.sleep(0.0005)  # the other threads run here

    return widened


@pytest.fixture(autouse=True)
def _gaps_widened(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each thread lets the others run right after a budget check and after a call in flight
    ends: a gap between a check and its count (or between a call's end and its record) is
    then met in every run of a test, not now and then (CPython switches threads every 5 ms).
    The patched names must exist (monkeypatch raises otherwise), so a test cannot go on
    passing with its gaps no longer widened."""
    for check in _tooldecisions.TOOL_CHECKS:  # the budgets admit checks under its lock
        monkeypatch.setattr(type(check), "__call__", _then_yield(type(check).__call__))
    monkeypatch.setattr(LoopState, "check_action", _then_yield(LoopState.check_action))
    monkeypatch.setattr(LoopState, "end_action", _then_yield(LoopState.end_action))


def call(
    run: tether.Run, shell: str, fn: Callable[..., Any], args: dict[str, Any], **options: Any
) -> Any:
    """One call of ``fn`` through the run, in the sync shell or the async one (a thread of
    its own event loop, as a framework running async tools in threads has)."""
    if shell == "sync":
        return run.call_tool(fn.__name__, fn, args, **options)

    async def through() -> Any:
        return await run.acall_tool(fn.__name__, fn, args, **options)

    return asyncio.run(through())


def together(n: int, work: Callable[[int], Any]) -> list[Any]:
    """``work(i)`` in ``n`` threads released at once: what each returned or raised."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def one(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(i)
        except BaseException as exc:  # what the call raised is the result
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def stopped(results: list[Any]) -> set[tether.StopReason]:
    return {r.reason for r in results if isinstance(r, tether.Stopped)}


@pytest.mark.parametrize("shell", SHELLS)
def test_calls_started_together_respect_max_tool_calls(shell: str) -> None:
    """12 different searches started at once under max_tool_calls=3: 3 run, the usage counts
    3, and the other 9 are refused MAX_TOOL_CALLS."""
    ran: list[str] = []

    def search(q: str) -> str:
        time.sleep(0.002)  # the calls overlap
        ran.append(q)
        return "found"

    with Guard(Budget(max_tool_calls=3)).start() as run:
        run.proceed()
        results = together(THREADS, lambda i: call(run, shell, search, {"q": f"q{i}"}))
        assert len(ran) == 3, f"{len(ran)} of {THREADS} ran under max_tool_calls=3"
        assert run.usage().tool_calls == 3
        assert sum(r == "found" for r in results) == 3
        assert stopped(results) == {tether.StopReason.MAX_TOOL_CALLS}
    assert run.outcome.usage.tool_calls == 3


@pytest.mark.parametrize("shell", SHELLS)
def test_identical_calls_started_together_respect_the_repeat_cap(shell: str) -> None:
    """12 identical searches started at once: the loop detector lets 2 run (the 3rd identical
    call is a loop), and the usage counts 2."""
    ran: list[str] = []

    def search(q: str) -> str:
        time.sleep(0.002)
        ran.append(q)
        return "found"

    with Guard().start() as run:
        run.proceed()
        results = together(THREADS, lambda i: call(run, shell, search, {"q": "A-1"}))
        assert len(ran) == 2, f"{len(ran)} of {THREADS} identical calls ran (repeat cap: 2)"
        assert run.usage().tool_calls == 2
        assert stopped(results) == {tether.StopReason.REPEATED_ACTION}


@pytest.mark.parametrize("shell", SHELLS)
def test_threads_calling_again_and_again_respect_allow_repeat(shell: str) -> None:
    """8 threads each repeating one identical call until refused, under allow_repeat=5: calls
    begin while others end, so a call between its end and its record (counted neither in
    flight nor done) would let one more through; exactly 5 run."""
    ran: list[str] = []

    def read(q: str) -> str:
        ran.append(q)
        return q

    def again(i: int) -> int:
        made = 0
        while True:
            try:
                call(run, shell, read, {"q": "A-1"}, allow_repeat=5)
            except tether.Stopped:
                return made
            except tether.ToolError:  # held: 3 identical calls under way already could
                time.sleep(0.0005)  # reach max_identical_failures; the model asks again
                continue
            made += 1

    with Guard(loops=LoopPolicy(max_repeats=None)).start() as run:
        run.proceed()
        made = together(8, again)
        assert len(ran) == 5, f"{len(ran)} identical calls ran under allow_repeat=5"
        assert sum(made) == 5 and run.usage().tool_calls == 5


@pytest.mark.parametrize("shell", SHELLS)
def test_a_call_refused_or_not_made_gives_its_slot_back(shell: str) -> None:
    """Calls that a framework's control flow interrupts (not made) give their slot back under
    concurrency too: 12 threads, 6 interrupted before their tool ran; under
    max_tool_calls=3 exactly 3 of the others run and the usage counts 3."""

    class Interrupt(Exception):
        """A framework's own control flow (passed through, the call not made)."""

    ran: list[str] = []

    def search(q: str) -> str:
        time.sleep(0.002)
        if q.startswith("x"):
            raise Interrupt(q)
        ran.append(q)
        return "found"

    def work(i: int) -> Any:
        q = f"x{i}" if i % 2 else f"q{i}"
        return call(run, shell, search, {"q": q}, passthrough=(Interrupt,))

    with Guard(Budget(max_tool_calls=3)).start() as run:
        run.proceed()
        results = together(THREADS, work)
        made = sum(r == "found" for r in results)
        interrupted = sum(isinstance(r, Interrupt) for r in results)
        assert made == len(ran) and made <= 3
        assert run.usage().tool_calls == made, (made, interrupted, run.usage().tool_calls)


def test_langchain_tool_node_threads_respect_max_tool_calls() -> None:
    """Through LangChain for real: create_agent with TetherMiddleware, its fake model asking
    for 12 searches in one reply, invoked sync (ToolNode runs them in its thread pool): 3 run
    under max_tool_calls=3 and the outcome counts 3."""
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    from tether.integrations.langchain import TetherMiddleware

    class Model(GenericFakeChatModel):
        model_name: str = "fake-model"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    ran: list[str] = []

    @tool
    def search(q: str) -> str:
        """Search the orders."""
        time.sleep(0.002)
        ran.append(q)
        return "found"

    usage = {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}
    calls = [{"name": "search", "args": {"q": f"A-{i}"}, "id": f"c{i}"} for i in range(THREADS)]
    replies = iter([AIMessage("", tool_calls=calls, usage_metadata=usage), AIMessage("Done.")])
    guard = Guard(Budget(max_tool_calls=3))
    agent = create_agent(
        Model(messages=replies), tools=[search], middleware=[TetherMiddleware(guard)]
    )
    state = agent.invoke({"messages": [("user", "look them up")]})
    outcome: tether.Outcome = state["tether_outcome"]
    assert len(ran) == 3, f"{len(ran)} of {THREADS} ran under max_tool_calls=3"
    assert outcome.usage.tool_calls == 3
    assert outcome.stopped_because is tether.StopReason.MAX_TOOL_CALLS
