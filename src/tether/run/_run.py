"""Guarded runs: budgets, loop detection and a graceful stop around an agent's loop.

A reliable agent checks every guard on every iteration, before spending the next
call; every way out of the loop returns a result, or a partial result and a reason.
:class:`Run` is the front: it owns the run's state (``_runstate``) and its parts, each
given that state and the guard's frozen settings: the steps (``_steps``), the tool-call
pipeline (``_toolcall`` over ``_tooldecisions``, ``_toolgate``, ``_hung``), the model
calls (``_modelcalls``), the compensations (``_rollback``) and the ending (``_ending``).
Only the run decides their order.
"""

from __future__ import annotations

import functools
import inspect
import operator
from collections.abc import Awaitable, Callable, Mapping
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    ParamSpec,
    Self,
    TypeVar,
    Unpack,
    overload,
)

from tether.classification._classify import classify
from tether.run._document import merge
from tether.run._ending import Ending
from tether.run._modelcalls import ModelCalls
from tether.run._options import ModelRequest, ModelUsage, ToolOptions
from tether.run._outcome import Outcome, Status, Stopped, StopReason
from tether.run._runstate import (
    RunState,
    Tail,
    close_span,
    escalate,
    keep_error,
    keep_result,
    note_compensations,
    open_span,
    reach_goal,
)
from tether.run._settings import RunSettings
from tether.run._steps import Steps
from tether.run._toolcall import ToolPipeline

if TYPE_CHECKING:
    from collections import Counter

    from tether.clock import Clock
    from tether.run._budget import Budget
    from tether.run._loops import LoopState
    from tether.run._rollback import Compensations, Rollback

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")

__all__ = ["Run"]


class _FromState(Generic[T]):
    """An attribute of the run's state, read (and, where the state allows, set) on the run;
    a private one (``run._loops``) is read only: its state's module alone writes it."""

    __slots__ = ("name",)

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, run: None, owner: type) -> Self: ...
    @overload
    def __get__(self, run: Run, owner: type) -> T: ...
    def __get__(self, run: Run | None, owner: type) -> T | Self:
        return self if run is None else getattr(run._state, self.name)

    def __set__(self, run: Run, value: T) -> None:
        if self.name.startswith("_"):
            raise AttributeError(f"run.{self.name} is read only (the run's state owns it)")
        setattr(run._state, self.name, value)


