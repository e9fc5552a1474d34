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
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import replace
from typing import Annotated, Any, NotRequired, Unpack, cast

from typing_extensions import TypedDict

from tether import (
    Fallback,
    Guard,
    ModelTurn,
    Outcome,
    Run,
    Stopped,
    StopReason,
    ToolError,
)
from tether._context import reset_if_here
from tether._errors import Picklable, RunDocumentError, TetherError, require
from tether.classification._classify import programming_error
from tether.guards._tokens import estimate_tokens
from tether.integrations._common import (
    SideEffects,
    ToolOptions,
    ToolRules,
    require_a_place_to_wait,
    require_guard,
    result_text,
)
from tether.integrations._fallbacks import gives_way
from tether.integrations._tokens import DEFAULT_MAX_OUTPUT
from tether.providers import langchain as langchain_profile
from tether.retries._policy import RetryPolicy

require("langchain", "langchain")

from langchain.agents.middleware.types import (  # noqa: E402 - after the extra check
    AgentMiddleware,
    AgentState,
    hook_config,
)
from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402
from langgraph.channels.untracked_value import UntrackedValue  # noqa: E402

__all__ = ["TetherFields", "TetherMiddleware", "TetherState", "ToolGuard"]

_log = logging.getLogger("tether")


def _newest(old: Any, new: Any) -> Any:
    """Two copies of one run's snapshot as one (parallel tool calls, ``Send`` branches and
    workers each write theirs): their entries' union (:meth:`tether.Run.merged`), so no
    count is lost and none counted twice; a run started anew, or ended (None), replaces
    the old one."""
    return Run.merged(old, new)


def _progress(doc: Mapping[str, Any]) -> tuple[int, ...]:
    found = doc.get("transcript")
    transcript: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    entries = len(transcript.get("entries") or ()) + int(transcript.get("omitted") or 0)
    merged = doc.get("merged")
    return (
        int(doc.get("steps") or 0),
        int(doc.get("model_calls") or 0),
        int(doc.get("tool_calls") or 0),
        entries,
        int(doc.get("stop") is not None),
        len(merged) if isinstance(merged, list) else 0,  # a copy merged with others
    )


class _Doc(dict[str, Any]):
    """A run's snapshot as the middleware writes it to the graph state: plain data (a copy, a
    pickle or a checkpoint of it is a plain dict) that also holds, in memory only, the run it
    was taken of and the stamp of that run's last hold (:class:`_Held`). The next hook
    continues that run instead of rebuilding it, as long as nothing took it since; the run
    lives as long as the snapshot does (a paused thread's checkpoint holds a plain copy:
    nothing of the run stays in memory)."""

    __slots__ = ("live",)

    live: tuple[Run, int]  # set when the run is parked with it (read with getattr)

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self),))  # a copy is plain data: never the run


class _Held:
    """The middleware's bookkeeping of a run its hooks hold: how many hold it now, the stamp
    of its last hold (a snapshot taken before that hold is no longer the run as it is), and
    the snapshots' marks it is shared under while held (parallel tool calls)."""

    __slots__ = ("ended", "holders", "last", "marks", "stamp")

    def __init__(self) -> None:
        self.holders = 0
        self.stamp = 0
        self.ended = False  # the run's outcome is made: never continued again
        self.last: tuple[Any, ...] = ()  # the mark of the newest snapshot taken of the run
        self.marks: list[tuple[Any, ...]] = []


class _Hold:
    """One hook's hold of the turn's run: let go once, by its snapshot or without one."""

    __slots__ = ("done", "run")

    def __init__(self, run: Run) -> None:
        self.run = run
        self.done = False


#: the run of the tool call being made now: an agent run inside it (a sub-agent that a tool
#: runs, with its own middleware) joins that run instead of starting one
_CALLER: ContextVar[Run | None] = ContextVar("tether_langchain_caller", default=None)


def _joined() -> _Hold | None:
    """A hold of the caller's run when this hook runs inside a guarded tool call (a
    sub-agent): its model turns and tool calls count there, under its budgets; the caller's
    agent ends it. Never let go through the middleware's own bookkeeping (``done``)."""
    run = _CALLER.get()
    if run is None:
        return None
    hold = _Hold(run)
    hold.done = True
    return hold


class TetherFields(TypedDict, total=False):
    """tether's fields for a hand-built graph's state (``class State(MessagesState,
    TetherFields)``): the turn's run as plain data, its outcome, its summary, and the
    checkpoint an invocation continues (``tether_resume``: a decided approval's or a paused
    run's ``checkpoint_id``)."""

    tether_run: Annotated[dict[str, Any] | None, _newest]
    tether_outcome: Annotated[Any, UntrackedValue]
    tether_ended: dict[str, Any] | None
    tether_resume: str | None


