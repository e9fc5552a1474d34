"""The retry engine: one decision function, driven by a thin sync and a thin async shell.

Retry at one layer only: a policy's call running inside another policy's call (same
thread or asyncio task, tracked by a context variable) makes exactly one attempt and
leaves every decision to the outer layer, so nested retries never multiply.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import random
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from tether import backoff
from tether._errors import CircuitOpenError, DeadlineExceeded, LimiterTimeout
from tether.classification._classify import Kind, Verdict, classify
from tether.clock import Clock, system_clock
from tether.retries._job import JOB_CAP
from tether.telemetry._emit import emit_retry, safe_call
from tether.telemetry._events import RetryEvent, RetryHook

if TYPE_CHECKING:
    from tether.guards._breaker import CircuitBreaker
    from tether.guards._budget import RetryBudget
    from tether.guards._limiter import AdaptiveLimiter

__all__ = ["RetryPolicy", "RetryStats", "retry"]

P = ParamSpec("P")
T = TypeVar("T")
R = TypeVar("R")
#: a guard operation a plan asks for: (kind, argument, verdict)
_Op = tuple[str, Any, "Verdict | None"]

JITTERS = ("full", "equal", "decorrelated", "none")

# True while an attempt of some policy is running in this context
_in_attempt: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "tether_in_attempt", default=False
)
# (policy id, attempts, total wait, last verdict) of the last call in this context
_last_stats: contextvars.ContextVar[tuple[int, int, float, Verdict | None] | None] = (
    contextvars.ContextVar("tether_last_stats", default=None)
)


@dataclass(frozen=True, slots=True)
class RetryStats:
    """What the last call of a policy did, in this thread or task."""

    attempts: int
    total_wait: float
    last_verdict: Verdict | None

    @property
    def retries(self) -> int:
        return max(0, self.attempts - 1)


class _CallState:
    """The mutable state of one call: attempts, tier counters, the clock readings."""

    __slots__ = ("attempt", "deadline_at", "name", "prev_delay", "rate_failures", "slow_failures",
                 "start", "total_wait", "verdict")  # fmt: skip

    def __init__(
        self, start: float, deadline_at: float | None, base: float, name: str = ""
    ) -> None:
        self.name = name
        self.attempt = 0
        self.start = start
        self.deadline_at = deadline_at
        self.prev_delay = base
        self.rate_failures = 0
        self.slow_failures = 0
        self.total_wait = 0.0
        self.verdict: Verdict | None = None


def _positive(name: str, value: float | None, *, allow_zero: bool = True) -> None:
    if value is None:
        return
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if value < 0 or (not allow_zero and value == 0) or value != value:
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")


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
            raise ValueError(
                f"rate_limit_cap must be >= rate_limit_base ({rl_base!r}), got {rl_cap!r}"
            )
        self.max_attempts = max_attempts
        self.base = float(base)
        self.cap = float(cap)
        self.jitter = jitter
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
        self._rng = random.Random(seed)

    def replace(self, **changes: Any) -> RetryPolicy:
        """A copy with some settings changed (validated again)."""
        fields: dict[str, Any] = {
            "max_attempts": self.max_attempts, "base": self.base, "cap": self.cap,
            "jitter": self.jitter, "deadline": self.deadline,
            "attempt_timeout": self.attempt_timeout, "budget": self.budget,
            "breaker": self.breaker, "limiter": self.limiter, "clock": self.clock,
            "seed": self.seed, "retry_after_cap": self.retry_after_cap,
            "rate_limit_base": self.rate_limit_base, "rate_limit_cap": self.rate_limit_cap,
            "on_retry": self.on_retry, "name": self.name, "classifier": self.classifier,
        }  # fmt: skip
        unknown = set(changes) - set(fields)
        if unknown:
            raise TypeError(f"unknown RetryPolicy setting(s): {', '.join(sorted(unknown))}")
        fields.update(changes)
        return RetryPolicy(**fields)

    def __repr__(self) -> str:
        return (
            f"RetryPolicy(max_attempts={self.max_attempts}, base={self.base}, cap={self.cap}, "
            f"jitter={self.jitter!r}, deadline={self.deadline})"
        )

    @property
    def statistics(self) -> RetryStats:
        """Attempts and total wait of this policy's last call in this thread or task."""
        last = _last_stats.get()
        if last is None or last[0] != id(self):
            return RetryStats(0, 0.0, None)
        return RetryStats(last[1], last[2], last[3])

    # --- the decision function shared by both shells --------------------------------

    def _delay(self, st: _CallState, verdict: Verdict) -> float:
        if verdict.kind is Kind.RATE_LIMITED:
            st.rate_failures += 1
            n, base, cap = st.rate_failures - 1, self.rate_limit_base, self.rate_limit_cap
        else:
            st.slow_failures += 1
            n, base, cap = st.slow_failures - 1, self.base, self.cap
        if self.jitter == "full":
            delay = backoff.full_jitter(n, base, cap, self._rng)
        elif self.jitter == "equal":
            delay = backoff.equal_jitter(n, base, cap, self._rng)
        elif self.jitter == "decorrelated":
            delay = backoff.decorrelated_jitter(st.prev_delay if n else base, base, cap, self._rng)
        else:
            delay = backoff.exponential(n, base, cap)
        st.prev_delay = delay
        if verdict.retry_after is not None:
            delay = max(delay, min(verdict.retry_after, self.retry_after_cap))
        return delay

    # The decisions that interleave with guard operations (after a failure; the limiter's
    # admission) are plans: generators that yield the operations they need (which talk to
    # the store) and get their answers back. The sync shell runs them with the guards' sync
    # methods, the async shell awaits their async twins, so that a RedisStore never blocks
    # an event loop and the two shells cannot drift.

    def _ops(self, plan: Generator[_Op, Any, R]) -> R:
        """Run a plan's guard operations synchronously."""
        try:
            op = next(plan)
            while True:
                op = plan.send(self._op(op))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def _aops(self, plan: Generator[_Op, Any, R]) -> R:
        """Run a plan's guard operations on the event loop."""
        try:
            op = next(plan)
            while True:
                op = plan.send(await self._aop(op))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def _op(self, op: _Op) -> Any:
        kind, arg, verdict = op
        if kind == "record":
            return self.breaker._record(arg, verdict)  # type: ignore[union-attr]
        if kind == "limit":
            return self.limiter.try_acquire()  # type: ignore[union-attr]
        if kind == "feedback":
            return self.limiter.record(verdict)  # type: ignore[union-attr]
        return self.budget.try_spend(timeout=bool(arg))  # type: ignore[union-attr]

    async def _aop(self, op: _Op) -> Any:
        kind, arg, verdict = op
        if kind == "record":
            return await self.breaker._arecord(arg, verdict)  # type: ignore[union-attr]
        if kind == "limit":
            return await self.limiter.atry_acquire()  # type: ignore[union-attr]
        if kind == "feedback":
            return await self.limiter.arecord(verdict)  # type: ignore[union-attr]
        return await self.budget.atry_spend(timeout=bool(arg))  # type: ignore[union-attr]

    def _after_failure(
        self, st: _CallState, exc: Exception, permit: object
    ) -> float | BaseException:
        return self._ops(self._plan_after_failure(st, exc, permit))

    def _plan_after_failure(
        self, st: _CallState, exc: Exception, permit: object
    ) -> Generator[_Op, Any, float | BaseException]:
        """Decide what follows a failed attempt: a wait, or the exception to raise."""
        if isinstance(exc, CircuitOpenError | LimiterTimeout) and permit is _NO_PERMIT:
            return exc  # our own guard refused the attempt: nothing was called
        verdict = self.classifier(exc)
        st.verdict = verdict
        if self.breaker is not None and permit is not _NO_PERMIT:
            yield ("record", permit, verdict)
        if self.limiter is not None:
            yield ("feedback", None, verdict)
        if not verdict.retryable or st.attempt >= self.max_attempts:
            return exc
        if self.breaker is not None:
            refusal = self.breaker._refusal()
            if refusal is not None:
                return refusal
        delay = self._delay(st, verdict)
        now = self.clock.now()
        if st.deadline_at is not None and now + delay >= st.deadline_at:
            return DeadlineExceeded(
                f"{self.name}: the next attempt would start after the deadline "
                f"(attempt {st.attempt} failed: {verdict.reason})"
            )
        if self.budget is not None and not (yield ("spend", verdict.timeout, None)):
            return exc
        event = RetryEvent(st.name or self.name, st.attempt, verdict, delay, exc, now - st.start)
        emit_retry(event)
        safe_call(self.on_retry, event)
        st.total_wait += delay
        return delay

    def _attempt_timeout(self, st: _CallState) -> float | None:
        """Count the attempt and work out its timeout; raises past the deadline."""
        st.attempt += 1
        timeout = self.attempt_timeout
        if st.deadline_at is not None:
            left = st.deadline_at - self.clock.now()
            if left <= 0:
                raise DeadlineExceeded(f"{self.name}: the call's deadline has passed")
            timeout = left if timeout is None else min(timeout, left)
        return timeout

    # the success path is a straight line of guard calls: no plan (no generator) needed

    def _before_attempt(self, st: _CallState) -> tuple[object, float | None]:
        timeout = self._attempt_timeout(st)
        return (_NO_PERMIT if self.breaker is None else self.breaker._acquire()), timeout

    async def _abefore_attempt(self, st: _CallState) -> tuple[object, float | None]:
        timeout = self._attempt_timeout(st)
        return (_NO_PERMIT if self.breaker is None else await self.breaker._aacquire()), timeout

    def _on_success(self, permit: object) -> None:
        if self.breaker is not None:
            self.breaker._record(permit, None)
        if self.limiter is not None:
            self.limiter.record(None)
        if self.budget is not None:
            self.budget.on_success()

    async def _aon_success(self, permit: object) -> None:
        if self.breaker is not None:
            await self.breaker._arecord(permit, None)
        if self.limiter is not None:
            await self.limiter.arecord(None)
        if self.budget is not None:
            await self.budget.aon_success()

    def _finish(self, st: _CallState) -> None:
        _last_stats.set((id(self), st.attempt, st.total_wait, st.verdict))

    # --- the sync shell -------------------------------------------------------------

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Call ``fn(*args, **kwargs)`` under this policy."""
        if _in_attempt.get():
            return fn(*args, **kwargs)  # an outer layer retries
        if _telemetry().enabled():
            return self._traced(fn, args, kwargs)
        if (
            self.budget is None
            and self.breaker is None
            and self.limiter is None
            and self.deadline is None
            and self.attempt_timeout is None
        ):
            token = _in_attempt.set(True)
            first: Exception | None = None
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                first = exc
            finally:
                _in_attempt.reset(token)
            if first is None:
                _last_stats.set((id(self), 1, 0.0, None))
                return result
            return self._call_loop(fn, args, kwargs, first_error=first, deadline=self.deadline)
        return self._call_loop(fn, args, kwargs, first_error=None, deadline=self.deadline)

    def call_within(self, seconds: float | None, fn: Callable[[], T]) -> T:
        """``call(fn)`` with the deadline tightened to ``seconds`` for this call only.

        What a guarded run uses to give each tool call the time the run has left,
        without building a new policy per call.
        """
        if _in_attempt.get():
            return fn()
        return self._call_loop(fn, (), {}, first_error=None, deadline=self._tighter(seconds))

    async def acall_within(self, seconds: float | None, fn: Callable[[], Awaitable[T]]) -> T:
        """The async form of :meth:`call_within`."""
        if _in_attempt.get():
            return await fn()
        return await self._aloop(fn, (), {}, self._tighter(seconds))

    def _tighter(self, seconds: float | None) -> float | None:
        if seconds is None:
            return self.deadline
        return seconds if self.deadline is None else min(seconds, self.deadline)

    def _call_loop(
        self,
        fn: Callable[..., T],
        args: Any,
        kwargs: Any,
        *,
        first_error: Exception | None,
        deadline: float | None,
    ) -> T:
        clock = self.clock
        start = clock.now()
        st = _CallState(start, None if deadline is None else start + deadline, self.base,
                        self._span_name(fn))  # fmt: skip
        pending = first_error
        try:
            while True:
                if pending is None:
                    permit: object = _NO_PERMIT
                    try:
                        # the breaker first: a caller it refuses never asks the limiter
                        permit, timeout = self._before_attempt(st)
                        self._limit(st)
                        token = _in_attempt.set(True)
                        try:
                            if timeout is not None and self.attempt_timeout is not None:
                                result = clock.call_with_timeout(
                                    timeout, functools.partial(fn, *args, **kwargs)
                                )
                            else:
                                result = fn(*args, **kwargs)
                        finally:
                            _in_attempt.reset(token)
                    except Exception as exc:
                        pending = exc
                        decision = self._after_failure(st, exc, permit)
                    else:
                        self._on_success(permit)
                        return result
                else:
                    st.attempt += 1
                    decision = self._after_failure(st, pending, _NO_PERMIT_FIRST)
                if isinstance(decision, BaseException):
                    if decision is pending:
                        raise pending
                    raise decision from pending
                clock.sleep(decision)
                pending = None
        finally:
            self._finish(st)

    def _plan_admission(self, st: _CallState) -> Generator[_Op, Any, tuple[float, bool]]:
        """The limiter's answer, with jitter on a refusal; raises past the deadline."""
        assert self.limiter is not None
        wait, admitted = yield ("limit", None, None)
        if not admitted:  # spread the callers that were turned away
            wait += self._rng.uniform(0.0, min(wait, 1.0) + 0.05)
        if st.deadline_at is not None and self.clock.now() + wait >= st.deadline_at:
            raise LimiterTimeout(self.limiter.name, wait)
        st.total_wait += wait
        return wait, admitted

    def _limit(self, st: _CallState) -> None:
        while self.limiter is not None:
            wait, admitted = self._ops(self._plan_admission(st))
            if wait > 0:
                self.clock.sleep(wait)
            if admitted:
                return

    async def _alimit(self, st: _CallState) -> None:
        while self.limiter is not None:
            wait, admitted = await self._aops(self._plan_admission(st))
            if wait > 0:
                await self.clock.asleep(wait)
            if admitted:
                return

    # --- the async shell ------------------------------------------------------------

    async def acall(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Await ``fn(*args, **kwargs)`` under this policy; attempts can be cancelled."""
        if _in_attempt.get():
            return await fn(*args, **kwargs)
        if _telemetry().enabled():
            return await self._atraced(fn, args, kwargs)
        return await self._aloop(fn, args, kwargs, self.deadline)

    # --- jobs ---------------------------------------------------------------------------

    def call_job(self, fn: Callable[..., T], /, *args: Any, give_up_after: float | None = None,
                 job_cap: float = JOB_CAP, **kwargs: Any) -> T:  # fmt: skip
        """Run ``fn(*args, **kwargs)`` until it succeeds, as a queue worker would.

        Under this policy; on an open breaker, wait for its next probe (with jitter);
        after a failure, back off at the job level (full jitter, at most ``job_cap``
        seconds: the limiter paces the fleet, a longer wait only finishes later); give
        up after ``give_up_after`` seconds, or at once on a permanent failure.
        """
        from tether.retries._job import call_job

        return call_job(self, fn, *args, give_up_after=give_up_after, job_cap=job_cap, **kwargs)

    async def acall_job(self, fn: Callable[..., Awaitable[T]], /, *args: Any,
                        give_up_after: float | None = None, job_cap: float = JOB_CAP, **kwargs: Any) -> T:  # fmt: skip
        """The async form of :meth:`call_job`."""
        from tether.retries._job import acall_job

        return await acall_job(
            self, fn, *args, give_up_after=give_up_after, job_cap=job_cap, **kwargs
        )

    # --- spans (only when OpenTelemetry is configured) ------------------------------

    def _span_name(self, fn: Any) -> str:
        """The policy's own name, or (for the default "call") the function's."""
        if self.name and self.name != "call":
            return self.name
        return getattr(fn, "__qualname__", None) or type(fn).__name__

    def _traced(self, fn: Callable[..., T], args: Any, kwargs: Any) -> T:
        from tether.retries._spans import traced

        return traced(self, fn, args, kwargs)

    async def _atraced(self, fn: Callable[..., Awaitable[T]], args: Any, kwargs: Any) -> T:
        from tether.retries._spans import atraced

        return await atraced(self, fn, args, kwargs)

    async def _aloop(
        self, fn: Callable[..., Awaitable[T]], args: Any, kwargs: Any, deadline: float | None
    ) -> T:
        clock = self.clock
        start = clock.now()
        st = _CallState(start, None if deadline is None else start + deadline, self.base,
                        self._span_name(fn))  # fmt: skip
        try:
            while True:
                permit: object = _NO_PERMIT
                try:
                    permit, timeout = await self._abefore_attempt(st)
                    await self._alimit(st)
                    token = _in_attempt.set(True)
                    try:
                        if timeout is not None:
                            result = await clock.acall_with_timeout(
                                timeout, functools.partial(fn, *args, **kwargs)
                            )
                        else:
                            result = await fn(*args, **kwargs)
                    finally:
                        _in_attempt.reset(token)
                except Exception as exc:
                    decision = await self._aops(self._plan_after_failure(st, exc, permit))
                    if isinstance(decision, BaseException):
                        if decision is exc:
                            raise
                        raise decision from exc
                else:
                    await self._aon_success(permit)
                    return result
                await clock.asleep(decision)
        finally:
            self._finish(st)

    # --- decorator ------------------------------------------------------------------

    @overload
    def __call__(self, fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]: ...
    @overload
    def __call__(self, fn: Callable[P, T]) -> Callable[P, T]: ...
    def __call__(self, fn: Callable[P, Any]) -> Callable[P, Any]:
        """Use the policy as a decorator of a sync or async function."""
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def awrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                return await self.acall(fn, *args, **kwargs)

            awrapper.retry_policy = self  # type: ignore[attr-defined]
            return awrapper

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            return self.call(fn, *args, **kwargs)

        wrapper.retry_policy = self  # type: ignore[attr-defined]
        return wrapper


def _telemetry() -> Any:
    from tether import telemetry

    return telemetry


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


_NO_PERMIT = _Marker("NO_PERMIT")  # no breaker, or the breaker refused before calling
_NO_PERMIT_FIRST = _Marker("NO_PERMIT_FIRST")  # the fast path's first attempt, no breaker


def retry(fn: Callable[..., Any] | None = None, /, **settings: Any) -> Any:
    """Decorate a sync or async function with a :class:`RetryPolicy`.

    ``@tether.retry`` uses the defaults; ``@tether.retry(max_attempts=3)`` takes any
    ``RetryPolicy`` setting. The policy is available as ``fn.retry_policy``.
    """
    policy = RetryPolicy(**settings)
    if fn is not None:
        return policy(fn)
    return policy
