"""LangChain v1 agents under a provider token budget: each model call reserves its prompt's
estimate and its ``max_tokens`` before it is made (waiting, or stopping the run TIMEOUT
before the call), and its usage gives back what it did not use."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool

from loop_watch import watched
from tether import Budget, Guard, StopReason, TokenBudget, VirtualClock
from tether.integrations.langchain import TetherMiddleware
from tether.stores import MemoryStore

SHELLS = ["sync", "async"]


class FakeGpt(GenericFakeChatModel):
    """LangChain's fake chat model under a real model's name, with a chat model's
    ``max_tokens`` (as ``ChatOpenAI`` has), able to be bound to tools (it ignores them)."""

    model_name: str = "gpt-6.1-terra"
    max_tokens: int | None = None
    calls: int = 0

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return super()._generate(*args, **kwargs)


def replies(input_tokens: int, output_tokens: int) -> Iterator[AIMessage]:
    """A search, then the answer; each reply says it used these tokens."""
    usage = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
    }
    yield AIMessage(
        content="",
        tool_calls=[{"name": "search", "args": {"q": "invoice 99"}, "id": "c1"}],
        usage_metadata=usage,  # type: ignore[arg-type]
    )
    yield AIMessage(content="Paid.", usage_metadata=usage)  # type: ignore[arg-type]


@tool
def search(q: str) -> str:
    """Search invoices."""
    return "paid"


def agent_for(guard: Guard, model: FakeGpt) -> Any:
    return create_agent(model, tools=[search], middleware=[TetherMiddleware(guard)])


def invoke(shell: str, agent: Any, prompt: str) -> Any:
    """The agent's final state, through ``invoke`` or ``ainvoke``."""
    state = {"messages": [("user", prompt)]}
    if shell == "sync":
        return agent.invoke(state)
    return asyncio.run(agent.ainvoke(state))


def drive(shell: str, agent: Any, prompt: str) -> Any:
    return invoke(shell, agent, prompt)["tether_outcome"]


def budgeted(max_seconds: float, **limits: float) -> tuple[Guard, TokenBudget, VirtualClock]:
    clock = VirtualClock()
    budget = TokenBudget("openai", store=MemoryStore(), clock=clock, **limits)  # type: ignore[arg-type]
    return (
        Guard(clock=clock, token_budget=budget, budget=Budget(max_seconds=max_seconds)),
        budget,
        clock,
    )


@pytest.mark.parametrize("shell", SHELLS)
def test_a_call_whose_max_tokens_would_come_too_late_is_never_made(shell: str) -> None:
    """1,000 output tokens a minute, ``max_tokens=800``, every reply uses all 800: the second
    call would wait ~36 s for its place, past the run's 10 s: TIMEOUT before it is made,
    and the agent ends with the customer message."""
    guard, _, clock = budgeted(10, output_tokens_per_minute=1000)
    model = FakeGpt(messages=replies(50, 800), max_tokens=800)
    state = invoke(shell, agent_for(guard, model), "invoice 99?")
    outcome = state["tether_outcome"]
    assert outcome.stopped_because is StopReason.TIMEOUT
    assert "token budget" in outcome.detail and "no request was sent" in outcome.detail
    assert model.calls == 1 and outcome.usage.model_calls == 1
    assert clock.now() < 1  # stopped at once, not after waiting out the time budget
    assert state["messages"][-1].content == outcome.customer_message


@pytest.mark.parametrize("shell", SHELLS)
def test_the_usage_gives_back_what_a_call_did_not_use(shell: str) -> None:
    """The same budget, each reply uses 20 of its 800: the unused output goes back, so the
    second call is admitted at once and the bucket ends 40 tokens down."""
    guard, budget, _ = budgeted(10, output_tokens_per_minute=1000)
    model = FakeGpt(messages=replies(50, 20), max_tokens=800)
    outcome = drive(shell, agent_for(guard, model), "invoice 99?")
    assert (outcome.status, model.calls) == ("success", 2)
    assert budget.reserved == 2 and budget.longest_wait == 0.0
    budget.flush()
    assert budget.view()["levels"]["output"] == pytest.approx(1000 - 2 * 20)


@pytest.mark.parametrize("shell", SHELLS)
def test_the_wait_for_a_place_counts_against_the_run(shell: str) -> None:
    """A second call 400 tokens short at 1,000 a minute waits ~24 s: within the run's 60 s
    it is made after the wait, and the run's time says it waited."""
    guard, budget, _ = budgeted(60, output_tokens_per_minute=1000)
    model = FakeGpt(messages=replies(50, 700), max_tokens=700)
    outcome = drive(shell, agent_for(guard, model), "invoice 99?")
    assert (outcome.status, model.calls) == ("success", 2)
    assert 15 <= budget.longest_wait <= 30
    assert outcome.usage.seconds >= budget.longest_wait


@pytest.mark.parametrize("shell", SHELLS)
def test_the_prompt_s_estimate_is_reserved(shell: str) -> None:
    """3,000 input tokens a minute and a prompt of 8,000 characters (~2,000 tokens, as the
    usage says): the second call, as long, would wait ~20 s, past the run's 10 s; a short
    prompt goes through. No ``max_tokens`` anywhere: the default output is reserved."""
    guard, _, _ = budgeted(10, input_tokens_per_minute=3000)
    model = FakeGpt(messages=replies(2000, 20))
    outcome = drive(shell, agent_for(guard, model), "invoice 99? " + "x" * 8000)
    assert outcome.stopped_because is StopReason.TIMEOUT and model.calls == 1
    guard, _, _ = budgeted(10, input_tokens_per_minute=3000)
    model = FakeGpt(messages=replies(20, 20))
    short = drive(shell, agent_for(guard, model), "invoice 99?")
    assert short.status == "success", short.detail
    assert model.calls == 2


def test_an_agent_waiting_for_its_place_does_not_block_the_event_loop() -> None:
    """On the system clock: 600 output tokens a minute, each reply uses its 310: the second
    call waits ~2 s for its place, and another task on the loop ticks all the while."""
    budget = TokenBudget("openai", output_tokens_per_minute=600, store=MemoryStore())
    guard = Guard(token_budget=budget, budget=Budget(max_seconds=30))
    model = FakeGpt(messages=replies(50, 310), max_tokens=310)
    agent = agent_for(guard, model)

    state, longest_gap = asyncio.run(
        watched(agent.ainvoke({"messages": [("user", "invoice 99?")]}))
    )
    outcome = state["tether_outcome"]
    assert (outcome.status, model.calls) == ("success", 2)
    assert budget.longest_wait >= 1.0
    assert longest_gap < budget.longest_wait / 2  # the loop ran other tasks during the wait
