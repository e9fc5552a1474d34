"""The attempt loop's decisions, without I/O: what to do next, and why.

One call under a retry policy is a plan of tether's one step vocabulary
(:mod:`tether._sansio`): a generator that yields :class:`~tether._sansio.Call` steps
(take a breaker permit, ask the limiter, make the attempt, record an outcome, spend the
budget) and :class:`~tether._sansio.Sleep` steps, and gets each step's answer back (or
its exception thrown in). It returns the attempt's result, or raises the error the caller
gets: the last error itself, :class:`tether.DeadlineExceeded`, or a guard's refusal.

The sync and the async driver of :mod:`tether._sansio` run the same plan, the sync one
with the guards' sync methods and the clock's ``sleep``, the async one with their async
twins and ``asleep``, so the two cannot drift. This module imports nothing else of the
retries package: the attempt itself comes in as an :class:`Attempts` pair.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from tether import backoff
from tether._errors import CircuitOpenError, DeadlineExceeded, LimiterTimeout
from tether._sansio import Call, Plan, Sleep
from tether.classification._classify import Kind, Verdict
from tether.telemetry._emit import emit_retry, safe_call
from tether.telemetry._events import RetryEvent, RetryHook

if TYPE_CHECKING:
    from tether.clock import Clock
    from tether.guards._breaker import CircuitBreaker
    from tether.guards._budget import RetryBudget
    from tether.guards._limiter import AdaptiveLimiter

__all__ = [
    "Attempts",
    "CallState",
    "Jitter",
    "Settings",
    "Waits",
    "attempt_plan",
    "attempt_timeout",
    "straight",
]


class Jitter(enum.StrEnum):
    """How a wait is spread (``RetryPolicy(jitter=...)`` takes the value as a string)."""

    FULL = "full"
    EQUAL = "equal"
    DECORRELATED = "decorrelated"
    NONE = "none"


class Attempts(NamedTuple):
    """The attempt of one call, in its two forms (made by :mod:`tether.retries._drive`).

    ``straight(st)`` is a whole attempt of a :func:`straight` policy: the breaker's permit
    (kept in ``st.permit``), the call, its success recorded; the policy's first attempt is
    this same step made without a plan. ``one(timeout, n)`` is the call alone, for a plan
    that asks its guards step by step. ``astraight`` and ``aone``: their async forms.
    """

    straight: Callable[[CallState], Any]
    astraight: Callable[[CallState], Awaitable[Any]] | None
    one: Callable[[float | None, int], Any]
    aone: Callable[[float | None, int], Awaitable[Any]] | None


class Settings(Protocol):
    """What a plan reads from its policy (a :class:`tether.RetryPolicy`)."""

    max_attempts: int
    attempt_timeout: float | None
    base: float
    cap: float
    jitter: Jitter
    retry_after_cap: float
    rate_limit_base: float
    rate_limit_cap: float
    budget: RetryBudget | None
    breaker: CircuitBreaker | None
    limiter: AdaptiveLimiter | None
    clock: Clock
    on_retry: RetryHook | None
    name: str
    classifier: Callable[[BaseException], Verdict]
    rng: random.Random


class _Permit:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: no breaker, or the breaker refused before calling
NO_PERMIT: Any = _Permit("NO_PERMIT")


class Waits:
    """The two-tier backoff of one request: rate limits and the rest count apart.

    After the n-th failure of a tier the wait is that tier's ``backoff(n - 1)``,
    jittered; a ``Retry-After`` is a floor on it, capped by ``retry_after_cap``.
    """

    __slots__ = ("_prev", "_rate", "_settings", "_slow")

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._prev = settings.base
        self._rate = self._slow = 0

    def next(self, verdict: Verdict) -> float:
        """The wait after a failure with ``verdict``."""
        s = self._settings
        if verdict.kind is Kind.RATE_LIMITED:
            self._rate += 1
            n, base, cap = self._rate - 1, s.rate_limit_base, s.rate_limit_cap
        else:
            self._slow += 1
            n, base, cap = self._slow - 1, s.base, s.cap
        jitter = s.jitter
        if jitter is Jitter.FULL:
            delay = backoff.full_jitter(n, base, cap, s.rng)
        elif jitter is Jitter.EQUAL:
            delay = backoff.equal_jitter(n, base, cap, s.rng)
        elif jitter is Jitter.DECORRELATED:
            delay = backoff.decorrelated_jitter(self._prev if n else base, base, cap, s.rng)
        else:
            delay = backoff.exponential(n, base, cap)
        self._prev = delay
        if verdict.retry_after is not None:
            delay = max(delay, min(verdict.retry_after, s.retry_after_cap))
        return delay


class CallState:
    """The mutable state of one call: attempts, waits, the clock readings."""

    __slots__ = (
        "attempt", "deadline_at", "name", "permit", "start", "total_wait", "verdict", "waits"
    )  # fmt: skip

    def __init__(self, settings: Settings, name: str, deadline: float | None) -> None:
        self.name = name
        self.attempt = 0
        self.permit: object = NO_PERMIT  # the breaker's permit of the attempt in flight
        self.start = settings.clock.now()
        self.deadline_at = None if deadline is None else self.start + deadline
        self.waits: Waits | None = None  # made at the first failure: most calls succeed
        self.total_wait = 0.0
        self.verdict: Verdict | None = None


def _probe() -> str:
    """The breaker's half-open permit (``Permit.PROBE``)."""
    from tether.stores._logic import PROBE

    return PROBE


