"""The one step vocabulary of tether's sans-IO plans, and its one pair of drivers.

A *plan* is a generator that decides, without I/O, what happens next: it yields steps and
gets each step's answer back (or the step's exception thrown in), and its return value is
the result. Two kinds of step:

* :class:`Sleep`: wait ``seconds`` on the driver's clock (its answer is None);
* :class:`Call`: ``fn(*args)``, the I/O itself (a store's round trip, a breaker's permit,
  the attempt of a retried call); ``afn(*args)`` is awaited in its place on an event loop.

:func:`drive` runs a plan in this thread, :func:`adrive` on the event loop; nothing else
tells the two shells apart, so sync and async code cannot drift. The retry policy's plan
(:mod:`tether.retries._plan`), the ledger's claim (:mod:`tether.effects._once`), a token
budget's place in line (:mod:`tether.guards._token_line`) and the Redis store's scripts
(:mod:`tether.stores.redis._connection`) are all plans of this vocabulary.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

if TYPE_CHECKING:
    from tether.clock import Clock

__all__ = ["Call", "Plan", "Sleep", "Step", "adrive", "drive"]

T = TypeVar("T")


class Sleep(NamedTuple):
    """Wait ``seconds`` on the driver's clock."""

    seconds: float


class Call(NamedTuple):
    """``fn(*args)`` in a thread; ``afn(*args)`` awaited on an event loop (None: ``fn``
    there too, for a step that does no I/O)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    afn: Callable[..., Awaitable[Any]] | None = None


Step = Sleep | Call
#: a plan: yields steps, gets their answers (or their exceptions), returns its result
Plan = Generator[Step, Any, T]


def drive(plan: Plan[T], clock: Clock | None = None) -> T:
    """Run ``plan`` in this thread: its sleeps on ``clock``, its calls as they are. A step's
    exception is thrown into the plan, which handles it or lets it through."""
    send, throw = plan.send, plan.throw
    answer: Any = None
    error: Exception | None = None
    while True:
        try:
            step = send(answer) if error is None else throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        error = None
        try:
            # a sleep's answer is None (the clock's sleep returns nothing)
            answer = (
                step.fn(*step.args) if type(step) is Call else clock.sleep(step.seconds)  # type: ignore[union-attr]
            )
        except Exception as exc:
            answer, error = None, exc


async def adrive(plan: Plan[T], clock: Clock | None = None) -> T:
    """Run ``plan`` on the event loop: its sleeps on ``clock.asleep``, its calls' async
    forms awaited."""
    send, throw = plan.send, plan.throw
    answer: Any = None
    error: Exception | None = None
    while True:
        try:
            step = send(answer) if error is None else throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        error = None
        try:
            if type(step) is Call:
                afn = step.afn
                answer = step.fn(*step.args) if afn is None else await afn(*step.args)
            else:
                answer = await clock.asleep(step.seconds)  # type: ignore[union-attr]
        except Exception as exc:
            answer, error = None, exc
