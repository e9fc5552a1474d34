"""The Agents SDK's run hooks under a tether run, and the runs nested inside one.

:class:`TetherHooks` puts every model call of an SDK run under the run's guards. The SDK
starts runs of its own inside a run (an agent used as a tool, ``Agent.as_tool``; a
guardrail that asks an agent; any ``Runner.run`` in a tool) without the outer run's hooks:
:class:`_NestedRunner`, installed once as the SDK's default runner, gives each of those the
hooks of the tether run it runs in, so that every paid request is counted and budgeted.
Outside a tether run it hands every call to the runner it replaced, unchanged.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

from tether import CircuitOpenError, ModelTurn, RequestUsage, Run, Stopped, StopReason
from tether._context import reset_if_here
from tether._errors import Picklable, require
from tether.guards._tokens import estimate_tokens
from tether.providers import openai_responses

require("agents", "openai-agents")

from agents import Agent, RunContextWrapper, RunHooks  # noqa: E402 - after the extra check
from agents.exceptions import AgentsException  # noqa: E402
from agents.items import ModelResponse  # noqa: E402
from agents.run import (  # noqa: E402
    AgentRunner,
    get_default_agent_runner,
    set_default_agent_runner,
)

__all__ = ["GuardStopped", "TetherHooks"]


class GuardStopped(Picklable, AgentsException):
    """A guard stopped the run before the next model call (raised from the hooks; the SDK
    attaches the run's items to it as ``run_data``)."""

    def __init__(self, reason: StopReason, detail: str = "") -> None:
        text = f" ({detail})" if detail else ""
        super().__init__(f"tether stopped the run: {reason.value}{text}")
        self.reason = reason
        self.detail = detail


def model_name(agent: Any, run_config: Any = None) -> str:
    """The model an agent calls: its name, a Model object's ``model`` (else its class name,
    so that its cost is unknown rather than zero), or the SDK's default."""
    for model in (getattr(run_config, "model", None), getattr(agent, "model", None)):
        if isinstance(model, str) and model:
            return model
        name = getattr(model, "model", None)
        if isinstance(name, str) and name:
            return name
        if model is not None:  # a Model with no name: priced only if the guard knows its class
            return type(model).__name__
    from agents.models import get_default_model

    return str(get_default_model())


class TetherHooks(RunHooks[Any]):
    """Run hooks that put every model call of an SDK run under ``run``'s guards.

    ``on_llm_start`` starts a step (raising :class:`GuardStopped` when a guard says no);
    ``on_llm_end`` counts the response's tokens and prices them. Runs the SDK starts
    inside this one (agents as tools, guardrail agents) get these hooks too. Subclass it to
    add your own hooks, calling ``super()`` in the two LLM methods.
    """

    def __init__(self, run: Run, *, model: str | None = None) -> None:
        if not isinstance(run, Run):
            raise TypeError(f"TetherHooks needs a tether Run (guard.start()), got {run!r}")
        self.run = run
        self.model = model
        self._in_flight: list[ModelTurn] = []  # the turns of requests sent, not answered yet
        # the provider breaker's permits of the attempts in flight (oldest first)
        self._permits: list[tuple[Any, str]] = []
        self._model = model or ""  # the model of the last request (its retries ask its breaker)
        #: what a nested run's starting agent becomes (tether's guarded copy, from run())
        self.nested: Callable[[Any], Any] = lambda agent: agent
        _install()

    async def on_llm_start(
        self,
        context: RunContextWrapper[Any],
        agent: Agent[Any],
        system_prompt: str | None,
        input_items: list[Any],
    ) -> None:
        run = self.run
        if run.stopped is None and run.proceed():
            # the SDK sends some requests at once (a guardrail's agent beside the agent's
            # first call): the ones in flight count against the model-call budget too
            limit = run.budget.max_model_calls
            if limit is None or run.model_calls + len(self._in_flight) < limit:
                turn = run.amodel_turn(
                    self.model or model_name(agent),
                    estimate=estimate_tokens(system_prompt, input_items),
                    max_output=agent.model_settings.max_tokens,
                )
                try:  # the guard's token budget may make the request wait for its place
                    self._in_flight.append(await turn.aopen())
                except Stopped:  # a wait past the run's time: stopped before the request
                    raise GuardStopped(run.stopped or StopReason.TIMEOUT, run.stop_detail) from None
                try:  # the provider's breaker: an open one waited out as outage_wait allows
                    await self.permit(turn.model)
                except CircuitOpenError as exc:  # the provider is down: CIRCUIT_OPEN, one incident
                    self._in_flight.remove(turn)
                    stopped = turn.fail(exc)
                    raise GuardStopped(stopped.reason, stopped.detail) from None
                return
            run.halt(StopReason.MAX_MODEL_CALLS, f"max model calls ({limit}) reached")
        assert run.stopped is not None
        raise GuardStopped(run.stopped, run.stop_detail)

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse
    ) -> None:
        turn = self.answered() or self.run.model_turn(self.model or model_name(agent))
        await self.settle(None)
        turn.record(openai_responses.usage(response) or RequestUsage())

    async def permit(self, model: str | None = None) -> None:
        """Ask the breaker of ``model``'s provider for the next attempt (the guard's retry
        policy's breaker, if it has one), waiting for its next probe as the run allows
        (``Guard(outage_wait=...)``); raises :class:`tether.CircuitOpenError` past that."""
        run = self.run
        model = self._model = self._model if model is None else model
        breaker = run.model_turn(model).breaker  # the guard's, one per provider

        async def acquire() -> None:
            self._permits.append((breaker, await breaker._aacquire()))

        await run.athrough_breaker(acquire)

    async def settle(self, verdict: Any) -> bool:
        """Tell the breaker how the oldest attempt in flight went (None: answered); True
        when that left the breaker open (the provider is down)."""
        if not self._permits:
            return False
        breaker, permit = self._permits.pop(0)
        await breaker._arecord(permit, verdict)
        return breaker._refusal() is not None

    def answered(self) -> ModelTurn | None:
        """A request of this run got its answer, or failed for good: no longer in flight;
        its turn (the oldest in flight; None: none is)."""
        return self._in_flight.pop(0) if self._in_flight else None


