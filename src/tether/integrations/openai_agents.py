"""The OpenAI Agents SDK under tether: ``await run(agent, input, guard=guard)``.

One tether run per agent run. Every model call is one step, the calls of nested agents
(``as_tool``) and guardrail agents too: checked before it is sent (budgets, loops, the
cost of the next call, a model a cost budget could not price) in :class:`TetherHooks`'
``on_llm_start``, and counted with the response's usage in ``on_llm_end``. A guard's stop
raises :class:`GuardStopped` from that hook, so the SDK ends the run without another paid
request and attaches the items produced so far; :func:`run` turns that into an
:class:`AgentOutcome` (a :class:`tether.Outcome`). Every function tool and MCP tool of
every agent the run reaches (handoffs, bare or ``handoff()`` objects) goes through
``run.acall_tool``: loop checks, the tool's timeout, its breaker, retries at one layer,
the ledger for the tools named in ``side_effects``. Model calls are retried by the SDK's
runner under ``ModelSettings(retry=...)`` with tether's classification, backoff and
``Retry-After``, within the run's time budget.

The SDK's own signals stay the SDK's: a tool call that needs approval ends the run
``AWAITING_APPROVAL`` with the SDK's interruptions and ``to_state()`` (approve, then run
again from the state); a guardrail's tripwire is ``outcome.tripwire``; the agent a
conversation continues with is ``outcome.last_agent``. ``max_turns`` ends the run as
``StopReason.MAX_STEPS`` (never a ``MaxTurnsExceeded`` for the caller); without an explicit
``max_turns`` the guard's step budget sets it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, fields
from typing import Any, Unpack

from tether import Guard, Outcome, Run, Stopped, StopReason, UnknownModelError
from tether._errors import require
from tether.classification._classify import programming_error
from tether.integrations._arguments import same_arguments
from tether.integrations._common import (
    SideEffects,
    ToolOptions,
    ToolRules,
    blocking,
    require_a_place_to_wait,
    require_guard,
    take_rules,
)
from tether.redaction._redact import redact

require("agents", "openai-agents")

from agents import Agent, RunConfig, Runner, RunState  # noqa: E402 - after the extra check
from agents.exceptions import (  # noqa: E402
    InputGuardrailTripwireTriggered,
    MaxTurnsExceeded,
    OutputGuardrailTripwireTriggered,
    UserError,
)
from agents.items import ItemHelpers, ToolApprovalItem  # noqa: E402
from agents.run import DEFAULT_MAX_TURNS  # noqa: E402 - the SDK's own, when nothing sets one

from tether.integrations._agents_graph import (  # noqa: E402
    Guarding,
    guarded_tool,
    model_retry,
)
from tether.integrations._agents_hooks import (  # noqa: E402
    GuardStopped,
    TetherHooks,
    model_name,
)

__all__ = [
    "AgentOutcome",
    "AgentStream",
    "GuardStopped",
    "TetherHooks",
    "guard_tools",
    "model_retry",
    "run",
    "run_streamed",
    "run_sync",
]

_model_name = model_name  # the name the tests of model naming import


@dataclass(frozen=True, slots=True)
class AgentOutcome(Outcome):
    """A :class:`tether.Outcome` with what the SDK's ``RunResult`` gives a caller.

    ``messages`` is the conversation as the SDK's input items (``to_input_list()``): a list
    the next turn appends to. ``last_agent`` is the caller's agent the run ended in (the
    next turn starts there), ``new_items`` the SDK's items of this run, ``interruptions``
    the tool calls waiting for approval (``AWAITING_APPROVAL``), ``tripwire`` the SDK's
    guardrail exception when a guardrail refused the run (``REFUSED``).
    """

    messages: list[Any] = field(default_factory=list)
    last_agent: Any = None
    new_items: list[Any] = field(default_factory=list)
    interruptions: list[Any] = field(default_factory=list)
    tripwire: Exception | None = None
    #: the tether run at the pause, as plain data (JSON-able): keep it beside the SDK's
    #: state and pass it back as ``run(..., snapshot=...)`` to continue this run
    snapshot: dict[str, Any] | None = None
    _result: Any = field(default=None, repr=False, compare=False)

    def to_state(self) -> RunState[Any]:
        """The SDK's ``RunState`` of the run: approve or reject ``interruptions`` on it, store
        it (``to_json()``), and pass it as the ``input`` of the next :func:`run`."""
        if self._result is None:
            raise RuntimeError(
                f"run {self.run_id} ended ({self.stopped_because.value}) before the SDK "
                "returned a result: there is no RunState to resume; run again from "
                "outcome.messages"
            )
        state: RunState[Any] = self._result.to_state()
        return state


def guard_tools(
    tools: Iterable[Any],
    run: Run,
    side_effects: SideEffects | ToolRules = None,
    **options: Unpack[ToolOptions],
) -> list[Any]:
    """Copies of ``tools`` whose calls go through ``run`` (the originals are untouched).

    Function tools are guarded; hosted tools (web search, file search...) pass unchanged.
    ``side_effects`` names the non-idempotent tools (a mapping of name to ``lookup``, or
    names): they run at most once per intent through the guard's ledger. A tool's own
    ``timeout_seconds`` becomes tether's timeout for it (unless ``timeouts`` names one),
    so that one clock decides when an attempt is abandoned. ``requires_approval`` and
    ``compensate`` (by tool name) are the governance options of ``run.call_tool``;
    ``labels`` what the customer reads for each tool's effect (``{"issue_refund": "refund"}``);
    ``hand_over`` the tools whose call hands the customer to a person (the run ends
    ``"escalated"``, a case filed); ``volatile`` the argument paths the model fills anew
    (:class:`tether.integrations.ToolOptions`, the same in every adapter).
    """
    if not isinstance(run, Run):
        raise TypeError(f"guard_tools needs a tether Run (guard.start()), got {run!r}")
    rules = (
        side_effects if isinstance(side_effects, ToolRules) else ToolRules(side_effects, **options)
    )
    require_a_place_to_wait(run.guard, rules.needing_approval())
    return [guarded_tool(tool, run, rules) for tool in tools]


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


class _Session:
    """One call of :func:`run`, :func:`run_streamed` or :func:`run_sync` (its parameters are
    theirs): the checks made before any request, the guarded agent graph, and the
    translation of the SDK's ending into the run's."""

    def __init__(
        self,
        agent: Agent[Any],
        input: str | list[Any] | RunState[Any],
        *,
        guard: Guard,
        side_effects: SideEffects = None,
        resume: str | None = None,
        snapshot: Mapping[str, Any] | None = None,
        key: str | None = None,
        context: Any = None,
        max_turns: int | None = None,
        run_config: RunConfig | None = None,
        scopes: Sequence[str] | None = None,
        **options: Any,
    ) -> None:
        # the per-tool options (ToolOptions, the same in every adapter); the rest of the
        # keywords go to Runner.run
        rules = ToolRules(side_effects, **take_rules(options))
        require_guard(guard)
        if not isinstance(agent, Agent):
            raise TypeError(f"agent must be an agents.Agent, got {agent!r}")
        if "hooks" in options:
            raise TypeError(
                "run() owns the run hooks: subclass TetherHooks and call Runner.run "
                "yourself (see guard_tools) to add your own"
            )
        if resume is not None and snapshot is not None:
            raise TypeError(
                "give resume= (a checkpoint id) or snapshot= (outcome.snapshot), not both"
            )
        require_a_place_to_wait(guard, rules.needing_approval())
        self.agent, self.input, self.guard, self.rules = agent, input, guard, rules
        self.restore = snapshot
        self.paused_as: dict[str, Any] | None = None
        self.resume, self.key, self.run_config, self.context = resume, key, run_config, context
        self.scopes = scopes  # the budget scopes of a new run (guard.start(scopes=...))
        self.turns = _max_turns(guard, max_turns)
        self.options = options
        self.guarding: Guarding | None = None
        self.result: Any = None
        self.tripwire: Exception | None = None
        self.last_agent: Any = None
        self.items: list[Any] = []

    def start(self) -> AbstractContextManager[Run]:
        if self.resume:
            return self.guard.resume(self.resume)
        if self.restore is not None:
            return self.guard.restore(self.restore)
        original = getattr(self.input, "_original_input", self.input)  # a RunState: its input
        key = self.key or self.conversation()
        return self.guard.start(task=_task(original), key=key, scopes=self.scopes)

    def conversation(self) -> str | None:
        """The request of a run given no ``key=``: the SDK's conversation (its ``session``,
        else the server-side ``conversation_id``), so an effect re-asked in a later turn of
        the same conversation ("try again") happens once; a run outside one is its own."""
        session_id = getattr(self.options.get("session"), "session_id", None)
        if isinstance(session_id, str) and session_id:
            return f"agents-session:{session_id}"
        conversation = self.options.get("conversation_id")
        if isinstance(conversation, str) and conversation:
            return f"agents-conversation:{conversation}"
        return None

    async def prepare(self, run: Run) -> tuple[Any, Any, dict[str, Any]]:
        """The guarded starting agent, the SDK's input and the keyword arguments of the
        runner's call."""
        policy = self.guard.retry.replace(name="model", clock=run.clock)
        guarding = self.guarding = Guarding(run, self.rules, policy)
        agent = guarding.agent(self.agent)
        configured = getattr(self.run_config, "model", None)
        hooks = TetherHooks(run, model=model_name(None, self.run_config) if configured else None)
        hooks.nested = guarding.agent
        sdk_input = self.input
        if isinstance(sdk_input, RunState):
            sdk_input = await _rebound(sdk_input, agent, self.context)
        kwargs = {
            "context": self.context,
            "max_turns": self.turns,
            "hooks": hooks,
            "run_config": self.run_config,
            **self.options,
        }
        return agent, sdk_input, kwargs

    def finished(self, run: Run, result: Any) -> None:
        """The SDK returned: the run succeeded, or waits for an approval."""
        self.result, self.items = result, list(result.new_items)
        self.last_agent = result.last_agent
        run.messages = result.to_input_list()
        if result.interruptions:
            self.paused_as = run.snapshot()  # before the stop: the run goes on after the pause
            names = ", ".join(sorted({str(i.name) for i in result.interruptions}))
            raise run.halt(StopReason.AWAITING_APPROVAL, f"the agent waits for approval of {names}")
        run.succeed(result.final_output)

    def failed(self, run: Run, exc: BaseException) -> None:
        """The SDK raised: the run's stop for it (raises Stopped), or the caller's error."""
        data = getattr(exc, "run_data", None)
        if data is not None:
            self.items, self.last_agent = list(data.new_items), data.last_agent
            run.messages = [
                *ItemHelpers.input_to_new_input_list(self._sdk_input(data)),
                *(i.to_input_item() for i in data.new_items if not isinstance(i, ToolApprovalItem)),
            ]
        if isinstance(exc, GuardStopped):
            raise Stopped(exc.reason, exc.detail) from None
        if isinstance(exc, MaxTurnsExceeded):
            raise run.halt(
                StopReason.MAX_STEPS,
                f"the agent used its max_turns ({self.turns}) without an answer",
            ) from None
        if isinstance(exc, InputGuardrailTripwireTriggered | OutputGuardrailTripwireTriggered):
            self.tripwire = exc
            guardrail = exc.guardrail_result.guardrail
            name = getattr(guardrail, "get_name", lambda: type(guardrail).__name__)()
            raise run.halt(StopReason.REFUSED, f"guardrail {name} tripped") from None
        if isinstance(exc, Warning):  # the caller's warnings filter raised it: the run ends
            run.model_call_failed(exc)  # ERROR and the warning itself is raised
        if isinstance(exc, UserError | UnknownModelError | Stopped) or not isinstance(
            exc, Exception
        ):
            raise exc  # the caller's configuration (fix it), or a cancellation
        if programming_error(exc):  # a bug (a bad call...): raised as it is, the run ended
            run.model_call_failed(exc)
            raise exc
        raise run.model_call_failed(exc) from None  # the model failed after its retries

    def _sdk_input(self, data: Any) -> Any:
        given = getattr(data, "input", None)
        return given if given is not None else getattr(self.input, "_original_input", self.input)

    def outcome(self, run: Run) -> AgentOutcome:
        base = run.outcome
        guarding = self.guarding
        last = self.last_agent if guarding is None else guarding.original(self.last_agent)
        waiting = list(self.result.interruptions) if self.result is not None else []
        values = {f.name: getattr(base, f.name) for f in fields(Outcome)}
        values["messages"] = list(base.messages)
        if waiting and values["pending_approval"] is None:
            values["pending_approval"] = _pending(waiting)
        return AgentOutcome(
            **values,
            last_agent=last if last is not None else self.agent,
            new_items=self.items,
            interruptions=waiting,
            tripwire=self.tripwire,
            snapshot=self.paused_as,
            _result=self.result,
        )


