"""PydanticAI under a provider token budget: each model request reserves its prompt's
estimate and its ``max_tokens`` before it is sent (waiting on the event loop, or stopping
the run TIMEOUT before the request), and its usage gives back what it did not use."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

import tether
from loop_watch import watched
from tether import Budget, Guard, StopReason, TokenBudget, VirtualClock
from tether.integrations import pydantic_ai as ta_pydantic
from tether.stores import MemoryStore

SHELLS = ["sync", "async"]


def searching_agent(
    output_tokens: int, max_tokens: int, input_tokens: int = 50
) -> tuple[Agent[None, Any], list[Any]]:
    """A model named after a real one (gpt-6.1-terra): it searches, then answers; each reply
    uses ``input_tokens`` and ``output_tokens``. The list holds what each request was sent."""
    sent: list[Any] = []

    def respond(messages: list[Any], info: AgentInfo) -> ModelResponse:
        sent.append(messages)
        usage = RequestUsage(input_tokens=input_tokens, output_tokens=output_tokens)
        if len(sent) == 1:
            return ModelResponse(
                parts=[ToolCallPart("search", {"q": "invoice 99"}, tool_call_id="c1")], usage=usage
            )
        return ModelResponse(parts=[TextPart("Paid.")], usage=usage)

    agent: Agent[None, Any] = Agent(
        FunctionModel(respond, model_name="gpt-6.1-terra"),
        model_settings={"max_tokens": max_tokens},
    )

    @agent.tool_plain
    def search(q: str) -> str:
        """Search invoices."""
        return "paid"

    return agent, sent


def drive(shell: str, agent: Agent[None, Any], prompt: str, guard: Guard) -> tether.Outcome:
    if shell == "sync":
        return ta_pydantic.run_sync(agent, prompt, guard=guard)
    return asyncio.run(ta_pydantic.run(agent, prompt, guard=guard))


@pytest.mark.parametrize("shell", SHELLS)
def test_a_request_whose_max_tokens_would_come_too_late_is_never_sent(shell: str) -> None:
    """1,000 output tokens a minute, ``max_tokens=800``, every reply uses all 800: the second
    request would wait ~36 s for its place, past the run's 10 s: TIMEOUT before it is sent."""
    clock = VirtualClock()
    limits = TokenBudget("openai", output_tokens_per_minute=1000, store=MemoryStore(), clock=clock)
    guard = Guard(clock=clock, token_budget=limits, budget=Budget(max_seconds=10))
    agent, sent = searching_agent(output_tokens=800, max_tokens=800)
    outcome = drive(shell, agent, "invoice 99?", guard)
    assert outcome.stopped_because is StopReason.TIMEOUT
    assert "token budget" in outcome.detail and "no request was sent" in outcome.detail
    assert len(sent) == 1 and outcome.usage.model_calls == 1
    assert clock.now() < 1  # stopped at once, not after waiting out the time budget


@pytest.mark.parametrize("shell", SHELLS)
def test_the_usage_gives_back_what_a_request_did_not_use(shell: str) -> None:
    """The same budget, each reply uses 20 of its 800: the unused output goes back, so the
    second request is admitted at once and the bucket ends 40 tokens down."""
    clock = VirtualClock()
    limits = TokenBudget("openai", output_tokens_per_minute=1000, store=MemoryStore(), clock=clock)
    guard = Guard(clock=clock, token_budget=limits, budget=Budget(max_seconds=10))
    agent, sent = searching_agent(output_tokens=20, max_tokens=800)
    outcome = drive(shell, agent, "invoice 99?", guard)
    assert (outcome.status, outcome.result) == ("success", "Paid.")
    assert len(sent) == 2 and limits.reserved == 2 and limits.longest_wait == 0.0
    limits.flush()
    assert limits.view()["levels"]["output"] == pytest.approx(1000 - 2 * 20)


