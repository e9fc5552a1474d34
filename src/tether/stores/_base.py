"""What a store of fleet-guard state provides."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from tether.stores._logic import BreakerConfig, BudgetConfig, LimiterConfig, config_text

__all__ = ["Store", "async_ops", "bind_name"]


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


def bind_name(
    store: Store, kind: str, name: str, cfg: BreakerConfig | BudgetConfig | LimiterConfig
) -> None:
    """Claim ``name`` in ``store`` for an object of this configuration: the first object
    stores its configuration beside the state, later ones must agree with it.

    Raises ValueError naming both configurations when they differ. A store without
    ``bind`` (one written before names were checked) accepts every object.
    """
    bind = getattr(store, "bind", None)
    if bind is None:
        return
    wanted = config_text(cfg)
    known = bind(kind, name, wanted)
    if known is not None:
        what = {"breaker": "circuit breaker", "budget": "retry budget"}.get(kind, kind)
        raise ValueError(
            f"a {what} named {name!r} already exists in {store!r} with {known}; this one asks "
            f"{wanted}. One name is one {what}, shared by every object and process that uses "
            f"this store: give this one another name, or the same settings (or forget the old "
            f"one's state first: store.reset({name!r}))"
        )


class _Awaitable:
    """A store without async operations (state in memory: nothing to wait for), seen
    through the async interface that ``RetryPolicy.acall`` uses."""

    __slots__ = ("store",)

    def __init__(self, store: Store) -> None:
        self.store = store

    async def abreaker_acquire(
        self, name: str, now: float, cfg: BreakerConfig
    ) -> tuple[str, str, float, str]:
        return self.store.breaker_acquire(name, now, cfg)

    async def abreaker_record(
        self, name: str, now: float, permit: str, failed: bool, cfg: BreakerConfig
    ) -> tuple[str, str, float]:
        return self.store.breaker_record(name, now, permit, failed, cfg)

    async def abudget_spend(self, name: str, capacity: float, cost: float) -> tuple[bool, float]:
        return self.store.budget_spend(name, capacity, cost)

    async def abudget_refund(self, name: str, capacity: float, amount: float) -> float:
        return self.store.budget_refund(name, capacity, amount)

    async def alimiter_acquire(
        self, name: str, now: float, cfg: LimiterConfig
    ) -> tuple[float, bool]:
        return self.store.limiter_acquire(name, now, cfg)

    async def alimiter_feedback(
        self, name: str, now: float, outcome: str, cfg: LimiterConfig
    ) -> float:
        return self.store.limiter_feedback(name, now, outcome, cfg)


def async_ops(store: Store) -> Any:
    """The store's async operations: its own (``RedisStore`` on ``redis.asyncio``), or its
    sync ones for a store whose state is in memory."""
    return store if hasattr(store, "abreaker_acquire") else _Awaitable(store)


#: URL schemes that name a Redis Cluster: ``redis+cluster://host:port`` (any node will do).
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")


def redis_client(url: str, *, asyncio: bool = False, **settings: Any) -> Any:
    """A Redis client for ``url``: a ``RedisCluster`` for ``redis+cluster://`` (or
    ``rediss+cluster://``), else a ``Redis``; ``asyncio`` gives the ``redis.asyncio`` twin."""
    from tether._errors import require

    module: Any = require("redis.asyncio" if asyncio else "redis", "redis")
    if url.startswith(CLUSTER_SCHEMES):
        cluster: Any = require("redis.asyncio.cluster" if asyncio else "redis.cluster", "redis")
        settings.pop("health_check_interval", None)
        return cluster.RedisCluster.from_url(url.replace("+cluster", "", 1), **settings)
    return module.Redis.from_url(url, **settings)
