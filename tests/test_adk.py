"""Google ADK agents under tether's plugin, driven by a scripted ``BaseLlm`` (ADK's own model
interface, as ADK's tests script theirs)."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.agents.run_config import RunConfig
from google.adk.apps import App, ResumabilityConfig
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.runners import InMemoryRunner, Runner
from google.adk.sessions import InMemorySessionService
from google.adk.tools.agent_tool import AgentTool
from google.adk.tools.function_tool import FunctionTool
from google.adk.tools.tool_context import ToolContext
from google.genai import types

from tether import Budget, Guard, Price, PriceTable, RetryPolicy, StopReason
from tether.integrations.adk import STATE_KEY, TetherPlugin

MODEL = "gemini-2.5-flash"
PRICES = PriceTable({MODEL: Price(input=0.30, output=2.50, cache_read=0.03)})


def usage() -> types.GenerateContentResponseUsageMetadata:
    return types.GenerateContentResponseUsageMetadata(
        prompt_token_count=1000,
        cached_content_token_count=400,
        candidates_token_count=80,
        thoughts_token_count=20,
    )


def call(name: str, args: dict[str, Any], i: int = 0) -> types.Part:
    return types.Part(function_call=types.FunctionCall(name=name, args=args, id=f"c{i}-{name}"))


def reply(*parts: types.Part, text: str = "") -> LlmResponse:
    said = [types.Part(text=text)] if text else []
    return LlmResponse(
        content=types.Content(role="model", parts=[*said, *parts]), usage_metadata=usage()
    )


class Scripted(BaseLlm):  # type: ignore[misc]
    """A model that answers from a script: ``script(i)`` is its i-th reply."""

    model: str = MODEL
    script: Any = None
    calls: int = 0

    async def generate_content_async(
        self, llm_request: Any, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.calls += 1
        yield self.script(self.calls - 1)


def scripted(replies: Callable[[int], LlmResponse] | list[LlmResponse]) -> Scripted:
    if isinstance(replies, list):
        listed = replies
        return Scripted(script=lambda i: listed[i])
    return Scripted(script=replies)


def guard(**budget: Any) -> Guard:
    return Guard(
        budget=Budget(max_steps=40, **budget), prices=PRICES, retry=RetryPolicy(base=0.001)
    )


async def drive(
    agent: LlmAgent,
    plugins: list[Any],
    text: str = "find invoice 99",
    run_config: RunConfig | None = None,
    **config: Any,
) -> list[Any]:
    runner = InMemoryRunner(app=App(name="shop", root_agent=agent, plugins=plugins))
    session = await runner.session_service.create_session(app_name="shop", user_id="u")
    message = types.Content(role="user", parts=[types.Part(text=text)])
    events = []
    async for event in runner.run_async(
        user_id="u",
        session_id=session.id,
        new_message=message,
        run_config=run_config or RunConfig(**config),
    ):
        events.append(event)
    return events


def drive_sync(
    agent: LlmAgent,
    plugins: list[Any],
    text: str = "find invoice 99",
    run_config: RunConfig | None = None,
) -> list[Any]:
    """ADK's sync shell: ``Runner.run`` (the async runner on a thread of its own)."""
    runner = InMemoryRunner(app=App(name="shop", root_agent=agent, plugins=plugins))
    session = asyncio.run(runner.session_service.create_session(app_name="shop", user_id="u"))
    message = types.Content(role="user", parts=[types.Part(text=text)])
    return list(
        runner.run(user_id="u", session_id=session.id, new_message=message, run_config=run_config)
    )


def last_text(events: list[Any]) -> str:
    for event in reversed(events):
        parts = event.content.parts if event.content else []
        texts = [p.text for p in parts or [] if p.text]
        if texts:
            return "".join(texts)
    return ""


SHELLS = {"async": lambda *a: asyncio.run(drive(*a)), "sync": drive_sync}


