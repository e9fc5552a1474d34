"""The retry policy: its settings, and the thin sync and async shells of its attempt loop.

The decisions are the plan's (:mod:`tether.retries._plan`), the attempts
:mod:`tether.retries._drive`'s, the I/O tether's one driver pair's (:mod:`tether._sansio`):
``call`` and ``acall`` only pick the driver. Every call's first attempt is the plan's own
straight attempt step, made without a plan; a failure goes on in the plan.

Retry at one layer only: a policy's call running inside another policy's call (same
thread or asyncio task, tracked by a context variable) makes exactly one attempt and
leaves every decision to the outer layer, so nested retries never multiply.
"""

from __future__ import annotations

import functools
import inspect
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from tether._frozen import Value, frozen_dataclass
from tether._sansio import adrive, drive
from tether.classification._classify import Verdict, classify
from tether.clock import Clock, system_clock
from tether.retries._drive import (
    IN_ATTEMPT,
    aattempts,
    astraight_attempt,
    attempts,
    retry_context,
    straight_attempt,
    unmark,
)
from tether.retries._job import JOB_CAP, Job
from tether.retries._plan import CallState, Jitter, Waits, attempt_plan, straight
from tether.telemetry import enabled as _recording
from tether.telemetry._attempts import AttemptHook, retry_spans
from tether.telemetry._events import RetryHook

if TYPE_CHECKING:
    from tether.guards._breaker import CircuitBreaker
    from tether.guards._budget import RetryBudget
    from tether.guards._limiter import AdaptiveLimiter

__all__ = ["RetryPolicy", "RetryStats", "retry"]

#: the context's retry state, read and set on every call (bound once: no look-up per call)
_context, _mark = retry_context.get, retry_context.set

P = ParamSpec("P")
T = TypeVar("T")

JITTERS = tuple(j.value for j in Jitter)

#: the settings ``replace`` copies, in the order of the constructor
_SETTINGS = (
    "max_attempts",
    "base",
    "cap",
    "jitter",
    "deadline",
    "attempt_timeout",
    "budget",
    "breaker",
    "limiter",
    "clock",
    "seed",
    "retry_after_cap",
    "rate_limit_base",
    "rate_limit_cap",
    "on_retry",
    "name",
    "classifier",
)


@frozen_dataclass
class RetryStats(Value):
    """What the last call of a policy did, in this thread or task."""

    attempts: int
    total_wait: float
    last_verdict: Verdict | None

    @property
    def retries(self) -> int:
        return max(0, self.attempts - 1)


def _positive(name: str, value: float | None, *, allow_zero: bool = True) -> None:
    if value is None:
        return
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if value < 0 or (not allow_zero and value == 0) or value != value:
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")


def _checked(
    max_attempts: int,
    base: float,
    cap: float,
    jitter: str,
    deadline: float | None,
    attempt_timeout: float | None,
    retry_after_cap: float,
    rate_limit_base: float | None,
    rate_limit_cap: float | None,
) -> tuple[Jitter, float, float]:
    """A policy's settings checked, each error naming its field; returns the jitter and
    the rate-limit tier's base and cap (the other tier's where not given)."""
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
        raise TypeError(f"max_attempts must be an int, got {type(max_attempts).__name__}")
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1, got {max_attempts!r}")
    _positive("base", base)
    _positive("cap", cap)
    if cap < base:
        raise ValueError(f"cap must be >= base ({base!r}), got {cap!r}")
    if jitter not in JITTERS:
        raise ValueError(f"jitter must be one of {', '.join(JITTERS)}; got {jitter!r}")
    _positive("deadline", deadline, allow_zero=False)
    _positive("attempt_timeout", attempt_timeout, allow_zero=False)
    _positive("retry_after_cap", retry_after_cap)
    _positive("rate_limit_base", rate_limit_base)
    _positive("rate_limit_cap", rate_limit_cap)
    rl_base = base if rate_limit_base is None else rate_limit_base
    rl_cap = cap if rate_limit_cap is None else rate_limit_cap
    if rl_cap < rl_base:
        raise ValueError(f"rate_limit_cap must be >= rate_limit_base ({rl_base!r}), got {rl_cap!r}")
    return Jitter(jitter), rl_base, rl_cap


