"""The suite's table in docs/integrations.md, made from the registry: a cell is "pass" when
the suite runs it (and CI requires it to pass), else "n/a" with its reason as a note.

Rewrite the page's table: ``python tests/conformance/table.py`` (from the checkout)."""

from __future__ import annotations

import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
BEGIN = "<!-- conformance table: made by tests/conformance/table.py -->"
END = "<!-- end of the conformance table -->"


def render() -> str:
    """The table and its notes, in Markdown."""
    from conformance.registry import ADAPTERS
    from conformance.suite import Cell

    notes: list[str] = []
    rows = ["| adapter | " + " | ".join(c.value for c in Cell) + " |",
            "|---|" + "---|" * len(Cell)]  # fmt: skip
    for adapter in ADAPTERS:
        cells = []
        for c in Cell:
            reason = adapter.not_applicable.get(c)
            if reason is None:
                cells.append("pass")
                continue
            if reason not in notes:
                notes.append(reason)
            cells.append(f"n/a ({notes.index(reason) + 1})")
        rows.append(f"| {adapter.name} | " + " | ".join(cells) + " |")
    lines = [*rows, ""]
    lines += [f"{i}. {reason}" for i, reason in enumerate(notes, 1)]
    return "\n".join(lines)


def page_table() -> str:
    """The table as the page has it now."""
    text = PAGE.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip("\n")


def write() -> None:
    text = PAGE.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    PAGE.write_text(text[:start] + "\n" + render() + "\n" + text[end:])


if __name__ == "__main__":
    sys.path[:0] = [str(Path(__file__).resolve().parents[1])]
    write()
