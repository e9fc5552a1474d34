"""An agent left mid-tool-call on an event loop that is then shut down, and its cleanup
run from another context (the tests of each adapter's context variables use these).

A coroutine closed or collected elsewhere runs its ``finally`` in whatever context is
current there; a ``ContextVar.reset`` there raised ``ValueError: <Token ...> was created in
a different Context``, printed as "Exception ignored in coroutine" (see
``tests/test_retry_context.py`` for the retry's own).
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import inspect
import sys
import time
import types
from collections.abc import Callable, Coroutine, Generator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from conformance.suite import World

#: the closing context's own value of the adapter's variable, which must stay as it is
MINE: Any = ("the closer's own value",)


class Abandoned(Exception):
    """The agent hung in its tool and its loop was shut down (see :func:`abandoning`)."""


class Hanging(World):
    """A world whose async ``search`` never answers (``hung`` says it has started)."""

    hung = False

    def _tool(self, name: str, asynchronous: bool) -> Callable[..., Any]:
        fn = super()._tool(name, asynchronous)
        if not asynchronous or name != "search":
            return fn

        async def hang(*args: Any, **kwargs: Any) -> Any:
            self.hung = True
            await asyncio.Event().wait()

        for attribute in ("__name__", "__qualname__", "__doc__", "__signature__"):
            setattr(hang, attribute, getattr(fn, attribute))
        hang.__annotations__ = fn.__annotations__
        return hang


def abandon(coro: Coroutine[Any, Any, Any], world: Hanging) -> set[asyncio.Task[Any]]:
    """Run ``coro`` on a loop of its own until the world's tool hangs, then close the loop
    (not cancelling anything): the loop's tasks, left pending."""
    loop = asyncio.new_event_loop()
    try:
        main = loop.create_task(coro)
        until = time.monotonic() + 60
        while not world.hung and not main.done() and time.monotonic() < until:
            loop.run_until_complete(asyncio.sleep(0.01))
        assert world.hung, "the agent never reached its tool"
        loop.run_until_complete(asyncio.sleep(0.05))
        return asyncio.all_tasks(loop)
    finally:
        loop.close()


@contextmanager
def abandoning(world: Hanging, left: list[set[asyncio.Task[Any]]]) -> Iterator[None]:
    """``asyncio.run`` of an agent that hangs in the world's tool: its tasks put in
    ``left`` and :class:`Abandoned` raised (a run that returns runs as before)."""
    run = asyncio.run

    def running(coro: Coroutine[Any, Any, Any], **options: Any) -> Any:
        if getattr(coro, "__qualname__", "").endswith("create_session"):  # a setup step
            return run(coro, **options)
        left.append(abandon(coro, world))
        del coro  # held by this frame, in the traceback, it would be collected later
        raise Abandoned

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(asyncio, "run", running)
        yield


def collected(left: list[Any], var: contextvars.ContextVar[Any]) -> None:
    """Collect what ``left`` holds (abandoned tasks, a suspended coroutine) here, where
    ``var`` holds :data:`MINE`: the value stays."""
    token = var.set(MINE)
    try:
        left.clear()
        gc.collect()
        assert var.get() is MINE
    finally:
        var.reset(token)


def closed(it: Any, var: contextvars.ContextVar[Any]) -> None:
    """Close a suspended coroutine or (async) generator here, where ``var`` holds
    :data:`MINE`: the value stays."""
    token = var.set(MINE)
    try:
        if inspect.isasyncgen(it):
            with pytest.raises(StopIteration):
                it.aclose().send(None)
        else:
            it.close()
        assert var.get() is MINE
    finally:
        var.reset(token)


def suspended(it: Any) -> Any:
    """Start a coroutine or (async) generator in a context of its own, up to where it waits."""
    own = contextvars.copy_context()
    step = it.__anext__().send if inspect.isasyncgen(it) else it.send
    try:
        own.run(step, None)
    except StopIteration:  # an async generator's first item
        pass
    return it


def unraisables(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The ``unraisable`` fixture of each test module: what Python would print as
    "Exception ignored in ..." (the framework's own leftovers
    of an abandoned loop, collected before the test ends, are among them)."""
    seen: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    yield seen
    for _ in range(3):  # what they hold (frames, coroutines) goes with them, here
        seen.clear()
        gc.collect()


def different_context(seen: list[Any]) -> list[Any]:
    """The "was created in a different Context" errors among ``seen``."""
    return [e for e in seen if "different Context" in str(e)]


@types.coroutine
def _pause() -> Generator[None, None, None]:
    yield


async def waits(*args: Any, **kwargs: Any) -> None:
    """Wait until closed (any arguments: it stands in for a tool, a task or a model call)."""
    await _pause()
