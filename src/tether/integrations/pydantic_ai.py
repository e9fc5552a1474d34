"""PydanticAI under tether: ``await run(agent, prompt, guard=guard)``, or the capability.

:class:`TetherCapability` is a PydanticAI capability (the framework's extension point):
one tether run per agent run. Every model request is one step, checked before it is sent
(budgets, loops, the cost of the next request, a model a cost budget could not price) and
counted after it with the response's usage, priced by the guard's prices (genai-prices,
as PydanticAI itself does; a response that cannot be priced counts as *unpriced*, never
as free). Requests go through the provider's breaker, and a failed attempt is retried by
tether's policy (classification, backoff, ``Retry-After``, the run's time budget) through
``RetryModelRequest``. Every tool call goes through ``run.acall_tool``: loop checks, the
tool's timeout, retries at one layer, the ledger for the tools named in ``side_effects``.

When a guard stops the run, ``agent.run()`` raises :class:`RunStopped` carrying the
:class:`tether.Outcome` (stop reason, partial results, customer message, the messages so
far): an early end never goes through the agent's output validation, so a caller that
expects a typed output is never handed a value of another type. :func:`run` returns that
outcome instead of raising; ``UsageLimitExceeded`` and ``RunTimedOut`` become stop reasons.

PydanticAI's own contract holds: a tool's exception that tether does not retry goes on
unchanged (the run raises it, as without tether; the tether run ends ``PERMANENT_ERROR``),
``ModelRetry``, deferred tools and approvals reach the framework unchanged, and a run that
ends with PydanticAI's ``DeferredToolRequests`` is ``AWAITING_APPROVAL`` with those requests
as ``outcome.result``. A delegate agent run inside a tool call counts in that call's run
(:class:`Delegate`, or from PydanticAI's usage when it has no tether capability).
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

from tether import (
    Guard,
    ModelTurn,
    Outcome,
    Run,
    Stopped,
    StopReason,
    ToolError,
    UnknownModelError,
)
from tether._context import reset_if_here
from tether._errors import Picklable, require
from tether.classification._classify import programming_error
from tether.guards._tokens import estimate_tokens
from tether.integrations._common import (
    ModelRetries,
    SideEffects,
    ToolOptions,
    ToolRules,
    blocking,
    require_a_place_to_wait,
    require_guard,
    take_rules,
)
from tether.integrations._tokens import DEFAULT_MAX_OUTPUT
from tether.providers import pydantic_ai as profile
from tether.retries._policy import RetryPolicy

require("pydantic_ai", "pydantic-ai")

from pydantic_ai import (  # noqa: E402 - after the extra check
    Agent,
    ModelRetry,
    exceptions,
)
from pydantic_ai.capabilities import AbstractCapability  # noqa: E402
from pydantic_ai.messages import ToolCallPart  # noqa: E402
from pydantic_ai.tools import DeferredToolRequests  # noqa: E402

__all__ = ["Delegate", "RunStopped", "TetherCapability", "free_test_model", "run", "run_sync"]

_log = logging.getLogger("tether")

#: PydanticAI's control flow raised inside a tool call: tether records the failure of the
#: intent and hands the original back to the framework.
_CONTROL_FLOW = (
    exceptions.ToolRetryError,
    exceptions.CallDeferred,
    exceptions.ApprovalRequired,
    exceptions.SkipToolExecution,
    exceptions.ToolFailedError,
)
#: The run of the tool call in progress: a delegate agent called inside it joins that run.
_CALLER: contextvars.ContextVar[_Live | None] = contextvars.ContextVar(
    "tether_pydantic_ai_caller", default=None
)
#: What :func:`run` asks of the next run of an agent that carries its own capability
#: (``resume``, ``key``): set around that one ``agent.run`` call, so concurrent runs of one
#: capability each read their own.
_NEXT: contextvars.ContextVar[tuple[str | None, str | None] | None] = contextvars.ContextVar(
    "tether_pydantic_ai_next", default=None
)
#: What tether calls the model of a delegate's request it did not see (it has no price).
DELEGATED = "unknown model of a delegate agent"
#: Finished runs' outcomes kept for :meth:`TetherCapability.outcome` (the oldest go first).
KEPT_OUTCOMES = 256


class RunStopped(Picklable, Exception):
    """A guard ended a PydanticAI run early; ``outcome`` says why and what was done."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(f"tether stopped the run: {outcome.stopped_because.value}")
        self.outcome = outcome


