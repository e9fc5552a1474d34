"""A model provider that is down (#40, case 4): a bounded wait, an honest ending, and one
incident with one case for the outage, not a case per conversation; on SQLite and
PostgreSQL, with workers that file at the same moment."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import anthropic
import pytest

import tether
from scripted_server import Reply, ScriptedServer
from tether import Budget, Guard, RetryPolicy, StopReason, VirtualClock
from tether.integrations import anthropic as t_anthropic


def said(name: str) -> str:
    """A customer message of the default texts, with nothing done."""
    return str(getattr(tether.CustomerMessages(), name, name)).format(done="")


CONVERSATIONS = 24


def overloaded() -> Reply:
    return Reply(
        529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    )


def conversation(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"conversation {i}: where is my order?"}]


def provider(server: ScriptedServer, clock: VirtualClock) -> RetryPolicy:
    """The default retry policy and provider breaker (threshold twice a call's attempts, a
    probe 1 s after the trip), on the test's virtual clock."""
    breaker = tether.CircuitBreaker(f"anthropic:{server.url}", failure_threshold=10, clock=clock)
    return RetryPolicy(breaker=breaker, clock=clock)


def outage(
    tmp_path: Path, shell: str, **guard_kw: Any
) -> tuple[list[tether.Outcome], Counter[int], tether.Records]:
    """24 conversations, one after another, on one Guard with records, against a provider
    that answers 529 to everything; the outcomes and the requests of each conversation."""
    clock = VirtualClock()
    records = tether.Records.sqlite(str(tmp_path / "records.db"))
    guard_kw.setdefault("budget", Budget(max_seconds=300))  # the README's time budget
    guard = Guard(records=records, clock=clock, **guard_kw)
    outs: list[tether.Outcome] = []
    with ScriptedServer() as server:
        server.default = overloaded()
        policy = provider(server, clock)
        if shell == "sync":
            with anthropic.Anthropic(api_key="t", base_url=server.url) as raw:
                client = t_anthropic.guarded(raw, policy=policy)
                for i in range(CONVERSATIONS):
                    outs.append(t_anthropic.run_agent(client, model="claude-haiku-4-5",
                                                      messages=conversation(i), guard=guard))  # fmt: skip
        else:

            async def main() -> None:
                async with anthropic.AsyncAnthropic(api_key="t", base_url=server.url) as raw:
                    client = t_anthropic.guarded(raw, policy=policy)
                    for i in range(CONVERSATIONS):
                        outs.append(await t_anthropic.arun_agent(client, model="claude-haiku-4-5",
                                                                 messages=conversation(i), guard=guard))  # fmt: skip

            asyncio.run(main())
        per = Counter(
            int(r.body["messages"][0]["content"].split()[1].rstrip(":")) for r in server.requests
        )
    return outs, per, records


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_an_outage_ends_each_conversation_within_the_bounded_wait(
    tmp_path: Path, shell: str
) -> None:
    """A provider down for good: no conversation waits more than outage_wait (10 s) past its
    retries (they waited 60-84 s with max_seconds=300), and few requests go to the provider."""
    outs, per, _ = outage(tmp_path, shell)
    longest = max(o.usage.seconds for o in outs)
    assert longest <= 10 + 7.5 + 1  # the bound, after one call's retries (0.5+1+2+4 s at most)
    # probes of the breaker, one at a time across conversations (they were 75, 24 at most)
    assert max(per.values()) <= 10
    assert sum(per.values()) <= 40
    stopped = [o for o in outs if o.stopped_because is StopReason.CIRCUIT_OPEN]
    assert len(stopped) >= CONVERSATIONS - 2  # the first two end ERROR before the breaker trips
    assert all(o.usage.seconds <= 10 + 1 for o in stopped)


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_an_outage_is_one_incident_with_one_case(tmp_path: Path, shell: str) -> None:
    """The conversations an outage stopped are one case in the records (they were 22), each
    run naming it; the customer reads the outage message, a person promised."""
    outs, _, records = outage(tmp_path, shell)
    stopped = [o for o in outs if o.stopped_because is StopReason.CIRCUIT_OPEN]
    cases = records.handoffs.list(limit=100)
    assert len(cases) == 1
    case = cases[0]
    assert case["incident"]["dependency"].startswith("anthropic:http://127.0.0.1:")
    assert {o.handoff.id for o in stopped} == {case["id"]}
    assert {o.status for o in stopped} == {"escalated"}
    assert {o.customer_message for o in stopped} == {said("outage")}
    held, total = records.incidents.runs(case["id"])
    assert total == len(stopped) == len(held)
    assert {r["run_id"] for r in held} == {o.run_id for o in stopped}
    filed = {r["run_id"]: r for r in records.runs.list(limit=100)}
    assert all(filed[o.run_id]["handoff_id"] == case["id"] for o in stopped)
    # the operator page: one open case, naming the outage and the conversations it stopped
    from starlette.testclient import TestClient

    from tether.serve import create_app

    inbox = TestClient(create_app(records), base_url="http://127.0.0.1:8765").get("/inbox").text
    assert "(0 to approve, 1 open cases)" in inbox
    assert f"Outage of {case['incident']['dependency']}:</b> {len(stopped)} conversations" in inbox
    assert inbox.count('href="/runs/') >= 10 + 1  # the newest ten, and the case's own run


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_an_escalation_sink_gets_one_handoff_per_incident(tmp_path: Path, shell: str) -> None:
    """Before: an Escalation(sink=...) beside the records got one handoff per conversation the
    outage stopped (one incident). Now: one, the incident's first run's, whose id is the
    incident's case; the records list every conversation it holds."""
    handed: list[tether.HandoffRecord] = []
    outs, _, records = outage(tmp_path, shell, escalation=tether.Escalation(sink=handed.append))
    stopped = [o for o in outs if o.stopped_because is StopReason.CIRCUIT_OPEN]
    assert len(stopped) >= CONVERSATIONS - 2
    # with a sink, the conversations that ended ERROR before the trip are handed over too
    (case,) = [c for c in records.handoffs.list(limit=100) if c.get("incident")]
    outage_handoffs = [h for h in handed if h.reason is StopReason.CIRCUIT_OPEN]
    assert [h.id for h in outage_handoffs] == [case["id"]]
    assert outage_handoffs[0].run_id == stopped[0].run_id
    assert len(handed) == len(outs) - len(stopped) + 1
    held, total = records.incidents.runs(case["id"])
    assert total == len(stopped) and {r["run_id"] for r in held} == {o.run_id for o in stopped}
    assert {o.customer_message for o in stopped} == {said("outage")}  # a person has them all


