"""A small MCP server for the MCP tests: one tool per kind of annotation.

Run as a script it serves over stdio (a real subprocess, as an IDE or agent starts a
server); imported, ``build(log)`` gives the same server for the in-process client. Every
call that reaches a tool is written as a line to the file ``log``.
"""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations


def build(log: str) -> MCPServer:
    server = MCPServer("weather")

    def note(tool: str, city: str) -> int:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{tool} {city}\n")
        with open(log, encoding="utf-8") as f:
            return sum(1 for line in f if line.startswith(tool + " "))

    @server.tool()  # declares nothing, as every example server of the MCP SDK
    def get_weather(city: str) -> str:
        """The weather in a city."""
        n = note("get_weather", city)
        return f"{city}: 22 degrees (reading {n})"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def forecast(city: str) -> str:
        """Tomorrow's weather; the first call ever hangs."""
        if note("forecast", city) == 1:
            await asyncio.sleep(5)
        return f"{city}: sunny tomorrow"

    @server.tool(annotations=ToolAnnotations(destructive_hint=False))
    def add_alert(city: str) -> str:
        """Adds an alert (an additive update: not idempotent)."""
        return f"alert {note('add_alert', city)} for {city}"

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=True))
    def reset_station(city: str) -> str:
        """Resets a station (destructive, and idempotent)."""
        note("reset_station", city)
        return f"{city}: station reset"

    return server


if __name__ == "__main__":
    build(os.environ.get("MCP_CALL_LOG", os.devnull)).run("stdio")
    sys.exit(0)
