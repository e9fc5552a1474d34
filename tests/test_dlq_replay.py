"""``tether dlq replay --by NAME`` is the page's replay (#40): who ran it is kept on the
letter, and once the handler ran the case of the letter's run is resolved in that name,
the case naming the letter and the letter reaching the case through its run; an outage's
incident is never closed by a replay. On SQLite and PostgreSQL (a schema of its own)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import tether
from tether import Budget, Guard, StopReason, ToolError, VirtualClock
from tether.cli import main
from tether.records._replay import replay_letter

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


def slow_charge(customer: str) -> str:
    """A handler that says it started (a file) and ends when the test lets it (a file)."""
    Path(os.environ["TETHER_TEST_STARTED"]).write_text("started")
    release = Path(os.environ["TETHER_TEST_RELEASE"])
    deadline = time.monotonic() + 60
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    with Path(os.environ["TETHER_TEST_CALLS"]).open("a") as calls:
        calls.write(f"{customer}\n")
    return f"charged {customer}"


def test_two_processes_replaying_one_letter_run_the_handler_once_in_the_first_ones_name(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Dana's replay (another process) holds the letter while its handler runs: Erin's
    replay is told Dana is replaying it and calls nothing; afterwards the letter and the
    case name Dana, and a later replay says Dana replayed it."""
    with tether.Records.open(where) as records:
        letter_id, _, case_id = a_letter_and_its_case(records)
    files = {name: tmp_path / name for name in ("started", "release", "calls")}
    env = {**os.environ, **{f"TETHER_TEST_{n.upper()}": str(p) for n, p in files.items()}}
    replay = ["dlq", "--db", where, "replay", letter_id, "--handler", "test_dlq_replay:slow_charge"]
    dana = subprocess.Popen(
        [sys.executable, "-m", "tether.cli", *replay, "--by", "dana"],
        cwd=Path(__file__).parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not files["started"].exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert files["started"].exists(), dana.communicate(timeout=5)
        os.environ.update({k: v for k, v in env.items() if k.startswith("TETHER_TEST_")})
        assert main([*replay, "--by", "erin"]) == 1
        assert "is being replayed right now by dana" in capsys.readouterr().err
    finally:
        files["release"].write_text("go")
        out, err = dana.communicate(timeout=60)
        for name in ("STARTED", "RELEASE", "CALLS"):
            os.environ.pop(f"TETHER_TEST_{name}", None)
    assert dana.returncode == 0, err
    assert files["calls"].read_text() == "c_2\n"  # the handler ran once, in Dana's process
    assert f"case {case_id} resolved by dana" in out
    with tether.Records.open(where) as records:
        letter = records.dead_letters.get(letter_id)
        assert (letter.replayed, letter.replayed_by) == (True, "dana")
        assert records.handoffs.get(case_id)["resolved_by"] == "dana"
    assert main([*replay, "--by", "erin"]) == 0
    assert "replayed before by dana" in capsys.readouterr().out
    assert files["calls"].read_text() == "c_2\n"


class _After:
    """A replay ledger whose ``once`` waits for ``done``: a replay that read the letter
    before the other replay ran, and reaches the ledger after it settled."""

    def __init__(self, ledger: Any, done: threading.Event) -> None:
        self.ledger, self.done = ledger, done

    def get(self, key: str) -> Any:
        return self.ledger.get(key)

    def once(self, key: str, fn: Any, **kwargs: Any) -> Any:
        assert self.done.wait(30)
        return self.ledger.once(key, fn, **kwargs)


def test_a_replay_that_read_the_letter_before_another_ran_leaves_the_letter_to_it(
    where: str,
) -> None:
    """Before: Erin's replay, having read the letter before Dana's ran, found the ledger
    done and wrote herself as the letter's replayer (the handler never ran for her). Now
    the letter keeps Dana, who ran it, and Erin is told Dana replayed it."""
    with tether.Records.open(where) as records:
        letter_id, _, _ = a_letter_and_its_case(records)
    done = threading.Event()
    told: list[Any] = []
    with tether.Records.open(where) as erins, tether.Records.open(where) as danas:
        ledger = _After(erins.dead_letters._replay_ledger(), done)

        def erin() -> None:
            told.append(erins.dead_letters._replay(letter_id, charge_handler, by="erin",
                                                   ledger=ledger))  # type: ignore[arg-type]  # fmt: skip

        racer = threading.Thread(target=erin)
        racer.start()
        try:
            assert danas.dead_letters.replay(letter_id, charge_handler, by="dana") == "charged c_2"
            first = danas.dead_letters.get(letter_id)
        finally:
            done.set()
            racer.join(30)
    assert charged == ["c_2"]
    with tether.Records.open(where) as records:
        letter = records.dead_letters.get(letter_id)
    assert (letter.replayed_by, letter.replayed_at) == ("dana", first.replayed_at)
    (replayed,) = told
    assert (replayed.result, replayed.ran, replayed.letter.replayed_by) == (
        "charged c_2",
        False,
        "dana",
    )


def test_a_replay_marks_a_letter_whose_replay_ran_but_was_not_marked_and_closes_its_case(
    where: str,
) -> None:
    """Dana's replay ran the handler (the ledger recorded it) but the letter's write failed:
    her replay raised and the case stayed open. Before, Erin's replay returned the recorded
    result and left the case open. Now it marks the letter in Dana's name (the replay that
    ran it) and resolves the case, linked to the letter as a successful replay is."""
    with tether.Records.open(where) as records:
        letter_id, _, case_id = a_letter_and_its_case(records)
        store = records.dead_letters.store
        put = store.put

        def full_disk(kind: str, doc_id: str, doc: dict[str, Any], at: float) -> None:
            if doc.get("replayed"):
                raise OSError("disk full")
            put(kind, doc_id, doc, at)

        store.put = full_disk  # type: ignore[method-assign]
        with pytest.raises(OSError, match="disk full"):
            replay_letter(records, letter_id, charge_handler, by="dana", at=100.0)
        store.put = put  # type: ignore[method-assign]
        assert records.dead_letters.get(letter_id).replayed is False
        assert records.handoffs.get(case_id)["state"] == "open"
        replayed = replay_letter(records, letter_id, charge_handler, by="erin", at=200.0)
        assert charged == ["c_2"]  # not called again
        letter = records.dead_letters.get(letter_id)
        case = records.handoffs.get(case_id)
    assert (letter.replayed, letter.replayed_by) == (True, "dana")
    assert (case["state"], case["resolved_by"], case["dead_letter"]) == (
        "resolved",
        "erin",
        letter_id,
    )
    assert "replayed by dana" in case["resolution"] and "marked by erin" in case["resolution"]
    assert (replayed.result, replayed.ran, replayed.repaired) == ("charged c_2", False, True)


def test_replay_shows_its_options_and_refuses_a_misspelled_one(tmp_path: Path) -> None:
    import inspect

    with tether.Records.open(str(tmp_path / "r.db")) as records:
        letters = records.dead_letters
        params = inspect.signature(letters.replay).parameters
        assert {n: p.default for n, p in params.items() if p.kind is p.KEYWORD_ONLY} == {
            "force": False,
            "ledger": None,
            "lookup": None,
            "by": "",
        }
        with pytest.raises(TypeError, match="forse"):
            letters.replay("no-such-letter", lambda **kw: kw, forse=True)  # type: ignore[call-arg]
