"""Guarded runs: budgets, loop detection and a graceful stop around an agent's loop.

A reliable agent checks every guard on every iteration, before spending the next
call; every way out of the loop returns a result, or a partial result and a reason.
The run's parts live in modules of their own: its state (``_runstate``), the tool-call
pipeline (``_toolcall`` over ``_tooldecisions``, ``_toolgate``, ``_hung``), its model
calls (``_modelcalls``), its compensations (``_rollback``) and its ending
(``_ending``); this module is its lifecycle.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from tether import telemetry
from tether.classification._classify import classify
from tether.effects._canonical import canonical_json
from tether.run._ending import Ending
from tether.run._modelcalls import ModelCalls
from tether.run._outcome import Outcome, Status, Stopped, StopReason
from tether.run._rollback import Compensations, Rollback
from tether.run._runstate import RunState
from tether.run._settings import RunSettings
from tether.run._toolcall import ToolPipeline

if TYPE_CHECKING:
    from tether.retries._policy import RetryPolicy

T = TypeVar("T")

__all__ = ["Run"]

_log = logging.getLogger("tether")


class Run(RunState):
    """One guarded run of an agent; see :class:`tether.Guard`.

    The run owns its parts: the tool-call pipeline, the model calls, the ending (status,
    facts, outcome, record) and the compensations; each gets the run's state, and only the
    run decides their order (roll back, then conclude).
    """

    def __init__(
        self,
        guard: RunSettings,
        task: str,
        run_id: str,
        *,
        key: str | None = None,
        request: str | None = None,
    ) -> None:
        super().__init__(guard, task, run_id, key=key, request=request)
        self._ending = Ending(self)
        self._undo = Rollback(self)
        self._tools = ToolPipeline(self)
        self._models = ModelCalls(self)

    # --- the with-block and the ending ------------------------------------------------

    def __enter__(self) -> Self:
        self._span_cm = telemetry.span(
            "tether.run", **{"tether.run_id": self.run_id, "tether.task": self.task[:200]}
        )
        self._span_cm.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        swallow = False
        if isinstance(exc, Stopped):
            swallow = True
        elif isinstance(exc, Exception):
            verdict = classify(exc)
            reason = StopReason.PERMANENT_ERROR if not verdict.retryable else StopReason.ERROR
            self.note_error(exc)
            self._halt(reason, f"{type(exc).__name__}: {verdict.reason}")
        self.finish()
        if self._span_cm is not None:
            self._span_cm.__exit__(None, None, None)
        return swallow

    async def __aenter__(self) -> Self:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return self.__exit__(exc_type, exc, tb)

    @property
    def outcome(self) -> Outcome:
        """The run's outcome, once it has ended (a stop condition holds, or its with-block
        closed); the run is finished on first access. Raises RuntimeError while it runs."""
        if self._outcome is None and self._stop is None:
            raise RuntimeError(
                f"run {self.run_id} has not ended: read run.outcome after its with-block, or "
                "end it first (run.succeed(), run.fail(), run.stop(), run.escalate())"
            )
        return self._outcome if self._outcome is not None else self.finish()

    def facts(self) -> list[str]:
        """Effects of this run that the ledger records as done (and no rollback undid), in
        words. Raises what the ledger's store raises when it cannot be read; :meth:`finish`
        turns that into an open issue."""
        return self._ending.facts()

    def finish(self) -> Outcome:
        """Close the run: status, reason, checkpoint, handoff, customer message; first
        what the guard says to undo for this ending (``Guard(rollback_on=...)``)."""
        if self._outcome is not None:
            return self._outcome
        if self._stop is None:
            self._halt(StopReason.NO_RESULT, "the loop ended without run.succeed()")
        assert self._stop is not None
        reason = self._stop[0]
        status = self._ending._status(reason)
        rollback_on = self.guard.rollback_on
        if (reason in rollback_on or status in rollback_on) and any(
            e.state == "done" for e in self._journal
        ):
            self.rollback()  # it may escalate: the status is read again
            status = self._ending._status(reason)
        return self._ending._conclude(status, amend=False)

    def _ended_as(self, record: Mapping[str, Any]) -> None:
        self._ending._ended_as(record)

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
        self._compensated.extend(done)
        if self._escalate and self._stop is None:
            self._halt(StopReason.ESCALATED, "a compensation could not be made")
        if self._stop is None and not self._began and self._resumed_stop is not None:
            self._halt(*self._resumed_stop)
            self.finish()
        elif self._outcome is not None and (done or self._escalate):
            status = Status.ESCALATED if self._escalate else self._outcome.status
            self._ending._conclude(status, amend=True)
        return tuple(done)

    def __repr__(self) -> str:
        return (
            f"Run({self.run_id!r}, steps={self.steps}, stopped={self._stop and self._stop[0].name})"
        )

    # --- model calls -----------------------------------------------------------------

    def begin_model_call(
        self,
        *,
        model: str = "",
        provider: str | None = None,
        estimated_input_tokens: int | None = None,
        max_output_tokens: int | None = None,
    ) -> float | None:
        """Check the run before a paid model request; returns the time it has left (the
        request's deadline, None: no time budget).

        Raises :class:`tether.Stopped` (the run's own stop) when the run has stopped, and
        :class:`tether.UnknownModelError` for a model whose cost a cost budget could not
        count (:meth:`check_model`). ``estimated_input_tokens`` and ``max_output_tokens``
        describe the request for the guard's token budgets (``Guard(token_budget=...)``):
        given an estimate, the call waits for its place in the budget of its model, and a
        wait longer than the run's time left stops the run ``TIMEOUT`` before the request
        (:mod:`tether.run._tokens`); :meth:`record_model_call` gives back what it did not use.
        """
        return self._models.begin_model_call(
            model=model,
            provider=provider,
            estimated_input_tokens=estimated_input_tokens,
            max_output_tokens=max_output_tokens,
        )

    async def abegin_model_call(
        self,
        *,
        model: str = "",
        provider: str | None = None,
        estimated_input_tokens: int | None = None,
        max_output_tokens: int | None = None,
    ) -> float | None:
        """The async form of :meth:`begin_model_call`: a wait for the token budget sleeps
        on the event loop."""
        return await self._models.abegin_model_call(
            model=model,
            provider=provider,
            estimated_input_tokens=estimated_input_tokens,
            max_output_tokens=max_output_tokens,
        )

    def check_model(self, model: str, provider: str | None = None) -> None:
        """Refuse, before the request, a model whose cost a cost budget could not count."""
        return self._models.check_model(model, provider)

    def model_call_failed(self, exc: BaseException) -> Stopped:
        """Stop the run for a model call that failed after its retries, with the reason its
        failure says (``TIMEOUT`` for the time budget, ``CIRCUIT_OPEN`` for a provider that
        is down, ``ERROR`` or ``PERMANENT_ERROR`` by classification); returns the Stopped
        to raise (an agent loop raises it, a framework's hook may just end the agent)."""
        return self._models.model_call_failed(exc)

    def retry_model_call(self, policy: RetryPolicy, fn: Callable[[], T]) -> T:
        """``fn()`` under ``policy``, never past the run's time left; its retries are
        counted into the run's usage. A failure after the retries is raised (see
        :meth:`model_call_failed`)."""
        return self._models.retry_model_call(policy, fn)

    async def aretry_model_call(self, policy: RetryPolicy, fn: Callable[[], Awaitable[T]]) -> T:
        """The async form of :meth:`retry_model_call`."""
        return await self._models.aretry_model_call(policy, fn)

    def record_model_call(
        self,
        *,
        input_tokens: int = 0,
        output_tokens: int = 0,
        model: str = "",
        cache_write_tokens: int = 0,
        cache_read_tokens: int = 0,
        cost_usd: float | None = None,
        provider: str | None = None,
        unmeasured: bool = False,
    ) -> float | None:
        """Count one model call's usage and cost; returns the cost in USD (None: unknown).

        The cost comes from ``cost_usd`` or the guard's prices for ``model``; a model
        with no price has its tokens counted and its cost unknown
        (``Usage.unpriced_calls``). Under a cost budget that raises
        :class:`tether.UnknownModelError` (call :meth:`check_model` before the request
        to refuse it before paying). ``unmeasured=True`` says the provider reported no
        token counts for the call: its cost is unknown too, never zero.
        """
        return self._models.record_model_call(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            model=model,
            cache_write_tokens=cache_write_tokens,
            cache_read_tokens=cache_read_tokens,
            cost_usd=cost_usd,
            provider=provider,
            unmeasured=unmeasured,
        )

    # --- tools -----------------------------------------------------------------------

    def call_tool(
        self,
        name: str,
        fn: Callable[..., Any],
        args: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        idempotent: bool = True,
        lookup: Callable[[str], Any] | None = None,
        requires_approval: bool | Callable[[Mapping[str, Any]], bool] = False,
        compensate: Callable[[Any], Any] | None = None,
        volatile: Iterable[str] = (),
        label: str | None = None,
        allow_repeat: int | None = None,
        passthrough: tuple[type[BaseException], ...] = (),
    ) -> Any:
        """Call a tool under every guard: policies, approval, loops and budgets, breaker,
        retries, ledger.

        ``fn(**args)`` is retried on transient failures with ``timeout`` per attempt;
        a non-idempotent tool runs at most once through the guard's ledger (an attempt
        that outlives ``timeout`` is never run again: the run stops ``UNKNOWN_OUTCOME``).
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
        return self._tools.call(
            name,
            fn,
            args,
            timeout=timeout,
            idempotent=idempotent,
            lookup=lookup,
            requires_approval=requires_approval,
            compensate=compensate,
            volatile=volatile,
            label=label,
            allow_repeat=allow_repeat,
            passthrough=passthrough,
        )

    async def acall_tool(
        self,
        name: str,
        fn: Callable[..., Awaitable[Any]] | Callable[..., Any],
        args: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        idempotent: bool = True,
        lookup: Callable[[str], Any] | None = None,
        requires_approval: bool | Callable[[Mapping[str, Any]], bool] = False,
        compensate: Callable[[Any], Any] | None = None,
        volatile: Iterable[str] = (),
        label: str | None = None,
        allow_repeat: int | None = None,
        passthrough: tuple[type[BaseException], ...] = (),
    ) -> Any:
        """The async form of :meth:`call_tool`; a hanging attempt is cancelled.

        ``fn`` may be a coroutine function (awaited) or a plain function (run in a
        worker thread, so that it does not block the event loop).
        """
        return await self._tools.acall(
            name,
            fn,
            args,
            timeout=timeout,
            idempotent=idempotent,
            lookup=lookup,
            requires_approval=requires_approval,
            compensate=compensate,
            volatile=volatile,
            label=label,
            allow_repeat=allow_repeat,
            passthrough=passthrough,
        )

    # --- the loop ---------------------------------------------------------------------

    def proceed(self) -> bool:
        """Start the next step if every guard allows it; False once a stop condition holds."""
        if self._stop is not None:
            return False
        self._began = True
        if self.steps and not self._end_step():
            return False
        reason = self._budget_stop()
        if reason is not None:
            self._halt(*reason)
            return False
        self.steps += 1
        self._step_progress = False
        self._step_counted = False
        self._step_calls = 0
        telemetry.end_step(self._step_span)
        self._step_span = telemetry.start_step(
            **{"tether.run_id": self.run_id, "tether.step": self.steps}
        )
        return True

    def _end_step(self) -> bool:
        """Account the step that just ended for the no-progress detector."""
        if self._step_progress:
            self._no_progress = 0
            if self.budget.progress_extension and self._max_steps is not None:
                ceiling = self.budget.max_steps_ceiling
                extended = self._max_steps + self.budget.progress_extension
                self._max_steps = extended if ceiling is None else min(extended, ceiling)
        elif self._step_counted or not self._step_exempt():
            self._no_progress += 1
        limit = self.guard.loops.max_no_progress
        if (
            limit is not None
            and self._no_progress >= limit
            and self.steps >= self.guard.loops.min_steps
        ):
            self._halt(
                StopReason.NO_PROGRESS, f"{self._no_progress} steps in a row added nothing new"
            )
            return False
        return True

    def _step_exempt(self) -> bool:
        """A step whose only tool calls were allowed repeats (polling) is not judged."""
        return self._step_calls > 0 and not self._step_counted

    def _budget_stop(self) -> tuple[StopReason, str] | None:
        b = self.budget
        if self._max_steps is not None and self.steps >= self._max_steps:
            return StopReason.MAX_STEPS, f"max steps ({self._max_steps}) reached"
        if b.max_seconds is not None and self.elapsed >= b.max_seconds:
            return (
                StopReason.TIMEOUT,
                f"time budget ({b.max_seconds:g} s) exceeded at step {self.steps}",
            )
        if b.max_model_calls is not None and self.model_calls >= b.max_model_calls:
            return StopReason.MAX_MODEL_CALLS, f"max model calls ({b.max_model_calls}) reached"
        if b.max_tokens is not None and self.total_tokens + self._last_tokens > b.max_tokens:
            return StopReason.MAX_TOKENS, (
                f"{self.total_tokens} tokens used; the next model call (about {self._last_tokens}) "
                f"would pass the budget of {b.max_tokens}"
            )
        for name, used in (
            ("max_input_tokens", self.input_tokens),
            ("max_output_tokens", self.output_tokens),
        ):
            limit = getattr(b, name)
            if limit is not None and used >= limit:
                return StopReason.MAX_TOKENS, f"{name} ({limit}) reached"
        if b.max_cost_usd is not None:
            nxt = self._next_cost()
            if self.cost_usd + nxt > b.max_cost_usd:
                return StopReason.MAX_COST, (
                    f"${self.cost_usd:.4f} spent; the next model call (about ${nxt:.4f}) would pass "
                    f"the budget of ${b.max_cost_usd:.4f}"
                )
        esc = self.guard.escalation
        if esc is not None and esc.max_steps is not None and self.steps >= esc.max_steps:
            self._escalate = True
            return StopReason.ESCALATED, f"step count passed {esc.max_steps}"
        return None

    def _next_cost(self) -> float:
        """The next model call's cost, extrapolated from the last two (costs tend to grow)."""
        if not self._last_costs:
            return 0.0
        last = self._last_costs[-1]
        prev = self._last_costs[-2] if len(self._last_costs) > 1 else last
        return max(last, last + (last - prev))

    def progress(self, note: str = "") -> None:
        """Say that this step made progress (a new fact, a finished sub-goal)."""
        self._step_progress = True
        if note:
            self.transcript.append({"step": self.steps, "progress": note})

    def observe_state(self, state: Any) -> None:
        """Record the agent's state; raises Stopped (STATE_CYCLE) when it repeats."""
        digest = hashlib.sha256(
            canonical_json(state, ignore=(), path="state").encode("ascii")
        ).hexdigest()
        if self._loops.observe_state(digest, self.steps):
            raise self._halt(
                StopReason.STATE_CYCLE, f"state at step {self.steps} repeats an earlier one"
            )
        self._step_progress = True  # a state never seen before is a new fact

    def snapshot(self) -> dict[str, Any]:
        """The run as plain data (JSON-able), for a framework that keeps it in its own state
        (LangGraph's checkpoint); ``guard.restore(doc)`` continues it, in any process."""
        from tether.run._snapshot import snapshot

        return snapshot(self)

    def succeed(self, result: Any = None) -> None:
        """The goal is reached: record the result; proceed() returns False from now on."""
        self._result = result
        if self._stop is None or self._stop[0] is not StopReason.GOAL_REACHED:
            self._stop = None
            self._halt(StopReason.GOAL_REACHED)

    def stop(self, reason: StopReason, detail: str = "") -> None:
        """End the run now for ``reason``; raises Stopped (swallowed by the with-block)."""
        raise self._halt(reason, detail)

    def fail(self, reason: str = "") -> None:
        """End the run as failed, for a reason the agent's code knows (raises Stopped,
        swallowed by the with-block); the outcome's status is "failed"."""
        raise self._halt(StopReason.FAILED, reason or "the agent's code gave up")

    def escalate(self, detail: str = "") -> None:
        """Hand the run to a person now; raises Stopped (swallowed by the with-block)."""
        self._escalate = True
        raise self._halt(StopReason.ESCALATED, detail or "escalated by the agent's code")
