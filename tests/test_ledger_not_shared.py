"""A run restored where its ledger cannot see its effects says so once, loudly (#38, case 7):
the restoring guard's ledger is this process's memory, and the effects were made by another
worker (here: another guard, with a ledger of its own, as another process has). With one
ledger for both, nothing is said and the effect is not made again."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import pytest

import tether
from tether import Guard, Ledger


def _first_worker(guard: Guard, paid: list[str]) -> dict[str, Any]:
    """A run that refunds A-1, then pauses: its document, as a checkpoint would keep it."""

    def refund(order: str) -> str:
        paid.append(order)
        return f"re_{len(paid)}"

    with guard.start("refund A-1") as run:
        run.call_tool("refund", refund, {"order": "A-1"}, idempotent=False)
        document = dict(run.snapshot())
    return document


def _second_worker(guard: Guard, document: dict[str, Any], paid: list[str]) -> None:
    """The run restored elsewhere (a fork replayed, a thread picked up by another worker),
    asking for the refund again."""

    def refund(order: str) -> str:
        paid.append(order)
        return f"re_{len(paid)}"

    with guard.restore(document) as run:
        run.call_tool("refund", refund, {"order": "A-1"}, idempotent=False)


def test_a_restore_on_an_in_process_ledger_that_cannot_see_the_effects_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    paid: list[str] = []
    document = _first_worker(Guard(), paid)
    elsewhere = Guard()  # another worker: its ledger is its own process's memory
    with caplog.at_level(logging.ERROR, logger="tether"):
        with pytest.warns(tether.LedgerNotShared, match="same ledger") as said:
            _second_worker(elsewhere, document, paid)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once: a second restore of the run says nothing
            elsewhere.restore(document)
    assert len(said) == 1
    assert "refund" in str(said[0].message) and "Ledger.postgres" in str(said[0].message)
    assert [r.levelname for r in caplog.records if "cannot see" in r.getMessage()] == ["ERROR"]
    assert paid == ["A-1", "A-1"]  # what the warning says: the refund ran again


def test_one_ledger_for_both_workers_says_nothing_and_pays_once(tmp_path: Path) -> None:
    paid: list[str] = []
    path = str(tmp_path / "ledger.db")
    document = _first_worker(Guard(ledger=Ledger.sqlite(path)), paid)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _second_worker(Guard(ledger=Ledger.sqlite(path)), document, paid)
    assert paid == ["A-1"]


def test_the_same_guard_in_the_same_process_says_nothing() -> None:
    paid: list[str] = []
    guard = Guard()
    document = _first_worker(guard, paid)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _second_worker(guard, document, paid)
    assert paid == ["A-1"]