@pytest.mark.parametrize("shell", SHELLS)
def test_the_wait_for_a_place_counts_against_the_run(shell: str) -> None:
    """A second request 300 tokens short at 1,000 a minute waits ~18 s for its place: within
    the run's 60 s it is sent after the wait, and the run's time says it waited."""
    clock = VirtualClock()
    limits = TokenBudget("openai", output_tokens_per_minute=1000, store=MemoryStore(), clock=clock)
    guard = Guard(clock=clock, token_budget=limits, budget=Budget(max_seconds=60))
    agent, sent = searching_agent(output_tokens=700, max_tokens=700)
    outcome = drive(shell, agent, "invoice 99?", guard)
    assert outcome.status == "success" and len(sent) == 2
    assert 15 <= limits.longest_wait <= 25
    assert outcome.usage.seconds >= limits.longest_wait


@pytest.mark.parametrize("shell", SHELLS)
def test_the_prompt_s_estimate_is_reserved(shell: str) -> None:
    """3,000 input tokens a minute and a prompt of 8,000 characters (~2,000 tokens, as the
    usage says): the second request, as long, would wait ~20 s, past the run's 10 s; a
    short prompt goes through."""

    def guard() -> Guard:
        clock = VirtualClock()
        limits = TokenBudget(
            "openai", input_tokens_per_minute=3000, store=MemoryStore(), clock=clock
        )
        return Guard(clock=clock, token_budget=limits, budget=Budget(max_seconds=10))

    agent, sent = searching_agent(output_tokens=20, max_tokens=100, input_tokens=2000)
    outcome = drive(shell, agent, "invoice 99? " + "x" * 8000, guard())
    assert outcome.stopped_because is StopReason.TIMEOUT and len(sent) == 1
    agent, sent = searching_agent(output_tokens=20, max_tokens=100, input_tokens=20)
    short = drive(shell, agent, "invoice 99?", guard())
    assert short.status == "success", short.detail
    assert len(sent) == 2


def test_a_run_waiting_for_its_place_does_not_block_the_event_loop() -> None:
    """On the system clock: 600 output tokens a minute, each reply uses its 310: the second
    request waits ~2 s for its place, and another task on the loop ticks all the while."""
    limits = TokenBudget("openai", output_tokens_per_minute=600, store=MemoryStore())
    guard = Guard(token_budget=limits, budget=Budget(max_seconds=30))
    agent, sent = searching_agent(output_tokens=310, max_tokens=310)

    outcome, longest_gap = asyncio.run(watched(ta_pydantic.run(agent, "invoice 99?", guard=guard)))
    assert outcome.status == "success" and len(sent) == 2
    assert limits.longest_wait >= 1.0
    assert longest_gap < limits.longest_wait / 2  # the loop ran other tasks during the wait


def test_two_processes_share_the_budget_through_redis(redis_url: str) -> None:
    """Two processes' budgets of one name in one Redis: the first one's answer takes 800 of
    1,000 output tokens a minute, so the second process's run would wait ~36 s for its
    800: it stops TIMEOUT before its request, which its own memory would have sent. (The
    capability is async: ``run_sync`` drives the same coroutine.)"""
    from tether.stores import RedisStore

    prefix = f"tether-test-{uuid.uuid4().hex[:8]}"
    clock = VirtualClock()
    sent: list[str] = []

    def respond(messages: list[Any], info: AgentInfo) -> ModelResponse:
        sent.append("request")
        return ModelResponse(
            parts=[TextPart("Paid.")], usage=RequestUsage(input_tokens=50, output_tokens=800)
        )

    agent: Agent[None, Any] = Agent(
        FunctionModel(respond, model_name="gpt-6.1-terra"), model_settings={"max_tokens": 800}
    )

    async def process() -> tether.Outcome:
        store = RedisStore(redis_url, prefix=prefix, server_time=False)
        limits = TokenBudget("openai", output_tokens_per_minute=1000, store=store, clock=clock)
        guard = Guard(clock=clock, token_budget=limits, budget=Budget(max_seconds=10))
        try:
            outcome = await ta_pydantic.run(agent, "invoice 99?", guard=guard)
            limits.flush()  # what this process learned, sent before it "exits"
            return outcome
        finally:
            await store.aclose()
            store.close()

    first, second = asyncio.run(process()), asyncio.run(process())
    assert first.status == "success"
    assert second.stopped_because is StopReason.TIMEOUT and len(sent) == 1
