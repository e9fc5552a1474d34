"""The conformance cells of the adapters whose frameworks live in ``.venv-crewai`` (CrewAI):
every cell one of them runs (a cell none of them runs is not collected here, so nothing is
skipped; the table says why)."""

from __future__ import annotations

import warnings

import pytest

from conformance.cells import CELLS, parametrize
from conformance.registry import ADAPTERS

with warnings.catch_warnings():  # crewai's lazy imports warn on import (ImportWarning)
    warnings.simplefilter("ignore", ImportWarning)
    import crewai  # noqa: F401 - missing: a failure, never a skip

#: CrewAI's own Agent reads the fields it deprecates on every Agent built
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

_HERE = [a for a in ADAPTERS if a.venv == "crewai"]
globals().update(
    {fn.__name__: fn for c, fn in CELLS.items() if any(c not in a.not_applicable for a in _HERE)}
)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize(metafunc, "crewai")
