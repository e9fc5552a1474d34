"""The conformance cells of the adapters whose frameworks live in ``.venv-crewai`` (CrewAI,
LiteLLM): every cell one of them runs (a cell none of them runs is not collected here, so
nothing is skipped; the table says why)."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator

import pytest

from conformance.cells import CELLS, parametrize
from conformance.registry import ADAPTERS

with warnings.catch_warnings():  # crewai's lazy imports warn on import (ImportWarning)
    warnings.simplefilter("ignore", ImportWarning)
    import crewai  # noqa: F401 - missing: a failure, never a skip
    import litellm  # noqa: F401

#: CrewAI's own Agent reads the fields it deprecates on every Agent built (and LiteLLM's
#: stream reader a field pydantic deprecates); LiteLLM's TypedDicts make pydantic warn of their
#: ReadOnly items on first use: the frameworks' warnings, not tether's
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:.*ReadOnly. qualifier:UserWarning"),
]


@pytest.fixture(autouse=True, scope="module")
def _litellm_s_own_loops() -> Iterator[None]:
    """LiteLLM's sync calls leave an event loop of its own unclosed (its logging worker's):
    collected here, its ResourceWarning LiteLLM's, not this code's."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


_HERE = [a for a in ADAPTERS if a.venv == "crewai"]
globals().update(
    {fn.__name__: fn for c, fn in CELLS.items() if any(c not in a.not_applicable for a in _HERE)}
)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize(metafunc, "crewai")
