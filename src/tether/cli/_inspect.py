"""The read-only commands an on-call engineer reaches for: ``tether dlq list|show`` and
``tether records list|show``.

Each reads a SQLite file or a PostgreSQL DSN alike, prints a table with a header (or
``--json``), gives times in ISO 8601 (UTC), and redacts what it prints as the operator
page does (secrets, and e-mail addresses and phone numbers unless masking is switched off).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "add_records_commands",
    "dead_letters",
    "limit",
    "list_letters",
    "print_table",
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


def screen_width() -> int:
    """The terminal's width (``COLUMNS`` first); 80 when the output is not a terminal."""
    import shutil

    return shutil.get_terminal_size((80, 24)).columns


def print_table(
    header: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    free: dict[str, int],
    optional: Sequence[str] = (),
) -> None:
    """Columns padded to their widest cell, the header first, fitted to the screen: the
    ``optional`` columns left out in turn while the rest cannot fit, then the widest of the
    ``free`` (text) columns shortened, not below its given width, each cut cell ending in
    "…". The columns left out are named on stderr."""
    width = screen_width()
    cells = [[str(c) for c in header], *[[" ".join(str(c).split()) for c in row] for row in rows]]
    natural = [max(len(row[i]) for row in cells) for i in range(len(header))]
    least = [min(natural[i], free.get(name, natural[i])) for i, name in enumerate(header)]

    def needed(keep: list[int], widths: Sequence[int]) -> int:
        return sum(widths[i] for i in keep) + 2 * (len(keep) - 1)

    keep = list(range(len(header)))
    left_out = []
    for name in optional:
        if needed(keep, least) <= width:
            break
        keep.remove(header.index(name))
        left_out.append(name)
    widths = list(natural)
    over = needed(keep, widths) - width
    for floors in (least, [4 if header[i] in free else natural[i] for i in range(len(header))]):
        while over > 0:  # cut the widest free column down to the next widest, and so on
            cuttable = sorted((i for i in keep if widths[i] > floors[i]), key=lambda i: -widths[i])
            if not cuttable:
                break
            i = cuttable[0]
            cut = min(
                over, max(1, widths[i] - max([floors[i], *(widths[j] for j in cuttable[1:2])]))
            )
            widths[i] -= cut
            over -= cut
    lines = [
        "  ".join(_cell(row[i], widths[i]).ljust(widths[i]) for i in keep).rstrip() for row in cells
    ]
    print("\n".join(lines), flush=True)
    if left_out:  # on stderr: stdout stays the table, for a script that reads it
        left = ", ".join(left_out)
        print(f"({left}: left out at {width} columns; --json has them)", file=sys.stderr)


def _cell(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


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
            f"{doc['error_type']}: {doc['error']}",
            doc.get("asked", 1),
            "yes" if doc.get("replayed") else "no",
        )
        for doc in found
    ]
    # TIMES: how many times the same call was asked and failed (``asked``, see --help)
    header = ("ID", "AT (UTC)", "TOOL", "ERROR", "TIMES", "REPLAYED")
    print_table(header, rows, free={"TOOL": 12, "ERROR": 20}, optional=("TIMES", "REPLAYED"))
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
        "--db", default=argparse.SUPPRESS, help="the records: a SQLite file or a PostgreSQL DSN"
    )
    from tether.run._outcome import STATUSES, StopReason

    statuses = [str(s) for s in STATUSES]
    listing.add_argument(
        "--status",
        type=_one_of(statuses),
        help=f"only runs that ended so: {', '.join(statuses)}",
    )
    listing.add_argument(
        "--reason",
        type=_one_of([r.value for r in StopReason]),
        help="only runs stopped for this reason (a tether.StopReason value: max_cost, "
        "timeout, permanent_error, ...)",
    )
    listing.add_argument(
        "--limit", type=limit, default=50, help="at most this many (1..1000, default 50)"
    )
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(run_command=records_list)
    show = records_sub.add_parser(
        "show",
        help="one run's record: outcome, totals, issues",
        description="One run's record, redacted as on the operator page: its outcome, "
        "what it counted by name (steps, model calls, tool calls, retries, tokens, cost) "
        "and the rest of the record; --json: the whole document, with those totals "
        "under 'totals'.",
    )
    show.add_argument("run_id")
    show.add_argument(
        "--db", default=argparse.SUPPRESS, help="the records: a SQLite file or a PostgreSQL DSN"
    )
    show.add_argument(
        "--json", action="store_true", help="print the record as JSON (with 'totals')"
    )
    show.set_defaults(run_command=records_show)


