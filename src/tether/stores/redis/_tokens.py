"""Token budgets shared by a fleet through Redis: the Lua twin of :mod:`tether.stores._tokens`.

A name's four buckets live in one hash, ``<prefix>:tokens:{<name>}`` (one hash tag per
provider and family, so Redis Cluster keeps a name on one node). One script settles what
the process learned since its last call (refunds from usage, the headers' limits and
levels, a pause) and then reserves the next call: one round trip per model call. A
429's pause is sent at once, without waiting for the next call.

When Redis cannot be reached the store's memory fallback takes over (the store logs one
warning, as for its other guards) and Redis is used again once it answers. The fallback
holds this process's share of each limit, not the whole: every ``MEMBER_EVERY`` seconds a
process's call also says it is here and asks how many processes used the name within
``MEMBER_TTL`` seconds, and while Redis is away it admits 1/that many of each limit (the
whole, until it has heard a count). Its buckets start empty when Redis goes away (it does
not know the shared levels): it admits its share of the refill, never a burst. What it
takes meanwhile is charged to the shared buckets with its next call that reaches Redis (the
shared buckets refilled while it was away). So a fleet whose processes all lost Redis
admits about one limit a minute between them, not a bucket per process at each timeout.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from typing import TYPE_CHECKING, Any

from tether.clock import system_clock
from tether.stores._tokens import MEMBER_EVERY, Settlement, TokenConfig, tokens_view
from tether.stores.redis._tokens_lua import TOKENS

if TYPE_CHECKING:
    from tether.stores._tokens import Answer, MemoryTokens, TokenAsk
    from tether.stores.redis._connection import Connection, Plan

__all__ = ["TOKENS", "Tokens"]


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Tokens:
    """The token budget operations of a :class:`~tether.stores.RedisStore` (see the module)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.member = secrets.token_hex(8)  # this process (this store) among the name's users
        #: name -> (this process's share of the limits, when the store last said it)
        self.shares: dict[str, tuple[float, float]] = {}
        self.away: set[str] = set()  # the names held in this process's memory now
        #: name -> what this process took from its memory while Redis was away (net of the
        #: refunds applied there): charged to the shared buckets when Redis answers again
        self.owed: dict[str, list[float]] = {}

    def key(self, name: str) -> str:
        return f"{self.conn.prefix}:tokens:{{{name}}}"

    @property
    def fallback(self) -> MemoryTokens:
        return self.conn.fallback.tokens()

    def _p_exchange(self, ask: TokenAsk) -> Plan[Answer]:
        s, need = ask.pending or Settlement(), ask.need
        mode = "settle" if need is None else "reserve"
        when = self.conn.when(ask.now)  # "": the script reads the server's clock (TIME)
        args = [when, mode, self.conn.ttl_ms, ask.cfg.probe_timeout, ask.horizon]
        args += [*ask.cfg.limits, *(need or (0.0, 0.0, 0.0, 0.0)), *s.args()]
        # the settlement's times travel as ages on the caller's clock (seconds before the
        # ask; a pause as seconds after it): the script places them on its own clock
        args[-3] = max(0.0, ask.now - s.seen_at) if s.seen_at > 0 else 0.0
        args[-2] = max(0.0, s.pause_until - ask.now) if s.pause_until > 0 else 0.0
        heard = self.shares.get(ask.name, (1.0, -math.inf))[1]
        count = system_clock.now() - heard >= MEMBER_EVERY
        args += [self.member, 1 if count else 0]
        owed = self.owed.get(ask.name)
        if owed is not None:  # 13..16: the settlement's refunds
            args[13:17] = [refund - debt for refund, debt in zip(args[13:17], owed, strict=True)]
        r = yield ("tokens", self.key(ask.name), args)
        if r is None:  # Redis is away: this process's memory, with its share of the limits
            return self._local_exchange(ask)
        self.away.discard(ask.name)
        self.owed.pop(ask.name, None)
        if count and len(r) > 3 and int(r[3]) > 0:
            self.shares[ask.name] = (1.0 / int(r[3]), system_clock.now())
        return bool(int(r[0])), float(_s(r[1])), float(_s(r[2]))

    def _local_exchange(self, ask: TokenAsk) -> Answer:
        """``ask`` answered from this process's memory (Redis is away): from empty buckets
        at first (no burst at each timeout), what it takes there kept to be charged to the
        shared buckets later."""
        local = self.local(ask)
        if ask.name not in self.away:
            self.away.add(ask.name)
            self.fallback.start_empty(ask.name, ask.now, local.cfg)
        answer = self.fallback.exchange(local)
        owed = self.owed.setdefault(ask.name, [0.0, 0.0, 0.0, 0.0])
        if ask.pending is not None:  # refunds applied here, not in the shared buckets
            for i in range(4):
                owed[i] -= ask.pending.refund[i]
        if answer[0] and ask.need is not None:
            for i in range(4):
                owed[i] += ask.need[i]
        return answer

    def local(self, ask: TokenAsk) -> TokenAsk:
        """``ask`` as this process's memory takes it while Redis is away: its limits (the
        configured ones and those a response states) scaled to this process's share."""
        share = self.shares.get(ask.name, (1.0, 0.0))[0]
        if share >= 1.0:
            return ask
        cfg = dataclasses.replace(ask.cfg, limits=tuple(x * share for x in ask.cfg.limits))  # type: ignore[arg-type]
        pending = ask.pending
        if pending is not None:
            pending = dataclasses.replace(pending, limit=[x * share for x in pending.limit])
        return dataclasses.replace(ask, cfg=cfg, pending=pending)

    def exchange(self, ask: TokenAsk) -> Answer:
        return self.conn.drive(self._p_exchange(ask))

    async def aexchange(self, ask: TokenAsk) -> Answer:
        return await self.conn.adrive(self._p_exchange(ask))

    def view(self, name: str, now: float, cfg: TokenConfig) -> dict[str, Any]:
        try:
            raw = self.conn.client.hgetall(self.key(name))
            if self.conn.server_time:  # the buckets' times are the server's
                seconds, micros = self.conn.client.time()
                now = int(seconds) + int(micros) / 1e6
        except self.conn.errors:
            return self.fallback.view(name, now, cfg)
        f: dict[str, Any] = {_s(a): float(_s(b)) for a, b in raw.items()}
        if f:
            f["known"] = int(f["known"])
        return tokens_view(f, now, cfg)

    def reset(self, name: str | None = None) -> None:
        """Delete one name's buckets, or every name's (one key at a time: the names'
        keys may be on several nodes of a cluster)."""
        try:
            if name is None:
                keys = list(self.conn.client.scan_iter(match=f"{self.conn.prefix}:tokens:*"))
            else:
                keys = [self.key(name)]
            for key in keys:
                self.conn.client.delete(key)
        except self.conn.errors:
            pass
