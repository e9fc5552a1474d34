"""The ledger's records and the rules every ledger backend applies atomically.

Pure data and decisions, no I/O: the memory and SQLite backends call these functions
under their lock or transaction; the Redis backend runs their Lua twins; the
PostgreSQL backend runs them under a row lock. Backends depend on this module only,
never on the :class:`tether.Ledger` that uses them.

A claim is owned by one ``owner`` token (a fresh UUID per claim), which is also the
fencing token: only the owner may renew, complete, mark unknown or release it, so a
worker that lost its claim can never overwrite the record of the worker that took it
over. ``lease_until`` says until when the owner is known to be alive; the owner
renews it while the effect runs (the heartbeat), and a takeover is possible only
once it has run out.
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple, Protocol

__all__ = [
    "COLUMNS",
    "Completion",
    "LedgerBackend",
    "Record",
    "Settlement",
    "State",
    "decide_claim",
    "decide_complete",
    "may_mark_unknown",
    "may_release",
    "may_renew",
    "renewed",
    "settled",
    "unknown_at",
]


class State(enum.Enum):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"
    UNKNOWN = "unknown"


class Completion(enum.Enum):
    """What became of a ``complete`` call."""

    RECORDED = "recorded"
    MISSING = "missing"  # the store no longer has the record (a Redis that forgot it)
    LOST = "lost"  # another worker took the claim over: the owner was fenced off
    FINAL = "final"  # the record was already DONE or FAILED


COLUMNS = (
    "key",
    "state",
    "payload_hash",
    "owner",
    "lease_until",
    "expires_at",
    "created_at",
    "result",
    "error",
    "detail",
    "attempts",
)
FINAL = (State.DONE, State.FAILED)
LIVE = (State.PENDING, State.UNKNOWN)


class Record(NamedTuple):
    """One effect's entry in the ledger (immutable).

    A named tuple rather than a frozen dataclass: three are built for every effect (the
    claim, the stored claim, the settled record), and a tuple is built in a third of the
    time. Read its fields by name; ``_replace`` makes a changed copy.
    """

    key: str
    state: State
    payload_hash: str | None
    owner: str
    lease_until: float
    expires_at: float
    created_at: float
    result: str | None = None  # the codec's text
    error: str | None = None  # JSON: {"type", "module", "message"}
    detail: str = ""
    attempts: int = 1

    def to_row(self) -> dict[str, Any]:
        row = dict(zip(COLUMNS, self, strict=True))
        row["state"] = self.state.value
        return row

    def values(self) -> tuple[Any, ...]:
        """The record's columns in the order of :data:`COLUMNS`, its state as text."""
        return (self.key, self.state.value, *self[2:])

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Record:
        return cls(
            key=str(row["key"]),
            state=State(row["state"]),
            payload_hash=row.get("payload_hash") or None,
            owner=str(row.get("owner") or ""),
            lease_until=float(row.get("lease_until") or 0.0),
            expires_at=float(row.get("expires_at") or 0.0),
            created_at=float(row.get("created_at") or 0.0),
            result=row.get("result"),
            error=row.get("error"),
            detail=str(row.get("detail") or ""),
            attempts=int(row.get("attempts") or 1),
        )

    @classmethod
    def from_values(cls, values: Any) -> Record:
        """A record from a row of :data:`COLUMNS`, as a database returns it."""
        return cls.from_row(dict(zip(COLUMNS, values, strict=True)))

    @classmethod
    def claim_of(
        cls, key: str, payload_hash: str | None, owner: str, lease: float, ttl: float
    ) -> Record:
        """A new claim, its times relative to the moment the backend stores it: its lease
        runs ``lease`` seconds and the record lives ``ttl`` seconds past that."""
        fields = (
            key,
            State.PENDING,
            payload_hash,
            owner,
            lease,
            lease + ttl,
            0.0,
            None,
            None,
            "",
            1,
        )
        return _build(cls, fields)

    def at(self, now: float) -> Record:
        """This claim with its relative times made absolute at ``now``."""
        # unpacked at once: cheaper than reading eleven fields by name
        key, state, payload, owner, lease, expires, _, result, error, detail, tries = self
        return _build(
            Record,
            (
                key,
                state,
                payload,
                owner,
                now + lease,
                now + expires,
                now,
                result,
                error,
                detail,
                tries,
            ),
        )


#: a record from all its fields at once, without the keyword handling of a named tuple's
#: constructor (three are built for every effect: the claim, the stored claim, the settled)
_build = tuple.__new__


class Settlement(NamedTuple):
    """What the owner of a claim settles it with: DONE or FAILED (``complete``), or
    UNKNOWN (``mark_unknown``: ``detail`` says why; ``keep_lease`` for an abandoned
    attempt that still runs and renews its lease). ``now`` as in :class:`LedgerBackend`."""

    key: str
    owner: str
    state: State
    now: float | None
    ttl: float
    result: str | None = None
    error: str | None = None
    detail: str = ""
    keep_lease: bool = False


