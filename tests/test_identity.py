"""One identity per effect: what an approval covers, which runs are one request, one dead
letter per intent, honest losers among workers that resume one checkpoint."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

import tether
from tether import Checkpoints, Guard, Ledger, StopReason, ToolError


class Payments:
    """A payment provider's records: every transfer it made."""

    def __init__(self) -> None:
        self.made: list[dict[str, Any]] = []

    def pay(self, to: dict[str, Any], amount: int, **_: Any) -> dict[str, Any]:
        self.made.append({"to": to, "amount": amount})
        return {"id": f"tr_{len(self.made)}"}


def places(kind: str, tmp_path: Path, pg_dsn: str | None = None) -> dict[str, Any]:
    """A durable ledger and checkpoints store of one kind (the same database for both)."""
    if kind == "sqlite":
        db = str(tmp_path / "tether.db")
        return {"ledger": Ledger.sqlite(db), "checkpoints": Checkpoints.sqlite(db)}
    assert pg_dsn is not None
    table = f"t_{uuid.uuid4().hex[:8]}"
    return {"ledger": Ledger.postgres(pg_dsn, table=f"{table}_ledger"),
            "checkpoints": Checkpoints.postgres(pg_dsn, table=f"{table}_docs")}  # fmt: skip


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """Makes guard settings on SQLite and on the real PostgreSQL server."""
    dsn = request.getfixturevalue("pg_dsn") if request.param == "postgres" else None
    made: list[dict[str, Any]] = []

    def make() -> dict[str, Any]:
        if not made:
            made.append(places(request.param, tmp_path, dsn))
        return made[0]

    yield make
    for found in made:
        found["ledger"].close()
        found["checkpoints"].close()


# --- case 1: an approval covers exactly the arguments the person saw ---------------------------


@pytest.mark.parametrize("field", ["uuid", "nonce", "idempotency_key"])
def test_an_approval_never_pays_another_payee_named_by_a_nested_field(
    backend: Any, field: str
) -> None:
    """Approving pay(to={field: acct-1}) does not let pay(to={field: acct-2}) run."""
    payments = Payments()
    guard = Guard(**backend())
    with guard.start(task="pay acct-1") as run:
        run.call_tool("pay", payments.pay, {"to": {field: "acct-1"}, "amount": 9000},
                      idempotent=False, requires_approval=True)  # fmt: skip
    guard.approve(run.outcome.checkpoint_id, by="alice")
    with guard.resume(run.outcome.checkpoint_id) as resumed:
        resumed.call_tool("pay", payments.pay, {"to": {field: "acct-2"}, "amount": 9000,
                          "request_id": uuid.uuid4().hex}, idempotent=False, requires_approval=True)  # fmt: skip
    assert payments.made == []  # 0 executions: acct-2 was never approved
    assert resumed.outcome.stopped_because is StopReason.AWAITING_APPROVAL
    assert resumed.outcome.pending_approval is not None
    assert resumed.outcome.pending_approval["args"]["to"] == {field: "acct-2"}


def test_an_approval_covers_the_call_reissued_with_a_fresh_top_level_request_id(
    backend: Any,
) -> None:
    """The model re-issues the approved call with a new top-level uuid: it is the same intent."""
    payments = Payments()
    guard = Guard(**backend())
    call = {"to": {"uuid": "acct-1"}, "amount": 9000}
    with guard.start(task="pay") as run:
        run.call_tool("pay", payments.pay, {**call, "uuid": "u-1"}, idempotent=False,
                      requires_approval=True)  # fmt: skip
    guard.approve(run.outcome.checkpoint_id, by="alice")
    with guard.resume(run.outcome.checkpoint_id) as resumed:
        resumed.succeed(resumed.call_tool("pay", payments.pay, {**call, "uuid": "u-2"},
                                          idempotent=False, requires_approval=True))  # fmt: skip
    assert payments.made == [{"to": {"uuid": "acct-1"}, "amount": 9000}]
    assert resumed.outcome.status == "success"


@pytest.mark.parametrize("field", ["uuid", "nonce", "idempotency_key"])
def test_two_transfers_to_two_payees_both_run(field: str) -> None:
    """A second transfer whose payee differs in a nested id field is not a duplicate."""
    payments = Payments()
    with Guard().start(task="pay two people") as run:
        for payee in ("acct-1", "acct-2"):
            run.call_tool("pay", payments.pay, {"to": {field: payee}, "amount": 10,
                          "uuid": uuid.uuid4().hex}, idempotent=False)  # fmt: skip
        run.succeed()
    assert [m["to"][field] for m in payments.made] == ["acct-1", "acct-2"]


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_tool_declares_its_own_volatile_paths(shell: str) -> None:
    """volatile=["meta.nonce"]: a fresh nested nonce is the same intent; the payee is not."""
    import asyncio

    payments = Payments()
    run = Guard().start(task="pay")

    def pay(to: dict[str, Any], amount: int, meta: dict[str, Any]) -> Any:
        return payments.pay(to, amount)

    def call(payee: str) -> Any:
        args = {"to": {"account": payee}, "amount": 10, "meta": {"nonce": uuid.uuid4().hex}}
        if shell == "sync":
            return run.call_tool("pay", pay, args, idempotent=False, volatile=["meta.nonce"])
        return asyncio.run(
            run.acall_tool("pay", pay, args, idempotent=False, volatile=["meta.nonce"])
        )

    with run:
        assert call("acct-1") == call("acct-1") == {"id": "tr_1"}  # the re-issue is replayed
        assert call("acct-2") == {"id": "tr_2"}
        run.succeed()
    assert len(payments.made) == 2
    with pytest.raises(TypeError, match="list of paths"):
        Guard().start().call_tool("pay", pay, {}, volatile="meta.nonce")  # type: ignore[arg-type]


def test_a_tool_set_declares_volatile_paths_and_refuses_a_bad_one() -> None:
    """tether.Tool(volatile=[...]) checks its paths when it is made."""
    from tether.integrations._common import Tool

    assert Tool("pay", lambda to: to, volatile=["meta.nonce"]).volatile == ("meta.nonce",)
    with pytest.raises(ValueError, match="volatile path"):
        Tool("pay", lambda to: to, volatile=["meta..nonce"])
    with pytest.raises(TypeError, match="list of paths"):
        Tool("pay", lambda to: to, volatile="meta.nonce")  # type: ignore[arg-type]


def test_a_rejection_still_reaches_the_model() -> None:
    """(sanity) a nested-field change after a rejection is asked again, not rejected."""
    payments = Payments()
    guard = Guard(checkpoints=Checkpoints.memory())
    with guard.start() as run:
        run.call_tool(
            "pay", payments.pay, {"to": {"uuid": "a"}, "amount": 1}, requires_approval=True
        )
    guard.reject(run.outcome.checkpoint_id, by="bob", reason="no")
    with guard.resume(run.outcome.checkpoint_id) as resumed:
        with pytest.raises(ToolError, match="rejected by bob"):
            resumed.call_tool("pay", payments.pay, {"to": {"uuid": "a"}, "amount": 1},
                              requires_approval=True)  # fmt: skip
        resumed.call_tool(
            "pay", payments.pay, {"to": {"uuid": "b"}, "amount": 1}, requires_approval=True
        )
    assert payments.made == [] and resumed.outcome.stopped_because is StopReason.AWAITING_APPROVAL
    assert tether.intent_key("pay", {"to": {"uuid": "a"}}) != tether.intent_key(
        "pay", {"to": {"uuid": "b"}}
    )
