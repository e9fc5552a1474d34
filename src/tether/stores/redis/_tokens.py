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
whole, until it has heard a count). For ``AWAY_GRACE`` seconds it admits nothing (a blip
ends sooner: its callers wait for Redis rather than admit what the processes still reaching
it admit too); its buckets start empty then (it does not know the shared levels): it admits
its share of the refill, never a burst. During the grace one of its calls tries Redis every
``GRACE_RETRY`` seconds (not only every ``reconnect_interval``), and what responses said
meanwhile (limits, levels, a pause) goes to the shared buckets with the first call that
reaches Redis. What it
takes meanwhile is charged to the shared buckets with its next call that reaches Redis (the
shared buckets refilled while it was away). So a fleet whose processes all lost Redis
admits about one limit a minute between them, not a bucket per process at each timeout.
Nor does it admit anything before the shared line ends (the calls the shared buckets had
already admitted, with a wait, when Redis went away): every answer says how long that
line is, and the process's memory starts empty at its end.

A call that timed out may still have run (the client retried it, or a stalled connection
delivered it later): every call carries the process's number for it and the refunds (less
what the process took from its memory) it has asked for in all, and the script keeps the
last of each per process, so a copy changes nothing and a refund counts once.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import secrets
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any

from tether.clock import system_clock
from tether.stores._tokens import (
    MEMBER_EVERY,
    PROBE_WAIT,
    Settlement,
    TokenConfig,
    tokens_view,
)
from tether.stores.redis._tokens_lua import TOKENS

if TYPE_CHECKING:
    from tether.stores._tokens import Answer, MemoryTokens, TokenAsk
    from tether.stores.redis._connection import Connection, Plan

__all__ = ["AWAY_GRACE", "GRACE_RETRY", "TOKENS", "Tokens"]

#: for this long after Redis went away (on the budget's clock) a process admits nothing from
#: its memory, its callers wait: a blip (a stall, a failover) is over before, and what the
#: process would admit alone meanwhile, the processes that still reach Redis admit as well
AWAY_GRACE = 5.0
#: during that grace one ask of the process tries Redis again this often (seconds), not only
#: every ``reconnect_interval``: its callers wait for Redis, so they go on as soon as it is back
GRACE_RETRY = 0.2


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _kind(need: Any, r: Any) -> str:
    """What kind of answer the script gave (see :attr:`Tokens.answers`)."""
    if need is None:
        return "settled"
    if int(r[0]):
        return "admitted"
    wait = float(_s(r[1]))
    return "probe" if wait < 0 else "older" if wait == 0 else "line"