def decide_claim(
    existing: Record | None, new: Record, now: float
) -> tuple[bool, Record | None, Record | None]:
    """The claim rule: (claimed, previous record, the record to store or None).

    Claimed with no previous record for a fresh effect (``new`` is stored), or for a
    repeat of the owner's own claim after a lost reply (nothing is stored: it holds the
    claim already); claimed with the previous record for a takeover (an UNKNOWN or PENDING
    record whose owner stopped renewing its lease: reconcile first; ``new`` is stored, one
    attempt more); or not claimed, with the current record (nothing is stored).
    """
    if existing is None or existing.expires_at <= now:
        return True, None, new
    if existing.owner == new.owner and existing.state is State.PENDING:
        return True, None, None
    same_intent = existing.payload_hash in (None, new.payload_hash) or not new.payload_hash
    if existing.state in LIVE and existing.lease_until <= now and same_intent:
        return True, existing, new._replace(attempts=existing.attempts + 1)
    return False, existing, None


def decide_complete(existing: Record | None, owner: str) -> Completion:
    """May ``owner`` settle this record? (fencing: only the claim's owner may)."""
    if existing is None:
        return Completion.MISSING
    if existing.owner != owner:
        return Completion.LOST
    if existing.state in FINAL:
        return Completion.FINAL
    return Completion.RECORDED


def may_renew(existing: Record | None, owner: str) -> bool:
    """The owner renews its lease while its effect runs (PENDING, or UNKNOWN after a
    timeout while the abandoned attempt is still running)."""
    return existing is not None and existing.state in LIVE and existing.owner == owner


def renewed(existing: Record, now: float, lease: float, ttl: float) -> Record:
    """The owner's record with its lease renewed to ``now + lease`` (never shortened);
    the record lives ``ttl`` past the new lease."""
    until = max(existing.lease_until, now + lease)
    return existing._replace(lease_until=until, expires_at=max(existing.expires_at, until + ttl))


def settled(existing: Record, s: Settlement, now: float) -> Record:
    """The record DONE or FAILED at ``now``: remembered ``s.ttl`` from now on."""
    # built directly, not with _replace, its fields unpacked at once: this runs on every effect
    key, _, payload_hash, owner, lease_until, _, created_at, _, _, detail, attempts = existing
    kept = (key, s.state, payload_hash, owner, lease_until, now + s.ttl, created_at)
    return _build(Record, (*kept, s.result, s.error, detail, attempts))


def unknown_at(existing: Record, s: Settlement, now: float) -> Record:
    """The record UNKNOWN at ``now``: its lease released (ends now) unless ``s.keep_lease``
    (an abandoned attempt still running renews it); remembered ``s.ttl`` past its lease."""
    until = existing.lease_until if s.keep_lease else min(existing.lease_until, now)
    expires = max(until, now) + s.ttl
    return existing._replace(
        state=State.UNKNOWN, detail=s.detail, lease_until=until, expires_at=expires
    )


def may_mark_unknown(existing: Record | None, owner: str) -> bool:
    """Only the owner's PENDING claim becomes UNKNOWN (a settled record stays settled)."""
    return existing is not None and existing.state is State.PENDING and existing.owner == owner


def may_release(existing: Record | None, owner: str) -> bool:
    """A PENDING claim is deleted by its owner when the effect provably did not happen."""
    return existing is not None and existing.state is State.PENDING and existing.owner == owner


class LedgerBackend(Protocol):
    """The atomic primitives a ledger store provides.

    ``now`` is the time of the ledger's clock, or None: then the backend uses its own
    clock (the server's, for Redis and PostgreSQL), so that leases are measured on one
    clock for the whole fleet.
    """

    def claim(self, record: Record, now: float | None) -> tuple[bool, Record | None]:
        """Insert ``record.at(now)`` (PENDING; built by :meth:`Record.claim_of`) or take
        over a reclaimable one, per :func:`decide_claim`."""
        ...

    def get(self, key: str) -> Record | None: ...

    def renew(self, key: str, owner: str, lease: float, now: float | None, ttl: float) -> bool:
        """Extend the owner's lease to ``now + lease`` (:func:`renewed`); False if the owner
        lost its claim."""
        ...

    def complete(self, s: Settlement) -> Completion:
        """Set DONE or FAILED (:func:`settled`), if ``s.owner`` still holds the claim (see
        :func:`decide_complete`)."""
        ...

    def mark_unknown(self, s: Settlement) -> None:
        """PENDING -> UNKNOWN (:func:`unknown_at`), if ``s.owner`` still holds the claim
        (:func:`may_mark_unknown`); its lease is released unless ``s.keep_lease``."""
        ...

    def release(self, key: str, owner: str) -> None:
        """Delete a PENDING record held by ``owner`` (nothing happened)."""
        ...

    def forget(self, key: str) -> None:
        """Delete a record whatever its state."""
        ...

    def records(self, state: State | None = None, limit: int = 100) -> list[Record]: ...

    def close(self) -> None: ...
