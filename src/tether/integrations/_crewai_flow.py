"""A CrewAI Flow's state holds the run: ``TetherCrew.kickoff(crew, flow=self)`` in a step.

The run document (``run.snapshot()``) is kept in the Flow's state, field ``tether_run``
(a structured state declares ``tether_run: dict[str, Any] | None = None``; an unstructured
one takes the key), so CrewAI's ``@persist`` saves it with the state after each step. The
Flow's state id is the request (``crewai-flow:<state id>``): a step that kicks a crew off
again, and the Flow restored from its persistence in another process or another instance
(``flow.kickoff(inputs={"id": state_id})``), continue the same run: its budgets spent, its
loop detectors, its effects replayed from the ledger. The document is read by the one
reader of run documents (``guard.restore``): an altered, forged, newer or corrupt one is
refused with :class:`tether.RunDocumentError` before anything runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tether import Guard, Run
from tether._errors import RunDocumentError

__all__ = ["FIELD", "flow_key", "kept_run", "keep"]

#: the field of the Flow's state that holds the run document
FIELD = "tether_run"


def flow_key(flow: Any) -> str:
    """The request a Flow serves: its state id."""
    return f"crewai-flow:{flow.state.id}"


def _holds(state: Any) -> bool:
    return isinstance(state, dict) or FIELD in type(state).model_fields


def _check(flow: Any) -> Any:
    state = flow.state
    if not _holds(state):
        raise ValueError(
            f"{type(flow).__name__}'s state ({type(state).__name__}) has no field {FIELD!r} "
            f"to keep its tether run in: add `{FIELD}: dict[str, Any] | None = None` to it"
        )
    return state


def kept_run(guard: Guard, flow: Any, key: str) -> Run | None:
    """The run the Flow's state holds, continuing under ``guard`` (None: none yet)."""
    state = _check(flow)
    doc = state.get(FIELD) if isinstance(state, dict) else getattr(state, FIELD)
    if doc is None:
        return None
    if not isinstance(doc, Mapping):
        raise RunDocumentError(
            f"the Flow's {FIELD} must be a run document, got {type(doc).__name__}: the Flow "
            "cannot go on unguarded"
        )
    if doc.get("key") != key:
        raise RunDocumentError(
            f"the Flow's {FIELD} serves request key {doc.get('key')!r:.60}, not this Flow's "
            f"({key!r:.60}): refused, nothing ran"
        )
    return guard.restore(doc)


def keep(flow: Any, run: Run) -> None:
    """The run's document into the Flow's state (``@persist`` saves it after the step)."""
    state = _check(flow)
    doc = run.snapshot()
    if isinstance(state, dict):
        state[FIELD] = doc
    else:
        setattr(state, FIELD, doc)
