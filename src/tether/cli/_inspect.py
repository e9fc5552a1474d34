"""The read-only commands an on-call engineer reaches for: ``tether dlq list|show`` and
``tether records list|show``.

Each reads a SQLite file or a PostgreSQL DSN alike, prints a table with a header (or
``--json``), gives times in ISO 8601 (UTC), and redacts what it prints as the operator
page does (secrets, and e-mail addresses and phone numbers unless masking is switched off).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "add_records_commands",
    "dead_letters",
    "list_letters",
    "missing",
    "records_list",
    "show_doc",
]

_TIME_FIELDS = (
    "at",
    "last_at",
    "started_at",
    "ended_at",
    "created_at",
    "decided_at",
    "replayed_at",
)


def iso(at: Any) -> Any:
    """An epoch time as ISO 8601 in UTC (``2026-12-07T04:45:12Z``); anything else as it is."""
    if isinstance(at, int | float) and not isinstance(at, bool):
        return (
            datetime.fromtimestamp(float(at), UTC)
            .isoformat(timespec="seconds")
            .replace("+00:00", "Z")
        )
    return at


def shown(value: Any) -> Any:
    """``value`` as the operator page shows it: redacted, times in ISO 8601."""
    from tether.redaction._redact import masks_pii, redact

    if isinstance(value, dict):
        return {
            k: iso(v) if k in _TIME_FIELDS else shown(v) for k, v in value.items()
        }  # fmt: skip
    if isinstance(value, list | tuple):
        return [shown(v) for v in value]
    return redact(value, pii=masks_pii())


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell, the header first."""
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines)


def _refused(command: str, why: str) -> int:
    print(f"tether {command}: {why}", file=sys.stderr)
    return 2


def missing(where: str) -> bool:
    from tether.records._records import Records

    return not Records.is_dsn(where) and not os.path.isfile(where)


@contextmanager
def dead_letters(where: str) -> Iterator[Any]:
    """The dead letters of a SQLite file (what ``DeadLetters.sqlite(path)`` or
    ``Records.sqlite(path)`` writes) or a PostgreSQL DSN (``Records.postgres(dsn)``)."""
    from tether.records._collections import DeadLetters
    from tether.records._records import Records

    opened = DeadLetters.postgres(where) if Records.is_dsn(where) else DeadLetters.sqlite(where)
    with opened as letters:
        yield letters


# --- dlq list / show ----------------------------------------------------------------


def list_letters(letters: Any, as_json: bool, limit: int) -> int:
    # the store gives the newest ``limit`` oldest first: shown newest first, as ``records list``
    found = [shown(letter.to_doc()) for letter in reversed(letters.list(limit=limit))]
    if as_json:
        print(json.dumps(found, indent=2, default=str))
        return 0
    if not found:
        print("no dead letters")
        return 0
    rows = [
        (
            doc["id"],
            doc["at"],
            doc["tool"],
            f"{doc['error_type']}: {str(doc['error'])[:60]}",
            doc.get("asked", 1),
            "yes" if doc.get("replayed") else "no",
        )
        for doc in found
    ]
    print(_table(("ID", "AT (UTC)", "TOOL", "ERROR", "ASKED", "REPLAYED"), rows))
    return 0


def show_doc(doc: dict[str, Any]) -> int:
    """One document, as JSON: redacted, times in ISO 8601."""
    print(json.dumps(shown(doc), indent=2, default=str))
    return 0


# --- records list / show ------------------------------------------------------------


def add_records_commands(records_sub: Any) -> None:
    """``tether records list`` and ``tether records show RUN_ID``."""
    listing = records_sub.add_parser(
        "list",
        help="the newest runs a guard filed, with their status and stop reason",
        description="The newest runs first; filters combine. Reads a SQLite file or a "
        "PostgreSQL DSN; what it prints is redacted as on the operator page.",
    )
    listing.add_argument(
        "--db", required=True, help="the records: a SQLite file or a PostgreSQL DSN"
    )
    listing.add_argument("--status", help="only runs that ended so (success, failed, ...)")
    listing.add_argument("--reason", help="only runs stopped for this reason (max_cost, ...)")
    listing.add_argument(
        "--limit", type=int, default=50, help="at most this many (1..1000, default 50)"
    )
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(run_command=records_list)
    show = records_sub.add_parser("show", help="one run's record as JSON: outcome, usage, issues")
    show.add_argument("run_id")
    show.add_argument("--db", required=True, help="the records: a SQLite file or a PostgreSQL DSN")
    show.set_defaults(run_command=records_show)


def records_list(args: argparse.Namespace) -> int:
    from tether.records._records import Records

    if missing(args.db):
        return _refused("records list", f"{args.db}: no such file (give the SQLite file your "
                        "Records.sqlite(...) writes, or a PostgreSQL DSN)")  # fmt: skip
    if not 1 <= args.limit <= 1000:
        return _refused("records list", f"--limit must be 1..1000, got {args.limit}")
    with Records.open(args.db) as records:
        page = records.runs.search(status=args.status, reason=args.reason, limit=args.limit)
        docs = [records.runs.get(r["run_id"]) for r in page.runs] if args.json else []
    if args.json:
        print(json.dumps([shown(doc) for doc in docs if doc is not None], indent=2, default=str))
        return 0
    if not page.runs:
        print("no runs")
        return 0
    rows = [
        (
            row["run_id"],
            iso(row.get("ended_at")),
            row.get("status", ""),
            row.get("reason", ""),
            _cost(row.get("cost_usd")),
            shown(str(row.get("task", ""))[:50]),
        )
        for row in page.runs
    ]
    print(_table(("RUN", "ENDED (UTC)", "STATUS", "REASON", "COST", "TASK"), rows))
    if page.total > len(page.runs):
        print(f"({len(page.runs)} of {page.total} runs that match; --limit for more)")
    return 0


def _cost(usd: Any) -> str:
    return f"${usd:.4f}" if isinstance(usd, int | float) else "unknown"


def records_show(args: argparse.Namespace) -> int:
    from tether.records._records import Records

    if missing(args.db):
        return _refused("records show", f"{args.db}: no such file (give the SQLite file your "
                        "Records.sqlite(...) writes, or a PostgreSQL DSN)")  # fmt: skip
    with Records.open(args.db) as records:
        doc = records.runs.get(args.run_id)
    if doc is None:
        print(f"tether records show: no run {args.run_id!r} in {args.db}", file=sys.stderr)
        return 1
    return show_doc(doc)
