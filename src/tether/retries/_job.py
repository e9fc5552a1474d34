"""A job that must get done: what every queue worker writes around a retry policy.

Call under the policy; when the breaker is open, wait for its next probe (with a little
jitter, so that a fleet does not wake at once); when the call fails after the policy's
own retries, back off at the job level and try again; give up at a deadline. Time is
the policy's clock, so the same code runs on virtual time in tests and the benchmark.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from tether import backoff
from tether._errors import CircuitOpenError, DeadlineExceeded, LimiterTimeout
from tether.classification._classify import classify

if TYPE_CHECKING:
    from tether.retries._policy import RetryPolicy

__all__ = ["acall_job", "call_job"]

T = TypeVar("T")

#: The longest job-level wait after a failure (the default of ``job_cap``): the limiter
#: paces the fleet, so a job waiting longer than this only finishes later.
JOB_CAP = 1.0


class _Job:
    """The decisions of one job, shared by the sync and async shells."""

    def __init__(self, policy: RetryPolicy, give_up_after: float | None, job_cap: float) -> None:
        if give_up_after is not None and not give_up_after > 0:
            raise ValueError(f"give_up_after must be > 0 or None, got {give_up_after!r}")
        if not job_cap > 0:
            raise ValueError(f"job_cap must be > 0, got {job_cap!r}")
        self.policy = policy
        self.clock = policy.clock
        self.start = self.clock.now()
        self.give_up_after = give_up_after
        self.job_cap = job_cap
        self.failures = 0
        self.rng = random.Random(policy._rng.random())

    def wait_after(self, exc: Exception) -> float:
        """How long to wait before the next try; re-raises when the job must give up."""
        if isinstance(exc, CircuitOpenError):
            wait = exc.retry_in + self.rng.uniform(0.0, min(1.0, 0.1 + 0.25 * exc.retry_in))
        elif isinstance(exc, LimiterTimeout):
            wait = exc.wait
        else:
            if not classify(exc).retryable or isinstance(exc, DeadlineExceeded):
                raise exc
            self.failures += 1
            wait = backoff.full_jitter(self.failures - 1, self.policy.base, self.job_cap, self.rng)
        if (
            self.give_up_after is not None
            and self.clock.now() + wait - self.start > self.give_up_after
        ):
            raise exc
        return wait


def call_job(policy: RetryPolicy, fn: Callable[..., T], *args: Any, give_up_after: float | None = None,
             job_cap: float = JOB_CAP, **kwargs: Any) -> T:  # fmt: skip
    """Run ``fn`` under ``policy`` until it succeeds, a permanent failure, or the deadline."""
    job = _Job(policy, give_up_after, job_cap)
    while True:
        try:
            return policy.call(fn, *args, **kwargs)
        except Exception as exc:
            policy.clock.sleep(job.wait_after(exc))


async def acall_job(policy: RetryPolicy, fn: Callable[..., Awaitable[T]], *args: Any,
                    give_up_after: float | None = None, job_cap: float = JOB_CAP, **kwargs: Any) -> T:  # fmt: skip
    """The async form of :func:`call_job`."""
    job = _Job(policy, give_up_after, job_cap)
    while True:
        try:
            return await policy.acall(fn, *args, **kwargs)
        except Exception as exc:
            await policy.clock.asleep(job.wait_after(exc))
