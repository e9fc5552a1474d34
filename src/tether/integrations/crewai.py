"""CrewAI under tether: ``tether.integrations.crewai.kickoff(crew, inputs, guard=guard)``.

One tether run per kickoff (``kickoff`` / ``akickoff``), found by the crew's agents through
a context variable. Every model call of every agent of the crew is one step, checked before
it is sent (budgets, loops, the cost of the next call) and counted after it with the usage
CrewAI's LLM reports (prompt, completion, cached and cache-write tokens), priced. Every tool
call goes through ``run.call_tool`` (loop checks, the tool's timeout, its breaker, retries
at one layer, and the ledger for the tools named in ``side_effects``, which run at most
once per request): CrewAI's task retries (``Task(max_retries=...)``, a guardrail's retry),
``ToolUsage``'s re-invocations and a crew kicked off again under the same request reach
the ledger, which replays the first result instead of paying twice. A stop ends the agent
in CrewAI's terms: its next model call answers with the customer message as the final
answer, which becomes the task's output; the outcome is returned.

The model calls are guarded where the agent makes them (the agent's ``LLM`` object, for the
kickoff's time, answers through the run), not by a ``@before_llm_call`` hook: a hook can
only block a call, which CrewAI raises as an error and which fails the task, while a stop
is an ending the customer reads.

CrewAI's own limits agree with the run's budgets, the lower one ending the run as tether
ends it (its stop reason, the customer message as the task's output):

* ``max_iter``: CrewAI's "best final answer" request once an agent used its iterations is
  not sent; the run ends ``MAX_STEPS`` (the guard's ``max_steps`` below it stops it first).
* ``max_execution_time``: a deadline for the agent's task on the run's clock, checked before
  each model and tool call; past it the run ends ``TIMEOUT`` (CrewAI alone lets the task go
  on in its thread and raises ``TimeoutError`` once it is over).
* ``max_rpm``: the wait for the next minute is on the run's clock and within its time: a
  wait that would pass the run's ``max_seconds`` ends it ``TIMEOUT`` instead.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Unpack

from tether import Guard, ModelTurn, Outcome, RetryPolicy, Run, Stopped, StopReason, ToolError
from tether._errors import RunDocumentError, require
from tether.integrations._common import (
    SideEffects,
    ToolOptions,
    ToolRules,
    require_a_place_to_wait,
    require_guard,
    require_request_key,
)
from tether.integrations._crewai_asks import HUMAN_INPUT, AskThroughTether, watching_tool_hooks
from tether.integrations._crewai_flow import flow_key, keep, kept_run
from tether.integrations._crewai_limits import asks_for_a_forced_answer, paced, timed, within_limits
from tether.providers import crewai as profile

require("crewai", "crewai")

__all__ = ["TetherCrew", "akickoff", "kickoff"]

_log = logging.getLogger("tether")

#: the run of the kickoff in progress (the crew's LLM and tools find it here)
_RUN: contextvars.ContextVar[Run | None] = contextvars.ContextVar("tether_crewai_run", default=None)
#: set on a tool function this module wrapped
_MARK = "__tether_guarded__"


def _current() -> Run:
    run = _RUN.get()
    if run is None:
        raise RunDocumentError(
            "a CrewAI agent guarded by tether called its model or a tool outside a guarded "
            "kickoff (tether.integrations.crewai.kickoff): it cannot go on unguarded"
        )
    return run


def _model_name(llm: Any) -> str:
    name = getattr(llm, "model", "")
    return name if isinstance(name, str) else ""


def _count(turn: ModelTurn, llm: Any, before: tuple[int, int, int, int]) -> None:
    """The call just made, as the tokens CrewAI's LLM added to its own tally (none: a call
    the LLM did not measure)."""
    usage = profile.usage(before, profile.tally(llm))
    if usage.prompt or usage.output_tokens:
        turn.record(usage)
    else:
        turn.record(unmeasured=True)


def _own(method: Any) -> Any:
    """The LLM's own call, without the rate-limit retries CrewAI wraps every ``BaseLLM``
    subclass's ``call``/``acall`` in (they sleep and ask again inside tether's attempt:
    two retry layers); tether's policy is the one layer."""
    if getattr(method, "_crewai_rate_limit_wrapped", False):
        return getattr(method, "__wrapped__", method)
    return method


