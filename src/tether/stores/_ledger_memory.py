"""The ledger in this process's memory."""

from __future__ import annotations

import threading
from dataclasses import replace

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
)

__all__ = ["MemoryLedgerBackend"]


class MemoryLedgerBackend:
    #: no I/O: async callers use it directly, not through a worker thread
    in_memory = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, Record] = {}

    def claim(self, record: Record, now: float | None) -> tuple[bool, Record | None]:
        now = system_clock.wall() if now is None else now
        new = record.at(now)
        with self._lock:
            claimed, previous = decide_claim(self._records.get(new.key), new, now)
            if claimed:
                self._records[new.key] = claimed_record(new, previous)
            return claimed, previous

    def get(self, key: str) -> Record | None:
        with self._lock:
            return self._records.get(key)

    def renew(self, key: str, owner: str, lease: float, now: float | None) -> bool:
        now = system_clock.wall() if now is None else now
        with self._lock:
            rec = self._records.get(key)
            if not may_renew(rec, owner):
                return False
            assert rec is not None
            self._records[key] = replace(rec, lease_until=max(rec.lease_until, now + lease))
            return True

    def complete(self, key: str, owner: str, state: State, result: str | None,
                 error: str | None) -> Completion:  # fmt: skip
        with self._lock:
            rec = self._records.get(key)
            verdict = decide_complete(rec, owner)
            if verdict is Completion.RECORDED:
                assert rec is not None
                self._records[key] = replace(rec, state=state, result=result, error=error)
            return verdict

    def mark_unknown(
        self, key: str, owner: str, detail: str, now: float | None, keep_lease: bool = False
    ) -> None:
        now = system_clock.wall() if now is None else now
        with self._lock:
            rec = self._records.get(key)
            if rec is not None and rec.state is State.PENDING and rec.owner == owner:
                until = rec.lease_until if keep_lease else min(rec.lease_until, now)
                self._records[key] = replace(rec, state=State.UNKNOWN, detail=detail,
                                             lease_until=until)  # fmt: skip

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
