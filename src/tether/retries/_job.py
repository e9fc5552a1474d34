"""A job that must get done: what every queue worker writes around a retry policy.

Call under the policy; when the breaker is open, wait for its next probe (with a little
jitter, so that a fleet does not wake at once); when the call fails after the policy's
own retries, back off at the job level and try again; give up at a deadline. Time is
the policy's clock, so the same code runs on virtual time in tests and the benchmark.
"""

from __future__ import annotations

import random

from tether import backoff
from tether._errors import CircuitOpenError, DeadlineExceeded, LimiterTimeout
from tether.classification._classify import classify
from tether.clock import Clock

__all__ = ["JOB_CAP", "Job"]

#: The longest job-level wait after a failure (the default of ``job_cap``): the limiter
#: paces the fleet, so a job waiting longer than this only finishes later.
JOB_CAP = 1.0


class Job:
    """The decisions of one job, shared by the sync and async shells
    (:meth:`tether.RetryPolicy.call_job` and :meth:`~tether.RetryPolicy.acall_job`)."""

    def __init__(
        self, clock: Clock, base: float, seed: float, give_up_after: float | None, job_cap: float
    ) -> None:
        if give_up_after is not None and not give_up_after > 0:
            raise ValueError(f"give_up_after must be > 0 or None, got {give_up_after!r}")
        if not job_cap > 0:
            raise ValueError(f"job_cap must be > 0, got {job_cap!r}")
        self.clock = clock
        self.base = base
        self.start = clock.now()
        self.give_up_after = give_up_after
        self.job_cap = job_cap
        self.failures = 0
        self.rng = random.Random(seed)

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
            wait = backoff.full_jitter(self.failures - 1, self.base, self.job_cap, self.rng)
        if (
            self.give_up_after is not None
            and self.clock.now() + wait - self.start > self.give_up_after
        ):
            raise exc
        return wait
