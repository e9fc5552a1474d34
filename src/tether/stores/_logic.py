"""The state machines of the fleet guards, as pure functions over a dict of fields.

:class:`~tether.stores.MemoryStore` applies them under a lock. The Redis store runs
Lua translations of the same functions on the server; the shared test suite runs
every behaviour against both so that they cannot drift.

Times are wall-clock seconds (``clock.wall()``): state shared by processes on
several machines cannot use a per-process monotonic clock.

A name is one breaker (budget, limiter) in a store, shared by every object and process
that uses it; its configuration is stored beside its state (:func:`config_text`), and an
object made with the same name and another configuration is refused.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Iterable
from typing import Any

from tether._frozen import Frozen, set_fields

__all__ = [
    "CALL",
    "DENY",
    "PROBE",
    "BreakerConfig",
    "BreakerState",
    "BudgetConfig",
    "LimiterConfig",
    "LimiterOutcome",
    "Permit",
    "breaker_acquire",
    "breaker_record",
    "next_probe_wait",
    "budget_refund",
    "budget_spend",
    "config_text",
    "limiter_acquire",
    "limiter_feedback",
]


class BreakerState(enum.StrEnum):
    """A breaker's state; the values are what the stores keep (and compare equal to them)."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Permit(enum.StrEnum):
    """What a breaker answers a call that asks to go out."""

    CALL = "call"  # closed: go
    PROBE = "probe"  # half-open: go, as one of the probes
    DENY = "deny"  # open, or half-open with its probes out: do not go


class LimiterOutcome(enum.StrEnum):
    """What a limited call's answer tells the limiter."""

    OK = "ok"
    THROTTLED = "throttled"  # 429, 529: the dependency asks for less
    FAILED = "failed"  # any other retryable failure


CALL, PROBE, DENY = Permit.CALL, Permit.PROBE, Permit.DENY
CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN
Fields = dict[str, Any]

# The numbers of the state machines. The Redis store's Lua scripts are rendered from
# these (stores/redis/_scripts.py): change one here and both stores change together.

#: Failures since the limiter's last cut (nine in ten or worse, see OUTAGE_RATIO) that it
#: reads as an outage. Few: the breaker handles outages; the limiter only stops pacing a
#: dependency that is gone.
OUTAGE_FAILURES = 20
#: An outage is at least this many failures for every success since the last cut.
OUTAGE_RATIO = 9
#: In slow start a plain failure still grows the rate while there is at least one success
#: for every BROWNOUT_RATIO failures since the last cut (a brownout, not an outage).
BROWNOUT_RATIO = 3
#: Slow start's increase of the rate for each success, and the least additive increase.
RATE_STEP = 1.0
#: The longest a caller turned away by the limiter is told to wait for its turn: the
#: rate may grow meanwhile (slow start doubles it in well under a second).
QUEUE_WAIT_CAP = 1.0
#: The time of the limiter's last cut before its first: long ago, so the first cut may come.
NEVER = -1e18
#: While probes keep failing, the wait before the next one is at most this share of the
#: time the breaker has been open: recovery is noticed within ~15% of the outage.
PROBE_SHARE = 0.15
#: After a failed probe the breaker waits at most this many times its previous wait.
PROBE_GROWTH = 2.0
#: A half-open breaker that refuses a call (its probes are out) tells the caller to ask
#: again within this many seconds (or the cooldown, when shorter): probes answer within a
#: call's latency.
PROBE_ASK_AGAIN = 1.0


