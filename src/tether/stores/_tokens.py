"""The token budget's state machine: a provider's per-minute buckets, as pure functions.

One name (a provider and model family) holds four buckets, the provider's own: requests,
input tokens, output tokens, and tokens (input and output together, OpenAI's TPM). Each
is a token bucket whose capacity is its per-minute limit and which refills continuously
at limit / 60 per second (Anthropic's documented algorithm; OpenAI's limits behave so
over a minute). A limit of 0 is a bucket the budget does not know of: never a reason to
wait.

* :func:`tokens_reserve` takes a call's need (1 request, the prompt's estimate, the
  ``max_tokens`` of the request) before the call. The level may go below zero: the
  caller is admitted with the wait until its tokens have accrued (a place in line), as
  long as that wait is within its ``horizon``; otherwise it is turned away and told when
  the line will be short enough. A caller that has waited longer asks with a longer
  horizon, so it is admitted before the newcomers: no caller waits unboundedly.
* :func:`tokens_settle` applies what responses said (a :class:`Settlement`): the
  difference between the reservation and the usage goes back, the headers' limits
  replace the configured ones, their ``remaining`` lowers a level the provider says is
  lower, and a 429's ``Retry-After`` pauses the name for everybody.
* Until a first response has been settled, one call goes out alone (a probe); the others
  wait for its headers, so a limit configured twice too high cannot send a burst the
  provider refuses.

:class:`MemoryTokens` applies them under the memory store's lock; the Redis store runs
their Lua twin (``stores/redis/_tokens.py``) in one round trip; the shared tests run
both. Times are wall-clock seconds.
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "BUCKETS",
    "FLY_TAU",
    "MEMBER_EVERY",
    "MEMBER_TTL",
    "PROBE_WAIT",
    "Settlement",
    "Answer",
    "TokenAsk",
    "TokenConfig",
    "TokenOps",
    "token_ops",
    "tokens_exchange",
    "tokens_reserve",
    "tokens_settle",
    "tokens_view",
]

#: the buckets of a name, in the order of every 4-tuple here
BUCKETS = ("requests", "input", "output", "tokens")
#: how soon a caller turned away while the first call (the probe) is out asks again
PROBE_WAIT = 0.25
#: a process that has not asked for a name in this many seconds no longer shares it
MEMBER_TTL = 30.0
#: how often a process asks the shared store how many processes share a name (seconds)
MEMBER_EVERY = 5.0
#: the margins in flight (see :func:`tokens_settle`) fade with this time constant (seconds):
#: those of calls whose settlement never came (a process gone) do not hold tokens for good
FLY_TAU = 60.0
_FLY = ("fly0", "fly1", "fly2", "fly3")
Fields = dict[str, Any]
Four = tuple[float, float, float, float]
#: a reservation's answer: (admitted, wait, retry_in)
Answer = tuple[bool, float, float]


@dataclass(frozen=True, slots=True)
class TokenConfig:
    """A name's configured limits per minute (0: not configured) and how long the first
    call may stay out before another caller may probe instead."""

    limits: Four
    probe_timeout: float = 30.0


@dataclass(slots=True)
class Settlement:
    """What this process learned from responses and has not told the store yet.

    ``refund``: tokens to give back per bucket (negative: the usage was above the
    reservation); ``limit``: the limits the headers stated (0: not stated), ``remaining``
    what they said was left (-1: not stated), both as of ``seen_at``; ``pause_until``:
    a 429's Retry-After; ``answered``: a response arrived (the name is calibrated);
    ``margin``: the padding of the settled reservations (no longer in flight).
    """

    refund: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    limit: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    remaining: list[float] = field(default_factory=lambda: [-1.0, -1.0, -1.0, -1.0])
    seen_at: float = 0.0
    pause_until: float = 0.0
    answered: bool = False
    margin: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])

    def empty(self) -> bool:
        return (
            not self.answered
            and not self.pause_until
            and not any(self.refund)
            and not any(self.margin)
        )

    def merge(self, other: Settlement) -> None:
        """Add ``other`` (learned later) to this one: refunds add up, the newer headers win."""
        for i in range(4):
            self.refund[i] += other.refund[i]
            self.margin[i] += other.margin[i]
        if other.seen_at >= self.seen_at:
            for i in range(4):
                if other.limit[i] > 0:
                    self.limit[i] = other.limit[i]
                if other.remaining[i] >= 0:
                    self.remaining[i] = other.remaining[i]
            self.seen_at = other.seen_at
        self.pause_until = max(self.pause_until, other.pause_until)
        self.answered = self.answered or other.answered

    def args(self) -> list[float]:
        """As 15 numbers, the order the Lua twin reads them in."""
        return [
            *self.refund,
            *self.limit,
            *self.remaining,
            self.seen_at,
            self.pause_until,
            1.0 if self.answered else 0.0,
        ]


@dataclass(frozen=True, slots=True)
class TokenAsk:
    """One conversation of a process with a name in the store: settle ``pending`` (what
    the process learned since), then, with a ``need``, reserve it within ``horizon``
    (``margin``: what of the need is the estimate's padding)."""

    name: str
    now: float
    cfg: TokenConfig
    pending: Settlement | None = None
    need: Four | None = None
    horizon: float = 0.0
    margin: Four | None = None


def _refill(f: Fields, until: float) -> None:
    """Bring the buckets to ``until`` (not before their own time): each refills at its limit
    per minute and holds at most its limit, as the provider's do."""
    dt = until - f["t"]
    if dt <= 0:
        return
    for i in range(4):
        cap = f[f"cap{i}"]
        if cap > 0:
            f[f"lvl{i}"] = min(cap, f[f"lvl{i}"] + cap * dt / 60.0)
    f["t"] = until


def _load(f: Fields, now: float, cfg: TokenConfig) -> None:
    """Initialise a name (its buckets full at the configured limits) or refill it to ``now``.

    The buckets' time ``t`` is the line's end: when the last call admitted goes out (it may
    be after ``now``); their levels are what the provider's buckets hold then, after it."""
    if "t" not in f:
        f["t"], f["known"], f["probe_until"], f["paused_until"] = now, 0, 0.0, 0.0
        for i in range(4):
            f[f"cap{i}"] = f[f"lvl{i}"] = float(cfg.limits[i])
    _refill(f, now)
    # the margins in flight fade (FLY_TAU): a settlement that never comes holds nothing long
    ft = f.get("ft")
    if ft is None:
        f["ft"], f["fly0"], f["fly1"], f["fly2"], f["fly3"] = now, 0.0, 0.0, 0.0, 0.0
    elif now > ft:
        fade = math.exp((ft - now) / FLY_TAU)
        for key in _FLY:
            f[key] *= fade
        f["ft"] = now


def tokens_settle(f: Fields, now: float, cfg: TokenConfig, s: Settlement) -> None:
    """Apply what responses said: refunds, the headers' limits and levels, a pause.

    A ``remaining`` header counts the calls in flight at their real usage, the buckets at
    what they reserved until their settlements give the padding back: the level it allows
    is less the margins of the calls still in flight (``fly``, the fleet's, kept by the
    reservations and their settlements), or each of those refunds would count twice.
    """
    _load(f, now, cfg)
    if any(s.margin):
        for i, key in enumerate(_FLY):
            f[key] = max(0.0, f[key] - s.margin[i])
    for i in range(4):
        cap, limit = f[f"cap{i}"], s.limit[i]
        if limit > 0 and limit != cap:
            # the provider states the real limit: it replaces the configured one
            f[f"lvl{i}"] = limit if cap <= 0 else min(f[f"lvl{i}"], limit)
            f[f"cap{i}"] = cap = limit
        if cap <= 0:
            continue
        level = min(cap, f[f"lvl{i}"] + s.refund[i])
        if s.remaining[i] >= 0:
            said = min(cap, s.remaining[i] + cap * max(0.0, f["t"] - s.seen_at) / 60.0)
            said -= f[f"fly{i}"]
            # the provider has less left than we think (callers outside the fleet, a limit
            # configured too high): believe it. Its first answer (the probe's: nothing else
            # is out) is believed either way
            level = said if s.answered and not f["known"] else min(level, said)
        f[f"lvl{i}"] = level
    if s.answered:
        f["known"], f["probe_until"] = 1, 0.0
    f["paused_until"] = max(f["paused_until"], s.pause_until)


def tokens_reserve(
    f: Fields,
    now: float,
    cfg: TokenConfig,
    need: Four,
    horizon: float,
    margin: Four | None = None,
) -> Answer:
    """Take ``need`` from the buckets if the wait for it is within ``horizon``.

    Returns ``(admitted, wait, retry_in)``: admitted, go after ``wait`` seconds; or not
    admitted, the whole wait would be ``wait`` (-1: unknown, the first call is still out)
    and asking again after ``retry_in`` may succeed. A need above a bucket's capacity is
    taken as the capacity (admitted once the bucket is full: the provider decides).

    A call goes out after the line (``t``) and the pause, once every bucket holds its
    need: the buckets are brought to that time (a bucket full meanwhile, waiting for
    another, gains nothing more) and the need is taken then; the line ends there.
    """
    _load(f, now, cfg)
    if not f["known"] and f["probe_until"] > now:
        # the probe is out: ask again after half the time it has been out (its answer is
        # a call's latency away), the wait unknown (-1)
        out_for = now - (f["probe_until"] - cfg.probe_timeout)
        return False, -1.0, min(max(PROBE_WAIT, out_for / 2.0), f["probe_until"] - now)
    start = max(f["t"], f["paused_until"])
    go = start
    for i in range(4):
        cap = f[f"cap{i}"]
        if cap > 0:
            level = min(cap, f[f"lvl{i}"] + cap * (start - f["t"]) / 60.0)
            go = max(go, start + (min(need[i], cap) - level) * 60.0 / cap)
    wait = go - now
    if wait > horizon:
        return False, wait, wait - horizon
    _refill(f, go)
    for i in range(4):
        cap = f[f"cap{i}"]
        if cap > 0:
            f[f"lvl{i}"] -= min(need[i], cap)
            if margin is not None and margin[i]:
                f[_FLY[i]] += min(margin[i], cap)
    if not f["known"]:
        f["probe_until"] = now + cfg.probe_timeout
    return True, wait, 0.0


def tokens_exchange(f: Fields, ask: TokenAsk) -> Answer:
    """One conversation with a name: settle what ``ask.pending`` says, then reserve
    ``ask.need`` (none: settle only, answered ``(False, 0, 0)``)."""
    if ask.pending is not None and not ask.pending.empty():
        tokens_settle(f, ask.now, ask.cfg, ask.pending)
    if ask.need is None:
        _load(f, ask.now, ask.cfg)
        return False, 0.0, 0.0
    return tokens_reserve(f, ask.now, ask.cfg, ask.need, ask.horizon, ask.margin)


def tokens_view(f: Fields, now: float, cfg: TokenConfig) -> dict[str, Any]:
    """The state as the operator reads it: limits, levels (after the line), the line, the
    pause."""
    _load(f, now, cfg)
    return {
        "limits": {b: f[f"cap{i}"] for i, b in enumerate(BUCKETS) if f[f"cap{i}"] > 0},
        "levels": {b: f[f"lvl{i}"] for i, b in enumerate(BUCKETS) if f[f"cap{i}"] > 0},
        "calibrated": bool(f["known"]),
        "line": max(0.0, f["t"] - now),
        "paused_for": max(0.0, f["paused_until"] - now),
    }


class TokenOps(Protocol):
    """A store's token operations (see :func:`token_ops`): one exchange (a settlement, a
    reservation or both: one round trip), the view, a reset."""

    def exchange(self, ask: TokenAsk) -> Answer: ...

    async def aexchange(self, ask: TokenAsk) -> Answer: ...

    def view(self, name: str, now: float, cfg: TokenConfig) -> dict[str, Any]: ...

    def reset(self, name: str | None = None) -> None: ...


class MemoryTokens:
    """Token budgets in this process's memory, every operation under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, Fields] = {}

    def exchange(self, ask: TokenAsk) -> Answer:
        with self._lock:
            return tokens_exchange(self._data.setdefault(ask.name, {}), ask)

    async def aexchange(self, ask: TokenAsk) -> Answer:
        return self.exchange(ask)

    def view(self, name: str, now: float, cfg: TokenConfig) -> dict[str, Any]:
        with self._lock:
            return tokens_view(self._data.setdefault(name, {}), now, cfg)

    def start_empty(self, name: str, at: float, cfg: TokenConfig) -> None:
        """Hold ``name`` at ``cfg``'s limits with every bucket empty at ``at`` (and the
        limits known: no probe): what a process takes over from a shared store that went
        away, whose levels it does not know, admits no burst, only the refill after ``at``
        (the end of the line the shared store had admitted)."""
        with self._lock:
            f = self._data[name] = {}
            _load(f, at, cfg)
            for i in range(4):
                f[f"lvl{i}"] = 0.0
            f["known"] = 1

    def reset(self, name: str | None = None) -> None:
        with self._lock:
            if name is None:
                self._data.clear()
            else:
                self._data.pop(name, None)


_OPS: weakref.WeakKeyDictionary[Any, TokenOps] = weakref.WeakKeyDictionary()
_OPS_LOCK = threading.Lock()


def token_ops(store: Any) -> TokenOps:
    """The token operations of ``store``: its own (``store.tokens()``: the memory and Redis
    stores), or state in this process's memory beside a store that has none."""
    own = getattr(store, "tokens", None)
    if callable(own):
        ops: TokenOps = own()
        return ops
    with _OPS_LOCK:
        return _OPS.setdefault(store, MemoryTokens())
