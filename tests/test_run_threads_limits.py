"""A policy's per-tool call limit and the identical-failures limit under calls made from many
threads at once (#38 case 5): a framework that runs one model reply's tool calls in threads
(LangChain's ToolNode, CrewAI, ...) gets the limits a single thread gets.

``policies.max_calls(tool, n)``: the call's count is checked and taken as one step among the
run's threads (before: 12 searches started together under ``max_calls("search", 3)`` all ran).
``max_identical_failures``: an identical call under way counts as a failure to come, so no more
identical calls are under way than the limit leaves (before: 12 identical failing calls
started together under a limit of 3 all ran, and the limit's count missed some of them)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import tether
from tether import Budget, Guard, LoopPolicy, policies
from tether.run import _toolgate

SHELLS = ["sync", "async"]
THREADS = 12
RERUNS = range(10)


def _then_yield(fn: Callable[..., Any]) -> Callable[..., Any]:
    def widened(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            time.sleep(0.005)  # the other threads run here (and a thread pool's late ones start)

    return widened


@pytest.fixture(autouse=True)
def _gap_widened(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each thread lets the others run right after the policies were checked: a gap between a
    policy's check and the count it reads is then met in every run of a test, not now and
    then. The patched name must exist (monkeypatch raises otherwise)."""
    monkeypatch.setattr(_toolgate, "check_policies", _then_yield(_toolgate.check_policies))


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


def meet(n: int) -> Callable[[], None]:
    """A meeting point inside a tool: the calls that run wait there for one another (at most
    0.3 s), so that every call admitted is under way before any of them ends."""
    barrier = threading.Barrier(n, timeout=0.3)

    def wait() -> None:
        try:
            barrier.wait()
        except threading.BrokenBarrierError:  # fewer came: they were refused
            pass

    return wait


# --- policies.max_calls ------------------------------------------------------------------


@pytest.mark.parametrize("rerun", RERUNS)
@pytest.mark.parametrize("shell", SHELLS)
def test_calls_started_together_respect_a_policy_s_max_calls(shell: str, rerun: int) -> None:
    """12 different searches started at once under ``policies.max_calls("search", 3)``: 3 run
    and 9 are denied by the policy (before: 12 ran)."""
    ran: list[str] = []
    arrive = meet(THREADS)

    def search(q: str) -> str:
        arrive()
        ran.append(q)
        return "found"

    with Guard(policies=[policies.max_calls("search", 3)]).start() as run:
        run.proceed()
        results = together(THREADS, lambda i: call(run, shell, search, {"q": f"q{i}"}))
        assert len(ran) == 3, f"{len(ran)} of {THREADS} ran under max_calls('search', 3)"
        denied = [r for r in results if isinstance(r, tether.ToolError)]
        assert len(denied) == THREADS - 3
        assert all("at most 3 times" in r.model_message for r in denied)
        assert run._tool_counts["search"] == 3


@pytest.mark.parametrize("shell", SHELLS)
def test_a_policy_denial_leaves_the_count_to_the_calls_let_through(shell: str) -> None:
    """Denied calls do not count, under concurrency too: 12 searches, the odd ones refused by
    another policy, under max_calls 3: 3 of the even ones run."""
    ran: list[str] = []

    def search(q: str) -> str:
        time.sleep(0.002)
        ran.append(q)
        return "found"

    def no_odd(tool: str, args: Any) -> str | None:
        return "odd" if int(args["q"][1:]) % 2 else None

    with Guard(policies=[no_odd, policies.max_calls("search", 3)]).start() as run:
        run.proceed()
        together(THREADS, lambda i: call(run, shell, search, {"q": f"q{i}"}))
        assert len(ran) == 3 and all(int(q[1:]) % 2 == 0 for q in ran)


# --- max_identical_failures --------------------------------------------------------------


def failing(ran: list[str], arrive: Callable[[], None] = lambda: None) -> Callable[..., Any]:
    def poll(job: str) -> str:
        arrive()
        ran.append(job)
        raise ValueError("job store rejected the query")  # permanent: never retried

    return poll


@pytest.mark.parametrize("rerun", RERUNS)
@pytest.mark.parametrize("shell", SHELLS)
def test_identical_failing_calls_started_together_respect_the_limit(shell: str, rerun: int) -> None:
    """12 identical calls of a tool allowed to repeat (a poll), started at once, all failing the
    same way, under max_identical_failures=3: 3 run, the run stops IDENTICAL_FAILURES, the
    others are told to wait for the calls under way (before: 12 ran)."""
    ran: list[str] = []
    poll = failing(ran, meet(THREADS))
    with Guard(Budget(max_identical_failures=3)).start() as run:
        run.proceed()
        results = together(
            THREADS, lambda i: call(run, shell, poll, {"job": "J-1"}, allow_repeat=30)
        )
        assert len(ran) == 3, f"{len(ran)} of {THREADS} identical failing calls ran (limit 3)"
        assert run.stopped is tether.StopReason.IDENTICAL_FAILURES
        assert max(run._state._failures.values()) == 3
        assert sum(isinstance(r, tether.Stopped) for r in results) >= 1


