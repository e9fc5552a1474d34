"""Checkpoints in PostgreSQL, the webhook sink, and the dlq command line."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg
import pytest

import tether
from scripted_server import Reply, ScriptedServer
from tether import Checkpoints, DeadLetters, Escalation, Guard, VirtualClock
from tether.cli import main


def test_postgres_checkpoints_for_a_fleet(pg_dsn: str) -> None:
    """A checkpoint saved by one guard is resumed by another, through PostgreSQL."""
    table = f"tether_docs_{uuid.uuid4().hex[:8]}"
    try:
        with (
            Checkpoints.postgres(pg_dsn, table) as first,
            Checkpoints.postgres(pg_dsn, table) as second,
        ):
            guard = Guard(
                clock=VirtualClock(), budget=tether.Budget(max_steps=4), checkpoints=first
            )
            with guard.start(task="collect") as run:
                while run.proceed():
                    run.call_tool("fetch", lambda page: {"page": page}, {"page": run.steps})
            other = Guard(
                clock=VirtualClock(), budget=tether.Budget(max_steps=6), checkpoints=second
            )
            with other.resume(run.outcome.checkpoint_id) as resumed:
                while resumed.proceed():
                    resumed.call_tool("fetch", lambda page: {"page": page}, {"page": resumed.steps})
        assert [e["args"]["page"] for e in resumed.outcome.partial] == [1, 2, 3, 4, 5, 6]
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")


def test_webhook_sink_posts_the_handoff(server: ScriptedServer) -> None:
    """tether.webhook(url) delivers the handoff record as JSON."""
    server.default = Reply(200, {"ok": True})
    guard = Guard(
        clock=VirtualClock(), escalation=Escalation(sink=tether.webhook(server.url + "/handoffs"))
    )
    with guard.start(task="refund A-1") as run:
        run.proceed()
        run.escalate("customer asked for a person")
    (seen,) = server.requests
    assert (seen.method, seen.path) == ("POST", "/handoffs")
    assert seen.body["task"] == "refund A-1"
    assert seen.body["reason"] == "escalated"


def test_webhook_rejects_other_schemes() -> None:
    """Only http(s) URLs are accepted."""
    with pytest.raises(ValueError, match="http"):
        tether.webhook("file:///etc/passwd")


def replay_handler(to: str, api_key: str, redacted: list[str]) -> str:
    assert api_key == "[redacted]" and redacted == ["args.api_key"]
    return f"sent to {to}"


def test_dlq_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """tether dlq list, show and replay."""
    db = str(tmp_path / "letters.db")
    letters = DeadLetters.sqlite(db)
    letter = letters.park(tool="send_email", args={"to": "a@b.c", "api_key": "sk-live-abcdefghijk"},
                          error=ValueError("mailbox does not exist"), run_id="run_1", task="notify", at=0.0)  # fmt: skip
    assert main(["dlq", "--db", db, "list"]) == 0
    assert letter.id in capsys.readouterr().out
    assert main(["dlq", "--db", db, "show", letter.id]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["args"]["api_key"] == "[redacted]"
    assert (
        main(
            [
                "dlq",
                "--db",
                db,
                "replay",
                letter.id,
                "--by",
                "dana",
                "--handler",
                "test_persist:replay_handler",
            ]
        )
        == 0
    )
    assert "sent to a@b.c" in capsys.readouterr().out
    assert DeadLetters.sqlite(db).get(letter.id).replayed
    assert main(["dlq", "--db", db, "show", "dl_missing"]) == 1


calls: list[str] = []


def counting_handler(to: str, api_key: str, redacted: list[str]) -> str:
    calls.append(to)
    return f"sent {len(calls)}"


def failing_handler(to: str, api_key: str, redacted: list[str]) -> str:
    raise RuntimeError("smtp refused")


def test_dlq_replay_twice_runs_the_handler_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The second replay says it was replayed before; --force runs the handler again."""
    db = str(tmp_path / "letters.db")
    letter = DeadLetters.sqlite(db).park(tool="send_email", args={"to": "a@b.c", "api_key": "k"},
                                         error=ValueError("x"), run_id="r", task="t", at=0.0)  # fmt: skip
    calls.clear()
    replay = ["replay", letter.id, "--by", "dana", "--handler", "test_persist:counting_handler"]
    assert main(["dlq", "--db", db, *replay]) == 0
    assert main(["dlq", *replay, "--db", db]) == 0  # --db after the action works too
    out = capsys.readouterr().out
    assert "was replayed before by dana at " in out
    assert "the handler was not called again and the letter is unchanged" in out
    assert calls == ["a@b.c"]
    assert main(["dlq", "--db", db, *replay, "--force"]) == 0
    assert calls == ["a@b.c", "a@b.c"]
    assert "(forced)" in capsys.readouterr().out


