"""The conformance cells of the adapters whose frameworks live in ``.venv-frameworks``
(Google ADK, Strands): every cell one of them runs (a cell none of them runs is not
collected here, so nothing is skipped; the table says why)."""

from __future__ import annotations

import pytest

from conformance.cells import CELLS, parametrize
from conformance.registry import ADAPTERS

#: ADK's own AgentTool builds its Runner with the deprecated ``plugins=`` (ADK's warning)
pytestmark = pytest.mark.filterwarnings("ignore:The `plugins` argument is deprecated")

_HERE = [a for a in ADAPTERS if a.venv == "frameworks"]
globals().update(
    {fn.__name__: fn for c, fn in CELLS.items() if any(c not in a.not_applicable for a in _HERE)}
)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize(metafunc, "frameworks")
