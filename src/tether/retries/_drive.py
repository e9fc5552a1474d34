"""The two drivers of the attempt plan: one for sync code, one for async.

Each runs the steps a plan asks for, and nothing else: the sync driver with the guards'
sync methods and ``clock.sleep``, the async one with their async twins (a RedisStore
answers on ``redis.asyncio``) and ``clock.asleep``. An :class:`AttemptHook` hears about
every attempt (spans); the drivers never build telemetry themselves.

Retry at one layer only: while an attempt runs, :data:`retry_context` holds
:data:`IN_ATTEMPT` in its context (thread or task), and a policy called inside it makes
exactly one attempt.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tether.retries._plan import NO_PERMIT, CallState, Op, Plan, Settings, Step, attempt_timeout
from tether.telemetry._attempts import AttemptHook

__all__ = ["IN_ATTEMPT", "adrive", "afirst_attempt", "drive", "first_attempt", "retry_context"]

T = TypeVar("T")

#: what a context (thread or task) knows of retries: IN_ATTEMPT while an attempt of some
#: policy runs in it; else (policy id, attempts, total wait, last verdict) of the last
#: call made in it, or None. One variable, so that the success path sets it once.
retry_context: contextvars.ContextVar[Any] = contextvars.ContextVar("tether_retry", default=None)
IN_ATTEMPT: Any = object()
#: the context's mark, set and reset around an attempt (bound once: no look-up per call)
_mark, _reset = retry_context.set, retry_context.reset


class _Cursor:
    """Where a driver is in its plan: the answer (or error) for the plan's last step."""

    __slots__ = ("answer", "error", "plan", "value")

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.answer: Any = None
        self.error: Exception | None = None
        self.value: Any = None

    def next(self) -> Step | None:
        """The plan's next step, or None once it returned (its result in ``value``)."""
        try:
            step = (
                self.plan.send(self.answer) if self.error is None else self.plan.throw(self.error)
            )
        except StopIteration as done:
            self.value = done.value
            return None
        self.answer = self.error = None
        return step


def drive(s: Settings, plan: Plan, call: Callable[[], T], hook: AttemptHook | None) -> T:
    """Run ``plan`` in this thread; ``call`` makes one attempt.

    A sync attempt is interrupted only by ``attempt_timeout`` (it then runs in a worker
    thread); the deadline alone bounds the waits between attempts.
    """
    cursor = _Cursor(plan)
    while (step := cursor.next()) is not None:
        try:
            cursor.answer = _step(s, step, call, hook)
        except Exception as exc:
            cursor.error = exc
    return cursor.value  # type: ignore[no-any-return]


async def adrive(
    s: Settings, plan: Plan, call: Callable[[], Awaitable[T]], hook: AttemptHook | None
) -> T:
    """Run ``plan`` on the event loop; an attempt past its timeout is cancelled."""
    cursor = _Cursor(plan)
    while (step := cursor.next()) is not None:
        try:
            cursor.answer = await _astep(s, step, call, hook)
        except Exception as exc:
            cursor.error = exc
    return cursor.value  # type: ignore[no-any-return]


#: what :func:`first_attempt` gives for an attempt that raised
FAILED: Any = object()


def first_attempt(
    s: Settings, st: CallState, call: Callable[[], T], hook: AttemptHook | None
) -> tuple[Any, Exception | None, object]:
    """The plan's first steps, made straight when :func:`~tether.retries._plan.straight`
    says so (a call that succeeds costs no plan): the breaker's permit, the attempt, the
    success recorded. Returns ``(result, None, permit)``, or ``(FAILED, error, permit)``
    for the plan to go on from (``attempt_plan(first_error=error, permit=permit)``)."""
    permit = NO_PERMIT
    breaker = s.breaker
    try:
        timeout = attempt_timeout(s, st)
        if breaker is not None:
            permit = breaker._acquire()
        if timeout is None or s.attempt_timeout is None:
            timeout = None  # made inline: only attempt_timeout moves a sync attempt
        if hook is None:
            # _Attempt's frame without the object (no hook to hear of it): the mark set
            # for the attempt and reset after it, however it ends
            token = _mark(IN_ATTEMPT)
            try:
                result = call() if timeout is None else s.clock.call_with_timeout(timeout, call)
            finally:
                _reset(token)
        else:
            with _Attempt(hook, st.attempt):
                result = call() if timeout is None else s.clock.call_with_timeout(timeout, call)
    except Exception as exc:
        return FAILED, exc, permit
    if breaker is not None:
        breaker._record(permit, None)
    return result, None, permit


