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


# --- case 2: a run is its own request unless it says which request it serves ----------------


class Certificates:
    """Gift certificates sent to customers: every one the provider sent."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def send(self, user: str, amount: int, uuid: str = "") -> dict[str, Any]:
        self.sent.append(user)
        return {"id": f"gc_{len(self.sent)}"}

    async def asend(self, user: str, amount: int, uuid: str = "") -> dict[str, Any]:
        return self.send(user, amount)


def conversation(
    guard: Guard, certificates: Certificates, shell: str, key: str | None = None
) -> Any:
    """One customer's conversation on a shared guard: it sends a certificate and ends."""
    import asyncio

    args = {"user": "u-1", "amount": 50, "uuid": uuid.uuid4().hex}
    if shell == "sync":
        with guard.start(task="send a certificate", key=key) as run:
            run.succeed(
                run.call_tool("send_certificate", certificates.send, args, idempotent=False)
            )
        return run.outcome

    async def main() -> Any:
        async with guard.start(task="send a certificate", key=key) as run:
            run.succeed(await run.acall_tool("send_certificate", certificates.asend, args,
                                             idempotent=False))  # fmt: skip
        return run.outcome

    return asyncio.run(main())


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_two_conversations_on_one_guard_each_get_their_effect(shell: str) -> None:
    """Two customers ask for the same thing in separate runs: each is done, each honestly."""
    certificates = Certificates()
    guard = Guard()
    first, second = (conversation(guard, certificates, shell) for _ in range(2))
    assert certificates.sent == ["u-1", "u-1"]  # 2 executions: two requests
    assert (first.result, second.result) == ({"id": "gc_1"}, {"id": "gc_2"})
    assert "gc_2" in second.customer_message


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_runs_with_one_request_key_do_their_effect_once(shell: str) -> None:
    """A caller re-running request T-7 after a crash pays nothing twice."""
    certificates = Certificates()
    guard = Guard()
    first = conversation(guard, certificates, shell, key="T-7")
    again = conversation(guard, certificates, shell, key="T-7")
    other = conversation(guard, certificates, shell, key="T-8")
    assert certificates.sent == ["u-1", "u-1"]  # T-7 once, T-8 once
    assert first.result == again.result == {"id": "gc_1"} and other.result == {"id": "gc_2"}


def test_a_request_key_is_checked() -> None:
    """A key that names nothing is refused, naming the field."""
    for bad in ("", "  ", 7):
        with pytest.raises(ValueError, match="key must be a non-empty string"):
            Guard().start(task="t", key=bad)  # type: ignore[arg-type]
    assert Guard().start(task="t", key="T-1").key == "T-1"


def test_resume_keeps_the_runs_request(backend: Any) -> None:
    """The resumed run's earlier effects replay; a new run asking the same thing does it."""
    certificates = Certificates()
    guard = Guard(**backend())
    args = {"user": "u-1", "amount": 50}

    def turn(run: tether.Run) -> Any:
        sent = run.call_tool("send_certificate", certificates.send, {**args, "uuid": uuid.uuid4().hex},
                             idempotent=False)  # fmt: skip
        run.call_tool("close_ticket", lambda: "closed", requires_approval=True)
        return sent

    for key in (None, "T-9"):
        certificates.sent.clear()
        with guard.start(task="certificate, then close", key=key) as run:
            turn(run)
        assert run.outcome.stopped_because is StopReason.AWAITING_APPROVAL
        guard.approve(run.outcome.checkpoint_id, by="alice")
        with Guard(**backend()).resume(run.outcome.checkpoint_id) as resumed:
            resumed.succeed(turn(resumed))  # the loop asks for the certificate again
        assert resumed.key == key
        assert certificates.sent == ["u-1"] and resumed.outcome.result == {"id": "gc_1"}
        with guard.start(task="another conversation") as fresh:
            fresh.call_tool("send_certificate", certificates.send, args, idempotent=False)
            fresh.succeed()
        assert certificates.sent == ["u-1", "u-1"]


