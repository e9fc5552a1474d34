"""Google's Agent Development Kit under tether: ``Runner(agent=..., plugins=[TetherPlugin(guard)])``.

One tether run per ADK invocation (a ``Runner.run_async`` call). Every model call of every
agent the invocation reaches (sub-agents it transfers to, Sequential/Parallel/Loop agents,
an ``AgentTool``'s agent, which ADK runs with the parent's plugins) is one step, checked
before it is sent (``before_model_callback``: budgets, loops, the cost of the next call, a
model a cost budget could not price) and counted after it with Gemini's
``usage_metadata`` (prompt, candidates, thoughts and cached tokens), priced. Every tool
call goes through ``run.acall_tool`` (``before_tool_callback`` runs the tool and returns
its result): loop checks, the tool's timeout, its breaker, retries at one layer, and the
ledger for the tools named in ``side_effects``, which run at most once per request. A
model error is classified (``on_model_error_callback``); a guard's stop ends the agent as
ADK expects, with a final model response carrying the customer message; the outcome is
``plugin.outcome(invocation_id)``. The run as plain data (``run.snapshot()``) is kept in
``session.state["tether_run"]``: an invocation resumed (``ResumabilityConfig``) continues
the run with the budget it had left, under the same request key, so the ledger never runs
an effect again.
"""

from __future__ import annotations

import contextvars
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Unpack

from tether import Guard, ModelTurn, Outcome, Run, Stopped, StopReason, ToolError
from tether._errors import ControlSignal, RunDocumentError, require
from tether.integrations import _adk_confirm
from tether.integrations._common import (
    SideEffects,
    ToolOptions,
    ToolRules,
    require_a_place_to_wait,
    require_guard,
)
from tether.providers import google

require("google.adk", "adk")

from google.adk.models.llm_response import LlmResponse  # noqa: E402 - after the extra check
from google.adk.plugins.base_plugin import BasePlugin  # noqa: E402
from google.genai import types  # noqa: E402

__all__ = ["STATE_KEY", "TetherPlugin"]

_log = logging.getLogger("tether")

#: where the run document lives in ``session.state``
STATE_KEY = "tether_run"
#: the invocation the run document in ``session.state`` belongs to
INVOCATION_KEY = "tether_invocation"
#: how many ended invocations' outcomes a plugin keeps (the oldest go first)
KEEP_OUTCOMES = 1024

#: the run of the tool call in progress: an ``AgentTool``'s own Runner counts in it
_PARENT: contextvars.ContextVar[Run | None] = contextvars.ContextVar("tether_adk_run", default=None)


class _Live:
    """An invocation's run in this process: its own, or its parent's (an ``AgentTool``)."""

    __slots__ = ("answer", "owned", "run", "turn")

    def __init__(self, run: Run, owned: bool) -> None:
        self.run = run
        self.owned = owned
        self.answer = ""  # the last model text: the run's result when it succeeds
        self.turn: ModelTurn | None = None  # the model turn of the request in flight


def _text(content: Any) -> str:
    parts = getattr(content, "parts", None) or ()
    return "".join(p.text for p in parts if getattr(p, "text", None) and not p.thought)


def _task(content: Any) -> str:
    return _text(content)[:200]


def _model_name(llm_request: Any, callback_context: Any) -> str:
    name = getattr(llm_request, "model", None)
    if isinstance(name, str) and name:
        return name
    agent = getattr(callback_context._invocation_context, "agent", None)
    model = getattr(agent, "model", None)
    if isinstance(model, str):
        return model
    return str(getattr(model, "model", "") or "")


def _max_output(llm_request: Any) -> int | None:
    config = getattr(llm_request, "config", None)
    limit = getattr(config, "max_output_tokens", None)
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None


async def _adk_asks(tool: Any, args: dict[str, Any], tool_context: Any) -> bool:
    """Whether ADK's ``require_confirmation`` (a bool or a predicate of the call) holds this
    call for a person's confirmation: tether asks it as an approval, in ADK's own flow."""
    check = getattr(tool, "check_require_confirmation", None)
    return check is not None and (await check(args, tool_context)) is True


class _AskedInTheTool(Exception):
    """The tool asked ADK's user to confirm its call itself (``request_confirmation``) and
    returned without doing it: carried out of the run's pipeline as a ``ControlSignal``
    (not done: no ledger result, no retry)."""

    @property
    def result(self) -> Any:
        """What the tool returned (its one argument: pickled, it comes back the same)."""
        return self.args[0]