async def _rebound(state: RunState[Any], agent: Agent[Any], context: Any) -> RunState[Any]:
    """``state`` on tether's copies of its agents (their tools under the run), with the
    state's own application context, and each decision the caller made on it (approve or
    reject, by tool call) made again on the copy.

    The SDK binds a decision to the agent object it was made with, so the caller's
    decisions on their own agents would not apply to tether's copies; they are carried
    over call by call, never by tool name alone."""
    wrapper = state._context  # the SDK keeps the state's context and decisions here
    if context is None and wrapper is not None:
        context = wrapper.context
    rebound = await RunState.from_json(agent, state.to_json(), context_override=context)
    if wrapper is None:
        return rebound
    for item in rebound.get_interruptions():
        name, call_id = item.name, item.call_id
        if not name or not call_id:
            continue
        decided = wrapper.is_tool_approved(name, call_id)
        if decided is True:
            rebound.approve(item)
        elif decided is False:
            why = wrapper.get_rejection_message(name, call_id, existing_pending=item)
            rebound.reject(item, rejection_message=why)
    return rebound


def _pending(waiting: list[Any]) -> dict[str, Any]:
    """``outcome.pending_approval`` for the SDK's interruptions: the first call's tool and
    (redacted) arguments, and every call waiting."""
    calls = []
    for item in waiting:
        try:
            args = json.loads(item.arguments or "{}")
        except ValueError:
            args = {"arguments": item.arguments}
        calls.append(
            {
                "tool": str(item.name),
                "args": redact(args),
                "call_id": getattr(item.raw_item, "call_id", None)
                if not isinstance(item.raw_item, Mapping)
                else item.raw_item.get("call_id"),
            }
        )
    return {**calls[0], "calls": calls}


