"""Governance: approvals before destructive calls, policies on arguments, compensations."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

import tether
from tether import Checkpoints, Guard, Ledger, StopReason, ToolError, policies
from tether.records._approvals import ApprovalError


class Provider:
    """A payment provider's records: what was refunded, and what was cancelled."""

    def __init__(self) -> None:
        self.refunds: list[dict[str, Any]] = []
        self.cancelled: list[str] = []

    def refund(self, order: str, amount: int, uuid: str = "") -> dict[str, Any]:
        refund = {"id": f"re_{len(self.refunds) + 1}", "order": order, "amount": amount}
        self.refunds.append(refund)
        return refund

    def cancel(self, refund: dict[str, Any]) -> str:
        self.cancelled.append(refund["id"])
        return f"cancelled {refund['id']}"


def stores(tmp_path: Path) -> dict[str, Any]:
    db = str(tmp_path / "tether.db")
    return {"ledger": Ledger.sqlite(db), "checkpoints": Checkpoints.sqlite(db)}


def big(args: Any) -> bool:
    return bool(args["amount"] > 5000)


def refund_step(run: tether.Run, provider: Provider, amount: int) -> Any:
    """The agent's loop asks for a refund (with a fresh uuid every time it asks)."""
    return run.call_tool("issue_refund", provider.refund,
                         {"order": "A-1", "amount": amount, "uuid": uuid.uuid4().hex},
                         idempotent=False, requires_approval=big, compensate=provider.cancel)  # fmt: skip


# --- approvals --------------------------------------------------------------------------------


def test_a_call_that_needs_approval_stops_before_it_runs_then_runs_once_when_approved(
    tmp_path: Path,
) -> None:
    provider = Provider()
    guard = Guard(**stores(tmp_path))
    with guard.start(task="refund A-1") as run:
        refund_step(run, provider, 9000)
    outcome = run.outcome
    assert provider.refunds == []  # the effect ran 0 times
    assert outcome.stopped_because is StopReason.AWAITING_APPROVAL
    assert outcome.status == "awaiting_approval"
    assert (
        outcome.pending_approval is not None and outcome.pending_approval["tool"] == "issue_refund"
    )
    assert outcome.pending_approval["args"]["amount"] == 9000
    assert "approval" in outcome.customer_message
    assert [a.status for a in guard.approvals()] == ["pending"]

    # a new process: a new Guard on the same SQLite file
    later = Guard(**stores(tmp_path))
    record = later.approve(outcome.checkpoint_id, by="alice", note="ok, the customer is known")
    assert record.status == "approved" and record.decided_by == "alice"
    with later.resume(outcome.checkpoint_id) as resumed:
        result = refund_step(resumed, provider, 9000)  # re-issued, with a fresh uuid
        resumed.succeed(result)
    assert len(provider.refunds) == 1 and resumed.outcome.status == "success"
    assert resumed.run_id == run.run_id
    statuses = {a.status for a in later.approvals()}
    assert statuses == {"used"}  # the approval covered that one call


def test_an_approval_covers_its_call_once(tmp_path: Path) -> None:
    provider = Provider()
    guard = Guard(**stores(tmp_path))
    with guard.start() as run:
        refund_step(run, provider, 9000)
    guard.approve(run.outcome.checkpoint_id, by="alice")
    with guard.resume(run.outcome.checkpoint_id) as resumed:
        first = refund_step(resumed, provider, 9000)
        # the same refund asked for again in this run is the same effect: the ledger replays
        # it, no second approval is asked and nothing is paid twice
        assert refund_step(resumed, provider, 9000) == first
        refund_step(resumed, provider, 7000)  # another refund asks again
    assert len(provider.refunds) == 1
    assert resumed.outcome.stopped_because is StopReason.AWAITING_APPROVAL
    assert resumed.outcome.pending_approval is not None
    assert resumed.outcome.pending_approval["args"]["amount"] == 7000


