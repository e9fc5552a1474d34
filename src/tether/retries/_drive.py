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

from tether.retries._plan import Op, Plan, Settings, Step
from tether.telemetry._attempts import AttemptHook

__all__ = ["IN_ATTEMPT", "adrive", "drive", "retry_context"]

T = TypeVar("T")

#: what a context (thread or task) knows of retries: IN_ATTEMPT while an attempt of some
#: policy runs in it; else (policy id, attempts, total wait, last verdict) of the last
#: call made in it, or None. One variable, so that the success path sets it once.
retry_context: contextvars.ContextVar[Any] = contextvars.ContextVar("tether_retry", default=None)
IN_ATTEMPT: Any = object()


def drive(s: Settings, plan: Plan, call: Callable[[], T], hook: AttemptHook | None) -> T:
    """Run ``plan`` in this thread; ``call`` makes one attempt.

    A sync attempt is interrupted only by ``attempt_timeout`` (it then runs in a worker
    thread); the deadline alone bounds the waits between attempts.
    """
    answer: Any = None
    error: Exception | None = None
    while True:
        try:
            step = plan.send(answer) if error is None else plan.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        answer = error = None
        try:
            if step.op is Op.ATTEMPT:
                answer = _attempt(s, step, call, hook)
            elif step.op is Op.SLEEP:
                s.clock.sleep(step.arg)
            else:
                answer = _guard(s, step)
        except Exception as exc:
            error = exc


async def adrive(
    s: Settings, plan: Plan, call: Callable[[], Awaitable[T]], hook: AttemptHook | None
) -> T:
    """Run ``plan`` on the event loop; an attempt past its timeout is cancelled."""
    answer: Any = None
    error: Exception | None = None
    while True:
        try:
            step = plan.send(answer) if error is None else plan.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        answer = error = None
        try:
            if step.op is Op.ATTEMPT:
                answer = await _aattempt(s, step, call, hook)
            elif step.op is Op.SLEEP:
                await s.clock.asleep(step.arg)
            else:
                answer = await _aguard(s, step)
        except Exception as exc:
            error = exc


def _attempt(s: Settings, step: Step, call: Callable[[], T], hook: AttemptHook | None) -> T:
    token = retry_context.set(IN_ATTEMPT)
    mark = None if hook is None else hook.begin(step.attempt)
    try:
        if step.arg is not None and s.attempt_timeout is not None:
            result = s.clock.call_with_timeout(step.arg, call)
        else:
            result = call()
    except BaseException as exc:
        if hook is not None:
            hook.end(mark, exc)
        raise
    finally:
        retry_context.reset(token)
    if hook is not None:
        hook.end(mark, None)
    return result


async def _aattempt(
    s: Settings, step: Step, call: Callable[[], Awaitable[T]], hook: AttemptHook | None
) -> T:
    token = retry_context.set(IN_ATTEMPT)
    mark = None if hook is None else hook.begin(step.attempt)
    try:
        if step.arg is not None:
            result = await s.clock.acall_with_timeout(step.arg, call)
        else:
            result = await call()
    except BaseException as exc:
        if hook is not None:
            hook.end(mark, exc)
        raise
    finally:
        retry_context.reset(token)
    if hook is not None:
        hook.end(mark, None)
    return result


def _guard(s: Settings, step: Step) -> Any:
    op = step.op
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


async def _aguard(s: Settings, step: Step) -> Any:
    op = step.op
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
