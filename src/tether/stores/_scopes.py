"""Budget scopes' state machine: limits that span runs (a tenant's, a user's), as pure functions.

A scope's state is one mapping of fields (a Redis hash in the Redis store):

* ``max_cost``, ``max_tokens``, ``max_calls``: its limits (absent: none), ``window``: a
  rolling period in seconds (absent: none, the limit holds until raised);
* ``cost``, ``input``, ``output``, ``calls``: what it spent, all time;
* ``s:<slice>``: what it spent in one slice of its window (``window / SLICES`` seconds);
  a window's spend is its newest ``SLICES + 1`` slices, so a spend leaves the window when
  its whole slice has (up to one slice late: never early);
* ``h:<call id>``: a call in flight, reserved at its price before it was sent.

Four numbers travel together, in this order: cost (USD), input tokens, output tokens,
model calls (:data:`DIMENSIONS`). ``max_tokens`` limits input and output together.

* :func:`scopes_reserve` takes a call's priced need from every scope of its run at once,
  all or nothing: a scope whose spend and reservations, with this need, would pass one
  of its limits refuses it (and so the call). A call id already known is not reserved
  again (a replayed request). A cost-limited scope refuses a call it cannot price.
* :func:`scopes_settle` replaces the reservation by the reply's usage, once per call id:
  a replayed record (an engine's recovery, a redelivered hook, a resumed run) counts
  nothing. A reply settled without a reservation is counted too.
* :func:`scopes_release` gives back the reservation of a call that got no reply.
* A reservation older than ``lease`` (its process died, or never settled) counts as
  spent at its reserved price: what it cost is not known, so it is never given back.

:class:`MemoryScopes` applies them under one lock; the Redis store runs their Lua twin
(``stores/redis/_scopes.py``) in one round trip per call for all of its scopes. The
shared tests run both.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "DIMENSIONS",
    "SLICES",
    "Answer",
    "Four",
    "MemoryScopes",
    "ScopeLimits",
    "ScopeOps",
    "scopes_release",
    "scopes_reserve",
    "scopes_settle",
    "share",
    "scope_limit",
    "scope_view",
]

#: the numbers of a need, a spend or a reservation, in order
DIMENSIONS = ("cost_usd", "input_tokens", "output_tokens", "model_calls")
#: slices of a rolling window
SLICES = 60
#: a reservation may pass a limit by this much (float rounding), never more
EPSILON = 1e-9

Fields = dict[str, Any]
Four = tuple[float, float, float, float]
#: a reservation's answer: (code, scope, limit's name, used, limit) with code
#: "ok" | "again" (known call id) | "unpriced" | "spent"; for "ok", the scope and limit
#: nearest to its end with this call taken (used and limit; "" and 0s: no limit)
Answer = tuple[str, str, str, float, float]
OK: Answer = ("ok", "", "", 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class ScopeLimits:
    """A scope's limits (None: none) and its rolling window in seconds (None: none)."""

    max_cost_usd: float | None = None
    max_tokens: int | None = None
    max_model_calls: int | None = None
    window: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_cost_usd", "max_tokens", "max_model_calls", "window"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{name} must be a number >= 0 or None, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value!r}")
        if self.window is not None and self.window <= 0:
            raise ValueError(f"window must be > 0 seconds or None, got {self.window!r}")


def _four(text: str) -> list[float]:
    return [float(x) for x in text.split()]


def _text(values: Iterable[float]) -> str:
    return " ".join(repr(float(v)) for v in values)


def _slice(f: Fields, now: float) -> int:
    return math.floor(now / (float(f["window"]) / SLICES))


def _spend(f: Fields, now: float, used: Sequence[float]) -> None:
    for i, name in enumerate(("cost", "input", "output", "calls")):
        f[name] = float(f.get(name, 0.0)) + used[i]
    if "window" in f:
        key = f"s:{_slice(f, now)}"
        old = _four(f[key]) if key in f else [0.0, 0.0, 0.0, 0.0]
        f[key] = _text(old[i] + used[i] for i in range(4))


def _expire(f: Fields, now: float, lease: float, calls: Fields) -> None:
    """Reservations older than ``lease`` count as spent (fail closed); old slices go."""
    current = _slice(f, now) if "window" in f else None
    for key in [k for k in f if k.startswith(("h:", "s:"))]:
        if key.startswith("h:"):
            held = _four(f[key])
            if now - held[0] > lease:
                del f[key]
                _spend(f, now, held[1:])
                calls[key[2:]] = f"d {now!r}"
        elif current is None or int(key[2:]) < current - SLICES:
            del f[key]


