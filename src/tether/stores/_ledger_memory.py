"""The ledger in this process's memory."""

from __future__ import annotations

import threading
from dataclasses import replace

from tether._effects import Record, State, decide_claim

__all__ = ["MemoryLedgerBackend"]

_FINAL = (State.DONE, State.FAILED)


class MemoryLedgerBackend:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, Record] = {}

    def claim(self, record: Record, now: float) -> tuple[bool, Record | None]:
        with self._lock:
            existing = self._records.get(record.key)
            claimed, previous = decide_claim(existing, record, now)
            if claimed:
                attempts = previous.attempts + 1 if previous else 1
                self._records[record.key] = replace(record, attempts=attempts)
            return claimed, previous

    def get(self, key: str) -> Record | None:
        with self._lock:
            return self._records.get(key)

    def complete(self, key: str, owner: str, state: State, result: str | None,
                 error: str | None, now: float) -> None:  # fmt: skip
        with self._lock:
            rec = self._records.get(key)
            if rec is not None and rec.state not in _FINAL:
                self._records[key] = replace(rec, state=state, result=result, error=error)

    def mark_unknown(self, key: str, owner: str, detail: str) -> None:
        with self._lock:
            rec = self._records.get(key)
            if rec is not None and rec.state is State.PENDING and rec.owner == owner:
                self._records[key] = replace(rec, state=State.UNKNOWN, detail=detail)

    def release(self, key: str, owner: str) -> None:
        with self._lock:
            rec = self._records.get(key)
            if rec is not None and rec.state is State.PENDING and rec.owner == owner:
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