class BreakerConfig(Frozen):
    """A breaker's configuration (frozen; a plain slots class, see :mod:`tether._frozen`)."""

    __slots__ = _fields = (
        "failure_threshold",
        "cooldown",
        "half_open_max_calls",
        "window",
        "min_calls",
        "failure_rate",
        "probe_interval",
    )
    failure_threshold: int
    cooldown: float  # the longest wait before a probe
    half_open_max_calls: int  # successful probes that close the breaker
    window: int  # 0: no failure-rate rule
    min_calls: int
    failure_rate: float
    probe_interval: float  # the first probe's wait (0: always ``cooldown``)

    def __init__(
        self,
        failure_threshold: int,
        cooldown: float,
        half_open_max_calls: int,
        window: int,
        min_calls: int,
        failure_rate: float,
        probe_interval: float = 0.0,
    ) -> None:
        set_fields(
            self,
            failure_threshold,
            cooldown,
            half_open_max_calls,
            window,
            min_calls,
            failure_rate,
            probe_interval,
        )


def next_probe_wait(f: Fields, now: float, cfg: BreakerConfig) -> float:
    """How long the breaker stays open after a trip or a failed probe.

    Adaptive (``probe_interval`` > 0): ``probe_interval`` after the trip; after each failed
    probe the larger of ``probe_interval`` and PROBE_SHARE of the time open so far, at most
    doubling the previous wait and never above ``cooldown``. So a short outage is probed
    every second or so and a long one ever more rarely, and the fleet learns of the
    recovery within about 15% of the outage's length.
    """
    if cfg.probe_interval <= 0:
        return cfg.cooldown
    if f["state"] != HALF_OPEN:  # a trip from closed
        return min(cfg.cooldown, cfg.probe_interval)
    grown = max(cfg.probe_interval, PROBE_SHARE * (now - f["opened_at"]))
    return float(min(cfg.cooldown, PROBE_GROWTH * max(f["open_wait"], cfg.probe_interval), grown))


class LimiterConfig(Frozen):
    """A limiter's configuration (frozen; a plain slots class)."""

    __slots__ = _fields = (
        "initial_rate",
        "min_rate",
        "max_rate",
        "burst",
        "horizon",
        "beta",
        "increase",
        "decrease_interval",
    )
    initial_rate: float
    min_rate: float
    max_rate: float
    burst: float
    horizon: float  # how far ahead slots are reserved, in seconds
    beta: float  # multiplicative decrease
    increase: float  # additive increase, as a fraction of the rate per second
    decrease_interval: float

    def __init__(
        self,
        initial_rate: float,
        min_rate: float,
        max_rate: float,
        burst: float,
        horizon: float,
        beta: float,
        increase: float,
        decrease_interval: float,
    ) -> None:
        set_fields(
            self,
            initial_rate,
            min_rate,
            max_rate,
            burst,
            horizon,
            beta,
            increase,
            decrease_interval,
        )


class BudgetConfig(Frozen):
    """A retry budget's configuration (frozen; a plain slots class)."""

    __slots__ = _fields = ("capacity", "retry_cost", "timeout_cost", "refund")
    capacity: float
    retry_cost: float
    timeout_cost: float
    refund: float

    def __init__(
        self, capacity: float, retry_cost: float, timeout_cost: float, refund: float
    ) -> None:
        set_fields(self, capacity, retry_cost, timeout_cost, refund)


@functools.lru_cache(maxsize=256)
def config_text(cfg: BreakerConfig | BudgetConfig | LimiterConfig) -> str:
    """A configuration as one line of text, the same in every process: what a store keeps
    beside a name's state, and what an error shows when a name is reused differently."""
    if isinstance(cfg, Frozen):
        names: Iterable[str] = cfg._fields
    else:  # a dataclass (the token budgets' configuration)
        names = [f.name for f in dataclasses.fields(cfg)]
    return ", ".join(f"{name}={getattr(cfg, name)!r}" for name in names)


def _breaker_defaults(f: Fields) -> None:
    if "state" in f:
        return
    f.setdefault("state", CLOSED)
    f.setdefault("failures", 0)
    f.setdefault("retry_at", 0.0)
    f.setdefault("inflight", 0)
    f.setdefault("probe_ok", 0)
    f.setdefault("probe_deadline", 0.0)
    f.setdefault("window", "")
    f.setdefault("opened_at", 0.0)
    f.setdefault("open_wait", 0.0)


