"""LangChain v1 agents under tether: ``create_agent(..., middleware=[TetherMiddleware(guard)])``.

One tether run per agent invocation. Every model call is one step, counted before it
is made (``before_model``: budgets, loops, the cost of the next call) and after it with
the tokens of ``usage_metadata`` (``after_model``); every tool call goes through
``run.call_tool`` (loop checks, the tool's timeout, its breaker, retries at one layer,
the ledger for the tools named in ``side_effects``). When a guard stops the run the
agent ends at once with an AI message carrying the customer message, and the returned
state holds ``tether_outcome``: never ``GraphRecursionError``, never "please try again"
after an effect whose outcome is unknown.

The run lives in a registry keyed by an id kept in the graph state (not on the
middleware instance, which concurrent invocations and threads share).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, NotRequired

from tether._errors import TetherError, require
from tether.integrations._common import ToolRules, require_a_place_to_wait, result_text
from tether.run._guard import Guard
from tether.run._outcome import Outcome, Stopped, StopReason, ToolError
from tether.run._run import Run

require("langchain", "langchain")

from langchain.agents.middleware.types import (  # noqa: E402 - after the extra check
    AgentMiddleware,
    AgentState,
    PrivateStateAttr,
    hook_config,
)
from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402
from langgraph.channels.untracked_value import UntrackedValue  # noqa: E402

__all__ = ["TetherMiddleware", "TetherState", "ToolGuard"]

_log = logging.getLogger("tether")


class TetherState(AgentState[Any]):
    """The agent's state with tether's fields: the run of this invocation, and its outcome."""

    tether_run_id: NotRequired[Annotated[str, UntrackedValue, PrivateStateAttr]]
    tether_outcome: NotRequired[Any]
    #: a checkpoint this invocation continues (a decided approval's ``checkpoint_id``)
    tether_resume: NotRequired[str | None]


def _usage(message: Any) -> dict[str, int]:
    meta = getattr(message, "usage_metadata", None) or {}
    details = meta.get("input_token_details") or {}
    cache_read = int(details.get("cache_read") or 0)
    cache_write = int(details.get("cache_creation") or 0)
    return {"input_tokens": max(0, int(meta.get("input_tokens") or 0) - cache_read - cache_write),
            "output_tokens": int(meta.get("output_tokens") or 0),
            "cache_read_tokens": cache_read, "cache_write_tokens": cache_write}  # fmt: skip


def _model_name(model: Any) -> str:
    for attr in ("model_name", "model"):
        value = getattr(model, attr, None)
        if isinstance(value, str) and value:
            return value
    return ""


class TetherMiddleware(AgentMiddleware[TetherState, Any]):
    """tether's guards for a LangChain v1 agent.

    ``side_effects`` names the non-idempotent tools: a mapping of tool name to its
    ``lookup`` (the provider's records, or None), or an iterable of names. They run at
    most once per intent through the guard's ledger; every other tool is treated as
    idempotent and retried through transient failures. ``labels`` names what the customer
    reads for each tool's effect (``{"issue_refund": "refund"}``).
    """

    state_schema = TetherState

    def __init__(self, guard: Guard, side_effects: Mapping[str, Callable[[str], Any] | None]
                 | Iterable[str] | None = None, *, timeouts: Mapping[str, float] | None = None,
                 requires_approval: Mapping[str, Any] | None = None,
                 compensate: Mapping[str, Callable[[Any], Any]] | None = None,
                 labels: Mapping[str, str] | None = None) -> None:  # fmt: skip
        super().__init__()
        if not isinstance(guard, Guard):
            raise TypeError(f"guard must be a tether.Guard, got {guard!r}")
        self.guard = guard
        # model calls: retried at this one layer, classified by tether, within the run's time
        self._policy = guard.retry.replace(name="model")
        self._warned = False
        self._tools = ToolGuard(
            side_effects, timeouts, requires_approval, compensate, labels=labels
        )
        require_a_place_to_wait(guard, self._tools.rules.needing_approval())
        self.side_effects = self._tools.side_effects
        self._runs: dict[str, Run] = {}
        self._lock = threading.Lock()

    # --- the run of an invocation -------------------------------------------------------

    def _run(self, state: Any) -> Run | None:
        run_id = state.get("tether_run_id") if isinstance(state, Mapping) else None
        with self._lock:
            return self._runs.get(run_id) if run_id else None

    def before_agent(self, state: TetherState, runtime: Any) -> dict[str, Any] | None:
        task = ""
        for message in state.get("messages", []):
            if getattr(message, "type", "") == "human":
                task = str(getattr(message, "content", ""))[:200]
                break
        resume = state.get("tether_resume")
        run = self.guard.resume(resume) if resume else self.guard.start(task=task)
        run.__enter__()
        run.messages = None
        with self._lock:
            self._runs[run.run_id] = run
        return {"tether_run_id": run.run_id, "tether_resume": None}  # a checkpoint continues once

    async def abefore_agent(self, state: TetherState, runtime: Any) -> dict[str, Any] | None:
        return self.before_agent(state, runtime)

    @hook_config(can_jump_to=["end"])
    def before_model(self, state: TetherState, runtime: Any) -> dict[str, Any] | None:
        run = self._run(state)
        if run is None:
            return None
        if run.stopped is None and run.proceed():
            return None
        return self._end(run, state)

    @hook_config(can_jump_to=["end"])
    async def abefore_model(self, state: TetherState, runtime: Any) -> dict[str, Any] | None:
        return self.before_model(state, runtime)

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        run = self._run(request.state)
        if run is None:
            return handler(request)
        self._before_model_call(run, request)
        try:
            response = run.retry_model_call(self._policy, lambda: handler(request))
        except Exception as exc:
            return self._model_failed(run, exc)
        self._count(run, request, response)
        return response

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        run = self._run(request.state)
        if run is None:
            return await handler(request)
        self._before_model_call(run, request)

        async def call() -> Any:
            return await handler(request)

        try:
            response = await run.aretry_model_call(self._policy, call)
        except Exception as exc:
            return self._model_failed(run, exc)
        self._count(run, request, response)
        return response

    def _before_model_call(self, run: Run, request: Any) -> None:
        run.check_model(_model_name(request.model))
        retries = getattr(request.model, "max_retries", 0)
        if isinstance(retries, int) and retries > 0 and not self._warned:
            self._warned = True
            _log.warning("tether: the chat model retries on its own (max_retries=%d); build it with "
                         "max_retries=0 so that retries happen at one layer", retries)  # fmt: skip

    def _model_failed(self, run: Run, exc: Exception) -> Any:
        """The model call failed after its retries: the run stops; the agent ends."""
        from langchain.agents.middleware.types import ModelResponse

        run.model_call_failed(exc)
        return ModelResponse(result=[AIMessage(content="")])

    def _count(self, run: Run, request: Any, response: Any) -> None:
        messages = getattr(response, "result", None) or [response]
        for message in messages:
            if getattr(message, "type", "") == "ai":
                used = _usage(message)
                run.record_model_call(model=_model_name(request.model), input_tokens=used["input_tokens"],
                                      output_tokens=used["output_tokens"], cache_read_tokens=used["cache_read_tokens"],
                                      cache_write_tokens=used["cache_write_tokens"])  # fmt: skip

    def after_agent(self, state: TetherState, runtime: Any) -> dict[str, Any] | None:
        run = self._run(state)
        if run is None:
            return None
        if run.stopped is None:
            last = state.get("messages", [])[-1:] if state.get("messages") else []
            run.succeed(str(getattr(last[0], "content", "")) if last else None)
        outcome = self._finish(run, state)
        if outcome.stopped_because is StopReason.GOAL_REACHED:
            return {"tether_outcome": outcome}
        return {
            "tether_outcome": outcome,
            "messages": [AIMessage(content=outcome.customer_message)],
        }

    async def aafter_agent(self, state: TetherState, runtime: Any) -> dict[str, Any] | None:
        return self.after_agent(state, runtime)

    def _finish(self, run: Run, state: Any) -> Outcome:
        run.messages = list(state.get("messages", []))
        run.__exit__(None, None, None)
        with self._lock:
            self._runs.pop(run.run_id, None)
        return run.outcome

    def _end(self, run: Run, state: Any) -> dict[str, Any]:
        """A guard stopped the run: end the agent with the customer message."""
        outcome = self._finish(run, state)
        return {"jump_to": "end", "messages": [AIMessage(content=outcome.customer_message)],
                "tether_outcome": outcome}  # fmt: skip

    # --- tools ----------------------------------------------------------------------

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        run = self._run(request.state)
        return handler(request) if run is None else self._tools.call(run, request, handler)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        run = self._run(request.state)
        if run is None:
            return await handler(request)
        return await self._tools.acall(run, request, handler)


class _Passing(BaseException):
    """A framework's control signal (LangGraph's ``GraphInterrupt``, ``ParentCommand``)
    carried through a run's tool call untouched: no retry, no record, no message."""

    def __init__(self, signal: BaseException) -> None:
        super().__init__()
        self.signal = signal


