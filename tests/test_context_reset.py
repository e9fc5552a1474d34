"""Cleanups run from another context leave that context's values alone (main venv).

A coroutine left mid-call (its loop shut down, Ctrl-C) and then closed or collected runs
its ``finally`` in whatever context is current there: each ``ContextVar.reset`` there
raised ``ValueError: <Token ...> was created in a different Context``, printed as
"Exception ignored in coroutine". Here: the virtual clock's deadline, the LangChain
middleware's, PydanticAI's and the OpenAI Agents SDK's runs (ADK and Strands:
``test_context_reset_frameworks.py``; CrewAI and LiteLLM: ``test_context_reset_crewai.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conformance.adapters.langchain import Middleware
from conformance.adapters.pydantic_ai import _model
from conformance.suite import ask, guard
from context_checks import (
    Abandoned,
    Hanging,
    abandoning,
    closed,
    collected,
    different_context,
    suspended,
    unraisables,
    waits,
)
from tether import VirtualClock
from tether.clock import _virtual_deadline


@pytest.fixture
def unraisable(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    yield from unraisables(monkeypatch)


def test_a_virtual_timeout_closed_from_another_context(unraisable: list[Any]) -> None:
    """acall_with_timeout closed elsewhere: no error, the closer's deadline as it was."""
    closed(suspended(VirtualClock().acall_with_timeout(5.0, waits)), _virtual_deadline)
    assert unraisable == []


def test_a_virtual_timeout_collected_in_another_context(unraisable: list[Any]) -> None:
    """The same, collected by the garbage collector."""
    left = [suspended(VirtualClock().acall_with_timeout(5.0, waits))]
    collected(left, _virtual_deadline)
    assert unraisable == []


def test_a_langchain_agent_left_in_its_tool_is_collected_elsewhere(
    tmp_path: Path, unraisable: list[Any]
) -> None:
    """The agent's loop shut down mid-tool-call (awrap_tool_call), its tasks collected
    elsewhere: nothing printed, the collector's value of the caller as it was."""
    from tether.integrations import langchain

    world = Hanging([ask(("search", {"q": "A-1"})), "done"])
    left: list[Any] = []
    with abandoning(world, left), pytest.raises(Abandoned):
        Middleware().run(world, guard(tmp_path), "async")
    collected(left, langchain._CALLER)
    assert different_context(unraisable) == []


def pydantic_agent(g: Any, world: Hanging) -> Any:
    """An agent built with its own TetherCapability, whose run waits (closed there)."""
    from pydantic_ai import Agent

    from tether.integrations import pydantic_ai as ta_pydantic

    agent: Any = Agent(_model(world), capabilities=[ta_pydantic.TetherCapability(g)])

    async def run(*args: Any, **kwargs: Any) -> Any:
        await waits()

    agent.run = run
    return agent


def test_a_pydantic_ai_run_closed_from_another_context(
    tmp_path: Path, unraisable: list[Any]
) -> None:
    """run() of an agent built with its TetherCapability, closed elsewhere: the closer's
    request for the next run as it was."""
    from tether.integrations import pydantic_ai as ta_pydantic

    g = guard(tmp_path)
    agent = pydantic_agent(g, Hanging(["done"]))
    closed(suspended(ta_pydantic.run(agent, "refund A-1", guard=g)), ta_pydantic._NEXT)
    assert unraisable == []


def test_a_nested_agents_sdk_run_closed_from_another_context(unraisable: list[Any]) -> None:
    """The Agents SDK's default runner under tether, closed mid-run elsewhere: the closer's
    active run as it was."""
    from tether.integrations import _agents_hooks

    class Inner:
        async def run(self, agent: Any, given: Any, **kwargs: Any) -> Any:
            await waits()

    runner = _agents_hooks._NestedRunner(Inner())  # type: ignore[arg-type]
    closed(suspended(runner.run(object(), "refund A-1")), _agents_hooks._ACTIVE)
    assert unraisable == []