def _answered_by(
    part: str, method: Callable[Concatenate[Any, P], R]
) -> Callable[Concatenate[Run, P], R]:
    """A method of the run that one of its parts (``run.<part>``) answers, with that
    method's signature and docstring (an async one stays a coroutine function)."""
    get = operator.attrgetter(part)

    def call(run: Run, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return method(get(run), *args, **kwargs)

    async def acall(run: Run, /, *args: P.args, **kwargs: P.kwargs) -> Any:
        return await method(get(run), *args, **kwargs)  # type: ignore[misc]

    return functools.update_wrapper(acall if inspect.iscoroutinefunction(method) else call, method)  # type: ignore[return-value]


def _not_done(s: RunState) -> bool:
    """A run told it succeeded after a person rejected a call (it ends ``DECLINED``), or after
    a side effect failed for good and was not done since (a business error, a dead letter:
    it ends ``PERMANENT_ERROR``, the ending of a framework that raises the tool's exception);
    the answer is kept as its result (#40)."""
    if s._stop is not None or not (s._failed_effects or s._declined):
        return False
    if s._declined:  # a person said no: it stands
        tool, why = next(iter(s._declined.values()))
        s._halt(StopReason.DECLINED, f"{tool}: rejected: {why}")
        return True
    tool, error = next(iter(s._failed_effects.items()))
    keep_error(s, error)
    s._halt(StopReason.PERMANENT_ERROR, f"{tool} failed and was not done ({error})")
    return True


class Run:
    """One guarded run of an agent (see :class:`tether.Guard`): a front that owns the run's
    state and its parts (steps, tool calls, model calls, compensations, ending), each given the
    state, and decides their order; the counters (``steps``, ``cost_usd``...) are the state's."""

    guard: _FromState[RunSettings] = _FromState()
    task: _FromState[str] = _FromState()
    run_id: _FromState[str] = _FromState()
    key: _FromState[str | None] = _FromState()  # the request key it was started with
    clock: _FromState[Clock] = _FromState()
    budget: _FromState[Budget] = _FromState()
    steps: _FromState[int] = _FromState()
    model_calls: _FromState[int] = _FromState()
    tool_calls: _FromState[int] = _FromState()
    retries: _FromState[int] = _FromState()
    input_tokens: _FromState[int] = _FromState()
    output_tokens: _FromState[int] = _FromState()
    cache_write_tokens: _FromState[int] = _FromState()
    cache_read_tokens: _FromState[int] = _FromState()
    total_tokens: _FromState[int] = _FromState()
    cost_usd: _FromState[float] = _FromState()
    unpriced_calls: _FromState[int] = _FromState()
    elapsed: _FromState[float] = _FromState()
    messages: _FromState[list[Any] | None] = _FromState()  # the conversation, when kept
    transcript: _FromState[Tail] = _FromState()
    stopped: _FromState[StopReason | None] = _FromState()  # None while it runs
    stop_detail: _FromState[str] = _FromState()  # why it stopped, in words
    urgency: _FromState[float] = _FromState()  # the largest share of a budget spent
    _loops: _FromState[LoopState] = _FromState()  # the loop detectors' memory
    _scope: _FromState[str] = _FromState()  # what its effects' intent keys are scoped by
    _tool_counts: _FromState[Counter[str]] = _FromState()  # calls let through, per tool

    @property
    def partial(self) -> Tail:
        """The completed tool calls the run keeps (``Guard(keep_last=...)``), oldest first,
        each a plain dict: its redacted view (``step``, ``tool``, ``args``, ``result``)."""
        return self._state.partial.as_views()

    def __init__(
        self,
        guard: RunSettings,
        task: str,
        run_id: str,
        *,
        key: str | None = None,
        request: str | None = None,
    ) -> None:
        self._state = state = RunState(self, guard, task, run_id, key=key, request=request)
        self._steps = Steps(state)
        self._tools = ToolPipeline(state)
        self._models = ModelCalls(state)
        self._ending = Ending(state)

    @functools.cached_property
    def _undo(self) -> Rollback:  # the compensations: made (its module loaded) when first used
        from tether.run._rollback import Rollback

        return Rollback(self._state)

    # --- the with-block and the ending ------------------------------------------------

    def __enter__(self) -> Self:
        open_span(self._state)
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> bool:
        if isinstance(exc, Exception) and not isinstance(exc, Stopped):
            verdict = classify(exc)
            self._state.note_error(exc)
            self._state._halt(
                StopReason.ERROR if verdict.retryable else StopReason.PERMANENT_ERROR,
                f"{type(exc).__name__}: {verdict.reason}",
            )
        self.finish()
        close_span(self._state)
        return isinstance(exc, Stopped)

    async def __aenter__(self) -> Self:
        return self.__enter__()

    async def __aexit__(self, kind: object, exc: BaseException | None, tb: object) -> bool:
        return self.__exit__(kind, exc, tb)

    @property
    def outcome(self) -> Outcome:
        """The run's outcome, once it has ended (a stop condition holds, or its with-block
        closed); the run is finished on first access. Raises RuntimeError while it runs."""
        s = self._state
        if s._outcome is None and s._stop is None:
            raise RuntimeError(
                f"run {s.run_id} has not ended: read run.outcome after its with-block, or "
                "end it first (run.succeed(), run.fail(), run.stop(), run.escalate())"
            )
        return s._outcome if s._outcome is not None else self.finish()

    facts = _answered_by("_ending", Ending.facts)

    def finish(self) -> Outcome:
        """Close the run: status, reason, checkpoint, handoff, customer message; first
        what the guard says to undo for this ending (``Guard(rollback_on=...)``)."""
        s = self._state
        if s._outcome is not None:
            return s._outcome
        if s._stop is None:
            s._halt(StopReason.NO_RESULT, "the loop ended without run.succeed()")
        reason = s.stopped
        assert reason is not None
        status = self._ending._status(reason)
        if (reason in s.guard.rollback_on or status in s.guard.rollback_on) and any(
            e.state == "done" for e in s._journal
        ):
            self.rollback()  # it may escalate: the status is read again
            status = self._ending._status(reason)
        return self._models.scopes.ended(self._ending._conclude(status, amend=False))

    _ended_as = _answered_by("_ending", Ending._ended_as)

    def rollback(self, compensations: Compensations = None) -> tuple[dict[str, Any], ...]:
        """Undo the run's completed calls that have a compensation, newest first.

        Each compensation runs at most once, through the guard's ledger under a key made
        from the original call's key, with the guard's retry and breaker rules: calling
        ``rollback()`` again, or in a process that resumed the run from its checkpoint
        (``compensations`` gives the functions by tool name there), finishes what is left
        and repeats nothing. A compensation that fails, or whose outcome is unknown, hands
        the run to a person with the facts (the run escalates). Returns what this call
        confirmed undone (including what an interrupted earlier rollback had undone, read
        from the ledger); ``outcome.compensated`` has everything undone, newest first.
        """
        return self._after_rollback(self._undo.rollback(compensations))

    async def arollback(self, compensations: Compensations = None) -> tuple[dict[str, Any], ...]:
        """The async form of :meth:`rollback` (async compensations awaited, sync ones in a
        worker thread)."""
        return self._after_rollback(await self._undo.arollback(compensations))

    def _after_rollback(self, done: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
        """What a rollback leaves: a run resumed only to roll back ends as its checkpoint
        had; a run that had ended gets its outcome amended (and escalates when something
        could not be undone)."""
        s = self._state
        note_compensations(s, done)
        if s._escalate and s._stop is None:
            s._halt(StopReason.ESCALATED, "a compensation could not be made")
        if s._stop is None and not s._began and s._resumed_stop is not None:
            s._halt(*s._resumed_stop)
            self.finish()
        elif s._outcome is not None and (done or s._escalate):
            status = Status.ESCALATED if s._escalate else s._outcome.status
            self._ending._conclude(status, amend=True)
        return tuple(done)

    def __repr__(self) -> str:
        stopped = self._state.stopped
        return f"Run({self.run_id!r}, steps={self.steps}, stopped={stopped and stopped.name})"

    # --- model calls -----------------------------------------------------------------

    model_turn = _answered_by("_models", ModelCalls.model_turn)
    amodel_turn = _answered_by("_models", ModelCalls.amodel_turn)

    def begin_model_call(self, **turn: Unpack[ModelRequest]) -> float | None:
        """The checks and reservations of :meth:`model_turn` alone (keywords ``model=""``,
        ``provider=None``, ``estimated_input_tokens=None``, ``max_output_tokens=None``), for
        a shell that counts the reply with :meth:`record_model_call`; returns the run's time
        left (None: no time budget). Raises as entering a model turn does."""
        return self._models.begin(turn)

    async def abegin_model_call(self, **turn: Unpack[ModelRequest]) -> float | None:
        """The async form of :meth:`begin_model_call`: a wait for the token budget sleeps
        on the event loop."""
        return await self._models.abegin(turn)

    check_model = _answered_by("_models", ModelCalls.check_model)
    model_call_failed = _answered_by("_models", ModelCalls.model_call_failed)
    model_call_gave_way = _answered_by("_models", ModelCalls.model_call_gave_way)
    retry_model_call = _answered_by("_models", ModelCalls.retry_model_call)
    aretry_model_call = _answered_by("_models", ModelCalls.aretry_model_call)

    def record_model_call(self, **usage: Unpack[ModelUsage]) -> float | None:
        """Count one model call's usage and cost; returns the cost in USD (None: unknown).
        Keywords: ``input_tokens=0``, ``output_tokens=0``, ``model=""``,
        ``cache_write_tokens=0``, ``cache_read_tokens=0``, ``cost_usd=None``,
        ``provider=None``, ``unmeasured=False``.

        The cost comes from ``cost_usd`` or the guard's prices for ``model``; a model
        with no price has its tokens counted and its cost unknown
        (``Usage.unpriced_calls``). Under a cost budget that raises
        :class:`tether.UnknownModelError` (call :meth:`check_model` before the request
        to refuse it before paying). ``unmeasured=True`` says the provider reported no
        token counts for the call: its cost is unknown too, never zero.
        """
        return self._models.record_model_call(**usage)

    # --- tools -----------------------------------------------------------------------

    def call_tool(
        self,
        name: str,
        fn: Callable[..., Any],
        args: Mapping[str, Any] | None = None,
        **options: Unpack[ToolOptions],
    ) -> Any:
        """Call a tool under every guard: policies, approval, loops and budgets, breaker,
        retries, ledger. Keywords (:class:`~tether.run._options.ToolOptions`):
        ``timeout=None``, ``idempotent=True``, ``lookup=None``,
        ``requires_approval=False``, ``compensate=None``, ``volatile=()``, ``label=None``,
        ``allow_repeat=None``, ``passthrough=()``.

        ``fn(**args)`` is retried on transient failures with ``timeout`` per attempt;
        a non-idempotent tool runs at most once through the guard's ledger (an attempt
        that outlives ``timeout`` is never run again: the run stops ``UNKNOWN_OUTCOME``).
        ``idempotent=True`` (the default) declares that running ``fn`` again with the same
        arguments is harmless: it is run again after a timeout (whose attempt may have
        completed) and each time the model asks again. Give a tool with a side effect that
        must not repeat (a payment, a refund, an email) ``idempotent=False``.
        The guard's policies may deny the call before anything runs; ``requires_approval``
        (True, or a predicate of the arguments) stops the run ``AWAITING_APPROVAL`` until a
        person approves this very call; ``compensate(result)`` is what ``run.rollback()``
        runs to undo it once it completed. ``volatile`` names argument paths that the
        model fills anew on every call (``"meta.nonce"``, ``"items.*.request_id"``), left
        out of the call's identity besides the top-level request ids
        (:data:`tether.VOLATILE_FIELDS`); every other field, at any depth, is the intent.
        ``label`` is what the customer's message calls
        its effect (``"refund"``: "Done: refund completed"); the tool's name never reaches
        the customer.
        ``allow_repeat`` gives this call its own repeat cap, as a tool named in
        ``LoopPolicy.allow_repeat`` (a read-only tool that polls). ``passthrough`` names
        exceptions that are a framework's control flow (LangGraph's ``GraphInterrupt``):
        raised by ``fn``, they leave as they are, and the call counts as not made (no
        retry, no record, a ledger's claim given back).
        Raises :class:`tether.Stopped` when a guard ends the run (the call is not made),
        or :class:`tether.ToolError` with a short text for the model when it fails.
        """
        return self._tools.call(name, fn, args, options)  # the keywords' own dict, once

    async def acall_tool(
        self,
        name: str,
        fn: Callable[..., Awaitable[Any]] | Callable[..., Any],
        args: Mapping[str, Any] | None = None,
        **options: Unpack[ToolOptions],
    ) -> Any:
        """The async form of :meth:`call_tool`; a hanging attempt is cancelled.

        ``fn`` may be a coroutine function (awaited) or a plain function (run in a
        worker thread, so that it does not block the event loop).
        """
        return await self._tools.acall(name, fn, args, options)

    # --- the run protocol that the state answers (docs/run.md) ------------------------

    usage = _answered_by("_state", RunState.usage)
    time_left = _answered_by("_state", RunState.time_left)
    halt = _answered_by("_state", RunState.halt)
    note_error = _answered_by("_state", RunState.note_error)
    count_retries = _answered_by("_state", RunState.count_retries)
    breaker_wait = _answered_by("_state", RunState.breaker_wait)
    through_breaker = _answered_by("_state", RunState.through_breaker)
    athrough_breaker = _answered_by("_state", RunState.athrough_breaker)

    # --- the loop ---------------------------------------------------------------------

    def proceed(self) -> bool:
        """Start the next step if every guard allows it; False once a stop condition holds."""
        return self._steps.proceed()

    progress = _answered_by("_steps", Steps.progress)
    observe_state = _answered_by("_steps", Steps.observe_state)

    merged = staticmethod(merge)  # two copies of a run as one (docs/run.md: copies merge)

    def snapshot(self) -> dict[str, Any]:
        """The run as plain data, for a framework's state: ``guard.restore(doc)`` goes on."""
        from tether.run._snapshot import snapshot

        return snapshot(self._state)

    def succeed(self, result: Any = None) -> None:
        """The goal is reached: the result kept; proceed() is False from now on (see _not_done)."""
        s = self._state
        keep_result(s, result)
        if not _not_done(s) and s.stopped is not StopReason.GOAL_REACHED:
            reach_goal(s)

    def stop(self, reason: StopReason, detail: str = "") -> None:
        """End the run now for ``reason``; raises Stopped (swallowed by the with-block)."""
        raise self._state._halt(reason, detail)

    def fail(self, reason: str = "") -> None:
        """End the run as failed, for a reason the agent's code knows (raises Stopped,
        swallowed by the with-block); the outcome's status is "failed"."""
        raise self._state._halt(StopReason.FAILED, reason or "the agent's code gave up")

    def escalate(self, detail: str = "") -> None:
        """Hand the run to a person now; raises Stopped (swallowed by the with-block)."""
        escalate(self._state)
        raise self._state._halt(StopReason.ESCALATED, detail or "escalated by the agent's code")
