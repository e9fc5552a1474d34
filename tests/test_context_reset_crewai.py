"""Cleanups run from another context leave that context's values alone (CrewAI, LiteLLM).

As ``test_context_reset.py``, in ``.venv-crewai``: LiteLLM's ``TetherLogger.serving`` block
in a coroutine and a CrewAI agent's task under its deadline, each closed from another context.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of the cost map
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

with warnings.catch_warnings():  # crewai's lazy imports warn on import (ImportWarning)
    warnings.simplefilter("ignore", ImportWarning)
    import crewai  # noqa: F401 - this module runs where CrewAI and LiteLLM are installed
from context_checks import closed, suspended, unraisables, waits
from tether import VirtualClock
from tether.integrations import _crewai_limits
from tether.integrations import litellm as ta_litellm

#: CrewAI's own Agent reads the fields it deprecates: not this code's warnings
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def unraisable(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    yield from unraisables(monkeypatch)


def test_a_litellm_serving_block_closed_from_another_context(unraisable: list[Any]) -> None:
    """A coroutine in ``serving(run)`` closed elsewhere: the closer's run as it was."""

    async def call(run: Any) -> None:
        with ta_litellm.TetherLogger.serving(run):
            await waits()

    closed(suspended(call(object())), ta_litellm._SERVING)
    assert unraisable == []


def test_a_crewai_task_under_its_deadline_closed_from_another_context(
    unraisable: list[Any],
) -> None:
    """An agent's async task under ``max_execution_time`` closed elsewhere: the closer's
    deadline as it was."""

    class Agent:
        role = "clerk"
        _aexecute_without_timeout = staticmethod(waits)

    class Run:
        clock = VirtualClock()

    _, aexecute = _crewai_limits.timed(Agent(), Run)
    closed(suspended(aexecute("refund A-1", None, 5.0)), _crewai_limits._DEADLINE)
    assert unraisable == []
