"""tether inside DBOS, for real on PostgreSQL: workflow processes SIGKILLed mid-step and
recovered by a new process (DBOS's own recovery), a guarded run's spend after recovery,
approvals that resume a waiting workflow, and tether's verdict as DBOS's retry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dbos import DBOS, DBOSConfig, SetWorkflowID

import tether
from tether.integrations import dbos as tether_dbos

WORKER = Path(__file__).with_name("dbos_worker.py")


# --- DBOS's system database: its own, created here and dropped after ---------------------


def _admin(dsn: str, sql: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql)


@pytest.fixture(scope="module")
def system_url(pg_dsn: str) -> Iterator[str]:
    """A database for DBOS's system tables (DBOS needs one of its own), dropped after."""
    base = pg_dsn.rsplit("/", 1)[0]
    name = f"tether_dbos_{uuid.uuid4().hex[:10]}"
    _admin(pg_dsn, f"CREATE DATABASE {name}")
    yield f"{base}/{name}"
    _admin(pg_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def table(pg_dsn: str) -> Iterator[str]:
    """This test's tables: the provider's records (one row per effect or paid model call)."""
    prefix = f"t_{uuid.uuid4().hex[:10]}"
    _admin(pg_dsn, f"CREATE TABLE {prefix}_effects (kind TEXT, what TEXT, pid INT)")
    yield prefix
    for suffix in ("effects", "ledger", "records"):
        _admin(pg_dsn, f"DROP TABLE IF EXISTS {prefix}_{suffix}")


def _rows(dsn: str, table: str, kind: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            f"SELECT count(*) FROM {table}_effects WHERE kind = %s", (kind,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _process(mode: str, env: dict[str, str]) -> tuple[int, dict[str, Any] | None]:
    proc = subprocess.run(
        [sys.executable, str(WORKER), mode], env=env, capture_output=True, text=True, timeout=120
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return proc.returncode, (json.loads(lines[-1][7:]) if lines else None)


def crash_and_recover(
    pg_dsn: str, system_url: str, table: str, workflow: str, crash: str, lookup: bool = True
) -> dict[str, Any]:
    """Start ``workflow`` in a process that SIGKILLs itself at ``crash``; recover it in a
    new process; the recovered workflow's result."""
    env = {
        **os.environ,
        "TETHER_PG_DSN": pg_dsn,
        "DBOS_SYSTEM_URL": system_url,
        "TABLE": table,
        "WORKFLOW": workflow,
        "WORKFLOW_ID": f"wf-{table}",
        "CRASH": crash,
        "LOOKUP": "1" if lookup else "0",
    }
    code, result = _process("start", env)
    if crash:
        assert code == -9, f"the first process was not killed (exit {code}, {result})"
        assert result is None
    code, result = _process("recover", env)
    assert code == 0, result
    assert result is not None
    return result


# --- the gap, and the layer that closes it -----------------------------------------------


def test_engine_alone_runs_a_step_twice_after_a_crash_after_its_effect(
    pg_dsn: str, system_url: str, table: str
) -> None:
    """DBOS alone: killed after the effect, before the step's checkpoint, the recovered
    workflow runs the step again: 2 refunds (the gap tether closes)."""
    result = crash_and_recover(pg_dsn, system_url, table, "engine", "after_effect")
    assert result == {"ok": {"refund": "re_A-1", "amount": 10}}
    assert _rows(pg_dsn, table, "refund") == 2


@pytest.mark.parametrize(
    ("workflow", "crash", "lookup", "refunds", "ends"),
    [
        (
            "tether",
            "after_effect",
            True,
            1,
            "found",
        ),  # the dead process was mid-effect: lookup settles it
        (
            "tether",
            "after_record_1",
            True,
            1,
            "replayed",
        ),  # tether recorded it; DBOS had not checkpointed
        ("tether", "after_record_1", False, 1, "replayed"),
        ("tether", "before_effect", True, 1, "ran"),  # lookup says it never happened: it runs, once
        (
            "tether",
            "after_effect",
            False,
            1,
            "unknown",
        ),  # nothing can tell: an honest UnknownOutcome
        ("tether", "before_effect", False, 0, "unknown"),
        ("atether", "after_effect", True, 1, "found"),  # the async step, the same
        ("atether", "after_record_1", False, 1, "replayed"),
        ("atether", "after_effect", False, 1, "unknown"),
    ],
)
def test_guarded_step_after_a_crash(
    pg_dsn: str,
    system_url: str,
    table: str,
    workflow: str,
    crash: str,
    lookup: bool,
    refunds: int,
    ends: str,
) -> None:
    """tether.integrations.dbos.step, sync and async: the recovered step never runs the
    effect a second time."""
    result = crash_and_recover(pg_dsn, system_url, table, workflow, crash, lookup)
    assert _rows(pg_dsn, table, "refund") == refunds
    if ends == "unknown":
        assert result["error"] == "UnknownOutcome"
    elif ends == "found":
        assert result == {"ok": {"refund": "re_A-1", "amount": 10, "found": True}}
    else:
        assert result == {"ok": {"refund": "re_A-1", "amount": 10}}


def test_guarded_run_killed_after_its_effect(pg_dsn: str, system_url: str, table: str) -> None:
    """A guarded run killed right after its refund, before any checkpoint, recovered by a
    new process: 1 refund, each model call paid and counted once, a success that says so."""
    result = crash_and_recover(pg_dsn, system_url, table, "run", "after_effect")["ok"]
    assert _rows(pg_dsn, table, "refund") == 1
    assert _rows(pg_dsn, table, "model") == 2
    assert (result["status"], result["reason"], result["result"]) == (
        "success",
        "goal_reached",
        "refunded A-1",
    )
    assert (result["model_calls"], result["tool_calls"], result["cost_usd"]) == (2, 1, 0.02)
    assert "refund completed" in result["message"]
    assert result["open_issues"] == []


@pytest.mark.parametrize(
    ("workflow", "crash", "paid", "counted", "refunds"),
    [
        (
            "engine_run",
            "after_model_1",
            3,
            2,
            1,
        ),  # DBOS alone: the lost reply is asked (and paid) again
        ("run", "after_record_3", 2, 2, 1),  # tether recorded the reply: replayed, paid once
        ("run", "after_model_1", 3, 2, 1),  # before tether's record: asked again, as DBOS alone
        ("engine_run", "after_effect", 2, 2, 2),  # DBOS alone: the refund runs twice
        ("run", "after_effect", 2, 2, 1),
    ],
)
def test_spend_after_recovery(
    pg_dsn: str,
    system_url: str,
    table: str,
    workflow: str,
    crash: str,
    paid: int,
    counted: int,
    refunds: int,
) -> None:
    """Model calls paid (the provider's rows) and counted (the recovered run's usage)."""
    result = crash_and_recover(pg_dsn, system_url, table, workflow, crash)["ok"]
    assert (_rows(pg_dsn, table, "model"), result["model_calls"]) == (paid, counted)
    assert result["cost_usd"] == pytest.approx(0.01 * counted)
    assert _rows(pg_dsn, table, "refund") == refunds


def _approve_while(proc: subprocess.Popen[Any], records: tether.Records, seen: set[str]) -> int:
    """Approve every approval asked for while ``proc`` runs, as the operator page does;
    how many were approved."""
    import time

    approved = 0
    deadline = time.monotonic() + 90
    while proc.poll() is None and time.monotonic() < deadline:
        for record in records.approvals.list():
            mark = f"{record.id}@{record.requested_at}"
            if record.status == "pending" and mark not in seen:
                seen.add(mark)
                records.approvals.decide(record.id, "approved", "ops@example.com", "", time.time())
                approved += 1
        time.sleep(0.05)
    return approved


def test_a_crash_right_after_an_approved_refund(pg_dsn: str, system_url: str, table: str) -> None:
    """The approved refund's process dies right after the refund; the recovered workflow
    may ask for the approval again (today it does: the limit docs/durable.md states), and
    the refund is found by lookup, never made again: 1 refund, a success."""
    env = {
        **os.environ,
        "TETHER_PG_DSN": pg_dsn,
        "DBOS_SYSTEM_URL": system_url,
        "TABLE": table,
        "WORKFLOW": "approval",
        "WORKFLOW_ID": f"wf-{table}",
        "CRASH": "after_effect",
        "LOOKUP": "1",
    }
    records, seen = tether.Records.postgres(pg_dsn, table=f"{table}_records"), set[str]()
    try:
        first = subprocess.Popen(
            [sys.executable, str(WORKER), "start"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        assert _approve_while(first, records, seen) == 1
        assert first.wait(timeout=60) == -9
        assert _rows(pg_dsn, table, "refund") == 1
        second = subprocess.Popen(
            [sys.executable, str(WORKER), "recover"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        asked_again = _approve_while(second, records, seen)
        out, _ = second.communicate(timeout=60)
    finally:
        records.close()
    result = json.loads([line for line in out.splitlines() if line.startswith("RESULT ")][-1][7:])[
        "ok"
    ]
    assert (result["status"], result["result"]["found"]) == ("success", True)
    assert _rows(pg_dsn, table, "refund") == 1
    assert asked_again <= 1


def test_guarded_run_without_a_crash(pg_dsn: str, system_url: str, table: str) -> None:
    """No crash: the same run, in one process."""
    result = crash_and_recover(pg_dsn, system_url, table, "run", "")["ok"]
    assert (result["status"], result["model_calls"], _rows(pg_dsn, table, "refund")) == (
        "success",
        2,
        1,
    )


# --- in this process: approvals, the async shell, DBOS's retry with tether's verdict ------

CALLS: dict[str, int] = {}
GUARD: dict[str, tether.Guard] = {}


@pytest.fixture(scope="module")
def launched(system_url: str) -> Iterator[None]:
    """DBOS launched in this process (its workflows are this module's)."""
    config: DBOSConfig = {
        "name": "tether-tests",
        "system_database_url": system_url,
        "run_admin_server": False,
        "enable_otlp": False,
        "notification_listener_polling_interval_sec": 0.05,
    }
    DBOS(config=config)
    DBOS.launch()
    yield
    DBOS.destroy(workflow_completion_timeout_sec=0)


@pytest.fixture
def guard(pg_dsn: str, launched: None) -> Iterator[tether.Guard]:
    prefix = f"g_{uuid.uuid4().hex[:10]}"
    ledger = tether.Ledger.postgres(pg_dsn, table=f"{prefix}_ledger")
    records = tether.Records.postgres(pg_dsn, table=f"{prefix}_records")
    CALLS.clear()
    GUARD["guard"] = made = tether.Guard(ledger=ledger, records=records)
    yield made
    ledger.close()
    records.close()
    for suffix in ("ledger", "records"):
        _admin(pg_dsn, f"DROP TABLE IF EXISTS {prefix}_{suffix}")


def _refund(order: str) -> dict[str, str]:
    CALLS[order] = CALLS.get(order, 0) + 1
    return {"refund": f"re_{order}"}


def _approval_agent(run: tether.Run) -> None:
    while run.proceed():
        try:
            found = run.call_tool(
                "refund", _refund, {"order": "B-7"}, idempotent=False, requires_approval=True
            )
        except tether.ToolError as exc:
            run.fail(exc.model_message)
        run.succeed(found)


@DBOS.workflow()
def approval_workflow(poll: float, timeout: float | None) -> tether.Outcome:
    return tether_dbos.run(
        GUARD["guard"],
        _approval_agent,
        task="refund B-7",
        approval_poll=poll,
        approval_timeout=timeout,
    )


async def _async_agent(run: tether.Run) -> None:
    while run.proceed():
        reply = await async_model(run.model_calls)
        run.record_model_call(input_tokens=10, output_tokens=5, cost_usd=0.001, model="scripted")
        if reply == "done":
            run.succeed("done")
        else:
            await run.acall_tool("refund", _refund, {"order": "C-3"}, idempotent=False)


@tether_dbos.step(None, name="async_model")
async def async_model(turn: int) -> str:
    CALLS["model"] = CALLS.get("model", 0) + 1
    return "refund" if turn == 0 else "done"


@DBOS.workflow()
async def async_workflow() -> tether.Outcome:
    return await tether_dbos.arun(GUARD["guard"], _async_agent, task="refund C-3")


SCOPES = tether.BudgetScopes()


def _scoped_agent(run: tether.Run) -> None:
    while run.proceed():
        run.begin_model_call(model="scripted", estimated_input_tokens=10, max_output_tokens=10)
        CALLS["model"] = CALLS.get("model", 0) + 1
        run.record_model_call(input_tokens=10, output_tokens=5, cost_usd=0.001, model="scripted")
        run.progress()


async def _ascoped_agent(run: tether.Run) -> None:
    while run.proceed():
        await run.abegin_model_call(
            model="scripted", estimated_input_tokens=10, max_output_tokens=10
        )
        CALLS["model"] = CALLS.get("model", 0) + 1
        run.record_model_call(input_tokens=10, output_tokens=5, cost_usd=0.001, model="scripted")
        run.progress()


@DBOS.workflow()
def scoped_workflow(scope: str) -> tether.Outcome:
    return tether_dbos.run(GUARD["scoped"], _scoped_agent, task="read", scopes=(scope,))


@DBOS.workflow()
async def ascoped_workflow(scope: str) -> tether.Outcome:
    return await tether_dbos.arun(GUARD["scoped"], _ascoped_agent, task="read", scopes=(scope,))


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_spent_budget_scope_pauses_the_workflows_run(guard: tether.Guard, shell: str) -> None:
    """run(guard, agent, scopes=...): the tenant's scope allows 3 model calls; the 4th is
    never made and the workflow returns the paused run's outcome (BUDGET_REACHED)."""
    scope = f"tenant:{uuid.uuid4().hex[:8]}"
    SCOPES.limit(scope, max_model_calls=3)
    GUARD["scoped"] = tether.Guard(
        ledger=guard.ledger,
        records=guard.records,
        scopes=SCOPES,
        budget=tether.Budget(max_steps=20),
    )
    workflow = scoped_workflow if shell == "sync" else ascoped_workflow
    with SetWorkflowID(f"scoped-{uuid.uuid4().hex[:8]}"):
        outcome = DBOS.start_workflow(workflow, scope).get_result()
    assert (outcome.status, outcome.stopped_because) == ("paused", tether.StopReason.BUDGET_REACHED)
    assert CALLS == {"model": 3} and SCOPES.spent(scope).model_calls == 3


def _pending(guard: tether.Guard) -> tether.ApprovalRecord:
    import time

    for _ in range(400):
        found = [a for a in guard.approvals() if a.status == "pending"]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError("no approval became pending")


def test_an_approval_on_the_operator_page_resumes_the_waiting_workflow(guard: tether.Guard) -> None:
    """The workflow waits durably; the operator decides in the records (what `tether serve`
    writes); the workflow reads it at its next poll, resumes and refunds once."""
    with SetWorkflowID(f"appr-{uuid.uuid4().hex[:8]}"):
        handle = DBOS.start_workflow(approval_workflow, 0.1, None)
    pending = _pending(guard)
    assert (pending.tool, CALLS) == ("refund", {})
    assert guard.records is not None
    guard.records.approvals.decide(
        pending.id, "approved", "ops@example.com", "ok", 0.0
    )  # the page's call
    outcome = handle.get_result()
    assert (outcome.status, outcome.result, CALLS) == ("success", {"refund": "re_B-7"}, {"B-7": 1})


def test_a_rejection_sent_as_a_message_wakes_the_workflow_at_once(guard: tether.Guard) -> None:
    """tether_dbos.reject: guard.reject, then a DBOS message: no wait for the next poll."""
    import time

    workflow_id = f"rej-{uuid.uuid4().hex[:8]}"
    with SetWorkflowID(workflow_id):
        handle = DBOS.start_workflow(approval_workflow, 600.0, None)
    pending = _pending(guard)
    assert pending.checkpoint_id is not None
    started = time.monotonic()
    tether_dbos.reject(
        guard, pending.checkpoint_id, workflow_id=workflow_id, by="ops", reason="over the limit"
    )
    outcome = handle.get_result()
    assert time.monotonic() - started < 30
    assert (outcome.status, CALLS) == ("failed", {})
    assert "over the limit" in (outcome.detail or "")


def test_an_approval_that_does_not_come_in_time_returns_the_awaiting_outcome(
    guard: tether.Guard,
) -> None:
    """approval_timeout: the workflow ends awaiting approval, nothing executed."""
    with SetWorkflowID(f"late-{uuid.uuid4().hex[:8]}"):
        outcome = DBOS.start_workflow(approval_workflow, 0.1, 0.3).get_result()
    assert (outcome.status, outcome.stopped_because, CALLS) == (
        "awaiting_approval",
        tether.StopReason.AWAITING_APPROVAL,
        {},
    )


def test_the_async_shell(guard: tether.Guard) -> None:
    """arun in an async workflow: the same run, the same counts (a workflow id with
    characters a run id may not have gives a hashed run id)."""
    with SetWorkflowID(f"ticket 1001/async {uuid.uuid4().hex[:8]}"):
        outcome = DBOS.start_workflow(async_workflow).get_result()
    assert outcome.run_id.startswith("dbos_") and " " not in outcome.run_id
    assert (outcome.status, outcome.usage.model_calls, outcome.usage.cost_usd) == (
        "success",
        2,
        0.002,
    )
    assert CALLS == {"model": 2, "C-3": 1}


class Busy(tether.TransientError):
    pass


@tether_dbos.step(None, retries_allowed=True, max_attempts=3, interval_seconds=0.01)
def flaky(kind: str) -> str:
    CALLS[kind] = CALLS.get(kind, 0) + 1
    raise Busy("503") if kind == "busy" else ValueError("no such order")


@DBOS.step(retries_allowed=True, max_attempts=3, interval_seconds=0.01)
def plain_flaky(kind: str) -> str:
    CALLS[kind] = CALLS.get(kind, 0) + 1
    raise Busy("503") if kind == "busy" else ValueError("no such order")


@DBOS.workflow()
def retry_workflow(kind: str, guarded: bool) -> str:
    try:
        return flaky(kind) if guarded else plain_flaky(kind)
    except Exception as exc:
        return type(exc).__name__


@pytest.mark.parametrize(
    ("kind", "guarded", "calls", "raised"),
    [
        ("busy", True, 3, "DBOSMaxStepRetriesExceeded"),
        ("bad", True, 1, "ValueError"),
        ("busy", False, 3, "DBOSMaxStepRetriesExceeded"),
        ("bad", False, 3, "DBOSMaxStepRetriesExceeded"),  # DBOS alone retries a 400 too
    ],
)
def test_dbos_retries_what_tether_calls_retryable(
    launched: None, kind: str, guarded: bool, calls: int, raised: str
) -> None:
    """retries_allowed=True: DBOS's retry is the one layer; a permanent failure is tried once."""
    CALLS.clear()
    with SetWorkflowID(f"retry-{uuid.uuid4().hex[:8]}"):
        assert DBOS.start_workflow(retry_workflow, kind, guarded).get_result() == raised
    assert {kind: calls} == CALLS


@DBOS.step(retries_allowed=True, max_attempts=2, interval_seconds=0.01)
def two_layers() -> str:
    attempts = [0]

    def dependency() -> str:
        attempts[0] += 1
        if attempts[0] == 1:
            raise Busy("503")
        return "ok"

    return tether.RetryPolicy(max_attempts=2, base=0.001).call(dependency)


@DBOS.workflow()
def two_layers_workflow() -> str:
    return two_layers()


def test_a_tether_retry_inside_a_retried_step_is_warned_about(launched: None) -> None:
    """Two retry layers multiply attempts: RetryLayersWarning."""
    assert two_layers() == "ok"  # outside a workflow DBOS does not retry: no warning
    with (
        SetWorkflowID(f"layers-{uuid.uuid4().hex[:8]}"),
        pytest.warns(tether_dbos.RetryLayersWarning, match="DBOS retries too"),
    ):
        assert two_layers_workflow() == "ok"  # run in this thread


def test_outside_a_workflow(guard: tether.Guard) -> None:
    """A guarded step called outside a workflow is keyed by its arguments alone; run()
    outside a workflow is refused."""
    ledger = guard.ledger
    once = tether_dbos.step(ledger)(_refund)
    assert once("D-1") == once("D-1") == {"refund": "re_D-1"}
    assert CALLS == {"D-1": 1}
    with pytest.raises(RuntimeError, match=r"DBOS\.workflow"):
        tether_dbos.run(guard, _approval_agent)


def test_bad_configuration_fails_at_construction() -> None:
    """Each wrong value names the field."""
    with pytest.raises(TypeError, match="ledger"):
        tether_dbos.step("ledger.db")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="lookup"):
        tether_dbos.step(None, lookup="no")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lease"):
        tether_dbos.step(None, lease=0)
    with pytest.raises(ValueError, match="approval_poll"):
        tether_dbos._polls(0, None)
    with pytest.raises(ValueError, match="approval_timeout"):
        tether_dbos._polls(1.0, -1)
    with pytest.raises(TypeError, match="guard"):
        tether_dbos.run(None, _approval_agent)  # type: ignore[arg-type]


def test_should_retry_follows_the_verdict() -> None:
    """DBOS's should_retry from tether's verdict."""
    assert tether_dbos.should_retry(Busy("503")) is True
    assert tether_dbos.should_retry(ValueError("400")) is False
    assert tether_dbos.should_retry(tether.UnknownOutcome("k")) is False
    assert tether_dbos.should_retry(tether.EffectInProgress("k", 0.0)) is True
    assert tether_dbos.should_retry(tether.StoreUnavailable("down")) is True