def test_outage_wait_none_waits_as_the_time_budget_allows(tmp_path: Path) -> None:
    """Guard(outage_wait=None): the old wait, up to three breaker cooldowns a call."""
    outs, _, _ = outage(tmp_path, "sync", outage_wait=None)
    stopped = [o for o in outs if o.stopped_because is StopReason.CIRCUIT_OPEN]
    assert min(o.usage.seconds for o in stopped) > 60


def test_outage_wait_zero_ends_at_once_and_no_budget_never_waits(tmp_path: Path) -> None:
    """outage_wait=0, or a run with no time budget: no wait for the probe."""
    for kw in ({"outage_wait": 0}, {"budget": Budget()}):
        where = tmp_path / next(iter(kw))
        where.mkdir()
        outs, _, _ = outage(where, "sync", **kw)
        stopped = [o for o in outs if o.stopped_because is StopReason.CIRCUIT_OPEN]
        assert stopped and max(o.usage.seconds for o in stopped) < 1


@pytest.mark.parametrize("bad", [-1, True, "10"])
def test_outage_wait_is_checked(bad: Any) -> None:
    """A negative, boolean or text outage_wait is refused."""
    with pytest.raises(ValueError, match="outage_wait"):
        Guard(outage_wait=bad)


def down(records: tether.Records | None, clock: VirtualClock) -> Guard:
    """A guard whose "orders" tool's service is down: its breaker open, a probe in 60 s."""
    guard = Guard(records=records, clock=clock, budget=Budget(max_seconds=30),
                  breaker_threshold=1, breaker_cooldown=60)  # fmt: skip
    breaker = guard.breaker("orders")
    if breaker.state == "closed":
        with pytest.raises(ConnectionRefusedError):
            breaker.call(unreachable)
    return guard


def unreachable() -> None:
    raise ConnectionRefusedError("orders service refused the connection")


def stopped_run(guard: Guard, task: str) -> tether.Outcome:
    """One run on the "orders" tool, whose service is down."""
    with guard.start(task=task) as run:
        while run.proceed():
            run.call_tool("orders", unreachable, {})
    return run.outcome