class _Live:
    """One agent run's tether state (a delegate's shares its caller's run and rules)."""

    __slots__ = (
        "base",
        "counted",
        "delegate",
        "first",
        "messages",
        "permit",
        "policy",
        "raised",
        "retries",
        "rules",
        "run",
        "turns",
        "usage",
    )

    def __init__(
        self, run: Run, policy: RetryPolicy, rules: ToolRules, *, delegate: bool = False
    ) -> None:
        self.run = run
        self.policy = policy
        self.rules = rules
        self.delegate = delegate  # an agent run inside a tool call of ``run``
        self.messages: list[Any] = []  # the run's history (the list the graph appends to)
        # the breaker asked before the attempt in flight, and its permit
        self.permit: tuple[Any, str] | None = None
        self.retries = ModelRetries(policy, run)
        self.first = 1  # PydanticAI's attempt the request's count starts at (after a probe)
        self.turns: list[ModelTurn] = []  # the model turns of the requests in flight
        self.raised: list[BaseException] = []  # what the tools raised themselves
        # PydanticAI's RunUsage of the run (a delegate with usage=ctx.usage adds to it), its
        # totals when the run began, and what tether counted of it: (requests, in, out)
        self.usage: Any = None
        self.base = (0, 0, 0)
        self.counted = [0, 0, 0]

    def watch(self, usage: Any, counted: list[int] | None = None) -> None:
        self.usage = usage
        self.base = _totals(usage)
        if counted is not None:
            self.counted = counted  # shared with the caller: one RunUsage, one account

    def settle_delegated(self) -> None:
        """Count the requests that PydanticAI added to the run's usage and tether did not
        see: a delegate agent without tether's capability, run with ``usage=ctx.usage``.
        Their model is unknown: they count as unpriced (under a cost budget the run raises
        UnknownModelError, since the budget cannot hold)."""
        if self.usage is None:
            return
        now = _totals(self.usage)
        extra = [n - b - c for n, b, c in zip(now, self.base, self.counted, strict=True)]
        if extra[0] <= 0:
            return
        for i, value in enumerate(extra):
            self.counted[i] += max(0, value)
        n, tokens_in, tokens_out = extra[0], max(0, extra[1]), max(0, extra[2])
        try:
            for i in range(n):
                first = i == 0
                self.run.record_model_call(
                    model=DELEGATED,
                    input_tokens=tokens_in // n + (tokens_in % n if first else 0),
                    output_tokens=tokens_out // n + (tokens_out % n if first else 0),
                )
        except UnknownModelError:
            raise UnknownModelError(
                f"{n} model request(s) of a delegate agent (run in a tool with usage=ctx.usage) "
                "went past tether, so the cost budget cannot count them: give the delegate "
                "tether's capability, Agent(..., capabilities=[ta_pydantic.Delegate()])"
            ) from None


def _totals(usage: Any) -> tuple[int, int, int]:
    names = ("requests", "input_tokens", "output_tokens")
    requests, tokens_in, tokens_out = (int(getattr(usage, n, 0) or 0) for n in names)
    return requests, tokens_in, tokens_out


def free_test_model(model: Any) -> bool:
    """Whether ``model`` is one of PydanticAI's test models under its own name: a
    ``TestModel`` (``"test"``) or a ``FunctionModel`` (``"function:..."``) sends no request
    to a provider, so its requests cost nothing. Named after a real model
    (``FunctionModel(fn, model_name="gpt-6.1-terra")``) it is priced as that model."""
    system = getattr(model, "system", None)
    name = str(getattr(model, "model_name", "") or "")
    return (system == "test" and name == "test") or (
        system == "function" and name.startswith("function:")
    )


