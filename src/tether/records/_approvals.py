"""Approval records: one call that needs (or had) a person's decision, kept in the
checkpoints' document store so that it survives a restart with its run."""

from __future__ import annotations

import enum
import json
import logging
from dataclasses import asdict, replace
from typing import Any

from tether import _digest
from tether._errors import TetherError
from tether._frozen import Value, frozen_dataclass

__all__ = [
    "APPROVED",
    "PENDING",
    "REJECTED",
    "USED",
    "ApprovalError",
    "ApprovalRecord",
    "ApprovalStatus",
    "Approvals",
    "approval_id",
]

_log = logging.getLogger("tether")


class ApprovalStatus(enum.StrEnum):
    """An approval's status; the values are what the records keep (and compare equal to them).

    ``pending`` -> ``approved`` or ``rejected`` (a person's decision) -> ``used`` (the run
    made the approved call, once)."""

    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    USED = "used"


PENDING, APPROVED, REJECTED, USED = (
    ApprovalStatus.PENDING,
    ApprovalStatus.APPROVED,
    ApprovalStatus.REJECTED,
    ApprovalStatus.USED,
)


class ApprovalError(TetherError, ValueError):
    """An approval that cannot be given: no such checkpoint, nothing pending, decided already."""


@frozen_dataclass
class ApprovalRecord(Value):
    """One call that needs (or had) a person's decision."""

    id: str
    run_id: str
    tool: str
    args: Any  # redacted: what the approver sees
    key: str  # the intent the approval covers
    status: ApprovalStatus  # given as its text ("pending") or a member
    requested_at: float
    checkpoint_id: str | None = None
    task: str = ""
    decided_by: str | None = None
    decided_at: float | None = None
    note: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.status, ApprovalStatus):
            try:
                status = ApprovalStatus(self.status)
            except ValueError:
                raise ValueError(
                    f"status must be one of {[s.value for s in ApprovalStatus]}, "
                    f"got {self.status!r}"
                ) from None
            object.__setattr__(self, "status", status)

    def to_doc(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> ApprovalRecord:
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})


def approval_id(run_id: str, key: str, request: str | None = None) -> str:
    """One approval per intent per run, and per request when the run serves one it was
    given (``key=``, a conversation): a document edited to another run's id, its request
    left as it was, finds no approval of that run."""
    bound = run_id if request in (None, f"run:{run_id}") else f"{run_id}\x00{request}"
    return "apr_" + _digest.sha256(f"{bound}\x00{key}".encode()).hexdigest()[:24]


class Approvals:
    """Approval records in a document store (the checkpoints' store: SQLite, PostgreSQL,
    memory), so that they survive a restart with the run they belong to."""

    def __init__(self, store: Any) -> None:
        from tether.stores._documents import DocKind  # loaded with the first store

        self.store = store
        self.kind = DocKind.APPROVAL

    def get(self, record_id: str) -> ApprovalRecord | None:
        text = self.store.get(self.kind, record_id)
        return None if text is None else ApprovalRecord.from_doc(json.loads(text))

    def put(self, record: ApprovalRecord, at: float) -> None:
        self.store.put(self.kind, record.id, record.to_doc(), at)

    def list(self, limit: int = 50) -> list[ApprovalRecord]:
        """The newest records first (the operator's inbox: pending ones to decide)."""
        return [
            ApprovalRecord.from_doc(json.loads(t)) for _, t in self.store.list(self.kind, limit)
        ]

    def decide(
        self, record_id: str, status: ApprovalStatus | str, by: str, note: str, at: float
    ) -> ApprovalRecord:
        record = self.get(record_id)
        if record is None:
            raise ApprovalError(f"no approval {record_id!r} in this store")
        if record.status != PENDING:
            raise ApprovalError(
                f"approval {record_id!r} was already {record.status}"
                + (f" by {record.decided_by}" if record.decided_by else "")
            )
        decided = replace(
            record, status=ApprovalStatus(status), decided_by=by, decided_at=at, note=note
        )
        self.put(decided, at)
        _log.info("tether: %s %s (%s) by %s", record.tool, status, record_id, by)
        return decided