def test_an_approval_does_not_cover_different_arguments(tmp_path: Path) -> None:
    provider = Provider()
    guard = Guard(**stores(tmp_path))
    with guard.start() as run:
        refund_step(run, provider, 9000)
    guard.approve(run.outcome.checkpoint_id, by="alice")
    with guard.resume(run.outcome.checkpoint_id) as resumed:
        refund_step(resumed, provider, 9500)  # the model changed the amount
    assert provider.refunds == []
    assert resumed.outcome.stopped_because is StopReason.AWAITING_APPROVAL
    assert resumed.outcome.pending_approval is not None
    assert resumed.outcome.pending_approval["args"]["amount"] == 9500


def test_a_rejection_runs_nothing_and_tells_the_model_why(tmp_path: Path) -> None:
    provider = Provider()
    guard = Guard(**stores(tmp_path))
    with guard.start() as run:
        refund_step(run, provider, 9000)
    guard.reject(run.outcome.checkpoint_id, by="bob", reason="order is older than 90 days")
    told = []
    with Guard(**stores(tmp_path)).resume(run.outcome.checkpoint_id) as resumed:
        try:
            refund_step(resumed, provider, 9000)
        except ToolError as exc:
            told.append(exc.model_message)
        resumed.fail("the refund was rejected")
    assert provider.refunds == []
    assert told == ["rejected: order is older than 90 days"]  # the rule, never the person (#40)


def test_small_calls_need_no_approval_and_decisions_are_checked(tmp_path: Path) -> None:
    provider = Provider()
    guard = Guard(**stores(tmp_path))
    with guard.start() as run:
        run.succeed(refund_step(run, provider, 100))
    assert len(provider.refunds) == 1 and run.outcome.status == "success"
    with guard.start() as run:
        refund_step(run, provider, 9000)
    checkpoint = run.outcome.checkpoint_id
    with pytest.raises(ValueError, match="by must name"):
        guard.approve(checkpoint, by="")
    guard.approve(checkpoint, by="alice")
    with pytest.raises(ApprovalError, match="already approved by alice"):
        guard.reject(checkpoint, by="bob")
    with guard.start() as done:
        done.succeed()
    with pytest.raises(ApprovalError, match="no call waiting"):
        guard.approve(done.outcome.checkpoint_id, by="alice")


def test_approval_needs_a_checkpoints_store_and_says_so() -> None:
    provider = Provider()
    with Guard().start() as run, pytest.raises(ValueError, match="checkpoints="):
        refund_step(run, provider, 9000)
    assert provider.refunds == []


def test_an_approval_survives_postgres(pg_dsn: str) -> None:
    provider = Provider()
    table = f"t_docs_{uuid.uuid4().hex[:8]}"
    guard = Guard(checkpoints=Checkpoints.postgres(pg_dsn, table=table))
    try:
        with guard.start() as run:
            refund_step(run, provider, 9000)
        other = Guard(checkpoints=Checkpoints.postgres(pg_dsn, table=table), ledger=guard.ledger)
        other.approve(run.outcome.checkpoint_id, by="alice")
        with other.resume(run.outcome.checkpoint_id) as resumed:
            resumed.succeed(refund_step(resumed, provider, 9000))
        assert len(provider.refunds) == 1 and resumed.outcome.status == "success"
        other.checkpoints.close()  # type: ignore[union-attr]
    finally:
        guard.checkpoints.close()  # type: ignore[union-attr]


def test_an_approvers_secret_never_reaches_the_model(tmp_path: Path) -> None:
    provider = Provider()
    guard = Guard(**stores(tmp_path))
    with guard.start() as run:
        refund_step(run, provider, 9000)
    guard.reject(run.outcome.checkpoint_id, by="bob", reason="card 4242 4242 4242 4242 is blocked")
    with guard.resume(run.outcome.checkpoint_id) as resumed, pytest.raises(ToolError) as caught:
        refund_step(resumed, provider, 9000)
    assert "4242 4242" not in caught.value.model_message


# --- policies ---------------------------------------------------------------------------------