def _spent(f: Fields, now: float) -> list[float]:
    if "window" not in f:
        return [float(f.get(n, 0.0)) for n in ("cost", "input", "output", "calls")]
    total = [0.0, 0.0, 0.0, 0.0]
    oldest = _slice(f, now) - SLICES
    for key, value in f.items():
        if key.startswith("s:") and int(key[2:]) >= oldest:
            for i, x in enumerate(_four(value)):
                total[i] += x
    return total


def _held(f: Fields) -> list[float]:
    total = [0.0, 0.0, 0.0, 0.0]
    for key, value in f.items():
        if key.startswith("h:"):
            for i, x in enumerate(_four(value)[1:]):
                total[i] += x
    return total


def scope_limit(f: Fields, limits: ScopeLimits, now: float) -> None:
    """Set a scope's limits. A new window keeps what was spent in the old one (it moves
    into the current slice: never forgotten early)."""
    old_window = f.get("window")
    new_window = limits.window
    if old_window is not None and new_window != float(old_window):
        carried = _spent(f, now)
        for key in [k for k in f if k.startswith("s:")]:
            del f[key]
        if new_window is not None:
            f["window"] = float(new_window)
            f[f"s:{_slice(f, now)}"] = _text(carried)
    for field, value in (
        ("max_cost", limits.max_cost_usd),
        ("max_tokens", limits.max_tokens),
        ("max_calls", limits.max_model_calls),
        ("window", new_window),
    ):
        if value is None:
            f.pop(field, None)
        else:
            f[field] = float(value)


def scopes_reserve(
    calls: Fields,
    scopes: Sequence[tuple[str, Fields]],
    call_id: str,
    need: tuple[float | None, float, float, float],
    now: float,
    lease: float,
) -> Answer:
    """Reserve ``need`` (cost None: the call cannot be priced) in every scope, or none."""
    if call_id in calls:
        return ("again", "", "", 0.0, 0.0)
    for name, f in scopes:
        _expire(f, now, lease, calls)
        if need[0] is None and "max_cost" in f:
            return ("unpriced", name, "max_cost_usd", 0.0, float(f["max_cost"]))
    want = [need[0] or 0.0, need[1], need[2], need[3]]
    nearest: Answer = OK
    for name, f in scopes:
        used = [a + b for a, b in zip(_spent(f, now), _held(f), strict=True)]
        for limit, u, n in (
            ("max_cost", used[0], want[0]),
            ("max_tokens", used[1] + used[2], want[1] + want[2]),
            ("max_calls", used[3], want[3]),
        ):
            if limit in f:
                cap = float(f[limit])
                if u >= cap or u + n > cap + EPSILON:
                    return ("spent", name, limit, u, cap)
                if cap > 0 and (u + n) / cap > share(nearest):
                    nearest = ("ok", name, limit, u + n, cap)
    for _, f in scopes:
        f[f"h:{call_id}"] = _text([now, *want])
    calls[call_id] = f"h {now!r}"
    return nearest


def share(answer: Answer) -> float:
    """The share of its limit the answer's scope has used (0: none named)."""
    return answer[3] / answer[4] if answer[4] > 0 else 0.0


def scopes_settle(
    calls: Fields, scopes: Sequence[tuple[str, Fields]], call_id: str, used: Four, now: float
) -> bool:
    """Count a call's usage in its scopes once (False: counted before), its reservation
    (if any) replaced."""
    state = calls.get(call_id)
    if state is not None and str(state).startswith("d"):
        return False
    for _, f in scopes:
        f.pop(f"h:{call_id}", None)
        _spend(f, now, used)
    calls[call_id] = f"d {now!r}"
    return True


def scopes_release(calls: Fields, scopes: Sequence[tuple[str, Fields]], call_id: str) -> None:
    """Give back a reservation whose call got no reply (a settled call stays counted)."""
    state = calls.get(call_id)
    if state is None or not str(state).startswith("h"):
        return
    for _, f in scopes:
        f.pop(f"h:{call_id}", None)
    del calls[call_id]


