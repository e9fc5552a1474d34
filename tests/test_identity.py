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
    from tether.run._tool import Tool

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
        with pytest.raises(ToolError, match="rejected: no"):
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


# --- cases 3 and 4: one dead letter per intent, replayed once through the ledger ------------


def open_records(kind: str, where: str, table: str = "tether_documents") -> tether.Records:
    """The records of one database, as a new process opens them."""
    return (
        tether.Records.sqlite(where) if kind == "sqlite" else tether.Records.postgres(where, table)
    )


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """(kind, where, table) of one records database: a SQLite file, or tables in PostgreSQL."""
    if request.param == "sqlite":
        return "sqlite", str(tmp_path / "records.db"), "tether_documents"
    return "postgres", request.getfixturevalue("pg_dsn"), f"t_{uuid.uuid4().hex[:10]}"


refunds_made: list[str] = []


def fixed_refund(order: str, amount: int, uuid: str) -> dict[str, Any]:
    refunds_made.append(order)
    return {"id": f"re_{len(refunds_made)}"}


def broken_refund(order: str, amount: int, uuid: str) -> dict[str, Any]:
    raise TypeError("refund() got an unexpected keyword argument 'uuid'")


def fail_a_refund_three_times(guard: Guard) -> tether.Outcome:
    """The refund fails with a business error; the model re-asks twice with fresh uuids."""

    def refund(order: str, amount: int, uuid: str) -> Any:
        raise ValueError("the order is locked")

    with guard.start(task="refund A-1") as run:
        while run.proceed():
            try:
                run.call_tool("refund", refund, {"order": "A-1", "amount": 10, "uuid": uuid.uuid4().hex},
                              idempotent=False)  # fmt: skip
            except ToolError:
                pass
    return run.outcome


def test_one_failed_refund_is_one_letter_and_replaying_every_letter_pays_once(
    database: Any,
) -> None:
    """Three asks, one letter; replaying it from the page's logic and the CLI, from two
    processes' connections, twice each: one refund."""
    from tether.cli import main

    kind, where, table = database
    records = open_records(kind, where, table)
    outcome = fail_a_refund_three_times(Guard(records=records))
    letters = records.dead_letters.list()
    assert len(letters) == 1 and letters[0].asked == 3  # was 3 letters
    assert sum("dead letter" in issue for issue in outcome.open_issues) == 1
    refunds_made.clear()
    other = open_records(kind, where, table)
    try:
        for letters_of in (records.dead_letters, other.dead_letters):
            for letter in letters_of.list():
                assert letters_of.replay(letter.id, fixed_refund) == {"id": "re_1"}
        if kind == "sqlite":
            assert main(["dlq", "--db", where, "replay", letters[0].id, "--by", "dana",
                         "--handler", "test_identity:fixed_refund"]) == 0  # fmt: skip
    finally:
        other.close()
        records.close()
    assert refunds_made == ["A-1"]  # was 3 refunds


