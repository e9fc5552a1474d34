"""Hand-built LangGraph graphs: tether's guards around a ``ToolNode``, and a retry policy.

>>> from langgraph.prebuilt import ToolNode
>>> from tether.integrations import langgraph as ta_langgraph
>>> with guard.start(task="refund A-1") as run:                        # doctest: +SKIP
...     tools = ToolNode([lookup_order, issue_refund],
...                      wrap_tool_call=ta_langgraph.tool_wrapper(run, side_effects={"issue_refund": None}))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tether._errors import require
from tether.classification._classify import classify
from tether.run._run import Run

__all__ = ["atool_wrapper", "retry_policy", "tool_wrapper"]


def retry_policy(**settings: Any) -> Any:
    """A LangGraph ``RetryPolicy`` that retries what ``tether.classify`` calls retryable
    (never a quota or a permanent failure); other fields as LangGraph's (``max_attempts``,
    ``initial_interval``, ``backoff_factor``, ``max_interval``, ``jitter``)."""
    types: Any = require("langgraph.types", "langchain")
    settings.setdefault("retry_on", lambda exc: classify(exc).retryable)
    return types.RetryPolicy(**settings)


Wrapper = Callable[[Any, Callable[[Any], Any]], Any]


def _drain(run: Run, control: Any) -> None:
    """A guard stopped the run: ask LangGraph to stop at the next superstep boundary, with
    its checkpoint saved (``GraphDrained``), so that the thread can be resumed."""
    if control is not None and run.stopped is not None and not control.drain_requested:
        control.request_drain(f"tether: {run.stopped.value}")


def tool_wrapper(
    run: Run,
    side_effects: Any = None,
    *,
    timeouts: Mapping[str, float] | None = None,
    control: Any = None,
    labels: Mapping[str, str] | None = None,
    volatile: Mapping[str, Iterable[str]] | None = None,
) -> Wrapper:
    """A ``ToolNode(wrap_tool_call=...)`` that runs every tool call through ``run``: loops,
    timeouts, breaker, retries, the ledger for ``side_effects``. A guard's stop comes back
    as an error tool message; route on ``run.stopped`` to end the graph, or pass the run's
    ``control`` (``langgraph.runtime.RunControl``, given to ``invoke(..., control=...)``) to
    drain it: LangGraph stops at the next superstep with a resumable checkpoint."""
    from tether.integrations.langchain import ToolGuard

    guard = ToolGuard(side_effects, timeouts, labels=labels, volatile=volatile)

    def wrapped(request: Any, handler: Callable[[Any], Any]) -> Any:
        try:
            return guard.call(run, request, handler)
        finally:
            _drain(run, control)

    return wrapped


def atool_wrapper(
    run: Run,
    side_effects: Any = None,
    *,
    timeouts: Mapping[str, float] | None = None,
    control: Any = None,
    labels: Mapping[str, str] | None = None,
    volatile: Mapping[str, Iterable[str]] | None = None,
) -> Wrapper:
    """The async form of :func:`tool_wrapper` (``ToolNode(awrap_tool_call=...)``)."""
    from tether.integrations.langchain import ToolGuard

    guard = ToolGuard(side_effects, timeouts, labels=labels, volatile=volatile)

    async def wrapped(request: Any, handler: Callable[[Any], Any]) -> Any:
        try:
            return await guard.acall(run, request, handler)
        finally:
            _drain(run, control)

    return wrapped
