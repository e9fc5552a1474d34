"""Strands Agents under tether: ``Agent(model, tools=[...], hooks=[TetherHooks(guard)])``.

One tether run per agent invocation (``agent(...)``, ``invoke_async``, ``stream_async``:
``BeforeInvocationEvent`` to ``AfterInvocationEvent``). Every model call is one step,
checked before it is sent (``BeforeModelCallEvent``: budgets, loops, the cost of the next
call; a stop cancels the call, and the agent ends with the customer message as its last
assistant message) and counted after it with the usage Strands reports
(``AfterModelCallEvent``: input, output and cache tokens), priced. Every tool call goes
through ``run.acall_tool``: ``BeforeToolCallEvent`` replaces the selected tool with the
same tool under the run (loop checks, its timeout, its breaker, retries at one layer, and
the ledger for the tools named in ``side_effects``, which run at most once per intent);
a call the run refuses is cancelled (``cancel_tool``) with the reason, and the agent's
loop ends after that round of tools (``AfterToolsEvent.end_turn``), its last message the
customer message. The outcome is ``hooks.last_outcome``.

The run as plain data (``run.snapshot()``, the run document, signed by the guard's
``signing_key``) is kept in ``agent.state["tether_run"]`` while the run goes on, after each
model call and each tool call: a Strands session manager (``FileSessionManager``,
``S3SessionManager``...) persists it with the agent's messages, so that an agent restored
from the same session after its process died continues the same run (its budgets spent,
its request, the ledger's effects: a refund made before the crash is not made again, given
a ledger the processes share, ``Guard(records=...)``). A document that cannot be read
(altered, forged, unsigned under a signing key, not a document) raises
:class:`tether.RunDocumentError` before anything runs. A run that ended leaves none.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any, Unpack

from tether import Guard, ModelTurn, Outcome, Run, Stopped, StopReason, ToolError
from tether._errors import RunDocumentError, require
from tether.integrations import _strands_interrupts
from tether.integrations._common import (
    ModelRetries,
    SideEffects,
    ToolOptions,
    ToolRules,
    require_a_place_to_wait,
    require_guard,
    require_request_key,
)
from tether.providers import bedrock

require("strands", "strands")

from strands.hooks import (  # noqa: E402 - after the extra check
    AfterInvocationEvent,
    AfterModelCallEvent,
    AfterToolsEvent,
    BeforeInvocationEvent,
    BeforeModelCallEvent,
    BeforeToolCallEvent,
    HookProvider,
    HookRegistry,
)
from strands.types.tools import AgentTool  # noqa: E402

__all__ = ["STATE_KEY", "TetherHooks"]

_log = logging.getLogger("tether")

#: where the invocation's run lives in Strands' ``invocation_state``
RUN_KEY = "tether_run"
#: where the run document of the run in progress lives in ``agent.state`` (which Strands'
#: session managers persist)
STATE_KEY = "tether_run"
#: set when the invocation joined the run of the guarded tool that runs it
_JOINED = "tether_joined_run"
#: the run of the guarded tool call in progress: an agent it runs under hooks counts in it
_PARENT: contextvars.ContextVar[tuple[Guard, Run] | None] = contextvars.ContextVar(
    "tether_strands_run", default=None
)
#: set when tether cancelled the model call (Strands reports a zero-usage reply for it)
_CANCELLED = "tether_cancelled_model_call"
#: the failed attempts of the model call in progress, and the retry decisions of the run
_ATTEMPT, _RETRIES = "tether_model_attempt", "tether_model_retries"
#: set while a failed model call is being retried (the next model call is the same step)
_RETRYING = "tether_retrying_model_call"
#: invocation_state's key of the model turn of the request in flight
_TURN = "tether_model_turn"


def _text(message: Any) -> str:
    content = message.get("content") if isinstance(message, Mapping) else None
    return "".join(str(b["text"]) for b in content or () if isinstance(b, Mapping) and "text" in b)


def _task(messages: Any) -> str:
    for message in messages or ():
        if isinstance(message, Mapping) and message.get("role") == "user":
            return _text(message)[:200]
    return ""


def _model_name(agent: Any) -> str:
    config = getattr(agent.model, "config", None)
    if isinstance(config, Mapping):
        name = config.get("model_id") or config.get("model")
        if isinstance(name, str):
            return name
    name = getattr(agent.model, "model_id", None)
    return name if isinstance(name, str) else ""


def _keep(agent: Any, run: Run) -> None:
    """The run document in ``agent.state`` (a session manager persists it with the next
    message of the agent)."""
    agent.state.set(STATE_KEY, run.snapshot())


def _kept(guard: Guard, agent: Any) -> Run | None:
    """The run an agent restored from its session was in when its process stopped (its
    document in ``agent.state``), continued under ``guard``; None when there is none."""
    doc = agent.state.get(STATE_KEY)
    if doc is None:
        return None
    if not isinstance(doc, Mapping):
        raise RunDocumentError(
            f"agent.state[{STATE_KEY!r}] must be a run document, got {type(doc).__name__}: "
            "the invocation cannot go on unguarded"
        )
    return guard.restore(doc)  # an altered, forged or unreadable one: RunDocumentError


class _GuardedTool(AgentTool):  # type: ignore[misc,unused-ignore]  # untyped without strands
    """A Strands tool whose call goes through a tether run."""

    def __init__(
        self, tool: Any, run: Run, options: dict[str, Any], guard: Guard, agent: Any = None
    ) -> None:
        super().__init__()
        self._guard = guard
        self._agent = agent  # where the run document is kept after the call (None: joined)
        self._tool = tool
        self._run = run
        self._options = options

    @property
    def tool_name(self) -> str:
        return str(self._tool.tool_name)

    @property
    def tool_spec(self) -> Any:
        return self._tool.tool_spec

    @property
    def tool_type(self) -> str:
        return str(self._tool.tool_type)

    async def stream(
        self, tool_use: Any, invocation_state: dict[str, Any], **kwargs: Any
    ) -> AsyncGenerator[Any, None]:
        from strands.types._events import ToolResultEvent

        tool = self._tool
        seen: list[Any] = []

        async def attempt(**args: Any) -> Any:
            final: Any = None
            async for event in tool.stream({**tool_use, "input": args}, invocation_state, **kwargs):
                if isinstance(event, ToolResultEvent):
                    final = event
                else:
                    seen.append(event)
            if final is None:
                raise RuntimeError(f"tool {self.tool_name!r} ended without a result")
            if final.exception is not None:  # the tool raised: tether classifies it
                raise final.exception
            result = final.tool_result
            return {"status": result.get("status"), "content": list(result.get("content") or [])}

        use_id = tool_use.get("toolUseId", "")
        token = _PARENT.set((self._guard, self._run))  # an agent it runs joins this run
        try:
            result = await self._run.acall_tool(
                self.tool_name, attempt, dict(tool_use.get("input") or {}), **self._options
            )
        except ToolError as exc:
            result = {"status": "error", "content": [{"text": exc.model_message}]}
        except Stopped as exc:  # the batch's AfterToolsEvent ends the loop
            result = {"status": "error", "content": [{"text": f"stopped: {exc.reason.value}"}]}
        finally:
            _PARENT.reset(token)
        if self._agent is not None:  # persisted with the call's result message
            _keep(self._agent, self._run)
        for event in seen:
            yield event
        if not isinstance(result, Mapping) or "content" not in result:
            result = {"status": "success", "content": [{"text": str(result)}]}
        yield ToolResultEvent(
            {
                "toolUseId": use_id,
                "status": result.get("status") or "success",
                "content": list(result["content"]),
            }
        )


class TetherHooks(HookProvider):  # type: ignore[misc,unused-ignore]
    """tether's guards for a Strands agent (``Agent(hooks=[TetherHooks(guard)])``).

    ``side_effects`` names the non-idempotent tools: a mapping of tool name to its
    ``lookup`` (the provider's records, or None), or an iterable of names; they run at most
    once per intent through the guard's ledger. ``key`` names the request an invocation
    serves (``guard.start(key=)``): a string, or a function of the invocation state; None:
    every invocation is its own request. ``timeouts``, ``requires_approval``,
    ``compensate`` and ``labels`` (by tool name) are the options of ``run.call_tool``.
    ``scopes`` names the budget scopes every invocation's run spends in
    (``guard.start(scopes=...)``): a spent scope pauses the run (``BUDGET_REACHED``) before
    the model call it could not pay.
    """

    def __init__(
        self,
        guard: Guard,
        side_effects: SideEffects = None,
        *,
        key: str | Callable[[dict[str, Any]], str | None] | None = None,
        scopes: Sequence[str] | None = None,
        **rules: Unpack[ToolOptions],
    ) -> None:
        require_guard(guard)
        require_request_key(key)
        self.guard = guard
        self.key = key
        #: the budget scopes each invocation's run spends in (``guard.start(scopes=...)``)
        self.scopes = scopes
        self.rules = ToolRules(side_effects, **rules)
        require_a_place_to_wait(guard, self.rules.needing_approval())
        self.side_effects = self.rules.side_effects
        #: the model calls' retries: one layer, tether's (Strands' own strategy then skips)
        self._policy = guard.retry.replace(name="model")
        #: the outcome of the invocation that ended last
        self.last_outcome: Outcome | None = None

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeInvocationEvent, self._begin)
        registry.add_callback(BeforeModelCallEvent, self._before_model)
        registry.add_callback(AfterModelCallEvent, self._after_model)
        registry.add_callback(BeforeToolCallEvent, self._before_tool)
        registry.add_callback(AfterToolsEvent, self._after_tools)
        registry.add_callback(AfterInvocationEvent, self._end)

    def _key(self, invocation_state: dict[str, Any]) -> str | None:
        if callable(self.key):
            key = self.key(invocation_state)
            if key is not None and (not isinstance(key, str) or not key.strip()):
                raise ValueError(f"key(invocation_state) must return a request id, got {key!r}")
            return key
        return self.key

    @staticmethod
    def _run(invocation_state: dict[str, Any]) -> Run:
        run = invocation_state.get(RUN_KEY)
        if not isinstance(run, Run):
            raise RunDocumentError(
                "the Strands invocation has no tether run (TetherHooks' BeforeInvocationEvent "
                "did not run for it): it cannot go on unguarded"
            )
        return run

    def _begin(self, event: Any) -> None:
        state = event.invocation_state
        parent = _PARENT.get()
        if parent is not None and parent[0] is self.guard:  # run by a guarded tool: joined
            state[RUN_KEY], state[_JOINED] = parent[1], True
            state.pop(_CANCELLED, None)
            return
        messages = event.messages if event.messages is not None else event.agent.messages
        run = _strands_interrupts.resumed(self.guard, event.agent)  # an answered interrupt
        if run is None:  # a run its process left unfinished, kept in the restored session
            run = _kept(self.guard, event.agent)
        if run is None:
            run = self.guard.start(task=_task(messages), key=self._key(state), scopes=self.scopes)
        run.__enter__()
        state[RUN_KEY] = run
        state.pop(_CANCELLED, None)

    async def _before_model(self, event: Any) -> None:
        state = event.invocation_state
        run = self._run(state)
        again = state.pop(_RETRYING, False)  # a retry of the step's call: the same step
        if run.stopped is None and (again or run.proceed()):
            try:  # each attempt asks its provider's breaker (open past outage_wait: stopped)
                turn = await run.amodel_turn(_model_name(event.agent)).aopen()
                state[_TURN] = await turn.aattempt()
                self._keep(event)
                return
            except Stopped:
                pass
        state[_CANCELLED] = True
        event.cancel = run.outcome.customer_message

    async def _after_model(self, event: Any) -> None:
        state = event.invocation_state
        run = self._run(state)
        turn = state.pop(_TURN, None) or run.model_turn(_model_name(event.agent))
        if state.get(_CANCELLED) or event.stop_response is None:
            if event.exception is not None and not state.get(_CANCELLED):
                if await self._retry(event, run, turn):
                    return
                turn.fail(event.exception)  # classified; Strands raises it on
            return
        state.pop(_ATTEMPT, None)
        usage = bedrock.usage(event.stop_response.message)
        if usage is None:
            turn.record(unmeasured=True)
        else:
            turn.record(usage)
        if event.stop_response.stop_reason == "max_tokens" and run.stopped is None:
            try:  # Strands raises MaxTokensReachedException: the reply is cut, never an answer
                run.stop(StopReason.TRUNCATED, "the model's reply was cut at its max_tokens")
            except Stopped:
                pass
        self._keep(event)

    @staticmethod
    def _keep(event: Any) -> None:
        """The run document in ``agent.state``, for the run this agent owns."""
        state = event.invocation_state
        if not state.get(_JOINED):
            _keep(event.agent, TetherHooks._run(state))

    async def _retry(self, event: Any, run: Run, turn: ModelTurn) -> bool:
        """Whether the failed model call is tried again: tether's policy decides (the
        failure's classification, its two-tier backoff and ``Retry-After``, its attempts,
        the run's time left), waits, and asks Strands for the retry (``event.retry``), so
        that Strands' own ``ModelRetryStrategy``, which skips a call already being retried,
        is never a second layer."""
        from tether.classification._classify import classify

        state = event.invocation_state
        attempt = state[_ATTEMPT] = state.get(_ATTEMPT, 0) + 1
        retries = state.get(_RETRIES)
        if not isinstance(retries, ModelRetries):
            retries = state[_RETRIES] = ModelRetries(self._policy, run)
        verdict = classify(event.exception)
        # the attempt's failure counts in its provider's breaker; one that left it open
        # (the provider is down) is tried again after the breaker's wait, its attempts
        # counted afresh (past Guard(outage_wait=...) the run ends CIRCUIT_OPEN)
        opened = turn.attempt_failed(event.exception) and verdict.retryable
        delay = 0.0 if opened else retries.wait(verdict, attempt)
        if delay is None:
            return False
        if opened:
            state[_ATTEMPT] = 0
        turn.gave_way(event.exception)  # its reservation back: the retry reserves
        await self.guard.clock.asleep(delay)
        state[_RETRYING] = True
        event.retry = True
        return True

    async def _before_tool(self, event: Any) -> None:
        run = self._run(event.invocation_state)
        tool = event.selected_tool
        if run.stopped is None and tool is not None:  # a call that needs approval interrupts
            name = str(tool.tool_name)
            await _strands_interrupts.ask(event, run, name, self.rules.options(name))
        if run.stopped is not None:  # the batch's AfterToolsEvent ends the loop
            event.cancel_tool = f"stopped: {run.stopped.value}"
            return
        if tool is None:  # a tool the model named that does not exist: Strands answers it
            return
        options = self.rules.options(str(tool.tool_name))
        keeper = None if event.invocation_state.get(_JOINED) else event.agent
        event.selected_tool = _GuardedTool(tool, run, options, self.guard, keeper)

    def _after_tools(self, event: Any) -> None:
        """A stop during the batch ends the loop once every call of the batch is done (the
        outcome then knows what they did), the customer message the agent's last word."""
        run = self._run(event.invocation_state)
        if run.stopped is not None:
            event.end_turn = run.outcome.customer_message

    def _end(self, event: Any) -> None:
        state = event.invocation_state
        run = state.pop(RUN_KEY, None)
        if not isinstance(run, Run) or state.pop(_JOINED, False):  # the caller's run goes on
            return
        if run.stopped is None:
            result = event.result
            if result is None:  # an exception ended the invocation: never a success
                try:
                    run.stop(StopReason.ERROR, "the Strands invocation ended without a result")
                except Stopped:
                    pass
            else:
                run.succeed(_text(getattr(result, "message", None)))
        run.__exit__(None, None, None)
        if event.agent.state.get(STATE_KEY) is not None:
            event.agent.state.delete(STATE_KEY)  # ended: the next invocation is a new run
        self.last_outcome = run.outcome
