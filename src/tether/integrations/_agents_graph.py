"""tether's copy of an Agents SDK agent graph: every agent a run can reach (handoffs, bare or
``handoff()`` objects, in cycles; nested agents started inside the run), with its function
tools and its MCP servers' tools under the run, and tether's model retries.

The caller's agents are never changed; :meth:`Guarding.original` maps a copy back to the
agent it was made from (``outcome.last_agent`` is the caller's own)."""

from __future__ import annotations

import copy
import json
import logging
import weakref
from typing import Any

from tether import CircuitOpenError, Run, Stopped, ToolError
from tether._errors import require
from tether.integrations._agents_hooks import GuardStopped, active_hooks, request_failed
from tether.integrations._common import ModelRetries, ToolRules, malformed_arguments
from tether.retries._policy import RetryPolicy

require("agents", "openai-agents")

from agents import Agent, FunctionTool, ModelSettings  # noqa: E402 - after the extra check
from agents.handoffs import Handoff  # noqa: E402
from agents.mcp import MCPServer  # noqa: E402
from agents.retry import ModelRetrySettings, RetryDecision, RetryPolicyContext  # noqa: E402

_log = logging.getLogger("tether")


class _ModelRetries(ModelRetries):
    """The SDK runner's model-retry policy, decided by tether."""

    def __deepcopy__(self, memo: dict[int, Any]) -> _ModelRetries:
        return self  # the SDK copies model settings; the run they count into is one

    _first = 1  # the SDK's attempt the current count starts at (after a breaker's probe)

    async def __call__(self, context: RetryPolicyContext) -> RetryDecision:
        verdict = self.policy.classifier(context.error)
        attempt = context.attempt
        if attempt <= 1:
            self._first = 1
        hooks = active_hooks()
        # the attempt's failure counts in its provider's breaker; one that left it open
        # waits for its next probe as the run allows (Guard(outage_wait=...)), then tries
        # again with its attempts counted afresh, as a guarded client's call does
        opened = hooks is not None and await hooks.settle(verdict)
        delay = None if opened else self.wait(verdict, attempt - self._first + 1)
        if delay is None and not (opened and verdict.retryable):
            request_failed()
            return RetryDecision(retry=False, reason=verdict.reason)
        if hooks is not None:
            try:  # the next attempt asks the breaker first
                await hooks.permit()
            except CircuitOpenError:  # raised out of the runner: the run ends CIRCUIT_OPEN
                request_failed()
                raise
        if delay is None:  # a probe after the wait
            self._first = attempt + 1
            return RetryDecision(retry=True, delay=0.0, reason="the provider's breaker probes")
        return RetryDecision(retry=True, delay=delay, reason=verdict.reason)


#: the SDK's own cap on a request's retries, left to tether's policy (its attempts, the
#: run's time and outage_wait bound them)
_UNBOUNDED = 1_000_000


def model_retry(policy: RetryPolicy | None = None, run: Run | None = None) -> ModelRetrySettings:
    """``ModelSettings(retry=...)`` that retries model calls the way tether does.

    Build the SDK's OpenAI client with ``max_retries=0`` as well, so that retries happen
    at this one layer.
    """
    policy = policy or RetryPolicy(name="model")
    return ModelRetrySettings(
        # the policy decides each retry (it sees the last attempt's failure too, which its
        # provider's breaker counts): max_attempts, counted afresh after a breaker's probe
        max_retries=_UNBOUNDED,
        policy=_ModelRetries(policy, run),
    )


def guarded_tool(tool: Any, run: Run, rules: ToolRules) -> Any:
    """A copy of ``tool`` whose calls go through ``run`` (hosted tools pass unchanged)."""
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
                try:
                    return await body(ctx, raw)
                except GuardStopped as stop:  # a nested agent's run was stopped by the guard
                    raise Stopped(stop.reason, stop.detail) from None

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
        _log.warning(
            "tether: the OpenAI client retries on its own (max_retries=%d); build it "
            "with max_retries=0 so that retries happen at one layer",
            retries,
        )


class Guarding:
    """One run's guarded copies of the agents it reaches, made once each."""

    def __init__(self, run: Run, rules: ToolRules, policy: RetryPolicy) -> None:
        self.run, self.rules, self.policy = run, rules, policy
        self._copies: dict[int, tuple[Agent[Any], Agent[Any]]] = {}  # id(original) -> both
        self._made: dict[int, Agent[Any]] = {}  # id(copy) -> original

    def agent(self, agent: Any) -> Any:
        """tether's copy of ``agent`` (``agent`` itself when it is one already)."""
        if not isinstance(agent, Agent) or id(agent) in self._made:
            return agent
        if id(agent) in self._copies:
            return self._copies[id(agent)][1]
        settings = agent.model_settings
        if settings.retry is not None:
            _log.warning(
                "tether: agent %r has its own ModelSettings.retry; tether's replaces "
                "it so that retries happen at one layer",
                agent.name,
            )
        _warn_client_retries(agent.model)
        clone = agent.clone(
            tools=[guarded_tool(tool, self.run, self.rules) for tool in agent.tools],
            model_settings=settings.resolve(
                ModelSettings(retry=model_retry(self.policy, self.run))
            ),
            mcp_servers=[self.server(server) for server in agent.mcp_servers],
        )
        self._copies[id(agent)] = (agent, clone)
        self._made[id(clone)] = agent
        clone.handoffs = [self.handoff(h) for h in agent.handoffs]
        return clone

    def original(self, agent: Any) -> Any:
        """The caller's agent that ``agent`` is tether's copy of (or ``agent`` itself)."""
        return self._made.get(id(agent), agent)

    def handoff(self, handoff: Any) -> Any:
        """A ``handoff()`` object (or a bare agent) whose target is tether's copy; the
        handoff's own hook, input filter and settings are kept as they are."""
        if isinstance(handoff, Agent):
            return self.agent(handoff)
        if not isinstance(handoff, Handoff):
            return handoff
        invoke = handoff.on_invoke_handoff

        async def on_invoke_handoff(ctx: Any, arguments: str) -> Any:
            return self.agent(await invoke(ctx, arguments))  # the hook runs as the SDK's

        guarded = copy.copy(handoff)
        guarded.on_invoke_handoff = on_invoke_handoff
        target = handoff._agent_ref() if handoff._agent_ref is not None else None
        if isinstance(target, Agent):  # the SDK finds a handoff's agent through this reference
            guarded._agent_ref = weakref.ref(self.agent(target))
        return guarded

    def server(self, server: Any) -> Any:
        """An agent's MCP server with its tool calls under the run, as
        :func:`tether.integrations.mcp.agents_server` puts them (the tools' annotations
        decide; the ones named in ``side_effects`` run at most once per intent)."""
        from tether.integrations._mcp_agents import GuardedAgentsServer
        from tether.integrations.mcp import agents_server

        if isinstance(server, GuardedAgentsServer) or not isinstance(server, MCPServer):
            return server  # guarded already (by the caller, for a run of theirs)
        effects = self.rules.side_effects
        return agents_server(
            server,
            self.run,
            idempotent=dict.fromkeys(effects, False),
            lookup={name: lookup for name, lookup in effects.items() if lookup is not None},
        )
