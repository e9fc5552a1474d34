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
    assert max(sent.values()) <= 10 and sum(sent.values()) <= 40
    assert {o.customer_message for o in stopped} == {said("outage")}
    assert {o.status for o in stopped} == {"escalated"}
    cases = records.handoffs.list(limit=100)
    assert len(cases) == 1
    assert cases[0]["incident"]["dependency"] == "anthropic"
    assert {o.handoff.id for o in stopped} == {cases[0]["id"]}
    held, total = records.incidents.runs(cases[0]["id"])
    assert total == len(stopped) == len(held)
