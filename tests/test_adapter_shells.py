"""The adapters' twin entry points share one parameter list, and the durable engines one
retry decision (what the thin shells forward to)."""

from __future__ import annotations

import inspect

import pytest

from tether import CircuitOpenError, EffectInProgress, StoreUnavailable, UnknownOutcome
from tether.integrations import dbos as ta_dbos
from tether.integrations import langgraph as ta_langgraph
from tether.integrations import mcp as ta_mcp
from tether.integrations import openai_agents as ta_agents
from tether.integrations import temporal as ta_temporal


def parameters(fn: object) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("twin", "model"),
    [
        (ta_agents.run_streamed, ta_agents.run),
        (ta_agents.run_sync, ta_agents.run),
        (ta_langgraph.atool_wrapper, ta_langgraph.tool_wrapper),
        (ta_mcp.guarded, ta_mcp.GuardedSession),
    ],
)
def test_a_twin_shows_the_parameters_it_forwards(twin: object, model: object) -> None:
    """help() and inspect.signature show a twin's real parameters, not ``**options``."""
    assert parameters(twin) == parameters(model)


def test_one_warning_for_two_retry_layers_in_either_engine() -> None:
    """Temporal's and DBOS's RetryLayersWarning are one class: one filter silences both."""
    assert ta_temporal.RetryLayersWarning is ta_dbos.RetryLayersWarning


@pytest.mark.parametrize(
    ("exc", "retried"),
    [
        (UnknownOutcome("k"), False),
        (EffectInProgress("k", 0.0), True),
        (CircuitOpenError("payments", 3.0, 0.0), True),
        (StoreUnavailable("redis is away"), True),
        (ConnectionResetError("reset"), True),
        (ValueError("no such order"), False),
    ],
)
def test_both_engines_retry_what_tether_would(exc: Exception, retried: bool) -> None:
    """DBOS's should_retry and Temporal's engine_error say the same of each failure."""
    assert ta_dbos.should_retry(exc) is retried
    error = ta_temporal.engine_error(exc)
    assert bool(getattr(error, "non_retryable", False)) is not retried
