"""The adaptive limiters of the Redis store.

A limiter's success is sent with the process's next admission request (or with every
16th success when no admission request comes), so a limiter-gated call costs one round
trip, its admission, on the success path. A refusal closes a local gate: the callers of
this process turned away wait for the same moment without asking Redis again.
"""

from __future__ import annotations

from typing import Any

from tether.stores._logic import LimiterConfig, LimiterOutcome
from tether.stores.redis._connection import Connection, Plan, text

__all__ = ["Limiters"]

_OK_BATCH = 16  # successes recorded without an acquire are sent at least this often
#: the outcome a script is sent with the held successes only (the Lua twin's 'none')
_ONLY_SUCCESSES = "none"


class Limiters:
    """The limiter operations of a :class:`~tether.stores.RedisStore`."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.pending_ok: dict[str, int] = {}  # successes not yet sent
        self.rate: dict[str, float] = {}  # the rate Redis last said
        self.gate: dict[str, float] = {}  # name -> when this process may ask again
        self._asking: dict[str, Any] = {}  # name -> future of the task asking Redis

    def _args(self, now: float, cfg: LimiterConfig) -> list[Any]:
        return [
            self.conn.when(now),  # "": the server's clock (TIME), one for the whole fleet
            cfg.initial_rate,
            cfg.min_rate,
            cfg.max_rate,
            cfg.burst,
            cfg.beta,
            cfg.increase,
            cfg.decrease_interval,
            self.conn.ttl_ms,
            cfg.horizon,
        ]

    def _p_acquire(self, name: str, now: float, cfg: LimiterConfig) -> Plan[tuple[float, bool]]:
        gate = self.gate.get(name)
        if gate is not None and now < gate:
            # the limiter turned a caller of this process away moments ago: the others
            # wait for the same moment without asking Redis again
            return gate - now, False
        pending = self.pending_ok.pop(name, 0)
        args = [*self._args(now, cfg), pending]
        r = yield ("limiter_acquire", self.conn.key("limiter", name), args)
        if r is None:
            self._fallback_oks(name, now, pending, cfg)
            return self.conn.fallback.limiter_acquire(name, now, cfg)
        self.rate[name] = float(text(r[2]))
        wait, admitted = float(text(r[0])), bool(int(r[1]))
        if admitted:
            self.gate.pop(name, None)
        else:
            self.gate[name] = now + wait
        return wait, admitted

    def _fallback_oks(self, name: str, now: float, count: int, cfg: LimiterConfig) -> None:
        """The successes held for Redis, told to the fallback instead (Redis is away)."""
        for _ in range(count):
            self.conn.fallback.limiter_feedback(name, now, LimiterOutcome.OK, cfg)

    def acquire(self, name: str, now: float, cfg: LimiterConfig) -> tuple[float, bool]:
        return self.conn.drive(self._p_acquire(name, now, cfg))

    async def aacquire(self, name: str, now: float, cfg: LimiterConfig) -> tuple[float, bool]:
        """Like :meth:`acquire`; the tasks of this process ask one at a time, so that one
        refusal closes the gate for all of them (as the sync client does)."""
        import asyncio

        while True:
            asking = self._asking.get(name)
            if asking is None or asking.done():
                break
            await asking
        self._asking[name] = asyncio.get_running_loop().create_future()
        try:
            return await self.conn.adrive(self._p_acquire(name, now, cfg))
        finally:
            fut = self._asking.pop(name)
            if not fut.done():
                fut.set_result(None)

    def _p_feedback(self, name: str, now: float, outcome: str, cfg: LimiterConfig) -> Plan[float]:
        conn = self.conn
        held = self.pending_ok.get(name, 0)
        if outcome == LimiterOutcome.OK and not conn.degraded and held < _OK_BATCH - 1:
            # a success travels with this process's next acquire: no round trip of its own
            self.pending_ok[name] = held + 1
            return self.rate.get(name, cfg.initial_rate)
        pending = self.pending_ok.pop(name, 0)
        sent = outcome
        if outcome == LimiterOutcome.OK:  # the batch is full: send it, this success with it
            pending, sent = pending + 1, _ONLY_SUCCESSES
        args = [*self._args(now, cfg), pending, sent]
        r = yield ("limiter_feedback", conn.key("limiter", name), args)
        if r is None:
            if outcome == LimiterOutcome.OK:
                pending -= 1  # the fallback hears this success as itself
            self._fallback_oks(name, now, pending, cfg)
            return conn.fallback.limiter_feedback(name, now, outcome, cfg)
        self.rate[name] = float(text(r))
        return self.rate[name]

    def feedback(self, name: str, now: float, outcome: str, cfg: LimiterConfig) -> float:
        return self.conn.drive(self._p_feedback(name, now, outcome, cfg))

    async def afeedback(self, name: str, now: float, outcome: str, cfg: LimiterConfig) -> float:
        return await self.conn.adrive(self._p_feedback(name, now, outcome, cfg))