class _GuardedLLM:
    """An agent's LLM object answering through the kickoff's run (installed on the object
    for the kickoff's time, removed after): each call one ``run.model_turn``, its attempts
    under the guard's retry policy (one layer: build the LLM with ``max_retries=0``)."""

    def __init__(self, llm: Any, policy: RetryPolicy) -> None:
        self.llm = llm
        self.policy = policy
        self.call = _own(type(llm).call).__get__(llm)
        self.acall = _own(type(llm).acall).__get__(llm)

    def _ends(self, run: Run, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
        """The run ends before this call: stopped, a CrewAI limit reached, or a budget."""
        if not within_limits(run):
            return True
        if asks_for_a_forced_answer(args, kwargs):
            run.halt(StopReason.MAX_STEPS, "a CrewAI agent used its max_iter without an answer")
            return True
        return not run.proceed()

    def guarded_call(self, *args: Any, **kwargs: Any) -> Any:
        run = _current()
        if self._ends(run, args, kwargs):
            return run.outcome.customer_message  # the final answer: the task's output
        before = profile.tally(self.llm)
        try:
            with run.model_turn(_model_name(self.llm)) as turn:
                answer = turn.call(self.call, *args, policy=self.policy, **kwargs)
                _count(turn, self.llm, before)
        except Stopped:  # a budget before the request, a failure after its attempts
            return run.outcome.customer_message
        return answer

    async def guarded_acall(self, *args: Any, **kwargs: Any) -> Any:
        run = _current()
        if self._ends(run, args, kwargs):
            return run.outcome.customer_message
        before = profile.tally(self.llm)
        try:
            async with run.amodel_turn(_model_name(self.llm)) as turn:
                answer = await turn.acall(self.acall, *args, policy=self.policy, **kwargs)
                _count(turn, self.llm, before)
        except Stopped:
            return run.outcome.customer_message
        return answer


def _tool_runner(name: str, fn: Callable[..., Any], options: dict[str, Any]) -> Callable[..., Any]:
    def guarded(*args: Any, **kwargs: Any) -> Any:
        run = _current()
        if args:  # CrewAI passes a tool's arguments by name; a positional one is its input
            kwargs = {**kwargs, "input": args[0] if len(args) == 1 else list(args)}
            call: Callable[..., Any] = lambda **a: fn(a.pop("input"), **a)  # noqa: E731
        else:
            call = fn
        if not within_limits(run):
            return f"stopped: {run.stopped.value if run.stopped else ''}"
        try:  # CrewAI runs a reply's calls in threads: the run admits each under its lock
            return run.call_tool(name, call, kwargs, **options)
        except ToolError as exc:
            return exc.model_message
        except Stopped as exc:  # the agent's next model call ends it with the customer message
            return f"stopped: {exc.reason.value}"

    setattr(guarded, _MARK, True)
    return guarded


def _atool_runner(name: str, fn: Callable[..., Any], options: dict[str, Any]) -> Callable[..., Any]:
    async def guarded(**kwargs: Any) -> Any:
        run = _current()
        if not within_limits(run):
            return f"stopped: {run.stopped.value if run.stopped else ''}"
        try:
            return await run.acall_tool(name, fn, kwargs, **options)
        except ToolError as exc:
            return exc.model_message
        except Stopped as exc:
            return f"stopped: {exc.reason.value}"

    setattr(guarded, _MARK, True)
    return guarded


def _overrides_arun(tool: Any) -> bool:
    from crewai.tools import BaseTool

    return getattr(type(tool), "_arun", None) is not BaseTool._arun


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)  # past pydantic's checks: an instance attribute


def _unset(obj: Any, name: str) -> None:
    obj.__dict__.pop(name, None)


