"""The policies of the τ² suite: the loops and frameworks people run, and tether.

Every policy drives the same scripted model through a real SDK or framework, in process:

* ``naive``: a tool-use loop over ``anthropic.AsyncAnthropic`` with the SDK's defaults (two
  retries, ``Retry-After`` honoured); a tool's exception goes back to the model as text.
* ``tenacity``: the same loop, each tool call wrapped in tenacity's
  ``wait_exponential_jitter()`` and ``stop_after_attempt(5)``.
* ``langchain``: ``create_agent`` with LangChain's own ``ModelRetryMiddleware()``,
  ``ToolRetryMiddleware()`` and ``ModelCallLimitMiddleware``.
* ``openai-agents`` and ``pydantic-ai``: the frameworks with their defaults, over
  ``openai.AsyncOpenAI`` with its defaults (two retries).
* ``tether``: ``tether.integrations.anthropic.run_agent`` (sync); ``tether-openai``:
  ``tether.integrations.openai.arun_agent``; ``tether-langchain``, ``tether-openai-agents``,
  ``tether-pydantic-ai``: the same frameworks through tether's adapters (the clients built
  with ``max_retries=0``, as tether's docs say). Every tether policy declares the writes
  with a correct lookup; ``tether-no-lookup`` declares them without one,
  ``tether-blind-lookup`` with a lookup that reads a field the write never sets, and
  ``tether-5-attempts`` is ``tether`` with the default five attempts (the others have 8).

Every policy has the same cap of :data:`MAX_TURNS` model turns (the longest task needs 14).
An exception that escapes an agent is what the application shows as an error
(:data:`CRASH_TEXT`).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import tether
from tether.bench._tau_common import (
    ATTEMPTS,
    CRASH_TEXT,
    MAX_TURNS,
    PROMPT,
    SYSTEM,
    Ending,
)
from tether.bench._tau_common import guard_of as _guard
from tether.bench._tau_common import told as _told
from tether.bench._tau_domain import WRITES
from tether.bench._tau_formats import (
    agents_model,
    anthropic_transport,
    chat_model,
    openai_transport,
    pydantic_model,
)
from tether.bench._tau_tools import ASYNC, BLIND_LOOKUPS, LOOKUPS, SYNC
from tether.bench._tau_world import MODEL, Episode
from tether.bench._vloop import run_virtual

__all__ = [
    "CRASH_TEXT",
    "DEFAULT_POLICIES",
    "EXTRA_POLICIES",
    "MAX_TURNS",
    "POLICIES",
    "Ending",
    "installed",
    "run_policy",
]


# --- the loop people write by hand ---------------------------------------------------------


_SCHEMAS: dict[str, dict[str, Any]] = {}
_TOOLS: dict[tuple[int, bool], list[tether.Tool]] = {}


def _schema(name: str) -> dict[str, Any]:
    if name not in _SCHEMAS:
        _SCHEMAS[name] = tether.Tool(name, ASYNC[name]).schema
    return _SCHEMAS[name]


def _anthropic_tools() -> list[dict[str, Any]]:
    return [
        {"name": t.name, "description": t.description, "input_schema": t.schema}
        for t in _tether_tools(LOOKUPS)
    ]


#: The SDKs' clients, made once per process as an application makes them (their transport
#: answers from the running episode, and they keep nothing of a request for the next).
_CLIENTS: dict[Any, Any] = {}


def _anthropic_client(asynchronous: bool) -> Any:
    if asynchronous not in _CLIENTS:
        import anthropic
        import httpx2

        make: Any = anthropic.AsyncAnthropic if asynchronous else anthropic.Anthropic
        http: Any = httpx2.AsyncClient if asynchronous else httpx2.Client
        _CLIENTS[asynchronous] = make(
            api_key="bench",
            base_url="http://model.bench",
            http_client=http(transport=anthropic_transport()),
        )
    return _CLIENTS[asynchronous]


async def _hand_loop(episode: Episode, retry_tools: bool) -> Ending:
    import anthropic

    client = _anthropic_client(asynchronous=True)
    tools: Any = _anthropic_tools()
    messages: Any = [{"role": "user", "content": PROMPT}]
    for _ in range(MAX_TURNS):
        try:
            reply = await client.messages.create(
                model=MODEL, max_tokens=1024, system=SYSTEM, tools=tools, messages=messages
            )
        except anthropic.APIError:
            return Ending(CRASH_TEXT, "crash")
        messages.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            return Ending("".join(b.text for b in reply.content if b.type == "text"), "answer")
        results = []
        for use in uses:
            try:
                out = await (
                    _tenacious(use.name, use.input) if retry_tools else ASYNC[use.name](**use.input)
                )
                results.append({"type": "tool_result", "tool_use_id": use.id, "content": out})
            except Exception as exc:  # the error goes back to the model, as people write it
                results.append(
                    {
                        "type": "tool_result",
                        "tool_use_id": use.id,
                        "is_error": True,
                        "content": f"{type(exc).__name__}: {exc}",
                    }
                )
        messages.append({"role": "user", "content": results})
    return Ending(CRASH_TEXT, "crash")


async def _tenacious(name: str, args: Any) -> Any:
    import tenacity

    retrying = tenacity.AsyncRetrying(
        wait=tenacity.wait_exponential_jitter(), stop=tenacity.stop_after_attempt(5), reraise=True
    )
    async for attempt in retrying:
        with attempt:
            return await ASYNC[name](**args)
    raise AssertionError("unreachable")  # pragma: no cover


# --- tether's own loop -------------------------------------------------------------------


def _tether_tools(lookups: dict[str, Any] | None, sync: bool = False) -> list[tether.Tool]:
    """The tools as ``tether.Tool``: the writes non-idempotent, with ``lookups``' lookup."""
    key = (id(lookups), sync)
    if key not in _TOOLS:
        _TOOLS[key] = [
            tether.Tool(
                name,
                SYNC[name] if sync else fn,
                input_schema=_schema(name),
                idempotent=name not in WRITES,
                lookup=(lookups or {}).get(name),
            )
            for name, fn in ASYNC.items()
        ]
    return _TOOLS[key]


