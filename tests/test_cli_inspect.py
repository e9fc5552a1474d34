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
    assert main(["records", "show", run.run_id, "--db", where]) == 0
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
    assert main(["records", "list", "--db", db, "--limit", "0"]) == 2
    assert "--limit must be 1..1000" in capsys.readouterr().err


def test_a_store_that_cannot_be_used_is_one_clear_line_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pg_dsn: str
) -> None:
    """Before: a traceback ending in StoreUnavailable after the pool's 10 s wait, or in
    CheckpointError. Now: one line naming the store and the DSN without its password; exit
    1 when the server does not answer, 2 when what was given is wrong; within seconds."""
    started = time.monotonic()
    assert main(["dlq", "list", "--db", "postgresql://postgres:hunter2@127.0.0.1:1/x"]) == 1
    err = capsys.readouterr().err
    assert time.monotonic() - started < 5
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


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path: Path) -> None:
    """`tether dlq list | head -1`: before, a BrokenPipeError traceback; now nothing on
    stderr, as Unix tools end when their reader goes away."""
    db = str(tmp_path / "records.db")
    with DeadLetters.sqlite(db) as letters:
        for i in range(300):
            letters.park(tool=f"t{i}", args={}, error=ValueError("no"), run_id="r", task="t", at=i)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
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


_ = tether