@same_arguments(_Session)
async def run(agent: Agent[Any], input: Any, **options: Any) -> AgentOutcome:
    """Run ``agent`` on ``input`` under ``guard``; the :class:`AgentOutcome`.

    ``input`` is what ``Runner.run`` takes: text, input items (``outcome.messages`` of the
    last turn, with the customer's next message appended), or the SDK's ``RunState``
    (``outcome.to_state()`` after its interruptions were approved or rejected).
    ``outcome.result`` is the agent's ``final_output`` when it finished.
    ``requires_approval`` and ``compensate`` (by tool name) are the governance options of
    ``run.call_tool``; ``resume=outcome.checkpoint_id`` continues a run that stopped, and
    ``snapshot=outcome.snapshot`` (plain data, no store needed) a run paused for the SDK's
    approvals, given its state as ``input``; ``key`` names the request the run serves
    (``guard.start(task, key=...)``; by default the conversation: the ``session``, else the
    ``conversation_id``, else the run alone); ``scopes`` names the budget scopes the run
    spends in (``guard.start(task, scopes=...)``). Other keyword arguments go to ``Runner.run``.
    """
    session = _Session(agent, input, **options)
    with session.start() as tether_run:
        guarded, sdk_input, kwargs = await session.prepare(tether_run)
        try:
            result = await Runner.run(guarded, sdk_input, **kwargs)
        except BaseException as exc:
            session.failed(tether_run, exc)
        else:
            session.finished(tether_run, result)
    return session.outcome(tether_run)