def breaker_acquire(f: Fields, now: float, cfg: BreakerConfig) -> tuple[str, str, float, str]:
    """May a call go out? Returns (old state, new state, retry_at, CALL|PROBE|DENY)."""
    _breaker_defaults(f)
    old = f["state"]
    if f["state"] == OPEN:
        if now < f["retry_at"]:
            return old, OPEN, f["retry_at"], DENY
        f["state"], f["inflight"], f["probe_ok"] = HALF_OPEN, 0, 0
    if f["state"] == HALF_OPEN:
        if f["inflight"] > 0 and now >= f["probe_deadline"]:
            f["inflight"] = 0  # the probes' callers vanished: let new ones through
        # slow start: one probe at first, one more in flight for every probe that succeeded,
        # and never more than half_open_max_calls in all (out and succeeded): the breaker
        # closes on the last of them
        out = f["inflight"]
        if out < 1 + f["probe_ok"] and out + f["probe_ok"] < cfg.half_open_max_calls:
            f["inflight"] += 1
            f["probe_deadline"] = now + cfg.cooldown
            return old, HALF_OPEN, 0.0, PROBE
        # the probes answer within a call's latency: ask again soon, not after a cooldown
        ask_again = now + min(PROBE_ASK_AGAIN, cfg.cooldown)
        return old, HALF_OPEN, min(f["probe_deadline"], ask_again), DENY
    return old, CLOSED, 0.0, CALL


def _trip(f: Fields, now: float, cfg: BreakerConfig) -> None:
    wait = next_probe_wait(f, now, cfg)
    if f["state"] != HALF_OPEN:
        f["opened_at"] = now
    f["state"], f["retry_at"], f["open_wait"] = OPEN, now + wait, wait
    f["failures"], f["window"], f["inflight"], f["probe_ok"] = 0, "", 0, 0


def breaker_record(
    f: Fields, now: float, permit: str, failed: bool, cfg: BreakerConfig
) -> tuple[str, str, float]:
    """Record a call's outcome. Returns (old state, new state, retry_at)."""
    _breaker_defaults(f)
    old = f["state"]
    if not failed and old == CLOSED and not f["failures"] and not cfg.window:
        return old, old, f["retry_at"]  # a success with nothing to reset: the common case
    if permit == PROBE and f["state"] == HALF_OPEN:
        f["inflight"] = max(0, f["inflight"] - 1)
        if failed:
            _trip(f, now, cfg)
        else:
            f["probe_ok"] += 1
            if f["probe_ok"] >= cfg.half_open_max_calls:
                f["state"], f["failures"], f["window"] = CLOSED, 0, ""
                f["inflight"], f["probe_ok"], f["retry_at"] = 0, 0, 0.0
    elif f["state"] == CLOSED:
        f["failures"] = f["failures"] + 1 if failed else 0
        trip = f["failures"] >= cfg.failure_threshold
        if cfg.window > 0:
            window = (f["window"] + ("1" if failed else "0"))[-cfg.window :]
            f["window"] = window
            if len(window) >= cfg.min_calls and window.count("1") >= cfg.failure_rate * len(window):
                trip = True
        if trip:
            _trip(f, now, cfg)
    return old, f["state"], f["retry_at"]


def budget_spend(f: Fields, capacity: float, cost: float) -> tuple[bool, float]:
    """Take ``cost`` tokens if there are enough. Returns (taken, tokens left)."""
    tokens = f.setdefault("tokens", float(capacity))
    if tokens >= cost:
        f["tokens"] = tokens - cost
        return True, f["tokens"]
    return False, tokens


def budget_refund(f: Fields, capacity: float, amount: float) -> float:
    """Give ``amount`` tokens back, up to capacity. Returns the tokens now held."""
    tokens = f.setdefault("tokens", float(capacity))
    f["tokens"] = min(float(capacity), tokens + amount)
    return float(f["tokens"])