def _model_policy(
    provider: str, base_url: str, episode: Episode, attempts: int = ATTEMPTS
) -> tether.RetryPolicy:
    """The guarded client's default policy (five attempts, the provider's breaker), seeded."""
    breaker = tether.breakers.get(f"{provider}:{base_url}", failure_threshold=10)
    return tether.RetryPolicy(
        name=provider, max_attempts=attempts, seed=episode.rng_seed, breaker=breaker
    )


def _tether_anthropic(
    episode: Episode, lookups: dict[str, Any] | None, attempts: int = ATTEMPTS
) -> Ending:
    from tether.integrations.anthropic import guarded, run_agent

    client = guarded(
        _anthropic_client(asynchronous=False),
        policy=_model_policy("anthropic", "http://model.bench", episode, attempts),
    )
    outcome = run_agent(
        client,
        model=MODEL,
        system=SYSTEM,
        messages=[{"role": "user", "content": PROMPT}],
        tools=_tether_tools(lookups, sync=True),
        guard=_guard(episode, attempts),
    )
    return _told(outcome)


def _openai_client(episode: Episode, retries: int | None) -> Any:
    key = ("openai", retries)
    if key not in _CLIENTS:
        import httpx2
        import openai

        options: Any = {} if retries is None else {"max_retries": retries}
        _CLIENTS[key] = openai.AsyncOpenAI(
            api_key="bench",
            base_url="http://model.bench/v1",
            http_client=httpx2.AsyncClient(transport=openai_transport()),
            **options,
        )
    return _CLIENTS[key]


async def _tether_openai(episode: Episode) -> Ending:
    from tether.integrations.openai import arun_agent, guarded

    policy = _model_policy("openai", "http://model.bench/v1", episode)
    outcome = await arun_agent(
        guarded(_openai_client(episode, 0), policy=policy),
        model=MODEL,
        tools=_tether_tools(LOOKUPS),
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}],
        guard=_guard(episode),
    )
    return _told(outcome)


# --- LangChain ---------------------------------------------------------------------------

_LC_TOOLS: list[Any] = []


def _lc_tools() -> list[Any]:
    if not _LC_TOOLS:
        from langchain_core.tools import StructuredTool

        _LC_TOOLS.extend(
            StructuredTool.from_function(coroutine=fn, name=name) for name, fn in ASYNC.items()
        )
    return _LC_TOOLS


_LC_AGENT: list[Any] = []


def _langchain_agent(middleware: list[Any]) -> Any:
    from langchain.agents import create_agent

    return create_agent(
        chat_model(), tools=_lc_tools(), system_prompt=SYSTEM, middleware=middleware
    )


_LC_TETHERED: list[Any] = []


