"""The success path of a guarded step: what it skips must not change what it gives."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import tether
from test_redaction_once import _json_values
from tether import Budget, CircuitBreaker, Guard, RetryPolicy, VirtualClock
from tether.effects._canonical import canonical_json, jsonable
from tether.redaction._redact import RecordedEntry, _reset, redact


@pytest.fixture(autouse=True)
def fresh_secrets() -> Any:
    _reset()
    yield
    _reset()


def test_a_recorded_view_made_without_the_walk_is_the_walked_one() -> None:
    """For any arguments and result, the recorded view equals redact(jsonable(call)),
    whether its texts were judged clean (no walk) or not."""
    from hypothesis import given, settings

    @settings(max_examples=400, deadline=None)
    @given(_json_values(), _json_values())
    def check(args: Any, result: Any) -> None:
        raw = {"step": 1, "tool": "t", "args": args, "result": result}
        texts = {
            "args": canonical_json(args, ignore=()),
            "result": canonical_json(result, ignore=()),
        }
        assert dict(RecordedEntry(raw, texts).redacted(jsonable)) == redact(jsonable(raw))

    check()


def test_a_text_judged_clean_is_judged_again_when_the_secrets_change() -> None:
    """A string remembered as clean is a secret's name once it is registered as one."""
    raw = {"step": 1, "tool": "t", "args": {"zorkword": "abcdef123"}, "result": None}
    texts = {"args": canonical_json(raw["args"], ignore=()), "result": None}
    assert RecordedEntry(raw, texts).redacted(jsonable)["args"] == {"zorkword": "abcdef123"}
    tether.add_secret_names("zorkword")
    assert RecordedEntry(raw, texts).redacted(jsonable)["args"] == {"zorkword": "[redacted]"}


def _thread_of_tool(budget: Budget) -> threading.Thread:
    seen: list[threading.Thread] = []

    def lookup(q: str) -> str:
        seen.append(threading.current_thread())
        return q

    with Guard(budget=budget).start(task="t") as run:  # the system clock: real threads
        run.proceed()
        run.call_tool("lookup", lookup, {"q": "x"})
        run.succeed("done")
    return seen[0]


def test_no_worker_thread_without_a_time_budget() -> None:
    """A sync tool with no timeout runs in the caller's thread unless the run has a time
    budget; under one it runs in a worker thread the budget can leave."""
    assert _thread_of_tool(Budget(max_steps=5)) is threading.current_thread()
    assert _thread_of_tool(Budget(max_seconds=60)) is not threading.current_thread()


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_first_attempt_made_straight_keeps_the_breaker_s_permit(shell: str) -> None:
    """A half-open breaker's probe that fails reopens it, one that succeeds closes it, when
    the first attempt is made without the plan, in both shells."""
    clock = VirtualClock()
    breaker = CircuitBreaker("dep", failure_threshold=1, cooldown=5.0, clock=clock)
    policy = RetryPolicy(max_attempts=1, breaker=breaker, clock=clock)

    def down() -> None:
        raise ConnectionRefusedError("refused")

    async def adown() -> None:
        down()

    async def aup() -> int:
        return 1

    def call(fn: Any, afn: Any) -> Any:
        if shell == "sync":
            return policy.call(fn)
        return asyncio.run(policy.acall(afn))

    with pytest.raises(ConnectionRefusedError):
        call(down, adown)
    assert breaker.state == "open"
    clock.advance(5.0)
    with pytest.raises(ConnectionRefusedError):  # the probe failed: open again
        call(down, adown)
    assert breaker.state == "open"
    clock.advance(5.0)
    assert call(lambda: 1, aup) == 1  # the probe succeeded
    assert breaker.state == "closed"


def test_a_tool_is_judged_async_as_inspect_judges_it() -> None:
    """call_tool's check of a plain function reads its code's flag: the same answer as
    inspect for plain and async functions, lambdas, a partial of either, an object with
    an async ``__call__``, and a function marked a coroutine function (3.12+)."""
    import functools
    import inspect

    from tether.run._tool import _is_async

    def plain(x: int = 0) -> int:
        return x

    async def coro(x: int = 0) -> int:
        return x

    class Calls:
        async def __call__(self) -> None:
            return None

    cases: list[tuple[Any, bool]] = [
        (plain, False),
        (coro, True),
        (lambda: None, False),
        (functools.partial(coro, 1), True),
        (functools.partial(plain, 1), False),
        (Calls(), True),
    ]
    mark = getattr(inspect, "markcoroutinefunction", None)
    if mark is not None:  # Python 3.12+
        cases.append((mark(lambda: None), True))
    for fn, expected in cases:
        assert _is_async(fn) is expected, fn
    for fn in (plain, coro):
        assert _is_async(fn) is inspect.iscoroutinefunction(fn)

    guard = Guard(budget=Budget(max_steps=3))
    with guard.start(task="t") as run:
        run.proceed()
        with pytest.raises(TypeError, match="coroutine function"):
            run.call_tool("c", coro)
        run.succeed("done")


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_call_s_retry_policy_is_the_guard_s_for_its_tool_and_kind(shell: str) -> None:
    """The run keeps the policy it looked up per (tool, timeout, effect): the same object
    the guard gives, an effect's apart from a read's, any truthy ``idempotent`` a read."""
    guard = Guard(budget=Budget(max_steps=10))
    seen: list[Any] = []

    def lookup(n: int) -> int:
        seen.append(n)  # the tool ran
        return n

    with guard.start(task="t") as run:
        for n, idem in enumerate((True, "yes", 1, True)):
            run.proceed()
            if shell == "sync":
                run.call_tool("lookup", lookup, {"n": n}, idempotent=idem)  # type: ignore[arg-type]
            else:

                async def go(n: int = n, idem: Any = idem) -> None:
                    await run.acall_tool("lookup", lookup, {"n": n}, idempotent=idem)

                asyncio.run(go())
        run.succeed("done")
    decide = run._tools.decide
    assert list(decide._policies) == [("lookup", None, False)]
    assert decide._policies[("lookup", None, False)] is guard._policy("lookup", None)
    assert len(seen) == 4


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_patched_time_module_moves_the_run_clock(
    shell: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tests freeze or move time by patching ``time`` (monkeypatch, freezegun): the
    system clock reads the module at each call, so a time budget sees the jump."""
    import time

    guard = Guard(budget=Budget(max_seconds=10.0))
    real = time.monotonic

    def lookup(n: int) -> int:
        return n

    async def alookup(n: int) -> int:
        return n

    async def steps(run: tether.Run) -> None:
        await run.acall_tool("lookup", alookup, {"n": 1})
        monkeypatch.setattr(time, "monotonic", lambda: real() + 100.0)
        await run.acall_tool("lookup", alookup, {"n": 2})

    with guard.start(task="patched") as run, pytest.raises(tether.Stopped) as stopped:
        if shell == "sync":
            run.call_tool("lookup", lookup, {"n": 1})
            monkeypatch.setattr(time, "monotonic", lambda: real() + 100.0)
            run.call_tool("lookup", lookup, {"n": 2})
        else:
            asyncio.run(steps(run))
    assert stopped.value.reason is tether.StopReason.TIMEOUT
