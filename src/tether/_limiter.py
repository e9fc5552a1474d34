"""The adaptive limiter: how much a recovering dependency can take, shared by a fleet."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether._classify import Kind, Verdict
from tether.clock import Clock, system_clock
from tether.stores._logic import LimiterConfig
from tether.stores._memory import default_store

if TYPE_CHECKING:
    from tether.stores._base import Store

__all__ = ["AdaptiveLimiter"]


class AdaptiveLimiter:
    """A fleet-wide admission rate per dependency: slow start, AIMD, a floor of probes.

    Backoff and jitter spread one client's retries; they do not tell a thousand
    clients how much a recovering dependency can take. The limiter keeps one rate
    (calls per second) per name in ``store``; every call, first attempt or retry,
    takes a token first and waits for one when there is none.

    * Success: in slow start the rate grows by one per success (doubling about every
      0.7 s of full admission) up to the slow-start threshold, then by
      ``increase`` times the rate per second.
    * Overload (any retryable failure: 429, 5xx, timeouts): the rate is multiplied by
      ``beta``, at most once per ``decrease_interval``, down to ``min_rate``: during an
      outage the fleet sends ``min_rate`` probes per second, no more.
    * An outage (failures with no success since the last decrease) does not lower the
      slow-start threshold, so recovery ramps up exponentially.

    The reference is the AWS SDKs' adaptive retry mode (there per client; here shared
    through the store, so the fleet adapts as one).
    """

    def __init__(
        self,
        name: str,
        store: Store | None = None,
        clock: Clock | None = None,
        *,
        initial_rate: float = 10.0,
        min_rate: float = 1.0,
        max_rate: float = 10_000.0,
        burst: float | None = None,
        beta: float = 0.7,
        increase: float = 0.1,
        decrease_interval: float = 1.0,
    ) -> None:
        if not name:
            raise ValueError("name must be a non-empty string")
        if min_rate <= 0:
            raise ValueError(f"min_rate must be > 0, got {min_rate!r}")
        if max_rate < min_rate:
            raise ValueError(f"max_rate must be >= min_rate ({min_rate!r}), got {max_rate!r}")
        if not min_rate <= initial_rate <= max_rate:
            raise ValueError(
                f"initial_rate must be between min_rate and max_rate, got {initial_rate!r}"
            )
        if not 0.0 < beta < 1.0:
            raise ValueError(f"beta must be in (0, 1), got {beta!r}")
        if increase <= 0:
            raise ValueError(f"increase must be > 0, got {increase!r}")
        if decrease_interval < 0:
            raise ValueError(f"decrease_interval must be >= 0, got {decrease_interval!r}")
        if burst is not None and burst < 1:
            raise ValueError(f"burst must be >= 1, got {burst!r}")
        self.name = name
        self.store: Store = store if store is not None else default_store
        self.clock: Clock = clock or system_clock
        self.config = LimiterConfig(
            initial_rate=float(initial_rate),
            min_rate=float(min_rate),
            max_rate=float(max_rate),
            burst=float(burst) if burst is not None else 1.0,
            beta=float(beta),
            increase=float(increase),
            decrease_interval=float(decrease_interval),
        )
        self.rate = float(initial_rate)

    def __repr__(self) -> str:
        return f"AdaptiveLimiter({self.name!r}, rate={self.rate:.2f}/s)"

    def try_acquire(self) -> float:
        """Take a token: 0.0 when the call may go now, else the seconds to wait first."""
        return self.store.limiter_acquire(self.name, self.clock.wall(), self.config)

    def acquire(self, max_wait: float | None = None) -> float:
        """Wait on the clock until admitted; returns the seconds waited.

        Raises :class:`tether.LimiterTimeout` when admission would take longer than
        ``max_wait``.
        """
        from tether._errors import LimiterTimeout

        waited = 0.0
        while (wait := self.try_acquire()) > 0:
            if max_wait is not None and waited + wait > max_wait:
                raise LimiterTimeout(self.name, waited + wait)
            self.clock.sleep(wait)
            waited += wait
        return waited

    def record(self, verdict: Verdict | None) -> None:
        """Feed back an outcome: None for a success."""
        if verdict is not None and not verdict.retryable:
            if verdict.kind is Kind.PERMANENT:
                ok = True  # the dependency answered: the request was at fault
            else:
                return
        else:
            ok = verdict is None
        self.rate = self.store.limiter_feedback(self.name, self.clock.wall(), ok, self.config)

    def reset(self) -> None:
        self.store.reset(self.name)