def _passes(exc: BaseException) -> bool:
    """LangGraph's own control flow (an ``interrupt()``, a ``Command`` to a parent graph)."""
    from langgraph.errors import GraphBubbleUp

    return isinstance(exc, GraphBubbleUp)


def _tools_own_error(exc: ToolError) -> BaseException | None:
    """The tool's own exception behind a failed call, raised again for the framework's error
    handling (``ToolNode(handle_tool_errors=...)``, a fallback); None when tether has the
    words: a transient failure it retried to the end (the model hears "temporarily
    unavailable", as with LangChain's ``ToolRetryMiddleware``), a policy, an approval, a
    tool's own ``tether.ToolError``."""
    cause = exc.__cause__
    if cause is None or isinstance(cause, TetherError) or exc.cause_kind == "unavailable":
        return None
    return cause


class ToolGuard:
    """A LangGraph tool call (``ToolCallRequest``) through a run; what the middleware and
    ``tether.integrations.langgraph.tool_wrapper`` share.

    LangGraph's contract holds: what the tool (or ``ToolNode``'s error handling) returns
    reaches LangGraph as it is (a ``ToolMessage``, a ``Command``, a list of them); an
    exception the tool raised and tether could not cure is raised again, so that
    ``handle_tool_errors`` decides; ``interrupt()`` pauses the graph. tether adds its
    guards: loops, budgets, breaker, retries at one layer, the ledger."""

    def __init__(self, side_effects: Any = None, timeouts: Mapping[str, float] | None = None,
                 requires_approval: Mapping[str, Any] | None = None,
                 compensate: Mapping[str, Callable[[Any], Any]] | None = None, *,
                 labels: Mapping[str, str] | None = None,
                 volatile: Mapping[str, Iterable[str]] | None = None) -> None:  # fmt: skip
        self.rules = ToolRules(side_effects, timeouts, requires_approval, compensate, labels=labels)
        self.side_effects = self.rules.side_effects
        self.timeouts = self.rules.timeouts
        self.volatile = _volatile(volatile)

    def _plan(self, request: Any) -> tuple[str, dict[str, Any], dict[str, Any]]:
        call = request.tool_call
        name = str(call.get("name", ""))
        args = call.get("args") if isinstance(call.get("args"), dict) else {}
        options = self.rules.options(name)
        if name in self.volatile:
            options["volatile"] = self.volatile[name]
        return name, dict(args), options

    def call(self, run: Run, request: Any, handler: Callable[[Any], Any]) -> Any:
        name, args, options = self._plan(request)
        replies: list[Any] = []

        def attempt(**_: Any) -> Any:
            try:
                replies.append(handler(request))
            except Exception as exc:
                if _passes(exc):
                    raise _Passing(exc) from None
                raise
            return replies[-1]

        try:
            return _as_message(request, run.call_tool(name, attempt, args, **options), replies)
        except _Passing as passing:
            raise passing.signal from None
        except ToolError as exc:
            own = _tools_own_error(exc)
            if own is not None:
                raise own from None
            return _message(request, exc.model_message)
        except Stopped as exc:  # the next model step ends the agent
            return _message(request, f"stopped: {exc.reason.value}")

    async def acall(self, run: Run, request: Any, handler: Callable[[Any], Any]) -> Any:
        name, args, options = self._plan(request)
        replies: list[Any] = []

        async def attempt(**_: Any) -> Any:
            try:
                replies.append(await handler(request))
            except Exception as exc:
                if _passes(exc):
                    raise _Passing(exc) from None
                raise
            return replies[-1]

        try:
            result = await run.acall_tool(name, attempt, args, **options)
            return _as_message(request, result, replies)
        except _Passing as passing:
            raise passing.signal from None
        except ToolError as exc:
            own = _tools_own_error(exc)
            if own is not None:
                raise own from None
            return _message(request, exc.model_message)
        except Stopped as exc:
            return _message(request, f"stopped: {exc.reason.value}")


