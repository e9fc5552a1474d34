"""The read-only commands: `tether` alone, `dlq list|show` and `records list|show`, on SQLite
and PostgreSQL alike, with headers or JSON, ISO times, and the page's redaction."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import tether
from tether import Guard, Records
from tether.cli import main
from tether.records._collections import DeadLetters

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def test_no_command_prints_usage_on_stderr_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """`tether` alone is a usage error (as argparse's own), not a success."""
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("usage: tether") and "a command is needed" in err
    named = err.split("a command is needed (", 1)[1].split(")", 1)[0].split(", ")
    assert named == ["bench", "demo", "dlq", "records", "scopes", "serve"]  # scopes was left out


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "records.db")
    dsn: str = request.getfixturevalue("pg_dsn")
    return dsn


def _park(where: str, email: str) -> str:
    opened = DeadLetters.postgres(where) if Records.is_dsn(where) else DeadLetters.sqlite(where)
    with opened as letters:
        letter = letters.park(tool="send_email", args={"to": email, "api_key": "sk-live-abcdefghijk"},
                              error=ValueError(f"mailbox {email} does not exist"),
                              run_id="run_1", task="notify", at=1796126400.0)  # fmt: skip
    return str(letter.id)


def test_dlq_list_has_a_header_iso_times_and_masks_as_the_page(
    where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table starts with a header; the e-mail in the error is masked as on the page; the
    time is ISO 8601 in UTC; --json gives the same letters as data."""
    email = f"ann.{uuid.uuid4().hex[:8]}@example.com"
    letter_id = _park(where, email)
    assert main(["dlq", "--db", where, "list"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["ID", "AT", "(UTC)"]
    assert letter_id in out and "2026-12-01T12:00:00Z" in out
    assert email not in out
    assert main(["dlq", "--db", where, "list", "--json"]) == 0
    (doc,) = [d for d in json.loads(capsys.readouterr().out) if d["id"] == letter_id]
    assert ISO.match(doc["at"]) and doc["args"]["api_key"] == "[redacted]"
    assert email not in json.dumps(doc)


def test_dlq_list_is_newest_first(where: str, capsys: pytest.CaptureFixture[str]) -> None:
    """As its help says and as `records list`: the newest letter first, --limit keeps the
    newest (before: oldest first on both stores)."""
    tag, later = uuid.uuid4().hex[:8], time.time() + 3e9  # after any other test's letters
    opened = DeadLetters.postgres(where) if Records.is_dsn(where) else DeadLetters.sqlite(where)
    with opened as letters:
        ids = [
            letters.park(
                tool=f"t{i}_{tag}", args={}, error=ValueError("no"), run_id="r", task="t", at=at
            ).id
            for i, at in enumerate((later, later + 1, later + 2))
        ]
    assert main(["dlq", "--db", where, "list", "--limit", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:]] == [ids[2], ids[1]]
    assert main(["dlq", "--db", where, "list", "--json", "--limit", "2"]) == 0
    assert [d["id"] for d in json.loads(capsys.readouterr().out)] == [ids[2], ids[1]]


def test_dlq_show_gives_iso_times(where: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`dlq show` is a JSON document with `at` in ISO 8601, redacted."""
    letter_id = _park(where, "bob@example.com")
    assert main(["dlq", "--db", where, "show", letter_id]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["at"] == "2026-12-01T12:00:00Z"
    assert "bob@example.com" not in json.dumps(doc)


def test_records_list_and_show(where: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`records list` shows the newest runs with a header (or JSON), `records show` one run."""
    task = f"refund order {uuid.uuid4().hex[:8]} for carol@example.com"
    records = Records.open(where)
    with records, Guard(records=records).start(task=task) as run:
        run.proceed()
        run.succeed("refunded")
    assert main(["records", "list", "--db", where, "--limit", "1000"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:2] == ["RUN", "ENDED"]
    assert run.run_id in out and "carol@example.com" not in out
    assert main(["records", "list", "--db", where, "--json", "--status", "success"]) == 0
    (doc,) = [d for d in json.loads(capsys.readouterr().out) if d["run_id"] == run.run_id]
    assert doc["status"] == "success" and ISO.match(doc["ended_at"])
    assert main(["records", "show", run.run_id, "--db", where, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["run_id"] == run.run_id and shown["result"] == "refunded"
    assert "carol@example.com" not in json.dumps(shown)
    assert main(["records", "show", "run_missing", "--db", where]) == 1


def test_bad_input_is_a_clear_error_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing file and an impossible --limit say what is wrong; nothing is created."""
    missing = str(tmp_path / "nope.db")
    assert main(["records", "list", "--db", missing]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["dlq", "--db", missing, "list"]) == 2
    assert not Path(missing).exists()
    db = str(tmp_path / "r.db")
    Records.sqlite(db).close()
    for argv in (
        ["records", "list", "--db", db, "--limit", "0"],
        ["dlq", "list", "--db", db, "--limit", "0"],  # before: "no dead letters", exit 0
        ["dlq", "list", "--db", db, "--limit", "-5"],  # before: accepted
        ["records", "list", "--db", db, "--status", "bogus"],  # before: "no runs", exit 0
        ["records", "list", "--db", db, "--reason", "bogus"],
    ):
        with pytest.raises(SystemExit) as refused:
            main(argv)
        err = capsys.readouterr().err
        assert refused.value.code == 2, argv
        assert "must be 1..1000" in err if "--limit" in argv else "is none of:" in err
        if "--status" in argv:  # the valid values, named
            assert "success, partial, awaiting_approval, paused, escalated, failed" in err


def test_records_show_names_the_totals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: the raw `counts` rows ({"81936ce4c999": [1, 1, ...]}). Now the totals by
    name for a person; --json keeps the document and adds them under `totals`."""
    db = str(tmp_path / "r.db")
    records = Records.sqlite(db)
    with records, Guard(records=records).start(task="look it up") as run:
        run.call_tool("lookup", lambda order: {"order": order}, {"order": "7"})
        run.call_tool("lookup", lambda order: {"order": order}, {"order": "8"})
        run.succeed("found")
    assert main(["records", "show", run.run_id, "--db", db]) == 0
    out = capsys.readouterr().out
    assert "  tool calls: 2" in out and "  steps: 0" in out and "cost: $0.0000" in out
    assert "counts" not in out
    assert main(["records", "show", run.run_id, "--db", db, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["totals"]["tool_calls"] == 2 and "counts" in doc


def test_help_and_results_a_person_can_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`dlq list`'s count column is named and explained; `records prune` fits 80 columns;
    `serve --redis` says it feeds the Scopes page too."""
    db = str(tmp_path / "r.db")
    _park(db, "dan@example.com")
    assert main(["dlq", "--db", db, "list"]) == 0
    assert "ASKED" not in capsys.readouterr().out.splitlines()[0]
    with pytest.raises(SystemExit):
        main(["dlq", "list", "--help"])
    assert "TIMES (how many times" in " ".join(capsys.readouterr().out.split())
    assert main(["records", "prune", "--db", db, "--older-than", "0"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80 and "  0  runs" in out
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "Scopes" in " ".join(capsys.readouterr().out.split())


def test_a_store_that_cannot_be_used_is_one_clear_line_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pg_dsn: str
) -> None:
    """Before: a traceback ending in StoreUnavailable after the pool's 10 s wait, or in
    CheckpointError. Now: one line naming the store and the DSN without its password; exit
    1 when the server does not answer, 2 when what was given is wrong; within seconds."""
    started = time.monotonic()
    assert main(["dlq", "list", "--db", "postgresql://postgres:hunter2@127.0.0.1:1/x"]) == 1
    err = capsys.readouterr().err
    assert time.monotonic() - started < 8  # the pool waited 10 s
    assert err.startswith("tether dlq list: cannot use the dead letters at postgresql://")
    assert "hunter2" not in err and len(err.strip().splitlines()) == 1
    base, _, _ = pg_dsn.rpartition("/")
    missing_db = f"{base}/tether_no_such_{uuid.uuid4().hex[:8]}"
    assert main(["records", "list", "--db", missing_db]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tether records list: cannot use the records at ")
    assert "does not exist" in err and len(err.strip().splitlines()) == 1
    text = tmp_path / "passwd"
    text.write_text("root:x:0:0:root:/root:/bin/bash\n" * 10)
    for argv in (["dlq", "list", "--db", str(text)], ["records", "list", "--db", str(text)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "file is not a database" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("dsn", "secrets"),
    [
        ("postgresql://postgres:se%ZZcret@127.0.0.1:5432/test", ["se%ZZcret", "cret"]),
        ("postgresql://postgres:hun@ter2@127.0.0.1:5432/test", ["hun@ter2", "ter2"]),
        ("postgresql://postgres:s3cr3t@127.0.0.1:1/x", ["s3cr3t"]),
    ],
)
def test_a_malformed_dsn_never_shows_its_password(
    dsn: str, secrets: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: libpq's reason repeated the password of a URL it could not read
    (``invalid percent-encoded token: "se%ZZcret"``) or split at an ``@`` inside it
    (``failed to resolve host 'ter2@127.0.0.1'``), and the line printed it."""
    assert main(["dlq", "list", "--db", dsn]) in (1, 2)
    err = capsys.readouterr().err
    assert err.startswith("tether dlq list: cannot use the dead letters at postgresql://")
    assert [s for s in secrets if s in err] == [], err


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path: Path) -> None:
    """`tether dlq list | head -1`: before, a BrokenPipeError traceback; now nothing on
    stderr, as Unix tools end when their reader goes away."""
    db = str(tmp_path / "records.db")
    with DeadLetters.sqlite(db) as letters:
        for i in range(400):  # 400 rows of 250+ characters: more than a pipe's buffer holds
            tool = f"t{i}_" + "x" * 250
            letters.park(tool=tool, args={}, error=ValueError("no"), run_id="r", task="t", at=i)
    # wide enough that the table's rows keep their 250+ characters (it fits the terminal)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "COLUMNS": "400"}
    for argv in (["dlq", "list", "--db", db], ["dlq", "list", "--json", "--db", db]):
        reader = subprocess.Popen(
            [sys.executable, "-m", "tether.cli", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        assert reader.stdout is not None and reader.stderr is not None
        reader.stdout.read(10)
        reader.stdout.close()  # as `head` does once it has its lines
        with reader.stderr:
            err = reader.stderr.read().decode()
        assert reader.wait(60) != 0 and err == "", err


def test_dlq_replay_help_states_the_handlers_contract(capsys: pytest.CaptureFixture[str]) -> None:
    """`dlq replay --help` says what the handler gets, returns and how often it is called."""
    with pytest.raises(SystemExit):
        main(["dlq", "replay", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "keyword arguments" in text and "once per letter" in text and "--force" in text
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    served = " ".join(capsys.readouterr().out.split())
    for said in (text, served):  # the whole contract, in both: before, "cannot be replayed"
        assert "cannot be replayed" not in said
        assert "def handler(**arguments) -> result" in said
        assert "keyword 'redacted'" in said and "['args.api_key']" in said
        assert "What it returns is the replay's result" in said
        assert "An exception means the replay failed" in said and "idempotent" in said


_ = tether
