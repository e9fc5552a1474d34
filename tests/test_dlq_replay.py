"""``tether dlq replay --by NAME`` is the page's replay (#40): who ran it is kept on the
letter, and once the handler ran the case of the letter's run is resolved in that name,
the case naming the letter and the letter reaching the case through its run; an outage's
incident is never closed by a replay. On SQLite and PostgreSQL (a schema of its own)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import tether
from tether import Budget, Guard, StopReason, ToolError, VirtualClock
from tether.cli import main

charged: list[str] = []


def charge_handler(customer: str) -> str:
    charged.append(customer)
    return f"charged {customer}"


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A records database: a SQLite file, or a PostgreSQL DSN whose tables live in a schema
    of their own (the command line opens the default tables)."""
    charged.clear()
    if request.param == "sqlite":
        yield str(tmp_path / "records.db")
        return
    dsn = request.getfixturevalue("pg_dsn")
    schema = f"tether_replay_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in dsn else "?"
    try:
        yield f"{dsn}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def declined(customer: str) -> None:
    raise PermissionError("card declined")


def a_letter_and_its_case(records: tether.Records) -> tuple[str, str, str]:
    """A run whose charge failed for good (a dead letter) and that a person must finish (a
    case): the letter's id, its run's id and the case's id."""
    guard = Guard(records=records, clock=VirtualClock())
    with guard.start(task="charge card, then a person") as run:
        with contextlib.suppress(ToolError):
            run.call_tool("charge", declined, {"customer": "c_2"}, idempotent=False)
        run.escalate("the card was declined")
    (letter,) = records.dead_letters.list()
    assert run.outcome.handoff is not None
    return letter.id, run.outcome.run_id, run.outcome.handoff.id


def test_a_replay_needs_a_name_and_resolves_the_runs_case_linked_both_ways(
    where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: the command line asked no name, and the case of the letter's run stayed
    open (the page closed it, the CLI did not). Now: no --by, nothing runs (exit 2); with
    it, the letter says who replayed it and the case is resolved by them, naming the letter."""
    with tether.Records.open(where) as records:
        letter_id, _, case_id = a_letter_and_its_case(records)
    replay = [
        "dlq",
        "--db",
        where,
        "replay",
        letter_id,
        "--handler",
        "test_dlq_replay:charge_handler",
    ]
    with pytest.raises(SystemExit) as refused:
        main(replay)
    assert refused.value.code == 2 and "--by" in capsys.readouterr().err
    assert charged == []
    assert main([*replay, "--by", "  "]) == 2 and charged == []
    assert main([*replay, "--by", "dana"]) == 0
    out = capsys.readouterr().out
    assert "charged c_2" in out and f"case {case_id} resolved by dana" in out
    with tether.Records.open(where) as records:
        assert records.dead_letters.get(letter_id).replayed_by == "dana"
        case = records.handoffs.get(case_id)
        assert (case["state"], case["resolved_by"], case["dead_letter"]) == (
            "resolved",
            "dana",
            letter_id,
        )
        assert "replayed by dana" in case["resolution"]
        run = records.runs.get(records.dead_letters.get(letter_id).run_id)
        assert run is not None and run["handoff_id"] == case_id  # the letter reaches its case
    with tether.Records.open(where) as records:
        first = records.dead_letters.get(letter_id)
    assert main([*replay, "--by", "erin"]) == 0  # again: not run again, the case stays dana's
    assert charged == ["c_2"]
    out = capsys.readouterr().out
    assert "replayed before by dana" in out and "unchanged" in out
    with tether.Records.open(where) as records:
        assert records.handoffs.get(case_id)["resolved_by"] == "dana"
        again = records.dead_letters.get(letter_id)  # a replay that ran nothing changes nothing
        assert (again.replayed_by, again.replayed_at) == ("dana", first.replayed_at)


def test_a_failed_replay_leaves_the_case_open(
    where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with tether.Records.open(where) as records:
        letter_id, _, case_id = a_letter_and_its_case(records)
    replay = ["dlq", "--db", where, "replay", letter_id, "--by", "dana", "--handler"]
    assert main([*replay, "test_dlq_replay:declined"]) == 1
    assert "card declined" in capsys.readouterr().err
    with tether.Records.open(where) as records:
        assert records.handoffs.get(case_id)["state"] == "open"


def test_an_outages_incident_is_never_closed_by_a_replay(
    where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run with a dead letter that an outage then stopped: its case is the outage's
    incident, holding other conversations; the replay runs, the incident stays open."""
    with tether.Records.open(where) as records:
        guard = Guard(records=records, clock=VirtualClock(), budget=Budget(max_seconds=300),
                      breaker_threshold=2, wait_for_recovery=False)  # fmt: skip

        def down() -> None:
            raise TimeoutError("the stock service does not answer")

        for _ in range(2):  # the stock service's breaker trips
            with contextlib.suppress(TimeoutError):
                guard.breaker("stock").call(down)
        with guard.start(task="charge, then check the stock") as run:
            with contextlib.suppress(ToolError):
                run.call_tool("charge", declined, {"customer": "c_3"}, idempotent=False)
            with contextlib.suppress(tether.Stopped, ToolError):
                run.call_tool("stock", lambda: 3, {})
        assert run.outcome.stopped_because is StopReason.CIRCUIT_OPEN
        assert run.outcome.handoff is not None
        incident = run.outcome.handoff.id
        assert records.handoffs.get(incident).get("incident")
        (letter,) = records.dead_letters.list()
    assert main(["dlq", "--db", where, "replay", letter.id, "--by", "dana", "--handler",
                 "test_dlq_replay:charge_handler"]) == 0  # fmt: skip
    assert charged == ["c_3"]
    assert "left open for a person to close" in capsys.readouterr().out
    with tether.Records.open(where) as records:
        case = records.handoffs.get(incident)
        assert case["state"] != "resolved" and "dead_letter" not in case
        assert records.dead_letters.get(letter.id).replayed_by == "dana"