def search_agent() -> tuple[LlmAgent, Scripted, list[str]]:
    searched: list[str] = []

    def search(query: str) -> str:
        """Search invoices."""
        searched.append(query)
        return "no result"

    model = scripted(lambda i: reply(call("search", {"query": "invoice 99"}, i)))
    return LlmAgent(name="clerk", model=model, tools=[search]), model, searched


@pytest.mark.parametrize("shell", SHELLS)
def test_a_repeated_call_is_stopped_with_the_customer_message(shell: str) -> None:
    agent, model, searched = search_agent()
    plugin = TetherPlugin(guard())
    events = SHELLS[shell](agent, [plugin])
    outcome = plugin.last_outcome
    assert outcome is not None
    assert outcome.stopped_because is StopReason.REPEATED_ACTION
    assert len(searched) <= 3
    assert model.calls == len(searched) + 1  # the next model call is never made
    assert last_text(events) == outcome.customer_message
    assert outcome.usage.model_calls == model.calls  # every call counted, the stop paid nothing
    assert plugin.outcome(events[-1].invocation_id) is outcome


def test_alone_the_same_call_runs_until_max_llm_calls() -> None:
    from google.adk.agents.invocation_context import LlmCallsLimitExceededError

    agent, _, searched = search_agent()
    with pytest.raises(LlmCallsLimitExceededError):
        asyncio.run(drive(agent, [], max_llm_calls=40))
    assert len(searched) == 40


def refund_agent(
    payments: dict[str, Any], times_out: bool = True
) -> tuple[LlmAgent, Callable[[str], Any]]:
    def issue_refund(order: str, amount: float, request_id: str) -> dict[str, Any]:
        """Refund an order."""
        payments[request_id] = {"order": order, "amount": amount}
        if times_out:
            raise TimeoutError("read timed out")  # the refund commits; the reply is lost
        return {"refund": request_id}

    def lookup(key: str) -> Any:
        return next(iter(payments.values()), None)

    def refund(i: int) -> types.Part:
        return call(
            "issue_refund", {"order": "A-1", "amount": 49.9, "request_id": uuid.uuid4().hex}, i
        )

    model = scripted([reply(refund(0)), reply(refund(1)), reply(text="Your refund is on its way.")])
    return LlmAgent(name="clerk", model=model, tools=[issue_refund]), lookup


@pytest.mark.parametrize("shell", SHELLS)
def test_a_timed_out_write_reissued_pays_once(shell: str) -> None:
    payments: dict[str, Any] = {}
    agent, lookup = refund_agent(payments)
    plugin = TetherPlugin(guard(), side_effects={"issue_refund": lookup})
    events = SHELLS[shell](agent, [plugin], "refund order A-1")
    assert len(payments) == 1
    outcome = plugin.last_outcome
    assert outcome is not None and outcome.stopped_because is StopReason.GOAL_REACHED
    assert last_text(events) == "Your refund is on its way." == outcome.result


def test_alone_a_reissued_write_pays_twice() -> None:
    payments: dict[str, Any] = {}
    agent, _ = refund_agent(payments, times_out=False)
    asyncio.run(drive(agent, [], "refund order A-1"))
    assert len(payments) == 2


@pytest.mark.parametrize("shell", SHELLS)
def test_a_budget_stop_ends_with_the_customer_message(shell: str) -> None:
    looked: list[str] = []

    def lookup_order(order: str) -> str:
        """Find an order."""
        looked.append(order)
        return "found"

    model = scripted(lambda i: reply(call("lookup_order", {"order": f"A-{i}"}, i)))
    plugin = TetherPlugin(guard(max_model_calls=3))
    events = SHELLS[shell](LlmAgent(name="clerk", model=model, tools=[lookup_order]), [plugin])
    outcome = plugin.last_outcome
    assert outcome is not None and outcome.stopped_because is StopReason.MAX_MODEL_CALLS
    assert model.calls == 3 and len(looked) == 3
    assert last_text(events) == outcome.customer_message
    # Gemini's usage: prompt minus cached, candidates plus thoughts, cached read; priced
    assert outcome.usage.input_tokens == 3 * 600 and outcome.usage.cache_read_tokens == 3 * 400
    assert outcome.usage.output_tokens == 3 * 100
    expected = 3 * (600 * 0.30 + 100 * 2.50 + 400 * 0.03) / 1e6
    assert outcome.usage.cost_usd == pytest.approx(expected)