def active_hooks() -> TetherHooks | None:
    """The hooks of the tether run the current task runs in (None: no tether run)."""
    return _ACTIVE.get()


def request_failed() -> None:
    """The model request of the current task failed and will not be retried (the SDK's
    retry policy said so): it no longer counts as in flight."""
    hooks = _ACTIVE.get()
    if hooks is not None:
        hooks.answered()


class _Both(RunHooks[Any]):
    """A nested run's own hooks, then the tether run's."""

    def __init__(self, own: RunHooks[Any], tether: TetherHooks) -> None:
        self.own, self.tether = own, tether

    async def on_llm_start(self, *args: Any) -> None:
        await self.own.on_llm_start(*args)
        await self.tether.on_llm_start(*args)

    async def on_llm_end(self, *args: Any) -> None:
        await self.own.on_llm_end(*args)
        await self.tether.on_llm_end(*args)

    async def on_agent_start(self, *args: Any) -> None:
        await self.own.on_agent_start(*args)

    async def on_agent_end(self, *args: Any) -> None:
        await self.own.on_agent_end(*args)

    async def on_handoff(self, *args: Any) -> None:
        await self.own.on_handoff(*args)

    async def on_tool_start(self, *args: Any) -> None:
        await self.own.on_tool_start(*args)

    async def on_tool_end(self, *args: Any) -> None:
        await self.own.on_tool_end(*args)


#: the hooks of the tether run the current task runs in (None: no tether run)
_ACTIVE: contextvars.ContextVar[TetherHooks | None] = contextvars.ContextVar(
    "tether_agents_run", default=None
)


def _tether_hooks(hooks: Any) -> TetherHooks | None:
    if isinstance(hooks, TetherHooks):
        return hooks
    return hooks.tether if isinstance(hooks, _Both) else None


class _NestedRunner(AgentRunner):
    """The SDK's default runner, with the runs started inside a tether run under it."""

    def __init__(self, inner: AgentRunner) -> None:
        self.inner = inner

    def _arguments(self, agent: Any, kwargs: dict[str, Any]) -> tuple[Any, TetherHooks | None]:
        """The agent to start and the tether hooks the call runs under (set in ``kwargs``)."""
        hooks = kwargs.get("hooks")
        mine = _tether_hooks(hooks)
        if mine is not None:  # a tether run itself (run(), or a caller's own TetherHooks)
            return agent, mine
        active = _ACTIVE.get()
        if active is None:
            return agent, None
        kwargs["hooks"] = active if hooks is None else _Both(hooks, active)
        return active.nested(agent), active

    async def run(self, starting_agent: Any, input: Any, **kwargs: Any) -> Any:
        agent, hooks = self._arguments(starting_agent, kwargs)
        token = _ACTIVE.set(hooks)
        try:
            return await self.inner.run(agent, input, **kwargs)
        finally:
            reset_if_here(_ACTIVE, token)

    def run_streamed(self, starting_agent: Any, input: Any, **kwargs: Any) -> Any:
        agent, hooks = self._arguments(starting_agent, kwargs)
        token = _ACTIVE.set(hooks)  # the stream's task copies the context it starts in
        try:
            return self.inner.run_streamed(agent, input, **kwargs)
        finally:
            _ACTIVE.reset(token)


def _install() -> None:
    """Make the SDK's default runner a :class:`_NestedRunner` (once; it wraps the runner
    that was the default, so a runner of the caller's own keeps working)."""
    current = get_default_agent_runner()
    if not isinstance(current, _NestedRunner):
        set_default_agent_runner(_NestedRunner(current))
