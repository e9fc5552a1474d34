"""The closed sets of the stores and records are enums whose values are what is stored."""

from __future__ import annotations

import json

import pytest

import tether
from tether.records._approvals import ApprovalRecord, ApprovalStatus
from tether.records._collections import CaseState
from tether.stores._documents import DocKind
from tether.stores._logic import BreakerState, LimiterOutcome, Permit


@pytest.mark.parametrize(
    ("enum", "stored"),
    [
        (BreakerState, ["closed", "open", "half_open"]),
        (Permit, ["call", "probe", "deny"]),
        (LimiterOutcome, ["ok", "throttled", "failed"]),
        (ApprovalStatus, ["pending", "approved", "rejected", "used"]),
        (CaseState, ["open", "claimed", "resolved"]),
        (DocKind, ["checkpoint", "approval", "handoff", "dead_letter", "run"]),
    ],
)
def test_values_are_the_stored_strings(enum: type, stored: list[str]) -> None:
    """Each member equals, formats and encodes as the string written before the enums."""
    members = list(enum)  # type: ignore[call-overload]
    assert [m.value for m in members] == stored
    assert [f"{m}" for m in members] == stored
    assert json.dumps(members) == json.dumps(stored)
    assert [enum(s) for s in stored] == members


def test_an_approval_read_back_has_its_status_as_a_member() -> None:
    """A record built from stored JSON (strings) holds the enum, and writes the same JSON."""
    doc = {
        "id": "apr_1",
        "run_id": "r",
        "tool": "refund",
        "args": {},
        "key": "k",
        "status": "approved",
        "requested_at": 1.0,
    }
    record = ApprovalRecord.from_doc(doc)
    assert record.status is ApprovalStatus.APPROVED
    assert record.status == "approved"
    written = json.loads(json.dumps(record.to_doc()))
    assert {k: written[k] for k in doc} == doc  # the same JSON as the strings gave
    assert type(written["status"]) is str


def test_an_approval_with_an_unknown_status_is_refused() -> None:
    """Bad input: the error names the field and the values it may take."""
    with pytest.raises(ValueError, match=r"status must be one of \['pending', 'approved'"):
        ApprovalRecord("apr_1", "r", "refund", {}, "k", "maybe", 1.0)


def test_a_breaker_reports_its_state_as_a_member() -> None:
    """``CircuitBreaker.state`` compares equal to the strings users wrote before."""
    breaker = tether.CircuitBreaker("closed-sets", failure_threshold=1)
    assert breaker.state == "closed"
    assert isinstance(breaker.state, BreakerState)
