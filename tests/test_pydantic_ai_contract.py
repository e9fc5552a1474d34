"""PydanticAI's own contract under tether: a tool's exception raises as without tether, its
ModelRetry / deferrals / approvals reach the framework unchanged, a delegate agent's
requests count in the caller's run, and PydanticAI's test models run under a cost budget."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults
from pydantic_ai.usage import RequestUsage

import tether
from tether import Budget, Guard, Price, PriceTable, RetryPolicy, StopReason
from tether.integrations import pydantic_ai as ta_pydantic

USAGE = RequestUsage(input_tokens=500, output_tokens=50)


def tool_results(messages: list[Any]) -> list[Any]:
    return [p for m in messages for p in m.parts if p.part_kind in ("tool-return", "retry-prompt")]


# --- 13: a tool's exception keeps PydanticAI's contract ----------------------------------------


@dataclass
class Bank:
    balances: dict[int, float]
    customer_id: int


class Advice(BaseModel):
    support_advice: str
    risk: int


def bank_agent(seen: list[str], **agent: Any) -> Agent[Bank, Advice]:
    """A support agent as in PydanticAI's bank example: its tool raises ValueError for a
    customer it does not know; the model answers with what the tool returned."""

    def respond(messages: list[Any], info: AgentInfo) -> ModelResponse:
        back = tool_results(messages)
        if not back:
            return ModelResponse([ToolCallPart("customer_balance", {})], usage=USAGE)
        seen.append(str(back[-1].content))
        args = {"support_advice": f"balance: {back[-1].content}", "risk": 1}
        return ModelResponse([ToolCallPart(info.output_tools[0].name, args)], usage=USAGE)

    built: Agent[Bank, Advice] = Agent(
        FunctionModel(respond), deps_type=Bank, output_type=Advice, **agent
    )

    @built.tool
    async def customer_balance(ctx: RunContext[Bank]) -> str:
        """The customer's balance."""
        if ctx.deps.customer_id not in ctx.deps.balances:
            raise ValueError("Customer not found")
        return f"${ctx.deps.balances[ctx.deps.customer_id]:.2f}"

    return built


UNKNOWN = Bank({123: 123.45}, customer_id=999)


def test_alone_the_tools_value_error_raises_from_the_run() -> None:
    seen: list[str] = []
    with pytest.raises(ValueError, match="Customer not found"):
        asyncio.run(bank_agent(seen).run("What is my balance?", deps=UNKNOWN))
    assert seen == []


def test_the_tools_value_error_raises_from_run_and_run_sync() -> None:
    """The same exception, never a tool result the model reads and answers from."""
    for entry in ("run", "run_sync"):
        seen: list[str] = []
        agent, guard = bank_agent(seen), Guard()
        with pytest.raises(ValueError, match="Customer not found"):
            if entry == "run":
                asyncio.run(
                    ta_pydantic.run(agent, "What is my balance?", guard=guard, deps=UNKNOWN)
                )
            else:
                ta_pydantic.run_sync(agent, "What is my balance?", guard=guard, deps=UNKNOWN)
        assert seen == [], entry


def test_with_the_capability_the_run_raises_and_its_outcome_says_why() -> None:
    capability = ta_pydantic.TetherCapability(Guard())
    seen: list[str] = []
    agent = bank_agent(seen, capabilities=[capability])
    run_ids: list[str] = []

    async def main() -> None:
        async with agent.iter("What is my balance?", deps=UNKNOWN) as running:
            run_ids.append(str(running.run_id))
            async for _ in running:
                pass

    with pytest.raises(ValueError, match="Customer not found"):
        asyncio.run(main())
    outcome = capability.outcome(run_ids[0])
    assert outcome is not None and outcome.status == "failed"
    assert outcome.stopped_because is StopReason.PERMANENT_ERROR
    assert outcome.error == "ValueError: Customer not found"


def test_a_known_customer_gets_the_answer() -> None:
    seen: list[str] = []
    outcome = ta_pydantic.run_sync(
        bank_agent(seen),
        "What is my balance?",
        guard=Guard(),
        deps=Bank({123: 123.45}, customer_id=123),
    )
    assert outcome.status == "success" and seen == ["$123.45"]
    assert outcome.result == Advice(support_advice="balance: $123.45", risk=1)


