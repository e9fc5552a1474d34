"""The Agents SDK's own semantics under tether: ``handoff()`` objects, tool approvals
(``needs_approval`` interruptions and ``RunState``), nested agents (``as_tool``) and
guardrail agents, multi-turn conversations, MCP servers, and a streamed run.

Each test drives the SDK for real (its ``ScriptedModel``; the OpenAI client's errors as the
client raises them) through every shell of ``run``: ``run_sync``, ``await run`` and
``run_streamed``, with the same results."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest
from agents import (
    Agent,
    GuardrailFunctionOutput,
    InputGuardrailTripwireTriggered,
    RunContextWrapper,
    Runner,
    RunState,
    function_tool,
    handoff,
    input_guardrail,
    set_tracing_disabled,
)
from agents.extensions import handoff_filters
from agents.items import ToolApprovalItem
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.usage import Usage

from tether import Budget, Guard, LoopPolicy, RetryPolicy, StopReason
from tether.integrations import openai_agents as ta_agents

set_tracing_disabled(True)  # offline: no trace export

USAGE = Usage(requests=1, input_tokens=1000, output_tokens=100, total_tokens=1100)
SHELLS = ["sync", "async", "streamed"]


def scripted(steps: list[Any]) -> ScriptedModel:
    return ScriptedModel(steps, default_usage=USAGE)


def drive(shell: str, agent: Agent[Any], input: Any, **options: Any) -> Any:
    """One run through one of the three shells; the streamed one reads every event first."""
    if shell == "sync":
        return ta_agents.run_sync(agent, input, **options)
    if shell == "async":
        return asyncio.run(ta_agents.run(agent, input, **options))

    async def main() -> Any:
        stream = ta_agents.run_streamed(agent, input, **options)
        events = [event async for event in stream.stream_events()]
        assert events, "the caller reads the SDK's events while tether guards the run"
        return stream.outcome

    return asyncio.run(main())


def rate_limited(retry_after: str = "0.01") -> openai.RateLimitError:
    """A 429 exactly as the OpenAI client raises it."""
    request = httpx.Request("POST", "https://api.openai.com/v1/responses")
    response = httpx.Response(429, request=request, headers={"retry-after": retry_after})
    return openai.RateLimitError("Rate limit reached", response=response, body=None)


def quick() -> Guard:
    return Guard(retry=RetryPolicy(base=0.01, cap=0.02), loops=LoopPolicy(max_no_progress=None))


# --- 9: agents reached through handoff(agent) are guarded like bare ones ----------------------


def seat_desk(model: ScriptedModel) -> tuple[Agent[Any], Agent[Any], list[str], list[str]]:
    """The customer_service shape: a triage agent that hands off with ``handoff()`` (an
    ``on_handoff`` hook and an ``input_filter``) to a seat agent whose booking commits and
    then loses its reply."""
    booked: list[str] = []
    entered: list[str] = []

    @function_tool
    def update_seat(confirmation_number: str, new_seat: str) -> str:
        """Update the seat for a confirmation number."""
        booked.append(new_seat)
        raise TimeoutError("seat service: read timed out")

    def on_handoff(ctx: RunContextWrapper[Any]) -> None:
        entered.append("seat desk")

    seat = Agent(name="Seat Booking Agent", model=model, tools=[update_seat])
    triage = Agent(
        name="Triage Agent",
        model=model,
        handoffs=[
            handoff(
                seat,
                on_handoff=on_handoff,
                input_filter=handoff_filters.remove_all_tools,
                tool_name_override="transfer_to_seat_booking_agent",
            )
        ],
    )
    return triage, seat, booked, entered


def seat_script() -> list[Any]:
    seat = [
        function_call(
            "update_seat", {"confirmation_number": "ABC123", "new_seat": "7A"}, call_id=f"s{i}"
        )
        for i in range(3)
    ]
    return [
        [function_call("transfer_to_seat_booking_agent", {}, call_id="h1")],
        *[[call] for call in seat],
        [assistant_message("Your seat is now 7A.")],
    ]


def test_alone_a_seat_booked_after_a_handoff_commits_three_times() -> None:
    triage, _, booked, entered = seat_desk(scripted(seat_script()))
    result = asyncio.run(Runner.run(triage, "I want seat 7A"))
    assert result.final_output == "Your seat is now 7A." and len(booked) == 3
    assert entered == ["seat desk"]


@pytest.mark.parametrize("shell", SHELLS)
def test_a_handoff_objects_agent_is_guarded_once_per_intent(shell: str) -> None:
    """The committed-then-timed-out booking, re-issued twice, runs once; the handoff's own
    hook ran once, its input filter applied, and the outcome names the agent it ended in."""
    model = scripted(seat_script())
    triage, seat, booked, entered = seat_desk(model)
    outcome = drive(shell, triage, "I want seat 7A", guard=quick(), side_effects=["update_seat"])
    assert booked == ["7A"]
    assert outcome.stopped_because is StopReason.UNKNOWN_OUTCOME
    assert "try again" not in outcome.customer_message
    assert entered == ["seat desk"]
    assert outcome.last_agent is seat  # the caller's agent, not tether's copy of it
    seat_input = model.calls[1].input
    assert isinstance(seat_input, list)
    assert not [i for i in seat_input if isinstance(i, dict) and i.get("type") == "function_call"]
    # the SDK's items of the run: the filter removed the handoff's own items, as it does alone
    assert [type(i).__name__ for i in outcome.new_items] == ["ToolCallItem", "ToolCallOutputItem"]


@pytest.mark.parametrize("shell", SHELLS)
def test_a_429_after_a_handoff_is_retried(shell: str) -> None:
    steps = [
        [function_call("transfer_to_seat_booking_agent", {}, call_id="h1")],
        ModelStep.raise_error(rate_limited()),
        [assistant_message("What is your confirmation number?")],
    ]
    model = scripted(steps)
    triage, seat, _, _ = seat_desk(model)
    outcome = drive(shell, triage, "I want a new seat", guard=quick())
    assert outcome.status == "success" and outcome.result == "What is your confirmation number?"
    assert outcome.usage.retries == 1 and len(model.calls) == 3
    assert outcome.last_agent is seat


def test_handoffs_in_a_cycle_are_guarded_and_the_callers_agents_untouched() -> None:
    """triage -> faq -> triage (the example's back-handoffs) guards both, copies each once."""
    model = scripted(
        [
            [function_call("transfer_to_faq", {}, call_id="h1")],
            [function_call("transfer_to_triage", {}, call_id="h2")],
            *[[function_call("search", {"q": "bags"}, call_id=f"q{i}")] for i in range(5)],
        ]
    )
    searched: list[str] = []

    @function_tool
    def search(q: str) -> str:
        """Search the FAQ."""
        searched.append(q)
        return "one bag"

    faq = Agent(name="FAQ Agent", model=model)
    triage = Agent(
        name="Triage Agent",
        model=model,
        tools=[search],
        handoffs=[handoff(faq, tool_name_override="transfer_to_faq")],
    )
    faq.handoffs.append(handoff(triage, tool_name_override="transfer_to_triage"))
    outcome = ta_agents.run_sync(triage, "bags?", guard=Guard())
    assert searched == ["bags", "bags"]
    assert outcome.stopped_because is StopReason.REPEATED_ACTION
    assert outcome.last_agent is triage and triage.tools == [search]


# --- 10: a run paused for tool approval ---------------------------------------------------------


def approval_desk(model: ScriptedModel) -> tuple[Agent[Any], list[str]]:
    """The human_in_the_loop shape: a tool that needs approval for Oakland only."""
    looked: list[str] = []

    async def oakland_only(ctx: Any, params: dict[str, Any], call_id: str) -> bool:
        return "Oakland" in params.get("city", "")

    @function_tool
    def get_weather(city: str) -> str:
        """Weather for a city."""
        looked.append(f"weather {city}")
        return f"The weather in {city} is sunny"

    @function_tool(needs_approval=oakland_only)
    def get_temperature(city: str) -> str:
        """Temperature for a city."""
        looked.append(f"temperature {city}")
        return f"The temperature in {city} is 20 degrees Celsius"

    agent = Agent(name="Weather Assistant", model=model, tools=[get_weather, get_temperature])
    return agent, looked


def approval_script() -> list[Any]:
    return [
        [
            function_call("get_weather", {"city": "Oakland"}, call_id="w1"),
            function_call("get_temperature", {"city": "Oakland"}, call_id="t1"),
        ],
        [assistant_message("Oakland: sunny, 20 degrees Celsius.")],
    ]


def test_alone_the_sdk_pauses_for_the_approval() -> None:
    agent, looked = approval_desk(scripted(approval_script()))
    result = asyncio.run(Runner.run(agent, "Weather and temperature in Oakland?"))
    assert [i.name for i in result.interruptions] == ["get_temperature"]
    assert looked == ["weather Oakland"] and result.final_output is None


@pytest.mark.parametrize("shell", SHELLS)
def test_a_run_paused_for_approval_ends_awaiting_approval_and_resumes(shell: str) -> None:
    """The pause is AWAITING_APPROVAL with the SDK's interruptions and state; the example's
    approve-and-resume loop (the state through its JSON, as the example stores it) runs on
    tether's run(), and the approved call goes through the run."""
    model = scripted(approval_script())
    agent, looked = approval_desk(model)
    guard = quick()
    first = drive(shell, agent, "Weather and temperature in Oakland?", guard=guard)
    assert first.status == "awaiting_approval"
    assert first.stopped_because is StopReason.AWAITING_APPROVAL
    assert looked == ["weather Oakland"] and first.result is None
    assert [i.name for i in first.interruptions] == ["get_temperature"]
    assert all(isinstance(i, ToolApprovalItem) for i in first.interruptions)
    assert "approval" in first.customer_message and "complete" not in first.customer_message
    assert first.pending_approval is not None
    assert first.pending_approval["tool"] == "get_temperature"

    stored = json.dumps(first.to_state().to_json())  # as the example writes it to a file
    state = asyncio.run(RunState.from_json(agent, json.loads(stored)))
    for interruption in first.interruptions:
        state.approve(interruption)
    second = drive(shell, agent, state, guard=guard)
    assert looked == ["weather Oakland", "temperature Oakland"]
    assert second.status == "success" and second.result == "Oakland: sunny, 20 degrees Celsius."
    assert second.interruptions == [] and second.usage.tool_calls == 1
    assert len(model.calls) == 2


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_rejected_call_is_not_made_and_the_model_hears_it(shell: str) -> None:
    model = scripted(
        [*approval_script()[:1], [assistant_message("I could not get the temperature.")]]
    )
    agent, looked = approval_desk(model)
    first = drive(shell, agent, "Weather and temperature in Oakland?", guard=quick())
    state = first.to_state()  # the live state, without the JSON round trip
    state.reject(first.interruptions[0])
    second = drive(shell, agent, state, guard=quick())
    assert looked == ["weather Oakland"]
    assert second.status == "success" and second.result == "I could not get the temperature."


@pytest.mark.parametrize("shell", SHELLS)
def test_the_run_resumed_from_the_sdks_state_keeps_its_budget(shell: str, tmp_path: Any) -> None:
    """With a guard that keeps checkpoints, ``resume=outcome.checkpoint_id`` continues the same
    tether run after the pause: one run id, and the model-call budget counts both halves."""
    import tether

    model = scripted(approval_script())
    agent, looked = approval_desk(model)
    guard = Guard(
        checkpoints=tether.Checkpoints.sqlite(str(tmp_path / "runs.db")),
        budget=Budget(max_model_calls=1),
    )
    first = drive(shell, agent, "Weather and temperature in Oakland?", guard=guard)
    assert first.stopped_because is StopReason.AWAITING_APPROVAL and first.checkpoint_id
    state = first.to_state()
    state.approve(first.interruptions[0])
    second = drive(shell, agent, state, guard=guard, resume=first.checkpoint_id)
    assert second.run_id == first.run_id
    assert second.stopped_because is StopReason.MAX_MODEL_CALLS and len(model.calls) == 1
    assert looked == ["weather Oakland", "temperature Oakland"]  # the approved call ran


@pytest.mark.parametrize("shell", SHELLS)
def test_the_run_continues_from_its_snapshot_beside_the_sdks_state(shell: str) -> None:
    """No store: the outcome's snapshot (plain data, kept beside the SDK's state JSON) makes
    the resumed run the same tether run, its budget counting both halves."""
    model = scripted(approval_script())
    agent, looked = approval_desk(model)
    guard = Guard(budget=Budget(max_model_calls=1))
    first = drive(shell, agent, "Weather and temperature in Oakland?", guard=guard)
    stored = json.dumps({"state": first.to_state().to_json(), "tether": first.snapshot})
    kept = json.loads(stored)
    state = asyncio.run(RunState.from_json(agent, kept["state"]))
    for interruption in first.interruptions:
        state.approve(interruption)
    second = drive(shell, agent, state, guard=guard, snapshot=kept["tether"])
    assert second.run_id == first.run_id
    assert looked == ["weather Oakland", "temperature Oakland"]  # the approved call ran
    assert second.stopped_because is StopReason.MAX_MODEL_CALLS and len(model.calls) == 1


def test_a_stream_the_caller_stops_reading_ends_the_run() -> None:
    """Leaving the stream early cancels the SDK's run and ends tether's: no more requests."""
    steps = [[function_call("search", {"q": f"invoice {i}"}, call_id=f"c{i}")] for i in range(5)]
    model = scripted([*steps, [assistant_message("found")]])

    @function_tool
    def search(q: str) -> str:
        """Search invoices."""
        return "no result"

    async def main() -> Any:
        stream = ta_agents.run_streamed(
            Agent(name="clerk", model=model, tools=[search]), "find", guard=Guard()
        )
        events = stream.stream_events()
        async for event in events:
            if getattr(event, "name", "") == "tool_output":
                break
        await events.aclose()  # type: ignore[attr-defined]
        return stream.outcome

    outcome = asyncio.run(main())
    assert outcome.status == "failed" and "stopped reading" in outcome.detail
    assert len(model.calls) == 1


# --- 11: every model call counts: nested agents and guardrail agents ---------------------------


def translators(model: ScriptedModel) -> Agent[Any]:
    """The agents_as_tools shape: an orchestrator whose tools are agents."""
    french = Agent(name="french_agent", instructions="Translate to French", model=model)
    spanish = Agent(name="spanish_agent", instructions="Translate to Spanish", model=model)
    return Agent(
        name="orchestrator_agent",
        model=model,
        tools=[
            french.as_tool(tool_name="translate_to_french", tool_description="To French"),
            spanish.as_tool(tool_name="translate_to_spanish", tool_description="To Spanish"),
        ],
    )


def translation_script() -> list[Any]:
    return [
        [function_call("translate_to_french", {"input": "Hello, world!"}, call_id="t1")],
        [assistant_message("Bonjour, le monde !")],
        [function_call("translate_to_spanish", {"input": "Hello, world!"}, call_id="t2")],
        [assistant_message("¡Hola, mundo!")],
        [assistant_message("French: Bonjour, le monde ! Spanish: ¡Hola, mundo!")],
    ]


def test_alone_agents_as_tools_make_five_requests() -> None:
    model = scripted(translation_script())
    result = asyncio.run(Runner.run(translators(model), "Hello, world! to French and Spanish"))
    assert result.final_output.startswith("French:") and len(model.calls) == 5


@pytest.mark.parametrize("shell", SHELLS)
def test_nested_agents_model_calls_are_counted(shell: str) -> None:
    model = scripted(translation_script())
    outcome = drive(shell, translators(model), "Hello, world! to French and Spanish", guard=quick())
    assert outcome.status == "success" and outcome.result.startswith("French:")
    assert outcome.usage.model_calls == len(model.calls) == 5
    assert outcome.usage.input_tokens == 5 * 1000


@pytest.mark.parametrize("shell", SHELLS)
def test_a_model_call_budget_holds_across_nested_agents(shell: str) -> None:
    model = scripted(translation_script())
    outcome = drive(
        shell,
        translators(model),
        "Hello, world! to French and Spanish",
        guard=Guard(budget=Budget(max_model_calls=2)),
    )
    assert len(model.calls) <= 2  # paid requests: never more than the budget
    assert outcome.stopped_because is StopReason.MAX_MODEL_CALLS
    assert outcome.usage.model_calls == len(model.calls)


@pytest.mark.parametrize("shell", SHELLS)
def test_a_nested_agents_side_effect_runs_once(shell: str) -> None:
    """The tools of an agent used as a tool are the run's too: its refund, committed then
    timed out and asked again with a fresh uuid, is paid once (the SDK alone: twice)."""
    paid: list[str] = []

    @function_tool
    def issue_refund(order: str, uuid: str) -> str:
        """Refund an order."""
        paid.append(order)
        raise TimeoutError("payments: read timed out")

    refund = [
        function_call("issue_refund", {"order": "A-1", "uuid": str(i)}, call_id=f"r{i}")
        for i in range(2)
    ]
    model = scripted(
        [
            [function_call("ask_cashier", {"input": "refund A-1"}, call_id="t1")],
            [refund[0]],
            [refund[1]],
            [assistant_message("Refunded.")],  # the cashier, nested
            [assistant_message("Your refund is on its way.")],
        ]
    )
    cashier = Agent(name="cashier", model=model, tools=[issue_refund])
    desk = Agent(
        name="desk",
        model=model,
        tools=[cashier.as_tool(tool_name="ask_cashier", tool_description="Refunds")],
    )
    outcome = drive(shell, desk, "refund A-1", guard=quick(), side_effects=["issue_refund"])
    assert paid == ["A-1"]
    assert outcome.stopped_because is StopReason.UNKNOWN_OUTCOME


@pytest.mark.parametrize("shell", SHELLS)
def test_a_nested_request_that_failed_for_good_no_longer_counts_as_in_flight(shell: str) -> None:
    """A nested agent's model call fails (not retryable): the tool fails, the agent answers,
    and the budget of 2 model calls still has room for the answer."""
    model = scripted(
        [
            [function_call("ask_cashier", {"input": "refund A-1"}, call_id="t1")],
            ModelStep.raise_error(PermissionError("no access")),  # the cashier, nested
            [assistant_message("The cashier is unavailable.")],
        ]
    )
    cashier = Agent(name="cashier", model=model)
    desk = Agent(
        name="desk",
        model=model,
        tools=[cashier.as_tool(tool_name="ask_cashier", tool_description="Refunds")],
    )
    outcome = drive(shell, desk, "refund A-1", guard=Guard(budget=Budget(max_model_calls=2)))
    assert outcome.status == "success" and outcome.result == "The cashier is unavailable."
    assert len(model.calls) == 3 and outcome.usage.model_calls == 2


def homework_desk(checker: ScriptedModel, model: ScriptedModel) -> Agent[Any]:
    """The input_guardrails shape: a guardrail that asks an agent of its own."""
    guardrail_agent = Agent(name="Guardrail check", model=checker, instructions="Math homework?")

    @input_guardrail
    async def math_guardrail(
        ctx: RunContextWrapper[Any], agent: Agent[Any], input: Any
    ) -> GuardrailFunctionOutput:
        result = await Runner.run(guardrail_agent, input, context=ctx.context)
        verdict = json.loads(result.final_output)
        return GuardrailFunctionOutput(
            output_info=verdict, tripwire_triggered=verdict["is_math_homework"]
        )

    return Agent(name="Customer support agent", model=model, input_guardrails=[math_guardrail])


def verdict(homework: bool) -> list[Any]:
    return [assistant_message(json.dumps({"reasoning": "-", "is_math_homework": homework}))]


@pytest.mark.parametrize("shell", SHELLS)
def test_guardrail_agents_model_calls_are_counted(shell: str) -> None:
    checker = scripted([verdict(False)])
    model = scripted([[assistant_message("Sacramento.")]])
    outcome = drive(shell, homework_desk(checker, model), "Capital of California?", guard=quick())
    assert outcome.result == "Sacramento."
    assert outcome.usage.model_calls == len(checker.calls) + len(model.calls) == 2


@pytest.mark.parametrize("shell", SHELLS)
def test_a_model_call_budget_counts_the_guardrail_agent(shell: str) -> None:
    checker = scripted([verdict(False)])
    model = scripted([[assistant_message("Sacramento.")]])
    outcome = drive(
        shell,
        homework_desk(checker, model),
        "Capital of California?",
        guard=Guard(budget=Budget(max_model_calls=1)),
    )
    assert len(checker.calls) + len(model.calls) <= 1
    assert outcome.stopped_because is StopReason.MAX_MODEL_CALLS


def test_a_runner_outside_a_tether_run_is_left_alone() -> None:
    """After a guarded run, the SDK's own Runner counts nothing into it and stops nothing."""
    checker = scripted([verdict(False), verdict(False)])
    model = scripted([[assistant_message("Sacramento.")], [assistant_message("Sacramento.")]])
    agent = homework_desk(checker, model)
    ta_agents.run_sync(
        agent, "Capital of California?", guard=Guard(budget=Budget(max_model_calls=2))
    )
    result = asyncio.run(Runner.run(agent, "Capital of California?"))
    assert result.final_output == "Sacramento." and len(checker.calls) == 2


@pytest.mark.parametrize("shell", SHELLS)
def test_the_guards_token_budget_holds_for_the_sdks_requests(shell: str) -> None:
    """Guard(token_budget=...): a request the provider's limits would admit only after the
    run's time is stopped TIMEOUT before it is sent (one request a minute, 10 s to run)."""
    import tether
    from tether.stores import MemoryStore

    class Gpt(ScriptedModel):
        model = "gpt-6.1-terra"

    clock = tether.VirtualClock()
    limits = tether.TokenBudget("openai", requests_per_minute=1, store=MemoryStore(), clock=clock)
    model = Gpt(
        [
            [function_call("search", {"q": "invoice 99"}, call_id="c1")],
            [assistant_message("Paid.")],
        ],
        default_usage=USAGE,
    )

    @function_tool
    def search(q: str) -> str:
        """Search invoices."""
        return "paid"

    guard = Guard(clock=clock, token_budget=limits, budget=Budget(max_seconds=10))
    outcome = drive(
        shell, Agent(name="clerk", model=model, tools=[search]), "invoice 99?", guard=guard
    )
    assert outcome.stopped_because is StopReason.TIMEOUT and "token budget" in outcome.detail
    assert len(model.calls) == 1


# --- 12: multi-turn, refusals, MCP servers, the streamed run ------------------------------------


@pytest.mark.parametrize("shell", SHELLS)
def test_the_conversation_is_a_list_the_next_turn_appends_to(shell: str) -> None:
    model = scripted([[assistant_message("Hello!")], [assistant_message("Sacramento.")]])
    agent = Agent(name="support", model=model)
    first = drive(shell, agent, [{"role": "user", "content": "hi"}], guard=quick())
    assert isinstance(first.messages, list)
    expected = asyncio.run(
        Runner.run(
            Agent(name="support", model=scripted([[assistant_message("Hello!")]])),
            [{"role": "user", "content": "hi"}],
        )
    ).to_input_list()
    assert first.messages == expected
    turn = first.messages
    turn.append({"role": "user", "content": "Capital of California?"})
    second = drive(shell, agent, turn, guard=quick())
    assert second.result == "Sacramento." and len(second.messages) == 4


@pytest.mark.parametrize("shell", SHELLS)
def test_a_guardrail_refusal_tells_the_customer_the_truth(shell: str) -> None:
    checker = scripted([verdict(True)])
    model = scripted([[assistant_message("x = 3")]])
    outcome = drive(shell, homework_desk(checker, model), "Solve 2x + 5 = 11", guard=quick())
    assert outcome.stopped_because is StopReason.REFUSED
    assert "try again" not in outcome.customer_message.lower()
    assert "can't help" in outcome.customer_message or "cannot help" in outcome.customer_message
    # the SDK's own signal, as the SDK raised it: what the example catches
    assert isinstance(outcome.tripwire, InputGuardrailTripwireTriggered)
    assert outcome.tripwire.guardrail_result.output.output_info["is_math_homework"] is True


@pytest.mark.parametrize("shell", SHELLS)
def test_multi_turn_resumes_at_the_last_agent(shell: str) -> None:
    """The customer_service loop on tether: the second turn starts at the seat agent the
    first ended in (2 + 2 requests), not at triage (which would hand off again)."""
    model = scripted(
        [
            [function_call("transfer_to_seat_booking_agent", {}, call_id="h1")],
            [assistant_message("Your confirmation number and seat?")],
            [
                function_call(
                    "update_seat", {"confirmation_number": "ABC123", "new_seat": "7A"}, call_id="s1"
                )
            ],
            [assistant_message("Your seat is now 7A.")],
        ]
    )
    booked: list[str] = []

    @function_tool
    def update_seat(confirmation_number: str, new_seat: str) -> str:
        """Update the seat for a confirmation number."""
        booked.append(new_seat)
        return f"Updated seat to {new_seat}"

    seat = Agent(name="Seat Booking Agent", model=model, tools=[update_seat])
    triage = Agent(
        name="Triage Agent",
        model=model,
        handoffs=[handoff(seat, tool_name_override="transfer_to_seat_booking_agent")],
    )
    guard, current, items = quick(), triage, []
    for text in ["I want to change my seat", "ABC123, seat 7A"]:
        items.append({"content": text, "role": "user"})
        outcome = drive(shell, current, items, guard=guard, side_effects=["update_seat"])
        items, current = outcome.messages, outcome.last_agent
    assert outcome.result == "Your seat is now 7A." and booked == ["7A"]
    assert len(model.calls) == 4 and current is seat


@pytest.mark.parametrize("shell", SHELLS)
def test_a_streamed_run_of_a_stuck_agent_ends_in_an_outcome(shell: str) -> None:
    searched: list[str] = []

    @function_tool
    def search(q: str) -> str:
        """Search invoices."""
        searched.append(q)
        return "no result"

    model = scripted(
        [[function_call("search", {"q": "invoice 99"}, call_id=f"c{i}")] for i in range(12)]
    )
    outcome = drive(
        shell, Agent(name="clerk", model=model, tools=[search]), "find invoice 99", guard=Guard()
    )
    assert searched == ["invoice 99", "invoice 99"]
    assert outcome.stopped_because is StopReason.REPEATED_ACTION and len(model.calls) == 3
    kinds = [m.get("type") for m in outcome.messages[1:]]
    assert kinds == ["function_call", "function_call_output"] * 3


def test_the_stream_tells_the_caller_to_read_it_first() -> None:
    async def main() -> None:
        stream = ta_agents.run_streamed(
            Agent(name="a", model=scripted([[assistant_message("hi")]])), "hi", guard=Guard()
        )
        with pytest.raises(RuntimeError, match="stream_events"):
            stream.outcome  # noqa: B018 - the property is what is tested
        async for _ in stream.stream_events():
            pass
        assert stream.outcome.result == "hi"

    asyncio.run(main())


# --- MCP servers on an agent --------------------------------------------------------------------

MCP_SERVER = """
import sys
from mcp.server.mcpserver import MCPServer

server = MCPServer("tickets")

@server.tool()
def open_ticket(subject: str, uuid: str) -> str:
    \"\"\"Open a support ticket.\"\"\"
    with open(sys.argv[1], "a") as log:
        log.write(subject + "\\n")
    return "ticket T-1 opened"

server.run()
"""


def mcp_tickets(tmp_path: Any, *, guard: Guard | None) -> tuple[list[str], Any]:
    """An agent whose tools come from an MCP server over stdio; the model opens the same
    ticket twice, with a fresh ``uuid`` each time (as models do)."""
    import sys
    import uuid

    from agents.mcp import MCPServerStdio

    script, log = tmp_path / "tickets.py", tmp_path / "opened.log"
    script.write_text(MCP_SERVER)
    calls = [
        [
            function_call(
                "open_ticket", {"subject": "refund A-1", "uuid": uuid.uuid4().hex}, call_id=f"m{i}"
            )
        ]
        for i in range(2)
    ]
    model = scripted([*calls, [assistant_message("Ticket T-1 is open.")]])

    async def main() -> Any:
        params = {"command": sys.executable, "args": [str(script), str(log)]}
        async with MCPServerStdio(params=params, name="tickets") as server:  # type: ignore[arg-type]
            agent = Agent(name="support", model=model, mcp_servers=[server])
            if guard is None:
                return await Runner.run(agent, "open a ticket")
            return await ta_agents.run(
                agent, "open a ticket", guard=guard, side_effects=["open_ticket"]
            )

    result = asyncio.run(main())
    return log.read_text().splitlines(), result


def test_alone_an_mcp_tool_reissued_with_a_fresh_uuid_runs_twice(tmp_path: Any) -> None:
    opened, result = mcp_tickets(tmp_path, guard=None)
    assert opened == ["refund A-1", "refund A-1"] and result.final_output == "Ticket T-1 is open."


def test_mcp_tools_named_in_side_effects_are_guarded(tmp_path: Any) -> None:
    """An MCP tool given in side_effects with mcp_servers= runs at most once per intent; the
    re-issued call gets the first call's result."""
    opened, outcome = mcp_tickets(tmp_path, guard=quick())
    assert opened == ["refund A-1"]
    assert outcome.status == "success" and outcome.result == "Ticket T-1 is open."
    replies = [m["output"] for m in outcome.messages if m.get("type") == "function_call_output"]
    assert len(replies) == 2 and all("T-1" in str(r) for r in replies)
    assert outcome.usage.tool_calls == 2


def test_a_refused_run_never_tells_the_customer_to_try_again() -> None:
    """The core's words for any REFUSED stop (a guardrail, a content filter, a model that
    refuses): trying again would get the same refusal."""
    guard = Guard()
    with guard.start(task="solve my homework") as run:
        run.proceed()
        run.stop(StopReason.REFUSED, "guardrail math_guardrail tripped")
    outcome = run.outcome
    assert (
        outcome.status == "failed"
        and outcome.customer_message == "We can't help with this request."
    )
