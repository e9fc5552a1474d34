"""Time sources: the real clock and a virtual one for tests and the benchmark.

Every part of tether that waits takes a ``clock=`` argument. Nothing in tether reads
the time or sleeps except through an object of this module, so the same code runs on
real time in production and on virtual time in tests and in ``tether bench``.

Timeouts are a clock's business too: :meth:`Clock.call_with_timeout` and
:meth:`Clock.acall_with_timeout` bound one call. On the real clock a synchronous call
runs in a worker thread (Python cannot interrupt a running thread: a call that hangs
is abandoned, counted in :func:`hung_threads`, and left to finish on its own); an
asynchronous call is cancelled. On a :class:`VirtualClock` a timeout fires when the
code inside sleeps past it through the same clock, which is how simulated tools hang.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar, runtime_checkable

from tether._context import reset_if_here

__all__ = [
    "Clock",
    "SystemClock",
    "VirtualClock",
    "hung_threads",
    "system_clock",
]

T = TypeVar("T")


@runtime_checkable
class Clock(Protocol):
    """What tether needs of a time source."""

    def now(self) -> float:
        """Monotonic seconds, for durations and deadlines."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch, for records and HTTP dates."""
        ...

    def sleep(self, seconds: float) -> None: ...

    async def asleep(self, seconds: float) -> None: ...

    def call_with_timeout(self, timeout: float, fn: Callable[[], T]) -> T: ...

    async def acall_with_timeout(self, timeout: float, fn: Callable[[], Awaitable[T]]) -> T: ...


_hung_lock = threading.Lock()
_hung = 0


def hung_threads() -> int:
    """How many worker threads of timed-out sync calls are still running (read on every
    tool call: reading an int needs no lock, the GIL; changing it takes the lock)."""
    return _hung


def _hung_delta(delta: int) -> None:
    global _hung
    with _hung_lock:
        _hung += delta


class _Worker(threading.Thread):
    """One daemon thread running one call, so that a hung call blocks nobody else."""

    def __init__(self, fn: Callable[[], object], ctx: contextvars.Context) -> None:
        super().__init__(daemon=True, name="tether-timeout-worker")
        self._fn = fn
        self._ctx = ctx
        self.result: object = None
        self.error: BaseException | None = None
        self.abandoned = False
        self._lock = threading.Lock()

    def run(self) -> None:
        try:
            self.result = self._ctx.run(self._fn)
        except BaseException as exc:  # handed to the caller
            self.error = exc
        finally:
            with self._lock:
                if self.abandoned:
                    _hung_delta(-1)
                self.abandoned = False

    def abandon(self) -> bool:
        """Mark the worker abandoned; False if it finished in the meantime."""
        with self._lock:
            if not self.is_alive():
                return False
            self.abandoned = True
            _hung_delta(1)
            return True


class SystemClock:
    """The real clock: ``time.monotonic``, ``time.time`` and real sleeps."""

    # read through the module at each call, not bound at import: a test that patches
    # time (monkeypatch, freezegun) moves the guards' clock as well
    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        import asyncio  # imported when first used: `import tether` loads no asyncio

        await asyncio.sleep(max(0.0, seconds))

    def call_with_timeout(self, timeout: float, fn: Callable[[], T]) -> T:
        worker = _Worker(fn, contextvars.copy_context())
        worker.start()
        worker.join(max(0.0, timeout))
        if worker.is_alive() and worker.abandon():
            raise TimeoutError(f"call did not return within {timeout:g} s")
        if worker.error is not None:
            raise worker.error
        return worker.result  # type: ignore[return-value]

    async def acall_with_timeout(self, timeout: float, fn: Callable[[], Awaitable[T]]) -> T:
        import asyncio

        try:
            async with asyncio.timeout(max(0.0, timeout)):
                return await fn()
        except TimeoutError as exc:
            if exc.args:
                raise
            raise TimeoutError(f"call did not return within {timeout:g} s") from None

    def __repr__(self) -> str:
        return "SystemClock()"


system_clock = SystemClock()

# deadlines set by VirtualClock.call_with_timeout, innermost last
_virtual_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "tether_virtual_deadline", default=None
)


class VirtualClock:
    """A clock whose time moves only when something sleeps on it or calls ``advance``.

    ``sleep`` and ``asleep`` return at once after moving the time forward, so minutes
    of backoff take microseconds. A sleep that would cross a deadline set by
    ``call_with_timeout`` moves time to the deadline and raises ``TimeoutError``. On an
    event loop that runs on this clock (its ``virtual_clock`` attribute is the clock, as
    the benchmark's loop does) ``asleep`` is a timer of the loop instead: concurrent
    tasks' sleeps overlap, as real ones do, rather than adding up.

    >>> clock = VirtualClock()
    >>> clock.sleep(2.5)
    >>> clock.now()
    2.5
    """

    def __init__(self, start: float = 0.0, *, wall_start: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._wall_offset = wall_start - start
        self._lock = threading.Lock()
        self.sleeps: int = 0
        self.slept: float = 0.0

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self._wall_offset

    def advance(self, seconds: float) -> None:
        """Move time forward without sleeping."""
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds!r}")
        with self._lock:
            self._now += seconds

    def _sleep(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        deadline = _virtual_deadline.get()
        with self._lock:
            self.sleeps += 1
            if deadline is not None and self._now + seconds > deadline:
                waited = max(0.0, deadline - self._now)
                self._now = max(self._now, deadline)
                self.slept += waited
                raise TimeoutError("call did not return before its deadline (virtual time)")
            self._now += seconds
            self.slept += seconds

    def sleep(self, seconds: float) -> None:
        self._sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        import asyncio

        if getattr(asyncio.get_running_loop(), "virtual_clock", None) is self:
            await self._timer(seconds)
            return
        self._sleep(seconds)
        await asyncio.sleep(0)

    async def _timer(self, seconds: float) -> None:
        """A sleep on an event loop whose time is this clock's (``virtual_clock``): a timer
        of the loop, so that one task's sleep moves nobody else's time; the loop moves the
        clock when every task waits. Crossing a deadline: up to it, then ``TimeoutError``."""
        import asyncio

        seconds = max(0.0, seconds)
        deadline = _virtual_deadline.get()
        late = False
        if deadline is not None and self._now + seconds > deadline:
            seconds, late = max(0.0, deadline - self._now), True
        with self._lock:
            self.sleeps += 1
        await asyncio.sleep(seconds)
        with self._lock:
            self.slept += seconds
        if late:
            raise TimeoutError("call did not return before its deadline (virtual time)")

    def call_with_timeout(self, timeout: float, fn: Callable[[], T]) -> T:
        token = self._push_deadline(timeout)
        try:
            return fn()
        finally:
            _virtual_deadline.reset(token)

    async def acall_with_timeout(self, timeout: float, fn: Callable[[], Awaitable[T]]) -> T:
        token = self._push_deadline(timeout)
        try:
            return await fn()
        finally:
            reset_if_here(_virtual_deadline, token)

    def _push_deadline(self, timeout: float) -> contextvars.Token[float | None]:
        deadline = self._now + max(0.0, timeout)
        outer = _virtual_deadline.get()
        if outer is not None:
            deadline = min(deadline, outer)
        return _virtual_deadline.set(deadline)

    def __repr__(self) -> str:
        return f"VirtualClock(now={self._now!r})"