class Tokens:
    """The token budget operations of a :class:`~tether.stores.RedisStore` (see the module)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.member = secrets.token_hex(8)  # this process (this store) among the name's users
        #: name -> (this process's share of the limits, when the store last said it)
        self.shares: dict[str, tuple[float, float]] = {}
        #: the names held in this process's memory now, and since when (the ask's clock)
        self.away: dict[str, float] = {}
        self._lock = threading.Lock()
        self._seq = itertools.count(1)
        #: name -> the refunds this process asked the shared buckets for, in all, less what
        #: it took from its memory while Redis was away (charged when Redis answers again)
        self.asked: dict[str, list[float]] = {}
        #: name -> (the number of the newest ask answered, its ``asked`` then)
        self.confirmed: dict[str, tuple[int, list[float]]] = {}
        #: name -> when the shared line ended, as the last answer said (the caller's clock)
        self.line_end: dict[str, float] = {}
        #: name -> the numbers of reservations whose answers were lost (the caller went on
        #: without them): told to the store, which gives back those it admitted
        self.lost: dict[str, dict[int, None]] = {}
        #: name -> what responses said while Redis was away (limits, levels, a pause; the
        #: refunds travel in ``asked``): sent with the next ask that reaches Redis
        self.unsent: dict[str, Settlement] = {}
        #: while Redis is away: until when an ask of this process is trying it (the others
        #: answer from memory meanwhile), and when the next may try
        self._trial_until = 0.0
        self._next_trial = 0.0
        #: the store's answers by kind (admitted, refused: line, probe or older; settled;
        #: memory: answered here while Redis was away)
        self.answers: Counter[str] = Counter()

    def key(self, name: str) -> str:
        return f"{self.conn.prefix}:tokens:{{{name}}}"

    @property
    def fallback(self) -> MemoryTokens:
        return self.conn.fallback.tokens()

    def _may_ask(self, name: str, now: float) -> bool | None:
        """Whether this ask goes to Redis: None, no (it answers from memory); False, yes (the
        connection may still say Redis is away); True, yes, as the one trial. While Redis is
        away and ``name`` in its grace, one ask at a time tries it again every
        ``GRACE_RETRY`` seconds, not only every ``reconnect_interval``."""
        conn = self.conn
        if not conn.degraded:
            return False
        t = system_clock.now()
        with self._lock:
            if t < self._trial_until:
                return None  # another ask of this process is trying Redis
            since = self.away.get(name)
            if since is None or now - since >= AWAY_GRACE or t < self._next_trial:
                return False  # the connection decides (its reconnect_interval)
            self._trial_until = t + conn.socket_timeout + 0.05
            self._next_trial = t + GRACE_RETRY
        conn.retry_now()
        return True

    def _take_unsent(self, name: str, s: Settlement) -> tuple[Settlement, Settlement | None]:
        """``s`` with what responses said while Redis was away merged in (and that part)."""
        with self._lock:
            unsent = self.unsent.pop(name, None)
        if unsent is None:
            return s, None
        merged = Settlement()
        merged.merge(unsent)
        merged.merge(s)
        return merged, unsent

    def _keep_unsent(self, name: str, s: Settlement | None) -> None:
        """Keep what ``s`` says of limits, levels and a pause for Redis (not its refunds:
        those are in ``asked``)."""
        if s is None or not (s.answered or s.pause_until or s.seen_at):
            return
        kept = dataclasses.replace(s, refund=[0.0, 0.0, 0.0, 0.0])
        with self._lock:
            self.unsent.setdefault(name, Settlement()).merge(kept)

    def _p_exchange(self, ask: TokenAsk) -> Plan[Answer]:
        s, need = ask.pending or Settlement(), ask.need
        s, unsent = self._take_unsent(ask.name, s)
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
        seq, asked = self._number(ask)
        # 13..16: what this ask adds to the refunds the store last confirmed (applied when
        # the store no longer knows this process); then its number and the refunds in all
        confirmed = self.confirmed.get(ask.name, (0, [0.0, 0.0, 0.0, 0.0]))[1]
        args[13:17] = [a - c for a, c in zip(asked, confirmed, strict=True)]
        with self._lock:
            lost = list(self.lost.get(ask.name, ()))
        args += [seq, *asked, " ".join(map(str, lost))]
        args += [*(ask.margin or (0.0, 0.0, 0.0, 0.0)), *s.margin]
        r, trial = None, self._may_ask(ask.name, ask.now)
        if trial is not None:
            r = yield ("tokens", self.key(ask.name), args)
        if trial:
            with self._lock:
                self._trial_until = 0.0  # the trial is over: answered, or Redis still away
        if r is None:  # Redis is away: this process's memory, with its share of the limits
            self._keep_unsent(ask.name, unsent)
            self.answers["memory"] += 1
            if need is not None:
                with self._lock:
                    gone = self.lost.setdefault(ask.name, {})
                    gone[seq] = None
                    while len(gone) > 16:  # the store keeps the last 32 admitted
                        del gone[next(iter(gone))]
            return self._local_exchange(ask)
        with self._lock:
            for number in lost:
                self.lost.get(ask.name, {}).pop(number, None)
            self.away.pop(ask.name, None)
            if seq > self.confirmed.get(ask.name, (0, []))[0]:
                self.confirmed[ask.name] = (seq, asked)
            if len(r) > 4:
                self.line_end[ask.name] = ask.now + float(_s(r[4]))
        self.answers[_kind(need, r)] += 1
        if count and len(r) > 3 and int(r[3]) > 0:
            self.shares[ask.name] = (1.0 / int(r[3]), system_clock.now())
        return bool(int(r[0])), float(_s(r[1])), float(_s(r[2]))

    def _number(self, ask: TokenAsk) -> tuple[int, list[float]]:
        """The ask's number and the refunds asked for in all with it (one lock: a later
        number always carries at least the refunds of an earlier one)."""
        with self._lock:
            asked = self.asked.setdefault(ask.name, [0.0, 0.0, 0.0, 0.0])
            if ask.pending is not None:
                for i in range(4):
                    asked[i] += ask.pending.refund[i]
            return next(self._seq), list(asked)

    def _local_exchange(self, ask: TokenAsk) -> Answer:
        """``ask`` answered from this process's memory (Redis is away): from empty buckets
        at first (no burst at each timeout), what it takes there kept to be charged to the
        shared buckets later."""
        local = self.local(ask)
        with self._lock:
            since = self.away.get(ask.name)
            if since is None:
                since = self.away[ask.name] = ask.now
                # empty when the grace ends, or the shared line (the calls it admitted go
                # out until then), whichever is later: no burst, and nothing promised twice
                start = max(ask.now + AWAY_GRACE, self.line_end.get(ask.name, ask.now))
                self.fallback.start_empty(ask.name, start, local.cfg)
        self._keep_unsent(ask.name, ask.pending)  # for the shared buckets, when Redis answers
        grace = since + AWAY_GRACE - ask.now
        if ask.need is not None and grace > 0:
            # a blip, maybe: what the ask carries is kept here, nothing admitted yet; its
            # callers wait (-1: as for a probe) and ask again soon
            self.fallback.exchange(dataclasses.replace(local, need=None))
            return False, -1.0, max(0.05, min(PROBE_WAIT, grace))
        answer = self.fallback.exchange(local)
        if answer[0] and ask.need is not None:
            # taken here: charged to the shared buckets with the next ask that reaches them
            # (the ask's refunds travel with it too: they are in ``asked`` already)
            with self._lock:
                asked = self.asked.setdefault(ask.name, [0.0, 0.0, 0.0, 0.0])
                for i in range(4):
                    asked[i] -= ask.need[i]
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
        # the buckets' fields (not the processes' m:<id> and q:<id>)
        f: dict[str, Any] = {_s(a): float(_s(b)) for a, b in raw.items() if ":" not in _s(a)}
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
