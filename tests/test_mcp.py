"""MCP tool sessions under a run, with the MCP SDK's in-process client and server."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import pytest
from mcp.client import Client
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

import tether
from tether import Guard, LoopPolicy, RetryPolicy, StopReason
from tether.integrations import mcp as ta_mcp


def shop() -> tuple[MCPServer, dict[str, list[Any]]]:
    server = MCPServer("shop")
    seen: dict[str, list[Any]] = {"search": [], "issue_refund": [], "order_status": []}

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def search(q: str) -> str:
        seen["search"].append(q)
        return "no result"

    @server.tool()
    def issue_refund(order: str, uuid: str = "") -> str:
        seen["issue_refund"].append(order)  # the refund commits ...
        raise RuntimeError("payments-db timed out after commit")  # ... and the reply is lost

    @server.tool(annotations=ToolAnnotations(idempotent_hint=True))
    async def order_status(order: str) -> str:
        seen["order_status"].append(order)
        if len(seen["order_status"]) == 1:
            await asyncio.sleep(5)  # the first call hangs
        return f"{order}: shipped"

    return server, seen


@pytest.fixture(autouse=True)
def _quiet_sdk_logs() -> None:
    logging.getLogger("mcp").setLevel(logging.CRITICAL)


def test_a_stuck_loop_over_a_read_only_tool_runs_it_twice() -> None:
    """search(q="invoice 99") forever: 2 executions, then REPEATED_ACTION."""
    server, seen = shop()

    async def main() -> tether.Outcome:
        async with (
            Client(server) as client,
            Guard(loops=LoopPolicy(max_no_progress=None)).start() as run,
        ):
            session = ta_mcp.guarded(client.session, run)
            while run.proceed():
                result = await session.call_tool("search", {"q": "invoice 99"})
                assert result.content[0].text == "no result"
        return run.outcome

    out = asyncio.run(main())
    assert seen["search"] == ["invoice 99", "invoice 99"]
    assert out.stopped_because is StopReason.REPEATED_ACTION


def test_an_unannotated_refund_runs_at_most_once() -> None:
    """issue_refund declares nothing: non-idempotent; re-issued with a fresh uuid it is not
    executed again, and the model reads the tool's own error text (redacted)."""
    server, seen = shop()
    errors: list[str] = []

    async def main() -> None:
        async with Client(server) as client, Guard(retry=RetryPolicy(base=0.01)).start() as run:
            session = ta_mcp.guarded(client.session, run)
            for _ in range(3):
                run.proceed()
                try:
                    await session.call_tool(
                        "issue_refund", {"order": "A-1", "uuid": uuid.uuid4().hex}
                    )
                except tether.ToolError as exc:
                    errors.append(exc.model_message)
            run.succeed()

    asyncio.run(main())
    assert seen["issue_refund"] == ["A-1"]
    assert errors and all("Error executing tool issue_refund" in e for e in errors)


def test_an_idempotent_tool_is_retried_through_a_transient_failure() -> None:
    """order_status is idempotent: its hanging first call times out and is retried."""
    server, seen = shop()

    async def main() -> str:
        async with Client(server) as client, Guard(retry=RetryPolicy(base=0.01)).start() as run:
            session = ta_mcp.guarded(client.session, run, timeout=0.3)
            run.proceed()
            result = await session.call_tool("order_status", {"order": "A-1"})
            run.succeed()
            return str(result.content[0].text)

    assert asyncio.run(main()) == "A-1: shipped"
    assert seen["order_status"] == ["A-1", "A-1"]


def test_overrides_and_list_tools_pass_through() -> None:
    """list_tools is the session's; idempotent= overrides what a tool declares."""
    server, seen = shop()

    async def main() -> list[str]:
        async with Client(server) as client, Guard(retry=RetryPolicy(base=0.01)).start() as run:
            session = ta_mcp.guarded(
                client.session, run, server="shop", idempotent={"search": False}
            )
            names = [t.name for t in (await session.list_tools()).tools]
            run.proceed()
            first = await session.call_tool("search", {"q": "x"})
            again = await session.call_tool("search", {"q": "x"})  # replayed from the ledger
            assert first.content[0].text == again.content[0].text == "no result"
            run.succeed()
            return names

    assert sorted(asyncio.run(main())) == ["issue_refund", "order_status", "search"]
    assert seen["search"] == ["x"]
