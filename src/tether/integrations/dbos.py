"""DBOS workflows under tether: at most once where a recovery gives at least once.

DBOS checkpoints a step's output once the step returns; a process that dies after the
step's effect and before that checkpoint re-runs the step when the workflow recovers,
and the effect happens twice. Two thin layers close that gap:

* :func:`step`: a DBOS step whose body runs through tether's ledger, keyed by the
  workflow id, the step id and the intent (the step's name and exact arguments). A
  recovered step returns the recorded result, reconciles through ``lookup`` when the
  dead process was mid-effect, or raises :class:`tether.UnknownOutcome`. With
  ``retries_allowed=True`` DBOS's retry is the one layer and tether's verdict decides
  what it retries (:func:`should_retry`).
* :func:`run` / :func:`arun`: a guarded run inside a workflow. Each *phase* of the run
  (from ``guard.start`` or ``guard.resume`` to its stop) is one DBOS step, so the
  workflow's own code reads no tether state and replays the same way every time; a phase
  interrupted by a crash runs again in the recovering process, where the ledger replays
  what the dead one did: its effects (non-idempotent tools) and its model calls (made
  through a :func:`step`) happen once, and the fresh run counts each model call and its
  cost once. A run that stops for an approval waits durably for it (a DBOS message, or
  the operator's decision read from the guard's records every ``approval_poll`` seconds),
  then resumes in a new phase.
"""

from __future__ import annotations

import functools
import hashlib
import warnings
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from tether import Guard, Outcome, Run, telemetry
from tether._errors import (
    require,
)
from tether.effects._canonical import intent_key
from tether.effects._ledger import Ledger
from tether.integrations._common import is_async, require_guard
from tether.integrations._durable import (
    F,
    Lookup,
    RetryLayersWarning,
    check_effect,
    engine_verdict,
)
from tether.records._approvals import PENDING, ApprovalRecord
from tether.records._collections import check_run_id

require("dbos", "dbos")

from dbos import DBOS  # noqa: E402 - after the extra check

__all__ = [
    "APPROVAL_TOPIC",
    "RetryLayersWarning",
    "approve",
    "arun",
    "notify",
    "reject",
    "run",
    "should_retry",
    "step",
    "step_key",
]

#: The topic of the DBOS message that wakes a workflow waiting for an approval
#: (``APPROVAL_TOPIC + approval id``).
APPROVAL_TOPIC = "tether.approval:"


# --- the guarded step --------------------------------------------------------------------


def step_key(name: str, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> str:
    """The ledger key of step ``name`` called with ``args`` in the running workflow:
    ``dbos:<workflow id>/<step id>`` and the exact arguments (outside a workflow, the
    arguments alone)."""
    workflow_id, step_id = DBOS.workflow_id, DBOS.step_id
    scope = f"dbos:{workflow_id}/{step_id}" if workflow_id is not None else "dbos"
    return intent_key(
        name, {"args": list(args), "kwargs": dict(kwargs or {})}, scope=scope, ignore=()
    )


def should_retry(exc: BaseException) -> bool:
    """DBOS's ``should_retry`` from tether's verdict: retry what may clear (a 503, a 429,
    a claim another process still holds, our own store down), never a permanent failure
    nor an effect whose outcome is unknown."""
    return engine_verdict(exc)[0]


def step(
    ledger: Ledger | None = None,
    *,
    lookup: Lookup | None = None,
    name: str | None = None,
    lease: float | None = None,
    **options: Any,
) -> Callable[[F], F]:
    """A DBOS step (``@DBOS.step(**options)``) whose body runs at most once per workflow
    step, sync or async.

    ``ledger`` keeps the record across processes (``Ledger.postgres(dsn)``; give it
    ``wait=`` longer than ``lease`` so that a recovering process waits out the lease of
    the process that died, then asks ``lookup``). ``lookup(key)`` reads the provider's
    records (None: :class:`tether.UnknownOutcome`). With ``retries_allowed=True`` and no
    ``should_retry`` of your own, DBOS retries what :func:`should_retry` allows.
    """
    check_effect(ledger, lease, lookup)
    if options.get("retries_allowed"):
        options.setdefault("should_retry", should_retry)

    def decorate(fn: F) -> F:
        tool: str = name or str(
            getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "step")
        )
        held = lease if lease is not None else (ledger.lease if ledger is not None else 60.0)
        body: Callable[..., Any]
        if is_async(fn):

            @functools.wraps(fn)
            async def abody(*args: Any, **kwargs: Any) -> Any:
                if ledger is None:
                    return await fn(*args, **kwargs)
                key = step_key(tool, args, kwargs)
                return await ledger.aonce(key, fn, *args, lookup=lookup, lease=held, **kwargs)

            body = abody
        else:

            @functools.wraps(fn)
            def sbody(*args: Any, **kwargs: Any) -> Any:
                if ledger is None:
                    return fn(*args, **kwargs)
                key = step_key(tool, args, kwargs)
                return ledger.once(key, fn, *args, lookup=lookup, lease=held, **kwargs)

            body = sbody
        return cast(F, DBOS.step(name=tool, **options)(body))

    return decorate