def _volatile(volatile: Mapping[str, Iterable[str]] | None) -> dict[str, tuple[str, ...]]:
    """``volatile={"tool": ["meta.nonce"]}``: the argument paths each tool's model fills anew."""
    if volatile is None:
        return {}
    if not isinstance(volatile, Mapping):
        raise TypeError(f"volatile must map tool names to argument paths, got {volatile!r}")
    out: dict[str, tuple[str, ...]] = {}
    for name, paths in volatile.items():
        if isinstance(paths, str) or not all(isinstance(p, str) for p in paths):
            raise TypeError(f"volatile[{name!r}] must be a list of paths (str), got {paths!r}")
        out[str(name)] = tuple(paths)
    return out


def _is_reply(item: Any) -> bool:
    return isinstance(item, ToolMessage) or type(item).__name__ == "Command"


def _as_message(request: Any, result: Any, replies: list[Any]) -> Any:
    """What answers this call: what ``ToolNode`` answered (a ``ToolMessage``, a ``Command``, a
    list of them) as it is; a result replayed from the ledger (a dict) or a lookup's answer
    as the message (a re-issued call has a new id)."""
    if replies and result is replies[-1]:
        return result
    call_id = str(request.tool_call.get("id", ""))
    if isinstance(result, Mapping) and result.get("type") == "tool":
        return ToolMessage.model_validate({**result, "tool_call_id": call_id})
    if _is_reply(result) or (isinstance(result, list) and result and all(map(_is_reply, result))):
        return result
    return ToolMessage(
        content=result_text(result), tool_call_id=call_id, name=request.tool_call.get("name")
    )


def _message(request: Any, text: str) -> ToolMessage:
    call = request.tool_call
    return ToolMessage(
        content=text, tool_call_id=str(call.get("id", "")), name=call.get("name"), status="error"
    )