def test_a_refund_over_the_limit_is_never_executed_and_the_model_is_told_the_rule() -> None:
    provider = Provider()
    guard = Guard(policies=[policies.limit("issue_refund", "amount", 5000)])
    told = []
    with guard.start() as run:
        for _ in range(5):  # a model that keeps asking
            try:
                run.call_tool("issue_refund", provider.refund, {"order": "A-1", "amount": 9000},
                              idempotent=False)  # fmt: skip
            except ToolError as exc:
                told.append(exc.model_message)
    assert provider.refunds == []
    assert told[0] == "denied by policy: issue_refund: amount 9000 is over the limit of 5000"
    # a denial is a failure of that intent: the identical-failures budget stops the run
    assert run.outcome.stopped_because is StopReason.IDENTICAL_FAILURES
    assert len(told) == 2


def test_policies_allow_lists_counts_and_failures() -> None:
    provider = Provider()

    def crashes(tool: str, args: Any) -> str | None:
        raise RuntimeError("bug in the policy")

    guard = Guard(policies=[policies.allow("issue_refund", "order", {"A-1", "A-2"}),
                            policies.max_calls("issue_refund", 2)])  # fmt: skip
    with guard.start() as run:
        with pytest.raises(ToolError, match="order must be one of A-1, A-2"):
            run.call_tool("issue_refund", provider.refund, {"order": "Z-9", "amount": 1})
        run.call_tool("issue_refund", provider.refund, {"order": "A-1", "amount": 1})
        run.call_tool("issue_refund", provider.refund, {"order": "A-2", "amount": 1})
        with pytest.raises(ToolError, match="at most 2 times"):
            run.call_tool("issue_refund", provider.refund, {"order": "A-1", "amount": 2})
        run.call_tool("lookup", lambda order: order, {"order": "Z-9"})  # other tools pass
        run.succeed()
    assert len(provider.refunds) == 2
    with (
        Guard(policies=[crashes]).start() as run,
        pytest.raises(ToolError, match="could not decide"),
    ):
        run.call_tool("lookup", lambda: 1, {})
    with pytest.raises(TypeError, match="policies must be callables"):
        Guard(policies=["no"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="rollback_on"):
        Guard(rollback_on=["sometimes"])


def test_a_policy_denial_is_logged_and_traced(caplog: pytest.LogCaptureFixture, otel: Any) -> None:
    exporter, _ = otel
    guard = Guard(policies=[policies.limit("issue_refund", "amount", 5000)])
    with (
        caplog.at_level(logging.WARNING, logger="tether"),
        guard.start() as run,
        pytest.raises(ToolError),
    ):
        run.call_tool("issue_refund", lambda **a: a, {"order": "A-1", "amount": 9000})
    assert any("policy denied issue_refund" in r.getMessage() for r in caplog.records)
    events = [e.name for s in exporter.get_finished_spans() for e in s.events]
    assert "tether.policy_denied" in events


# --- compensations ----------------------------------------------------------------------------


def three_refunds(run: tether.Run, provider: Provider) -> None:
    for order in ("A-1", "A-2", "A-3"):
        run.call_tool("issue_refund", provider.refund, {"order": order, "amount": 10},
                      idempotent=False, compensate=provider.cancel, label="refund")  # fmt: skip


def test_rollback_undoes_newest_first_each_once() -> None:
    provider = Provider()
    with Guard().start() as run:
        three_refunds(run, provider)
        undone = run.rollback()
        again = run.rollback()
        run.fail("the order could not be completed")
    assert provider.cancelled == ["re_3", "re_2", "re_1"]
    assert [u["args"]["order"] for u in undone] == ["A-3", "A-2", "A-1"] and again == ()
    outcome = run.outcome
    assert [c["tool"] for c in outcome.compensated] == ["issue_refund"] * 3
    assert "Undone: refund (reference re_3)" in outcome.customer_message
    assert (
        "Done:" not in outcome.customer_message and "issue_refund" not in outcome.customer_message
    )


def test_rollback_after_the_run_ended_amends_the_outcome() -> None:
    provider = Provider()
    with Guard().start() as run:
        three_refunds(run, provider)
        run.fail("the shipment failed")
    assert run.outcome.compensated == ()
    run.rollback()
    assert provider.cancelled == ["re_3", "re_2", "re_1"]
    assert len(run.outcome.compensated) == 3 and "Undone" in run.outcome.customer_message


def test_rollback_on_chooses_the_outcomes_that_roll_back() -> None:
    provider = Provider()
    guard = Guard(rollback_on=[StopReason.FAILED])
    with guard.start() as run:
        three_refunds(run, provider)
        run.fail("the shipment failed")
    assert provider.cancelled == ["re_3", "re_2", "re_1"]
    with guard.start() as run:
        three_refunds(run, Provider())
        run.succeed()
    assert run.outcome.compensated == ()  # success is not rolled back


def test_a_compensation_that_fails_escalates_with_the_facts() -> None:
    provider = Provider()
    handed: list[Any] = []

    def cannot_cancel(refund: Any) -> None:
        raise PermissionError("refund already settled")

    guard = Guard(escalation=tether.Escalation(sink=handed.append))
    with guard.start() as run:
        run.call_tool("issue_refund", provider.refund, {"order": "A-1", "amount": 10},
                      idempotent=False, compensate=provider.cancel)  # fmt: skip
        run.call_tool("issue_refund", provider.refund, {"order": "A-2", "amount": 10},
                      idempotent=False, compensate=cannot_cancel)  # fmt: skip
        run.rollback()
    outcome = run.outcome
    assert provider.cancelled == ["re_1"]  # the older one is still undone
    assert outcome.status == "escalated" and len(handed) == 1
    assert any("undoing issue_refund failed (PermissionError)" in i for i in outcome.open_issues)
    # the tools declare no label: the customer reads a neutral phrase, never the tool's name
    assert "a step of your request completed (reference re_2)" in " ".join(handed[0].facts)
    assert "issue_refund" not in outcome.customer_message


def test_async_rollback_awaits_async_compensations() -> None:
    import asyncio

    provider = Provider()
    undone: list[str] = []

    async def cancel(refund: Any) -> str:
        undone.append(refund["id"])
        return "ok"

    async def main() -> tether.Outcome:
        with Guard().start() as run:
            for order in ("A-1", "A-2"):
                await run.acall_tool("issue_refund", provider.refund, {"order": order, "amount": 1},
                                     idempotent=False, compensate=cancel)  # fmt: skip
            with pytest.raises(TypeError, match="arollback"):
                run.rollback()
            await run.arollback()
            run.fail()
        return run.outcome

    outcome = asyncio.run(main())
    assert undone == ["re_2", "re_1"] and len(outcome.compensated) == 2


CHILD = textwrap.dedent("""
    import json, logging, os, sys
    import tether
    db, phase, log = sys.argv[1], sys.argv[2], sys.argv[3]

    def refund(order, amount):
        return {"id": "re_" + order, "order": order}

    def cancel(refund):
        with open(log, "a") as f:
            f.write(refund["id"] + "\\n")
        return "cancelled"

    guard = tether.Guard(ledger=tether.Ledger.sqlite(db), checkpoints=tether.Checkpoints.sqlite(db))
    if phase == "first":
        class Die(logging.Handler):  # the process dies right after the first compensation
            def emit(self, record):
                if "compensated" in record.getMessage():
                    os._exit(3)
        logging.getLogger("tether").addHandler(Die())
        logging.getLogger("tether").setLevel(logging.INFO)
        with guard.start(task="three refunds") as run:
            for order in ("A-1", "A-2", "A-3"):
                run.call_tool("issue_refund", refund, {"order": order, "amount": 10},
                              idempotent=False, compensate=cancel)
            run.fail("the shipment failed")
        print(run.outcome.checkpoint_id, flush=True)
        run.rollback()
    else:
        run = guard.resume(phase)
        undone = run.rollback(compensations={"issue_refund": cancel})
        print(json.dumps([u["args"]["order"] for u in undone]))
""")


def test_a_rollback_cut_by_a_dying_process_is_finished_by_the_next(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    db, log = str(tmp_path / "t.db"), tmp_path / "cancelled.log"
    first = subprocess.run([sys.executable, str(script), db, "first", str(log)],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert first.returncode == 3, first.stderr
    checkpoint = first.stdout.strip()
    assert log.read_text().split() == ["re_A-3"]
    second = subprocess.run([sys.executable, str(script), db, checkpoint, str(log)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout) == ["A-3", "A-2", "A-1"]  # A-3 confirmed from the ledger
    assert log.read_text().split() == ["re_A-3", "re_A-2", "re_A-1"]  # each exactly once


# --- run_agent: approval, resume, rollback through tether.Tool --------------------------------


def test_run_agent_waits_for_approval_and_resumes_with_the_pending_call(
    server: Any, tmp_path: Path
) -> None:
    import anthropic

    from scripted_server import Reply
    from tether.integrations import anthropic as t_anthropic

    def reply(content: list[dict[str, Any]], stop: str = "end_turn") -> Any:
        return Reply(200, {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-6",
                           "content": content, "stop_reason": stop, "stop_sequence": None,
                           "usage": {"input_tokens": 900, "output_tokens": 80}})  # fmt: skip

    ask = {"type": "tool_use", "id": "tu_1", "name": "issue_refund",
           "input": {"order": "A-1", "amount": 9000, "uuid": uuid.uuid4().hex}}  # fmt: skip
    server.script = [reply([ask], stop="tool_use"),
                     reply([{"type": "text", "text": "Refunded 9000."}])]  # fmt: skip
    provider = Provider()
    tools = [tether.Tool("issue_refund", provider.refund, idempotent=False, requires_approval=big,
                         compensate=provider.cancel)]  # fmt: skip
    user = [{"role": "user", "content": "refund order A-1"}]
    with anthropic.Anthropic(api_key="test", base_url=server.url) as raw:
        first = t_anthropic.run_agent(raw, model="claude-sonnet-4-6", messages=user, tools=tools,
                                      guard=Guard(**stores(tmp_path)))  # fmt: skip
        assert first.stopped_because is StopReason.AWAITING_APPROVAL and provider.refunds == []
        guard = Guard(**stores(tmp_path))
        guard.approve(first.checkpoint_id, by="alice")  # type: ignore[arg-type]
        second = t_anthropic.run_agent(raw, model="claude-sonnet-4-6", messages=first.messages,
                                       tools=tools, guard=guard, resume=first.checkpoint_id)  # fmt: skip
    assert len(provider.refunds) == 1
    assert second.status == "success" and second.result == "Refunded 9000."
    assert len(server.requests) == 2  # the pending call ran without asking the model again
    results = server.requests[1].body["messages"][-1]["content"]
    assert results[0]["tool_use_id"] == "tu_1" and "re_1" in results[0]["content"]
    assert second.usage.model_calls == 2  # counted across the pause


def test_openai_pending_calls_are_the_unanswered_ones() -> None:
    from tether.integrations._loop import agent_call
    from tether.integrations.openai import _setup

    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": "a", "arguments": "{}"}},
                   {"id": "c2", "type": "function", "function": {"name": "b", "arguments": '{"x": 1}'}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "done"}]  # fmt: skip
    turns = _setup(agent_call(None, model="gpt-6.1-sol", messages=history, max_tokens=None))
    assert [(u.id, u.name, u.args) for u in turns.pending()] == [("c2", "b", {"x": 1})]
    assert _setup(agent_call(None, model="gpt-6.1-sol", messages=history[:1])).pending() == []


def test_tool_rejects_bad_governance_fields() -> None:
    with pytest.raises(TypeError, match="requires_approval"):
        tether.Tool("t", lambda: 1, requires_approval="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="compensate"):
        tether.Tool("t", lambda: 1, compensate="undo")  # type: ignore[arg-type]


# --- the adapters -----------------------------------------------------------------------------


def test_pydantic_ai_approval_then_resume(tmp_path: Path) -> None:
    import itertools

    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    from tether.integrations import pydantic_ai as ta_pydantic

    provider = Provider()
    turn = itertools.count()

    def model(messages: list[Any], info: Any) -> ModelResponse:
        if next(turn) < 2:  # asks, and asks again after the pause (a fresh uuid)
            args = {"order": "A-1", "amount": 9000, "uuid": uuid.uuid4().hex}
            return ModelResponse(parts=[ToolCallPart("issue_refund", args)])
        return ModelResponse(parts=[TextPart("Refunded.")])

    agent = Agent(FunctionModel(model, model_name="scripted"))
    agent.tool_plain(provider.refund, name="issue_refund")
    rules = {"side_effects": ["issue_refund"], "requires_approval": {"issue_refund": big},
             "compensate": {"issue_refund": provider.cancel}}  # fmt: skip
    first = ta_pydantic.run_sync(agent, "refund A-1", guard=Guard(**stores(tmp_path)), **rules)
    assert first.stopped_because is StopReason.AWAITING_APPROVAL and provider.refunds == []
    guard = Guard(**stores(tmp_path))
    guard.approve(first.checkpoint_id, by="alice")  # type: ignore[arg-type]
    second = ta_pydantic.run_sync(agent, None, guard=guard, resume=first.checkpoint_id,
                                  message_history=list(first.messages), **rules)  # fmt: skip
    assert (
        second.status == "success" and second.result == "Refunded." and len(provider.refunds) == 1
    )


def test_openai_agents_policy_and_approval(tmp_path: Path) -> None:
    from agents import Agent, function_tool, set_tracing_disabled
    from agents.testing import ScriptedModel, assistant_message, function_call

    from tether.integrations import openai_agents as ta_agents

    set_tracing_disabled(True)
    provider = Provider()

    @function_tool
    def issue_refund(order: str, amount: int, uuid: str) -> str:
        """Refund an order."""
        return json.dumps(provider.refund(order, amount))

    def ask(amount: int, i: int) -> list[Any]:
        return [function_call("issue_refund", {"order": "A-1", "amount": amount, "uuid": uuid.uuid4().hex},
                              call_id=f"c{i}")]  # fmt: skip

    # a policy: the model is told the rule and never pays
    denied = ScriptedModel([ask(90000, 1), [assistant_message("I cannot refund that much.")]])
    outcome = ta_agents.run_sync(Agent(name="a", model=denied, tools=[issue_refund]), "refund",
                                 guard=Guard(policies=[policies.limit("issue_refund", "amount", 50000)]))  # fmt: skip
    assert provider.refunds == [] and outcome.result == "I cannot refund that much."
    told = [m["output"] for m in outcome.messages if m.get("type") == "function_call_output"]
    assert told == ["denied by policy: issue_refund: amount 90000 is over the limit of 50000"]

    # an approval: the pause, then the re-issued call runs once
    scripted = ScriptedModel([ask(9000, 2), ask(9000, 3), [assistant_message("Refunded.")]])
    agent = Agent(name="a", model=scripted, tools=[issue_refund])
    rules = {"side_effects": ["issue_refund"], "requires_approval": {"issue_refund": big}}
    first = ta_agents.run_sync(agent, "refund A-1", guard=Guard(**stores(tmp_path)), **rules)
    assert first.stopped_because is StopReason.AWAITING_APPROVAL and provider.refunds == []
    guard = Guard(**stores(tmp_path))
    guard.approve(first.checkpoint_id, by="alice")  # type: ignore[arg-type]
    second = ta_agents.run_sync(agent, list(first.messages), guard=guard, resume=first.checkpoint_id,
                                **rules)  # fmt: skip
    assert second.status == "success" and len(provider.refunds) == 1


def test_a_scoped_guard_undoes_by_the_scoped_ledger_key() -> None:
    provider = Provider()
    guard = Guard(scope="tenant-7")
    with guard.start() as run:
        three_refunds(run, provider)
        run.rollback()
        run.fail()
    assert provider.cancelled == ["re_3", "re_2", "re_1"]
    scope = json.dumps(["tenant-7", f"run:{run.run_id}"])  # the guard's scope and the request
    key = tether.intent_key("issue_refund", {"order": "A-1", "amount": 10}, scope=scope)
    assert guard.ledger.get(f"undo:{key}") is not None


def test_an_approvals_store_that_fails_mid_call_runs_nothing_and_says_so(tmp_path: Path) -> None:
    provider = Provider()
    guard = Guard(**stores(tmp_path))
    with guard.start() as run:
        guard.checkpoints.close()  # type: ignore[union-attr]  # the store goes away mid-run
        with pytest.raises(tether.StoreUnavailable, match="issue_refund was not executed"):
            refund_step(run, provider, 9000)
        run.fail()
    assert provider.refunds == []
    assert any("checkpoint failed" in i for i in run.outcome.open_issues)  # the outcome still comes
