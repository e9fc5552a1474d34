"""A model provider that is down (#40, case 4) under Google ADK's plugin and Strands' hooks:
each framework's real model class and SDK client over a loopback server answering
overloaded to everything, twelve conversations on one Guard with SQLite records. Every
model turn asks its provider's breaker on the guard (``ModelTurn``): the conversations the
outage stopped end ``CIRCUIT_OPEN`` within ``outage_wait`` with the outage message, one
incident with one case (before: each ended ``ERROR`` after its own attempts, one case
each)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import tether
from outage_checks import CONVERSATIONS, OVERLOADED, UNAVAILABLE, check_one_incident, figures
from scripted_server import Reply, ScriptedServer, Seen
from tether import Budget, Guard, VirtualClock


def a_guard(tmp_path: Path) -> tuple[Guard, tether.Records]:
    """The README's guard (max_seconds=300) with records and the default retry policy, its
    time, retry waits and breakers on a virtual clock."""
    records = tether.Records.sqlite(str(tmp_path / "records.db"))
    guard = Guard(records=records, clock=VirtualClock(), budget=Budget(max_seconds=300))
    return guard, records


def asked(seen: Seen, read: Any) -> str:
    """The conversation a request belongs to (its first user text)."""
    try:
        return str(read(seen.body))
    except (KeyError, IndexError, TypeError):
        return "?"


def adk_outage(tmp_path: Path, shell: str) -> tuple[list[tether.Outcome], Counter[str], Any]:
    """ADK: an LlmAgent on its Gemini model (google-genai's client, its own retries off)
    over a loopback server answering 503 UNAVAILABLE, through ``Runner.run`` (sync) or
    ``run_async``."""
    import httpx
    from google import genai
    from google.adk.agents import LlmAgent
    from google.adk.apps import App
    from google.adk.models.google_llm import Gemini
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    from tether.integrations.adk import TetherPlugin

    guard, records = a_guard(tmp_path)
    plugin = TetherPlugin(guard)
    outs: list[tether.Outcome] = []
    with ScriptedServer() as server:
        server.default = Reply(503, UNAVAILABLE)

        def runner(http: httpx.AsyncClient) -> InMemoryRunner:
            options = types.HttpOptions(base_url=server.url, httpx_async_client=http)
            client = genai.Client(api_key="k", http_options=options)
            model = Gemini(model="gemini-2.5-flash", client=client)
            agent = LlmAgent(name="support", model=model, instruction="Help the customer.")
            return InMemoryRunner(app=App(name="shop", root_agent=agent, plugins=[plugin]))

        async def one(i: int) -> None:  # no pooled connection outlives its event loop
            http = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0))
            each = runner(http)
            session = await each.session_service.create_session(app_name="shop", user_id="u")
            ask = types.Content(role="user", parts=[types.Part(text=f"conversation {i}: where?")])
            if shell == "sync":  # ADK's sync shell: the async runner on a thread of its own
                events = await asyncio.to_thread(
                    lambda: list(each.run(user_id="u", session_id=session.id, new_message=ask))
                )
            else:
                events = [
                    e
                    async for e in each.run_async(
                        user_id="u", session_id=session.id, new_message=ask
                    )
                ]
            assert plugin.last_outcome is not None and events
            outs.append(plugin.last_outcome)
            await http.aclose()

        for i in range(CONVERSATIONS):
            asyncio.run(one(i))
        sent = Counter(
            asked(r, lambda b: b["contents"][0]["parts"][0]["text"]) for r in server.requests
        )
    return outs, sent, records


def strands_outage(tmp_path: Path, shell: str) -> tuple[list[tether.Outcome], Counter[str], Any]:
    """Strands: an Agent on its OpenAIModel (the openai client, its own retries off) over a
    loopback server answering 529, called (sync) or ``invoke_async``."""
    from strands import Agent
    from strands.models.openai import OpenAIModel

    from tether.integrations.strands import TetherHooks

    guard, records = a_guard(tmp_path)
    hooks = TetherHooks(guard)
    outs: list[tether.Outcome] = []
    with ScriptedServer() as server:
        server.default = Reply(529, OVERLOADED)
        for i in range(CONVERSATIONS):
            model = OpenAIModel(
                client_args={"api_key": "k", "base_url": server.url + "/v1", "max_retries": 0},
                model_id="gpt-6.1-terra",
            )
            agent = Agent(model=model, hooks=[hooks], callback_handler=None)
            ask = f"conversation {i}: where is my order?"
            try:
                agent(ask) if shell == "sync" else asyncio.run(agent.invoke_async(ask))
            except Exception:  # Strands raises the model's failure on (an ERROR ending)
                pass
            assert hooks.last_outcome is not None
            outs.append(hooks.last_outcome)
        sent = Counter(
            asked(r, lambda b: b["messages"][-1]["content"][0]["text"]) for r in server.requests
        )
    return outs, sent, records


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_adk_an_outage_ends_each_conversation_circuit_open_as_one_case(
    tmp_path: Path, shell: str
) -> None:
    outs, sent, records = adk_outage(tmp_path, shell)
    print("adk", shell, figures(outs, sent, records))
    check_one_incident(outs, sent, records, "gemini-2.5-flash")


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_strands_an_outage_ends_each_conversation_circuit_open_as_one_case(
    tmp_path: Path, shell: str
) -> None:
    outs, sent, records = strands_outage(tmp_path, shell)
    print("strands", shell, figures(outs, sent, records))
    check_one_incident(outs, sent, records, "openai")
