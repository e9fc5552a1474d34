"""The breakers of the Redis store: the scripts' callers, and the local cache of states.

Round trips on the success path of a breaker-guarded call: the state is read from a
local cache refreshed at most every ``cache_ttl`` seconds (default 1 s) and by every
failure this process records, and a success is written only when it changes
something (a failure count to reset, a half-open probe, a failure-rate window). In
a steady healthy state that is no round trip per call and one per ``cache_ttl``. The
cost: after another process opens the breaker this one may keep calling for up to
``cache_ttl`` seconds (its first failure then refreshes the cache at once). Set
``cache_ttl=0`` for an exact view at one round trip per call.
"""

from __future__ import annotations

from typing import Any

from tether.clock import system_clock
from tether.stores._logic import (
    CALL,
    CLOSED,
    DENY,
    HALF_OPEN,
    OPEN,
    BreakerConfig,
    BreakerState,
    Permit,
)
from tether.stores.redis._connection import Connection, Plan, text

__all__ = ["Breakers"]


class Breakers:
    """The breaker operations of a :class:`~tether.stores.RedisStore`."""

    def __init__(self, conn: Connection, cache_ttl: float) -> None:
        self.conn = conn
        self.cache_ttl = cache_ttl
        # name -> (state, retry_at, failures, fetched at, version); see the module docstring
        self.cache: dict[str, tuple[BreakerState, float, int, float, int]] = {}
        self._asking: dict[str, Any] = {}  # name -> future of the task asking Redis

    def _cached_acquire(self, name: str, now: float) -> tuple[str, str, float, str] | None:
        """The answer the cache can give without Redis (the success path), or None."""
        cached = self.cache.get(name)
        if cached is not None:
            state, retry_at = cached[0], cached[1]
            # an open breaker cannot change before its retry_at: no need to ask until then
            if state in (OPEN, HALF_OPEN) and now < retry_at:
                return state, state, retry_at, DENY
            fresh = self.cache_ttl > 0 and system_clock.now() - cached[3] < self.cache_ttl
            if state == CLOSED and fresh:
                return CLOSED, CLOSED, 0.0, CALL
        return None

    def _p_acquire(
        self, name: str, now: float, cfg: BreakerConfig
    ) -> Plan[tuple[str, str, float, str]]:
        cached = self._cached_acquire(name, now)
        if cached is not None:
            return cached
        conn = self.conn
        args = [conn.when(now), cfg.cooldown, cfg.half_open_max_calls, conn.ttl_ms]
        r = yield ("breaker_acquire", conn.key("breaker", name), args)
        if r is None:
            return conn.fallback.breaker_acquire(name, now, cfg)
        old, new, permit = BreakerState(text(r[0])), BreakerState(text(r[1])), Permit(text(r[3]))
        retry_at = conn.caller_time(float(text(r[2])), now, float(text(r[6])))
        old = self._remember(name, old, new, retry_at, int(r[4]), int(r[5]))
        return old, new, retry_at, permit

    def acquire(self, name: str, now: float, cfg: BreakerConfig) -> tuple[str, str, float, str]:
        return self._cached_acquire(name, now) or self.conn.drive(self._p_acquire(name, now, cfg))

    async def aacquire(
        self, name: str, now: float, cfg: BreakerConfig
    ) -> tuple[str, str, float, str]:
        """Like :meth:`acquire`; when the cache cannot answer, one task of this process
        asks Redis and the others waiting on the same breaker use its answer."""
        import asyncio

        plan = self._p_acquire(name, now, cfg)
        try:
            step = next(plan)
        except StopIteration as done:  # the cache answered
            return done.value  # type: ignore[no-any-return]
        asking = self._asking.get(name)
        if asking is not None and not asking.done():
            plan.close()
            await asking  # another task of this process is asking Redis right now
            return await self.conn.adrive(self._p_acquire(name, now, cfg))
        self._asking[name] = asyncio.get_running_loop().create_future()
        try:
            while True:
                step = plan.send(await self.conn.arun(*step))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        finally:
            fut = self._asking.pop(name)
            if not fut.done():
                fut.set_result(None)

    def _nothing_to_record(self, name: str, permit: str, failed: bool, cfg: BreakerConfig) -> bool:
        """A success of a closed breaker with nothing to reset needs no round trip."""
        if failed or permit != CALL or cfg.window != 0:
            return False
        cached = self.cache.get(name)
        # with cache_ttl=0 the cache was refreshed by this very call's acquire
        fresh = self.cache_ttl == 0 or (
            cached is not None and system_clock.now() - cached[3] < self.cache_ttl
        )
        return cached is not None and cached[0] == CLOSED and cached[2] == 0 and fresh

    def _remember(
        self,
        name: str,
        old: BreakerState,
        new: BreakerState,
        retry_at: float,
        failures: int,
        version: int,
    ) -> BreakerState:
        """Cache what the store said; the state this process knew before, when another
        process moved it meanwhile (so that this process's hooks hear of it too)."""
        cached = self.cache.get(name)
        self.cache[name] = (new, retry_at, failures, system_clock.now(), version)
        if cached is not None and cached[4] < version and cached[0] != old:
            return cached[0]
        return old

    def _p_record(
        self, name: str, now: float, permit: str, failed: bool, cfg: BreakerConfig
    ) -> Plan[tuple[str, str, float]]:
        if self._nothing_to_record(name, permit, failed, cfg):
            return CLOSED, CLOSED, 0.0
        conn = self.conn
        args = [
            conn.when(now),
            permit,
            "1" if failed else "0",
            cfg.failure_threshold,
            cfg.cooldown,
            cfg.half_open_max_calls,
            cfg.window,
            cfg.min_calls,
            cfg.failure_rate,
            conn.ttl_ms,
            cfg.probe_interval,
        ]
        r = yield ("breaker_record", conn.key("breaker", name), args)
        if r is None:
            return conn.fallback.breaker_record(name, now, permit, failed, cfg)
        old, new = BreakerState(text(r[0])), BreakerState(text(r[1]))
        retry_at = conn.caller_time(float(text(r[2])), now, float(text(r[5])))
        old = self._remember(name, old, new, retry_at, int(r[3]), int(r[4]))
        return old, new, retry_at

    def record(
        self, name: str, now: float, permit: str, failed: bool, cfg: BreakerConfig
    ) -> tuple[str, str, float]:
        if self._nothing_to_record(name, permit, failed, cfg):
            return CLOSED, CLOSED, 0.0
        return self.conn.drive(self._p_record(name, now, permit, failed, cfg))

    async def arecord(
        self, name: str, now: float, permit: str, failed: bool, cfg: BreakerConfig
    ) -> tuple[str, str, float]:
        return await self.conn.adrive(self._p_record(name, now, permit, failed, cfg))

    def state(self, name: str, now: float) -> tuple[str, float]:
        conn = self.conn
        answer = conn.run("breaker_read", conn.key("breaker", name), [])
        if answer is None:
            return conn.fallback.breaker_state(name, now)
        state, retry_at, seconds, micros = answer
        st = BreakerState(text(state)) if state else CLOSED
        store_now = int(seconds) + int(micros) / 1e6 if conn.server_time else now
        at = conn.caller_time(float(text(retry_at)) if retry_at else 0.0, now, store_now)
        if st == OPEN and now >= at:
            return HALF_OPEN, at
        return st, at

    def names(self, limit: int = 1000) -> list[str]:
        """The names of the breakers this store holds state for."""
        head = f"{self.conn.prefix}:breaker:"
        names = []
        for key in self.conn.client.scan_iter(match=head + "*", count=500):
            names.append(text(key)[len(head) :])
            if len(names) >= limit:
                break
        return sorted(names)

    def force(self, name: str, state: str, seconds: float = 0.0) -> None:
        """Open a breaker for ``seconds``, or close it; every process sees it at its next read."""
        if state not in (OPEN, CLOSED):
            raise ValueError(f"state must be 'open' or 'closed', got {state!r}")
        conn = self.conn
        key = conn.key("breaker", name)
        conn.scripts["breaker_force"](keys=[key], args=[state, float(seconds), conn.ttl_ms])
        self.cache.clear()
