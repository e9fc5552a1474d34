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
    from tether.cli._where import action_of, checked, one_line, scrubbed

    where = f"tether {args.command}" + (
        f" {action}" if (action := action_of(args)) else ""
    )  # e.g. "tether dlq list", as the errors name it
    if getattr(args, "db", "") is None and args.command in _NEEDS_DB:  # --db before or after
        print(f"{where}: --db PATH is required ({_STORES[args.command]}: a SQLite file or a "
              "PostgreSQL DSN)", file=sys.stderr)  # fmt: skip
        return 2
    try:
        refused = checked(args, _STORES.get(args.command, "the store"))
        if refused is not None:
            print(f"{where}: {refused[1]}", file=sys.stderr)
            return refused[0]
        code: int = args.run_command(args)
    except BrokenPipeError:  # `tether dlq list | head -1`: the reader had enough; quietly
        return _pipe_closed()
    except CheckpointError as exc:  # a file that is not a tether database: what was given
        print(
            f"{where}: {scrubbed(one_line(exc), getattr(args, 'db', None) or '')}", file=sys.stderr
        )
        return 2
    except StoreUnavailable as exc:  # the store could not be used now
        print(
            f"{where}: {scrubbed(one_line(exc), getattr(args, 'db', None) or '')}", file=sys.stderr
        )
        return 1
    return code


#: what each command's ``--db`` holds, as its errors name it
_STORES = {"dlq": "the dead letters", "records": "the records", "serve": "the records",
           "scopes": "the budget scopes"}  # fmt: skip
#: the commands that cannot go on without ``--db`` (scopes may use Redis instead)
_NEEDS_DB = ("dlq", "records", "serve")


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
