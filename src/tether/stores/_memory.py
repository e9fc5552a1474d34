"""The default store: this process's memory, thread-safe and asyncio-safe."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from tether.stores import _logic
from tether.stores._logic import CLOSED, HALF_OPEN, OPEN, BreakerConfig, LimiterConfig

if TYPE_CHECKING:
    from tether.stores._tokens import MemoryTokens

__all__ = ["MemoryStore"]

#: the answers of a closed breaker's fast paths (a call's permit; a success recorded)
_CLOSED_CALL = (CLOSED, CLOSED, 0.0, _logic.CALL)
_STILL_CLOSED = (CLOSED, CLOSED, 0.0)


class MemoryStore:
    """Guard state in a dict, every operation under one lock (none of them awaits)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, dict[str, Any]] = {}
        self._configs: dict[str, str] = {}  # "kind:name" -> its configuration (see bind)
        self._tokens: MemoryTokens | None = None  # made with the first token budget
        # "breaker:<name>" per breaker name, made once: the closed breaker's fast paths
        # (twice per guarded call) look their state up without building the key
        self._breaker_keys: dict[str, str] = {}

    def _fields(self, kind: str, name: str) -> dict[str, Any]:
        return self._data.setdefault(f"{kind}:{name}", {})

    def bind(self, kind: str, name: str, config: str) -> str | None:
        """Keep ``config`` for ``kind:name`` if it has none; the other one if it differs."""
        with self._lock:
            known = self._configs.setdefault(f"{kind}:{name}", config)
        return None if known == config else known

    def _breaker_key(self, name: str) -> str:
        """The data key of breaker ``name`` (kept: as many as there are breaker names)."""
        key = self._breaker_keys[name] = f"breaker:{name}"
        return key

    def breaker_acquire(
        self, name: str, now: float, cfg: BreakerConfig
    ) -> tuple[str, str, float, str]:
        key = self._breaker_keys.get(name) or self._breaker_key(name)
        f = self._data.get(key)
        if f is not None and f.get("state") == CLOSED:  # a read needs no lock (the GIL)
            return _CLOSED_CALL
        with self._lock:
            return _logic.breaker_acquire(self._fields("breaker", name), now, cfg)

    def breaker_record(
        self, name: str, now: float, permit: str, failed: bool, cfg: BreakerConfig
    ) -> tuple[str, str, float]:
        key = self._breaker_keys.get(name) or self._breaker_key(name)
        f = self._data.get(key)
        if (
            not failed
            and f is not None
            and f.get("state") == CLOSED
            and not f.get("failures")
            and not cfg.window
        ):
            return _STILL_CLOSED  # a success with nothing to reset
        with self._lock:
            return _logic.breaker_record(self._fields("breaker", name), now, permit, failed, cfg)

    def breaker_state(self, name: str, now: float) -> tuple[str, float]:
        with self._lock:
            f = self._fields("breaker", name)
            state, retry_at = f.get("state", CLOSED), f.get("retry_at", 0.0)
        if state == OPEN and now >= retry_at:
            return HALF_OPEN, retry_at
        return state, retry_at

    def budget_spend(self, name: str, capacity: float, cost: float) -> tuple[bool, float]:
        with self._lock:
            return _logic.budget_spend(self._fields("budget", name), capacity, cost)

    def budget_refund(self, name: str, capacity: float, amount: float) -> float:
        with self._lock:
            return _logic.budget_refund(self._fields("budget", name), capacity, amount)

    def budget_tokens(self, name: str, capacity: float) -> float:
        with self._lock:
            return float(self._fields("budget", name).get("tokens", capacity))

    def limiter_acquire(self, name: str, now: float, cfg: LimiterConfig) -> tuple[float, bool]:
        with self._lock:
            return _logic.limiter_acquire(self._fields("limiter", name), now, cfg)

    def limiter_feedback(self, name: str, now: float, outcome: str, cfg: LimiterConfig) -> float:
        with self._lock:
            return _logic.limiter_feedback(self._fields("limiter", name), now, outcome, cfg)

    def reset(self, name: str | None = None) -> None:
        """Forget the state of one name (every kind), or of everything."""
        with self._lock:
            if name is None:
                self._data.clear()
                self._configs.clear()
            else:
                for kind in ("breaker", "budget", "limiter", "token budget"):
                    self._data.pop(f"{kind}:{name}", None)
                    self._configs.pop(f"{kind}:{name}", None)
        if self._tokens is not None:
            self._tokens.reset(name)

    def tokens(self) -> MemoryTokens:
        """The token budgets' operations (:class:`tether.TokenBudget`)."""
        if self._tokens is None:
            from tether.stores._tokens import MemoryTokens  # loaded with the first budget

            with self._lock:
                if self._tokens is None:
                    self._tokens = MemoryTokens()
        return self._tokens

    def __repr__(self) -> str:
        return "MemoryStore()"


default_store = MemoryStore()
