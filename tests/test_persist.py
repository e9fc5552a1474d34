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


def replay_handler(to: str, api_key: str) -> str:
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
        main(["dlq", "--db", db, "replay", letter.id, "--handler", "test_persist:replay_handler"])
        == 0
    )
    assert "sent to a@b.c" in capsys.readouterr().out
    assert DeadLetters.sqlite(db).get(letter.id).replayed
    assert main(["dlq", "--db", db, "show", "dl_missing"]) == 1
