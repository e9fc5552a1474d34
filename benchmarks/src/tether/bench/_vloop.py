"""An asyncio event loop on a :class:`tether.VirtualClock`, for libraries that sleep with asyncio.

The SDKs' own retries (``anyio.sleep``), LangChain's retry middlewares and the Agents SDK's
runner wait with ``asyncio.sleep``: they take no clock. Run under this loop, their sleeps
are timers of the loop, and the loop's time is the clock's: when nothing is ready to run,
the loop moves the clock to its next timer instead of waiting. Minutes of backoff take
microseconds, and the waits are exactly what each library decided.

A :class:`tether.VirtualClock`'s own ``asleep`` on this loop is one of its timers too, so
tasks that sleep at once overlap their sleeps instead of each moving everybody's time.

Work handed to a thread (``asyncio.to_thread``) is waited for in real time: the loop's
executor counts what is in flight, and the clock does not jump while a thread works.
"""

from __future__ import annotations

import asyncio
import selectors
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from tether import VirtualClock

__all__ = ["run_virtual"]

T = TypeVar("T")


class _Executor(ThreadPoolExecutor):
    """The loop's default executor, counting the calls in flight."""

    def __init__(self) -> None:
        super().__init__(max_workers=4, thread_name_prefix="tau-bench")
        self.busy = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._lock:
            self.busy += 1
        future = super().submit(fn, *args, **kwargs)
        future.add_done_callback(self._done)
        return future

    def _done(self, _: Future[Any]) -> None:
        with self._lock:
            self.busy -= 1


class _Selector(selectors.BaseSelector):
    """A real selector that moves the virtual clock instead of sleeping."""

    def __init__(self, clock: VirtualClock, executor: _Executor) -> None:
        self._real = selectors.DefaultSelector()
        self._clock = clock
        self._executor = executor

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout == 0:  # callbacks are ready: a thread's result is among them already
            return []  # (call_soon_threadsafe queues it; its wake-up byte is read later)
        ready = self._real.select(0)
        if ready:
            return ready
        if timeout is None or self._executor.busy:  # a thread's result will wake the loop
            return self._real.select(timeout if self._executor.busy and timeout else None)
        self._clock.advance(timeout)
        return []

    def get_map(self) -> Any:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()


class _Loop(asyncio.SelectorEventLoop):
    def __init__(self, clock: VirtualClock) -> None:
        self._executor_ = _Executor()
        super().__init__(_Selector(clock, self._executor_))
        #: the clock whose time this loop's is: its ``asleep`` is a timer of this loop
        self.virtual_clock = clock
        self.used_threads = False

    def time(self) -> float:
        return self.virtual_clock.now()

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> Any:  # type: ignore[override]
        if executor is None and not self.used_threads:  # the counting executor, made on first use
            self.used_threads = True
            self.set_default_executor(self._executor_)
        return super().run_in_executor(executor, func, *args)


def run_virtual(clock: VirtualClock, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a fresh loop whose time is ``clock``'s."""
    loop = _Loop(clock)
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            _cancel_all(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
            if loop.used_threads:
                loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