@contextmanager
def _asking() -> Iterator[None]:
    """``human_input`` as a tether approval and a blocking tool hook as a stop, for the
    kickoff's time (see :mod:`tether.integrations._crewai_asks`)."""
    from crewai.core.providers.human_input import reset_provider, set_provider

    token = set_provider(AskThroughTether(_current))
    try:
        with watching_tool_hooks(_current):
            yield
    finally:
        reset_provider(token)


class TetherCrew:
    """tether's guards for a CrewAI crew: ``TetherCrew(guard, side_effects=[...]).kickoff(crew)``.

    ``side_effects`` names the non-idempotent tools (a mapping of tool name to its
    ``lookup``, or an iterable of names): they run at most once per request through the
    guard's ledger, whatever CrewAI retries. ``key`` names the request a kickoff serves
    (``guard.start(key=)``): a string, or a function of the crew and the inputs; default:
    the crew (``crewai:<crew.id>``), so a crew kicked off again, or a Flow step that runs
    the same crew again, pays nothing twice; pass your own request id when one Crew object
    serves many requests. ``hand_over``, ``timeouts``, ``requires_approval``, ``compensate``,
    ``labels`` and ``volatile`` (by tool name) are the options of ``run.call_tool``;
    ``scopes`` names the budget scopes each kickoff's run spends in.
    """

    def __init__(
        self,
        guard: Guard,
        side_effects: SideEffects = None,
        *,
        key: str | Callable[[Any, Mapping[str, Any] | None], str | None] | None = None,
        scopes: Sequence[str] | None = None,
        **rules: Unpack[ToolOptions],
    ) -> None:
        require_guard(guard)
        require_request_key(key)
        self.guard = guard
        self.key = key
        #: the budget scopes each kickoff's run spends in (``guard.start(scopes=...)``)
        self.scopes = scopes
        self.rules = ToolRules(side_effects, **rules)
        require_a_place_to_wait(guard, self.rules.needing_approval())
        self.side_effects = self.rules.side_effects
        #: the model calls' retries: one layer, tether's
        self._policy = guard.retry.replace(name="model")
        #: the outcome of the kickoff that ended last
        self.last_outcome: Outcome | None = None
        #: the CrewOutput of the kickoff that ended last (None when it raised)
        self.last_output: Any = None

    def _key(self, crew: Any, inputs: Mapping[str, Any] | None) -> str:
        if callable(self.key):
            key = self.key(crew, inputs)
            if key is not None and (not isinstance(key, str) or not key.strip()):
                raise ValueError(f"key(crew, inputs) must return a request id, got {key!r}")
            if key is not None:
                return key
        elif isinstance(self.key, str):
            return self.key
        return f"crewai:{crew.id}"

    def _start(
        self, crew: Any, inputs: Mapping[str, Any] | None, resume: str | None, flow: Any
    ) -> Run:
        tasks = list(getattr(crew, "tasks", None) or ())
        if any(getattr(t, "human_input", False) for t in tasks):
            require_a_place_to_wait(self.guard, [HUMAN_INPUT])
        first = str(getattr(tasks[0], "description", "")) if tasks else ""
        key = flow_key(flow) if flow is not None and self.key is None else None
        key = key or self._key(crew, inputs)
        run = None
        if resume is not None:
            run = self.guard.resume(resume)
        elif flow is not None:
            run = kept_run(self.guard, flow, key)
        if run is None:
            run = self.guard.start(task=first[:200], key=key, scopes=self.scopes)
        run.__enter__()
        return run

    @contextmanager
    def _guarding(self, crew: Any) -> Iterator[None]:
        """The crew's LLMs and tools answering through the run, for the kickoff's time."""
        llms: list[Any] = []
        tools: list[tuple[Any, tuple[str, Any]]] = []
        patched: list[tuple[Any, tuple[str, ...]]] = []  # objects given instance attributes
        try:
            for holder in [crew, *crew.agents]:
                controller = getattr(holder, "_rpm_controller", None)
                if controller is not None and "_wait_for_next_minute" not in controller.__dict__:
                    _set(controller, "_wait_for_next_minute", paced(controller, _current))
                    patched.append((controller, ("_wait_for_next_minute",)))
            for agent in crew.agents:
                if getattr(agent, "max_execution_time", None) is not None:
                    execute, aexecute = timed(agent, _current)
                    _set(agent, "_execute_with_timeout", execute)
                    _set(agent, "_aexecute_with_timeout", aexecute)
                    patched.append((agent, ("_execute_with_timeout", "_aexecute_with_timeout")))
                llm = getattr(agent, "llm", None)
                if llm is not None and not isinstance(llm, str) and "call" not in llm.__dict__:
                    guarded = _GuardedLLM(llm, self._policy)
                    _set(llm, "call", guarded.guarded_call)
                    _set(llm, "acall", guarded.guarded_acall)
                    llms.append(llm)
            holders = [*crew.agents, *crew.tasks]
            for tool in {
                id(t): t for h in holders for t in getattr(h, "tools", None) or ()
            }.values():
                if "_run" in tool.__dict__ or getattr(tool.__dict__.get("func"), _MARK, False):
                    continue  # already guarded (one tool object in two agents)
                name = str(tool.name)
                options = self.rules.options(name)
                func = tool.__dict__.get("func")
                if callable(func):  # a @tool function: its run, _run and structured form call it
                    wrap = _atool_runner if inspect.iscoroutinefunction(func) else _tool_runner
                    _set(tool, "func", wrap(name, func, options))
                    kept = ("func", func)
                else:  # a BaseTool subclass: run() calls _run(), arun() calls _arun()
                    _set(tool, "_run", _tool_runner(name, type(tool)._run.__get__(tool), options))
                    if _overrides_arun(tool):  # else CrewAI runs it by run(), not arun()
                        own_arun = type(tool)._arun.__get__(tool)
                        _set(tool, "_arun", _atool_runner(name, own_arun, options))
                    kept = ("_run", None)
                tools.append((tool, kept))
            with _asking():
                yield
        finally:
            for obj, names in patched:
                for name in names:
                    _unset(obj, name)
            for llm in llms:
                _unset(llm, "call")
                _unset(llm, "acall")
            for tool, (name, func) in tools:
                if name == "func":
                    _set(tool, "func", func)
                else:
                    _unset(tool, "_run")
                    _unset(tool, "_arun")

    def _end(self, run: Run, output: Any, exc: BaseException | None, flow: Any = None) -> Outcome:
        if flow is not None:  # the run as the crew left it: the Flow's next step continues it
            keep(flow, run)
        if exc is None and run.stopped is None:
            run.succeed(getattr(output, "raw", output))
        run.__exit__(None if exc is None else type(exc), exc, None)
        self.last_outcome = outcome = run.outcome
        self.last_output = output
        return outcome

    def kickoff(
        self,
        crew: Any,
        inputs: Mapping[str, Any] | None = None,
        *,
        resume: str | None = None,
        flow: Any = None,
    ) -> Outcome:
        """``crew.kickoff(inputs)`` as one tether run; its outcome (the CrewOutput is
        ``self.last_output``; when a guard stopped the run, its last task's output is the
        customer message). ``resume=outcome.checkpoint_id`` continues a run that paused (an
        approval decided): the crew runs again, its effects done once replayed. ``flow``:
        the Flow whose step this is (``flow=self``): its state holds the run and its state
        id is the request (:mod:`tether.integrations._crewai_flow`)."""
        _refuse_streaming(crew)
        run = self._start(crew, inputs, resume, flow)
        token = _RUN.set(run)
        output: Any = None
        try:
            with self._guarding(crew):
                output = crew.kickoff(inputs=dict(inputs) if inputs is not None else None)
        except Stopped:
            pass
        except BaseException as exc:
            self._end(run, None, exc, flow)
            raise
        finally:
            _RUN.reset(token)
        return self._end(run, output, None, flow)

    async def akickoff(
        self,
        crew: Any,
        inputs: Mapping[str, Any] | None = None,
        *,
        resume: str | None = None,
        flow: Any = None,
    ) -> Outcome:
        """The async form of :meth:`kickoff` (``crew.akickoff``)."""
        _refuse_streaming(crew)
        run = self._start(crew, inputs, resume, flow)
        token = _RUN.set(run)
        output: Any = None
        try:
            with self._guarding(crew):
                output = await crew.akickoff(inputs=dict(inputs) if inputs is not None else None)
        except Stopped:
            pass
        except BaseException as exc:
            self._end(run, None, exc, flow)
            raise
        finally:
            _RUN.reset(token)
        return self._end(run, output, None, flow)

    def stream(
        self,
        crew: Any,
        inputs: Mapping[str, Any] | None = None,
        *,
        resume: str | None = None,
        flow: Any = None,
    ) -> Iterator[Any]:
        """A ``Crew(stream=True)``'s kickoff as one tether run: CrewAI's chunks as it yields
        them; read to its end, the outcome is ``self.last_outcome`` (and the CrewOutput
        ``self.last_output``). A stream left unread to its end ends the run as an error."""
        _require_streaming(crew)
        run = self._start(crew, inputs, resume, flow)
        token = _RUN.set(run)
        output: Any = None
        try:
            with self._guarding(crew):
                streaming = crew.kickoff(inputs=dict(inputs) if inputs is not None else None)
                yield from streaming
                output = streaming.result
        except Stopped:
            pass
        except BaseException as exc:
            self._end(run, None, exc, flow)
            raise
        finally:
            _RUN.reset(token)
        self._end(run, output, None, flow)

    async def astream(
        self,
        crew: Any,
        inputs: Mapping[str, Any] | None = None,
        *,
        resume: str | None = None,
        flow: Any = None,
    ) -> AsyncIterator[Any]:
        """The async form of :meth:`stream` (``crew.akickoff`` with ``stream=True``)."""
        _require_streaming(crew)
        run = self._start(crew, inputs, resume, flow)
        token = _RUN.set(run)
        output: Any = None
        try:
            with self._guarding(crew):
                given = dict(inputs) if inputs is not None else None
                streaming = await crew.akickoff(inputs=given)
                async for chunk in streaming:
                    yield chunk
                output = streaming.result
        except Stopped:
            pass
        except BaseException as exc:
            self._end(run, None, exc, flow)
            raise
        finally:
            _RUN.reset(token)
        self._end(run, output, None, flow)


