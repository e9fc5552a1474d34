"""The docs' conformance table is the suite's: every adapter, every cell run or explained."""

from __future__ import annotations

from conformance import table
from conformance.cells import CELLS
from conformance.registry import ADAPTERS
from conformance.suite import Adapter, Cell


def test_the_page_shows_the_suites_table() -> None:
    """docs/integrations.md's table is what the registry says (rewrite it with
    ``python tests/conformance/table.py``)."""
    assert table.page_table() == table.render()


def test_every_cell_is_run_or_explained() -> None:
    """A cell an adapter does not run has a reason (never a silent skip), and one it runs
    has what the cell needs."""
    for adapter in ADAPTERS:
        for c, reason in adapter.not_applicable.items():
            assert isinstance(c, Cell) and len(reason.strip()) > 20, (adapter, c)
        runs = set(Cell) - set(adapter.not_applicable)
        if Cell.PAUSE_RESUME in runs:
            assert type(adapter).resume is not Adapter.resume, adapter
        if Cell.NESTED in runs:
            assert type(adapter).nested is not Adapter.nested, adapter
    assert set(CELLS) == set(Cell)