def _adk_limit_reached(callback_context: Any) -> int | None:
    """ADK's ``RunConfig.max_llm_calls`` when the next model call would pass it (ADK counts
    a call after the plugins' ``before_model_callback`` and raises past its limit), else
    None."""
    ctx = callback_context._invocation_context
    limit = getattr(getattr(ctx, "run_config", None), "max_llm_calls", 0)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
        return None  # ADK enforces no limit
    made = getattr(getattr(ctx, "_invocation_cost_manager", None), "_number_of_llm_calls", None)
    if not isinstance(made, int):  # pragma: no cover - ADK's counter moved: ADK raises itself
        return None
    return limit if made >= limit else None


def _again(
    error: Exception, callback_context: Any, llm_request: Any
) -> Callable[[], Awaitable[LlmResponse]]:
    """The attempts of a model call that failed with ``error``: the first fails with it (so
    the retry policy waits as that failure asks), the next ask the agent's model again for
    its whole reply (what ADK would have read), which ADK then hands to
    ``after_model_callback``."""
    failed = [error]

    async def attempt() -> LlmResponse:
        if failed:
            raise failed.pop()
        agent = callback_context._invocation_context.agent
        final: LlmResponse | None = None
        async for response in agent.canonical_model.generate_content_async(llm_request):
            if not response.partial:
                final = response
        if final is None:
            raise RuntimeError("the model's reply ended without a whole response")
        return final

    return attempt


def _stop_reply(run: Run) -> LlmResponse:
    """The model's last word when a guard stopped the run: the customer message, final."""
    message = run.outcome.customer_message
    return LlmResponse(
        content=types.Content(role="model", parts=[types.Part(text=message)]),
        turn_complete=True,
        custom_metadata={"tether_stopped_because": run.outcome.stopped_because.value},
    )