async def afirst_attempt(
    s: Settings, st: CallState, call: Callable[[], Awaitable[T]], hook: AttemptHook | None
) -> tuple[Any, Exception | None, object]:
    """The async form of :func:`first_attempt` (an attempt past its timeout is cancelled)."""
    permit = NO_PERMIT
    breaker = s.breaker
    try:
        timeout = attempt_timeout(s, st)
        if breaker is not None:
            permit = await breaker._aacquire()
        if hook is None:  # as in first_attempt: _Attempt's frame without the object
            token = _mark(IN_ATTEMPT)
            try:
                if timeout is not None:
                    result = await s.clock.acall_with_timeout(timeout, call)
                else:
                    result = await call()
            finally:
                _reset(token)
        else:
            with _Attempt(hook, st.attempt):
                if timeout is not None:
                    result = await s.clock.acall_with_timeout(timeout, call)
                else:
                    result = await call()
    except Exception as exc:
        return FAILED, exc, permit
    if breaker is not None:
        await breaker._arecord(permit, None)
    return result, None, permit


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
        retry_context.reset(self.token)
        if self.hook is not None:
            self.hook.end(self.mark, error)


def _attempt(s: Settings, step: Step, call: Callable[[], T], hook: AttemptHook | None) -> T:
    with _Attempt(hook, step.attempt):
        if step.arg is not None and s.attempt_timeout is not None:
            return s.clock.call_with_timeout(step.arg, call)
        return call()


async def _aattempt(
    s: Settings, step: Step, call: Callable[[], Awaitable[T]], hook: AttemptHook | None
) -> T:
    with _Attempt(hook, step.attempt):
        if step.arg is not None:
            return await s.clock.acall_with_timeout(step.arg, call)
        return await call()


def _step(s: Settings, step: Step, call: Callable[[], Any], hook: AttemptHook | None) -> Any:
    op = step.op
    if op is Op.ATTEMPT:
        return _attempt(s, step, call, hook)
    if op is Op.SLEEP:
        return s.clock.sleep(step.arg)
    if op is Op.ACQUIRE:
        return s.breaker._acquire()  # type: ignore[union-attr]
    if op is Op.RECORD:
        return s.breaker._record(step.arg, step.verdict)  # type: ignore[union-attr]
    if op is Op.ADMIT:
        return s.limiter.try_acquire()  # type: ignore[union-attr]
    if op is Op.FEEDBACK:
        return s.limiter.record(step.verdict)  # type: ignore[union-attr]
    if op is Op.SPEND:
        return s.budget.try_spend(timeout=bool(step.arg))  # type: ignore[union-attr]
    return s.budget.on_success()  # type: ignore[union-attr]


async def _astep(
    s: Settings, step: Step, call: Callable[[], Awaitable[Any]], hook: AttemptHook | None
) -> Any:
    op = step.op
    if op is Op.ATTEMPT:
        return await _aattempt(s, step, call, hook)
    if op is Op.SLEEP:
        return await s.clock.asleep(step.arg)
    if op is Op.ACQUIRE:
        return await s.breaker._aacquire()  # type: ignore[union-attr]
    if op is Op.RECORD:
        return await s.breaker._arecord(step.arg, step.verdict)  # type: ignore[union-attr]
    if op is Op.ADMIT:
        return await s.limiter.atry_acquire()  # type: ignore[union-attr]
    if op is Op.FEEDBACK:
        return await s.limiter.arecord(step.verdict)  # type: ignore[union-attr]
    if op is Op.SPEND:
        return await s.budget.atry_spend(timeout=bool(step.arg))  # type: ignore[union-attr]
    return await s.budget.aon_success()  # type: ignore[union-attr]