class RetryPolicy:
    """How long to wait, how often, until when: one object, sync and async.

    * ``max_attempts`` counts calls, the first included. Permanent and quota failures
      are raised after exactly one call; exhaustion re-raises the last error itself.
    * Waits: after the n-th failure of a tier the wait is ``backoff(n - 1)``, jittered
      (``"full"``, ``"equal"``, ``"decorrelated"``, ``"none"``). Rate limits and the
      rest are two tiers with their own counters and schedules: a 429 uses
      ``rate_limit_base``/``rate_limit_cap`` (short waits), anything else ``base``/``cap``.
      A ``Retry-After`` is a floor on the wait, capped by ``retry_after_cap``.
    * ``deadline`` bounds the whole call in seconds: if the next wait would end past
      it, :class:`tether.DeadlineExceeded` is raised at once, chained from the last
      error. It also bounds the attempt in progress where that can be interrupted.
    * ``attempt_timeout`` bounds one attempt. Async attempts are cancelled. Sync
      attempts run in a worker thread: the caller gets a ``TimeoutError`` on time, but
      Python cannot kill a thread, so a hung call keeps running in the background.
    * ``budget``, ``breaker`` and ``limiter`` are the fleet guards; see their classes.

    >>> from tether import VirtualClock
    >>> policy = RetryPolicy(max_attempts=3, jitter="none", clock=VirtualClock())
    >>> calls = []
    >>> def flaky():
    ...     calls.append(1)
    ...     if len(calls) < 3:
    ...         raise ConnectionResetError()
    ...     return "ok"
    >>> policy.call(flaky), policy.statistics.attempts, policy.statistics.total_wait
    ('ok', 3, 1.5)
    """

    def __init__(
        self,
        max_attempts: int = 5,
        base: float = 0.5,
        cap: float = 30.0,
        jitter: str = "full",
        deadline: float | None = None,
        attempt_timeout: float | None = None,
        budget: RetryBudget | None = None,
        breaker: CircuitBreaker | None = None,
        limiter: AdaptiveLimiter | None = None,
        clock: Clock | None = None,
        seed: int | None = None,
        *,
        retry_after_cap: float = 60.0,
        rate_limit_base: float | None = None,
        rate_limit_cap: float | None = None,
        on_retry: RetryHook | None = None,
        name: str = "call",
        classifier: Callable[[BaseException], Verdict] | None = None,
    ) -> None:
        self.jitter, rl_base, rl_cap = _checked(
            max_attempts,
            base,
            cap,
            jitter,
            deadline,
            attempt_timeout,
            retry_after_cap,
            rate_limit_base,
            rate_limit_cap,
        )
        self.max_attempts = max_attempts
        self.base = float(base)
        self.cap = float(cap)
        self.deadline = deadline
        self.attempt_timeout = attempt_timeout
        self.budget = budget
        self.breaker = breaker
        self.limiter = limiter
        self.clock: Clock = clock or system_clock
        self.seed = seed
        self.retry_after_cap = float(retry_after_cap)
        self.rate_limit_base = float(rl_base)
        self.rate_limit_cap = float(rl_cap)
        self.on_retry = on_retry
        self.name = name
        self.classifier = classifier or classify
        self.rng = random.Random(seed)
        self._one_attempt: tuple[int, int, float, Verdict | None] = (id(self), 1, 0.0, None)
        # no guard and no clock reading: the first attempt can be a plain call (the
        # settings are fixed once made; ``replace`` makes a policy with others)
        self._plain = all(x is None for x in (budget, breaker, limiter, deadline, attempt_timeout))
        self._straight = straight(self)
        # the span name when it is the policy's own (a guarded run's, named by its tool):
        # no look-up of the function's name per call
        self._own_name = name if name and name != "call" else None

    def replace(self, **changes: Any) -> RetryPolicy:
        """A copy with some settings changed (validated again)."""
        unknown = set(changes) - set(_SETTINGS)
        if unknown:
            raise TypeError(f"unknown RetryPolicy setting(s): {', '.join(sorted(unknown))}")
        fields = {name: getattr(self, name) for name in _SETTINGS}
        fields["jitter"] = self.jitter.value
        fields.update(changes)
        return RetryPolicy(**fields)

    def __repr__(self) -> str:
        return (
            f"RetryPolicy(max_attempts={self.max_attempts}, base={self.base}, cap={self.cap}, "
            f"jitter={self.jitter.value!r}, deadline={self.deadline})"
        )

    @property
    def statistics(self) -> RetryStats:
        """Attempts and total wait of this policy's last call in this thread or task."""
        last = retry_context.get()
        if last is None or last is IN_ATTEMPT or last[0] != id(self):
            return RetryStats(0, 0.0, None)
        return RetryStats(last[1], last[2], last[3])

    def _retries(self) -> int:
        """``statistics.retries``, without building the statistics (a run asks per call)."""
        last = _context()
        if last is self._one_attempt:  # what a call that succeeded at once leaves
            return 0
        if last is None or last is IN_ATTEMPT or last[0] != id(self):
            return 0
        return max(0, last[1] - 1)  # type: ignore[no-any-return]

    def waits(self) -> Waits:
        """A fresh two-tier backoff: ``.next(verdict)`` is the wait after each failure.

        For a framework that makes a request's attempts itself and asks tether how long
        to wait (one ``waits()`` per request).
        """
        return Waits(self)

    # --- the sync shell -------------------------------------------------------------

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Call ``fn(*args, **kwargs)`` under this policy."""
        if _context() is IN_ATTEMPT:
            return fn(*args, **kwargs)  # an outer layer retries
        if self._plain and not _recording():
            token = _mark(IN_ATTEMPT)
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                unmark(token)
                if not isinstance(exc, Exception):
                    raise
                first = exc
            else:
                _mark(self._one_attempt)  # what reset, then set would leave
                return result
            return self._loop(functools.partial(fn, *args, **kwargs), fn, self.deadline, first)
        if _recording():
            return self._traced(functools.partial(fn, *args, **kwargs), self._span_name(fn))
        return self._loop(functools.partial(fn, *args, **kwargs), fn, self.deadline)

    def call_within(
        self, seconds: float | None, fn: Callable[[], T], *, hook: AttemptHook | None = None
    ) -> T:
        """``call(fn)`` with the deadline tightened to ``seconds`` for this call only.

        What a guarded run uses to give each tool call the time the run has left,
        without building a new policy per call; ``hook`` hears about each attempt
        (:func:`tether.telemetry.attempt_spans` makes their spans).
        """
        if _context() is IN_ATTEMPT:
            return fn()
        deadline = self.deadline if seconds is None else self._tighter(seconds)
        return self._loop(fn, fn, deadline, hook=hook)

    def _loop(
        self,
        call: Callable[[], T],
        fn: Any,
        deadline: float | None,
        first: Exception | None = None,
        hook: AttemptHook | None = None,
    ) -> T:
        st = CallState(self, self._own_name or self._span_name(fn), deadline)
        try:
            if first is None and self._straight:
                try:
                    return straight_attempt(self, call, hook, st)
                except Exception as exc:
                    first = exc
            plan = attempt_plan(self, st, attempts(self, call, hook), first)
            return drive(plan, self.clock)  # type: ignore[no-any-return]
        finally:
            _mark(self._left(st))

    def _traced(self, call: Callable[[], T], name: str) -> T:
        spans = retry_spans(name)
        with spans:  # type: ignore[union-attr]
            return self._loop(call, name, self.deadline, hook=spans)

    # --- the async shell ------------------------------------------------------------

    async def acall(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Await ``fn(*args, **kwargs)`` under this policy; attempts can be cancelled."""
        if retry_context.get() is IN_ATTEMPT:
            return await fn(*args, **kwargs)
        call = functools.partial(fn, *args, **kwargs)
        if _recording():
            name = self._span_name(fn)
            spans = retry_spans(name)
            with spans:  # type: ignore[union-attr]
                return await self._aloop(call, name, self.deadline, spans)
        return await self._aloop(call, fn, self.deadline, None)

    async def acall_within(
        self,
        seconds: float | None,
        fn: Callable[[], Awaitable[T]],
        *,
        hook: AttemptHook | None = None,
    ) -> T:
        """The async form of :meth:`call_within`."""
        if _context() is IN_ATTEMPT:
            return await fn()
        return await self._aloop(fn, fn, self._tighter(seconds), hook)

    async def _aloop(
        self,
        call: Callable[[], Awaitable[T]],
        fn: Any,
        deadline: float | None,
        hook: AttemptHook | None,
    ) -> T:
        st = CallState(self, self._own_name or self._span_name(fn), deadline)
        closed = False
        try:
            first = None
            if self._straight:
                try:
                    return await astraight_attempt(self, call, hook, st)
                except Exception as exc:
                    first = exc
            plan = attempt_plan(self, st, aattempts(self, call, hook), first)
            return await adrive(plan, self.clock)
        except GeneratorExit:
            closed = True  # perhaps from another context, whose value is not ours
            raise
        finally:
            if not closed:
                _mark(self._left(st))

    def _left(self, st: CallState) -> tuple[int, int, float, Verdict | None]:
        """What a call leaves in the context for ``statistics``: one attempt that
        succeeded leaves the policy's own tuple (no new one; ``_retries`` knows it)."""
        if st.attempt == 1 and st.verdict is None and st.total_wait == 0.0:
            return self._one_attempt
        return (id(self), st.attempt, st.total_wait, st.verdict)

    def _tighter(self, seconds: float | None) -> float | None:
        if seconds is None:
            return self.deadline
        return seconds if self.deadline is None else min(seconds, self.deadline)

    def _span_name(self, fn: Any) -> str:
        """The policy's own name, or (for the default "call") the function's."""
        if isinstance(fn, str):
            return fn
        if self.name and self.name != "call":
            return self.name
        return getattr(fn, "__qualname__", None) or type(fn).__name__

    # --- jobs ---------------------------------------------------------------------------

    def call_job(
        self,
        fn: Callable[..., T],
        /,
        *args: Any,
        give_up_after: float | None = None,
        job_cap: float = JOB_CAP,
        **kwargs: Any,
    ) -> T:
        """Run ``fn(*args, **kwargs)`` until it succeeds, as a queue worker would.

        Under this policy; on an open breaker, wait for its next probe (with jitter);
        after a failure, back off at the job level (full jitter, at most ``job_cap``
        seconds: the limiter paces the fleet, a longer wait only finishes later); give
        up after ``give_up_after`` seconds, or at once on a permanent failure.
        """
        job = Job(self.clock, self.base, self.rng.random(), give_up_after, job_cap)
        while True:
            try:
                return self.call(fn, *args, **kwargs)
            except Exception as exc:
                self.clock.sleep(job.wait_after(exc))

    async def acall_job(
        self,
        fn: Callable[..., Awaitable[T]],
        /,
        *args: Any,
        give_up_after: float | None = None,
        job_cap: float = JOB_CAP,
        **kwargs: Any,
    ) -> T:
        """The async form of :meth:`call_job`."""
        job = Job(self.clock, self.base, self.rng.random(), give_up_after, job_cap)
        while True:
            try:
                return await self.acall(fn, *args, **kwargs)
            except Exception as exc:
                await self.clock.asleep(job.wait_after(exc))

    # --- decorator ------------------------------------------------------------------

    @overload
    def __call__(self, fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]: ...
    @overload
    def __call__(self, fn: Callable[P, T]) -> Callable[P, T]: ...
    def __call__(self, fn: Callable[P, Any]) -> Callable[P, Any]:
        """Use the policy as a decorator of a sync or async function."""
        return _decorated(self, fn)


def _decorated(policy: RetryPolicy, fn: Callable[P, Any]) -> Callable[P, Any]:
    """``fn`` calling through ``policy`` (``policy.acall`` for a coroutine function);
    the policy is ``wrapper.retry_policy``."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            return await policy.acall(fn, *args, **kwargs)

        awrapper.retry_policy = policy  # type: ignore[attr-defined]
        return awrapper

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
        return policy.call(fn, *args, **kwargs)

    wrapper.retry_policy = policy  # type: ignore[attr-defined]
    return wrapper


def retry(fn: Callable[..., Any] | None = None, /, **settings: Any) -> Any:
    """Decorate a sync or async function with a :class:`RetryPolicy`.

    ``@tether.retry`` uses the defaults; ``@tether.retry(max_attempts=3)`` takes any
    ``RetryPolicy`` setting. The policy is available as ``fn.retry_policy``.
    """
    policy = RetryPolicy(**settings)
    if fn is not None:
        return policy(fn)
    return policy