def scope_view(f: Fields, now: float, lease: float, calls: Fields) -> dict[str, Any]:
    """A scope as the operator reads it: limits, spent (in its window), held in flight."""
    _expire(f, now, lease, calls)
    spent, held = _spent(f, now), _held(f)
    return {
        "limits": ScopeLimits(
            f.get("max_cost"),
            int(f["max_tokens"]) if "max_tokens" in f else None,
            int(f["max_calls"]) if "max_calls" in f else None,
            f.get("window"),
        ),
        "spent": dict(zip(DIMENSIONS, spent, strict=True)),
        "held": dict(zip(DIMENSIONS, held, strict=True)),
        "in_flight": sum(1 for k in f if k.startswith("h:")),
    }


def prune_calls(calls: Fields, now: float, retention: float) -> None:
    """Forget settled call ids older than ``retention`` (oldest first; stops at a newer one)."""
    for call_id in list(calls):
        state = str(calls[call_id]).split()
        if float(state[1]) >= now - retention:
            break
        if state[0] == "d":
            del calls[call_id]


class ScopeOps(Protocol):
    """A store's budget-scope operations: one round trip each."""

    def limit(self, name: str, limits: ScopeLimits, now: float) -> None: ...
    def reserve(
        self,
        names: Sequence[str],
        call_id: str,
        need: tuple[float | None, float, float, float],
        now: float,
    ) -> Answer: ...
    async def areserve(
        self,
        names: Sequence[str],
        call_id: str,
        need: tuple[float | None, float, float, float],
        now: float,
    ) -> Answer: ...
    def settle(self, names: Sequence[str], call_id: str, used: Four, now: float) -> bool: ...
    async def asettle(self, names: Sequence[str], call_id: str, used: Four, now: float) -> bool: ...
    def release(self, names: Sequence[str], call_id: str) -> None: ...
    def view(self, name: str, now: float) -> dict[str, Any]: ...
    def names(self) -> list[str]: ...
    def wait(self, name: str, run_id: str, checkpoint_id: str) -> None: ...
    def unwait(self, names: Sequence[str], run_id: str) -> None: ...
    def waiting(self, name: str) -> dict[str, str]: ...


class MemoryScopes:
    """Budget scopes in this process's memory, every operation under one lock."""

    def __init__(self, *, lease: float = 600.0, retention: float = 7 * 86_400.0) -> None:
        self.lease, self.retention = float(lease), float(retention)
        self._lock = threading.Lock()
        self._scopes: dict[str, Fields] = {}
        self._calls: Fields = {}
        self._waiting: dict[str, dict[str, str]] = {}

    def _of(self, names: Sequence[str]) -> list[tuple[str, Fields]]:
        return [(n, self._scopes.setdefault(n, {})) for n in names]

    def limit(self, name: str, limits: ScopeLimits, now: float) -> None:
        with self._lock:
            scope_limit(self._scopes.setdefault(name, {}), limits, now)

    def reserve(
        self,
        names: Sequence[str],
        call_id: str,
        need: tuple[float | None, float, float, float],
        now: float,
    ) -> Answer:
        with self._lock:
            return scopes_reserve(self._calls, self._of(names), call_id, need, now, self.lease)

    async def areserve(
        self,
        names: Sequence[str],
        call_id: str,
        need: tuple[float | None, float, float, float],
        now: float,
    ) -> Answer:
        return self.reserve(names, call_id, need, now)

    def settle(self, names: Sequence[str], call_id: str, used: Four, now: float) -> bool:
        with self._lock:
            counted = scopes_settle(self._calls, self._of(names), call_id, used, now)
            prune_calls(self._calls, now, self.retention)
            return counted

    async def asettle(self, names: Sequence[str], call_id: str, used: Four, now: float) -> bool:
        return self.settle(names, call_id, used, now)

    def release(self, names: Sequence[str], call_id: str) -> None:
        with self._lock:
            scopes_release(self._calls, self._of(names), call_id)

    def view(self, name: str, now: float) -> dict[str, Any]:
        with self._lock:
            return scope_view(self._scopes.get(name, {}), now, self.lease, self._calls)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._scopes)

    def wait(self, name: str, run_id: str, checkpoint_id: str) -> None:
        with self._lock:
            self._waiting.setdefault(name, {})[run_id] = checkpoint_id

    def unwait(self, names: Sequence[str], run_id: str) -> None:
        with self._lock:
            for name in names:
                self._waiting.get(name, {}).pop(run_id, None)

    def waiting(self, name: str) -> dict[str, str]:
        with self._lock:
            return dict(self._waiting.get(name, {}))
