"""The retry budgets of the Redis store: a token bucket per name, spent and refunded by
one script each. A refund to a full bucket is skipped for ``cache_ttl`` seconds after
Redis said it was full (the healthy path: every success refunds)."""

from __future__ import annotations

from tether.clock import system_clock
from tether.stores.redis._connection import Connection, Plan, text

__all__ = ["Budgets"]


class Budgets:
    """The budget operations of a :class:`~tether.stores.RedisStore`."""

    def __init__(self, conn: Connection, cache_ttl: float) -> None:
        self.conn = conn
        self.cache_ttl = cache_ttl
        self.full: dict[str, float] = {}  # name -> when Redis said its bucket was full

    def _p_spend(self, name: str, capacity: float, cost: float) -> Plan[tuple[bool, float]]:
        conn = self.conn
        self.full.pop(name, None)
        r = yield ("budget_spend", conn.key("budget", name), [capacity, cost, conn.ttl_ms])
        if r is None:
            return conn.fallback.budget_spend(name, capacity, cost)
        return bool(int(r[0])), float(text(r[1]))

    def spend(self, name: str, capacity: float, cost: float) -> tuple[bool, float]:
        return self.conn.drive(self._p_spend(name, capacity, cost))

    async def aspend(self, name: str, capacity: float, cost: float) -> tuple[bool, float]:
        return await self.conn.adrive(self._p_spend(name, capacity, cost))

    def _p_refund(self, name: str, capacity: float, amount: float) -> Plan[float]:
        conn = self.conn
        full_at = self.full.get(name)
        if full_at is not None and system_clock.now() - full_at < max(self.cache_ttl, 0.0):
            return float(capacity)
        r = yield ("budget_refund", conn.key("budget", name), [capacity, amount, conn.ttl_ms])
        if r is None:
            return conn.fallback.budget_refund(name, capacity, amount)
        tokens = float(text(r))
        if tokens >= capacity:
            self.full[name] = system_clock.now()
        return tokens

    def refund(self, name: str, capacity: float, amount: float) -> float:
        return self.conn.drive(self._p_refund(name, capacity, amount))

    async def arefund(self, name: str, capacity: float, amount: float) -> float:
        return await self.conn.adrive(self._p_refund(name, capacity, amount))

    def tokens(self, name: str, capacity: float) -> float:
        conn = self.conn
        try:
            conn.round_trips += 1
            raw = conn.client.hget(conn.key("budget", name), "tokens")
        except conn.errors:
            return conn.fallback.budget_tokens(name, capacity)
        return float(text(raw)) if raw is not None else float(capacity)