def test_without_records_the_outage_message_promises_no_person() -> None:
    """No records, no sink: the run fails with the outage message, promising nobody."""
    out = stopped_run(down(None, VirtualClock()), "t")
    assert out.stopped_because is StopReason.CIRCUIT_OPEN
    assert out.customer_message == said("outage_no_case")


# --- the incident in the records: resolved once, and workers filing at once -----------------


def test_a_resolved_incident_is_not_joined_again(tmp_path: Path) -> None:
    """Once a person resolves the incident, the next outage opens a new one."""
    clock = VirtualClock()
    records = tether.Records.sqlite(str(tmp_path / "r.db"))
    first = [stopped_run(down(records, clock), f"t{i}") for i in range(3)]
    assert {o.stopped_because for o in first} == {StopReason.CIRCUIT_OPEN}
    assert len({o.handoff.id for o in first}) == 1
    records.handoffs.resolve(first[0].handoff.id, by="carol", note="service back", at=1.0)
    later = stopped_run(down(records, clock), "t4")
    assert later.handoff.id != first[0].handoff.id
    assert [c["state"] for c in records.handoffs.list()] == ["open", "resolved"]
    assert records.incidents.runs(first[0].handoff.id)[1] == 3


def test_an_incident_quiet_for_the_gap_is_not_joined(tmp_path: Path) -> None:
    """A run stopped INCIDENT_GAP after the incident's last one opens a new incident."""
    from tether.records._incidents import INCIDENT_GAP

    clock = VirtualClock()
    records = tether.Records.sqlite(str(tmp_path / "r.db"))
    first = stopped_run(down(records, clock), "a")
    clock.advance(INCIDENT_GAP + 1)
    second = stopped_run(down(records, clock), "b")
    assert StopReason.CIRCUIT_OPEN is first.stopped_because is second.stopped_because
    assert first.handoff.id != second.handoff.id


def filing_at_once(open_records: Any, workers: int = 12) -> tether.Records:
    """``workers`` threads, each with its own records connection and guard, end a run
    stopped by the same outage at the same moment; the records to read back."""
    clock = VirtualClock()
    down(None, clock)  # the breaker, shared by every worker's guard (one name, one store)
    barrier = threading.Barrier(workers, timeout=60)
    start = threading.Barrier(workers, timeout=60)  # a fleet starting cold: no table yet
    outs: list[tether.Outcome] = []
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        start.wait()
        try:
            records = open_records()  # every worker makes the tables and the ledger's at once
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()  # the others stop waiting for this worker
            return
        try:
            guard = down(records, clock)
            with guard.start(task=f"conversation {i}") as run:
                barrier.wait()
                while run.proceed():
                    run.call_tool("orders", unreachable, {})
            outs.append(run.outcome)
        except BaseException as exc:
            errors.append(exc)
        finally:
            records.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(outs) == workers
    assert {o.stopped_because for o in outs} == {StopReason.CIRCUIT_OPEN}
    assert len({o.handoff.id for o in outs}) == 1
    return open_records()


def test_workers_filing_at_once_on_sqlite_get_one_case(tmp_path: Path) -> None:
    """12 workers on one SQLite file, filing the same outage at once: one case, 12 runs."""
    path = str(tmp_path / "shared.db")
    records = filing_at_once(lambda: tether.Records.sqlite(path))
    cases = records.handoffs.list()
    assert len(cases) == 1
    assert records.incidents.runs(cases[0]["id"])[1] == 12


def test_workers_filing_at_once_on_postgres_get_one_case(pg_dsn: str) -> None:
    """12 workers on one PostgreSQL database, filing the same outage at once: one case."""
    table = f"t_outage_{uuid.uuid4().hex[:8]}"
    records = filing_at_once(lambda: tether.Records.postgres(pg_dsn, table))
    try:
        cases = records.handoffs.list()
        assert len(cases) == 1
        assert records.incidents.runs(cases[0]["id"])[1] == 12
    finally:
        with records.store.sql(write=True) as sql:
            for name in ("documents", "runs", "run_tools", "decisions", "incidents", "ledger"):
                sql.run(
                    f"DROP TABLE IF EXISTS {table if name == 'documents' else table + '_' + name}"
                )
        records.close()