def test_a_failed_replay_can_be_replayed_once_fixed(
    database: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The handler raised: the next replay calls the fixed one (no --force); then it is done."""
    from tether.cli import main

    kind, where, table = database
    records = open_records(kind, where, table)
    fail_a_refund_three_times(Guard(records=records))
    letter = records.dead_letters.list()[0]
    refunds_made.clear()
    try:
        with pytest.raises(TypeError, match="unexpected keyword"):
            records.dead_letters.replay(letter.id, broken_refund)
        assert records.dead_letters.replay(letter.id, fixed_refund) == {"id": "re_1"}
        assert records.dead_letters.replay(letter.id, fixed_refund) == {"id": "re_1"}
        assert records.dead_letters.get(letter.id).replayed
    finally:
        records.close()
    assert refunds_made == ["A-1"]
    if kind == "sqlite":  # the command line: broken, then fixed, then done
        fail_a_refund_three_times(
            Guard(records=open_records(kind, str(Path(where).with_name("cli.db"))))
        )
        db = str(Path(where).with_name("cli.db"))
        letter_id = tether.Records.sqlite(db).dead_letters.list()[0].id
        replay = ["dlq", "--db", db, "replay", letter_id, "--by", "dana", "--handler"]
        assert main([*replay, "test_identity:broken_refund"]) == 1
        assert main([*replay, "test_identity:fixed_refund"]) == 0
        assert main([*replay, "test_identity:fixed_refund"]) == 0
        assert "replayed before" in capsys.readouterr().out
        assert refunds_made == ["A-1", "A-1"]  # one per database


def test_a_replay_whose_outcome_is_unknown_goes_through_lookup(tmp_path: Path) -> None:
    """A replay that timed out after sending: the next one asks lookup, never runs blindly."""
    records = tether.Records.sqlite(str(tmp_path / "r.db"))
    fail_a_refund_three_times(Guard(records=records))
    letter = records.dead_letters.list()[0]
    sent: list[str] = []

    def lost_response(order: str, amount: int, uuid: str) -> Any:
        sent.append(order)
        raise TimeoutError("read timed out")

    with pytest.raises(TimeoutError):
        records.dead_letters.replay(letter.id, lost_response)
    with pytest.raises(tether.UnknownOutcome):
        records.dead_letters.replay(letter.id, fixed_refund)
    found = records.dead_letters.replay(
        letter.id, fixed_refund, lookup=lambda key: {"id": "re_sent"}
    )
    assert found == {"id": "re_sent"} and sent == ["A-1"]
    assert records.dead_letters.replay(letter.id, fixed_refund) == {"id": "re_sent"}
    records.close()


# --- cases 5 and 6: concurrent and redelivered resumes of one approved checkpoint ----------


class SlowRefunds:
    """A provider whose refunds take a moment; every refund is a line in a file (shared by
    threads and processes)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def refund(self, order: str, amount: int, uuid: str = "") -> dict[str, Any]:
        import time

        time.sleep(0.3)
        with open(self.path, "a") as f:
            f.write(order + "\n")
        return {"id": "re_1", "order": order}

    def made(self) -> int:
        return len(Path(self.path).read_text().splitlines()) if Path(self.path).exists() else 0


REFUND = {"order": "A-1", "amount": 9000}


def ask_refund(run: tether.Run, refunds: SlowRefunds, idempotent: bool) -> Any:
    return run.call_tool("issue_refund", refunds.refund, {**REFUND, "uuid": uuid.uuid4().hex},
                         idempotent=idempotent, requires_approval=True)  # fmt: skip


def approved_checkpoint(
    kind: str, where: str, table: str, refunds: SlowRefunds, idempotent: bool
) -> str:
    records = open_records(kind, where, table)
    guard = Guard(records=records)
    with guard.start(task="refund A-1") as run:
        ask_refund(run, refunds, idempotent)
    guard.approve(str(run.outcome.checkpoint_id), by="alice")
    records.close()
    return str(run.outcome.checkpoint_id)


def resume_and_refund(kind: str, where: str, table: str, checkpoint_id: str, path: str,
                      idempotent: bool) -> dict[str, Any]:  # fmt: skip
    """One worker (a thread, or a process of its own): resume the checkpoint, ask again."""
    records = open_records(kind, where, table)
    try:
        with Guard(records=records).resume(checkpoint_id) as run:
            try:
                run.succeed(ask_refund(run, SlowRefunds(path), idempotent))
            except ToolError:
                pass
        out = run.outcome
        return {"status": out.status, "reason": out.stopped_because.value, "result": out.result,
                "message": out.customer_message, "issues": list(out.open_issues)}  # fmt: skip
    finally:
        records.close()


def _process_worker(args: tuple[Any, ...], queue: Any) -> None:
    queue.put(resume_and_refund(*args))


def in_processes(n: int, args: tuple[Any, ...]) -> list[dict[str, Any]]:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    workers = [ctx.Process(target=_process_worker, args=(args, queue)) for _ in range(n)]
    for w in workers:
        w.start()
    outs = [queue.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(timeout=60)
    return outs


def in_threads(n: int, args: tuple[Any, ...]) -> list[dict[str, Any]]:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: resume_and_refund(*args), range(n)))


def pending_approvals(kind: str, where: str, table: str) -> list[Any]:
    with open_records(kind, where, table) as records:
        return [a for a in records.approvals.list(200) if a.status == "pending"]


