"""A call closed mid-retry from another context: no "Exception ignored", that context untouched.

A coroutine cancelled mid-retry and then collected (its loop shut down, Ctrl-C) runs its
``finally`` in whatever context is current where it is closed; before, each such
coroutine printed "Exception ignored ... ValueError: <Token var=<ContextVar
name='tether_retry'> was created in a different Context" (118 of them on a Ctrl-C of
``tether bench --suite fleet``).
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

import tether
from tether import Guard, Ledger
from tether.retries._drive import IN_ATTEMPT, retry_context

MINE = ("the closer's own value",)


class Hook:
    """An attempt hook that hears nothing of interest (its presence takes the other frame)."""

    def begin(self, attempt: int) -> object:
        return attempt

    def end(self, mark: object, error: BaseException | None) -> None:
        pass


@pytest.fixture
def unraisable(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What Python would print as "Exception ignored in ..."."""
    seen: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    return seen


def flaky() -> Callable[[], Coroutine[Any, Any, str]]:
    """Fails once (a retry), then hangs in its second attempt."""
    calls = 0

    async def fn(**args: Any) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionResetError("reset")
        await asyncio.sleep(3600)
        return "never"

    return fn


POLICY = tether.RetryPolicy(max_attempts=5, base=0.001, cap=0.001)


def via_acall() -> Coroutine[Any, Any, Any]:
    return POLICY.acall(flaky())


def via_hook() -> Coroutine[Any, Any, Any]:
    return POLICY.acall_within(60.0, flaky(), hook=Hook())


def via_guarded_run() -> Coroutine[Any, Any, Any]:
    guard = Guard(retry=POLICY, ledger=Ledger.memory())

    async def agent() -> None:
        async with guard.start(task="look up A1") as run:
            run.proceed()
            await run.acall_tool("lookup", flaky(), {"order": "A1"})

    return agent()


CALLS = {"acall": via_acall, "hooked attempt": via_hook, "guarded run": via_guarded_run}


def started_mid_retry(make: Callable[[], Coroutine[Any, Any, Any]]) -> asyncio.Task[Any]:
    """A task left in its second attempt on a loop that is then closed (not cancelled)."""
    loop = asyncio.new_event_loop()
    task = loop.create_task(make())
    try:
        loop.run_until_complete(asyncio.sleep(0.2))
        assert not task.done()
    finally:
        loop.close()
    return task


@pytest.mark.parametrize("name", CALLS)
def test_a_call_closed_mid_retry_from_another_context(name: str, unraisable: list[Any]) -> None:
    """coro.close() elsewhere: no error, the closer's value as it was."""
    task = started_mid_retry(CALLS[name])
    token = retry_context.set(MINE)
    try:
        task.get_coro().close()  # type: ignore[union-attr]
        assert retry_context.get() == MINE
    finally:
        retry_context.reset(token)
    assert unraisable == []


@pytest.mark.parametrize("name", CALLS)
def test_a_call_collected_mid_retry_from_another_context(name: str, unraisable: list[Any]) -> None:
    """The garbage collector closes it: nothing printed, the collector's value as it was."""
    task = started_mid_retry(CALLS[name])
    token = retry_context.set(MINE)
    try:
        del task
        gc.collect()
        assert retry_context.get() == MINE
    finally:
        retry_context.reset(token)
    assert [e for e in unraisable if not isinstance(e, RuntimeError | GeneratorExit)] == []
    assert [e for e in unraisable if "different Context" in str(e)] == []


@pytest.mark.parametrize("name", CALLS)
def test_a_call_cancelled_mid_retry_leaves_its_own_context_clean(
    name: str, unraisable: list[Any]
) -> None:
    """Cancelled in its own task: out of the attempt afterwards, nothing printed."""

    async def main() -> Any:
        own = contextvars.copy_context()  # the task's own context, to read after
        task = asyncio.get_running_loop().create_task(CALLS[name](), context=own)
        await asyncio.sleep(0.2)
        assert own.get(retry_context) is IN_ATTEMPT  # in its second attempt
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return own.get(retry_context)

    assert asyncio.run(main()) is not IN_ATTEMPT
    assert unraisable == []


def test_a_sync_call_interrupted_mid_retry_leaves_the_attempt(unraisable: list[Any]) -> None:
    """The sync driver, interrupted in its second attempt: the context out of the attempt."""
    calls = 0

    def fn() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionResetError("reset")
        assert retry_context.get() is IN_ATTEMPT
        raise KeyboardInterrupt

    for call in (lambda: POLICY.call(fn), lambda: POLICY.call_within(60.0, fn, hook=Hook())):
        calls = 0
        with pytest.raises(KeyboardInterrupt):
            call()
        assert retry_context.get() is not IN_ATTEMPT
        assert calls == 2
    assert unraisable == []
