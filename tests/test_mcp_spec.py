"""MCP's defaults for what a tool declares, over stdio (a real server subprocess) and in
process: an unannotated tool runs at most once within a request and never replays into
another; a switch for servers whose unannotated tools are reads; the hints honoured; the
guarded server as the OpenAI Agents SDK's MCP server."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

import tether
from mcp_server import build
from tether import Guard, Ledger, RetryPolicy
from tether.integrations import mcp as ta_mcp

SERVER = str(Path(__file__).with_name("mcp_server.py"))
Connect = Callable[[], AbstractAsyncContextManager[Any]]


@pytest.fixture(autouse=True)
def _quiet_sdk_logs() -> None:
    logging.getLogger("mcp").setLevel(logging.CRITICAL)


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "calls.log"
    path.touch()
    return path


def calls(log: Path, tool: str = "get_weather") -> int:
    """How many calls reached ``tool`` on the server."""
    return sum(1 for line in log.read_text().splitlines() if line.startswith(tool + " "))


def connector(transport: str, log: Path) -> Connect:
    """A fresh client session to the test server: a subprocess over stdio, or in process."""

    @asynccontextmanager
    async def stdio() -> AsyncIterator[Any]:
        params = StdioServerParameters(
            command=sys.executable, args=[SERVER], env={"MCP_CALL_LOG": str(log)}
        )
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session

    @asynccontextmanager
    async def in_process() -> AsyncIterator[Any]:
        async with Client(build(str(log))) as client:
            yield client.session

    return stdio if transport == "stdio" else in_process


TRANSPORTS = ["stdio", "in-process"]


async def ask(
    connect: Connect, guard: Guard, tool: str, times: int, key: str | None = None, **options: Any
) -> list[str]:
    """One conversation on its own session: the model asks ``tool(city="London")`` ``times``
    times; the texts it reads."""
    texts = []
    async with connect() as session, guard.start(task="weather", key=key) as run:
        guarded = ta_mcp.guarded(session, run, **options)
        for _ in range(times):
            run.proceed()
            result = await guarded.call_tool(tool, {"city": "London"})
            texts.append(result.content[0].text)
        run.succeed()
    return texts


# --- an unannotated tool: the protocol's defaults ------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_two_conversations_on_one_guard_each_reach_the_server(transport: str, log: Path) -> None:
    """Two runs (two requests) on one Guard: get_weather(London) runs in each."""
    connect, guard = connector(transport, log), Guard()

    async def main() -> list[str]:
        return [
            *(await ask(connect, guard, "get_weather", 1)),
            *(await ask(connect, guard, "get_weather", 1)),
        ]

    assert asyncio.run(main()) == [
        "London: 22 degrees (reading 1)",
        "London: 22 degrees (reading 2)",
    ]
    assert calls(log) == 2


def test_a_persistent_ledger_replays_nothing_into_a_new_conversation(
    tmp_path: Path, log: Path
) -> None:
    """The ledger outlives the process (SQLite, two Guards): a new request runs again."""
    connect, path = connector("in-process", log), str(tmp_path / "ledger.db")

    async def main() -> None:
        for _ in range(2):  # two processes, one after the other
            await ask(connect, Guard(ledger=Ledger.sqlite(path)), "get_weather", 1)

    asyncio.run(main())
    assert calls(log) == 2


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_within_one_request_an_unannotated_tool_runs_at_most_once(
    transport: str, log: Path
) -> None:
    """Not idempotent by the protocol's default: asked twice in one run, it runs once and
    the repeat reads the recorded result; a retry of the same request (key=) too."""
    connect, guard = connector(transport, log), Guard()

    async def main() -> tuple[list[str], list[str]]:
        first = await ask(connect, guard, "get_weather", 2, key="ticket-7")
        again = await ask(connect, guard, "get_weather", 1, key="ticket-7")
        return first, again

    first, again = asyncio.run(main())
    assert first == ["London: 22 degrees (reading 1)"] * 2 and again == first[:1]
    assert calls(log) == 1


# --- the switch for servers whose unannotated tools are reads ------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_unannotated_reads_run_every_time(transport: str, log: Path) -> None:
    """unannotated_reads=True: get_weather is a read, run again on every call."""
    connect = connector(transport, log)
    texts = asyncio.run(ask(connect, Guard(), "get_weather", 2, unannotated_reads=True))
    assert texts == ["London: 22 degrees (reading 1)", "London: 22 degrees (reading 2)"]
    assert calls(log) == 2


def test_the_switch_does_not_touch_a_tool_that_declares_a_hint(log: Path) -> None:
    """add_alert declares destructiveHint=false only: still not idempotent, so once."""
    texts = asyncio.run(
        ask(connector("in-process", log), Guard(), "add_alert", 2, unannotated_reads=True)
    )
    assert texts == ["alert 1 for London"] * 2 and calls(log, "add_alert") == 1


# --- the hints, when given -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "executions"),
    [
        ("get_weather", 1),  # nothing declared: not read-only, destructive, not idempotent
        ("add_alert", 1),  # destructiveHint=false: additive, still not idempotent
        ("reset_station", 2),  # idempotentHint=true (destructive): may run again
        ("forecast", 3),  # readOnlyHint=true: its hanging first call is retried, then run again
    ],
)
def test_each_hint_decides_what_may_run_again(tool: str, executions: int, log: Path) -> None:
    """Asked twice in one run (with a 0.5 s timeout per call)."""
    connect = connector("in-process", log)
    guard = Guard(retry=RetryPolicy(base=0.01))
    asyncio.run(ask(connect, guard, tool, 2, timeout=0.5))
    assert calls(log, tool) == executions


def test_an_override_beats_the_annotations(log: Path) -> None:
    connect = connector("in-process", log)
    asyncio.run(ask(connect, Guard(), "get_weather", 2, idempotent={"get_weather": True}))
    asyncio.run(ask(connect, Guard(), "reset_station", 2, idempotent={"reset_station": False}))
    assert calls(log) == 2 and calls(log, "reset_station") == 1


def test_may_repeat_reads_the_protocols_defaults() -> None:
    from mcp.types import Tool, ToolAnnotations

    def tool(**hints: Any) -> Tool:
        notes = ToolAnnotations(**hints) if hints else None
        return Tool(name="t", input_schema={"type": "object"}, annotations=notes)

    assert ta_mcp.may_repeat(tool()) is False
    assert ta_mcp.may_repeat(tool(), unannotated_reads=True) is True
    assert ta_mcp.may_repeat(tool(title="Weather"), unannotated_reads=True) is True
    assert ta_mcp.may_repeat(tool(read_only_hint=True)) is True
    assert ta_mcp.may_repeat(tool(read_only_hint=False), unannotated_reads=True) is False
    assert ta_mcp.may_repeat(tool(destructive_hint=False), unannotated_reads=True) is False
    assert ta_mcp.may_repeat(tool(destructive_hint=True, idempotent_hint=True)) is True


def test_bad_arguments_name_the_field() -> None:
    with Guard().start() as run:
        with pytest.raises(TypeError, match="unannotated_reads"):
            ta_mcp.guarded(object(), run, unannotated_reads="yes")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="idempotent"):
            ta_mcp.guarded(object(), run, idempotent={"get_weather": "no"})  # type: ignore[dict-item]
        with pytest.raises(TypeError, match=r"agents\.mcp\.MCPServer"):
            ta_mcp.agents_server(object(), run)


# --- the guarded server as the OpenAI Agents SDK's MCP server ---------------------------------


@pytest.mark.parametrize("unannotated_reads", [False, True])
def test_the_agents_sdk_runs_the_guarded_server(unannotated_reads: bool, log: Path) -> None:
    """Agent(mcp_servers=[agents_server(MCPServerStdio(...), run)]): the model asks
    get_weather(London) twice in one run; the server sees 1 call (2 as reads)."""
    from agents import Agent, Runner, set_tracing_disabled
    from agents.mcp import MCPServerStdio
    from agents.testing import ScriptedModel, assistant_message, function_call

    from tether.integrations import openai_agents as ta_agents

    set_tracing_disabled(True)
    steps: list[Any] = [
        [function_call("get_weather", {"city": "London"}, call_id=f"c{i}")] for i in range(2)
    ]
    steps.append([assistant_message("22 degrees in London.")])

    async def main() -> tuple[Any, tether.Outcome]:
        stdio = MCPServerStdio(
            {"command": sys.executable, "args": [SERVER], "env": {"MCP_CALL_LOG": str(log)}},
            name="weather",
        )
        with Guard().start(task="weather") as run:
            async with ta_mcp.agents_server(stdio, run, unannotated_reads=unannotated_reads) as s:
                agent = Agent(name="clerk", model=ScriptedModel(steps), mcp_servers=[s])
                result = await Runner.run(
                    agent, "weather in London?", hooks=ta_agents.TetherHooks(run)
                )
            run.succeed(result.final_output)
        return result, run.outcome

    result, outcome = asyncio.run(main())
    assert result.final_output == "22 degrees in London."
    assert calls(log) == (2 if unannotated_reads else 1)
    assert outcome.usage.tool_calls == 2 and outcome.status == "success"


# --- destructive tools wait for a person, when asked ------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_approve_destructive_asks_before_a_destructive_call(
    transport: str, log: Path, tmp_path: Path
) -> None:
    """approve_destructive=True: get_weather (nothing declared: possibly destructive) and
    reset_station (destructive, idempotent) wait for approval; forecast (read-only) and
    add_alert (destructiveHint=false) do not. Approved, the run resumes and the call runs once."""
    connect = connector(transport, log)
    records = tether.Records.sqlite(str(tmp_path / "records.db"))

    async def turn(guard: Guard, checkpoint: str | None = None) -> list[str]:
        ran: list[str] = []
        async with connect() as session:
            with guard.resume(checkpoint) if checkpoint else guard.start(task="weather") as run:
                guarded = ta_mcp.guarded(session, run, approve_destructive=True, timeout=2.0)
                for tool in ("add_alert", "get_weather", "reset_station"):
                    run.proceed()
                    await guarded.call_tool(tool, {"city": "London"})
                    ran.append(tool)
                run.succeed()
        outcomes.append(run.outcome)
        return ran

    outcomes: list[tether.Outcome] = []
    guard = Guard(records=records)
    assert asyncio.run(turn(guard)) == ["add_alert"]
    first = outcomes[-1]
    assert first.stopped_because is tether.StopReason.AWAITING_APPROVAL
    assert first.pending_approval is not None and first.pending_approval["tool"] == "get_weather"
    assert calls(log) == 0 and calls(log, "add_alert") == 1
    assert first.checkpoint_id is not None
    guard.approve(first.checkpoint_id, by="alice")
    assert asyncio.run(turn(guard, first.checkpoint_id)) == ["add_alert", "get_weather"]
    second = outcomes[-1]
    assert second.pending_approval is not None
    assert second.pending_approval["tool"] == "reset_station"
    assert calls(log) == 1 and calls(log, "add_alert") == 1  # nothing ran twice
    records.close()


def test_approve_destructive_needs_a_place_to_wait() -> None:
    with Guard().start() as run, pytest.raises(ValueError, match="checkpoints="):
        ta_mcp.guarded(object(), run, approve_destructive=True)


def test_may_destroy_reads_the_protocols_defaults() -> None:
    from mcp.types import Tool, ToolAnnotations

    def tool(**hints: Any) -> Tool:
        notes = ToolAnnotations(**hints) if hints else None
        return Tool(name="t", input_schema={"type": "object"}, annotations=notes)

    assert ta_mcp.may_destroy(tool()) is True
    assert ta_mcp.may_destroy(tool(), unannotated_reads=True) is False
    assert ta_mcp.may_destroy(tool(read_only_hint=True, destructive_hint=True)) is False
    assert ta_mcp.may_destroy(tool(destructive_hint=False)) is False
    assert ta_mcp.may_destroy(tool(idempotent_hint=True)) is True