@pytest.mark.parametrize("idempotent", [False, True])
@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_concurrent_resumes_of_one_approved_checkpoint_refund_once_and_say_so_honestly(
    database: Any, tmp_path: Path, workers: str, idempotent: bool
) -> None:
    """8 threads (or 4 processes) resume one approved refund: one execution; every other
    run has the recorded result or says another worker is doing it; nothing new to approve."""
    kind, where, table = database
    refunds = SlowRefunds(str(tmp_path / "refunds.txt"))
    cid = approved_checkpoint(kind, where, table, refunds, idempotent)
    args = (kind, where, table, cid, refunds.path, idempotent)
    outs = in_threads(8, args) if workers == "threads" else in_processes(4, args)
    assert refunds.made() == 1  # one approval, one execution (5 with idempotent=True before)
    for out in outs:
        assert out["status"] != "failed", out
        if out["status"] == "success":
            assert out["result"] == {"id": "re_1", "order": "A-1"}
        else:
            assert (out["status"], out["reason"]) == ("partial", "in_progress"), out
            assert "being completed" in out["message"]
            assert any("being done by another worker" in i for i in out["issues"])
    assert any(out["status"] == "success" for out in outs)
    assert pending_approvals(kind, where, table) == []  # a used approval never turns pending


def test_a_redelivered_resume_after_the_run_ended_pays_nothing_and_files_nothing_older(
    database: Any, tmp_path: Path
) -> None:
    """The approved refund ran and the run ended; the same checkpoint resumed again (a retried
    job, in another process) ends with the recorded outcome: no refund, no new approval."""
    kind, where, table = database
    refunds = SlowRefunds(str(tmp_path / "refunds.txt"))
    cid = approved_checkpoint(kind, where, table, refunds, False)
    first = in_processes(1, (kind, where, table, cid, refunds.path, False))[0]
    again = in_processes(1, (kind, where, table, cid, refunds.path, False))[0]
    assert refunds.made() == 1  # was 2: the redelivery filed a new approval that paid again
    assert first["status"] == again["status"] == "success"
    assert again["result"] == {"id": "re_1", "order": "A-1"}
    assert pending_approvals(kind, where, table) == []
    with open_records(kind, where, table) as records:
        run_id = records.checkpoints.load(cid)["run_id"]
        assert records.runs.get(run_id)["status"] == "success"  # not filed as awaiting approval
        with pytest.raises(tether.ApprovalError):  # there is nothing left to approve there
            Guard(records=records).approve(cid, by="bob")
        guard = Guard(records=records)
        assert type(guard.ledger.backend).__name__ != "MemoryLedgerBackend"  # durable, beside


# --- case 7: rollback by several workers --------------------------------------------------------


def slow_cancel(refund: dict[str, Any]) -> str:
    import os
    import time

    time.sleep(0.3)
    with open(os.environ["TETHER_TEST_CANCELS"], "a") as f:
        f.write(refund["id"] + "\n")
    return f"cancelled {refund['id']}"


def roll_back(kind: str, where: str, table: str, checkpoint_id: str) -> dict[str, Any]:
    records = open_records(kind, where, table)
    try:
        run = Guard(records=records).resume(checkpoint_id)
        run.rollback(compensations={"issue_refund": slow_cancel})
        out = run.outcome  # a rollback-only resume ends with an outcome
        return {
            "status": out.status,
            "issues": list(out.open_issues),
            "compensated": len(out.compensated),
        }
    finally:
        records.close()


def _rollback_worker(args: tuple[Any, ...], queue: Any) -> None:
    queue.put(roll_back(*args))


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_rollback_by_several_workers_undoes_once_and_reports_the_one_in_progress(
    database: Any, tmp_path: Path, workers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4 workers roll back one run: one cancellation; the others say another worker is doing
    it (not "undo it by hand"); each rollback-only resume has an outcome."""
    import multiprocessing
    from concurrent.futures import ThreadPoolExecutor

    kind, where, table = database
    cancels = tmp_path / "cancels.txt"
    monkeypatch.setenv("TETHER_TEST_CANCELS", str(cancels))
    records = open_records(kind, where, table)
    with Guard(records=records).start(task="refund") as run:
        run.succeed(run.call_tool("issue_refund", lambda order: {"id": "re_1"}, {"order": "A-1"},
                                  idempotent=False, compensate=slow_cancel))  # fmt: skip
    records.close()
    args = (kind, where, table, str(run.outcome.checkpoint_id))
    if workers == "threads":
        with ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(lambda _: roll_back(*args), range(4)))
    else:
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        procs = [ctx.Process(target=_rollback_worker, args=(args, queue)) for _ in range(4)]
        for p in procs:
            p.start()
        outs = [queue.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(timeout=60)
    assert cancels.read_text().splitlines() == ["re_1"]  # each compensation once
    for out in outs:
        assert not any("by hand" in i for i in out["issues"]), out
        assert out["status"] != "escalated", out
        assert out["compensated"] == 1 or any("another worker" in i for i in out["issues"]), out