def attempt_plan(
    s: Settings, st: CallState, attempts: Attempts, first_error: Exception | None = None
) -> Plan[Any]:
    """The attempt loop; ``first_error``: the first attempt was made already (straight,
    under the breaker's permit in ``st.permit``) and failed."""
    if first_error is not None:
        st.attempt = 1
        failure = yield from _after_failure(s, st, first_error, st.permit)
        yield Sleep(failure)
    if straight(s):  # each attempt one step: the one the policy makes first without a plan
        attempt = Call(attempts.straight, (st,), attempts.astraight)
        while True:
            try:
                return (yield attempt)
            except Exception as exc:
                failure = yield from _after_failure(s, st, exc, st.permit)
            yield Sleep(failure)
    breaker, limiter, budget = s.breaker, s.limiter, s.budget
    while True:
        permit = NO_PERMIT
        try:
            timeout = attempt_timeout(s, st)
            if breaker is not None:  # first: a caller it refuses never asks the limiter
                permit = yield Call(breaker._acquire, (), breaker._aacquire)
            # a probe is paced by the breaker (one at a time), not queued behind the limiter;
            # the stores are imported only by a policy with a limiter (not by import tether)
            if limiter is not None and permit != _probe():
                while not (yield from _admission(s, st)):
                    # turned away: the breaker may have opened meanwhile, and a caller must
                    # not go out later on a permit of before the trip (nor queue for it)
                    if breaker is not None:
                        permit = NO_PERMIT  # a call's permit needs no giving back
                        permit = yield Call(breaker._acquire, (), breaker._aacquire)
                        if permit == _probe():
                            break
            result = yield Call(attempts.one, (timeout, st.attempt), attempts.aone)
        except Exception as exc:
            wait = yield from _after_failure(s, st, exc, permit)
        else:
            if breaker is not None:
                yield Call(breaker._record, (permit, None), breaker._arecord)
            if limiter is not None:
                yield Call(limiter.record, (None,), limiter.arecord)
            if budget is not None:
                yield Call(budget.on_success, (), budget.aon_success)
            return result
        yield Sleep(wait)


def straight(s: Settings) -> bool:
    """Whether a call's first attempt can be made straight by its driver, without the
    plan (:func:`tether.retries._drive.straight_attempt`): no limiter to ask, no budget to
    refund; a breaker's permit is taken before it and its success recorded after it, as
    the plan would. A failure goes on in the plan (``attempt_plan(first_error=...)``)."""
    return s.limiter is None and s.budget is None


def attempt_timeout(s: Settings, st: CallState) -> float | None:
    """Count the attempt and work out its timeout; raises past the deadline."""
    st.attempt += 1
    if st.deadline_at is None:
        return s.attempt_timeout
    left = st.deadline_at - s.clock.now()
    if left <= 0:
        raise DeadlineExceeded(f"{s.name}: the call's deadline has passed")
    return left if s.attempt_timeout is None else min(s.attempt_timeout, left)


def _admission(s: Settings, st: CallState) -> Plan[bool]:
    """Ask the limiter once and wait for its answer: True once admitted (after the wait for
    the slot), False after the wait a refusal asks for (with jitter: ask again then);
    raises past the deadline."""
    assert s.limiter is not None
    limiter = s.limiter
    wait, admitted = yield Call(limiter.try_acquire, (), limiter.atry_acquire)
    if not admitted:  # spread the callers that were turned away
        wait += s.rng.uniform(0.0, min(wait, 1.0) + 0.05)
    if st.deadline_at is not None and s.clock.now() + wait >= st.deadline_at:
        raise LimiterTimeout(limiter.name, wait)
    st.total_wait += wait
    if wait > 0:
        yield Sleep(wait)
    return bool(admitted)


def _after_failure(s: Settings, st: CallState, exc: Exception, permit: object) -> Plan[float]:
    """What follows a failed attempt: the wait before the next one, or raise."""
    if isinstance(exc, CircuitOpenError | LimiterTimeout) and permit is NO_PERMIT:
        # a breaker or limiter refused (ours, or one inside the function): it says when to
        # come back, so the caller hears it at once, from the first attempt as from any other
        raise exc
    verdict = s.classifier(exc)
    st.verdict = verdict
    breaker, limiter = s.breaker, s.limiter
    if breaker is not None and permit is not NO_PERMIT:
        yield Call(breaker._record, (permit, verdict), breaker._arecord)
    if limiter is not None:
        yield Call(limiter.record, (verdict,), limiter.arecord)
    if not verdict.retryable or st.attempt >= s.max_attempts:
        raise exc
    if s.breaker is not None:
        refusal = s.breaker._refusal()
        if refusal is not None:
            raise refusal from exc
    if st.waits is None:
        st.waits = Waits(s)
    delay = st.waits.next(verdict)
    now = s.clock.now()
    if st.deadline_at is not None and now + delay >= st.deadline_at:
        raise DeadlineExceeded(
            f"{s.name}: the next attempt would start after the deadline "
            f"(attempt {st.attempt} failed: {verdict.reason})"
        ) from exc
    budget = s.budget
    if budget is not None and not (yield Call(_spend, (budget, bool(verdict.timeout)), _aspend)):
        raise exc
    event = RetryEvent(st.name or s.name, st.attempt, verdict, delay, exc, now - st.start)
    emit_retry(event)
    safe_call(s.on_retry, event)
    st.total_wait += delay
    return delay


def _spend(budget: RetryBudget, timeout: bool) -> bool:
    return budget.try_spend(timeout=timeout)


async def _aspend(budget: RetryBudget, timeout: bool) -> bool:
    return await budget.atry_spend(timeout=timeout)
