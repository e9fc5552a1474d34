"""How each tool has answered in one run: attempts that timed out, threads that still hang.

A sync attempt that outlives its timeout keeps running in a worker thread (Python cannot
kill a thread); a run counts those threads per tool and stops starting a tool that holds
``UNRESPONSIVE_AFTER`` of them, or that timed out that many times while its breaker is
not closed. The counts are the run's own: shared state between runs is the breaker's.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from tether._errors import Picklable

__all__ = [
    "HUNG_TOOL_MODES",
    "UNRESPONSIVE_AFTER",
    "HungToolMode",
    "ToolHealth",
    "ToolUnresponsive",
]

#: A tool whose attempts timed out this many times in a run (while its breaker is not
#: closed), or that holds this many hung worker threads, is not started again in the run.
UNRESPONSIVE_AFTER = 2

HungToolMode = Literal["hand_over", "tell_model", "wait"]
#: ``Guard(on_hung_tool=...)``: what a run does with a tool that stopped answering
HUNG_TOOL_MODES: tuple[str, ...] = ("hand_over", "tell_model", "wait")


class ToolUnresponsive(Picklable, Exception):
    """A tool that stopped answering in this run: it was not started (nothing ran)."""

    def __init__(self, tool: str, timed_out: int, hanging: int) -> None:
        self.tool, self.timed_out, self.hanging = tool, timed_out, hanging
        self.before = False  # refused before the call's retry policy ran
        held = f"; {hanging} of its calls still hang in worker threads" if hanging else ""
        super().__init__(f"{tool} is not answering: {timed_out} attempts timed out{held}")


class _Try:
    """One attempt run in a thread: whether it still runs, and whether its caller gave up."""

    __slots__ = ("given_up", "running", "thread")

    def __init__(self) -> None:
        self.running = False
        self.given_up = False
        self.thread: threading.Thread | None = None

    def hangs(self) -> bool:
        # a tether clock's worker is marked ``abandoned`` when its caller's timeout passed
        gave_up = self.given_up or bool(getattr(self.thread, "abandoned", False))
        return self.running and gave_up


class ToolHealth:
    """One tool's timed-out attempts in a run and the worker threads it still holds."""

    __slots__ = ("_lock", "_tries", "timed_out")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tries: list[_Try] = []
        self.timed_out = 0

    def hanging(self) -> int:
        """How many of this tool's attempts still run in a thread their caller left (each
        such attempt is counted as timed out once)."""
        with self._lock:
            self._tries = [t for t in self._tries if t.running]
            for t in self._tries:
                if t.hangs():
                    self._left(t)
            return sum(1 for t in self._tries if t.hangs())

    def _left(self, t: _Try) -> None:
        """Attempt ``t`` timed out (its caller left it): counted once. Under the lock."""
        if not t.given_up:
            t.given_up = True
            self.timed_out += 1

    def _timed_out(self, t: _Try) -> None:
        with self._lock:
            self._left(t)

    def sync(self, check: Callable[[], None], fn: Callable[[], Any]) -> Callable[[], Any]:
        """``fn`` as an attempt of a sync tool (run inline or in a tether worker thread)."""

        def attempt() -> Any:
            check()
            t = _Try()
            t.thread = threading.current_thread()
            t.running = True
            with self._lock:
                self._tries.append(t)
            try:
                return fn()
            except TimeoutError:  # the tool's own timeout, or a virtual clock's deadline
                self._timed_out(t)
                raise
            finally:
                t.running = False

        return attempt

    def threaded(self, check: Callable[[], None], fn: Callable[[], Any]) -> Callable[[], Any]:
        """``fn`` as an async attempt of a sync tool: run in a thread the caller may leave."""

        async def attempt() -> Any:
            import asyncio  # imported when first used: `import tether` loads no asyncio

            check()
            t = _Try()

            def body() -> Any:
                t.running = True
                try:
                    return fn()
                finally:
                    t.running = False

            with self._lock:
                self._tries.append(t)
            try:
                return await in_daemon_thread(body)
            except (TimeoutError, asyncio.CancelledError):
                self._timed_out(t)
                raise

        return attempt

    def coro(
        self, check: Callable[[], None], fn: Callable[[], Awaitable[Any]]
    ) -> Callable[[], Awaitable[Any]]:
        """``fn`` as an attempt of an async tool (cancelled at its timeout: nothing hangs)."""

        async def attempt() -> Any:
            import asyncio

            check()
            try:
                return await fn()
            except (TimeoutError, asyncio.CancelledError):
                with self._lock:
                    self.timed_out += 1
                raise

        return attempt


async def in_daemon_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` in a daemon thread of its own, awaited. Unlike ``asyncio.to_thread``, a call
    that hangs after its caller left it never holds up the event loop's shutdown
    (``asyncio.run`` waits for the default executor's threads)."""
    import asyncio

    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    ctx = contextvars.copy_context()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def work() -> None:
        try:
            result = (True, ctx.run(fn))
        except BaseException as exc:  # handed to the awaiting task
            result = (False, exc)
        try:
            loop.call_soon_threadsafe(settle, *result)
        except RuntimeError:  # the loop closed meanwhile: nobody waits for the result
            pass

    threading.Thread(target=work, daemon=True, name="tether-tool-worker").start()
    return await future
