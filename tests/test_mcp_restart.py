"""An MCP server over streamable HTTP restarted on the same port (#40 case 7): the client's
session is lost ("Session not found"). A healthy tool is never "do not call it again": the
loss is transient, and with ``reconnect=`` the call is retried on a new session."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

import tether
from mcp_server import build
from tether import Guard, RetryPolicy, ToolError
from tether.integrations import mcp as ta_mcp


@pytest.fixture(autouse=True)
def _quiet_sdk_logs() -> None:
    for name in ("mcp", "httpx", "uvicorn"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


class Server:
    """The test server (tests/mcp_server.py) over streamable HTTP on a loopback port; each
    ``start`` is a new process's worth of state: the sessions of the last one are gone."""

    def __init__(self, log: Path) -> None:
        self.log = log
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        app = build(str(self.log)).streamable_http_app()
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            log_level="critical",
            timeout_graceful_shutdown=0.2,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        assert not self.thread.is_alive(), "server did not stop"

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    log = tmp_path / "calls.log"
    log.write_text("")
    running = Server(log)
    running.start()
    yield running
    running.stop()


def calls(server: Server, tool: str) -> int:
    return sum(1 for line in server.log.read_text().splitlines() if line.startswith(tool + " "))


async def after_a_restart(server: Server, reconnect: bool) -> dict[str, str]:
    """One conversation: a call, the server restarts, then each kind of tool is called;
    what the model reads of each."""
    read: dict[str, str] = {}
    async with AsyncExitStack() as stack:

        async def connect() -> Any:
            streams = await stack.enter_async_context(streamable_http_client(server.url))
            session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
            await session.initialize()
            return session

        session = await connect()
        guard = Guard(retry=RetryPolicy(max_attempts=3, base=0.01, cap=0.02))
        async with guard.start(task="weather") as run:
            options = {"reconnect": connect} if reconnect else {}
            guarded = ta_mcp.guarded(session, run, **options)
            run.proceed()
            await guarded.call_tool("reset_station", {"city": "Oslo"})
            server.restart()
            # idempotent, then an additive update (neither read-only nor idempotent)
            for tool in ("reset_station", "add_alert"):
                run.proceed()
                try:
                    result = await guarded.call_tool(tool, {"city": "Oslo"})
                    read[tool] = str(result.content[0].text)
                except ToolError as exc:
                    read[tool] = exc.model_message
            run.succeed()
    return read


def test_a_lost_session_is_transient_never_do_not_call_it_again(server: Server) -> None:
    """Without a way to reconnect, each call fails, and the model reads "temporarily
    unavailable", never "do not call it again" about a healthy tool; nothing ran."""
    read = asyncio.run(after_a_restart(server, reconnect=False))
    assert set(read) == {"reset_station", "add_alert"}
    for text in read.values():
        assert "temporarily unavailable" in text and "do not call it again" not in text
    assert (calls(server, "reset_station"), calls(server, "add_alert")) == (1, 0)


def test_reconnect_retries_the_call_on_a_new_session(server: Server) -> None:
    """With reconnect=, the idempotent tool and the additive update (refused before it ran:
    the ledger released it) each run once on the new session."""
    read = asyncio.run(after_a_restart(server, reconnect=True))
    assert read == {"reset_station": "Oslo: station reset", "add_alert": "alert 1 for Oslo"}
    assert (calls(server, "reset_station"), calls(server, "add_alert")) == (2, 1)


def test_classify_reads_a_lost_session() -> None:
    """The SDK's words for a lost session (the server's 404 body, the client's for a bare
    404) are transient and prove nothing ran; other MCP errors stay what they were."""
    for said in ("Session not found", "Session terminated"):
        verdict = tether.classify(MCPError(-32600, said))
        assert verdict.retryable and not verdict.outcome_unknown, said
    assert not tether.classify(MCPError(-32602, "Invalid params")).retryable


def test_reconnect_must_be_callable() -> None:
    with Guard().start() as run, pytest.raises(TypeError, match="reconnect"):
        ta_mcp.guarded(object(), run, reconnect="yes")
