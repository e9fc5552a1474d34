"""Guard state shared by a fleet through Redis.

Every transition runs as one Lua script on the server (atomic, one round trip). The
scripts (:mod:`._scripts`) are translations of :mod:`tether.stores._logic`, with its
constants substituted; the same table tests run against both stores.

:class:`RedisStore` is a front over its parts, each in a module of its own:

* :mod:`._connection`: the clients, the registered scripts, the drivers of the parts'
  plans (sync and asyncio) and the fallback to this process's memory;
* :mod:`._breaker`: the breakers, with the local cache that keeps a healthy call off
  the network (see its docstring for the round trips);
* :mod:`._budget`: the retry budgets;
* :mod:`._limiter`: the adaptive limiters, whose successes travel with the next
  admission request.

When Redis cannot be reached the store falls back to this process's memory, logs
one warning, tries Redis again every ``reconnect_interval`` seconds and goes back to
it (with another log line) once it answers: an outage of Redis never takes the
agent down, it only makes the guards local for a while.
"""

from __future__ import annotations

from collections import Counter
from contextlib import AbstractContextManager
from typing import Any

from tether._errors import require
from tether.stores._logic import BreakerConfig, LimiterConfig
from tether.stores._memory import MemoryStore
from tether.stores.redis._breaker import Breakers
from tether.stores.redis._budget import Budgets
from tether.stores.redis._connection import Connection
from tether.stores.redis._limiter import Limiters
from tether.stores.redis._scopes import Scopes
from tether.stores.redis._tokens import Tokens

__all__ = ["RedisStore"]

#: the kinds of state a store keeps per name (``reset(name)`` deletes each)
KINDS = ("breaker", "budget", "limiter")


