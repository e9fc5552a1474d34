"""The heartbeat: the leases of running effects renewed from one daemon thread.

Each lease is renewed every third of its length while its effect runs. An effect
shorter than that costs one dict insert and one removal under a lock: the thread is
not woken for it, since its first renewal falls after the thread's next look anyway
(while idle, the thread looks every ``IDLE_TICK`` seconds). The thread is woken only
for an effect that needs renewing sooner than that, so a stream of short effects costs
it nothing. A renewal the store
refuses means another worker took the claim over: it is logged, and the effect's result
will be refused when it tries to record it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from tether.stores._ledger_logic import LedgerBackend

__all__ = ["Heartbeat", "heartbeat"]

_log = logging.getLogger("tether")
#: how often the thread looks while no effect runs (an effect whose first renewal is due
#: later than that never wakes it)
IDLE_TICK = 5.0


class Heartbeat:
    """Renews the leases of the effects this process is running."""

    def __init__(self) -> None:
        # owner (a fresh token per claim) -> [backend, ttl, key, lease, next renewal due]
        self._active: dict[str, list[Any]] = {}
        self._lock = threading.Lock()  # add and remove take it directly (the cheaper way)
        self._cond = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._wake_at = 0.0  # when the thread looks next

    def add(self, backend: LedgerBackend, ttl: float, key: str, owner: str, lease: float) -> None:
        due = time.monotonic() + lease / 3
        # a dict insert is atomic: the lock is taken only to start or wake the thread
        self._active[owner] = [backend, ttl, key, lease, due]
        if due < self._wake_at or self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._loop, name="tether-lease-heartbeat", daemon=True
                    )
                    self._thread.start()
                elif due < self._wake_at:
                    self._cond.notify()

    def remove(self, owner: str) -> None:
        self._active.pop(owner, None)  # atomic; the thread reads a copy under its lock

    def _loop(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                active = list(self._active.items())
                due = [(o, e) for o, e in active if e[4] <= now]
                if not due:
                    soon = min((e[4] for _, e in active), default=now + IDLE_TICK)
                    self._wake_at = soon
                    self._cond.wait(soon - now)
                    self._wake_at = 0.0  # awake: an add need not notify
                    continue
                for _, entry in due:
                    entry[4] = now + entry[3] / 3
            for owner, (backend, ttl, key, lease, _) in due:
                self._renew(backend, ttl, key, owner, lease)

    def _renew(
        self, backend: LedgerBackend, ttl: float, key: str, owner: str, lease: float
    ) -> None:
        try:
            kept = backend.renew(key, owner, lease, None, ttl)
        except Exception as exc:  # try again at the next beat
            _log.warning("tether: effect %s…: lease renewal failed: %s", key[:16], exc)
            return
        if not kept:
            _log.error(
                "tether: effect %s…: lost its claim while running (another worker "
                "took it over, or the store forgot it)",
                key[:16],
            )
            self.remove(owner)


#: the process's heartbeat, shared by every ledger on a real clock
heartbeat = Heartbeat()