def test_a_transient_failure_past_the_retries_reaches_the_model_as_a_retry_prompt() -> None:
    """A read that keeps timing out: retried by tether, then PydanticAI's own retry path
    (a RetryPromptPart), never a ToolReturnPart posing as the tool's answer."""
    tries: list[int] = []

    def flaky(q: str) -> str:
        """Search."""
        tries.append(1)
        raise TimeoutError("read timed out")

    def respond(messages: list[Any], info: AgentInfo) -> ModelResponse:
        if not tool_results(messages):
            return ModelResponse([ToolCallPart("flaky", {"q": "x"})], usage=USAGE)
        return ModelResponse([TextPart("The search is down.")], usage=USAGE)

    agent = Agent(FunctionModel(respond))
    agent.tool_plain(flaky)
    guard = Guard(retry=RetryPolicy(max_attempts=3, base=0.01))
    outcome = ta_pydantic.run_sync(agent, "search", guard=guard)
    assert len(tries) == 3 and outcome.result == "The search is down."
    parts = tool_results(outcome.messages)
    assert [p.outcome for p in parts] == ["retried"]  # PydanticAI's own retry, not "success"
    assert "temporarily unavailable" in str(parts[0].content)


def test_model_retry_past_the_tools_retries_ends_as_pydantic_ai_says() -> None:
    """ModelRetry every time: PydanticAI's own retry limit ends it (tool retries: 1), with
    the same exception as without tether."""
    tries: list[str] = []

    def lookup(order: str) -> str:
        """Look an order up."""
        tries.append(order)
        raise ModelRetry("order ids look like A-1")

    def respond(messages: list[Any], info: AgentInfo) -> ModelResponse:
        return ModelResponse([ToolCallPart("lookup", {"order": f"a{len(tries)}"})], usage=USAGE)

    agent = Agent(FunctionModel(respond))
    agent.tool_plain(lookup)
    with pytest.raises(Exception, match="exceeded max retries") as alone:
        asyncio.run(agent.run("find"))
    alone_tries, tries[:] = list(tries), []
    with pytest.raises(type(alone.value), match="exceeded max retries"):
        ta_pydantic.run_sync(agent, "find", guard=Guard())
    assert tries == alone_tries == ["a0", "a1"]


def deferring_agent(executed: list[str]) -> Agent[None, str | DeferredToolRequests]:
    """A refund that needs approval and a lookup run elsewhere (PydanticAI's deferred tools)."""

    def respond(messages: list[Any], info: AgentInfo) -> ModelResponse:
        back = tool_results(messages)
        if not back:
            return ModelResponse(
                [
                    ToolCallPart("refund", {"order": "A-1"}, tool_call_id="r1"),
                    ToolCallPart("ledger_lookup", {"order": "A-1"}, tool_call_id="l1"),
                ],
                usage=USAGE,
            )
        return ModelResponse([TextPart(f"done: {sorted(str(p.content) for p in back)}")])

    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(respond), output_type=[str, DeferredToolRequests]
    )

    @agent.tool
    def refund(ctx: RunContext[None], order: str) -> str:
        """Refund an order (a person approves it first)."""
        if not ctx.tool_call_approved:
            raise ApprovalRequired()
        executed.append(order)
        return f"refunded {order}"

    @agent.tool_plain
    def ledger_lookup(order: str) -> str:
        """Looked up by another system."""
        raise CallDeferred()

    return agent


def test_deferred_tools_and_approvals_pass_through_unchanged() -> None:
    """The run ends with PydanticAI's DeferredToolRequests, as alone; resumed with the
    person's approval and the external result, the refund runs once."""
    alone_done: list[str] = []
    alone = asyncio.run(deferring_agent(alone_done).run("refund A-1"))
    executed: list[str] = []
    agent, guard = deferring_agent(executed), Guard()
    first = ta_pydantic.run_sync(agent, "refund A-1", guard=guard, side_effects=["refund"])
    requests = first.result
    assert isinstance(requests, DeferredToolRequests) and isinstance(
        alone.output, DeferredToolRequests
    )
    assert (
        [c.tool_name for c in requests.approvals]
        == [c.tool_name for c in alone.output.approvals]
        == ["refund"]
    )
    assert [c.tool_name for c in requests.calls] == ["ledger_lookup"] and executed == []
    assert first.status == "awaiting_approval"  # paused, not "success"
    assert first.stopped_because is StopReason.AWAITING_APPROVAL
    assert "approval of refund" in first.detail and "ledger_lookup" in first.detail
    results = DeferredToolResults(approvals={"r1": True}, calls={"l1": "balance ok"})
    second = ta_pydantic.run_sync(
        agent,
        None,
        guard=guard,
        side_effects=["refund"],
        message_history=first.messages,
        deferred_tool_results=results,
    )
    assert executed == ["A-1"] and second.status == "success"
    assert second.result == "done: ['balance ok', 'refunded A-1']"
    # the worker answers the same approval again (a retry after a crash): nothing runs twice
    again = ta_pydantic.run_sync(
        agent,
        None,
        guard=guard,
        side_effects=["refund"],
        message_history=first.messages,
        deferred_tool_results=results,
    )
    assert executed == ["A-1"] and again.result == second.result
    assert type(second.messages[-1]).__name__ == "ModelResponse"