async def _langchain(episode: Episode, tethered: bool) -> Ending:
    if tethered:
        from tether.integrations.langchain import TetherMiddleware

        # one agent, built once as an application builds it; its middleware is made anew
        # for each episode's guard (each episode has its own clock, store and seed): the
        # instance the agent holds is initialised again, as a new TetherMiddleware would be
        if not _LC_TETHERED:
            middleware = TetherMiddleware(_guard(episode), side_effects=LOOKUPS)
            _LC_TETHERED.append((_langchain_agent([middleware]), middleware))
        agent, middleware = _LC_TETHERED[0]
        TetherMiddleware.__init__(middleware, _guard(episode), side_effects=LOOKUPS)
    else:  # LangChain's middlewares keep nothing between runs: one agent serves every episode
        from langchain.agents.middleware import (
            ModelCallLimitMiddleware,
            ModelRetryMiddleware,
            ToolRetryMiddleware,
        )

        if not _LC_AGENT:
            limit = ModelCallLimitMiddleware(run_limit=MAX_TURNS)
            _LC_AGENT.append(
                _langchain_agent([ModelRetryMiddleware(), ToolRetryMiddleware(), limit])
            )
        agent = _LC_AGENT[0]
    try:
        state = await agent.ainvoke({"messages": [("user", PROMPT)]})
    except Exception:
        return Ending(CRASH_TEXT, "crash")
    outcome = state.get("tether_outcome")
    if outcome is not None:
        return _told(outcome)
    return Ending(str(state["messages"][-1].content), "answer")


# --- the OpenAI Agents SDK ---------------------------------------------------------------

_AGENT_TOOLS: list[Any] = []


def _agents_tools() -> list[Any]:
    if not _AGENT_TOOLS:
        from agents import function_tool, set_tracing_disabled

        set_tracing_disabled(True)  # offline: no trace export
        _AGENT_TOOLS.extend(function_tool(fn) for fn in ASYNC.values())
    return _AGENT_TOOLS


async def _openai_agents(episode: Episode, tethered: bool) -> Ending:
    from agents import Agent, Runner

    agent = Agent(name="retail", instructions=SYSTEM, tools=_agents_tools(), model=agents_model())
    if tethered:
        from tether.integrations import openai_agents

        outcome = await openai_agents.run(
            agent, PROMPT, guard=_guard(episode), side_effects=LOOKUPS, max_turns=MAX_TURNS
        )
        return _told(outcome)
    try:
        result = await Runner.run(agent, PROMPT, max_turns=MAX_TURNS)
    except Exception:
        return Ending(CRASH_TEXT, "crash")
    return Ending(str(result.final_output), "answer")


# --- PydanticAI ----------------------------------------------------------------------------

_PAI_TOOLS: list[Any] = []


def _pydantic_tools() -> list[Any]:
    if not _PAI_TOOLS:
        from pydantic_ai import Tool

        _PAI_TOOLS.extend(Tool(fn) for fn in ASYNC.values())
    return _PAI_TOOLS


async def _pydantic_ai(episode: Episode, tethered: bool) -> Ending:
    from pydantic_ai import Agent
    from pydantic_ai.usage import UsageLimits

    agent = Agent(pydantic_model(), instructions=SYSTEM, tools=_pydantic_tools())
    limits = UsageLimits(request_limit=MAX_TURNS)
    if tethered:
        from tether.integrations import pydantic_ai

        outcome = await pydantic_ai.run(
            agent, PROMPT, guard=_guard(episode), side_effects=LOOKUPS, usage_limits=limits
        )
        return _told(outcome)
    try:
        result = await agent.run(PROMPT, usage_limits=limits)
    except Exception:
        return Ending(CRASH_TEXT, "crash")
    return Ending(str(result.output), "answer")


# --- the table --------------------------------------------------------------------------------

Runner = Callable[[Episode], Ending]


def _virtual(make: Callable[[Episode], Coroutine[Any, Any, Ending]]) -> Runner:
    return lambda episode: run_virtual(episode.clock, make(episode))


