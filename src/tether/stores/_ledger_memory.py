"""The ledger in this process's memory."""

from __future__ import annotations

import os
import threading
import time

from tether.clock import system_clock
from tether.stores._ledger_logic import (
    Completion,
    Record,
    Settlement,
    State,
    decide_claim,
    decide_complete,
    may_mark_unknown,
    may_release,
    may_renew,
    renewed,
    settled,
    unknown_at,
)

__all__ = ["MemoryLedgerBackend"]


class MemoryLedgerBackend:
    """Records in a dict under one lock.

    Leases and expiries are measured on the monotonic clock, read as seconds since the
    epoch from the moment the backend was made: stepping the system clock (NTP, a
    suspended laptop) never ends a lease early or keeps a record late, and the records'
    times still read as dates.
    """

    #: no I/O: async callers use it directly, not through a worker thread
    in_memory = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, Record] = {}
        #: names this ledger in the run documents written on it: a run restored on another
        #: in-process ledger is told its effects may be made again (tether.LedgerNotShared)
        self.identity = os.urandom(16).hex()
        self._epoch = system_clock.wall() - system_clock.now()

    def _time(self, now: float | None) -> float:
        return self._epoch + time.monotonic() if now is None else now

    def claim(self, record: Record, now: float | None) -> tuple[bool, Record | None]:
        new = record.at(self._epoch + time.monotonic() if now is None else now)
        key = new.key
        with self._lock:
            existing = self._records.get(key)
            if existing is None:  # a fresh key: decide_claim's first rule, without the call
                self._records[key] = new
                return True, None
            claimed, previous, store = decide_claim(existing, new, new.created_at)
            if store is not None:
                self._records[key] = store
            return claimed, previous

    def get(self, key: str) -> Record | None:
        with self._lock:
            return self._records.get(key)

    def renew(self, key: str, owner: str, lease: float, now: float | None, ttl: float) -> bool:
        now = self._time(now)
        with self._lock:
            rec = self._records.get(key)
            if not may_renew(rec, owner):
                return False
            assert rec is not None
            self._records[key] = renewed(rec, now, lease, ttl)
            return True

    def complete(self, s: Settlement) -> Completion:
        now = self._epoch + time.monotonic() if s.now is None else s.now
        with self._lock:
            rec = self._records.get(s.key)
            verdict = decide_complete(rec, s.owner)
            if verdict is Completion.RECORDED:
                assert rec is not None
                self._records[s.key] = settled(rec, s, now)
            return verdict

    def mark_unknown(self, s: Settlement) -> None:
        now = self._time(s.now)
        with self._lock:
            rec = self._records.get(s.key)
            if may_mark_unknown(rec, s.owner):
                assert rec is not None
                self._records[s.key] = unknown_at(rec, s, now)

    def release(self, key: str, owner: str) -> None:
        with self._lock:
            if may_release(self._records.get(key), owner):
                del self._records[key]

    def forget(self, key: str) -> None:
        with self._lock:
            self._records.pop(key, None)

    def records(self, state: State | None = None, limit: int = 100) -> list[Record]:
        with self._lock:
            found = [r for r in self._records.values() if state is None or r.state is state]
        return sorted(found, key=lambda r: r.created_at)[:limit]

    def close(self) -> None:
        pass
