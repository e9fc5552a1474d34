"""The attempts of a retried call, for the plans of :mod:`tether.retries._plan`.

The plan is run by tether's one pair of drivers (:func:`tether._sansio.drive` in a thread,
:func:`~tether._sansio.adrive` on an event loop). This module gives it the attempt
itself: :func:`straight_attempt` (the breaker's permit, the call, its success recorded:
the first attempt of every call, made without a plan, and each attempt of a plan whose
policy asks nothing more of its guards) and the call alone for a plan that asks its guards
step by step. An :class:`AttemptHook` hears about every attempt (spans); nothing here
builds telemetry itself.

Retry at one layer only: while an attempt runs, :data:`retry_context` holds
:data:`IN_ATTEMPT` in its context (thread or task), and a policy called inside it makes
exactly one attempt.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from tether.retries._plan import NO_PERMIT, Attempts, CallState, Settings, attempt_timeout
from tether.telemetry._attempts import AttemptHook

__all__ = [
    "IN_ATTEMPT",
    "astraight_attempt",
    "attempts",
    "aattempts",
    "retry_context",
    "straight_attempt",
    "unmark",
]

T = TypeVar("T")

#: what a context (thread or task) knows of retries: IN_ATTEMPT while an attempt of some
#: policy runs in it; else (policy id, attempts, total wait, last verdict) of the last
#: call made in it, or None. One variable, so that the success path sets it once.
retry_context: contextvars.ContextVar[Any] = contextvars.ContextVar("tether_retry", default=None)
IN_ATTEMPT: Any = object()
#: the context's mark, set and reset around an attempt (bound once: no look-up per call)
_mark, _reset = retry_context.set, retry_context.reset


def unmark(token: contextvars.Token[Any]) -> None:
    """Take an attempt's mark back, in the context that set it.

    A coroutine closed or collected elsewhere (cancelled mid-retry, its loop shut
    down) runs its ``finally`` in whatever context is current there: the context that
    set the mark goes with the coroutine, and the current one is not ours to change, so
    the mark is left alone (``reset`` would raise ``ValueError`` there, printed as
    "Exception ignored" once per coroutine collected). It is
    :func:`tether._context.reset_if_here` with the reset bound once, for the attempt's path.
    """
    try:
        _reset(token)
    except ValueError:
        pass


def straight_attempt(
    s: Settings, call: Callable[[], T], hook: AttemptHook | None, st: CallState
) -> T:
    """One whole attempt of a straight policy (:func:`~tether.retries._plan.straight`):
    the breaker's permit (kept in ``st.permit`` for the plan, should it fail), the call
    (in a worker thread only under ``attempt_timeout``), its success recorded."""
    st.permit = NO_PERMIT
    timeout = attempt_timeout(s, st)
    breaker = s.breaker
    if breaker is not None:
        st.permit = breaker._acquire()
    if timeout is None or s.attempt_timeout is None:
        timeout = None  # made inline: only attempt_timeout moves a sync attempt
    if hook is None:
        # _Attempt's frame without the object (no hook to hear of it): the mark set for
        # the attempt and reset after it, however it ends
        token = _mark(IN_ATTEMPT)
        try:
            result = call() if timeout is None else s.clock.call_with_timeout(timeout, call)
        finally:
            unmark(token)
    else:
        with _Attempt(hook, st.attempt):
            result = call() if timeout is None else s.clock.call_with_timeout(timeout, call)
    if breaker is not None:
        breaker._record(st.permit, None)
    return result


async def astraight_attempt(
    s: Settings, call: Callable[[], Awaitable[T]], hook: AttemptHook | None, st: CallState
) -> T:
    """The async form of :func:`straight_attempt` (an attempt past its timeout is
    cancelled)."""
    st.permit = NO_PERMIT
    timeout = attempt_timeout(s, st)
    breaker = s.breaker
    if breaker is not None:
        st.permit = await breaker._aacquire()
    if hook is None:  # as in straight_attempt: _Attempt's frame without the object
        token = _mark(IN_ATTEMPT)
        try:
            if timeout is not None:
                result = await s.clock.acall_with_timeout(timeout, call)
            else:
                result = await call()
        finally:
            unmark(token)
    else:
        with _Attempt(hook, st.attempt):
            if timeout is not None:
                result = await s.clock.acall_with_timeout(timeout, call)
            else:
                result = await call()
    if breaker is not None:
        await breaker._arecord(st.permit, None)
    return result


def attempts(s: Settings, call: Callable[[], Any], hook: AttemptHook | None) -> Attempts:
    """The attempt steps of a sync call's plan."""
    return Attempts(
        partial(straight_attempt, s, call, hook), None, partial(_attempt, s, call, hook), None
    )


def aattempts(
    s: Settings, call: Callable[[], Awaitable[Any]], hook: AttemptHook | None
) -> Attempts:
    """The attempt steps of an async call's plan."""
    straight = partial(astraight_attempt, s, call, hook)
    one = partial(_aattempt, s, call, hook)
    return Attempts(straight, straight, one, one)


class _Attempt:
    """One attempt's frame, the same in both drivers: marked in the context (a policy
    called inside makes one attempt), heard by the hook from its start to its end."""

    __slots__ = ("hook", "mark", "n", "token")

    def __init__(self, hook: AttemptHook | None, n: int) -> None:
        self.hook, self.n = hook, n

    def __enter__(self) -> None:
        self.token = retry_context.set(IN_ATTEMPT)
        self.mark = None if self.hook is None else self.hook.begin(self.n)

    def __exit__(self, et: object, error: BaseException | None, tb: object) -> None:
        unmark(self.token)
        if self.hook is not None:
            self.hook.end(self.mark, error)


def _attempt(
    s: Settings, call: Callable[[], T], hook: AttemptHook | None, timeout: float | None, n: int
) -> T:
    with _Attempt(hook, n):
        if timeout is not None and s.attempt_timeout is not None:
            return s.clock.call_with_timeout(timeout, call)
        return call()


async def _aattempt(
    s: Settings,
    call: Callable[[], Awaitable[T]],
    hook: AttemptHook | None,
    timeout: float | None,
    n: int,
) -> T:
    with _Attempt(hook, n):
        if timeout is not None:
            return await s.clock.acall_with_timeout(timeout, call)
        return await call()
