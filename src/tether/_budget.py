"""The retry budget: a token bucket that stops a fleet from turning an outage into a storm."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether._telemetry_hooks import logger
from tether.stores._base import async_ops
from tether.stores._memory import default_store

if TYPE_CHECKING:
    from tether.stores._base import Store

__all__ = ["RetryBudget"]


class RetryBudget:
    """Retries spend tokens, successes refund them; first attempts are always allowed.

    In the style of the AWS SDKs' standard retry mode: the bucket starts full at
    ``capacity``; a retry costs ``retry_cost`` (``timeout_cost`` after a timeout); each
    success refunds ``refund``. When the bucket cannot pay for a retry, the retry is
    refused and the caller gets the last error: during an outage the whole fleet
    stops retrying after ``capacity / retry_cost`` retries, while first attempts go on.

    >>> budget = RetryBudget(capacity=10, retry_cost=5)
    >>> budget.try_spend(), budget.try_spend(), budget.try_spend()
    (True, True, False)
    >>> budget.on_success(); budget.tokens
    1.0
    """

    def __init__(
        self,
        name: str = "default",
        capacity: float = 500,
        retry_cost: float = 5,
        timeout_cost: float = 10,
        refund: float = 1,
        store: Store | None = None,
    ) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be > 0, got {capacity!r}")
        for field, value in (("retry_cost", retry_cost), ("timeout_cost", timeout_cost)):
            if value <= 0:
                raise ValueError(f"{field} must be > 0, got {value!r}")
            if value > capacity:
                raise ValueError(f"{field} must be <= capacity ({capacity!r}), got {value!r}")
        if refund < 0:
            raise ValueError(f"refund must be >= 0, got {refund!r}")
        self.name = name
        self.capacity = float(capacity)
        self.retry_cost = float(retry_cost)
        self.timeout_cost = float(timeout_cost)
        self.refund = float(refund)
        self.store: Store = store if store is not None else default_store
        self.refused = 0

    def __repr__(self) -> str:
        return f"RetryBudget({self.name!r}, tokens={self.tokens:g}/{self.capacity:g})"

    @property
    def tokens(self) -> float:
        return self.store.budget_tokens(self.name, self.capacity)

    def try_spend(self, *, timeout: bool = False) -> bool:
        """Pay for one retry; False (and nothing spent) when the budget cannot."""
        cost = self.timeout_cost if timeout else self.retry_cost
        return self._spent(cost, *self.store.budget_spend(self.name, self.capacity, cost))

    async def atry_spend(self, *, timeout: bool = False) -> bool:
        """The async form of :meth:`try_spend`."""
        cost = self.timeout_cost if timeout else self.retry_cost
        answer = await async_ops(self.store).abudget_spend(self.name, self.capacity, cost)
        return self._spent(cost, *answer)

    def _spent(self, cost: float, ok: bool, left: float) -> bool:
        if not ok:
            self.refused += 1
            if self.refused == 1 or self.refused % 100 == 0:
                logger.warning(
                    "retry budget %s is spent (%.0f tokens left, a retry costs %.0f): "
                    "retries refused, %d so far",
                    self.name,
                    left,
                    cost,
                    self.refused,
                )
        return ok

    def on_success(self) -> None:
        """Refund a success."""
        if self.refund:
            self.store.budget_refund(self.name, self.capacity, self.refund)

    async def aon_success(self) -> None:
        """The async form of :meth:`on_success`."""
        if self.refund:
            await async_ops(self.store).abudget_refund(self.name, self.capacity, self.refund)

    def reset(self) -> None:
        self.store.reset(self.name)