#: ADK's own AgentTool builds its Runner with the deprecated ``plugins=`` (ADK's warning)
AGENT_TOOL = pytest.mark.filterwarnings("ignore:The `plugins` argument is deprecated")


@AGENT_TOOL
def test_a_sub_agent_as_a_tool_counts_in_the_same_run() -> None:
    asked: list[int] = []  # ADK runs a copy of the sub-agent (and of its model)
    child_model = scripted(lambda i: asked.append(i) or reply(text="invoice 99 is paid"))
    child = LlmAgent(name="billing", model=child_model, description="Answers billing questions.")
    parent_model = scripted(
        [reply(call("billing", {"request": "invoice 99"})), reply(text="It is paid.")]
    )
    parent = LlmAgent(name="clerk", model=parent_model, tools=[AgentTool(agent=child)])
    plugin = TetherPlugin(guard())
    events = asyncio.run(drive(parent, [plugin]))
    outcome = plugin.last_outcome
    assert outcome is not None and outcome.stopped_because is StopReason.GOAL_REACHED
    assert len(asked) == 1 and parent_model.calls == 2
    assert outcome.usage.model_calls == 3 and outcome.usage.tool_calls == 1
    assert last_text(events) == "It is paid."


@AGENT_TOOL
def test_a_sub_agent_called_in_a_loop_is_stopped() -> None:
    asked: list[int] = []
    child_model = scripted(lambda i: asked.append(i) or reply(text="no idea"))
    child = LlmAgent(name="billing", model=child_model, description="Answers billing questions.")
    parent_model = scripted(lambda i: reply(call("billing", {"request": "invoice 99"}, i)))
    parent = LlmAgent(name="clerk", model=parent_model, tools=[AgentTool(agent=child)])
    plugin = TetherPlugin(guard())
    events = asyncio.run(drive(parent, [plugin]))
    outcome = plugin.last_outcome
    assert outcome is not None and outcome.stopped_because is StopReason.REPEATED_ACTION
    assert 1 <= len(asked) <= 3
    assert last_text(events) == outcome.customer_message


def test_parallel_tool_calls_are_each_counted() -> None:
    looked: list[str] = []

    def lookup_order(order: str) -> str:
        """Find an order."""
        looked.append(order)
        return "found"

    model = scripted(
        [
            reply(*(call("lookup_order", {"order": f"A-{n}"}, n) for n in range(3))),
            reply(text="All three found."),
        ]
    )
    plugin = TetherPlugin(guard(max_tool_calls=2))
    asyncio.run(drive(LlmAgent(name="clerk", model=model, tools=[lookup_order]), [plugin]))
    outcome = plugin.last_outcome
    assert outcome is not None
    assert outcome.stopped_because is StopReason.MAX_TOOL_CALLS
    assert len(looked) == 2 and model.calls == 1


def test_the_run_is_kept_in_the_session_state() -> None:
    agent, _, _ = search_agent()
    plugin = TetherPlugin(guard())
    runner = InMemoryRunner(app=App(name="shop", root_agent=agent, plugins=[plugin]))

    async def go() -> Any:
        session = await runner.session_service.create_session(app_name="shop", user_id="u")
        message = types.Content(role="user", parts=[types.Part(text="find invoice 99")])
        async for _ in runner.run_async(user_id="u", session_id=session.id, new_message=message):
            pass
        return await runner.session_service.get_session(
            app_name="shop", user_id="u", session_id=session.id
        )

    session = asyncio.run(go())
    doc = session.state[STATE_KEY]
    assert doc["run_id"] == plugin.last_outcome.run_id  # type: ignore[union-attr]
    assert doc["model_calls"] >= 1


