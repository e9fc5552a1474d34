"""The OpenAI Agents SDK under tether: ``await run(agent, input, guard=guard)``.

One tether run per agent run. Every model call is one step: checked before it is sent
(budgets, loops, the cost of the next call, a model a cost budget could not price) in
:class:`TetherHooks`' ``on_llm_start``, and counted with the response's usage in
``on_llm_end``. A guard's stop raises :class:`GuardStopped` from that hook, so the SDK ends
the run without another paid request and attaches the items produced so far; :func:`run`
turns that into a :class:`tether.Outcome`. Every function tool goes through
``run.acall_tool`` (:func:`guard_tools`): loop checks, the tool's timeout, its breaker,
retries at one layer, the ledger for the tools named in ``side_effects``. Model calls are
retried by the SDK's runner under ``ModelSettings(retry=...)`` with tether's
classification, backoff and ``Retry-After``, within the run's time budget.

``max_turns`` ends the run as ``StopReason.MAX_STEPS`` (never a ``MaxTurnsExceeded`` for
the caller); without an explicit ``max_turns`` the guard's step budget sets it.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tether._errors import require
from tether.integrations._common import (
    ModelRetries,
    ToolRules,
    blocking,
    malformed_arguments,
    require_a_place_to_wait,
)
from tether.retries._policy import RetryPolicy
from tether.run._guard import Guard
from tether.run._outcome import Outcome, Stopped, StopReason, ToolError
from tether.run._pricing import UnknownModelError
from tether.run._run import Run

require("agents", "openai-agents")

from agents import (  # noqa: E402 - after the extra check
    Agent,
    FunctionTool,
    ModelSettings,
    RunConfig,
    RunContextWrapper,
    RunHooks,
    Runner,
)
from agents.exceptions import (  # noqa: E402
    AgentsException,
    InputGuardrailTripwireTriggered,
    MaxTurnsExceeded,
    OutputGuardrailTripwireTriggered,
    UserError,
)
from agents.items import ItemHelpers, ModelResponse  # noqa: E402
from agents.retry import ModelRetrySettings, RetryDecision, RetryPolicyContext  # noqa: E402
from agents.run import DEFAULT_MAX_TURNS  # noqa: E402 - the SDK's own, when nothing sets one

__all__ = ["GuardStopped", "TetherHooks", "guard_tools", "model_retry", "run", "run_sync"]

_log = logging.getLogger("tether")


class GuardStopped(AgentsException):
    """A guard stopped the run before the next model call (raised from the hooks; the SDK
    attaches the run's items to it as ``run_data``)."""

    def __init__(self, reason: StopReason, detail: str = "") -> None:
        text = f" ({detail})" if detail else ""
        super().__init__(f"tether stopped the run: {reason.value}{text}")
        self.reason = reason
        self.detail = detail


def _model_name(agent: Any, run_config: Any = None) -> str:
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
    ``on_llm_end`` counts the response's tokens and prices them. Subclass it to add your
    own hooks, calling ``super()`` in the two LLM methods.
    """

    def __init__(self, run: Run, *, model: str | None = None) -> None:
        if not isinstance(run, Run):
            raise TypeError(f"TetherHooks needs a tether Run (guard.start()), got {run!r}")
        self.run = run
        self.model = model

    async def on_llm_start(
        self, context: RunContextWrapper[Any], agent: Agent[Any], system_prompt: str | None,
        input_items: list[Any],
    ) -> None:  # fmt: skip
        run = self.run
        if run.stopped is None and run.proceed():
            run.check_model(self.model or _model_name(agent))
            return
        assert run.stopped is not None
        raise GuardStopped(run.stopped, run.stop_detail)

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse
    ) -> None:
        usage = response.usage
        cached = int(getattr(usage.input_tokens_details, "cached_tokens", 0) or 0)
        self.run.record_model_call(
            model=self.model or _model_name(agent),
            input_tokens=max(0, int(usage.input_tokens) - cached),
            output_tokens=int(usage.output_tokens),
            cache_read_tokens=cached,
        )


class _ModelRetries(ModelRetries):
    """The SDK runner's model-retry policy, decided by tether."""

    def __deepcopy__(self, memo: dict[int, Any]) -> _ModelRetries:
        return self  # the SDK copies model settings; the run they count into is one

    def __call__(self, context: RetryPolicyContext) -> RetryDecision:
        verdict = self.policy.classifier(context.error)
        delay = self.wait(verdict, context.attempt)
        if delay is None:
            return RetryDecision(retry=False, reason=verdict.reason)
        return RetryDecision(retry=True, delay=delay, reason=verdict.reason)


def model_retry(policy: RetryPolicy | None = None, run: Run | None = None) -> ModelRetrySettings:
    """``ModelSettings(retry=...)`` that retries model calls the way tether does.

    Build the SDK's OpenAI client with ``max_retries=0`` as well, so that retries happen
    at this one layer.
    """
    policy = policy or RetryPolicy(name="model")
    return ModelRetrySettings(
        max_retries=policy.max_attempts - 1, policy=_ModelRetries(policy, run)
    )


def guard_tools(
    tools: Iterable[Any],
    run: Run,
    side_effects: Mapping[str, Callable[[str], Any] | None]
    | Iterable[str]
    | ToolRules
    | None = None,
    *,
    timeouts: Mapping[str, float] | None = None,
    requires_approval: Mapping[str, Any] | None = None,
    compensate: Mapping[str, Callable[[Any], Any]] | None = None,
    labels: Mapping[str, str] | None = None,
) -> list[Any]:
    """Copies of ``tools`` whose calls go through ``run`` (the originals are untouched).

    Function tools are guarded; hosted tools (web search, file search...) pass unchanged.
    ``side_effects`` names the non-idempotent tools (a mapping of name to ``lookup``, or
    names): they run at most once per intent through the guard's ledger. A tool's own
    ``timeout_seconds`` becomes tether's timeout for it (unless ``timeouts`` names one),
    so that one clock decides when an attempt is abandoned. ``requires_approval`` and
    ``compensate`` (by tool name) are the governance options of ``run.call_tool``;
    ``labels`` what the customer reads for each tool's effect (``{"issue_refund": "refund"}``).
    """
    if not isinstance(run, Run):
        raise TypeError(f"guard_tools needs a tether Run (guard.start()), got {run!r}")
    rules = side_effects if isinstance(side_effects, ToolRules) else ToolRules(
        side_effects, timeouts, requires_approval, compensate, labels=labels)  # fmt: skip
    require_a_place_to_wait(run.guard, rules.needing_approval())
    return [_guarded(tool, run, rules) for tool in tools]


def _guarded(tool: Any, run: Run, rules: ToolRules) -> Any:
    if not isinstance(tool, FunctionTool):
        return tool
    name = tool.name
    # the tool body without the SDK's failure formatter: tether must see the exception
    # (a timeout after a refund was sent is not a tool result to record)
    body = getattr(tool.on_invoke_tool, "_invoke_tool_impl", tool.on_invoke_tool)
    options = rules.options(name, tool.timeout_seconds)

    async def invoke(ctx: Any, raw: str) -> Any:
        try:
            args = json.loads(raw) if raw else {}
        except ValueError:
            args = None
        try:
            if not isinstance(args, dict):
                return await run.acall_tool(
                    name, lambda **_: malformed_arguments(raw), {"arguments": raw}
                )

            async def call(**_: Any) -> Any:
                return await body(ctx, raw)

            return await run.acall_tool(name, call, args, **options)
        except ToolError as exc:
            return exc.model_message
        except Stopped as exc:  # the next model call raises GuardStopped
            return f"stopped: {exc.reason.value}"

    guarded = copy.copy(tool)
    guarded.on_invoke_tool = invoke
    guarded.timeout_seconds = None
    return guarded


_warned: set[int] = set()


def _warn_client_retries(model: Any) -> None:
    """The SDK keeps an OpenAI client's own retries on a model call's first attempt: say
    once per client that it should be built with ``max_retries=0``."""
    client = getattr(model, "_client", None)
    retries = getattr(client, "max_retries", 0)
    if isinstance(retries, int) and retries > 0 and id(client) not in _warned:
        _warned.add(id(client))
        _log.warning("tether: the OpenAI client retries on its own (max_retries=%d); build it "
                     "with max_retries=0 so that retries happen at one layer", retries)  # fmt: skip


def _guard_agent(agent: Agent[Any], run: Run, rules: ToolRules, policy: RetryPolicy,
                 seen: dict[int, Agent[Any]]) -> Agent[Any]:  # fmt: skip
    """A clone of ``agent`` (and of the agents it hands off to) with guarded tools and
    tether's model retries."""
    if id(agent) in seen:
        return seen[id(agent)]
    settings = agent.model_settings
    if settings.retry is not None:
        _log.warning("tether: agent %r has its own ModelSettings.retry; tether's replaces it "
                     "so that retries happen at one layer", agent.name)  # fmt: skip
    _warn_client_retries(agent.model)
    clone = agent.clone(
        tools=guard_tools(agent.tools, run, rules),
        model_settings=settings.resolve(ModelSettings(retry=model_retry(policy, run))),
    )
    seen[id(agent)] = clone
    clone.handoffs = [
        _guard_agent(h, run, rules, policy, seen) if isinstance(h, Agent) else h
        for h in agent.handoffs
    ]
    return clone


def _items(input: Any, new_items: Iterable[Any]) -> list[Any]:
    """The conversation as the SDK's input list (what ``RunResult.to_input_list()`` gives)."""
    return [*ItemHelpers.input_to_new_input_list(input), *(i.to_input_item() for i in new_items)]


def _task(input: Any) -> str:
    if isinstance(input, str):
        return input[:200]
    for item in input or ():
        if isinstance(item, Mapping) and item.get("role") == "user":
            content = item.get("content")
            return (content if isinstance(content, str) else json.dumps(content, default=str))[:200]
    return ""


def _max_turns(guard: Guard, max_turns: int | None) -> int:
    """The caller's max_turns, or one past the guard's step budget (tether stops first)."""
    if max_turns is not None:
        return max_turns
    budget = guard.budget
    steps = budget.max_steps_ceiling or budget.max_steps or budget.max_model_calls
    return steps + 1 if steps is not None else DEFAULT_MAX_TURNS


async def run(
    agent: Agent[Any],
    input: str | list[Any],
    *,
    guard: Guard,
    side_effects: Mapping[str, Callable[[str], Any] | None] | Iterable[str] | None = None,
    timeouts: Mapping[str, float] | None = None,
    requires_approval: Mapping[str, Any] | None = None,
    compensate: Mapping[str, Callable[[Any], Any]] | None = None,
    resume: str | None = None,
    key: str | None = None,
    labels: Mapping[str, str] | None = None,
    context: Any = None,
    max_turns: int | None = None,
    run_config: RunConfig | None = None,
    **runner_options: Any,
) -> Outcome:
    """Run ``agent`` on ``input`` under ``guard``; the :class:`tether.Outcome`.

    ``outcome.result`` is the agent's ``final_output`` when it finished, and
    ``outcome.messages`` the conversation as the SDK's input items (the partial one when
    a guard stopped the run). ``requires_approval`` and ``compensate`` (by tool name) are
    the governance options of ``run.call_tool``; ``resume=outcome.checkpoint_id`` continues
    a run that stopped (for an approval: pass ``outcome.messages`` as ``input``); ``key``
    names the request the run serves (``guard.start(task, key=...)``). Other keyword
    arguments go to ``Runner.run``.
    """
    if not isinstance(guard, Guard):
        raise TypeError(f"guard must be a tether.Guard, got {guard!r}")
    if not isinstance(agent, Agent):
        raise TypeError(f"agent must be an agents.Agent, got {agent!r}")
    if "hooks" in runner_options:
        raise TypeError("run() owns the run hooks: subclass TetherHooks and call Runner.run "
                        "yourself (see guard_tools) to add your own")  # fmt: skip
    turns = _max_turns(guard, max_turns)
    rules = ToolRules(side_effects, timeouts, requires_approval, compensate, labels=labels)
    require_a_place_to_wait(guard, rules.needing_approval())
    with guard.resume(resume) if resume else guard.start(task=_task(input), key=key) as tether_run:
        policy = guard.retry.replace(name="model", clock=tether_run.clock)
        guarded = _guard_agent(agent, tether_run, rules, policy, {})
        hooks = TetherHooks(tether_run, model=_model_name(agent, run_config) or None)
        try:
            result = await Runner.run(guarded, input, context=context, max_turns=turns,
                                      hooks=hooks, run_config=run_config, **runner_options)  # fmt: skip
        except GuardStopped as exc:
            _keep_items(tether_run, input, exc)
            raise Stopped(exc.reason, exc.detail) from None
        except MaxTurnsExceeded as exc:
            _keep_items(tether_run, input, exc)
            raise tether_run.halt(
                StopReason.MAX_STEPS, f"the agent used its max_turns ({turns}) without an answer"
            ) from None
        except (InputGuardrailTripwireTriggered, OutputGuardrailTripwireTriggered) as exc:
            _keep_items(tether_run, input, exc)
            name = type(exc.guardrail_result.guardrail).__name__
            guardrail = getattr(exc.guardrail_result.guardrail, "get_name", lambda: name)()
            raise tether_run.halt(StopReason.REFUSED, f"guardrail {guardrail} tripped") from None
        except (UserError, UnknownModelError, Stopped):
            raise  # the caller's configuration: fix it, nothing to retry
        except Exception as exc:  # the model failed after its retries, or misbehaved
            _keep_items(tether_run, input, exc)
            raise tether_run.model_call_failed(exc) from None
        tether_run.messages = result.to_input_list()
        tether_run.succeed(result.final_output)
    return tether_run.outcome


def _keep_items(run: Run, input: Any, exc: BaseException) -> None:
    data = getattr(exc, "run_data", None)
    run.messages = _items(input, data.new_items) if data is not None else None


def run_sync(
    agent: Agent[Any],
    input: str | list[Any],
    *,
    guard: Guard,
    side_effects: Mapping[str, Callable[[str], Any] | None] | Iterable[str] | None = None,
    **options: Any,
) -> Outcome:
    """:func:`run` from synchronous code (not from inside a running event loop)."""
    return blocking(lambda: run(agent, input, guard=guard, side_effects=side_effects, **options))
