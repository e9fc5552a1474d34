"""The attempt loop's decisions, without I/O: what to do next, and why.

One call under a retry policy is a plan: a generator that yields the steps it needs
(:class:`Op`: take a breaker permit, ask the limiter, make the attempt, sleep, record an
outcome, spend the budget) and gets each step's answer back (or its exception thrown
in). It returns the attempt's result, or raises the error the caller gets: the last
error itself, :class:`tether.DeadlineExceeded`, or a guard's refusal.

The sync and the async driver (:mod:`tether.retries._drive`) run the same plan, the
sync one with the guards' sync methods and the clock's ``sleep``, the async one with
their async twins and ``asleep``, so the two cannot drift. This module imports nothing
else of the retries package.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from tether import backoff
from tether._errors import CircuitOpenError, DeadlineExceeded, LimiterTimeout
from tether.classification._classify import Kind, Verdict
from tether.telemetry._emit import emit_retry, safe_call
from tether.telemetry._events import RetryEvent, RetryHook

if TYPE_CHECKING:
    from tether.clock import Clock
    from tether.guards._breaker import CircuitBreaker
    from tether.guards._budget import RetryBudget
    from tether.guards._limiter import AdaptiveLimiter

__all__ = [
    "CallState",
    "Jitter",
    "Op",
    "Plan",
    "Settings",
    "Step",
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


class Op(enum.Enum):
    """A step the plan asks its driver for."""

    ACQUIRE = "acquire"  # a breaker permit; raises CircuitOpenError
    ADMIT = "admit"  # the limiter's answer: (wait, admitted)
    ATTEMPT = "attempt"  # call the function once, within ``timeout``
    SLEEP = "sleep"  # wait ``seconds`` on the clock
    RECORD = "record"  # the breaker learns an outcome (permit, verdict or None)
    FEEDBACK = "feedback"  # the limiter learns an outcome (verdict or None)
    SPEND = "spend"  # the budget pays for a retry (timeout: bool) -> bool
    REFUND = "refund"  # the budget is refunded a success


class Step(NamedTuple):
    op: Op
    arg: Any = None
    verdict: Verdict | None = None
    attempt: int = 0


#: a plan: yields steps, gets their answers, returns the result
Plan = Generator[Step, Any, Any]


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

    __slots__ = ("attempt", "deadline_at", "name", "start", "total_wait", "verdict", "waits")

    def __init__(self, settings: Settings, name: str, deadline: float | None) -> None:
        self.name = name
        self.attempt = 0
        self.start = settings.clock.now()
        self.deadline_at = None if deadline is None else self.start + deadline
        self.waits: Waits | None = None  # made at the first failure: most calls succeed
        self.total_wait = 0.0
        self.verdict: Verdict | None = None


class _Permit:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: no breaker, or the breaker refused before calling
NO_PERMIT: Any = _Permit("NO_PERMIT")


def _probe() -> str:
    """The breaker's half-open permit (``Permit.PROBE``)."""
    from tether.stores._logic import PROBE

    return PROBE


def attempt_plan(
    s: Settings, st: CallState, first_error: Exception | None = None, permit: object = NO_PERMIT
) -> Plan:
    """The attempt loop; ``first_error``: the first attempt was made already (under the
    breaker's ``permit``, if it took one) and failed."""
    if first_error is not None:
        st.attempt = 1
        failure = yield from _after_failure(s, st, first_error, permit)
        yield Step(Op.SLEEP, failure)
    while True:
        permit = NO_PERMIT
        try:
            timeout = attempt_timeout(s, st)
            if s.breaker is not None:  # first: a caller it refuses never asks the limiter
                permit = yield Step(Op.ACQUIRE)
            # a probe is paced by the breaker (one at a time), not queued behind the limiter;
            # the stores are imported only by a policy with a limiter (not by import tether)
            if s.limiter is not None and permit != _probe():
                while not (yield from _admission(s, st)):
                    # turned away: the breaker may have opened meanwhile, and a caller must
                    # not go out later on a permit of before the trip (nor queue for it)
                    if s.breaker is not None:
                        permit = NO_PERMIT  # a call's permit needs no giving back
                        permit = yield Step(Op.ACQUIRE)
                        if permit == _probe():
                            break
            result = yield Step(Op.ATTEMPT, timeout, None, st.attempt)
        except Exception as exc:
            wait = yield from _after_failure(s, st, exc, permit)
        else:
            if s.breaker is not None:
                yield Step(Op.RECORD, permit)
            if s.limiter is not None:
                yield Step(Op.FEEDBACK)
            if s.budget is not None:
                yield Step(Op.REFUND)
            return result
        yield Step(Op.SLEEP, wait)


def straight(s: Settings) -> bool:
    """Whether a call's first attempt can be made straight by its driver, without the
    plan (:func:`tether.retries._drive.first_attempt`): no limiter to ask, no budget to
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


def _admission(s: Settings, st: CallState) -> Generator[Step, Any, bool]:
    """Ask the limiter once and wait for its answer: True once admitted (after the wait for
    the slot), False after the wait a refusal asks for (with jitter: ask again then);
    raises past the deadline."""
    assert s.limiter is not None
    wait, admitted = yield Step(Op.ADMIT)
    if not admitted:  # spread the callers that were turned away
        wait += s.rng.uniform(0.0, min(wait, 1.0) + 0.05)
    if st.deadline_at is not None and s.clock.now() + wait >= st.deadline_at:
        raise LimiterTimeout(s.limiter.name, wait)
    st.total_wait += wait
    if wait > 0:
        yield Step(Op.SLEEP, wait)
    return bool(admitted)


def _after_failure(
    s: Settings, st: CallState, exc: Exception, permit: object
) -> Generator[Step, Any, float]:
    """What follows a failed attempt: the wait before the next one, or raise."""
    if isinstance(exc, CircuitOpenError | LimiterTimeout) and permit is NO_PERMIT:
        # a breaker or limiter refused (ours, or one inside the function): it says when to
        # come back, so the caller hears it at once, from the first attempt as from any other
        raise exc
    verdict = s.classifier(exc)
    st.verdict = verdict
    if s.breaker is not None and permit is not NO_PERMIT:
        yield Step(Op.RECORD, permit, verdict)
    if s.limiter is not None:
        yield Step(Op.FEEDBACK, None, verdict)
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
    if s.budget is not None and not (yield Step(Op.SPEND, verdict.timeout)):
        raise exc
    event = RetryEvent(st.name or s.name, st.attempt, verdict, delay, exc, now - st.start)
    emit_retry(event)
    safe_call(s.on_retry, event)
    st.total_wait += delay
    return delay
