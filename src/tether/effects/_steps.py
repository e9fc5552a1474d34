"""Ledger steps from async code: a cancellation never cuts a store step in half."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["off_loop", "settle"]

T = TypeVar("T")


async def off_loop(
    backend: Any,
    fn: Callable[..., T],
    *args: Any,
    undo: Callable[[T], None] | None = None,
    skipped: Callable[[], object] | None = None,
) -> T:
    """A ledger step from async code: in a worker thread when the backend does I/O,
    directly when it is this process's memory (no thread hop on the success path).

    A cancellation never cuts the step in half: a step its thread began is waited for
    (one store round trip) and ``undo`` gets what it returned; a step its thread had
    not begun never runs, and ``skipped`` is called instead. Both run before the
    cancellation goes on, on the event loop's thread (rarely: only when cancelled).
    """
    if getattr(backend, "in_memory", False):
        return fn(*args)
    import asyncio  # imported when first used: `import tether` loads no asyncio

    step = _Step(fn, args)
    try:
        return await asyncio.to_thread(step)
    except asyncio.CancelledError:
        if not step.abandon():
            if skipped is not None:
                try:
                    skipped()
                except Exception:  # logged where it failed; the cancellation goes on
                    pass
        elif step.error is None and undo is not None:
            undo(step.result)
        raise


async def settle(backend: Any, fn: Callable[..., object], *args: Any) -> None:
    """A step that records an effect's outcome: a cancellation never leaves it unwritten
    (a step its thread had not begun runs here, before the cancellation goes on)."""
    await off_loop(backend, fn, *args, skipped=lambda: fn(*args))


class _Step:
    """One blocking ledger step for a worker thread, that a cancellation cannot cut in half.

    Once the thread began the step, a cancelled caller waits for its end (:meth:`abandon`)
    and learns what it did; a step the thread had not begun yet never runs.
    """

    __slots__ = ("_args", "_began", "_ended", "_fn", "_lock", "_off", "error", "result")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._fn, self._args = fn, args
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._began = self._off = False
        self.result: Any = None
        self.error: BaseException | None = None

    def __call__(self) -> Any:
        with self._lock:
            if self._off:
                return None
            self._began = True
        try:
            self.result = self._fn(*self._args)
            return self.result
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            self._ended.set()

    def abandon(self) -> bool:
        """The caller gives up: True once the step that began has ended, False if it never
        began (and never will)."""
        with self._lock:
            self._off = True
            began = self._began
        if began:
            self._ended.wait()
        return began
