"""The conformance cells of the adapters whose frameworks are in the main venv."""

from __future__ import annotations

import pytest

from conformance.cells import *  # noqa: F403  (the cells, collected here)
from conformance.cells import parametrize


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize(metafunc, "main")