def test_a_model_error_is_classified() -> None:
    class Down(BaseLlm):  # type: ignore[misc]
        model: str = MODEL

        async def generate_content_async(
            self, llm_request: Any, stream: bool = False
        ) -> AsyncGenerator[LlmResponse, None]:
            raise ValueError("400 INVALID_ARGUMENT: the request is malformed")
            yield  # pragma: no cover

    plugin = TetherPlugin(guard())
    events = asyncio.run(drive(LlmAgent(name="clerk", model=Down()), [plugin]))
    outcome = plugin.last_outcome
    assert outcome is not None
    assert outcome.stopped_because in (StopReason.PERMANENT_ERROR, StopReason.ERROR)
    assert last_text(events) == outcome.customer_message


def test_the_plugin_refuses_what_it_cannot_use() -> None:
    with pytest.raises(TypeError):
        TetherPlugin("not a guard")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        TetherPlugin(guard(), hand_over="transfer")  # type: ignore[arg-type]


_ = (itertools, Iterator)


def test_a_tool_that_requires_confirmation_needs_a_place_to_wait() -> None:
    """A tool declared with ADK's ``require_confirmation`` is a tether approval: under a
    guard with nowhere to keep a paused run, the call is refused (naming the fix) before it
    runs, never left to ADK's gate alone."""

    paid: list[str] = []

    def issue_refund(order: str) -> str:
        """Refund an order."""
        paid.append(order)
        return "refunded"

    model = scripted([reply(call("issue_refund", {"order": "A-1"})), reply(text="Asked.")])
    agent = LlmAgent(
        name="clerk",
        model=model,
        tools=[FunctionTool(issue_refund, require_confirmation=True)],
    )
    plugin = TetherPlugin(guard(), side_effects=["issue_refund"])
    with pytest.raises((ValueError, RuntimeError), match="nowhere to wait"):
        asyncio.run(drive(agent, [plugin], "refund A-1"))
    assert paid == []


@pytest.mark.parametrize("shell", SHELLS)
def test_a_spent_budget_scope_pauses_the_invocation(shell: str) -> None:
    """TetherPlugin(guard, scopes=...): the tenant's scope allows 3 model calls; the 4th is
    never sent, the run is paused BUDGET_REACHED and the agent ends with the message."""
    from tether import BudgetScopes, Checkpoints, LoopPolicy

    looked: list[str] = []

    def lookup_order(order: str) -> str:
        """Find an order."""
        looked.append(order)
        return "found"

    scopes = BudgetScopes()
    scopes.limit("tenant:acme", max_model_calls=3)
    tethered = Guard(
        scopes=scopes, prices=PRICES, loops=LoopPolicy(max_repeats=None),
        checkpoints=Checkpoints.memory(),
    )  # fmt: skip
    model = scripted(lambda i: reply(call("lookup_order", {"order": f"A-{i}"}, i)))
    plugin = TetherPlugin(tethered, scopes=("tenant:acme",))
    events = SHELLS[shell](LlmAgent(name="clerk", model=model, tools=[lookup_order]), [plugin])
    outcome = plugin.last_outcome
    assert outcome is not None
    assert (outcome.status, outcome.stopped_because) == ("paused", StopReason.BUDGET_REACHED)
    assert model.calls == 3 and scopes.spent("tenant:acme").model_calls == 3
    assert last_text(events) == outcome.customer_message


def pages_agent() -> tuple[LlmAgent, Scripted, list[str]]:
    looked: list[str] = []

    def lookup_order(order: str) -> str:
        """Find an order."""
        looked.append(order)
        return "found"

    model = scripted(lambda i: reply(call("lookup_order", {"order": f"A-{i}"}, i)))
    return LlmAgent(name="clerk", model=model, tools=[lookup_order]), model, looked


