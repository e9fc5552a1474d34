"""Hand-built LangGraph graphs: tether's guards around a ``ToolNode``, and a retry policy.

>>> from langgraph.prebuilt import ToolNode
>>> from tether.integrations import langgraph as ta_langgraph
>>> with guard.start(task="refund A-1") as run:                        # doctest: +SKIP
...     tools = ToolNode([lookup_order, issue_refund],
...                      wrap_tool_call=ta_langgraph.tool_wrapper(run, side_effects={"issue_refund": None}))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Unpack, cast

from tether import ModelTurn, Run, Stopped
from tether._errors import require
from tether.classification._classify import classify, programming_error
from tether.integrations._arguments import same_arguments
from tether.integrations._common import require_a_place_to_wait
from tether.integrations._tool_options import SideEffects, ToolOptions

if TYPE_CHECKING:
    from tether.integrations.langchain import _Hold

__all__ = [
    "GraphGuard",
    "atool_wrapper",
    "retry_policy",
    "tool_wrapper",
]  # + TetherFields, newest_run


def __getattr__(name: str) -> Any:
    if name == "TetherFields":  # tether's fields for a graph's state (needs the extra)
        from tether.integrations.langchain import TetherFields

        return TetherFields
    if name == "newest_run":  # the reducer of ``tether_run``, for a dataclass state
        from tether.integrations.langchain import _newest

        return _newest
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: the Retry-After of the failure that a ``retry_policy`` just judged (read by its interval)
_RETRY_AFTER: ContextVar[float | None] = ContextVar("tether_langgraph_retry_after", default=None)


class _Interval(float):
    """LangGraph's ``initial_interval``, whose wait (``interval * backoff_factor ** n``) the
    failure's Retry-After raises to its floor (LangGraph's ``max_interval`` still caps it)."""

    def __mul__(self, other: Any) -> float:
        wait = float(self) * float(other)
        after = _RETRY_AFTER.get()
        return wait if after is None else max(wait, after)

    __rmul__ = __mul__


def retry_policy(**settings: Any) -> Any:
    """A LangGraph ``RetryPolicy`` that retries what ``tether.classify`` calls retryable
    (never a quota or a permanent failure) and waits at least the failure's Retry-After;
    other fields as LangGraph's (``max_attempts``, ``initial_interval``, ``backoff_factor``,
    ``max_interval``, ``jitter``)."""
    types: Any = require("langgraph.types", "langchain")
    own = settings.pop("retry_on", None)

    def retry_on(exc: Exception) -> bool:
        verdict = classify(exc)
        _RETRY_AFTER.set(verdict.retry_after)
        if own is None:
            return verdict.retryable
        if isinstance(own, type | tuple):
            return isinstance(exc, own)
        return bool(own(exc))

    settings["initial_interval"] = _Interval(settings.get("initial_interval", 0.5))
    return types.RetryPolicy(retry_on=retry_on, **settings)


Wrapper = Callable[[Any, Callable[[Any], Any]], Any]


def _drain(run: Run, control: Any) -> None:
    """A guard stopped the run: ask LangGraph to stop at the next superstep boundary, with
    its checkpoint saved (``GraphDrained``), so that the thread can be resumed."""
    if control is not None and run.stopped is not None and not control.drain_requested:
        control.request_drain(f"tether: {run.stopped.value}")


def tool_wrapper(
    run: Run,
    side_effects: SideEffects = None,
    *,
    control: Any = None,
    **options: Unpack[ToolOptions],
) -> Wrapper:
    """A ``ToolNode(wrap_tool_call=...)`` that runs every tool call through ``run``: loops,
    timeouts, breaker, retries, the ledger for ``side_effects``, and the per-tool options
    (:class:`tether.integrations.ToolOptions`). A guard's stop comes back
    as an error tool message; route on ``run.stopped`` to end the graph, or pass the run's
    ``control`` (``langgraph.runtime.RunControl``, given to ``invoke(..., control=...)``) to
    drain it: LangGraph stops at the next superstep with a resumable checkpoint."""
    from tether.integrations.langchain import ToolGuard

    guard = ToolGuard(side_effects, **options)
    require_a_place_to_wait(run.guard, guard.rules.needing_approval())
    return _ToolWrapper(run, guard, control)


@same_arguments(tool_wrapper)
def atool_wrapper(*args: Any, **options: Any) -> Wrapper:
    """The async form of :func:`tool_wrapper` (``ToolNode(awrap_tool_call=...)``)."""
    return cast("_ToolWrapper", tool_wrapper(*args, **options)).acall


class _ToolWrapper:
    """A tool call of a ``ToolNode`` through the run, then a drain when a guard stopped it."""

    def __init__(self, run: Run, guard: Any, control: Any) -> None:
        self.run, self.guard, self.control = run, guard, control

    def __call__(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        try:
            return self.guard.call(self.run, request, handler)
        finally:
            _drain(self.run, self.control)

    async def acall(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        try:
            return await self.guard.acall(self.run, request, handler)
        finally:
            _drain(self.run, self.control)


class GraphGuard:
    """tether's guards for a hand-built graph compiled once (``langgraph.json``, LangGraph
    server): the run of each turn lives in the graph state, keyed by its thread, as
    ``TetherMiddleware`` keeps it; nothing is rebuilt per invocation.

    Give the graph's state tether's fields (``class State(MessagesState, TetherFields)``),
    wrap the model node (``guarded.model_node(call_model)``: one step per call, the
    budgets checked before it, its usage and cost counted, retried at one layer within the
    run's time, the turn ended with the customer message when a guard stops it or when
    the model answers without calling a tool), and give the ``ToolNode`` the wrappers
    (``ToolNode(tools, wrap_tool_call=guarded.tool_wrapper, awrap_tool_call=
    guarded.atool_wrapper)``), or call :meth:`call_tools` from a hand-written tool node.
    ``scopes``: the budget scopes each turn's run spends in (``guard.start(scopes=...)``);
    ``side_effects`` and the per-tool options (:class:`tether.integrations.ToolOptions`:
    ``timeouts``, ``requires_approval``, ``compensate``, ``labels``, ``hand_over``,
    ``volatile``) are the middleware's.
    """

    def __init__(
        self,
        guard: Any,
        side_effects: SideEffects = None,
        *,
        read_only: Iterable[str] = (),
        model: str = "",
        key: str | Callable[[Mapping[str, Any]], str | None] | None = None,
        scopes: Sequence[str] | None = None,
        **options: Unpack[ToolOptions],
    ) -> None:
        from tether.integrations.langchain import TetherMiddleware

        #: the model's name for prices, when its replies do not say (``response_metadata``)
        self.model = model
        # the middleware is the one place that knows how a run lives in a graph's state
        self._agent = TetherMiddleware(
            guard, side_effects, read_only=read_only, key=key, scopes=scopes, **options
        )
        self.guard = guard

    # --- the model node ----------------------------------------------------------------

    def model_node(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn(state[, runtime | config])`` (sync or async) returning ``{"messages": ai}``,
        under the turn's run."""
        import inspect

        params = list(inspect.signature(fn).parameters)[1:2]
        extra = params[0] if params else None

        def arguments(state: Any, runtime: Any) -> tuple[Any, ...]:
            if extra is None:
                return (state,)
            if extra == "config":
                from langgraph.config import get_config

                return (state, get_config())
            return (state, runtime)

        if inspect.iscoroutinefunction(fn):

            async def anode(state: Any, runtime: Any) -> dict[str, Any]:
                hold, ended = self._turn(state)
                try:
                    if ended is not None:
                        return ended
                    run = hold.run
                    try:  # the guard's token budget may make the call wait (on the event loop)
                        turn = await run.amodel_turn(**self._model_call(state)).aopen()
                    except Stopped:  # a wait past the run's time: stopped before the call
                        return self._ended(run, state, {})
                    try:
                        out = await turn.acall(
                            fn, *arguments(state, runtime), policy=self._agent._policy
                        )
                    except Exception as exc:
                        return self._model_failed(run, turn, state, exc)
                    except BaseException as exc:
                        turn.gave_way(exc)
                        raise
                    return self._after(hold, turn, state, out)
                finally:
                    self._agent._let_go(hold)

            anode.__name__ = getattr(fn, "__name__", "model")
            return anode

        def node(state: Any, runtime: Any) -> dict[str, Any]:
            hold, ended = self._turn(state)
            try:
                if ended is not None:
                    return ended
                run = hold.run
                try:
                    turn = run.model_turn(**self._model_call(state)).open()
                except Stopped:
                    return self._ended(run, state, {})
                try:
                    out = turn.call(fn, *arguments(state, runtime), policy=self._agent._policy)
                except Exception as exc:
                    return self._model_failed(run, turn, state, exc)
                except BaseException as exc:
                    turn.gave_way(exc)
                    raise
                return self._after(hold, turn, state, out)
            finally:
                self._agent._let_go(hold)

        node.__name__ = getattr(fn, "__name__", "model")
        return node

    def _model_failed(
        self, run: Run, turn: ModelTurn, state: Any, exc: Exception
    ) -> dict[str, Any]:
        """The node failed after its retries: the turn ends with the customer message; a
        programming error (``tether.classification.PROGRAMMING_ERRORS``) is raised once the
        run is ended and filed, as a plain program would raise it."""
        turn.fail(exc)
        ended = self._ended(run, state, {})
        if programming_error(exc):
            raise exc
        return ended

    def _model_call(self, state: Any) -> dict[str, Any]:
        """What ``run.begin_model_call`` is told of the call the node makes: the model's
        name, the state's messages as the prompt's estimate (the node's own system prompt
        and tools are not seen: the budget learns the difference from the usage), the
        default output reservation."""
        from tether.integrations._tokens import DEFAULT_MAX_OUTPUT
        from tether.integrations.langchain import prompt_tokens

        return {
            "model": self.model,
            "estimate": prompt_tokens(_get(state, "messages") or ()),
            "max_output": DEFAULT_MAX_OUTPUT,
        }

    def _turn(self, state: Any) -> tuple[_Hold, dict[str, Any] | None]:
        """A hold of the turn's run (a new turn starts one), its step begun; or how the turn
        ends. The node holds the run until its update is made (``_agent._let_go``), so that
        parallel branches of one step share it, as the middleware's hooks do."""
        hold = self._agent._take(state)
        if hold is None:
            task = ""
            for message in _get(state, "messages") or ():
                if getattr(message, "type", "") == "human":
                    task = str(getattr(message, "content", ""))[:200]
            resume = _get(state, "tether_resume")  # a decided approval, a raised scope
            hold = self._agent._hold_new(
                self.guard.resume(resume)
                if resume
                else self.guard.start(task=task, key=self._agent._key(), scopes=self._agent.scopes)
            )
        run = hold.run
        if run.stopped is None and run.proceed():
            return hold, None
        return hold, self._ended(run, state, {})

    def _after(self, hold: _Hold, turn: ModelTurn, state: Any, out: Any) -> dict[str, Any]:
        from tether.integrations.langchain import _usage

        run = hold.run
        update = dict(out) if isinstance(out, Mapping) else {"messages": out}
        found = update.get("messages")
        replies = found if isinstance(found, list) else [found]
        counted = False
        for message in replies:
            if getattr(message, "type", "") == "ai":
                meta = getattr(message, "response_metadata", None) or {}
                name = str(meta.get("model_name") or meta.get("model") or self.model)
                turn.record(_usage(message), model=name)
                counted = True
        if not counted:  # the node's update holds no reply: a call with no usage reported
            turn.record(unmeasured=True)
        last = replies[-1] if replies else None
        if getattr(last, "type", "") == "ai" and not getattr(last, "tool_calls", None):
            run.succeed(str(getattr(last, "content", "")))
            return self._ended(run, state, update)
        return {**update, **_resumed(state), "tether_run": self._agent._put(hold)}

    def _ended(self, run: Run, state: Any, update: dict[str, Any]) -> dict[str, Any]:
        from langchain_core.messages import AIMessage

        from tether import StopReason
        from tether.integrations.langchain import _summary

        messages = list(_get(state, "messages") or ())
        found = update.get("messages")
        run.messages = messages + (found if isinstance(found, list) else [found] if found else [])
        outcome = self._agent._end_run(run)
        ended = {
            **update,
            **_resumed(state),
            "tether_outcome": outcome,
            "tether_run": None,
            "tether_ended": _summary(outcome),
        }
        if outcome.stopped_because is not StopReason.GOAL_REACHED:
            ended["messages"] = [AIMessage(content=outcome.customer_message)]
        return ended

    # --- tools -------------------------------------------------------------------------

    def tool_wrapper(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """``ToolNode(wrap_tool_call=guarded.tool_wrapper)``."""
        return self._agent.wrap_tool_call(request, handler)

    async def atool_wrapper(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """``ToolNode(awrap_tool_call=guarded.atool_wrapper)``."""
        return await self._agent.awrap_tool_call(request, handler)

    def call_tools(self, state: Any, tools: Iterable[Any]) -> dict[str, Any]:
        """A hand-written tool node (the "ReAct agent from scratch" one): every tool call of
        the last AI message through the turn's run; the node's state update."""
        # held until the update: parallel branches share it; a tool node always follows the
        # turn's model node, so a state without its run is refused (tether.RunDocumentError)
        hold = self._agent._must_take(state)
        try:
            return self._call_tools(hold, state, tools)
        finally:
            self._agent._let_go(hold)

    def _call_tools(self, hold: _Hold, state: Any, tools: Iterable[Any]) -> dict[str, Any]:
        from langchain_core.messages import ToolMessage

        from tether import Stopped, StopReason, ToolError
        from tether.integrations._common import result_text
        from tether.integrations.langchain import _message

        run = hold.run
        by_name = {tool.name: tool for tool in tools}
        last = (_get(state, "messages") or [None])[-1]
        out: list[Any] = []
        for call in getattr(last, "tool_calls", None) or ():
            request = _Request(call, by_name.get(call["name"]))
            if request.tool is None:
                out.append(
                    ToolMessage(
                        f"unknown tool {call['name']!r}", tool_call_id=call["id"], status="error"
                    )
                )
                continue
            name, args, options = self._agent._tools._plan(request)
            try:
                invoke = request.tool.invoke
                result = run.call_tool(name, lambda _i=invoke, **a: _i(a), args, **options)
                out.append(ToolMessage(result_text(result), tool_call_id=call["id"], name=name))
            except ToolError as exc:
                own = exc.__cause__
                if isinstance(own, Exception) and programming_error(own):
                    # a bug in the tool: the run ends and is filed, then the bug is raised
                    run.note_error(own)
                    run.halt(StopReason.PERMANENT_ERROR, f"a tool raised {type(own).__name__}")
                    self._ended(run, state, {})
                    raise own from None
                out.append(_message(request, exc.model_message))
            except Stopped as exc:
                out.append(_message(request, f"stopped: {exc.reason.value}"))
        return {"messages": out, "tether_run": self._agent._put(hold)}


class _Request:
    """A tool call as ``ToolNode`` hands it to a wrapper (what ``ToolGuard`` reads)."""

    def __init__(self, call: Mapping[str, Any], tool: Any) -> None:
        self.tool_call = call
        self.tool = tool


def _resumed(state: Any) -> dict[str, Any]:
    """The update that marks a ``tether_resume`` taken (a checkpoint continues once)."""
    return {"tether_resume": None} if _get(state, "tether_resume") else {}


def _get(state: Any, name: str) -> Any:
    return state.get(name) if isinstance(state, Mapping) else getattr(state, name, None)