@pytest.mark.parametrize("rerun", RERUNS)
@pytest.mark.parametrize("shell", SHELLS)
def test_threads_failing_again_and_again_respect_the_limit(shell: str, rerun: int) -> None:
    """8 threads each repeating one identical failing call until the run stops (a model told
    to try again), under max_identical_failures=3: exactly 3 run, every failure counted."""
    ran: list[str] = []
    poll = failing(ran, lambda: time.sleep(0.002))

    def again(i: int) -> int:
        made = 0
        while True:
            try:
                call(run, shell, poll, {"job": "J-1"}, allow_repeat=30)
            except tether.Stopped:
                return made
            except tether.ToolError:
                made += 1
                time.sleep(0.001)  # the model's next turn

    with Guard(Budget(max_identical_failures=3)).start() as run:
        run.proceed()
        together(8, again)
        assert len(ran) == 3, f"{len(ran)} identical failing calls ran (limit 3)"
        assert max(run._state._failures.values()) == 3
        assert run.stopped is tether.StopReason.IDENTICAL_FAILURES


@pytest.mark.parametrize("shell", SHELLS)
def test_identical_calls_that_succeed_are_not_held(shell: str) -> None:
    """What the limit leaves alone: as many identical calls under way together as the limit
    (3) all run when they succeed (a poll under allow_repeat), and so do identical calls one
    after another: nothing is held back, the run goes on."""
    ran: list[str] = []
    arrive = meet(3)

    def poll(job: str) -> str:
        arrive()
        ran.append(job)
        return "running"

    with Guard(Budget(max_identical_failures=3)).start() as run:
        run.proceed()
        results = together(3, lambda i: call(run, shell, poll, {"job": "J-1"}, allow_repeat=30))
        assert results == ["running"] * 3
        arrive = lambda: None  # noqa: E731 - one after another from here
        for _ in range(5):
            call(run, shell, poll, {"job": "J-1"}, allow_repeat=30)
        assert len(ran) == 8 and run.stopped is None


# --- through the frameworks ----------------------------------------------------------------


def _langchain_agent(tools: list[Any], replies: list[Any], guard: Guard) -> Any:
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    from tether.integrations.langchain import TetherMiddleware

    class Model(GenericFakeChatModel):
        model_name: str = "fake-model"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    return create_agent(
        Model(messages=iter(replies)), tools=tools, middleware=[TetherMiddleware(guard)]
    )


USAGE = {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}


@pytest.mark.parametrize("rerun", RERUNS)
def test_langchain_tool_node_threads_respect_max_calls(rerun: int) -> None:
    """Through LangChain for real: create_agent with TetherMiddleware, its fake model asking
    for 12 searches in one reply, invoked sync (ToolNode runs them in its thread pool), under
    max_calls("search", 3): 3 run (before: 12)."""
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    ran: list[str] = []
    arrive = meet(THREADS)

    @tool
    def search(q: str) -> str:
        """Search the orders."""
        arrive()
        ran.append(q)
        return "found"

    calls = [{"name": "search", "args": {"q": f"A-{i}"}, "id": f"c{i}"} for i in range(THREADS)]
    replies = [AIMessage("", tool_calls=calls, usage_metadata=USAGE), AIMessage("Done.")]
    agent = _langchain_agent([search], replies, Guard(policies=[policies.max_calls("search", 3)]))
    state = agent.invoke({"messages": [("user", "look them up")]})
    assert len(ran) == 3, f"{len(ran)} of {THREADS} ran under max_calls('search', 3)"
    denied = [m for m in state["messages"] if "at most 3 times" in str(m.content)]
    assert len(denied) == THREADS - 3


@pytest.mark.parametrize("rerun", RERUNS)
def test_langchain_tool_node_threads_respect_max_identical_failures(rerun: int) -> None:
    """Through LangChain: 12 identical failing polls in one reply (the poll allowed to repeat),
    under max_identical_failures=3: 3 run and the outcome stops IDENTICAL_FAILURES (before:
    12 ran)."""
    from langchain_core.messages import AIMessage
    from langchain_core.tools import ToolException, tool

    ran: list[str] = []
    arrive = meet(THREADS)

    @tool
    def job_status(job: str) -> str:
        """The status of a job."""
        arrive()
        ran.append(job)
        raise ToolException("job store rejected the query")

    job_status.handle_tool_error = True  # ToolNode answers with the error, as agents do

    calls = [{"name": "job_status", "args": {"job": "J-1"}, "id": f"c{i}"} for i in range(THREADS)]
    replies = [AIMessage("", tool_calls=calls, usage_metadata=USAGE), AIMessage("Done.")]
    guard = Guard(Budget(max_identical_failures=3), loops=LoopPolicy(allow_repeat=["job_status"]))
    state = _langchain_agent([job_status], replies, guard).invoke(
        {"messages": [("user", "is it done")]}
    )
    outcome: tether.Outcome = state["tether_outcome"]
    assert len(ran) == 3, f"{len(ran)} of {THREADS} identical failing polls ran (limit 3)"
    assert outcome.stopped_because is tether.StopReason.IDENTICAL_FAILURES
