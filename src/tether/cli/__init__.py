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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # a command is needed: usage on stderr, as argparse's errors
        parser.print_usage(sys.stderr)
        print(
            "tether: a command is needed (bench, demo, dlq, records, serve); "
            "`tether --help` lists them",
            file=sys.stderr,
        )
        return 2
    code: int = args.run_command(args)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
