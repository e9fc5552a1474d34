"""The ledger in this process's memory."""

from __future__ import annotations

import threading

from tether.clock import system_clock
from tether.stores._ledger_logic import (
    Completion,
    Record,
    State,
    claimed_record,
    decide_claim,
    decide_complete,
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
        self._epoch = system_clock.wall() - system_clock.now()

    def _time(self, now: float | None) -> float:
        return self._epoch + system_clock.now() if now is None else now

    def claim(self, record: Record, now: float | None) -> tuple[bool, Record | None]:
        now = self._time(now)
        new = record.at(now)
        with self._lock:
            claimed, previous = decide_claim(self._records.get(new.key), new, now)
            if claimed:  # a fresh claim is stored as it came (claimed_record would copy it)
                fresh = previous is None and new.attempts == 1
                self._records[new.key] = new if fresh else claimed_record(new, previous)
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

    def complete(
        self,
        key: str,
        owner: str,
        state: State,
        result: str | None,
        error: str | None,
        now: float | None,
        ttl: float,
    ) -> Completion:
        now = self._time(now)
        with self._lock:
            rec = self._records.get(key)
            verdict = decide_complete(rec, owner)
            if verdict is Completion.RECORDED:
                assert rec is not None
                self._records[key] = settled(rec, state, result, error, now, ttl)
            return verdict

    def mark_unknown(
        self,
        key: str,
        owner: str,
        detail: str,
        now: float | None,
        ttl: float,
        keep_lease: bool = False,
    ) -> None:
        now = self._time(now)
        with self._lock:
            rec = self._records.get(key)
            if rec is not None and rec.state is State.PENDING and rec.owner == owner:
                self._records[key] = unknown_at(rec, detail, now, ttl, keep_lease)

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