class RedisStore(AbstractContextManager["RedisStore"]):
    """Breaker, budget and limiter state in Redis, shared by every process using it.

    >>> store = RedisStore("redis://127.0.0.1:6379/0")  # doctest: +SKIP
    >>> breaker = tether.CircuitBreaker("payments", store=store)  # doctest: +SKIP
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "tether",
        key_ttl: float = 86_400.0,
        cache_ttl: float = 1.0,
        reconnect_interval: float = 1.0,
        socket_timeout: float = 0.5,
        client: Any = None,
        aclient: Any = None,
        server_time: bool = True,
    ) -> None:
        if cache_ttl < 0:
            raise ValueError(f"cache_ttl must be >= 0, got {cache_ttl!r}")
        if key_ttl <= 0:
            raise ValueError(f"key_ttl must be > 0, got {key_ttl!r}")
        redis = require("redis", "redis")
        self.cache_ttl = float(cache_ttl)
        # every Redis error means the store is unavailable: a refused connection, but
        # also an error reply (OOM, READONLY, NOSCRIPT after a flush, ACL refusals)
        self._errors: tuple[type[BaseException], ...] = (
            redis.RedisError,  # type: ignore[attr-defined]
            OSError,
        )
        #: breakers measure their cooldowns on the Redis server's clock (``TIME``), so that a
        #: process whose clock runs ahead or behind cannot probe early or late; ``False``
        #: measures on the callers' clocks (a VirtualClock in tests)
        self.server_time = server_time
        self._conn = Connection(
            url,
            prefix=prefix,
            key_ttl=key_ttl,
            reconnect_interval=reconnect_interval,
            socket_timeout=socket_timeout,
            client=client,
            aclient=aclient,
            server_time=server_time,
            errors=self._errors,
        )
        #: the Redis URL, without its password (or the client's repr, when given one)
        self.url: str = self._conn.url
        self.prefix = prefix
        self.reconnect_interval = self._conn.reconnect_interval
        self.client: Any = self._conn.client  # the sync Redis client
        #: where the state lives while Redis is unreachable: this process's memory
        self.fallback: MemoryStore = self._conn.fallback
        self.scripts_run: Counter[str] = self._conn.scripts_run  # round trips by script
        self._breakers = Breakers(self._conn, self.cache_ttl)
        self._budgets = Budgets(self._conn, self.cache_ttl)
        self._limiters = Limiters(self._conn)
        self._tokens = Tokens(self._conn)
        self._scopes = Scopes(self._conn)

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r})"

    # --- the connection's state, as the store's -------------------------------------------

    @property
    def round_trips(self) -> int:
        """Round trips to Redis made so far (scripts and reads)."""
        return self._conn.round_trips

    @property
    def degraded(self) -> bool:
        """True while Redis is unreachable and the local fallback is in use."""
        return self._conn.degraded

    def _key(self, kind: str, name: str) -> str:
        return self._conn.key(kind, name)

    def bind(self, kind: str, name: str, config: str) -> str | None:
        """Keep ``config`` beside the state of ``kind:name`` if it has none; the other one if
        it differs (this process's memory while Redis is unreachable)."""
        return self._conn.bind(kind, name, config)

    # --- breaker ----------------------------------------------------------------------------

    def breaker_acquire(
        self, name: str, now: float, cfg: BreakerConfig
    ) -> tuple[str, str, float, str]:
        return self._breakers.acquire(name, now, cfg)

    async def abreaker_acquire(
        self, name: str, now: float, cfg: BreakerConfig
    ) -> tuple[str, str, float, str]:
        """Like :meth:`breaker_acquire`; when the cache cannot answer, one task of this
        process asks Redis and the others waiting on the same breaker use its answer."""
        return await self._breakers.aacquire(name, now, cfg)

    def breaker_record(
        self, name: str, now: float, permit: str, failed: bool, cfg: BreakerConfig
    ) -> tuple[str, str, float]:
        return self._breakers.record(name, now, permit, failed, cfg)

    async def abreaker_record(
        self, name: str, now: float, permit: str, failed: bool, cfg: BreakerConfig
    ) -> tuple[str, str, float]:
        return await self._breakers.arecord(name, now, permit, failed, cfg)

    def breaker_state(self, name: str, now: float) -> tuple[str, float]:
        return self._breakers.state(name, now)

    def breaker_names(self, limit: int = 1000) -> list[str]:
        """The names of the breakers this store holds state for."""
        return self._breakers.names(limit)

    def breaker_force(self, name: str, state: str, seconds: float = 0.0) -> None:
        """Open a breaker for ``seconds`` (an operator's decision: the dependency is down),
        or close it; every process sees it at its next read (its cache is one ``cache_ttl``)."""
        self._breakers.force(name, state, seconds)

    # --- budget -----------------------------------------------------------------------------

    def budget_spend(self, name: str, capacity: float, cost: float) -> tuple[bool, float]:
        return self._budgets.spend(name, capacity, cost)

    async def abudget_spend(self, name: str, capacity: float, cost: float) -> tuple[bool, float]:
        return await self._budgets.aspend(name, capacity, cost)

    def budget_refund(self, name: str, capacity: float, amount: float) -> float:
        return self._budgets.refund(name, capacity, amount)

    async def abudget_refund(self, name: str, capacity: float, amount: float) -> float:
        return await self._budgets.arefund(name, capacity, amount)

    def budget_tokens(self, name: str, capacity: float) -> float:
        return self._budgets.tokens(name, capacity)

    # --- limiter ----------------------------------------------------------------------------

    def limiter_acquire(self, name: str, now: float, cfg: LimiterConfig) -> tuple[float, bool]:
        return self._limiters.acquire(name, now, cfg)

    async def alimiter_acquire(
        self, name: str, now: float, cfg: LimiterConfig
    ) -> tuple[float, bool]:
        """Like :meth:`limiter_acquire`; the tasks of this process ask one at a time, so
        that one refusal closes the gate for all of them (as the sync client does)."""
        return await self._limiters.aacquire(name, now, cfg)

    def limiter_feedback(self, name: str, now: float, outcome: str, cfg: LimiterConfig) -> float:
        return self._limiters.feedback(name, now, outcome, cfg)

    async def alimiter_feedback(
        self, name: str, now: float, outcome: str, cfg: LimiterConfig
    ) -> float:
        return await self._limiters.afeedback(name, now, outcome, cfg)

    # --- lifecycle --------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the asyncio client of the running event loop (and the sync one)."""
        await self._conn.aclose()

    def close(self) -> None:
        """Close the connections to Redis."""
        self._conn.close()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tokens(self) -> Tokens:
        """The token budgets' operations (:class:`tether.TokenBudget`)."""
        return self._tokens

    def scopes(self) -> Scopes:
        """The budget scopes' operations (:class:`tether.BudgetScopes`)."""
        return self._scopes

    def reset(self, name: str | None = None) -> None:
        """Delete the shared state of one name, or every key under this prefix."""
        self._breakers.cache.clear()
        self._budgets.full.clear()
        self._limiters.pending_ok.clear()
        self._limiters.rate.clear()
        self._limiters.gate.clear()
        self.fallback.reset(name)
        self._conn.delete(name, KINDS)
        self._tokens.reset(name)
        if name is None:
            self._scopes.reset()