POLICIES: dict[str, Runner] = {
    "naive": _virtual(lambda e: _hand_loop(e, retry_tools=False)),
    "tenacity": _virtual(lambda e: _hand_loop(e, retry_tools=True)),
    "langchain": _virtual(lambda e: _langchain(e, tethered=False)),
    "openai-agents": _virtual(lambda e: _openai_agents(e, tethered=False)),
    "pydantic-ai": _virtual(lambda e: _pydantic_ai(e, tethered=False)),
    "tether": lambda e: _tether_anthropic(e, LOOKUPS),
    "tether-openai": _virtual(_tether_openai),
    "tether-langchain": _virtual(lambda e: _langchain(e, tethered=True)),
    "tether-openai-agents": _virtual(lambda e: _openai_agents(e, tethered=True)),
    "tether-pydantic-ai": _virtual(lambda e: _pydantic_ai(e, tethered=True)),
    "tether-no-lookup": lambda e: _tether_anthropic(e, None),
    "tether-blind-lookup": lambda e: _tether_anthropic(e, BLIND_LOOKUPS),
    "tether-5-attempts": lambda e: _tether_anthropic(e, LOOKUPS, attempts=5),
    "adk": _virtual(lambda e: _frameworks().adk(e, tethered=False)),
    "tether-adk": _virtual(lambda e: _frameworks().adk(e, tethered=True)),
    "strands": _virtual(lambda e: _frameworks().strands(e, tethered=False)),
    "tether-strands": _virtual(lambda e: _frameworks().strands(e, tethered=True)),
    "crewai": _virtual(lambda e: _crewai().crewai(e, tethered=False)),
    "tether-crewai": _virtual(lambda e: _crewai().crewai(e, tethered=True)),
    "litellm": _virtual(lambda e: _litellm().litellm_loop(e, tethered=False)),
    "tether-litellm": _virtual(lambda e: _litellm().litellm_loop(e, tethered=True)),
}


def _litellm() -> Any:
    """The LiteLLM policies (run where LiteLLM is installed: .venv-crewai)."""
    from tether.bench import _tau_litellm

    return _tau_litellm


def _crewai() -> Any:
    """CrewAI's policies (run where it is installed: .venv-crewai)."""
    from tether.bench import _tau_crewai

    return _tau_crewai


def _frameworks() -> Any:
    """Google ADK's and Strands' policies (run where they are installed: .venv-frameworks)."""
    from tether.bench import _tau_frameworks

    return _tau_frameworks


#: What ``--suite tau`` runs unless told: the loops and frameworks, and tether's loop and
#: adapters. Named with ``--tau-policy`` (or ``all``): ``tether-no-lookup`` and
#: ``tether-blind-lookup`` (what a lookup is for), ``tether-5-attempts`` (``tether`` with the
#: default ``RetryPolicy(max_attempts=5)``), and ``tether-openai``, whose figures are
#: ``tether``'s (the same loop and decisions, async) at three times the cost, spent building
#: the OpenAI SDK's requests.
#: ``adk``, ``tether-adk``, ``strands`` and ``tether-strands`` run where those frameworks are
#: installed (``.venv-frameworks``), so only when named; ``crewai``, ``tether-crewai``,
#: ``litellm`` and ``tether-litellm`` likewise (``.venv-crewai``).
EXTRA_POLICIES = (
    "tether-no-lookup",
    "tether-blind-lookup",
    "tether-5-attempts",
    "tether-openai",
    "adk",
    "tether-adk",
    "strands",
    "tether-strands",
    "crewai",
    "tether-crewai",
    "litellm",
    "tether-litellm",
)
DEFAULT_POLICIES = tuple(p for p in POLICIES if p not in EXTRA_POLICIES)


#: the package each framework policy needs (``all`` takes a policy whose package is installed)
_NEEDS = {"adk": "google.adk", "tether-adk": "google.adk", "strands": "strands",
          "tether-strands": "strands", "crewai": "crewai", "tether-crewai": "crewai",
          "litellm": "litellm", "tether-litellm": "litellm"}  # fmt: skip


#: where each framework policy runs: its extra and the repository's venv that has it
_WHERE = {"google.adk": ("adk", ".venv-frameworks"), "strands": ("strands", ".venv-frameworks"),
          "crewai": ("crewai", ".venv-crewai"), "litellm": ("litellm", ".venv-crewai")}  # fmt: skip


def missing(names: list[str]) -> str | None:
    """Why some of ``names`` cannot run here (their framework is not installed), else None."""
    ready = set(installed())
    lacking = [p for p in names if p in _NEEDS and p not in ready]
    if not lacking:
        return None
    said = []
    for package in dict.fromkeys(_NEEDS[p] for p in lacking):
        extra, venv = _WHERE[package]
        who = ", ".join(p for p in lacking if _NEEDS[p] == package)
        said.append(
            f"{who} need {package}, which is not installed here: pip install "
            f"'tether[{extra}]' (in a checkout, `make {venv}/.installed` builds {venv} with it)"
        )
    return "tau policy " + "; ".join(said)


def installed() -> list[str]:
    """Every policy this environment can run (``--tau-policy all``)."""
    import importlib.util

    def can(name: str) -> bool:
        try:
            return importlib.util.find_spec(_NEEDS[name]) is not None
        except ModuleNotFoundError:
            return False

    return [p for p in POLICIES if p not in _NEEDS or can(p)]


def run_policy(policy: str, episode: Episode) -> Ending:
    """Run one episode under ``policy``."""
    return POLICIES[policy](episode)
