"""What `--db` names, as a new user types it: a URL's password is never printed whatever its
scheme, read-only commands create nothing, tables fit the terminal, `--db` goes before or
after the action, and a wrong input is exit 2 with what is wrong."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tether import Guard, Records
from tether.cli import build_parser, main

LONG_TASK = "refund order 1234 for carol@example.com: " + "the parcel never arrived, " * 6
LONG_TOOL = "send_email_to_the_customer_about_the_refund_of_their_order"


def _filed(where: str) -> str:
    """A database as a guarded run leaves it: a run's record and a dead letter."""

    def bounce(to: str) -> None:
        raise ValueError(f"mailbox {to} does not exist: 550 permanent failure " + "x" * 80)

    records = Records.open(where)
    with records:
        guard = Guard(records=records)
        with guard.start(task=LONG_TASK) as run:
            run.call_tool("lookup", lambda order: {"order": order}, {"order": "7"})
            run.succeed("refunded")
        with guard.start(task="notify") as failing, pytest.raises(Exception):
            failing.call_tool(LONG_TOOL, bounce, {"to": "ann@example.com"})
    return run.run_id


@pytest.fixture
def ops(tmp_path: Path) -> str:
    db = str(tmp_path / "ops.db")
    _filed(db)
    return db


@pytest.fixture
def own_schema(pg_dsn: str) -> Iterator[str]:
    """A PostgreSQL DSN whose search path is a schema of this test's own (dropped after)."""
    import psycopg

    schema = f"tether_cli_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def _tables_in(pg_dsn: str, dsn: str) -> list[str]:
    import psycopg

    schema = dsn.rsplit("%3D", 1)[1]
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchall()
    return sorted(str(r[0]) for r in rows)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg2x://postgres:s3cretpw@127.0.0.1:1/test",  # a driver: stripped
        "mysql://root:s3cretpw@127.0.0.1:3306/test",
        "redis://:s3cretpw@127.0.0.1:6379/0",
        "pgsql://postgres:s3cretpw@127.0.0.1:5432/test",
        "sqlite://u:s3cretpw@host/x.db",
    ],
)
def test_a_urls_password_is_never_printed_whatever_its_scheme(
    url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: `mysql://root:s3cretpw@...: no such file`, the password printed and the
    reason wrong. Now the password masked, the schemes taken named, exit 2 (a driver's URL
    is read as postgresql://: the server is not there, exit 1); nothing created."""
    monkeypatch.chdir(tmp_path)
    for argv in (
        ["records", "list", "--db", url],
        ["records", "show", "run_x", "--db", url],
        ["dlq", "--db", url, "list"],
        ["records", "prune", "--db", url],
        ["serve", "--db", url],
    ):
        code = main(argv)
        err = capsys.readouterr().err
        assert "s3cretpw" not in err, err
        assert "no such file" not in err and len(err.strip().splitlines()) == 1
        if url.startswith("postgresql+"):
            assert code == 1 and "cannot use the " in err and "at postgresql://***@" in err
        else:
            assert code == 2 and "--db takes a SQLite file's path or a PostgreSQL DSN" in err
            assert "postgresql://, postgres:// or postgresql+psycopg://" in err
    assert list(tmp_path.iterdir()) == []


def test_sqlalchemys_postgresql_psycopg_url_is_read(
    own_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`postgresql+psycopg://` (SQLAlchemy's) is the same DSN to libpq once `+psycopg` goes."""
    run_id = _filed(own_schema)
    url = own_schema.replace("postgresql://", "postgresql+psycopg://", 1)
    assert main(["records", "list", "--db", url, "--json"]) == 0
    assert [d["run_id"] for d in json.loads(capsys.readouterr().out)][-1] == run_id


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("content", ["empty", "other tables"])
def test_read_only_commands_create_nothing_in_a_file(
    content: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `records list` on an empty (or another program's) SQLite file created 5
    tables (80 KB) and said "no runs". Now: not a tether database, exit 2, the file as it
    was."""
    db = tmp_path / "empty.db"
    if content == "empty":
        db.write_bytes(b"")
    else:
        import sqlite3

        with sqlite3.connect(db) as conn:
            conn.execute("CREATE TABLE orders (id INTEGER)")
    before = _digest(db)
    for argv in (
        ["records", "list", "--db", str(db)],
        ["records", "show", "run_x", "--db", str(db)],
        ["dlq", "list", "--db", str(db)],
        ["dlq", "show", "dl_x", "--db", str(db)],
        ["scopes", "list", "--db", str(db)],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "not a tether database" in err and "nothing was created" in err
        assert _digest(db) == before and sorted(os.listdir(tmp_path)) == ["empty.db"]


def test_records_commands_on_dead_letters_only_add_no_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file `DeadLetters.sqlite(path)` wrote holds no runs: said so, without adding the
    runs' tables (before: four more tables)."""
    import sqlite3

    from tether.records._collections import DeadLetters

    db = str(tmp_path / "letters.db")
    with DeadLetters.sqlite(db) as letters:
        letters.park(tool="t", args={}, error=ValueError("no"), run_id="r", task="t", at=1.0)
    assert main(["records", "list", "--db", db]) == 0
    assert capsys.readouterr().out == "no runs\n"
    assert main(["records", "list", "--db", db, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["records", "show", "r", "--db", db]) == 1
    assert "no run 'r'" in capsys.readouterr().err
    assert main(["scopes", "list", "--db", db]) == 0
    assert capsys.readouterr().out == "no scopes\n"
    with sqlite3.connect(db) as conn:
        tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    assert tables == [("tether_documents",)]


def test_read_only_commands_create_nothing_on_postgres(
    own_schema: str, pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `records list` (and `scopes list`) on a database without tether's tables
    created them. Now: not a tether database, exit 2, no table; once a guard filed there,
    the same commands read it (and `scopes list` adds no scopes' tables)."""
    for argv in (
        ["records", "list", "--db", own_schema],
        ["records", "show", "run_x", "--db", own_schema],
        ["dlq", "list", "--db", own_schema],
        ["dlq", "--db", own_schema, "show", "dl_x"],
        ["scopes", "list", "--db", own_schema],
    ):
        assert main(argv) == 2, argv
        assert "not a tether database" in capsys.readouterr().err
    assert _tables_in(pg_dsn, own_schema) == []
    run_id = _filed(own_schema)
    filed = _tables_in(pg_dsn, own_schema)
    assert main(["scopes", "list", "--db", own_schema]) == 0
    assert capsys.readouterr().out == "no scopes\n" and _tables_in(pg_dsn, own_schema) == filed
    assert main(["records", "show", run_id, "--db", own_schema]) == 0
    assert "status: success" in capsys.readouterr().out


def _widths(text: str) -> list[int]:
    return [len(line) for line in text.splitlines()]


@pytest.mark.parametrize("columns", [80, 100])
def test_tables_fit_the_terminal_and_mark_what_they_cut(
    columns: int, ops: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: 122 and 174 columns at COLUMNS=80, the task cut at 50 characters without a
    mark. Now every line fits, a cut cell ends in "…", and --json keeps every character."""
    monkeypatch.setenv("COLUMNS", str(columns))
    for argv in (["records", "list", "--db", ops], ["dlq", "--db", ops, "list"]):
        assert main(argv) == 0
        out, err = capsys.readouterr()
        assert max(_widths(out)) <= columns and "…" in out, out
        assert max(_widths(err), default=0) <= columns
        assert main([*argv, "--json"]) == 0
        data = capsys.readouterr().out
        assert ("the parcel never arrived, " * 6).strip() in data or LONG_TOOL in data
    assert main(["dlq", "--db", ops, "list", "--json"]) == 0
    (letter,) = json.loads(capsys.readouterr().out)
    assert letter["tool"] == LONG_TOOL and letter["error"].endswith("x" * 80)


def test_a_piped_table_is_80_columns_unless_columns_says(ops: str) -> None:
    """Output to a pipe (no terminal): 80 columns, or COLUMNS when it is set."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    for columns, widest in ((None, 80), ("132", 132)):
        if columns:
            env["COLUMNS"] = columns
        done = subprocess.run(
            [sys.executable, "-m", "tether.cli", "records", "list", "--db", ops],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        assert max(_widths(done.stdout)) <= widest
        assert "…" in done.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["records", "--db", "{db}", "list"],
        ["records", "list", "--db", "{db}"],
        ["records", "--db", "{db}", "show", "{run}"],
        ["records", "show", "{run}", "--db", "{db}"],
        ["records", "--db", "{db}", "prune"],
        ["dlq", "--db", "{db}", "list"],
        ["dlq", "list", "--db", "{db}"],
        ["scopes", "--db", "{db}", "list"],
        ["scopes", "list", "--db", "{db}"],
    ],
)
def test_db_goes_before_or_after_the_action(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `tether records --db ops.db list` failed ("invalid choice: 'ops.db'") while
    `tether dlq --db ops.db list` worked."""
    db = str(tmp_path / "ops.db")
    run_id = _filed(db)
    assert main([a.format(db=db, run=run_id) for a in argv]) == 0
    assert "error" not in capsys.readouterr().err


def test_a_directory_is_named_as_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `--db /tmp` said "no such file"."""
    for argv in (
        ["records", "list", "--db", str(tmp_path)],
        ["dlq", "--db", str(tmp_path), "list"],
    ):
        assert main(argv) == 2
        assert f"{tmp_path} is a directory, not a file" in capsys.readouterr().err


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://postgres:s3cretpw@127.0.0.1:5432/test?sslmode=bogus",
        "postgresql://postgres:s3cretpw@127.0.0.1:5432/test?target_session_attrs=x",
        "postgresql://postgres:s3cretpw@127.0.0.1:5432/test?bogus=1",
        "host=127.0.0.1 password=s3cretpw sslmode=bogus",
    ],
)
def test_a_malformed_dsn_parameter_is_exit_2_with_libpqs_reason(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `?sslmode=bogus` was exit 1, "(is the server up and the address right?)": a
    wrong parameter is the user's input. Now exit 2, libpq's reason, the password masked."""
    assert main(["records", "list", "--db", dsn]) == 2
    err = capsys.readouterr().err
    assert "s3cretpw" not in err and "is the server up" not in err
    assert "invalid" in err and "(a malformed DSN)" in err


def test_records_show_rounds_the_seconds(ops: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `seconds: 0.01578137899991816`. Now three decimals and a unit."""
    assert main(["records", "list", "--db", ops, "--json"]) == 0
    run_id = json.loads(capsys.readouterr().out)[-1]["run_id"]
    assert main(["records", "show", run_id, "--db", ops]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("seconds:")]
    number, unit = line.split()[1:]
    assert unit == "s" and len(number.split(".")[1]) == 3


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_help_fits_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: `tether bench --help`'s usage was 100 columns (every suite in braces)."""
    monkeypatch.setenv("COLUMNS", "80")
    wide = {
        p.prog: [len(line) for line in p.format_help().splitlines() if len(line) > 80]
        for p in _parsers(build_parser())
    }
    assert {prog: lines for prog, lines in wide.items() if lines} == {}