# --- 14: a delegate agent's requests count in the caller's run ---------------------------------


class Flight(BaseModel):
    number: str
    destination: str


def flight_agents(
    delegate: list[Any], priced: bool = False
) -> tuple[Agent[None, Flight], list[int]]:
    """As PydanticAI's flight_booking: a search agent whose tool runs an extraction agent
    with usage=ctx.usage, and whose output validator makes the model try again once."""
    name = {"model_name": "gpt-6.1-terra"} if priced else {}
    sent: list[int] = []

    def extract(messages: list[Any], info: AgentInfo) -> ModelResponse:
        sent.append(1)
        flights = [
            {"number": "AK123", "destination": "ANC"},
            {"number": "AK456", "destination": "FAI"},
        ]
        return ModelResponse(
            [ToolCallPart(info.output_tools[0].name, {"response": flights})], usage=USAGE
        )

    def search(messages: list[Any], info: AgentInfo) -> ModelResponse:
        sent.append(1)
        n = sum(1 for m in messages if m.kind == "response")
        if n == 0:
            return ModelResponse([ToolCallPart("extract_flights", {})], usage=USAGE)
        flight = (
            {"number": "AK456", "destination": "FAI"}
            if n == 1
            else {"number": "AK123", "destination": "ANC"}
        )
        return ModelResponse([ToolCallPart(info.output_tools[0].name, flight)], usage=USAGE)

    extraction: Agent[None, list[Flight]] = Agent(
        FunctionModel(extract, **name), output_type=list[Flight], capabilities=delegate
    )
    searcher: Agent[None, Flight] = Agent(FunctionModel(search, **name), output_type=Flight)

    @searcher.tool
    async def extract_flights(ctx: RunContext[None]) -> list[Flight]:
        """All the flights on the page."""
        result = await extraction.run("the page", usage=ctx.usage)
        return result.output

    @searcher.output_validator
    def to_anchorage(output: Flight) -> Flight:
        if output.destination != "ANC":
            raise ModelRetry("the flight should go to ANC")
        return output

    return searcher, sent


def test_alone_pydantic_ai_counts_the_delegates_request() -> None:
    agent, sent = flight_agents([])
    result = asyncio.run(agent.run("find a flight to ANC"))
    assert result.output.number == "AK123" and result.usage.requests == len(sent) == 4


@pytest.mark.parametrize("delegate", ["Delegate", "TetherCapability"])
def test_a_delegate_agents_request_counts_in_the_callers_run(delegate: str) -> None:
    """Sync entry here; the async one in the test below."""
    capability = (
        ta_pydantic.Delegate() if delegate == "Delegate" else ta_pydantic.TetherCapability(Guard())
    )
    agent, sent = flight_agents([capability], priced=True)
    outcome = ta_pydantic.run_sync(agent, "find a flight to ANC", guard=Guard())
    assert outcome.result == Flight(number="AK123", destination="ANC")
    assert outcome.usage.model_calls == len(sent) == 4
    assert outcome.usage.input_tokens == 4 * 500
    assert outcome.usage.cost_usd == pytest.approx(4 * (500 * 1.0 + 50 * 5.0) / 1e6)


def test_a_delegates_request_is_budgeted_before_it_is_sent() -> None:
    """max_model_calls=1: the delegate's request (the 2nd) is never sent; the run stops."""
    agent, sent = flight_agents([ta_pydantic.Delegate()])
    outcome = ta_pydantic.run_sync(agent, "find", guard=Guard(budget=Budget(max_model_calls=1)))
    assert len(sent) == 1 and outcome.usage.model_calls == 1
    assert outcome.stopped_because is StopReason.MAX_MODEL_CALLS


def test_the_delegate_capability_outside_a_guarded_run_changes_nothing() -> None:
    agent, sent = flight_agents([ta_pydantic.Delegate()])
    result = asyncio.run(agent.run("find a flight to ANC"))
    assert result.output.number == "AK123" and len(sent) == 4


# --- PydanticAI's test models under a cost budget ---------------------------------------------