def test_a_checkpoint_from_before_requests_keeps_its_scope(tmp_path: Path) -> None:
    """A checkpoint written without a request resumes under the guard's scope alone, so the
    effects it recorded replay instead of running again."""
    certificates = Certificates()
    db = str(tmp_path / "t.db")
    guard = Guard(ledger=Ledger.sqlite(db), checkpoints=Checkpoints.sqlite(db), scope="shop")
    args = {"user": "u-1", "amount": 50}
    guard.ledger.once(
        tether.intent_key("send_certificate", args, scope="shop"), certificates.send, **args
    )
    cid = guard.checkpoints.save({"run_id": "run_old", "task": "t", "usage": {}, "partial": [],
                                  "transcript": []}, 0.0)  # fmt: skip
    with guard.resume(cid) as run:
        run.succeed(run.call_tool("send_certificate", certificates.send, args, idempotent=False))
    assert certificates.sent == ["u-1"] and run.outcome.result == {"id": "gc_1"}


# --- case 12: requires_approval with nowhere to wait is refused before the first request ----


def test_run_agent_refuses_an_approval_it_cannot_wait_for_before_paying(server: Any) -> None:
    """No checkpoints store: run_agent and arun_agent raise before the first model request."""
    import asyncio

    import anthropic
    import openai

    from tether.integrations import anthropic as t_anthropic
    from tether.integrations import openai as t_openai

    tools = [
        tether.Tool("issue_refund", lambda order: order, idempotent=False, requires_approval=True)
    ]
    user = [{"role": "user", "content": "refund A-1"}]
    with (
        anthropic.Anthropic(api_key="test", base_url=server.url) as raw,
        pytest.raises(ValueError, match=r"issue_refund may require approval.*no request was sent"),
    ):
        t_anthropic.run_agent(raw, model="claude-sonnet-4-6", messages=user, tools=tools)
    with (
        openai.OpenAI(api_key="test", base_url=server.url) as oa,
        pytest.raises(ValueError, match="nowhere to wait"),
    ):
        t_openai.run_agent(oa, model="gpt-4.1-mini", messages=user, tools=tools, guard=Guard())

    async def from_async() -> None:
        async with anthropic.AsyncAnthropic(api_key="test", base_url=server.url) as raw:
            await t_anthropic.arun_agent(raw, model="claude-sonnet-4-6", messages=user, tools=tools)

    with pytest.raises(ValueError, match="nowhere to wait"):
        asyncio.run(from_async())
    assert server.requests == []  # nothing was paid for


def test_the_adapters_refuse_an_approval_they_cannot_wait_for_at_construction() -> None:
    """The Agents SDK, PydanticAI and LangChain adapters refuse it before any request."""
    from agents import Agent, function_tool
    from agents.testing import ScriptedModel, assistant_message
    from pydantic_ai import Agent as PAgent
    from pydantic_ai.models.test import TestModel

    from tether.integrations import langchain as t_langchain
    from tether.integrations import openai_agents as t_agents
    from tether.integrations import pydantic_ai as t_pydantic

    rule = {"issue_refund": lambda args: args["amount"] > 5000}

    @function_tool
    def issue_refund(order: str, amount: int) -> str:
        """Refund an order."""
        return order

    model = ScriptedModel([[assistant_message("done")]])
    with pytest.raises(ValueError, match="nowhere to wait"):
        t_agents.run_sync(Agent(name="a", model=model, tools=[issue_refund]), "refund",
                          guard=Guard(), requires_approval=rule)  # fmt: skip
    with pytest.raises(ValueError, match="nowhere to wait"):
        t_agents.guard_tools([issue_refund], Guard().start(), requires_approval=rule)
    with pytest.raises(ValueError, match="nowhere to wait"):
        t_pydantic.TetherCapability(Guard(), requires_approval=rule)
    with pytest.raises(ValueError, match="nowhere to wait"):
        t_pydantic.run_sync(PAgent(TestModel()), "refund", guard=Guard(), requires_approval=rule)
    with pytest.raises(ValueError, match="nowhere to wait"):
        t_langchain.TetherMiddleware(Guard(), requires_approval=rule)
    assert model.calls == ()  # the model was never asked
    # a guard with somewhere to wait is fine, and a rule that is False needs nothing
    t_pydantic.TetherCapability(Guard(checkpoints=Checkpoints.memory()), requires_approval=rule)
    t_pydantic.TetherCapability(Guard(), requires_approval={"issue_refund": False})