@telemetry.on_retry
def _warn_two_layers(event: Any) -> None:
    """A tether RetryPolicy retried inside a step that DBOS retries too."""
    status = DBOS.step_status
    if status is None or not status.max_attempts or status.max_attempts <= 1:
        return
    warnings.warn(
        f"tether retried {event.name!r} inside a DBOS step that DBOS retries too "
        f"(max_attempts={status.max_attempts}): the attempts multiply. Keep one layer: "
        "RetryPolicy(max_attempts=1) inside the step, or retries_allowed=False",
        RetryLayersWarning,
        stacklevel=2,
    )


# --- the guarded run ----------------------------------------------------------------------


def _workflow_id() -> str:
    workflow_id = DBOS.workflow_id
    if workflow_id is None or DBOS.step_id is not None:
        raise RuntimeError(
            "tether.integrations.dbos.run must be called in a @DBOS.workflow function (not in a "
            "step): each phase of the run is a step of that workflow"
        )
    return workflow_id


def _open(
    guard: Guard, task: str, scopes: Sequence[str], workflow_id: str, checkpoint_id: str | None
) -> Run:
    """The phase's run: the checkpointed one, or a new one serving the workflow's request
    (``key=`` the workflow id), named after the workflow and the phase's step (the same
    names when a crashed phase runs again)."""
    if checkpoint_id is not None:
        return guard.resume(checkpoint_id)
    run_id = f"dbos_{workflow_id}_{DBOS.step_id}"
    try:
        check_run_id(run_id)
    except ValueError:  # a workflow id with characters a run id may not have
        run_id = f"dbos_{hashlib.sha256(workflow_id.encode()).hexdigest()[:32]}_{DBOS.step_id}"
    # the run serves the workflow's request: its effects happen once across its phases
    return guard.start(task, key=workflow_id, run_id=run_id, scopes=scopes or None)


def _phase(
    guard: Guard,
    agent: Callable[[Run], Any],
    task: str,
    scopes: Sequence[str],
    workflow_id: str,
    checkpoint_id: str | None,
) -> Outcome:
    run = _open(guard, task, scopes, workflow_id, checkpoint_id)
    with run:
        agent(run)
    return run.outcome


async def _aphase(
    guard: Guard,
    agent: Callable[[Run], Awaitable[Any]],
    task: str,
    scopes: Sequence[str],
    workflow_id: str,
    checkpoint_id: str | None,
) -> Outcome:
    run = _open(guard, task, scopes, workflow_id, checkpoint_id)
    async with run:
        await agent(run)
    return run.outcome


def _approval_status(guard: Guard, approval_id: str) -> str:
    """The decision on ``approval_id`` as the guard's records hold it (the operator page's
    or ``guard.approve``'s)."""
    if guard.records is not None:
        record = guard.records.approvals.get(approval_id)
        return record.status if record is not None else PENDING
    for found in guard.approvals(limit=1000):
        if found.id == approval_id:
            return found.status
    return PENDING


def _waits(outcome: Outcome) -> str | None:
    """The approval a phase stopped for, when the run can resume after it."""
    pending = outcome.pending_approval
    if outcome.status != "awaiting_approval" or outcome.checkpoint_id is None or not pending:
        return None
    approval_id = pending.get("id") if isinstance(pending, dict) else None
    return approval_id if isinstance(approval_id, str) else None


