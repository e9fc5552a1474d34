"""Every adapter the suite runs (a row of the docs' table). Adding one: a driver module in
``adapters/`` (a subclass of ``suite.Adapter``) and a line here."""

from __future__ import annotations

from conformance.adapters.adk import ADK
from conformance.adapters.crewai import CrewAI
from conformance.adapters.guarded_client import GuardedClaude, GuardedClient
from conformance.adapters.langchain import Graph, Middleware
from conformance.adapters.litellm import LiteLLM
from conformance.adapters.openai_agents import AgentsSDK
from conformance.adapters.pydantic_ai import PydanticAI
from conformance.adapters.sdk_loop import AnthropicLoop, OpenAILoop
from conformance.adapters.strands import Strands
from conformance.suite import Adapter

ADAPTERS: list[Adapter] = [
    AnthropicLoop(),
    OpenAILoop(),
    GuardedClient(),
    GuardedClaude(),
    AgentsSDK(),
    Middleware(),
    Graph(),
    PydanticAI(),
    ADK(),
    Strands(),
    CrewAI(),
    LiteLLM(),
]

assert len({a.id for a in ADAPTERS}) == len(ADAPTERS), "adapter ids are unique"