def _limit_reason(exc: exceptions.UsageLimitExceeded) -> StopReason:
    text = str(exc)
    if "request_limit" in text:
        return StopReason.MAX_MODEL_CALLS
    if "tool_calls_limit" in text:
        return StopReason.MAX_TOOL_CALLS
    if "cost_limit" in text:
        return StopReason.MAX_COST
    return StopReason.MAX_TOKENS


def _task(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt[:200]
    return " ".join(p for p in prompt or () if isinstance(p, str))[:200]


class TetherCapability(AbstractCapability[Any]):
    """tether's guards for a PydanticAI agent: ``Agent(model, capabilities=[...])``.

    ``side_effects`` names the non-idempotent tools (a mapping of tool name to its
    ``lookup``, or names); they run at most once per intent through the guard's ledger.
    Every other tool is treated as idempotent and retried through transient failures.
    ``timeouts`` gives tools a time limit per attempt; ``labels`` what the customer reads
    for each tool's effect (``{"issue_refund": "refund"}``).

    One instance serves concurrent runs (their state is keyed by PydanticAI's run id).
    After a run, :meth:`outcome` gives its :class:`tether.Outcome`.
    """

    def __init__(
        self,
        guard: Guard,
        side_effects: SideEffects = None,
        *,
        resume: str | None = None,
        key: str | None = None,
        scopes: Sequence[str] | None = None,
        **rules: Unpack[ToolOptions],
    ) -> None:
        require_guard(guard)
        self.guard = guard
        self.rules = ToolRules(side_effects, **rules)
        require_a_place_to_wait(guard, self.rules.needing_approval())
        self.side_effects = self.rules.side_effects
        self._resume = resume
        self._key = key
        #: the budget scopes each of its runs spends in (``guard.start(scopes=...)``)
        self.scopes = scopes
        self._policy = guard.retry.replace(name="model")
        self._live: dict[str, _Live] = {}
        self._outcomes: OrderedDict[str, Outcome] = OrderedDict()
        self._lock = threading.Lock()

    def outcome(self, run_id: str) -> Outcome | None:
        """The outcome of the finished PydanticAI run ``run_id`` (``result.run_id``)."""
        with self._lock:
            return self._outcomes.get(run_id)

    def _state(self, ctx: Any) -> _Live | None:
        with self._lock:
            return self._live.get(str(ctx.run_id))

    # --- the run ------------------------------------------------------------------------

    async def wrap_run(self, ctx: Any, *, handler: Any) -> Any:
        caller = _CALLER.get()
        if caller is not None:  # a delegate agent inside a tool call: it joins that run
            return await self._delegate(ctx, handler, caller)
        asked = _NEXT.get()
        if asked is not None:  # run() of an agent that carries this capability
            _NEXT.set(None)  # (an agent run inside this one asks nothing)
            resume, key = asked
        else:
            resume, self._resume = self._resume, None  # a checkpoint continues one run, once
            key, self._key = self._key, None  # and a request key names the next run
        if key is None:  # the run serves its conversation: a re-asked effect happens once
            key = _conversation(ctx)
        run = (
            self.guard.resume(resume)
            if resume
            else self.guard.start(task=_task(ctx.prompt), key=key, scopes=self.scopes)
        )
        run.__enter__()
        key = str(ctx.run_id)
        live = _Live(run, self._policy, self.rules)
        live.watch(ctx.usage)
        with self._lock:
            self._live[key] = live
        try:
            result = await handler()
        except BaseException:  # on_run_error ended it; else a cancellation: the run ends too
            if self._state(ctx) is not None:
                run.halt(StopReason.ERROR, "the agent run was cancelled")
                self._finish(key, run, self._messages(ctx))
            raise
        _settle_quietly(live)
        if isinstance(result.output, DeferredToolRequests):  # PydanticAI's own pause
            run.halt(StopReason.AWAITING_APPROVAL, _waiting_for(result.output))
            self._finish(key, run, result.all_messages(), result.output)
            return result
        run.succeed(result.output)
        self._finish(key, run, result.all_messages())
        return result

    async def _delegate(self, ctx: Any, handler: Any, caller: _Live) -> Any:
        """The agent run of a delegate: its model requests and tools count in the caller's
        run (budgets, loops, breaker, retries); the caller's run ends, not this one."""
        key = str(ctx.run_id)
        live = _Live(caller.run, caller.policy, caller.rules, delegate=True)
        if ctx.usage is caller.usage:  # usage=ctx.usage: what it counts is the caller's too
            live.watch(caller.usage, caller.counted)
            live.base = caller.base
        with self._lock:
            self._live[key] = live
        try:
            return await handler()
        finally:
            with self._lock:
                self._live.pop(key, None)

    async def on_run_error(self, ctx: Any, *, error: BaseException) -> Any:
        """The run body failed (or a guard stopped it): end the tether run, raise its outcome;
        a tool's own exception ends it too and goes on to the caller unchanged."""
        live = self._state(ctx)
        if live is None or not isinstance(error, Exception) or live.delegate:
            raise error
        run = live.run
        _settle_quietly(live)
        if any(error is raised for raised in live.raised):  # PydanticAI's contract: it raises
            run.note_error(error)
            run.halt(StopReason.PERMANENT_ERROR, f"a tool raised {type(error).__name__}")
            self._finish(str(ctx.run_id), run, self._messages(ctx))
            raise error
        if isinstance(error, Stopped):
            pass
        elif isinstance(error, exceptions.UsageLimitExceeded):
            run.halt(_limit_reason(error), f"PydanticAI usage limit: {error}")
        elif isinstance(error, exceptions.RunTimedOut):
            run.halt(StopReason.TIMEOUT, f"PydanticAI run timeout: {error}")
        elif isinstance(
            error, exceptions.UserError | UnknownModelError | Warning
        ):  # the caller's configuration (a warning its filters raise as an error too)
            run.note_error(error)
            run.halt(StopReason.ERROR, type(error).__name__)
            self._finish(str(ctx.run_id), run, self._messages(ctx))
            raise error
        elif programming_error(error):  # a bug (a bad call...): raised as it is, the run filed
            self._turn_failed(ctx, run, error)
            self._finish(str(ctx.run_id), run, self._messages(ctx))
            raise error
        else:  # the model failed after its retries, or misbehaved
            self._turn_failed(ctx, run, error)
        raise RunStopped(self._finish(str(ctx.run_id), run, self._messages(ctx))) from None

    def _turn_failed(self, ctx: Any, run: Run, error: BaseException) -> None:
        """The run stops for a model request that failed after its retries: through the
        request's model turn (a failure outside one: the run's own stop for it)."""
        live = self._state(ctx)
        turns = live.turns if live is not None else []
        if turns:
            turns.pop(0).fail(error)
            turns.clear()
        else:
            run.model_call_failed(error)

    def _messages(self, ctx: Any) -> list[Any]:
        live = self._state(ctx)
        return list(ctx.messages or (live.messages if live is not None else ()))

    def _finish(self, key: str, run: Run, messages: Any, paused: Any = None) -> Outcome:
        run.messages = list(messages or ())
        run.__exit__(None, None, None)
        outcome = run.outcome
        if paused is not None:  # what the caller answers to go on (DeferredToolRequests)
            outcome = dataclasses.replace(outcome, result=paused)
        with self._lock:
            self._live.pop(key, None)
            self._outcomes[key] = outcome
            while len(self._outcomes) > KEPT_OUTCOMES:
                self._outcomes.popitem(last=False)
        return outcome

    # --- model requests -----------------------------------------------------------------

    async def wrap_model_request(self, ctx: Any, *, request_context: Any, handler: Any) -> Any:
        live = self._state(ctx)
        if live is None:
            return await handler(request_context)
        run = live.run
        live.messages = ctx.messages
        live.settle_delegated()  # what delegates spent counts before the next request
        if run.stopped is not None or not run.proceed():
            assert run.stopped is not None
            raise Stopped(run.stopped, run.stop_detail)
        model = request_context.model
        if free_test_model(model):  # no provider: no price, no place in a token budget
            turn = run.amodel_turn()
        else:  # the request's place in the guard's token budget (a retry has it already)
            first = request_context.attempt <= 1
            turn = run.amodel_turn(
                str(getattr(model, "model_name", "") or ""),
                provider=_provider(model),
                estimate=_estimate(request_context) if first else None,
                max_output=_max_output(request_context),
            )
        live.turns.append(await turn.aopen())
        try:
            return await handler(request_context)
        except BaseException as exc:  # this attempt has no reply: its reservations go back
            if turn in live.turns:
                live.turns.remove(turn)
                turn.gave_way(exc)
            raise

    async def prepare_model_request(self, ctx: Any, request_context: Any) -> Any:
        """Each attempt asks the provider's breaker first (waiting for its next probe when
        the run's time allows)."""
        live = self._state(ctx)
        if live is None:
            return request_context
        model = request_context.model  # the guard's breaker of its provider (ModelTurn.breaker)
        name = str(getattr(model, "model_name", "") or "")
        breaker = live.run.model_turn(name, provider=_provider(model)).breaker

        async def acquire() -> None:
            live.permit = (breaker, await breaker._aacquire())

        await live.run.athrough_breaker(acquire)
        return request_context

    async def after_model_request(self, ctx: Any, *, request_context: Any, response: Any) -> Any:
        live = self._state(ctx)
        if live is None:
            return response
        await self._settle(live, None)
        model = response.model_name or str(getattr(request_context.model, "model_name", ""))
        usage = profile.usage(response, model)
        live.counted[0] += 1
        live.counted[1] += usage.prompt
        live.counted[2] += usage.output_tokens
        turn = live.turns.pop(0) if live.turns else live.run.model_turn(model)
        turn.record(
            usage,
            provider=response.provider_name or _provider(request_context.model),
            unmeasured=bool(getattr(response.usage, "unmeasured_requests", 0)),
            cost_usd=0.0 if free_test_model(request_context.model) else None,
        )
        return response

    async def on_model_request_error(
        self, ctx: Any, *, request_context: Any, error: Exception
    ) -> Any:
        live = self._state(ctx)
        if live is None:
            raise error
        verdict = live.policy.classifier(error)
        attempt = request_context.attempt
        if attempt <= 1:
            live.first = 1
        # a failure that left the provider's breaker open is tried again after the
        # breaker's wait (prepare_model_request), its attempts counted afresh, as a guarded
        # client's call does; past Guard(outage_wait=...) the run ends CIRCUIT_OPEN
        if await self._settle(live, verdict) and verdict.retryable:
            live.first = attempt + 1
            raise exceptions.RetryModelRequest()
        delay = live.retries.wait(verdict, attempt - live.first + 1)
        if delay is None:
            raise error
        await live.run.clock.asleep(delay)
        raise exceptions.RetryModelRequest()

    @staticmethod
    async def _settle(live: _Live, verdict: Any) -> bool:
        """Tell the breaker asked before this attempt how it went (None: a success); True
        when that left it open (the provider is down)."""
        if live.permit is None:
            return False
        breaker, permit = live.permit
        live.permit = None
        await breaker._arecord(permit, verdict)
        return breaker._refusal() is not None

    # --- tools --------------------------------------------------------------------------

    async def wrap_tool_execute(
        self, ctx: Any, *, call: Any, tool_def: Any, args: Any, handler: Any
    ) -> Any:
        live = self._state(ctx)
        if live is None:
            return await handler(args)
        name = str(call.tool_name)
        control: list[BaseException] = []
        raised: list[BaseException] = []

        async def attempt(**_: Any) -> Any:
            token = _CALLER.set(live)  # a delegate agent run in the tool joins this run
            try:
                return await handler(args)
            except _CONTROL_FLOW as exc:  # the framework's own signals: handed back below
                control.append(exc)
                raise ToolError(f"{name} asked the model to try again") from None
            except Exception as exc:
                raised.append(exc)
                raise
            finally:
                _CALLER.reset(token)

        arguments = dict(args) if isinstance(args, Mapping) else {"args": args}
        try:
            return await live.run.acall_tool(name, attempt, arguments, **live.rules.options(name))
        except ToolError as exc:
            if control:
                raise control[-1] from None
            cause = exc.__cause__
            if (
                cause is not None
                and exc.cause_kind == "rejected"
                and any(cause is r for r in raised)
                and not isinstance(cause, ToolError)
            ):
                # not retryable: the tool's exception goes on as without tether (the run raises)
                live.raised.append(cause)
                raise cause from None
            if raised or exc.cause_kind != "rejected" or isinstance(cause, ToolError):
                # the tool failed past tether's retries, or said why (ToolError): the model
                # reads it on PydanticAI's own retry path, never as a tool's result
                raise ModelRetry(exc.model_message) from None
            return exc.model_message  # a policy or a person refused the call before it ran
        except Stopped as exc:  # the next model request ends the run
            return f"stopped: {exc.reason.value}"


class Delegate(TetherCapability):
    """The capability of a delegate agent (one that a tool of a guarded agent runs, as
    PydanticAI's agent delegation does with ``usage=ctx.usage``): its runs inside a guarded
    tool call join that run, every model request counted, priced and budgeted there before
    it is sent; run anywhere else, it changes nothing.

    ``Agent(model, capabilities=[ta_pydantic.Delegate()])``; a :class:`TetherCapability`
    given to a delegate joins the caller's run in the same way.
    """

    def __init__(self) -> None:
        self._live = {}
        self._outcomes = OrderedDict()
        self._lock = threading.Lock()

    async def wrap_run(self, ctx: Any, *, handler: Any) -> Any:
        caller = _CALLER.get()
        if caller is None:
            return await handler()
        return await self._delegate(ctx, handler, caller)


def _conversation(ctx: Any) -> str | None:
    """The request of a run by default: PydanticAI's conversation. A run continuing a
    conversation (``message_history=``, a ``Conversation``) serves the conversation's
    request, so an effect re-asked in a later turn ("try again") happens once; a run
    inside a durable engine's workflow (DBOS, Temporal, Prefect) has a conversation id
    derived from its workflow, the same when the engine runs it again after a crash; a
    new run without history starts a new conversation, its own request."""
    conversation = getattr(ctx, "conversation_id", None)
    return f"pydantic-ai-conversation:{conversation}" if conversation else None


def _carried(agent: Agent[Any, Any]) -> TetherCapability | None:
    """The TetherCapability the agent was built with (a Delegate aside), if any."""
    found: list[TetherCapability] = []

    def visit(capability: Any) -> None:
        if isinstance(capability, TetherCapability) and not isinstance(capability, Delegate):
            found.append(capability)

    agent.root_capability.apply(visit)
    return found[0] if found else None


def _paused_request(history: Any) -> str | None:
    """The request of the run that paused on deferred tool calls: its PydanticAI run id."""
    for message in reversed(list(history or ())):
        run_id = getattr(message, "run_id", None)
        if getattr(message, "kind", None) == "response" and run_id:
            return f"pydantic-ai-run:{run_id}"
    return None


def _waiting_for(requests: Any) -> str:
    approvals = sorted({str(c.tool_name) for c in requests.approvals})
    calls = sorted({str(c.tool_name) for c in requests.calls})
    said = [f"approval of {', '.join(approvals)}"] if approvals else []
    said += [f"the result of {', '.join(calls)} (run elsewhere)"] if calls else []
    return "the agent waits for " + " and ".join(said)


def _settle_quietly(live: _Live) -> None:
    """At the end of a run: count what delegates spent (an unpriced call stays unpriced)."""
    try:
        live.settle_delegated()
    except UnknownModelError:
        pass


def _provider(model: Any) -> str | None:
    """The provider a model's requests go to (None for PydanticAI's function and test
    models, which send none: a name like ``gpt-6.1-terra`` says whose it stands for)."""
    system = getattr(model, "system", None)
    if not isinstance(system, str) or system in ("", "function", "test"):
        return None
    return system


def _estimate(request_context: Any) -> int:
    """The request's prompt in tokens, estimated (the token budget's reservation): its
    instructions, the text of its messages' parts, tool calls and returns, and its tools."""
    params = request_context.model_request_parameters
    said: list[Any] = [part.content for part in params.instruction_parts or ()]
    for message in request_context.messages:
        for part in message.parts:
            said.append(getattr(part, "content", None))
            if isinstance(part, ToolCallPart):
                said += [part.tool_name, part.args]
    tools = [*params.function_tools, *params.output_tools]
    said += [(t.name, t.description, t.parameters_json_schema) for t in tools]
    return estimate_tokens(*said)


def _max_output(request_context: Any) -> int:
    """The output the request may generate: its ``max_tokens`` setting, else the default
    that the guarded clients reserve for a request that names none."""
    limit = (request_context.model_settings or {}).get("max_tokens")
    return limit if isinstance(limit, int) and limit > 0 else DEFAULT_MAX_OUTPUT


async def run(
    agent: Agent[Any, Any],
    prompt: Any,
    *,
    guard: Guard,
    side_effects: SideEffects = None,
    resume: str | None = None,
    key: str | None = None,
    scopes: Sequence[str] | None = None,
    **agent_options: Any,
) -> Outcome:
    """Run ``agent`` on ``prompt`` under ``guard``; the :class:`tether.Outcome`.

    ``outcome.result`` is the agent's output when it finished (validated by PydanticAI),
    ``outcome.messages`` its messages (``all_messages()``; the ones so far when a guard
    stopped it). ``requires_approval`` and ``compensate`` (by tool name) are the governance
    options of ``run.call_tool``; ``resume=outcome.checkpoint_id`` continues a run that
    stopped (pass ``message_history=outcome.messages``); ``key`` names the request the run
    serves (``guard.start(task, key=...)``), ``scopes`` the budget scopes it spends in
    (``guard.start(task, scopes=...)``). Other keyword arguments go to ``agent.run``.
    A run that answers PydanticAI's deferred requests (``deferred_tool_results=`` with the
    paused run's ``message_history``) serves the paused run's request unless ``key`` says
    otherwise, so answering the same approval twice runs its effect once.
    """
    if not isinstance(agent, Agent):
        raise TypeError(f"agent must be a pydantic_ai.Agent, got {agent!r}")
    if key is None and agent_options.get("deferred_tool_results") is not None:
        key = _paused_request(agent_options.get("message_history"))
    rules = take_rules(agent_options)  # the tools' rules; the rest goes to agent.run
    carried = _carried(agent)
    token = None
    if carried is None:
        capability = TetherCapability(
            guard, side_effects, resume=resume, key=key, scopes=scopes, **rules
        )
        extra = list(agent_options.pop("capabilities", None) or ())
        agent_options["capabilities"] = [capability, *extra]
    else:  # built with its own (a durable engine refuses a capability added per run)
        if carried.guard is not guard or side_effects or rules or scopes is not None:
            raise ValueError(
                "this agent carries its own TetherCapability: call run() with that "
                "capability's guard and no side_effects, tool rules or scopes (they are the "
                "capability's), or build the agent without it"
            )
        capability = carried
        token = _NEXT.set((resume, key))
    try:
        result = await agent.run(prompt, **agent_options)
    except RunStopped as exc:
        return exc.outcome
    finally:
        if token is not None:
            reset_if_here(_NEXT, token)
    outcome = capability.outcome(str(result.run_id))
    assert outcome is not None
    return outcome


def run_sync(
    agent: Agent[Any, Any],
    prompt: Any,
    *,
    guard: Guard,
    side_effects: SideEffects = None,
    **options: Any,
) -> Outcome:
    """:func:`run` from synchronous code (not from inside a running event loop)."""
    return blocking(lambda: run(agent, prompt, guard=guard, side_effects=side_effects, **options))