def _limiter_defaults(f: Fields, now: float, cfg: LimiterConfig) -> None:
    if "rate" not in f:
        f["rate"] = cfg.initial_rate
        f["ssthresh"] = cfg.max_rate
        f["tat"] = now
        f["last_decrease"] = NEVER
        f["ok_since_decrease"] = 0


def limiter_acquire(f: Fields, now: float, cfg: LimiterConfig) -> tuple[float, bool]:
    """Reserve a send slot (GCRA), at most ``cfg.horizon`` seconds ahead.

    Returns (wait, admitted): admitted with the wait until the reserved slot, or not
    admitted with the seconds after which asking again may succeed (the backlog past
    the horizon, plus the place in the queue of callers already turned away, so that they
    come back one by one). Bounding the horizon keeps a slow rate (an outage's floor)
    from handing out slots minutes ahead that a recovered dependency would not need.
    """
    _limiter_defaults(f, now, cfg)
    interval = 1.0 / f["rate"]
    tat = max(f["tat"], now - (cfg.burst - 1.0) * interval)
    wait = max(0.0, tat - now)
    if wait > cfg.horizon:
        # the callers turned away queue up: each is told to come back about when its turn
        # may come at the current rate, instead of all asking again at once
        served = (now - f.get("queued_at", now)) * f["rate"]
        queued = max(0.0, f.get("queued", 0.0) - served) + 1.0
        f["queued"], f["queued_at"] = queued, now
        return wait - cfg.horizon + min(queued * interval, QUEUE_WAIT_CAP), False
    f["tat"] = tat + interval
    return wait, True


def limiter_feedback(f: Fields, now: float, outcome: str, cfg: LimiterConfig) -> float:
    """Slow start, then additive increase on success; multiplicative decrease on overload.

    ``outcome`` is ``"ok"``, ``"throttled"`` (429, 529: the dependency asks for less) or
    ``"failed"`` (any other retryable failure). A throttle cuts the rate at once; plain
    failures cut it only when nearly every call fails (an outage: the rate falls to the
    floor of probes), so a dependency that drops some calls at random is not starved.
    A cut that follows no success at all does not lower the slow-start threshold: an
    outage says nothing about capacity, so the recovery ramps up exponentially.
    At most one cut per ``decrease_interval``. Returns the new rate.
    """
    _limiter_defaults(f, now, cfg)
    rate = f["rate"]
    if outcome == LimiterOutcome.OK:
        f["ok_since_decrease"] += 1
        if rate < f["ssthresh"]:
            rate += RATE_STEP  # one more per success: doubles every 1/ln2 s of full admission
        else:
            rate += max(RATE_STEP, cfg.increase * rate) / rate
        f["rate"] = min(cfg.max_rate, rate)
        return float(f["rate"])
    f["failed_since_decrease"] = f.get("failed_since_decrease", 0) + 1
    outage = (
        f["failed_since_decrease"] >= OUTAGE_FAILURES
        and f["failed_since_decrease"] >= OUTAGE_RATIO * f["ok_since_decrease"]
    )
    if (outcome == LimiterOutcome.THROTTLED or outage) and now - f[
        "last_decrease"
    ] >= cfg.decrease_interval:
        if f["ok_since_decrease"] > 0:
            f["ssthresh"] = max(cfg.min_rate, rate * cfg.beta)
        f["rate"] = max(cfg.min_rate, rate * cfg.beta)
        f["last_decrease"] = now
        f["ok_since_decrease"] = 0
        f["failed_since_decrease"] = 0
    elif (
        outcome == LimiterOutcome.FAILED
        and rate < f["ssthresh"]
        and BROWNOUT_RATIO * f["ok_since_decrease"] >= f["failed_since_decrease"]
    ):
        # a plain failure (not a throttle) while a quarter of calls succeed was still an answer:
        # in slow start it is evidence of capacity too, so a brownout does not slow the
        # ramp-up (an outage, with no successes, never grows the rate)
        f["rate"] = min(cfg.max_rate, rate + RATE_STEP)
    return float(f["rate"])