@pytest.mark.parametrize(("max_llm_calls", "max_model_calls"), [(3, 10), (10, 3)])
@pytest.mark.parametrize("shell", ["async", "sync"])
def test_adk_max_llm_calls_and_the_budget_whichever_is_lower_ends_the_run(
    shell: str, max_llm_calls: int, max_model_calls: int
) -> None:
    """RunConfig(max_llm_calls=N) beside Budget(max_model_calls=M): the lower stops the agent
    after exactly that many calls, honestly: MAX_MODEL_CALLS with the customer message, no
    call reserved and left unsent, no LlmCallsLimitExceededError out of the Runner."""
    agent, model, looked = pages_agent()
    plugin = TetherPlugin(guard(max_model_calls=max_model_calls))
    config = RunConfig(max_llm_calls=max_llm_calls)
    if shell == "async":
        events = asyncio.run(drive(agent, [plugin], "find the orders", run_config=config))
    else:
        events = drive_sync(agent, [plugin], "find the orders", run_config=config)
    outcome = plugin.last_outcome
    assert outcome is not None
    assert (outcome.status, outcome.stopped_because) == ("partial", StopReason.MAX_MODEL_CALLS)
    assert model.calls == 3 == outcome.usage.model_calls == len(looked)
    assert last_text(events) == outcome.customer_message


class Overloaded(Exception):
    status_code = 503


@pytest.mark.parametrize("shell", SHELLS)
def test_a_transient_model_error_is_retried_by_the_run(shell: str) -> None:
    """ADK makes one attempt per model call; under the plugin a 503 is retried by the run's
    policy (one layer) and the agent goes on: the answer, 2 requests for 1 counted call."""
    asked: list[int] = []

    class Flaky(BaseLlm):  # type: ignore[misc]
        model: str = MODEL

        async def generate_content_async(
            self, llm_request: Any, stream: bool = False
        ) -> AsyncGenerator[LlmResponse, None]:
            asked.append(1)
            if len(asked) == 1:
                raise Overloaded("503 UNAVAILABLE: the model is overloaded")
            yield reply(text="Invoice 99 is paid.")

    plugin = TetherPlugin(guard())
    events = SHELLS[shell](LlmAgent(name="clerk", model=Flaky()), [plugin])
    outcome = plugin.last_outcome
    assert outcome is not None
    assert (outcome.status, outcome.result) == ("success", "Invoice 99 is paid.")
    assert len(asked) == 2 and outcome.usage.model_calls == 1 and outcome.usage.retries == 1
    assert last_text(events) == "Invoice 99 is paid."