class AgentStream:
    """A streamed :func:`run`: ``async for event in stream.stream_events()`` gives the SDK's
    stream events while tether guards the run; ``stream.outcome`` is its
    :class:`AgentOutcome` once the events are read (a guard's stop ends the stream, it
    raises nothing)."""

    def __init__(self, session: _Session) -> None:
        self._session = session
        self._outcome: AgentOutcome | None = None
        self._read = False
        #: the SDK's ``RunResultStreaming`` while the run streams
        self.result: Any = None

    @property
    def outcome(self) -> AgentOutcome:
        if self._outcome is None:
            raise RuntimeError(
                "the run has not ended: read stream.stream_events() to its end first"
            )
        return self._outcome

    async def stream_events(self) -> AsyncIterator[Any]:
        """The SDK's stream events of the run, read once."""
        if self._read:
            raise RuntimeError("stream_events() reads a run once")
        self._read = True
        session = self._session
        with session.start() as tether_run:
            guarded, sdk_input, kwargs = await session.prepare(tether_run)
            streamed = self.result = Runner.run_streamed(guarded, sdk_input, **kwargs)
            try:
                async for event in streamed.stream_events():
                    yield event
            except GeneratorExit:  # the caller stopped reading: so does the run
                streamed.cancel()
                tether_run.halt(StopReason.FAILED, "the caller stopped reading the stream")
            except BaseException as exc:
                session.failed(tether_run, exc)
            else:
                session.finished(tether_run, streamed)
        self._outcome = session.outcome(tether_run)


@same_arguments(_Session)
def run_streamed(agent: Agent[Any], input: Any, **options: Any) -> AgentStream:
    """:func:`run` as ``Runner.run_streamed``: the same arguments, checked at once; read
    ``stream_events()``, then ``stream.outcome``."""
    return AgentStream(_Session(agent, input, **options))


@same_arguments(_Session)
def run_sync(agent: Agent[Any], input: Any, **options: Any) -> AgentOutcome:
    """:func:`run` from synchronous code (not from inside a running event loop)."""
    return blocking(lambda: run(agent, input, **options))
