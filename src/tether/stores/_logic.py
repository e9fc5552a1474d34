"""The state machines of the fleet guards, as pure functions over a dict of fields.

:class:`~tether.stores.MemoryStore` applies them under a lock. The Redis store runs
Lua translations of the same functions on the server; the shared test suite runs
every behaviour against both so that they cannot drift.

Times are wall-clock seconds (``clock.wall()``): state shared by processes on
several machines cannot use a per-process monotonic clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "CALL",
    "DENY",
    "PROBE",
    "BreakerConfig",
    "LimiterConfig",
    "breaker_acquire",
    "breaker_record",
    "budget_refund",
    "budget_spend",
    "limiter_acquire",
    "limiter_feedback",
]

CALL, PROBE, DENY = "call", "probe", "deny"
Fields = dict[str, Any]


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    failure_threshold: int
    cooldown: float
    half_open_max_calls: int
    window: int  # 0: no failure-rate rule
    min_calls: int
    failure_rate: float


@dataclass(frozen=True, slots=True)
class LimiterConfig:
    initial_rate: float
    min_rate: float
    max_rate: float
    burst: float
    horizon: float  # how far ahead slots are reserved, in seconds
    beta: float  # multiplicative decrease
    increase: float  # additive increase, as a fraction of the rate per second
    decrease_interval: float


def _breaker_defaults(f: Fields) -> None:
    if "state" in f:
        return
    f.setdefault("state", "closed")
    f.setdefault("failures", 0)
    f.setdefault("retry_at", 0.0)
    f.setdefault("inflight", 0)
    f.setdefault("probe_ok", 0)
    f.setdefault("probe_deadline", 0.0)
    f.setdefault("window", "")


def breaker_acquire(f: Fields, now: float, cfg: BreakerConfig) -> tuple[str, str, float, str]:
    """May a call go out? Returns (old state, new state, retry_at, CALL|PROBE|DENY)."""
    _breaker_defaults(f)
    old = f["state"]
    if f["state"] == "open":
        if now < f["retry_at"]:
            return old, "open", f["retry_at"], DENY
        f["state"], f["inflight"], f["probe_ok"] = "half_open", 0, 0
    if f["state"] == "half_open":
        if f["inflight"] > 0 and now >= f["probe_deadline"]:
            f["inflight"] = 0  # the probes' callers vanished: let new ones through
        if f["inflight"] + f["probe_ok"] < cfg.half_open_max_calls:
            f["inflight"] += 1
            f["probe_deadline"] = now + cfg.cooldown
            return old, "half_open", 0.0, PROBE
        # the probes answer within a call's latency: ask again soon, not after a cooldown
        return old, "half_open", min(f["probe_deadline"], now + min(1.0, cfg.cooldown)), DENY
    return old, "closed", 0.0, CALL


def _trip(f: Fields, now: float, cfg: BreakerConfig) -> None:
    f["state"], f["retry_at"] = "open", now + cfg.cooldown
    f["failures"], f["window"], f["inflight"], f["probe_ok"] = 0, "", 0, 0


def breaker_record(
    f: Fields, now: float, permit: str, failed: bool, cfg: BreakerConfig
) -> tuple[str, str, float]:
    """Record a call's outcome. Returns (old state, new state, retry_at)."""
    _breaker_defaults(f)
    old = f["state"]
    if not failed and old == "closed" and not f["failures"] and not cfg.window:
        return old, old, f["retry_at"]  # a success with nothing to reset: the common case
    if permit == PROBE and f["state"] == "half_open":
        f["inflight"] = max(0, f["inflight"] - 1)
        if failed:
            _trip(f, now, cfg)
        else:
            f["probe_ok"] += 1
            if f["probe_ok"] >= cfg.half_open_max_calls:
                f["state"], f["failures"], f["window"] = "closed", 0, ""
                f["inflight"], f["probe_ok"] = 0, 0
    elif f["state"] == "closed":
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
        f["last_decrease"] = -1e18
        f["ok_since_decrease"] = 0


def limiter_acquire(f: Fields, now: float, cfg: LimiterConfig) -> tuple[float, bool]:
    """Reserve a send slot (GCRA), at most ``cfg.horizon`` seconds ahead.

    Returns (wait, admitted): admitted with the wait until the reserved slot, or not
    admitted with the seconds after which asking again may succeed (the backlog past
    the horizon). Bounding the horizon keeps a slow rate (an outage's floor) from
    handing out slots minutes ahead that a recovered dependency would not need.
    """
    _limiter_defaults(f, now, cfg)
    interval = 1.0 / f["rate"]
    tat = max(f["tat"], now - (cfg.burst - 1.0) * interval)
    wait = max(0.0, tat - now)
    if wait > cfg.horizon:
        return wait - cfg.horizon, False
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
    if outcome == "ok":
        f["ok_since_decrease"] += 1
        if rate < f["ssthresh"]:
            rate += 1.0  # one more per success: doubles every 1/ln2 s of full admission
        else:
            rate += max(1.0, cfg.increase * rate) / rate
        f["rate"] = min(cfg.max_rate, rate)
        return float(f["rate"])
    f["failed_since_decrease"] = f.get("failed_since_decrease", 0) + 1
    outage = (
        f["failed_since_decrease"] >= 5 and f["failed_since_decrease"] >= 9 * f["ok_since_decrease"]
    )
    if (outcome == "throttled" or outage) and now - f["last_decrease"] >= cfg.decrease_interval:
        if f["ok_since_decrease"] > 0:
            f["ssthresh"] = max(cfg.min_rate, rate * cfg.beta)
        f["rate"] = max(cfg.min_rate, rate * cfg.beta)
        f["last_decrease"] = now
        f["ok_since_decrease"] = 0
        f["failed_since_decrease"] = 0
    return float(f["rate"])