def records_list(args: argparse.Namespace) -> int:
    from tether.cli._where import runs_filed
    from tether.records._records import Records

    if not runs_filed(args.db):  # dead letters only, say: opening Records would add tables
        print("[]" if args.json else "no runs")
        return 0
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
            shown(str(row.get("task", ""))),
        )
        for row in page.runs
    ]
    header = ("RUN", "ENDED (UTC)", "STATUS", "REASON", "COST", "TASK")
    print_table(header, rows, free={"TASK": 12}, optional=("COST", "REASON"))
    if page.total > len(page.runs):
        print(f"({len(page.runs)} of {page.total} runs that match; --limit for more)")
    return 0


def limit(text: str) -> int:
    """``--limit`` of a list command: a whole number from 1 to 1000 (argparse refuses
    anything else with exit code 2, naming the option)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= 1000:
        raise argparse.ArgumentTypeError(f"must be 1..1000, got {text[:40]!r}")
    return n


def _one_of(values: Sequence[str]) -> Any:
    """An argparse type: one of ``values``, else an error naming them (exit code 2)."""

    def parse(text: str) -> str:
        if text not in values:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is none of: {', '.join(values)}")
        return text

    return parse


def _cost(usd: Any) -> str:
    return f"${usd:.4f}" if isinstance(usd, int | float) else "unknown"


def records_show(args: argparse.Namespace) -> int:
    from tether.cli._where import runs_filed, shown_db
    from tether.records._records import Records

    doc = None
    if runs_filed(args.db):  # else no run: opening Records would add its tables
        with Records.open(args.db) as records:
            doc = records.runs.get(args.run_id)
    if doc is None:
        print(f"tether records show: no run {args.run_id!r} in {shown_db(args.db)}",
              file=sys.stderr)  # fmt: skip
        return 1
    totals = run_totals(doc)
    if args.json:
        return show_doc({**doc, "totals": totals})
    print(_run_text(shown(doc), totals))
    return 0


def run_totals(doc: dict[str, Any]) -> dict[str, Any]:
    """What a run counted, by name: its ``counts`` rows (one per copy of the run that
    counted: ``[sequence, steps, model_calls, ...]``, docs/run.md) summed."""
    from tether.run._runstate import COUNTED

    rows = doc.get("counts")
    sums = [0.0] * len(COUNTED)
    if isinstance(rows, dict):
        for row in rows.values():
            if isinstance(row, list):  # [sequence, *counts in COUNTED's order]
                for i, v in enumerate(row[1 : len(COUNTED) + 1]):
                    if isinstance(v, int | float) and not isinstance(v, bool):
                        sums[i] += v
    return {
        name: (round(v, 6) if name == "cost_usd" else int(v))
        for name, v in zip(COUNTED, sums, strict=True)
    }


#: the fields the human view of ``records show`` shows first, in this order
_HEAD = ("run_id", "status", "reason", "task", "result", "started_at", "ended_at")


def _run_text(doc: dict[str, Any], totals: dict[str, Any]) -> str:
    """One run for a person: its outcome, its totals by name, then the rest of the record
    (the raw ``counts`` rows left out: the totals are what they add up to)."""
    lines = [f"{k}: {doc[k]}" for k in _HEAD if doc.get(k) not in (None, "")]
    lines.append("totals:")
    for name, value in totals.items():
        if name == "cost_usd":
            lines.append(f"  cost: ${value:.4f}")
        else:
            lines.append(f"  {name.replace('_', ' ')}: {value:,}")
    # the totals stand for the raw rows, the usage and its copies at the top level
    rest = {k: v for k, v in doc.items() if k not in (*_HEAD, *totals, "counts", "usage")}
    for key, value in rest.items():
        if value in (None, "", [], {}):
            continue
        text = json.dumps(value, indent=2, default=str) if isinstance(value, dict | list) else value
        if key == "seconds" and isinstance(value, int | float):  # 0.016 s, not 0.0157813789…
            text = _seconds(value)
        lines.append(f"{key}: {text}")
    return "\n".join(lines)


def _seconds(value: float) -> str:
    """A duration for a person: three decimals under a minute, one after (``0.016 s``)."""
    return f"{value:.3f} s" if abs(value) < 60 else f"{value:,.1f} s"
