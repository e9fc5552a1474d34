"""The adaptive limiter: how much a recovering dependency can take, shared by a fleet."""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from tether._errors import LimiterTimeout
from tether.classification._classify import Kind, Verdict
from tether.clock import Clock, system_clock
from tether.stores._base import async_ops, bind_name
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
    * Throttling (429, 529) multiplies the rate by ``beta``, at most once per
      ``decrease_interval``; so does an outage (nine failures in ten or worse), down to
      ``min_rate``: during an outage the fleet sends ``min_rate`` probes per second.
      Scattered failures (a brownout) do not starve the dependency of calls.
    * An outage (failures with no success since the last decrease) does not lower the
      slow-start threshold, so recovery ramps up exponentially.

    The reference is the AWS SDKs' adaptive retry mode (there per client; here shared
    through the store, so the fleet adapts as one). A limiter made with a name the store
    holds with other settings is refused (ValueError naming both).
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
        horizon: float = 0.5,
        beta: float = 0.7,
        increase: float = 0.1,
        decrease_interval: float = 1.0,
    ) -> None:
        if not name or not isinstance(name, str):
            raise ValueError(f"name must be a non-empty string, got {name!r}")
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
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon!r}")
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
            horizon=float(horizon),
            beta=float(beta),
            increase=float(increase),
            decrease_interval=float(decrease_interval),
        )
        self.rate = float(initial_rate)
        bind_name(self.store, "limiter", name, self.config)

    def __repr__(self) -> str:
        return f"AdaptiveLimiter({self.name!r}, rate={self.rate:.2f}/s)"

    def try_acquire(self) -> tuple[float, bool]:
        """Reserve a slot: ``(wait, True)`` to go after ``wait`` seconds, or
        ``(wait, False)`` to ask again after ``wait`` seconds (the queue is full)."""
        return self.store.limiter_acquire(self.name, self.clock.wall(), self.config)

    def acquire(self, max_wait: float | None = None) -> float:
        """Wait on the clock until admitted; returns the seconds waited.

        Raises :class:`tether.LimiterTimeout` when admission would take longer than
        ``max_wait``.
        """
        plan, answer = self._admission(max_wait), None
        try:
            while True:
                wait = plan.send(answer)
                if wait is None:
                    answer = self.try_acquire()
                else:
                    self.clock.sleep(wait)
                    answer = None
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def aacquire(self, max_wait: float | None = None) -> float:
        """The async form of :meth:`acquire` (the same decisions, waits on the event loop)."""
        plan, answer = self._admission(max_wait), None
        try:
            while True:
                wait = plan.send(answer)
                if wait is None:
                    answer = await self.atry_acquire()
                else:
                    await self.clock.asleep(wait)
                    answer = None
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def _admission(self, max_wait: float | None) -> Generator[float | None, Any, float]:
        """The decisions of :meth:`acquire`: yields None to ask the store, a wait to sleep."""
        waited = 0.0
        while True:
            wait, admitted = yield None
            if max_wait is not None and waited + wait > max_wait:
                raise LimiterTimeout(self.name, waited + wait)
            if wait > 0:
                yield wait
                waited += wait
            if admitted:
                return waited

    async def atry_acquire(self) -> tuple[float, bool]:
        """The async form of :meth:`try_acquire`."""
        ops = async_ops(self.store)
        answer: tuple[float, bool] = await ops.alimiter_acquire(
            self.name, self.clock.wall(), self.config
        )
        return answer

    def record(self, verdict: Verdict | None) -> None:
        """Feed back an outcome: None for a success (a local verdict is not the dependency's:
        it is not fed back)."""
        if verdict is not None and verdict.local:
            return
        self.rate = self.store.limiter_feedback(
            self.name, self.clock.wall(), _outcome(verdict), self.config
        )

    async def arecord(self, verdict: Verdict | None) -> None:
        """The async form of :meth:`record`."""
        if verdict is not None and verdict.local:
            return
        ops = async_ops(self.store)
        self.rate = await ops.alimiter_feedback(
            self.name, self.clock.wall(), _outcome(verdict), self.config
        )

    def reset(self) -> None:
        """Forget this limiter's state (back to its initial rate)."""
        self.store.reset(self.name)
        bind_name(self.store, "limiter", self.name, self.config)


def _outcome(verdict: Verdict | None) -> str:
    if verdict is None or verdict.kind in (Kind.PERMANENT, Kind.QUOTA):
        return "ok"  # the dependency answered; the request or the account was at fault
    if verdict.kind is Kind.RATE_LIMITED or verdict.status in (429, 529):
        return "throttled"
    return "failed"
