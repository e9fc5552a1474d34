"""What a store of fleet-guard state provides."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from tether.stores._logic import BreakerConfig, LimiterConfig

__all__ = ["Store"]


@runtime_checkable
class Store(Protocol):
    """Atomic operations on the state of breakers, budgets and limiters, by name."""

    def breaker_acquire(
        self, name: str, now: float, cfg: BreakerConfig
    ) -> tuple[str, str, float, str]: ...

    def breaker_record(
        self, name: str, now: float, permit: str, failed: bool, cfg: BreakerConfig
    ) -> tuple[str, str, float]: ...

    def breaker_state(self, name: str, now: float) -> tuple[str, float]: ...

    def budget_spend(self, name: str, capacity: float, cost: float) -> tuple[bool, float]: ...

    def budget_refund(self, name: str, capacity: float, amount: float) -> float: ...

    def budget_tokens(self, name: str, capacity: float) -> float: ...

    def limiter_acquire(self, name: str, now: float, cfg: LimiterConfig) -> tuple[float, bool]: ...

    def limiter_feedback(
        self, name: str, now: float, outcome: str, cfg: LimiterConfig
    ) -> float: ...

    def reset(self, name: str | None = None) -> None: ...
