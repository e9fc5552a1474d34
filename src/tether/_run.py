"""Guarded runs: budgets, loop detection and a graceful stop around an agent's loop.

A reliable agent checks every guard on every iteration, before spending the next
call; every way out of the loop returns a result, or a partial result and a reason.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from tether import telemetry
from tether._breaker import CircuitBreaker
from tether._canonical import canonical_json, intent_key
from tether._classify import classify
from tether._errors import CircuitOpenError, DeadlineExceeded, UnknownOutcome
from tether._handoff import CustomerMessages, Escalation, HandoffRecord, _Delivery
from tether._loops import LoopPolicy, LoopState
from tether._outcome import Outcome, Stopped, StopReason, ToolError, Usage
from tether._persist import Checkpoints, DeadLetters, redact
from tether._pricing import PriceTable
from tether._retry import RetryPolicy
from tether.clock import Clock, hung_threads, system_clock

if TYPE_CHECKING:
    from tether._effects import Ledger
    from tether.stores._base import Store

__all__ = ["Budget", "Guard", "Run"]

_log = logging.getLogger("tether")
UNAVAILABLE = "temporarily unavailable; try again later or continue without it"
_RECOVERY_WAITS = 3


@dataclass(frozen=True, slots=True)
class Budget:
    """Limits counted in code (a limit that exists only in the prompt is a request).

    Every limit is None (unlimited) by default except ``max_identical_failures``.
    ``progress_extension`` grants that many extra steps each time a step makes
    progress, never beyond ``max_steps_ceiling`` (seed 000's progress-based budget).
    """

    max_steps: int | None = None
    max_model_calls: int | None = None
    max_tool_calls: int | None = None
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    max_seconds: float | None = None
    max_identical_failures: int | None = 3
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    progress_extension: int = 0
    max_steps_ceiling: int | None = None
    max_hung_threads: int = 3

    def __post_init__(self) -> None:
        for name in ("max_steps", "max_model_calls", "max_tool_calls", "max_tokens",
                     "max_input_tokens", "max_output_tokens", "max_identical_failures",
                     "max_steps_ceiling"):  # fmt: skip
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}")
        for name in ("max_cost_usd", "max_seconds"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 or None, got {value!r}")
        if self.progress_extension < 0:
            raise ValueError(f"progress_extension must be >= 0, got {self.progress_extension!r}")
        if self.progress_extension and self.max_steps is None:
            raise ValueError("progress_extension needs max_steps")
        if (
            self.max_steps_ceiling is not None
            and self.max_steps is not None
            and self.max_steps_ceiling < self.max_steps
        ):
            raise ValueError(
                f"max_steps_ceiling must be >= max_steps ({self.max_steps}), got {self.max_steps_ceiling!r}"
            )
        if self.max_hung_threads < 1:
            raise ValueError(f"max_hung_threads must be >= 1, got {self.max_hung_threads!r}")


@dataclass(frozen=True, slots=True)
class _Call:
    """The checked context of one tool call."""

    name: str
    args: Any
    action: str
    step: int
    policy: RetryPolicy


class Guard:
    """The guards around an agent's loop; ``guard.start(task)`` opens one run.

    >>> guard = Guard(budget=Budget(max_steps=5))
    >>> with guard.start(task="find invoice 99") as run:
    ...     while run.proceed():
    ...         run.call_tool("search", lambda q: None, {"q": "invoice 99"})
    >>> run.outcome.status, run.outcome.stopped_because.name, len(run.outcome.partial)
    ('partial', 'REPEATED_ACTION', 2)
    """

    def __init__(
        self,
        budget: Budget | None = None,
        loops: LoopPolicy | None = None,
        clock: Clock | None = None,
        ledger: Ledger | None = None,
        checkpoints: Checkpoints | None = None,
        dead_letters: DeadLetters | None = None,
        *,
        retry: RetryPolicy | None = None,
        escalation: Escalation | None = None,
        prices: PriceTable | None = None,
        messages: CustomerMessages | None = None,
        store: Store | None = None,
        breaker_threshold: int | None = None,
        wait_for_recovery: bool = True,
        breaker_cooldown: float = 30.0,
        describe_effect: Callable[[str, Any, Any], str | None] | None = None,
        on_stop: Callable[[Outcome], object] | None = None,
        scope: str = "",
    ) -> None:
        self.budget = budget or Budget()
        self.loops = loops or LoopPolicy()
        self.clock: Clock = clock or system_clock
        self.ledger = ledger
        self.checkpoints = checkpoints
        self.dead_letters = dead_letters
        self.retry = (retry or RetryPolicy()).replace(clock=self.clock)
        self.escalation = escalation
        self.prices = prices or PriceTable()
        self.messages = messages or CustomerMessages()
        self.store = store
        # one unlucky call's retries alone never trip a tool's breaker
        self.breaker_threshold = breaker_threshold or max(5, 2 * self.retry.max_attempts)
        self.wait_for_recovery = wait_for_recovery
        self.breaker_cooldown = breaker_cooldown
        self.describe_effect = describe_effect or _describe
        self.on_stop = on_stop
        self.scope = scope
        self._breakers: dict[str, CircuitBreaker] = {}
        self._policies: dict[tuple[str, float | None], RetryPolicy] = {}

    def breaker(self, tool: str) -> CircuitBreaker:
        """The breaker that guards ``tool`` (one per tool name, shared by this guard's runs)."""
        breaker = self._breakers.get(tool)
        if breaker is None:
            breaker = CircuitBreaker(f"tool:{tool}", failure_threshold=self.breaker_threshold,
                                     cooldown=self.breaker_cooldown, store=self.store, clock=self.clock)  # fmt: skip
            self._breakers[tool] = breaker
        return breaker

    def _policy(self, tool: str, timeout: float | None) -> RetryPolicy:
        policy = self._policies.get((tool, timeout))
        if policy is None:
            policy = self.retry.replace(
                name=tool, breaker=self.breaker(tool),
                attempt_timeout=timeout if timeout is not None else self.retry.attempt_timeout,
            )  # fmt: skip
            self._policies[(tool, timeout)] = policy
        return policy

    def start(self, task: str = "", *, run_id: str | None = None) -> Run:
        """Open a run (use it as a context manager)."""
        return Run(self, task, run_id or f"run_{uuid.uuid4().hex[:16]}")

    def resume(self, checkpoint_id: str) -> Run:
        """A run that continues a checkpointed one, with the budget it had left."""
        if self.checkpoints is None:
            raise ValueError("this guard has no checkpoints store: pass checkpoints= to Guard")
        doc = self.checkpoints.load(checkpoint_id)
        run = Run(self, str(doc["task"]), str(doc.get("run_id") or checkpoint_id))
        try:
            usage = Usage(**doc["usage"])
        except TypeError as exc:
            from tether._persist import CheckpointError

            raise CheckpointError(
                f"checkpoint {checkpoint_id!r} is corrupt: bad usage ({exc})"
            ) from exc
        run._restore(usage, list(doc["partial"]), list(doc["transcript"]))
        return run


def _describe(tool: str, args: Any, result: Any) -> str | None:
    ref = result.get("id") if isinstance(result, Mapping) else getattr(result, "id", None)
    return f"{tool} completed" + (f" (reference {ref})" if ref else "")


class Run:
    """One guarded run of an agent; see :class:`Guard`."""

    def __init__(self, guard: Guard, task: str, run_id: str) -> None:
        self.guard = guard
        self.task = task
        self.run_id = run_id
        self.clock = guard.clock
        self.budget = guard.budget
        self._loops = LoopState(guard.loops)
        self._started = self.clock.now()
        self._elapsed_before = 0.0
        self._hung_base = hung_threads()
        self.steps = self.model_calls = self.tool_calls = self.retries = 0
        self.input_tokens = self.output_tokens = self.cache_write_tokens = (
            self.cache_read_tokens
        ) = 0
        self.cost_usd = 0.0
        self._last_costs: list[float] = []
        self._last_tokens = 0
        self._max_steps = self.budget.max_steps
        self.partial: list[dict[str, Any]] = []
        self.transcript: list[dict[str, Any]] = []
        self._effects: list[tuple[str, Any, str]] = []  # (tool, args, ledger key)
        self._failures: Counter[tuple[str, str, str]] = Counter()
        self._results: OrderedDict[str, None] = OrderedDict()
        self._no_progress = 0
        self._step_progress = False
        self._step_counted = False
        self._step_calls = 0
        self._stop: tuple[StopReason, str] | None = None
        self._escalate = False
        self._result: Any = None
        self._outcome: Outcome | None = None
        self._issues: list[str] = []
        self._span_cm: Any = None
        self._step_span: telemetry.StepSpan | None = None

    def __repr__(self) -> str:
        return (
            f"Run({self.run_id!r}, steps={self.steps}, stopped={self._stop and self._stop[0].name})"
        )

    # --- bookkeeping ------------------------------------------------------------------

    def _restore(
        self, usage: Usage, partial: list[dict[str, Any]], transcript: list[dict[str, Any]]
    ) -> None:
        self.steps, self.model_calls, self.tool_calls = (
            usage.steps,
            usage.model_calls,
            usage.tool_calls,
        )
        self.input_tokens, self.output_tokens = usage.input_tokens, usage.output_tokens
        self.cache_write_tokens, self.cache_read_tokens = (
            usage.cache_write_tokens,
            usage.cache_read_tokens,
        )
        self.cost_usd, self.retries, self._elapsed_before = (
            usage.cost_usd,
            usage.retries,
            usage.seconds,
        )
        self.partial, self.transcript = partial, transcript

    @property
    def elapsed(self) -> float:
        return self._elapsed_before + self.clock.now() - self._started

    @property
    def total_tokens(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_write_tokens
            + self.cache_read_tokens
        )

    @property
    def stopped(self) -> StopReason | None:
        return self._stop[0] if self._stop else None

    def usage(self) -> Usage:
        return Usage(self.steps, self.model_calls, self.tool_calls, self.input_tokens, self.output_tokens,
                     self.cache_write_tokens, self.cache_read_tokens, round(self.cost_usd, 10),
                     self.retries, self.elapsed)  # fmt: skip

    def _halt(self, reason: StopReason, detail: str = "") -> Stopped:
        """Record the first stop condition; later ones do not overwrite it."""
        if self._stop is None:
            self._stop = (reason, detail)
            _log.info(
                "run %s stops: %s%s", self.run_id, reason.value, f" ({detail})" if detail else ""
            )
            if reason in (StopReason.REPEATED_ACTION, StopReason.REPEATED_SEQUENCE,
                          StopReason.STATE_CYCLE, StopReason.NO_PROGRESS):  # fmt: skip
                telemetry.add_event("tether.loop_detected", **{"tether.stop_reason": reason.value})
            elif reason.name.startswith("MAX_") or reason is StopReason.TIMEOUT:
                telemetry.add_event(
                    "tether.budget_exhausted", **{"tether.stop_reason": reason.value}
                )
        reason, detail = self._stop
        return Stopped(reason, detail)

    # --- the loop ---------------------------------------------------------------------

    def proceed(self) -> bool:
        """Start the next step if every guard allows it; False once a stop condition holds."""
        if self._stop is not None:
            return False
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

    def record_model_call(
        self,
        *,
        input_tokens: int = 0,
        output_tokens: int = 0,
        model: str = "",
        cache_write_tokens: int = 0,
        cache_read_tokens: int = 0,
        cost_usd: float | None = None,
    ) -> float:
        """Count one model call's usage and cost; returns the cost in USD."""
        counts = {"input_tokens": input_tokens, "output_tokens": output_tokens,
                  "cache_write_tokens": cache_write_tokens, "cache_read_tokens": cache_read_tokens}  # fmt: skip
        for name, value in counts.items():
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        if cost_usd is None:
            if model:
                cost_usd = self.guard.prices.cost(model, input_tokens, output_tokens, cache_write_tokens,
                                                  cache_read_tokens)  # fmt: skip
            elif self.budget.max_cost_usd is not None and (input_tokens or output_tokens):
                raise ValueError(
                    "a cost budget is set: pass model= (priced from the table) or cost_usd="
                )
            else:
                cost_usd = 0.0
        self.model_calls += 1
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.cache_write_tokens += cache_write_tokens
        self.cache_read_tokens += cache_read_tokens
        self.cost_usd += cost_usd
        self._last_costs = [*self._last_costs[-1:], cost_usd]
        self._last_tokens = input_tokens + output_tokens + cache_write_tokens + cache_read_tokens
        telemetry.add_event("gen_ai.client.inference", **{"gen_ai.request.model": model or None,
                            "gen_ai.usage.input_tokens": input_tokens, "gen_ai.usage.output_tokens": output_tokens,
                            "tether.cost_usd": cost_usd})  # fmt: skip
        self.transcript.append({"step": self.steps, "model": model, "input_tokens": input_tokens,
                                "output_tokens": output_tokens, "cost_usd": cost_usd})  # fmt: skip
        return cost_usd

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

    def succeed(self, result: Any = None) -> None:
        """The goal is reached: record the result; proceed() returns False from now on."""
        self._result = result
        if self._stop is None or self._stop[0] is not StopReason.GOAL_REACHED:
            self._stop = None
            self._halt(StopReason.GOAL_REACHED)

    def stop(self, reason: StopReason, detail: str = "") -> None:
        """End the run now for ``reason``; raises Stopped (swallowed by the with-block)."""
        raise self._halt(reason, detail)

    def escalate(self, detail: str = "") -> None:
        """Hand the run to a person now; raises Stopped (swallowed by the with-block)."""
        self._escalate = True
        raise self._halt(StopReason.ESCALATED, detail or "escalated by the agent's code")

    # --- tool calls -------------------------------------------------------------------

    def _before_tool(self, name: str, args: Any, timeout: float | None) -> _Call:
        if self._stop is not None:
            raise self._halt(*self._stop)
        b = self.budget
        if b.max_tool_calls is not None and self.tool_calls >= b.max_tool_calls:
            raise self._halt(
                StopReason.MAX_TOOL_CALLS, f"max tool calls ({b.max_tool_calls}) reached"
            )
        policy = self.guard._policy(name, timeout)
        if b.max_seconds is not None and b.max_seconds - self.elapsed <= 0:
            raise self._halt(StopReason.TIMEOUT, f"time budget ({b.max_seconds:g} s) exceeded")
        hung = hung_threads() - self._hung_base
        if hung >= b.max_hung_threads:
            raise self._halt(
                StopReason.HUNG_TOOLS, f"{hung} tool calls are still hanging in threads"
            )
        action = intent_key(name, args)
        loop = self._loops.check_action(name, action, self.steps)
        if loop is not None:
            raise self._halt(loop[0], f"{loop[1]} (step {self.steps})")
        self.tool_calls += 1
        self._step_calls += 1
        if name not in self.guard.loops.allow_repeat:
            self._step_counted = True
        return _Call(name, args, action, self.steps, policy)

    def _effect(self, call: _Call, attempt: Callable[[], Any], idempotent: bool,
                lookup: Callable[[str], Any] | None) -> Callable[[], Any]:  # fmt: skip
        ledger = self.guard.ledger
        if idempotent or ledger is None:
            return attempt
        key = self._effect_key(call)
        return lambda: ledger.once(key, attempt, lookup=lookup)

    def _effect_key(self, call: _Call) -> str:
        """The ledger key of a non-idempotent call (its action hash, scoped if asked), noted
        so that the outcome can state what the ledger says was done."""
        scope = self.guard.scope
        key = intent_key(call.name, call.args, scope=scope) if scope else call.action
        self._effects.append((call.name, call.args, key))
        return key

    def _after_success(self, call: _Call, result: Any) -> Any:
        # only completed calls count as repeats: a call that failed is the business of
        # max_identical_failures, so a model retrying a dead dependency is not a "loop"
        self._loops.record_action(call.name, call.action)
        self.retries += call.policy.statistics.retries
        entry = {"step": call.step, "tool": call.name, "args": call.args, "result": result}
        self.partial.append(entry)
        self.transcript.append({"step": call.step, "tool": call.name, "ok": True})
        try:
            digest = canonical_json(result, ignore=())
        except (TypeError, ValueError):
            digest = repr(result)
        digest = hashlib.sha256(f"{call.name}\x00{digest}".encode()).hexdigest()
        if digest not in self._results:
            self._results[digest] = None
            if len(self._results) > self.guard.loops.state_window:
                self._results.popitem(last=False)
            self._step_progress = True
        self._check_retry_escalation()
        return result

    def _check_retry_escalation(self) -> None:
        esc = self.guard.escalation
        if esc is not None and esc.max_retries is not None and self.retries > esc.max_retries:
            self._escalate = True
            raise self._halt(StopReason.ESCALATED, f"retries passed {esc.max_retries}")

    def _after_failure(self, call: _Call, exc: Exception) -> BaseException:
        """The exception to raise for a failed tool call (Stopped or ToolError)."""
        self.retries += call.policy.statistics.retries
        self.transcript.append(
            {"step": call.step, "tool": call.name, "ok": False, "error": type(exc).__name__}
        )
        if isinstance(exc, Stopped):
            return exc
        if isinstance(exc, CircuitOpenError):
            return self._halt(
                StopReason.CIRCUIT_OPEN, f"{call.name}: its dependency is down (circuit open)"
            )
        if isinstance(exc, UnknownOutcome):
            self._issues.append(
                f"{call.name}: outcome unknown, check the provider's records ({exc.key[:16]}…)"
            )
            return self._halt(
                StopReason.UNKNOWN_OUTCOME, f"{call.name} may or may not have happened"
            )
        verdict = classify(exc)
        if isinstance(exc, DeadlineExceeded) and self.budget.max_seconds is not None:
            return self._halt(StopReason.TIMEOUT, f"time budget ran out during {call.name}")
        signature = (call.action, type(exc).__name__, f"{verdict.status}:{verdict.code}")
        self._failures[signature] += 1
        limit = self.budget.max_identical_failures
        if limit is not None and self._failures[signature] >= limit:
            self._park(call, exc)
            return self._halt(StopReason.IDENTICAL_FAILURES,
                              f"{call.name} failed {limit} times the same way ({type(exc).__name__})")  # fmt: skip
        try:
            self._check_retry_escalation()
        except Stopped as stopped:
            return stopped
        if verdict.retryable or isinstance(exc, DeadlineExceeded):
            return ToolError(call.name, UNAVAILABLE, cause_kind="unavailable")
        self._park(call, exc)
        text = redact(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return ToolError(call.name, f"failed: {str(text)[:200]}", cause_kind=verdict.kind.value)

    def _park(self, call: _Call, exc: BaseException) -> None:
        letters = self.guard.dead_letters
        if letters is None:
            return
        letter = letters.park(tool=call.name, args=call.args, error=exc, run_id=self.run_id,
                              task=self.task, at=self.clock.wall())  # fmt: skip
        self._issues.append(f"{call.name} failed permanently; dead letter {letter.id}")

    def call_tool(
        self,
        name: str,
        fn: Callable[..., Any],
        args: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        idempotent: bool = True,
        lookup: Callable[[str], Any] | None = None,
    ) -> Any:
        """Call a tool under every guard: loops and budgets, breaker, retries, ledger.

        ``fn(**args)`` is retried on transient failures with ``timeout`` per attempt;
        a non-idempotent tool runs at most once through the guard's ledger. Raises
        :class:`tether.Stopped` when a guard ends the run (the call is not made), or
        :class:`tether.ToolError` with a short text for the model when it fails.
        """
        args = dict(args or {})
        call = self._before_tool(name, args, timeout)
        run = self._effect(call, _attempt_span(name, lambda: fn(**args)), idempotent, lookup)
        with telemetry.span(
            "tether.tool_call", **{"gen_ai.tool.name": name, "tether.run_id": self.run_id}
        ):
            waited = 0
            while True:
                try:
                    result = call.policy.call_within(self._time_left(), run)
                    break
                except CircuitOpenError as exc:
                    self.clock.sleep(self._circuit_wait(call, exc, timeout, waited))
                    waited += 1
                except Exception as exc:
                    raise self._after_failure(call, exc) from exc
        return self._after_success(call, result)

    def _time_left(self) -> float | None:
        """The run's time budget left (the deadline of the next tool call), or None."""
        b = self.budget.max_seconds
        return None if b is None else max(1e-9, b - self.elapsed)

    def _circuit_wait(
        self, call: _Call, exc: CircuitOpenError, timeout: float | None, waited: int
    ) -> float:
        """How long to wait for an open breaker's next probe; raises the stop when the run
        may not wait (no time budget, not enough of it left, or waited often enough)."""
        left = self._time_left()
        wait = max(0.0, exc.retry_at - self.clock.wall()) + 0.05
        if (
            not self.guard.wait_for_recovery
            or left is None
            or waited >= _RECOVERY_WAITS
            or wait + (timeout or 0.0) >= left
        ):
            raise self._after_failure(call, exc) from exc
        return wait

    async def acall_tool(
        self,
        name: str,
        fn: Callable[..., Awaitable[Any]],
        args: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        idempotent: bool = True,
        lookup: Callable[[str], Any] | None = None,
    ) -> Any:
        """The async form of :meth:`call_tool`; a hanging attempt is cancelled."""
        args = dict(args or {})
        call = self._before_tool(name, args, timeout)
        ledger = self.guard.ledger
        if not idempotent and ledger is not None:
            key = self._effect_key(call)

            async def attempt() -> Any:
                # the ledger is sync: it claims in a thread, the coroutine runs on this loop
                async def coro() -> Any:
                    return await fn(**args)

                return await _aonce(ledger, key, coro, lookup)
        else:

            async def attempt() -> Any:
                return await fn(**args)

        with telemetry.span(
            "tether.tool_call", **{"gen_ai.tool.name": name, "tether.run_id": self.run_id}
        ):
            waited = 0
            while True:
                try:
                    result = await call.policy.acall_within(self._time_left(), attempt)
                    break
                except CircuitOpenError as exc:
                    await self.clock.asleep(self._circuit_wait(call, exc, timeout, waited))
                    waited += 1
                except Exception as exc:
                    raise self._after_failure(call, exc) from exc
        return self._after_success(call, result)

    # --- the end ----------------------------------------------------------------------

    def __enter__(self) -> Run:
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
            self._halt(reason, f"{type(exc).__name__}: {verdict.reason}")
        self.finish()
        if self._span_cm is not None:
            self._span_cm.__exit__(None, None, None)
        return swallow

    async def __aenter__(self) -> Run:
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
        """The run's outcome (the run is finished on first access)."""
        if self._outcome is None:
            self.finish()
        assert self._outcome is not None
        return self._outcome

    def facts(self) -> list[str]:
        """Effects of this run that the ledger records as done, in words."""
        ledger = self.guard.ledger
        out: list[str] = []
        for tool, args, key in self._effects:
            if ledger is None:
                break
            record = ledger.get(key)
            if record is not None and record.state.value == "done":
                text = self.guard.describe_effect(tool, args, ledger.result(key))
                if text and text not in out:
                    out.append(text)
        return out

    def finish(self) -> Outcome:
        """Close the run: status, reason, checkpoint, handoff, customer message."""
        if self._outcome is not None:
            return self._outcome
        if self._stop is None:
            self._halt(StopReason.NO_RESULT, "the loop ended without run.succeed()")
        assert self._stop is not None
        reason, detail = self._stop
        esc = self.guard.escalation
        # a handoff is made when the code asks for one, when a trigger fires, or, for any
        # run that did not reach its goal, when a sink is configured to receive it
        escalate = self._escalate or (
            esc is not None
            and reason is not StopReason.GOAL_REACHED
            and (reason in esc.on or esc.sink is not None)
        )
        if reason is StopReason.GOAL_REACHED:
            status = "success"
        elif escalate:
            status = "escalated"
        elif reason in (StopReason.PERMANENT_ERROR, StopReason.ERROR) or not self.partial:
            status = "failed"
        else:
            status = "partial"
        facts = self.facts()
        issues = list(self._issues)
        if status != "success":
            issues.insert(0, f"stopped: {reason.value}" + (f" ({detail})" if detail else ""))
        message = self.guard.messages.render(status, facts)
        usage = self.usage()
        checkpoint_id = None
        if self.guard.checkpoints is not None:
            doc = {"run_id": self.run_id, "task": self.task, "status": status, "reason": reason.value,
                   "detail": detail, "usage": _usage_doc(usage), "partial": _jsonable(self.partial),
                   "transcript": _jsonable(self.transcript), "open_issues": issues}  # fmt: skip
            try:
                checkpoint_id = self.guard.checkpoints.save(doc, self.clock.wall())
            except Exception as exc:  # a failing store never loses the outcome
                _log.error("tether: run %s: checkpoint failed: %s", self.run_id, exc)
                issues.append(f"checkpoint failed: {type(exc).__name__}")
        handoff = None
        if status == "escalated":
            handoff = HandoffRecord(f"ho_{uuid.uuid4().hex[:20]}", self.run_id, self.task, reason, detail,
                                    tuple(_jsonable(self.transcript)), tuple(facts), tuple(issues), message,
                                    self.clock.wall())  # fmt: skip
            delivery = _Delivery(esc.sink if esc is not None else None)
            delivery.deliver(handoff)
            issues.extend(delivery.errors)
        self._outcome = Outcome(status, reason, self._result, tuple(self.partial), detail, tuple(issues),
                                usage, checkpoint_id, message, self.run_id, handoff)  # fmt: skip
        telemetry.end_step(self._step_span)
        self._step_span = None
        telemetry.record_stop(
            reason.value, status, **{"tether.run_id": self.run_id, "tether.steps": usage.steps}
        )
        telemetry.notify("stop", self._outcome)
        if self.guard.on_stop is not None:
            try:
                self.guard.on_stop(self._outcome)
            except Exception:
                _log.exception("tether: on_stop hook raised; ignored")
        return self._outcome


def _attempt_span(name: str, fn: Callable[[], Any]) -> Callable[[], Any]:
    """Each attempt of a tool call as a ``tether.attempt`` span (only when telemetry is on)."""
    if not telemetry.enabled():
        return fn
    attempts = [0]

    def attempt() -> Any:
        attempts[0] += 1
        telemetry.record_attempt(name, attempts[0])
        with telemetry.span(
            "tether.attempt", **{"gen_ai.tool.name": name, "tether.attempt": attempts[0]}
        ):
            return fn()

    return attempt


async def _aonce(ledger: Ledger, key: str, fn: Callable[[], Coroutine[Any, Any, Any]],
                 lookup: Callable[[str], Any] | None) -> Any:  # fmt: skip
    """Ledger.once for a coroutine function: claim, await, record (same rules as once)."""
    import asyncio

    loop = asyncio.get_running_loop()

    def run_sync() -> Any:
        return asyncio.run_coroutine_threadsafe(fn(), loop).result()

    return await asyncio.to_thread(ledger.once, key, run_sync, lookup=lookup)


def _usage_doc(usage: Usage) -> dict[str, Any]:
    return {name: getattr(usage, name) for name in Usage.__slots__}


def _jsonable(value: Any) -> Any:
    import json

    try:
        return json.loads(canonical_json(value, ignore=()))
    except (TypeError, ValueError):
        return json.loads(json.dumps(value, default=repr))
