"""The retry budget: a token bucket that stops a fleet from turning an outage into a storm."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from tether.stores._base import async_ops, bind_name
from tether.stores._logic import BudgetConfig
from tether.stores._memory import default_store
from tether.telemetry._emit import logger

if TYPE_CHECKING:
    from tether.stores._base import Store

__all__ = ["RetryBudget"]


class _Unnamed(str):
    """The default name: it reads "default", and stands for a budget nobody named."""

    __slots__ = ()


#: A budget left unnamed has a pot of its own; a budget shared (by objects, by processes
#: on one RedisStore) is one given a name.
UNNAMED = _Unnamed("default")


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

    Budgets with one name in one store are one budget (a fleet on one
    :class:`~tether.stores.RedisStore` shares it); a budget made with a name the store holds
    with other settings is refused (ValueError naming both). A budget left unnamed has a
    pot of its own: two unnamed budgets never share one.
    """

    def __init__(
        self,
        name: str = UNNAMED,
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
        if not name or not isinstance(name, str):
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        # an unnamed budget's pot is its own (its name says so in logs and in the store)
        self.name = f"unnamed-{os.urandom(16).hex()[:12]}" if name is UNNAMED else str(name)
        self.capacity = float(capacity)
        self.retry_cost = float(retry_cost)
        self.timeout_cost = float(timeout_cost)
        self.refund = float(refund)
        self.config = BudgetConfig(self.capacity, self.retry_cost, self.timeout_cost, self.refund)
        self.store: Store = store if store is not None else default_store
        bind_name(self.store, "budget", self.name, self.config)
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
        """Refill this budget (forget its state)."""
        self.store.reset(self.name)
        bind_name(self.store, "budget", self.name, self.config)