def held_handler(to: str, api_key: str, redacted: list[str]) -> str:
    """A handler that runs until the test lets it end (files named by the environment)."""
    import os
    import time

    Path(os.environ["HELD_STARTED"]).write_text(to)
    deadline = time.monotonic() + 60
    while not Path(os.environ["HELD_RELEASE"]).exists():
        assert time.monotonic() < deadline, "never released"
        time.sleep(0.02)
    with open(os.environ["HELD_CALLS"], "a") as calls_file:
        calls_file.write(to + "\n")
    return f"sent to {to}"


def test_a_second_terminal_is_told_the_letter_is_being_replayed(tmp_path: Path) -> None:
    """Two `tether dlq replay` processes on one letter: while the first one's handler runs,
    the second is told the letter is being replayed (not that the handler failed), exits 1
    without calling the handler; the first ends normally, the handler ran once."""
    import os
    import subprocess
    import sys
    import time

    db = str(tmp_path / "letters.db")
    with DeadLetters.sqlite(db) as letters:
        letter = letters.park(tool="send_email", args={"to": "a@b.c", "api_key": "k"},
                              error=ValueError("x"), run_id="r", task="t", at=0.0)  # fmt: skip
    started, release, calls_file = (tmp_path / n for n in ("started", "release", "calls"))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "HELD_STARTED": str(started),
        "HELD_RELEASE": str(release),
        "HELD_CALLS": str(calls_file),
    }
    command = [sys.executable, "-m", "tether.cli", "dlq", "--db", db, "replay", letter.id,
               "--by", "dana", "--handler", "test_persist:held_handler"]  # fmt: skip
    here = str(Path(__file__).parent)
    first = subprocess.Popen(command, cwd=here, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not started.exists():
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first replay never reached its handler"
            time.sleep(0.02)
        second = subprocess.run(command, cwd=here, env=env, capture_output=True, text=True,
                                timeout=60)  # fmt: skip
    finally:
        release.write_text("go")
        out, err = first.communicate(timeout=60)
    assert second.returncode == 1, (second.stdout, second.stderr)
    assert "is being replayed" in second.stderr and "handler failed" not in second.stderr
    assert "Traceback" not in second.stderr
    assert first.returncode == 0 and "sent to a@b.c" in out, (out, err)
    assert calls_file.read_text().split() == ["a@b.c"]


def test_dlq_command_line_rough_edges(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing file, a missing --db and a failing handler: one line each, non-zero."""
    missing = str(tmp_path / "missing.db")
    assert main(["dlq", "list", "--db", missing]) == 2
    assert "no such file" in capsys.readouterr().err
    assert not Path(missing).exists()
    assert main(["dlq", "list"]) == 2
    assert "--db PATH is required" in capsys.readouterr().err
    db = str(tmp_path / "letters.db")
    letter = DeadLetters.sqlite(db).park(tool="send_email", args={"to": "a@b.c", "api_key": "k"},
                                         error=ValueError("x"), run_id="r", task="t", at=0.0)  # fmt: skip
    code = main(
        [
            "dlq",
            "--db",
            db,
            "replay",
            letter.id,
            "--by",
            "dana",
            "--handler",
            "test_persist:failing_handler",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert err.strip() == "tether dlq: the handler failed: RuntimeError: smtp refused"
    assert (
        main(
            ["dlq", "--db", db, "replay", letter.id, "--by", "d", "--handler", "no_such_module:fn"]
        )
        == 2
    )
    assert "cannot import the handler" in capsys.readouterr().err


def unaware_handler(to: str, api_key: str) -> str:
    raise AssertionError("must not be called with a redacted api_key")


def test_dlq_replay_refuses_a_handler_that_cannot_fill_redacted_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A letter with redacted arguments and a handler without `redacted`: refused, named."""
    db = str(tmp_path / "letters.db")
    letter = DeadLetters.sqlite(db).park(tool="send_email", args={"to": "a@b.c", "api_key": "sk-live-abcdefghijk"},
                                         error=ValueError("x"), run_id="r", task="t", at=0.0)  # fmt: skip
    code = main(
        [
            "dlq",
            "--db",
            db,
            "replay",
            letter.id,
            "--by",
            "dana",
            "--handler",
            "test_persist:unaware_handler",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "args.api_key" in err and "redacted" in err
    assert not DeadLetters.sqlite(db).get(letter.id).replayed
