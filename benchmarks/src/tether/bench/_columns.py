"""The report's tables written as columns: each a header and how a row's cell reads.

A row is a mapping (a suite's figures for one policy, with its scenario and policy); a
:class:`Column`'s cell function turns it into text, so that a table is the list of its
columns and the header and the cells cannot fall out of step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "UNDEFINED",
    "Cell",
    "Column",
    "Row",
    "Table",
    "fixed",
    "most",
    "share",
    "table",
    "text",
    "thousands",
]

#: a table: its header and its rows of cells
Table = tuple[list[str], list[list[str]]]
#: a row: the figures of one line of a table, by name
Row = Mapping[str, Any]
#: how a column reads a row
Cell = Callable[[Row], str]
#: a column: its header and its cell
Column = tuple[str, Cell]


def table(columns: Sequence[Column], rows: Iterable[Row]) -> Table:
    """The header of ``columns`` and, for each of ``rows``, its cells."""
    return [head for head, _ in columns], [[cell(row) for _, cell in columns] for row in rows]


def text(key: str) -> Cell:
    """The value as it is (a count, a name)."""
    return lambda row: str(row[key])


#: a figure the run did not measure (pass^4 of a run with fewer than 4 seeds)
UNDEFINED = "—"


def share(key: str, undefined: bool = False) -> Cell:
    """A fraction as a percentage with one decimal; with ``undefined``, a row without the
    figure reads :data:`UNDEFINED` (never a 0 it did not measure)."""
    if not undefined:
        return lambda row: f"{row[key]:.1%}"
    return lambda row: f"{row[key]:.1%}" if row.get(key) is not None else UNDEFINED


def fixed(key: str, digits: int) -> Cell:
    """A number with ``digits`` decimals."""
    return lambda row: f"{row[key]:.{digits}f}"


def thousands(key: str) -> Cell:
    """A whole number with thousands separators."""
    return lambda row: f"{row[key]:,}"


def most(key: str, n: int) -> Cell:
    """The ``n`` largest of a mapping of counts, largest first: ``"a 3, b 1"``."""

    def cell(row: Row) -> str:
        ranked = sorted(row[key].items(), key=lambda kv: -kv[1])[:n]
        return ", ".join(f"{k} {v}" for k, v in ranked)

    return cell