def _refuse_streaming(crew: Any) -> None:
    if getattr(crew, "stream", False):  # its kickoff returns before the crew runs
        raise ValueError("a Crew built with stream=True runs through stream()/astream()")


def _require_streaming(crew: Any) -> None:
    if not getattr(crew, "stream", False):
        raise ValueError("stream()/astream() run a Crew built with stream=True; use kickoff()")


def kickoff(
    crew: Any,
    inputs: Mapping[str, Any] | None = None,
    *,
    guard: Guard,
    side_effects: SideEffects = None,
    key: str | Callable[[Any, Mapping[str, Any] | None], str | None] | None = None,
    scopes: Sequence[str] | None = None,
    resume: str | None = None,
    flow: Any = None,
    **rules: Unpack[ToolOptions],
) -> Outcome:
    """``crew.kickoff(inputs)`` under ``guard``: see :class:`TetherCrew`."""
    crewed = TetherCrew(guard, side_effects, key=key, scopes=scopes, **rules)
    return crewed.kickoff(crew, inputs, resume=resume, flow=flow)


async def akickoff(
    crew: Any,
    inputs: Mapping[str, Any] | None = None,
    *,
    guard: Guard,
    side_effects: SideEffects = None,
    key: str | Callable[[Any, Mapping[str, Any] | None], str | None] | None = None,
    scopes: Sequence[str] | None = None,
    resume: str | None = None,
    flow: Any = None,
    **rules: Unpack[ToolOptions],
) -> Outcome:
    """``await crew.akickoff(inputs)`` under ``guard``: see :class:`TetherCrew`."""
    crewed = TetherCrew(guard, side_effects, key=key, scopes=scopes, **rules)
    return await crewed.akickoff(crew, inputs, resume=resume, flow=flow)