def confirmed_refund(
    answer: bool | None, sync: bool, resumable: bool = False
) -> tuple[Any, list[str], Scripted, Any]:
    """A refund that needs a person's approval, asked through ADK's confirmation; then the
    ADK user's ``answer`` (None: decided on tether's side, by ``guard.approve``)."""
    from tether import Checkpoints

    paid: list[str] = []

    def issue_refund(order: str) -> str:
        """Refund an order."""
        paid.append(order)
        return "refunded"

    model = scripted([reply(call("issue_refund", {"order": "A-1"})), reply(text="Refunded A-1.")])
    tethered = Guard(prices=PRICES, checkpoints=Checkpoints.memory())
    plugin = TetherPlugin(
        tethered, side_effects=["issue_refund"], requires_approval={"issue_refund": True}
    )
    agent = LlmAgent(name="clerk", model=model, tools=[issue_refund])
    resuming = ResumabilityConfig(is_resumable=True) if resumable else None
    app = App(name="shop", root_agent=agent, plugins=[plugin], resumability_config=resuming)
    runner = InMemoryRunner(app=app)
    session = asyncio.run(runner.session_service.create_session(app_name="shop", user_id="u"))

    def send(message: Any) -> list[Any]:
        if sync:
            return list(runner.run(user_id="u", session_id=session.id, new_message=message))

        async def read() -> list[Any]:
            return [e async for e in runner.run_async(user_id="u", session_id=session.id,
                                                      new_message=message)]  # fmt: skip

        return asyncio.run(read())

    first = send(types.Content(role="user", parts=[types.Part(text="refund A-1")]))
    paused = plugin.last_outcome
    assert paused is not None and paused.stopped_because is StopReason.AWAITING_APPROVAL
    assert paid == [] and model.calls == 1
    asks = [p.function_call for e in first for p in (e.content.parts if e.content else ())
            if p.function_call and p.function_call.name == "adk_request_confirmation"]  # fmt: skip
    assert len(asks) == 1  # ADK's own confirmation request, for tether's approval
    confirmed = answer
    if answer is None:  # the operator page (or guard.approve) decided; the app resumes
        tethered.approve(paused.checkpoint_id, by="alice")
        confirmed = True
    response = types.FunctionResponse(id=asks[0].id, name=asks[0].name,
                                      response={"confirmed": confirmed})  # fmt: skip
    events = send(types.Content(role="user", parts=[types.Part(function_response=response)]))
    return plugin, paid, model, (tethered, events)


@pytest.mark.filterwarnings("ignore:\\[EXPERIMENTAL\\] ResumabilityConfig")  # ADK's own warning
@pytest.mark.parametrize("resumable", [False, True])
@pytest.mark.parametrize("answer", [True, None])
@pytest.mark.parametrize("shell", ["async", "sync"])
def test_a_tether_approval_is_asked_and_answered_through_adks_confirmation(
    shell: str, answer: bool | None, resumable: bool
) -> None:
    """requires_approval pauses the run (a checkpoint, a pending approval) and asks ADK's
    confirmation; the ADK user's "confirmed" (or guard.approve) resumes the paused run, in
    an App with or without ADK's ResumabilityConfig: the refund runs once, the approval is
    used, the model answers."""
    plugin, paid, model, (tethered, events) = confirmed_refund(answer, shell == "sync", resumable)
    outcome = plugin.last_outcome
    assert (outcome.status, outcome.result) == ("success", "Refunded A-1.")
    assert paid == ["A-1"] and model.calls == 2
    (record,) = tethered.approvals()
    assert (record.status, record.decided_by) == ("used", "adk:u" if answer else "alice")
    assert last_text(events) == "Refunded A-1."


@pytest.mark.parametrize("shell", ["async", "sync"])
def test_a_confirmation_declined_in_adk_rejects_the_approval(shell: str) -> None:
    """The ADK user declines: the approval is rejected, the refund never runs, and the run
    ends DECLINED."""
    plugin, paid, _, (tethered, _) = confirmed_refund(False, shell == "sync")
    assert paid == []
    (record,) = tethered.approvals()
    assert record.status == "rejected"
    assert plugin.last_outcome.stopped_because is StopReason.DECLINED


class Crash(BaseException):
    """The process dies (not an error ADK or a plugin handles)."""


class CrashAfterTool(BasePlugin):  # type: ignore[misc]
    """Kills the process once, after a tool paid and before ADK kept its response."""

    def __init__(self, paid: list[str]) -> None:
        super().__init__(name="crash")
        self.paid = paid

    async def after_tool_callback(self, **_: Any) -> None:
        if self.paid:
            raise Crash


