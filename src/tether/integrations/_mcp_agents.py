"""An OpenAI Agents SDK MCP server whose tool calls go through a tether run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tether import Run
from tether._errors import require
from tether.integrations._mcp_core import Tools as _Tools
from tether.integrations._mcp_core import through as _through

require("agents", "openai-agents")

from agents.mcp import MCPServer  # noqa: E402 - after the extra check

__all__ = ["guarded_agents_server"]

#: The wrapped server's settings that the guarded one takes over as they are.
_SETTINGS = (
    "use_structured_content",
    "tool_meta_resolver",
    "custom_data_extractor",
    "tool_input_guardrails",
    "tool_output_guardrails",
)


class GuardedAgentsServer(MCPServer):
    """The wrapped server for everything but ``call_tool``, which goes through the run."""

    def __init__(
        self,
        server: MCPServer,
        run: Run,
        tools: _Tools,
        timeout: float | None,
        lookups: dict[str, Callable[[str], Any]],
    ) -> None:
        super().__init__(
            failure_error_function=server._failure_error_function,
            **{name: getattr(server, name) for name in _SETTINGS},
        )
        self._needs_approval_policy = server._needs_approval_policy  # the SDK's own approvals
        self.server: Any = server  # the SDK's connect/cleanup are untyped
        self.run = run
        self._tools = tools
        self.timeout = timeout
        self.lookups = lookups

    @property
    def name(self) -> str:
        return str(self.server.name)

    @property
    def cached_tools(self) -> Any:
        return self.server.cached_tools

    async def connect(self) -> None:
        await self.server.connect()

    async def cleanup(self) -> None:
        await self.server.cleanup()

    async def __aenter__(self) -> GuardedAgentsServer:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.cleanup()

    async def list_tools(self, run_context: Any = None, agent: Any = None) -> Any:
        tools = await self.server.list_tools(run_context, agent)
        self._tools.remember(tools)
        return tools

    async def call_tool(
        self, tool_name: str, arguments: dict[str, Any] | None, meta: dict[str, Any] | None = None
    ) -> Any:
        safe = self._tools.lookup(tool_name)
        if safe is None:
            self._tools.remember(await self.server.list_tools())
            safe = bool(self._tools.lookup(tool_name))
        server = self.server

        async def call(args: dict[str, Any]) -> Any:
            if meta is None:
                return await server.call_tool(tool_name, args)
            return await server.call_tool(tool_name, args, meta=meta)

        label = f"{server.name}/{tool_name}"
        return await _through(
            self.run,
            label,
            tool_name,
            call,
            arguments,
            safe,
            self.timeout,
            self.lookups.get(tool_name),
            self._tools.needs_approval(tool_name),
        )

    async def list_prompts(self) -> Any:
        return await self.server.list_prompts()

    async def get_prompt(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        return await self.server.get_prompt(name, arguments)

    async def list_resources(self, cursor: str | None = None) -> Any:
        return await self.server.list_resources(cursor)

    async def list_resource_templates(self, cursor: str | None = None) -> Any:
        return await self.server.list_resource_templates(cursor)

    async def read_resource(self, uri: str) -> Any:
        return await self.server.read_resource(uri)


def guarded_agents_server(
    server: Any,
    run: Run,
    tools: _Tools,
    timeout: float | None,
    lookups: dict[str, Callable[[str], Any]],
) -> GuardedAgentsServer:
    if not isinstance(server, MCPServer):
        raise TypeError(f"server must be an agents.mcp.MCPServer, got {server!r}")
    return GuardedAgentsServer(server, run, tools, timeout, lookups)
