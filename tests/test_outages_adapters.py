"""A model provider that is down (#40, case 4) under the framework adapters: LangChain's
``create_agent`` with ``TetherMiddleware``, driven for real with a fake chat model whose
provider answers 529 to everything, the Agents SDK and PydanticAI over a loopback server
answering 529 (ADK and Strands: test_outages_frameworks.py; CrewAI and LiteLLM:
test_outages_crewai.py). Each conversation goes through the provider's breaker:
an outage ends it ``CIRCUIT_OPEN`` within ``Guard(outage_wait=...)`` with the outage
message, and the conversations it stopped are one incident with one case (they ended
``ERROR`` after their attempts, one case each, with no breaker)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

import tether
from outage_checks import CONVERSATIONS, OVERLOADED, check_one_incident, figures
from tether import Budget, Guard, StopReason, VirtualClock
from tether.integrations.langchain import TetherMiddleware


class Overloaded(Exception):
    """The provider's overloaded error (its status code is what classification reads)."""

    status_code = 529


class DownModel(GenericFakeChatModel):
    """A Claude model whose provider answers 529 to every request; counts them."""

    model_name: str = "claude-haiku-4-5"
    sent: Any = None

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        self.sent[str(messages[0].content)] += 1
        raise Overloaded("overloaded")


def langchain_outage(
    tmp_path: Path, shell: str
) -> tuple[list[tether.Outcome], Counter[str], tether.Records]:
    """12 conversations, one after another, on one Guard with records (the README's
    max_seconds=300, a virtual clock), each its own create_agent over a provider that is
    down; the outcomes and the requests of each conversation."""
    records = tether.Records.sqlite(str(tmp_path / "records.db"))
    guard = Guard(records=records, clock=VirtualClock(), budget=Budget(max_seconds=300))
    sent: Counter[str] = Counter()
    outs: list[tether.Outcome] = []
    for i in range(CONVERSATIONS):
        model = DownModel(messages=iter([]), sent=sent)
        agent = create_agent(model, tools=[], middleware=[TetherMiddleware(guard)])
        ask = {"messages": [("user", f"conversation {i}: where is my order?")]}
        state = (
            agent.invoke(ask) if shell in ("invoke", "sync") else asyncio.run(agent.ainvoke(ask))
        )
        outcome = state["tether_outcome"]
        assert state["messages"][-1].content == outcome.customer_message
        outs.append(outcome)
    return outs, sent, records


@pytest.mark.parametrize("shell", ["invoke", "ainvoke"])
def test_langchain_an_outage_ends_each_conversation_circuit_open_as_one_case(
    tmp_path: Path, shell: str
) -> None:
    """Before: 12 conversations ERROR, 5 requests and 7.5 s each, 12 cases. After: all but
    the first two (their failures trip the breaker) end CIRCUIT_OPEN within outage_wait,
    few requests reach the provider, one case for the outage."""
    outs, sent, records = langchain_outage(tmp_path, shell)
    print("langchain", shell, figures(outs, sent, records))
    check_one_incident(outs, sent, records, "anthropic")
    assert len([o for o in outs if o.stopped_because is StopReason.CIRCUIT_OPEN]) >= 10