def adk_confirmed_refund(
    answer: bool, sync: bool, path: str, crash: bool = False, asked_by: str = "declared"
) -> tuple[list[Any], list[str], Any]:
    """A refund declared with ADK's own ``require_confirmation=True`` (no tether rule), in a
    resumable App whose records are on disk; the ADK user's ``answer``; with ``crash``, the
    process dies after the refund ran and a new one (a new Guard and plugin on the same
    records and session) resumes the invocation from the session. ``asked_by="the tool"``:
    the tool asks itself (``tool_context.request_confirmation``), refunding once confirmed."""

    from tether import Records

    paid: list[str] = []

    def issue_refund(order: str) -> str:
        """Refund an order."""
        paid.append(order)
        return "refunded"

    def refund_asking(order: str, tool_context: ToolContext) -> dict[str, Any]:
        """Refund an order, once the user confirmed it."""
        confirmation = tool_context.tool_confirmation
        if confirmation is None:
            tool_context.request_confirmation(hint=f"Refund {order}?", payload={"order": order})
            return {"status": "waiting for the user"}
        if not confirmation.confirmed:
            return {"status": "not refunded"}
        paid.append(order)
        return {"status": "refunded"}

    refund = (
        FunctionTool(issue_refund, require_confirmation=True)
        if asked_by == "declared"
        else FunctionTool(refund_asking)
    )
    model = scripted(lambda i: reply(call(refund.name, {"order": "A-1"})) if i == 0
                     else reply(text="Refunded A-1."))  # fmt: skip
    agent = LlmAgent(name="clerk", model=model, tools=[refund])
    plugins: list[Any] = []
    sessions = InMemorySessionService()

    def process(*extra: Any) -> Any:
        tethered = Guard(prices=PRICES, records=Records.sqlite(path))
        plugins.append(TetherPlugin(tethered))  # no tether rule: ADK's alone
        app = App(name="shop", root_agent=agent, plugins=[plugins[-1], *extra],
                  resumability_config=ResumabilityConfig(is_resumable=True))  # fmt: skip
        return Runner(app=app, session_service=sessions), tethered

    runner, tethered = process(*([CrashAfterTool(paid)] if crash else []))
    session = asyncio.run(sessions.create_session(app_name="shop", user_id="u"))

    def send(runner: Any, message: Any = None, invocation_id: str | None = None) -> list[Any]:
        if sync and invocation_id is None:
            return list(runner.run(user_id="u", session_id=session.id, new_message=message))

        async def read() -> list[Any]:
            return [e async for e in runner.run_async(user_id="u", session_id=session.id,
                    new_message=message, invocation_id=invocation_id)]  # fmt: skip

        return asyncio.run(read())

    first = send(runner, types.Content(role="user", parts=[types.Part(text="refund A-1")]))
    assert paid == [] and model.calls == 1
    asks = [p.function_call for e in first for p in (e.content.parts if e.content else ())
            if p.function_call and p.function_call.name == "adk_request_confirmation"]  # fmt: skip
    assert len(asks) == 1  # ADK's own confirmation request: one question
    (pending,) = tethered.approvals()  # ... and one tether approval, on the operator page
    assert pending.status == "pending"
    response = types.FunctionResponse(id=asks[0].id, name=asks[0].name,
                                      response={"confirmed": answer})  # fmt: skip
    answered = types.Content(role="user", parts=[types.Part(function_response=response)])
    if not crash:
        return send(runner, answered), paid, (plugins[-1], tethered)
    # the refund ran; its response never reached the session (ADK's sync runner reports
    # the death of its thread as a RuntimeError)
    with pytest.raises((Crash, RuntimeError)) as died:
        send(runner, answered)
    assert died.type is Crash or "Crash" in str(died.value)
    assert paid == ["A-1"]
    runner, tethered = process()  # a new process, resuming the invocation from the session
    events = send(runner, None, first[0].invocation_id)
    return events, paid, (plugins[-1], tethered)


