"""The ``tether`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tether._version import __version__

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tether", description="Keep LLM agents bounded and their side effects safe."
    )
    parser.add_argument("--version", action="version", version=f"tether {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    from tether.cli import _commands as _cli_commands

    _cli_commands.register(sub)
    return parser


def commands(parser: argparse.ArgumentParser) -> list[str]:
    """The parser's commands, sorted (what the no-command message names)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return sorted(action.choices)
    return []


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # a command is needed: usage on stderr, as argparse's errors
        parser.print_usage(sys.stderr)
        print(
            f"tether: a command is needed ({', '.join(commands(parser))}); "
            "`tether --help` lists them",
            file=sys.stderr,
        )
        return 2
    if args.command == "bench":  # the benchmark reports its own errors
        bench_code: int = args.run_command(args)
        return bench_code
    from tether._errors import CheckpointError, StoreUnavailable

    where = f"tether {args.command}" + (
        f" {action}" if (action := _action(args)) else ""
    )  # e.g. "tether dlq list", as the errors name it
    try:
        refused = _unreachable(args)
        if refused is not None:
            print(f"{where}: {refused[1]}", file=sys.stderr)
            return refused[0]
        code: int = args.run_command(args)
    except BrokenPipeError:  # `tether dlq list | head -1`: the reader had enough; quietly
        return _pipe_closed()
    except CheckpointError as exc:  # a file that is not a tether database: what was given
        print(f"{where}: {_one_line(exc)}", file=sys.stderr)
        return 2
    except StoreUnavailable as exc:  # the store could not be used now
        print(f"{where}: {_one_line(exc)}", file=sys.stderr)
        return 1
    return code


#: what each command's ``--db`` holds, as its errors name it
_STORES = {"dlq": "the dead letters", "records": "the records", "serve": "the records",
           "scopes": "the budget scopes"}  # fmt: skip


def _action(args: argparse.Namespace) -> str:
    for name in ("dlq_command", "records_command", "scopes_command"):
        value = getattr(args, name, None)
        if isinstance(value, str):
            return value
    return ""


def _unreachable(args: argparse.Namespace) -> tuple[int, str] | None:
    """For a ``--db`` that is a PostgreSQL DSN: one connection, given 3 seconds, before the
    command opens its pool (which waits 10 s for a server that is not there). None when it
    connects (or psycopg is not installed: the store says so); else the exit code (2: the
    server answered and refused, e.g. no such database or role; 1: it did not answer) and
    a line naming the store, the DSN without its password and the reason."""
    db = getattr(args, "db", None)
    if not isinstance(db, str):
        return None
    from tether.records._records import Records

    if not Records.is_dsn(db):
        return None
    try:
        import psycopg
    except ImportError:
        return None
    from tether.stores._sqlfailures import safe_dsn

    try:
        psycopg.connect(db, connect_timeout=3).close()
    except psycopg.Error as exc:
        text = _one_line(exc)
        reason = text.rsplit(" failed: ", 1)[-1]
        refused = reason.startswith("FATAL:")
        reason = " ".join(reason.removeprefix("FATAL:").split())
        store = _STORES.get(args.command, "the store")
        return (2 if refused else 1), _scrubbed(
            f"cannot use {store} at {safe_dsn(db)}: {safe_dsn(reason)}"
            + ("" if refused else " (is the server up and the address right?)"),
            db,
        )
    return None


def _scrubbed(text: str, dsn: str) -> str:
    """``text`` without the DSN's password, however the driver quoted it: libpq repeats the
    part of a malformed URL it could not read (``invalid percent-encoded token: "pw"``) and
    splits a password holding ``@`` at the wrong place (``failed to resolve host
    'rest@host'``), so each piece of the password is masked where it appears."""
    from urllib.parse import unquote

    password = ""
    _, sep, rest = dsn.partition("://")
    if sep:
        authority = rest.split("/", 1)[0].split("?", 1)[0]
        userinfo = authority.rpartition("@")[0]
        password = userinfo.partition(":")[2]
    pieces = {password, unquote(password)}
    for piece in list(pieces):
        pieces.update(piece.replace(":", "@").split("@"))
    for piece in sorted(pieces, key=len, reverse=True):
        if len(piece) >= 3:
            text = text.replace(piece, "***")
    return text


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0].strip() if lines else type(exc).__name__


def _pipe_closed() -> int:
    """The reader of our output went away: point stdout at /dev/null (so the interpreter's
    last flush does not fail again) and end as a tool killed by SIGPIPE reports it."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a file (a test's capture)
        pass
    return 141  # 128 + SIGPIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