def agents_outage(
    tmp_path: Path, shell: str
) -> tuple[list[tether.Outcome], Counter[str], tether.Records]:
    """The same through the Agents SDK: its real Runner and OpenAI client (its own retries
    off) over a loopback server answering 529 to everything; tether's retry waits short
    (the runner sleeps them for real), the guard's time and breaker on a virtual clock."""
    import httpx
    import openai
    from agents import Agent, OpenAIChatCompletionsModel

    from scripted_server import Reply, ScriptedServer
    from tether import RetryPolicy
    from tether.integrations import openai_agents as ta_agents

    records = tether.Records.sqlite(str(tmp_path / "records.db"))
    guard = Guard(records=records, clock=VirtualClock(), budget=Budget(max_seconds=300),
                  retry=RetryPolicy(base=0.01, cap=0.02))  # fmt: skip
    outs: list[tether.Outcome] = []
    with ScriptedServer() as server:
        server.default = Reply(529, {"error": {"message": "Overloaded", "type": "overloaded"}})

        def support(client: Any) -> Agent[Any]:
            return Agent(name="support", model=OpenAIChatCompletionsModel("gpt-6.1-terra", client))

        def client() -> openai.AsyncOpenAI:  # no pooled connection outlives its event loop
            http = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0))
            return openai.AsyncOpenAI(api_key="t", base_url=server.url + "/v1", max_retries=0,
                                      http_client=http)  # fmt: skip

        if shell == "sync":
            for i in range(CONVERSATIONS):
                each = client()
                ask = f"conversation {i}: where is my order?"
                outs.append(ta_agents.run_sync(support(each), ask, guard=guard))
                asyncio.run(each.close())
        else:

            async def conversations() -> None:
                async with client() as each:
                    for i in range(CONVERSATIONS):
                        ask = f"conversation {i}: where is my order?"
                        outs.append(await ta_agents.run(support(each), ask, guard=guard))

            asyncio.run(conversations())
        sent = Counter(str(r.body["messages"][-1]["content"]) for r in server.requests)
    return outs, sent, records


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_agents_sdk_an_outage_ends_each_conversation_circuit_open_as_one_case(
    tmp_path: Path, shell: str
) -> None:
    """Before: 12 conversations ERROR, 5 requests each, no case. After: all but the first
    two end CIRCUIT_OPEN within outage_wait with the outage message, one case."""
    outs, sent, records = agents_outage(tmp_path, shell)
    print("agents", shell, figures(outs, sent, records))
    check_one_incident(outs, sent, records, "openai")


def pydantic_outage(
    tmp_path: Path, shell: str
) -> tuple[list[tether.Outcome], Counter[str], tether.Records]:
    """The same through PydanticAI: an Agent on its OpenAIChatModel (the openai client, its
    own retries off) over a loopback server answering 529, ``run_sync`` or ``run``; the
    guard's default retry policy, its time and breaker on a virtual clock."""
    import httpx
    import openai
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from scripted_server import Reply, ScriptedServer
    from tether.integrations import pydantic_ai as ta_pydantic

    records = tether.Records.sqlite(str(tmp_path / "records.db"))
    guard = Guard(records=records, clock=VirtualClock(), budget=Budget(max_seconds=300))
    outs: list[tether.Outcome] = []
    with ScriptedServer() as server:
        server.default = Reply(529, OVERLOADED)
        for i in range(CONVERSATIONS):  # no pooled connection outlives its event loop
            http = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0))
            client = openai.AsyncOpenAI(api_key="t", base_url=server.url + "/v1", max_retries=0,
                                        http_client=http)  # fmt: skip
            model = OpenAIChatModel("gpt-6.1-terra", provider=OpenAIProvider(openai_client=client))
            ask = f"conversation {i}: where is my order?"
            if shell == "sync":
                outs.append(ta_pydantic.run_sync(Agent(model), ask, guard=guard))
            else:
                outs.append(asyncio.run(ta_pydantic.run(Agent(model), ask, guard=guard)))
            asyncio.run(http.aclose())
        sent = Counter(str(r.body["messages"][-1]["content"]) for r in server.requests)
    return outs, sent, records


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_pydantic_ai_an_outage_ends_each_conversation_circuit_open_as_one_case(
    tmp_path: Path, shell: str
) -> None:
    """The guard's breaker of the provider, on its store and clock (was: a process-wide
    breaker per base URL on the system clock, which a virtual-clock run never saw reopen)."""
    outs, sent, records = pydantic_outage(tmp_path, shell)
    print("pydantic_ai", shell, figures(outs, sent, records))
    check_one_incident(outs, sent, records, "openai")