@pytest.mark.filterwarnings("ignore:\\[EXPERIMENTAL\\] ResumabilityConfig")  # ADK's own warning
@pytest.mark.parametrize("asked_by", ["declared", "the tool"])
@pytest.mark.parametrize("crash", [False, True])
@pytest.mark.parametrize("shell", ["async", "sync"])
def test_adks_require_confirmation_is_a_tether_approval(
    shell: str, crash: bool, asked_by: str, tmp_path: Any
) -> None:
    """A tool declared with ADK's ``require_confirmation``: one tether approval, asked as
    ADK's confirmation, approved by the ADK user's "confirmed"; the refund runs once, also
    when the process dies after it ran and a new one resumes the invocation."""
    events, paid, (plugin, tethered) = adk_confirmed_refund(
        True, shell == "sync", str(tmp_path / "records.db"), crash=crash, asked_by=asked_by
    )
    assert paid == ["A-1"]
    (record,) = tethered.approvals()
    assert (record.status, record.decided_by) == ("used", "adk:u")
    assert plugin.last_outcome.status == "success"
    assert last_text(events) == "Refunded A-1."


@pytest.mark.filterwarnings("ignore:\\[EXPERIMENTAL\\] ResumabilityConfig")  # ADK's own warning
@pytest.mark.parametrize("asked_by", ["declared", "the tool"])
@pytest.mark.parametrize("shell", ["async", "sync"])
def test_adks_require_confirmation_declined_rejects_the_approval(
    shell: str, asked_by: str, tmp_path: Any
) -> None:
    """Declined in ADK: the tether approval is rejected, the refund never runs, the run
    ends DECLINED."""
    _, paid, (plugin, tethered) = adk_confirmed_refund(
        False, shell == "sync", str(tmp_path / "records.db"), asked_by=asked_by
    )
    assert paid == []
    (record,) = tethered.approvals()
    assert record.status == "rejected"
    assert plugin.last_outcome.stopped_because is StopReason.DECLINED


@pytest.mark.filterwarnings("ignore:\\[EXPERIMENTAL\\] ResumabilityConfig")  # ADK's own warning
def test_alone_a_confirmed_call_resumed_after_a_crash_pays_twice() -> None:
    """ADK alone (its Resume page: tools run at least once): the confirmed refund ran, the
    process died before ADK kept its response, and the resumed invocation refunds again."""
    paid: list[str] = []

    def issue_refund(order: str) -> str:
        """Refund an order."""
        paid.append(order)
        return "refunded"

    model = scripted(lambda i: reply(call("issue_refund", {"order": "A-1"})) if i == 0
                     else reply(text="Refunded A-1."))  # fmt: skip
    agent = LlmAgent(name="clerk", model=model,
                     tools=[FunctionTool(issue_refund, require_confirmation=True)])  # fmt: skip
    sessions = InMemorySessionService()

    def runner(*plugins: Any) -> Runner:
        app = App(name="shop", root_agent=agent, plugins=list(plugins),
                  resumability_config=ResumabilityConfig(is_resumable=True))  # fmt: skip
        return Runner(app=app, session_service=sessions)

    async def send(runner: Runner, message: Any = None, invocation_id: str | None = None) -> Any:
        return [e async for e in runner.run_async(user_id="u", session_id=session.id,
                new_message=message, invocation_id=invocation_id)]  # fmt: skip

    session = asyncio.run(sessions.create_session(app_name="shop", user_id="u"))
    first = asyncio.run(send(runner(CrashAfterTool(paid)), types.Content(
        role="user", parts=[types.Part(text="refund A-1")])))  # fmt: skip
    (ask,) = [p.function_call for e in first for p in (e.content.parts if e.content else ())
              if p.function_call and p.function_call.name == "adk_request_confirmation"]  # fmt: skip
    response = types.FunctionResponse(id=ask.id, name=ask.name, response={"confirmed": True})
    with pytest.raises(Crash):
        asyncio.run(send(runner(CrashAfterTool(paid)),
                         types.Content(role="user", parts=[types.Part(function_response=response)])))  # fmt: skip
    asyncio.run(send(runner(), None, first[0].invocation_id))
    assert paid == ["A-1", "A-1"]