class TetherState(AgentState[Any]):
    """The agent's state with tether's fields.

    ``tether_run`` is the run of this turn as plain data (``run.snapshot()``): it lives in
    LangGraph's checkpoint with the thread, so that a paused thread (``interrupt()``,
    ``HumanInTheLoopMiddleware``, ``interrupt_before``) resumes the same run, in any
    process, and nothing of it stays in the middleware's memory. ``tether_outcome`` (the
    ``tether.Outcome`` of the turn) is returned by the invocation that ended it and never
    written to the checkpoint; ``tether_ended`` is its summary there, as plain data.
    """

    tether_run: NotRequired[Annotated[dict[str, Any] | None, _newest]]
    tether_outcome: NotRequired[Annotated[Any, UntrackedValue]]
    tether_ended: NotRequired[dict[str, Any] | None]
    #: a checkpoint this invocation continues (a decided approval's ``checkpoint_id``)
    tether_resume: NotRequired[str | None]


#: A read-only tool's own cap of identical calls (polling), as ``LoopPolicy.allow_repeat``.
READ_ONLY_REPEATS = 30


def _summary(outcome: Outcome) -> dict[str, Any]:
    """An outcome in the checkpoint: plain data."""
    return {
        "run_id": outcome.run_id,
        "status": str(getattr(outcome.status, "value", outcome.status)),
        "stopped_because": outcome.stopped_because.value,
        "customer_message": outcome.customer_message,
        "checkpoint_id": outcome.checkpoint_id,
    }


