"""A model provider that is down (#40, case 4) under the framework adapters: LangChain's
``create_agent`` with ``TetherMiddleware``, driven for real with a fake chat model whose
provider answers 529 to everything. Each conversation goes through the provider's breaker:
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
from tether import Budget, Guard, StopReason, VirtualClock
from tether.integrations.langchain import TetherMiddleware

CONVERSATIONS = 12


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


def said(name: str) -> str:
    return str(getattr(tether.CustomerMessages(), name, name)).format(done="")


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
    stopped = [o for o in outs if o.stopped_because is StopReason.CIRCUIT_OPEN]
    assert len(stopped) >= CONVERSATIONS - 2
    assert all(o.usage.seconds <= 10 + 1 for o in stopped)
    assert max(o.usage.seconds for o in outs) <= 10 + 7.5 + 1
    # probes of the breaker, one at a time across conversations (they were 5 each, 60)
    # a call's attempts, then probes of the breaker, at most one a second within outage_wait
    assert max(sent.values()) <= 5 + 10 and sum(sent.values()) <= 40  # they were 5 each, 60
    assert {o.customer_message for o in stopped} == {said("outage")}
    assert {o.status for o in stopped} == {"escalated"}
    cases = records.handoffs.list(limit=100)
    assert len(cases) == 1
    assert cases[0]["incident"]["dependency"] == "anthropic"
    assert {o.handoff.id for o in stopped} == {cases[0]["id"]}
    held, total = records.incidents.runs(cases[0]["id"])
    assert total == len(stopped) == len(held)


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
    stopped = [o for o in outs if o.stopped_because is StopReason.CIRCUIT_OPEN]
    assert len(stopped) >= CONVERSATIONS - 2
    assert all(o.usage.seconds <= 10 + 1 for o in stopped)
    # a call's attempts, then probes of the breaker, at most one a second within outage_wait
    assert max(sent.values()) <= 5 + 10 and sum(sent.values()) <= 40  # they were 5 each, 60
    assert {o.customer_message for o in stopped} == {said("outage")}
    assert {o.status for o in stopped} == {"escalated"}
    cases = records.handoffs.list(limit=100)
    assert len(cases) == 1
    assert cases[0]["incident"]["dependency"] == "openai"
    assert {o.handoff.id for o in stopped} == {cases[0]["id"]}
    held, total = records.incidents.runs(cases[0]["id"])
    assert total == len(stopped) == len(held)
