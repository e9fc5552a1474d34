"""A model provider that is down (#40, case 4) under CrewAI's adapter and LiteLLM's: the
real ``Crew`` on CrewAI's own ``LLM``, and ``litellm.completion``, over a loopback server
answering 529 to everything, twelve conversations on one Guard with SQLite records. Every
model turn asks its provider's breaker on the guard (``ModelTurn``): the conversations the
outage stopped end ``CIRCUIT_OPEN`` within ``outage_wait`` with the outage message, one
incident with one case (before: each ended ``ERROR`` after its own attempts, no case)."""

from __future__ import annotations

import asyncio
import os
import re
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import tether
from outage_checks import CONVERSATIONS, OVERLOADED, check_one_incident, figures
from scripted_server import Reply, ScriptedServer, Seen
from tether import Budget, Guard, Stopped, VirtualClock

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of the cost map

pytestmark = [
    # CrewAI's own Agent reads the fields it deprecates on every Agent built: not this code's
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    # LiteLLM's own types make pydantic warn (TypedDicts with ReadOnly items) on first use
    pytest.mark.filterwarnings("ignore:.*ReadOnly. qualifier:UserWarning"),
]

MODEL = "gpt-6.1-terra"


def a_guard(tmp_path: Path) -> tuple[Guard, tether.Records]:
    """The README's guard (max_seconds=300) with records and the default retry policy, its
    time, retry waits and breakers on a virtual clock."""
    records = tether.Records.sqlite(str(tmp_path / "records.db"))
    return Guard(records=records, clock=VirtualClock(), budget=Budget(max_seconds=300)), records


def conversations(server: ScriptedServer) -> Counter[str]:
    """The requests each conversation sent (by the "conversation N" its prompt names)."""

    def of(seen: Seen) -> str:
        found = re.search(r"conversation \d+", str(seen.body))
        return found.group(0) if found else "?"

    return Counter(of(r) for r in server.requests)


def crewai_outage(tmp_path: Path, shell: str) -> tuple[list[tether.Outcome], Counter[str], Any]:
    with warnings.catch_warnings():  # crewai's lazy imports warn on import (ImportWarning)
        warnings.simplefilter("ignore", ImportWarning)
        from crewai import LLM, Agent, Crew, Task

    from tether.integrations.crewai import akickoff, kickoff

    guard, records = a_guard(tmp_path)
    outs: list[tether.Outcome] = []
    with ScriptedServer() as server:
        server.default = Reply(529, OVERLOADED)
        for i in range(CONVERSATIONS):
            llm = LLM(model=f"openai/{MODEL}", base_url=server.url + "/v1", api_key="k",
                      max_retries=0)  # fmt: skip
            clerk = Agent(role="clerk", goal="help the customer", backstory="a support clerk",
                          llm=llm, verbose=False)  # fmt: skip
            task = Task(description=f"conversation {i}: where is my order?",
                        expected_output="an answer", agent=clerk)  # fmt: skip
            crew = Crew(agents=[clerk], tasks=[task], verbose=False)
            if shell == "sync":
                outs.append(kickoff(crew, guard=guard))
            else:
                outs.append(asyncio.run(akickoff(crew, guard=guard)))
        sent = conversations(server)
    return outs, sent, records


def litellm_outage(tmp_path: Path, shell: str) -> tuple[list[tether.Outcome], Counter[str], Any]:
    from tether.integrations.litellm import acompletion, completion

    guard, records = a_guard(tmp_path)
    outs: list[tether.Outcome] = []
    with ScriptedServer() as server:
        server.default = Reply(529, OVERLOADED)
        for i in range(CONVERSATIONS):
            ask = f"conversation {i}: where is my order?"
            request: dict[str, Any] = {
                "model": f"openai/{MODEL}", "api_base": server.url + "/v1", "api_key": "k",
                "messages": [{"role": "user", "content": ask}],
            }  # fmt: skip
            with guard.start(ask) as run:
                try:
                    if shell == "sync":
                        completion(run, **request)
                    else:
                        asyncio.run(acompletion(run, **request))
                except Stopped:
                    pass
            outs.append(run.outcome)
        sent = conversations(server)
    return outs, sent, records


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_crewai_an_outage_ends_each_conversation_circuit_open_as_one_case(
    tmp_path: Path, shell: str
) -> None:
    outs, sent, records = crewai_outage(tmp_path, shell)
    print("crewai", shell, figures(outs, sent, records))
    check_one_incident(outs, sent, records, "openai")


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_litellm_an_outage_ends_each_conversation_circuit_open_as_one_case(
    tmp_path: Path, shell: str
) -> None:
    outs, sent, records = litellm_outage(tmp_path, shell)
    print("litellm", shell, figures(outs, sent, records))
    check_one_incident(outs, sent, records, "openai")