def test_test_models_under_their_own_names_are_free() -> None:
    """TestModel ('test') and FunctionModel ('function:...') send nothing to a provider:
    0 USD, priced (not unpriced), so a cost budget holds without a made-up price."""
    budget = Budget(max_cost_usd=0.01)
    outcome = ta_pydantic.run_sync(
        Agent(TestModel(custom_output_text="ok")), "hi", guard=Guard(budget=budget)
    )
    assert outcome.result == "ok" and outcome.usage.cost_usd == 0.0
    assert outcome.usage.unpriced_calls == 0 and outcome.usage.model_calls == 1
    agent, sent = flight_agents([ta_pydantic.Delegate()])
    outcome = ta_pydantic.run_sync(agent, "find", guard=Guard(budget=budget))
    assert outcome.status == "success" and outcome.usage.model_calls == len(sent) == 4
    assert outcome.usage.cost_usd == 0.0 and outcome.usage.unpriced_calls == 0
    assert ta_pydantic.free_test_model(TestModel()) and not ta_pydantic.free_test_model(
        FunctionModel(lambda m, i: ModelResponse([TextPart("x")]), model_name="gpt-6.1-terra")
    )


def test_a_test_model_named_after_a_real_one_is_priced_as_that_one() -> None:
    priced = PriceTable({"scripted": Price(input=10.0, output=10.0)})
    outcome = ta_pydantic.run_sync(
        Agent(TestModel(custom_output_text="ok", model_name="scripted")),
        "hi",
        guard=Guard(prices=priced),
    )
    assert outcome.usage.cost_usd > 0
    with pytest.raises(tether.UnknownModelError):
        ta_pydantic.run_sync(
            Agent(TestModel(model_name="mystery")),
            "hi",
            guard=Guard(budget=Budget(max_cost_usd=1.0)),
        )


@pytest.mark.parametrize("entry", ["run_sync", "run"])
def test_a_delegate_without_tethers_capability_is_counted_from_pydantic_ais_usage(
    entry: str,
) -> None:
    """flight_booking as written (usage=ctx.usage, no capability on the delegate): its
    request is counted from PydanticAI's usage, before the next request; unpriced, since
    tether never saw its model."""
    agent, sent = flight_agents([], priced=True)
    if entry == "run":
        outcome = asyncio.run(ta_pydantic.run(agent, "find a flight to ANC", guard=Guard()))
    else:
        outcome = ta_pydantic.run_sync(agent, "find a flight to ANC", guard=Guard())
    assert outcome.status == "success" and outcome.usage.model_calls == len(sent) == 4
    assert outcome.usage.unpriced_calls == 1 and outcome.usage.input_tokens == 4 * 500


def test_a_delegate_without_the_capability_is_budgeted_from_the_next_request() -> None:
    """max_model_calls=2: the delegate's request is the 2nd; the 3rd is never sent."""
    agent, sent = flight_agents([])
    outcome = ta_pydantic.run_sync(agent, "find", guard=Guard(budget=Budget(max_model_calls=2)))
    assert len(sent) == 2 and outcome.usage.model_calls == 2
    assert outcome.stopped_because is StopReason.MAX_MODEL_CALLS


def test_under_a_cost_budget_an_unseen_delegate_model_is_refused_and_the_fix_is_named() -> None:
    agent, sent = flight_agents([], priced=True)
    with pytest.raises(tether.UnknownModelError, match=r"Delegate\(\)"):
        ta_pydantic.run_sync(agent, "find", guard=Guard(budget=Budget(max_cost_usd=1.0)))
    assert len(sent) == 2  # the request after the delegate's is never sent


def test_delegates_in_parallel_tool_calls_are_counted_once() -> None:
    """Two tool calls in one response, each running a delegate (one with the capability,
    one without): every request once, as PydanticAI's own count."""

    def extract(messages: list[Any], info: AgentInfo) -> ModelResponse:
        return ModelResponse([TextPart("AK123")], usage=USAGE)

    seen = Agent(FunctionModel(extract), capabilities=[ta_pydantic.Delegate()])
    unseen = Agent(FunctionModel(extract))

    def search(messages: list[Any], info: AgentInfo) -> ModelResponse:
        if not tool_results(messages):
            calls = [ToolCallPart("page", {"n": n}, tool_call_id=f"p{n}") for n in (1, 2)]
            return ModelResponse(calls, usage=USAGE)
        return ModelResponse([TextPart("AK123 it is.")], usage=USAGE)

    def build() -> Agent[None, str]:
        agent: Agent[None, str] = Agent(FunctionModel(search))

        @agent.tool
        async def page(ctx: RunContext[None], n: int) -> str:
            """Read a page with a delegate."""
            delegate = seen if n == 1 else unseen
            first = await delegate.run(f"page {n}", usage=ctx.usage)
            second = await delegate.run(f"page {n} again", usage=ctx.usage)
            return first.output + second.output

        return agent

    alone = asyncio.run(build().run("find"))
    outcome = ta_pydantic.run_sync(build(), "find", guard=Guard())
    assert outcome.usage.model_calls == alone.usage.requests == 6
    assert outcome.usage.unpriced_calls == 2  # the two requests of the delegate tether never saw