def _polls(approval_poll: float, approval_timeout: float | None) -> int | None:
    if (
        isinstance(approval_poll, bool)
        or not isinstance(approval_poll, int | float)
        or approval_poll <= 0
    ):
        raise ValueError(f"approval_poll must be a number of seconds > 0, got {approval_poll!r}")
    if approval_timeout is None:
        return None
    if (
        isinstance(approval_timeout, bool)
        or not isinstance(approval_timeout, int | float)
        or approval_timeout < 0
    ):
        raise ValueError(
            f"approval_timeout must be a number of seconds >= 0 or None, got {approval_timeout!r}"
        )
    return max(1, int(-(-approval_timeout // approval_poll)))


@dataclass(frozen=True, slots=True)
class _Step:
    """A step the workflow asks DBOS to run: ``fn(*args)``, named ``name``."""

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class _Message:
    """A wait for the message on ``topic`` (at most the approval poll)."""

    topic: str


def _workflow(
    guard: Guard,
    agent: Any,
    task: str,
    scopes: Sequence[str],
    approval_poll: float,
    approval_timeout: float | None,
    phase: Callable[..., Any],
) -> Generator[_Step | _Message, Any, Outcome]:
    """The guarded run as a workflow (sans-IO: :func:`run` and :func:`arun` make the steps
    it asks for): a phase of the run as one step; while it waits for an approval, the
    decision read as a step, then a wait for the message that wakes it; then the next
    phase from the checkpoint."""
    require_guard(guard)
    polls = _polls(approval_poll, approval_timeout)
    workflow_id = _workflow_id()
    checkpoint_id: str | None = None
    while True:
        outcome: Outcome = yield _Step(
            "tether.run", phase, (guard, agent, task, scopes, workflow_id, checkpoint_id)
        )
        approval_id = _waits(outcome)
        if approval_id is None:
            return outcome
        waited = 0
        while (yield _Step("tether.approval", _approval_status, (guard, approval_id))) == PENDING:
            if polls is not None and waited >= polls:
                return outcome
            yield _Message(APPROVAL_TOPIC + approval_id)
            waited += 1
        checkpoint_id = outcome.checkpoint_id


class _Plan:
    """A :func:`_workflow` being driven: its next ask (None once it ended, with its
    ``outcome``), given the ``answer`` to the last one."""

    def __init__(self, steps: Generator[_Step | _Message, Any, Outcome]) -> None:
        self._steps = steps
        self.answer: Any = None
        self._outcome: Outcome | None = None

    @property
    def outcome(self) -> Outcome:
        assert self._outcome is not None, "the workflow has not ended"
        return self._outcome

    def next(self) -> _Step | _Message | None:
        try:
            return self._steps.send(self.answer)
        except StopIteration as done:
            self._outcome = done.value
            return None


def run(
    guard: Guard,
    agent: Callable[[Run], Any],
    *,
    task: str = "",
    scopes: Sequence[str] | None = None,
    approval_poll: float = 30.0,
    approval_timeout: float | None = None,
) -> Outcome:
    """Run ``agent(run)`` as a guarded run of the calling DBOS workflow; its Outcome.

    ``agent`` is the loop (``while run.proceed(): ...``); make its model calls through a
    :func:`step` (the recovering process replays their replies from the ledger) and its
    effects non-idempotent tool calls (``run.call_tool(..., idempotent=False)``) on a
    durable ledger. A run that stops ``AWAITING_APPROVAL`` waits for the decision (a
    message from :func:`approve`/:func:`notify`, or the records read every
    ``approval_poll`` seconds) at most ``approval_timeout`` seconds (None: as long as it
    takes), then resumes; past the timeout the awaiting outcome is returned. ``scopes``
    names the budget scopes the run spends in (``guard.start(task, scopes=...)``); a spent
    scope ends the workflow with the paused run's outcome (``BUDGET_REACHED``).
    """
    plan = _Plan(
        _workflow(guard, agent, task, tuple(scopes or ()), approval_poll, approval_timeout, _phase)
    )
    while (ask := plan.next()) is not None:
        if isinstance(ask, _Step):
            plan.answer = DBOS.run_step({"name": ask.name}, ask.fn, *ask.args)
        else:
            plan.answer = DBOS.recv(ask.topic, timeout_seconds=approval_poll)
    return plan.outcome


async def arun(
    guard: Guard,
    agent: Callable[[Run], Awaitable[Any]],
    *,
    task: str = "",
    scopes: Sequence[str] | None = None,
    approval_poll: float = 30.0,
    approval_timeout: float | None = None,
) -> Outcome:
    """The async form of :func:`run`: ``await agent(run)`` in an async workflow."""
    plan = _Plan(
        _workflow(guard, agent, task, tuple(scopes or ()), approval_poll, approval_timeout, _aphase)
    )
    while (ask := plan.next()) is not None:
        if isinstance(ask, _Step):
            plan.answer = await DBOS.run_step_async({"name": ask.name}, ask.fn, *ask.args)
        else:
            plan.answer = await DBOS.recv_async(ask.topic, timeout_seconds=approval_poll)
    return plan.outcome


# --- approvals from outside the workflow ------------------------------------------------------


def notify(workflow_id: str, approval_id: str) -> None:
    """Wake the workflow waiting for ``approval_id`` (it reads the decision at once)."""
    DBOS.send(workflow_id, approval_id, APPROVAL_TOPIC + approval_id)


def approve(
    guard: Guard, checkpoint_id: str, *, workflow_id: str, by: str, note: str = ""
) -> ApprovalRecord:
    """``guard.approve(...)``, then wake the workflow that waits for it."""
    return _woken(workflow_id, guard.approve(checkpoint_id, by=by, note=note))


def reject(
    guard: Guard, checkpoint_id: str, *, workflow_id: str, by: str, reason: str = ""
) -> ApprovalRecord:
    """``guard.reject(...)``, then wake the workflow that waits for it."""
    return _woken(workflow_id, guard.reject(checkpoint_id, by=by, reason=reason))


def _woken(workflow_id: str, record: ApprovalRecord) -> ApprovalRecord:
    """A decision made: the workflow that waits for it is woken."""
    notify(workflow_id, record.id)
    return record