class TetherPlugin(BasePlugin):  # type: ignore[misc,unused-ignore]  # untyped without google-adk
    """tether's guards for every agent of an ADK ``Runner`` (``Runner(plugins=[...])`` or
    ``App(plugins=[...])``).

    ``side_effects`` names the non-idempotent tools: a mapping of tool name to its
    ``lookup`` (the provider's records, or None), or an iterable of names. They run at most
    once per intent through the guard's ledger (a call re-issued with fresh UUIDs after a
    timeout pays nothing twice); every other tool is treated as idempotent and retried
    through transient failures. ``hand_over`` names the tools that hand the customer to a
    person: the tool runs, then the run ends "escalated". ``key`` names the request an
    invocation serves, as ``guard.start(key=)``: a string, or a function of ADK's
    ``InvocationContext``; default: the app, user, session and invocation (a resumed
    invocation is the same request). ``timeouts``, ``requires_approval``, ``compensate``
    and ``labels`` (by tool name) are the options of ``run.call_tool``. ``scopes`` names
    the budget scopes every invocation's run spends in (``guard.start(scopes=...)``): a
    spent scope pauses the run (``BUDGET_REACHED``) before the model call it could not pay.
    """

    def __init__(
        self,
        guard: Guard,
        side_effects: SideEffects = None,
        *,
        key: str | Callable[[Any], str | None] | None = None,
        scopes: Sequence[str] | None = None,
        name: str = "tether",
        **rules: Unpack[ToolOptions],
    ) -> None:
        super().__init__(name=name)
        require_guard(guard)
        if key is not None and not callable(key) and (not isinstance(key, str) or not key.strip()):
            raise ValueError(
                f"key must be a request id (str), a function of the invocation, or None, got {key!r}"
            )
        self.guard = guard
        self.key = key
        #: the budget scopes each invocation's run spends in (``guard.start(scopes=...)``)
        self.scopes = scopes
        self.rules = ToolRules(side_effects, **rules)
        require_a_place_to_wait(guard, self.rules.needing_approval())
        self.side_effects = self.rules.side_effects
        self.hand_over = self.rules.hand_over  # their calls end the run HANDED_OVER
        #: the model calls' retries (ADK makes one attempt: tether's policy is the one layer)
        self._policy = guard.retry.replace(name="model")
        self._live: dict[str, _Live] = {}
        self._outcomes: OrderedDict[str, Outcome] = OrderedDict()
        #: the outcome of the invocation that ended last in this process
        self.last_outcome: Outcome | None = None

    # --- the run of an invocation ---------------------------------------------------

    def outcome(self, invocation_id: str) -> Outcome:
        """The :class:`tether.Outcome` of an invocation that ended (``event.invocation_id``)."""
        try:
            return self._outcomes[invocation_id]
        except KeyError:
            raise KeyError(f"no ended invocation {invocation_id!r} under this plugin") from None

    def _key(self, ctx: Any) -> str | None:
        if isinstance(self.key, str):
            return self.key
        if callable(self.key):
            key = self.key(ctx)
            if key is not None and (not isinstance(key, str) or not key.strip()):
                raise ValueError(f"key(invocation) must return a request id (str), got {key!r}")
            return key
        session = ctx.session
        return f"adk:{session.app_name}:{session.user_id}:{session.id}:{ctx.invocation_id}"

    def _run(self, invocation_id: str) -> Run:
        live = self._live.get(invocation_id)
        if live is None:  # a callback of an invocation this plugin never saw begin
            raise RunDocumentError(
                f"ADK invocation {invocation_id!r} has no tether run (the plugin's "
                "before_run_callback did not run for it): it cannot go on unguarded"
            )
        return live.run

    async def before_run_callback(self, *, invocation_context: Any) -> types.Content | None:
        ctx = invocation_context
        parent = _PARENT.get()
        if parent is not None:  # an AgentTool's agent: counted in the calling run
            self._live[ctx.invocation_id] = _Live(parent, owned=False)
            return None
        state = ctx.session.state
        doc = state.get(STATE_KEY)
        paused = _adk_confirm.answered(self.guard, ctx)
        if paused is not None:  # the ADK user answered a paused run's confirmation
            run = self.guard.resume(paused)
        elif state.get(INVOCATION_KEY) == ctx.invocation_id and doc is not None:
            if not isinstance(doc, Mapping):
                raise RunDocumentError(
                    f"session.state[{STATE_KEY!r}] must be a run document, got "
                    f"{type(doc).__name__}: the invocation cannot go on unguarded"
                )
            run = self.guard.restore(doc)  # a resumed invocation: the budget it had left
        else:
            run = self.guard.start(
                task=_task(ctx.user_content), key=self._key(ctx), scopes=self.scopes
            )
        run.__enter__()
        self._live[ctx.invocation_id] = _Live(run, owned=True)
        return None

    def _keep(self, context: Any, run: Run) -> None:
        """The run as plain data in the session's state (written with the next event)."""
        try:
            context.state[STATE_KEY] = run.snapshot()
            context.state[INVOCATION_KEY] = context.invocation_id
            if context.state.get(_adk_confirm.AWAITING_KEY) is not None:
                context.state[_adk_confirm.AWAITING_KEY] = None  # answered: never again
        except (AttributeError, TypeError):  # pragma: no cover - a context without state
            pass

    def _end(self, invocation_id: str, exc: BaseException | None = None) -> None:
        live = self._live.pop(invocation_id, None)
        if live is None or not live.owned:
            return
        run = live.run
        if exc is None and run.stopped is None:
            run.succeed(live.answer)
        run.__exit__(None if exc is None else type(exc), exc, None)
        outcome = run.outcome
        self._outcomes[invocation_id] = self.last_outcome = outcome
        while len(self._outcomes) > KEEP_OUTCOMES:
            self._outcomes.popitem(last=False)

    async def after_run_callback(self, *, invocation_context: Any) -> None:
        self._end(invocation_context.invocation_id)

    async def on_run_error_callback(self, *, invocation_context: Any, error: Exception) -> None:
        self._end(invocation_context.invocation_id, error)

    # --- model calls ----------------------------------------------------------------

    async def before_model_callback(
        self, *, callback_context: Any, llm_request: Any
    ) -> LlmResponse | None:
        run = self._run(callback_context.invocation_id)
        if run.stopped is not None:
            return _stop_reply(run)
        limit = _adk_limit_reached(callback_context)
        if limit is not None:  # ADK would raise: the run ends as its own model-call budget does
            try:
                run.stop(StopReason.MAX_MODEL_CALLS, f"ADK's max_llm_calls ({limit}) reached")
            except Stopped:
                return _stop_reply(run)
        if not run.proceed():
            return _stop_reply(run)
        turn = run.amodel_turn(
            _model_name(llm_request, callback_context), max_output=_max_output(llm_request)
        )
        try:  # a token budget's wait past the run's time; the provider's breaker open past
            await turn.aopen()  # Guard(outage_wait=...): CIRCUIT_OPEN, one incident
            await turn.aattempt()
        except Stopped:
            return _stop_reply(run)
        live = self._live.get(callback_context.invocation_id)
        if live is not None:
            live.turn = turn
        self._keep(callback_context, run)
        return None

    async def after_model_callback(
        self, *, callback_context: Any, llm_response: Any
    ) -> LlmResponse | None:
        if llm_response.partial:  # a streamed chunk: the whole reply is counted once
            return None
        live = self._live.get(callback_context.invocation_id)
        if live is None:
            self._run(callback_context.invocation_id)  # raises: nothing runs unguarded
            return None
        run = live.run
        model = str(llm_response.model_version or _model_name(None, callback_context))
        turn, live.turn = live.turn or run.model_turn(model), None
        usage = google.usage(llm_response)
        if usage is None:
            turn.record(model=model, unmeasured=True)
        else:
            turn.record(usage, model=model)
        text = _text(llm_response.content)
        if text:
            live.answer = text
        self._keep(callback_context, run)
        return None

    async def on_model_error_callback(
        self, *, callback_context: Any, llm_request: Any, error: Exception
    ) -> LlmResponse | None:
        run = self._run(callback_context.invocation_id)
        live = self._live.get(callback_context.invocation_id)
        turn = (live.turn if live is not None else None) or run.model_turn()
        if isinstance(error, Stopped):
            turn.gave_way(error)
            return _stop_reply(run)
        turn.attempt_failed(error)  # ADK's own attempt: its provider's breaker is told
        try:  # one retry layer: tether's policy, within the run's time (ADK has none of its own)
            return await turn.acall(
                _again(error, callback_context, llm_request), policy=self._policy
            )
        except Stopped as exc:
            turn.gave_way(exc)
            return _stop_reply(run)
        except Exception as exc:
            if live is not None:
                live.turn = None
            turn.fail(exc)  # the run stops with the failure's reason
            return _stop_reply(run)

    # --- tools ----------------------------------------------------------------------

    async def before_tool_callback(
        self, *, tool: Any, tool_args: dict[str, Any], tool_context: Any
    ) -> dict[str, Any] | None:
        run = self._run(tool_context.invocation_id)
        name = str(tool.name)
        options = self.rules.options(name)
        confirming = tool_context.tool_confirmation is not None  # a confirmed call, again
        if confirming or await _adk_asks(tool, tool_args, tool_context):
            # ADK's require_confirmation is tether's approval, asked in ADK's own flow; a
            # call a person must confirm has an effect: it runs at most once, on the ledger
            require_a_place_to_wait(self.guard, [name])
            options.update(requires_approval=True, idempotent=False)
        if _adk_confirm.refused(tool_context):  # declined in ADK: never run, whatever else
            if run.stopped is None:
                try:
                    run.stop(StopReason.DECLINED, f"{name}: declined in ADK's confirmation")
                except Stopped:
                    pass
            return {"error": _adk_confirm.REFUSED}

        async def attempt(**args: Any) -> Any:
            result = await tool.run_async(args=args, tool_context=tool_context)
            if _adk_confirm.asked_itself(tool_context):
                raise ControlSignal(_AskedInTheTool(result))
            return result

        token = _PARENT.set(run)  # an AgentTool's Runner counts in this run
        try:
            result = await run.acall_tool(name, attempt, dict(tool_args), **options)
        except _AskedInTheTool as asked:  # the tool's own question: tether's approval too
            return await self._approval(run, name, tool_args, tool_context, options, asked)
        except ToolError as exc:
            return {"error": exc.model_message}
        except Stopped as exc:  # the next model call ends the agent with the customer message
            if exc.reason is StopReason.AWAITING_APPROVAL:  # ADK's confirmation asks the person
                return _adk_confirm.ask(run, name, tool_context)
            return {"error": f"stopped: {exc.reason.value}"}
        finally:
            _PARENT.reset(token)
        if name in self.hand_over and run.stopped is None:
            try:
                run.escalate(f"{name} handed the customer to a person")
            except Stopped:
                pass
        self._keep(tool_context, run)
        return result if isinstance(result, dict) else {"result": result}

    async def _approval(
        self,
        run: Run,
        name: str,
        tool_args: dict[str, Any],
        tool_context: Any,
        options: dict[str, Any],
        asked: _AskedInTheTool,
    ) -> dict[str, Any]:
        """A tool asked ADK's user to confirm its call itself: the call waits for tether's
        approval (one record, the run paused), its question the tool's own."""
        require_a_place_to_wait(self.guard, [name])

        def never(**_: Any) -> Any:
            raise RuntimeError(f"{name} ran before its confirmation was answered")

        options = {**options, "requires_approval": True, "idempotent": False}
        try:
            await run.acall_tool(name, never, dict(tool_args), **options)
        except ToolError as exc:
            return {"error": exc.model_message}
        except Stopped as exc:
            if exc.reason is StopReason.AWAITING_APPROVAL:
                return _adk_confirm.ask(run, name, tool_context, asked=asked.result)
            return {"error": f"stopped: {exc.reason.value}"}
        return {"error": f"{name} ran before its confirmation was answered"}  # pragma: no cover

    async def on_tool_error_callback(
        self, *, tool: Any, tool_args: dict[str, Any], tool_context: Any, error: Exception
    ) -> dict[str, Any] | None:
        """A call ADK could not make (a tool the model named that does not exist): through
        the run, so that a model repeating it is stopped like any repeated call."""
        run = self._run(tool_context.invocation_id)

        def fails(**_: Any) -> Any:
            raise error

        try:
            await run.acall_tool(str(tool.name), fails, dict(tool_args), timeout=None)
        except ToolError as exc:
            return {"error": exc.model_message}
        except Stopped as exc:
            return {"error": f"stopped: {exc.reason.value}"}
        return None  # pragma: no cover - fails() always raises