_usage = langchain_profile.usage


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
    reads for each tool's effect (``{"issue_refund": "refund"}``). ``hand_over`` names the
    tools whose call hands the customer to a person (``["transfer_to_human"]``): the tool
    runs, then the agent ends ``"escalated"`` with a case filed. ``read_only`` names the
    tools that only read (they may poll: identical calls count against their own cap,
    :data:`READ_ONLY_REPEATS`), besides tools whose LangChain metadata says
    ``readOnlyHint``. ``volatile`` maps a tool to the argument paths its model fills anew
    on every call. ``key`` names the request a turn serves, as ``guard.start(key=)``: a
    string, or a function of the invocation's ``RunnableConfig`` (``lambda config:
    config["configurable"]["ticket"]``, or ``lambda config: None`` for every turn its own
    request); None (the default): the LangGraph thread (``thread_id``), so that "try again"
    in a later turn of the same thread does not pay twice.
    ``fallbacks``: the models a model call goes to, in order, when its own cannot answer
    (its breaker is open, a quota refused it: see :class:`tether.Fallback`); default: the
    guard's. Each is a LangChain chat model (``Fallback.client``) or built by
    ``init_chat_model(model, model_provider=provider)``, refused here when it cannot be.
    ``scopes``: the budget scopes each turn's run spends in (``guard.start(scopes=...)``).
    """

    state_schema = TetherState

    def __init__(
        self,
        guard: Guard,
        side_effects: SideEffects = None,
        *,
        read_only: Iterable[str] = (),
        key: str | Callable[[Mapping[str, Any]], str | None] | None = None,
        fallbacks: Sequence[Fallback | str] | None = None,
        scopes: Sequence[str] | None = None,
        **rules: Unpack[ToolOptions],
    ) -> None:
        super().__init__()
        require_guard(guard)
        if key is not None and not callable(key) and (not isinstance(key, str) or not key.strip()):
            raise ValueError(
                f"key must be a request id (str), a function of the config, or None, got {key!r}"
            )
        self.guard = guard
        self.key = key
        #: the budget scopes every turn's run spends in (``guard.start(scopes=...)``)
        self.scopes = scopes
        # model calls: retried at this one layer, classified by tether, within the run's time
        self._policy = guard.retry.replace(name="model")
        #: the chat models a model call goes to when its own cannot answer, in order
        chain = Fallback.chain(guard.fallbacks if fallbacks is None else fallbacks)
        guard.prices.check_chain(chain, guard.budget.max_cost_usd)
        self.fallbacks = _chat_models(chain)
        self._fallback_policy = self._policy.replace(breaker=None)
        self._warned = False
        self._tools = ToolGuard(side_effects, read_only=read_only, **rules)
        require_a_place_to_wait(guard, self._tools.rules.needing_approval())
        self.side_effects = self._tools.side_effects
        # runs held by hooks now, by the marks of the snapshots they were taken from, shared
        # by the hooks that hold them at once (parallel tool calls); let go with the last
        self._shared: dict[tuple[Any, ...], Run] = {}
        # the runs the hooks hold or a snapshot in the graph state holds (weak: a run lives as
        # long as a hook uses it or its snapshot is in memory, never for a paused thread)
        self._held: weakref.WeakKeyDictionary[Run, _Held] = weakref.WeakKeyDictionary()
        # by run id: the run a hook last took from a plain copy of its snapshot (a checkpoint's,
        # another worker's), and that snapshot's mark; the next hook on the same copy (a
        # parallel tool call of the same step) continues it, until a hook takes another copy
        self._recent: dict[Any, tuple[tuple[Any, ...], weakref.ref[Run]]] = {}
        self._lock = threading.Lock()

    # --- the run of a turn: in the graph state, as plain data ----------------------------

    def _hold_new(self, run: Run) -> _Hold:
        """A hold of a run just started (or resumed): known to the middleware from here."""
        with self._lock:
            held = self._held[run] = _Held()
            held.holders = held.stamp = 1
        return _Hold(run)

    def _take(self, state: Any) -> _Hold | None:
        """A hold of the run in ``state``: the run its snapshot was taken of when nothing
        took that run since (``guard.restore(reuse=)`` makes it what a rebuilt one would
        be), the run a hook holds now for the same snapshot (parallel tool calls), or the
        run rebuilt from the snapshot; None when the state has no run (``tether_run`` None
        or absent: the caller decides whether a turn may be without one). A run document
        that cannot be read (another version, the wrong type, corrupt) raises
        :class:`tether.RunDocumentError`: nothing runs unguarded."""
        # a TypedDict state is a mapping; a dataclass or pydantic state has attributes
        doc = (
            state.get("tether_run")
            if isinstance(state, Mapping)
            else getattr(state, "tether_run", None)
        )
        if doc is None:
            return None
        if not isinstance(doc, Mapping):
            raise RunDocumentError(
                f"the run in the graph state (tether_run) must be a run document, got "
                f"{type(doc).__name__}: the thread cannot go on unguarded"
            )
        try:
            mark = (doc.get("run_id"), *_progress(doc))
        except (TypeError, ValueError) as exc:
            raise RunDocumentError(f"the run in the graph state is corrupt ({exc})") from None
        if self.key is not None:  # the document serves this conversation's request only
            expected = self._key()
            if doc.get("key") != expected:
                raise RunDocumentError(
                    f"the run in the graph state serves request key {doc.get('key')!r:.60}, "
                    f"not this invocation's ({expected!r:.60}): refused, nothing ran"
                )
        with self._lock:
            run = self._shared.get(mark)
            if run is None:
                run = self._further_on(doc, mark)
                if run is None and type(doc) is not _Doc:
                    run = self._sibling(mark)
                if run is None:
                    run = self.guard.restore(doc, reuse=self._parked(doc))
                self._shared[mark] = run
            self._took(mark, run, type(doc) is not _Doc)
            held = self._held.get(run)
            if held is None:
                held = self._held[run] = _Held()
            if mark not in held.marks:
                held.marks.append(mark)
            held.holders += 1
            held.stamp += 1
        return _Hold(run)

    def _must_take(self, state: Any) -> _Hold:
        """A hold of the run in ``state``, which a hook inside a turn needs: a turn always
        has its run (``before_agent`` put it there), so a state without one was cleared or
        replaced and is refused (:class:`tether.RunDocumentError`), never run unguarded."""
        hold = self._take(state)
        if hold is None:
            raise RunDocumentError(
                "the graph state has no run (tether_run is None) in the middle of a turn: it "
                "was cleared or replaced; the thread cannot go on unguarded (start a new turn)"
            )
        return hold

    def _further_on(self, doc: Mapping[str, Any], mark: tuple[Any, ...]) -> Run | None:
        """The run ``doc`` was taken of, when a hook took it since and it has not ended: the
        snapshot is an older copy of a run still going (parallel tool calls of one model
        turn are each given the state before the turn's calls, and each call's hook may
        come after another's has let go of the run). That run goes on, with every call
        counted; rebuilt from the older copy, a call would not see the others' (under the
        lock)."""
        live = getattr(doc, "live", None) if type(doc) is _Doc else None
        if live is None:
            return None
        run: Run = live[0]
        held = self._held.get(run)
        if held is None or held.ended:
            return None  # ended: an older snapshot is rebuilt
        if held.stamp == live[1] and not held.holders and held.last == mark:
            return None  # untouched since: restored (reuse=) as before
        return run

    def _sibling(self, mark: tuple[Any, ...]) -> Run | None:
        """The run a hook took from the same plain copy of a snapshot, when no hook took
        another copy of the run since and it has not ended: the parallel tool calls of one
        step each read the step's copy (from a checkpoint, in threads that need not overlap)
        and go on in one run, its budgets seeing every call (under the lock)."""
        recent = self._recent.get(mark[0])
        if recent is None or recent[0] != mark:
            return None
        run = recent[1]()
        held = None if run is None else self._held.get(run)
        return None if held is None or held.ended else run

    def _took(self, mark: tuple[Any, ...], run: Run, plain: bool) -> None:
        """Note that a hook took ``run`` from its snapshot ``mark``: from a ``plain`` copy,
        the run's sibling for that copy from now on; the sibling of another copy of the run
        is forgotten (the graph went on: a fork replayed from that copy later is rebuilt)
        (under the lock)."""
        recent = self._recent.get(mark[0])
        if recent is not None and (plain or recent[0] != mark):
            del self._recent[mark[0]]
        if plain:
            if len(self._recent) >= 1024:  # threads paused, never continued: the oldest go
                del self._recent[next(iter(self._recent))]
            self._recent[mark[0]] = (mark, weakref.ref(run))

    def _parked(self, doc: Mapping[str, Any]) -> Run | None:
        """The run ``doc`` was taken of, untouched since (no hook took it after that
        snapshot); None when there is none (under the lock)."""
        live = getattr(doc, "live", None) if type(doc) is _Doc else None
        if live is None:
            return None
        run, stamp = live
        held = self._held.get(run)
        return run if held is not None and held.stamp == stamp and not held.holders else None

    def _put(self, hold: _Hold) -> _Doc:
        """The run's snapshot for the state update, and the hold let go with it: the snapshot
        taken by the last holder keeps the run for the next hook (the two at once, under the
        lock, so that no other holder's change comes between them)."""
        with self._lock:
            doc = _Doc(hold.run.snapshot())
            held = self._release(hold)
            if held is not None:
                doc.live = (hold.run, held.stamp)
                held.last = (doc.get("run_id"), *_progress(doc))
        return doc

    def _doc(self, hold: _Hold) -> _Doc | None:
        """:meth:`_put`, or None for a joined run (its document is the caller's)."""
        return None if _CALLER.get() is hold.run else self._put(hold)

    def _let_go(self, hold: _Hold) -> None:
        """Let go of a hold without a snapshot (the run ended, or the hook failed: the state
        keeps the snapshot it had, and the next hook rebuilds the run from it)."""
        if not hold.done:
            with self._lock:
                self._release(hold)

    def _release(self, hold: _Hold) -> _Held | None:
        hold.done = True
        held = self._held.get(hold.run)
        if held is None:  # pragma: no cover - a held run is known until let go
            return None
        held.holders -= 1
        if not held.holders:  # nobody holds it: no hook shares it any more
            for mark in held.marks:
                if self._shared.get(mark) is hold.run:
                    del self._shared[mark]
            held.marks.clear()
        return held

    def _key(self) -> str | None:
        """The request of this invocation: ``key=`` (a string, or what it makes of the
        config), else the LangGraph thread (``configurable.thread_id``): a turn that asks
        again in the same thread ("try again") serves the same request, so its effects are
        at most once across the thread's turns. Without a thread (no checkpointer), None:
        the turn is its own request."""
        if isinstance(self.key, str):
            return self.key
        from langgraph.config import get_config

        if self.key is None:
            try:
                configurable = get_config().get("configurable") or {}
            except RuntimeError:  # called outside a graph's invocation
                return None
            thread = configurable.get("thread_id")
            if isinstance(thread, bool) or not isinstance(thread, str | int):
                return None
            return str(thread) if str(thread).strip() else None
        key = self.key(get_config())
        if key is not None and (not isinstance(key, str) or not key.strip()):
            raise ValueError(f"key(config) must return a request id (str) or None, got {key!r}")
        return key

    def before_agent(self, state: TetherState, runtime: Any) -> dict[str, Any] | None:
        if _CALLER.get() is not None:  # a sub-agent inside a guarded tool call: it joins
            return {"tether_run": None, "tether_resume": None, "tether_ended": None}
        task = ""
        for message in state.get("messages", []):
            if getattr(message, "type", "") == "human":
                task = str(getattr(message, "content", ""))[:200]  # the turn's request
        resume = state.get("tether_resume")
        run = (
            self.guard.resume(resume)
            if resume
            else self.guard.start(task=task, key=self._key(), scopes=self.scopes)
        )
        # a checkpoint continues once; the turn's run goes with the thread
        doc = self._put(self._hold_new(run))
        return {"tether_run": doc, "tether_resume": None, "tether_ended": None}

    async def abefore_agent(self, state: TetherState, runtime: Any) -> dict[str, Any] | None:
        return self.before_agent(state, runtime)

    @hook_config(can_jump_to=["end"])
    def before_model(self, state: TetherState, runtime: Any) -> dict[str, Any] | None:
        caller = _CALLER.get()
        if caller is not None:  # the caller's run decides; its agent ends it
            if caller.stopped is None and caller.proceed():
                return None
            reason = caller.stopped.value if caller.stopped is not None else "stopped"
            return {"jump_to": "end", "messages": [AIMessage(content=f"stopped: {reason}")]}
        hold = self._must_take(state)
        try:
            run = hold.run
            if run.stopped is None and run.proceed():
                return {"tether_run": self._put(hold)}
            return self._end(run, state)
        finally:
            self._let_go(hold)

    @hook_config(can_jump_to=["end"])
    async def abefore_model(self, state: TetherState, runtime: Any) -> dict[str, Any] | None:
        return self.before_model(state, runtime)

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        hold = _joined() or self._must_take(request.state)
        try:
            run = hold.run
            chain = self._chain(request)
            for i, (asked, policy) in enumerate(chain):
                last = i == len(chain) - 1
                try:  # the guard's token budget may make the call wait for its place
                    turn = run.model_turn(**self._model_call(asked)).open()
                except Stopped:  # a wait past the run's time: stopped before the request
                    return _no_reply(self._doc(hold))
                try:
                    response = turn.call(handler, asked, policy=policy, breaker_wait=last)
                except Exception as exc:
                    if _gives_way(turn, chain, i, exc):
                        continue
                    return self._model_failed(hold, turn, exc, request.state)
                except BaseException as exc:
                    turn.gave_way(exc)
                    raise
                self._count(turn, response)
                return _with_run(response, self._doc(hold))
            raise AssertionError("unreachable: the last model answers or fails")  # pragma: no cover
        finally:
            self._let_go(hold)

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        hold = _joined() or self._must_take(request.state)
        try:
            run = hold.run
            chain = self._chain(request)
            for i, (asked, policy) in enumerate(chain):
                last = i == len(chain) - 1
                try:  # the token budget's wait sleeps on the event loop
                    turn = await run.amodel_turn(**self._model_call(asked)).aopen()
                except Stopped:
                    return _no_reply(self._doc(hold))
                try:
                    response = await turn.acall(handler, asked, policy=policy, breaker_wait=last)
                except Exception as exc:
                    if _gives_way(turn, chain, i, exc):
                        continue
                    return self._model_failed(hold, turn, exc, request.state)
                except BaseException as exc:
                    turn.gave_way(exc)
                    raise
                self._count(turn, response)
                return _with_run(response, self._doc(hold))
            raise AssertionError("unreachable: the last model answers or fails")  # pragma: no cover
        finally:
            self._let_go(hold)

    def _chain(self, request: Any) -> list[tuple[Any, RetryPolicy]]:
        """The request to its own model, then to each fallback (``request.override``); a
        fallback's attempts go through the guard's retry policy without the primary's
        breaker (an open one is what sends the call on, or, last, ends the run
        ``CIRCUIT_OPEN`` after ``Guard(outage_wait=...)``): each turn asks its own
        provider's breaker (``ModelTurn.call``)."""
        if not self.fallbacks:
            return [(request, self._policy)]
        return [(request, self._policy)] + [
            (request.override(model=model), self._fallback_policy) for model in self.fallbacks
        ]

    def _model_call(self, request: Any) -> dict[str, Any]:
        """What ``run.begin_model_call`` is told of the request: its model, its prompt's
        estimate and the output it may generate (the token budget's reservation)."""
        retries = getattr(request.model, "max_retries", 0)
        if isinstance(retries, int) and retries > 0 and not self._warned:
            self._warned = True
            _log.warning(
                "tether: the chat model retries on its own (max_retries=%d); build it with "
                "max_retries=0 so that retries happen at one layer",
                retries,
            )
        return {
            "model": _model_name(request.model),
            "estimate": _estimate(request),
            "max_output": _max_output(request),
        }

    def _model_failed(self, hold: _Hold, turn: ModelTurn, exc: Exception, state: Any) -> Any:
        """The model call failed after its retries: the run stops; the agent ends. A
        programming error (an ``ImportError``, a ``TypeError`` of a bad call...) is raised
        once the run is ended and filed, as a plain program would raise it."""
        turn.fail(exc)
        if programming_error(exc):
            if _CALLER.get() is None:  # a joined run is the caller's to end
                self._finish(hold.run, state)
            raise exc
        return _no_reply(self._doc(hold))

    def _count(self, turn: ModelTurn, response: Any) -> None:
        """Each AI message of the reply counted in the turn (none: an unmeasured call)."""
        messages = getattr(response, "result", None)
        if messages is None:
            messages = getattr(getattr(response, "model_response", None), "result", None)
        counted = False
        for message in messages or [response]:
            if getattr(message, "type", "") == "ai":
                turn.record(_usage(message))
                counted = True
        if not counted:
            turn.record(unmeasured=True)

    def after_agent(self, state: TetherState, runtime: Any) -> dict[str, Any] | None:
        if _CALLER.get() is not None:  # a joined run goes on in the caller's agent
            return None
        if state.get("tether_run") is None and isinstance(state.get("tether_ended"), Mapping):
            return None  # a guard ended the turn already (its outcome is in the update)
        hold = self._must_take(state)
        try:
            return self._after_agent(hold.run, state)
        finally:
            self._let_go(hold)

    def _after_agent(self, run: Run, state: TetherState) -> dict[str, Any]:
        if run.stopped is None:
            last = state.get("messages", [])[-1:] if state.get("messages") else []
            run.succeed(str(getattr(last[0], "content", "")) if last else None)
        outcome = self._finish(run, state)
        ended = {"tether_outcome": outcome, "tether_run": None, "tether_ended": _summary(outcome)}
        if outcome.stopped_because is StopReason.GOAL_REACHED:
            return ended
        return {**ended, "messages": [AIMessage(content=outcome.customer_message)]}

    async def aafter_agent(self, state: TetherState, runtime: Any) -> dict[str, Any] | None:
        return self.after_agent(state, runtime)

    def _finish(self, run: Run, state: Any) -> Outcome:
        run.messages = list(state.get("messages", []))
        return self._end_run(run)

    def _end_run(self, run: Run) -> Outcome:
        """End ``run`` (its outcome made): an older copy of it is never continued again."""
        with self._lock:
            held = self._held.get(run)
            if held is not None:
                held.ended = True
            self._recent.pop(run.run_id, None)
        run.__exit__(None, None, None)
        return run.outcome

    def _end(self, run: Run, state: Any) -> dict[str, Any]:
        """A guard stopped the run: end the agent with the customer message."""
        outcome = self._finish(run, state)
        return {
            "jump_to": "end",
            "messages": [AIMessage(content=outcome.customer_message)],
            "tether_outcome": outcome,
            "tether_run": None,
            "tether_ended": _summary(outcome),
        }

    # --- tools ----------------------------------------------------------------------

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        joined = _joined()
        hold = joined or self._must_take(request.state)
        try:
            token = _CALLER.set(hold.run)  # an agent the tool runs joins this run
            try:
                reply = self._tools.call(hold.run, request, handler)
            finally:
                _CALLER.reset(token)
            return _and_run(reply, self._doc(hold))
        except _signals():  # LangGraph's control flow (interrupt()): the run goes on
            raise
        except Exception as exc:
            if joined is None:
                self._raised(hold.run, request.state, exc)
            raise
        finally:
            self._let_go(hold)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        joined = _joined()
        hold = joined or self._must_take(request.state)
        try:
            token = _CALLER.set(hold.run)  # an agent the tool runs joins this run
            try:
                reply = await self._tools.acall(hold.run, request, handler)
            finally:
                reset_if_here(_CALLER, token)
            return _and_run(reply, self._doc(hold))
        except _signals():  # LangGraph's control flow (interrupt()): the run goes on
            raise
        except Exception as exc:
            if joined is None:
                self._raised(hold.run, request.state, exc)
            raise
        finally:
            self._let_go(hold)

    def _raised(self, run: Run, state: Any, exc: Exception) -> None:
        """A tool's own exception leaves the agent (LangChain's ``handle_tool_errors`` raises
        it): the run ends and is filed first, as in every adapter (its dead letter points at
        a filed run)."""
        run.note_error(exc)
        run.halt(StopReason.PERMANENT_ERROR, f"a tool raised {type(exc).__name__}")
        messages = state.get("messages", []) if isinstance(state, Mapping) else []
        run.messages = list(messages)
        run.__exit__(None, None, None)


def _chat_models(chain: Sequence[Fallback]) -> tuple[Any, ...]:
    """The chat model of each fallback: its ``client`` (a LangChain chat model), else one
    LangChain builds from its name and provider; refused here, naming the entry."""
    from langchain_core.language_models import BaseChatModel

    models = []
    for i, entry in enumerate(chain):
        if entry.client is not None:
            if not isinstance(entry.client, BaseChatModel):
                raise TypeError(
                    f"fallbacks[{i}].client must be a LangChain chat model for a LangChain "
                    f"agent (the agent calls its model through LangChain), got {entry.client!r}"
                )
            models.append(entry.client)
            continue
        from langchain.chat_models import init_chat_model

        try:
            models.append(init_chat_model(entry.model, model_provider=entry.provider))
        except Exception as exc:  # an unknown provider, its package missing, no API key
            raise ValueError(
                f"fallbacks[{i}] ({entry.model!r}): LangChain cannot build its chat model "
                f"({exc}); give it one: tether.Fallback({entry.model!r}, client=<chat model>)"
            ) from None
    return tuple(models)


def _gives_way(turn: ModelTurn, chain: Sequence[tuple[Any, Any]], i: int, exc: Exception) -> bool:
    """Whether model ``i``'s failure sends the call to the next model (logged, with a
    ``tether.fallback`` event); its turn's reservations are given back."""
    names = [(None, _model_name(asked.model)) for asked, _ in chain]
    if not gives_way(names, i, exc):
        return False
    turn.gave_way(exc)
    return True


def _estimate(request: Any) -> int:
    """The request's prompt in tokens, estimated (see :func:`prompt_tokens`)."""
    return prompt_tokens(request.messages, request.system_message, request.tools)


def prompt_tokens(messages: Iterable[Any], system: Any = None, tools: Iterable[Any] = ()) -> int:
    """A prompt's tokens, estimated: the system message, the messages' content and tool
    calls, the tools' names, descriptions and arguments."""
    said: list[Any] = [getattr(system, "content", None)]
    for message in messages:
        said += [getattr(message, "content", None), getattr(message, "tool_calls", None) or None]
    for t in tools:
        said.append(t if isinstance(t, Mapping) else _tool_text(t))
    return estimate_tokens(*said)


#: a tool's (name, description, arguments) as the estimate's JSON text, by the tool's id:
#: (a weak reference to the tool, its name, description and args_schema, the text)
_TOOL_TEXTS: dict[int, tuple[Any, Any, Any, Any, str]] = {}


def _tool_text(t: Any) -> str:
    """``(t.name, t.description, t.args)`` as JSON text, what the estimate counts of a tool
    (so the same count): made once per tool while its name, description and
    ``args_schema`` (a pydantic model class) stay the objects they were; a dict schema,
    which may change in place, is read at every call. ``t.args`` builds the tool's JSON
    schema anew at each read (pydantic's ``model_json_schema``), and every model call
    reads the tools again."""
    import json

    name, description, schema = t.name, t.description, getattr(t, "args_schema", None)
    if not isinstance(schema, type):  # a dict schema (changed in place?), none: read anew
        return json.dumps((name, description, t.args), default=str, ensure_ascii=False)
    found = _TOOL_TEXTS.get(id(t))
    if found is not None:
        ref, *was, text = found
        if ref() is t and was[0] is name and was[1] is description and was[2] is schema:
            return text
    text = json.dumps((name, description, t.args), default=str, ensure_ascii=False)
    try:
        ref = weakref.ref(t)
    except TypeError:  # a tool that cannot be referenced weakly: not kept
        return text
    if len(_TOOL_TEXTS) >= 512:  # tools made per request: the oldest texts go
        _TOOL_TEXTS.clear()
    _TOOL_TEXTS[id(t)] = (ref, name, description, schema, text)
    return text


def _max_output(request: Any) -> int:
    """The output the call may generate: the request's ``max_tokens`` setting or the chat
    model's, else the default the guarded clients reserve for a request that names none."""
    for limit in (
        request.model_settings.get("max_tokens"),
        getattr(request.model, "max_tokens", None),
    ):
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            return limit
    return DEFAULT_MAX_OUTPUT


def _no_reply(doc: Mapping[str, Any] | None) -> Any:
    """The model was not called or failed for good (the run stopped): an empty reply, after
    which the agent ends with the customer message."""
    from langchain.agents.middleware.types import ModelResponse

    return _with_run(ModelResponse(result=[AIMessage(content="")]), doc)


def _with_run(response: Any, doc: Mapping[str, Any] | None) -> Any:
    """The model's response, and the run as it stands (``doc``, for the checkpoint; None
    for a sub-agent that joined its caller's run)."""
    from langchain.agents.middleware.types import ExtendedModelResponse
    from langgraph.types import Command

    update: dict[str, Any] = {"tether_run": doc}
    if isinstance(response, ExtendedModelResponse):
        command = response.command
        if command is not None and isinstance(command.update, Mapping):
            update = {**command.update, **update}
            command = replace(command, update=update)
        return ExtendedModelResponse(response.model_response, command or Command(update=update))
    if isinstance(response, AIMessage):
        from langchain.agents.middleware.types import ModelResponse

        response = ModelResponse(result=[response])
    return ExtendedModelResponse(model_response=response, command=Command(update=update))


def _and_run(reply: Any, doc: Mapping[str, Any] | None) -> list[Any]:
    """The tool's reply as it is, and the run as it stands (``doc``: a state update of its
    own)."""
    from langgraph.types import Command

    replies = reply if isinstance(reply, list) else [reply]
    return [*replies, Command(update={"tether_run": doc})]


def _signals() -> tuple[type[BaseException], ...]:
    """LangGraph's own control flow (an ``interrupt()``, a ``Command`` to a parent graph):
    through a tool call untouched."""
    from langgraph.errors import GraphBubbleUp

    return (GraphBubbleUp,)


def _reads(request: Any) -> bool:
    """A tool whose LangChain metadata says it only reads (MCP's ``readOnlyHint``)."""
    meta = getattr(getattr(request, "tool", None), "metadata", None) or {}
    return isinstance(meta, Mapping) and bool(meta.get("readOnlyHint") or meta.get("read_only"))


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

    def __init__(
        self,
        side_effects: SideEffects = None,
        *positional: Any,
        read_only: Iterable[str] = (),
        **options: Unpack[ToolOptions],
    ) -> None:
        if (
            positional
        ):  # the first form: ToolGuard(side_effects, timeouts, requires_approval, compensate)
            if len(positional) > 3:
                raise TypeError(
                    f"ToolGuard takes at most 4 positional arguments, got {len(positional) + 1}"
                )
            named = dict(
                zip(("timeouts", "requires_approval", "compensate"), positional, strict=False)
            )
            if set(named) & set(options):
                raise TypeError(f"{', '.join(sorted(set(named) & set(options)))} given twice")
            options = cast("ToolOptions", {**named, **options})
        self.rules = ToolRules(side_effects, **options)
        self.side_effects = self.rules.side_effects
        self.timeouts = self.rules.timeouts
        if isinstance(read_only, str) or not all(isinstance(n, str) for n in read_only):
            raise TypeError(f"read_only must be a list of tool names, got {read_only!r}")
        self.read_only = frozenset(read_only)

    def _plan(self, request: Any) -> tuple[str, dict[str, Any], dict[str, Any]]:
        call = request.tool_call
        name = str(call.get("name", ""))
        args = call.get("args") if isinstance(call.get("args"), dict) else {}
        options = self.rules.options(name)
        options["passthrough"] = _signals()
        if name not in self.side_effects and (name in self.read_only or _reads(request)):
            options["allow_repeat"] = READ_ONLY_REPEATS
        return name, dict(args), options

    def call(self, run: Run, request: Any, handler: Callable[[Any], Any]) -> Any:
        name, args, options = self._plan(request)
        replies: list[Any] = []

        def attempt(**_: Any) -> Any:
            replies.append(handler(request))
            return _own_result(replies[-1])

        try:
            return _as_message(request, run.call_tool(name, attempt, args, **options), replies)
        except ToolError as exc:
            return _failed(request, exc)
        except Stopped as exc:  # the next model step ends the agent
            return _message(request, f"stopped: {exc.reason.value}")

    async def acall(self, run: Run, request: Any, handler: Callable[[Any], Any]) -> Any:
        name, args, options = self._plan(request)
        replies: list[Any] = []

        async def attempt(**_: Any) -> Any:
            replies.append(await handler(request))
            return _own_result(replies[-1])

        try:
            result = await run.acall_tool(name, attempt, args, **options)
            return _as_message(request, result, replies)
        except ToolError as exc:
            return _failed(request, exc)
        except Stopped as exc:
            return _message(request, f"stopped: {exc.reason.value}")


class FailedReply(Picklable, Exception):
    """``ToolNode`` answered a call with an error message (``handle_tool_errors`` caught the
    tool's exception): the call failed, whatever the framework did with its exception; the
    message is what the model reads."""

    def __init__(self, reply: Any) -> None:
        super().__init__(str(getattr(reply, "content", "") or "the tool failed")[:300])
        self.reply = reply


def _own_result(reply: Any) -> Any:
    """What a call's reply records as its result: a ``ToolMessage``'s content (the tool's own
    result: ``outcome.partial`` and the ledger hold it, never the framework's message); an
    error message is a failure, never a result."""
    if isinstance(reply, ToolMessage):
        if reply.status == "error":
            raise FailedReply(reply)
        return reply.content
    return reply


def _failed(request: Any, exc: ToolError) -> Any:
    """A failed call: the tool's own exception raised again for the framework's error
    handling, the error message ``ToolNode`` answered with, or tether's words."""
    cause = exc.__cause__
    if isinstance(cause, FailedReply):
        return cause.reply
    own = _tools_own_error(exc)
    if own is not None:
        raise own from None
    return _message(request, exc.model_message)


def _is_reply(item: Any) -> bool:
    return isinstance(item, ToolMessage) or type(item).__name__ == "Command"


def _as_message(request: Any, result: Any, replies: list[Any]) -> Any:
    """What answers this call: what ``ToolNode`` answered (a ``ToolMessage``, a ``Command``, a
    list of them) as it is; a result replayed from the ledger (a dict) or a lookup's answer
    as the message (a re-issued call has a new id)."""
    if replies:  # the call ran now: what ToolNode answered, as it is
        return replies[-1]
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
