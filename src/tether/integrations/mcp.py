"""MCP tool sessions, guarded: every ``call_tool`` goes through a tether run.

``guarded(session, run)`` has the surface of the MCP SDK's ``ClientSession``:
``await session.call_tool(name, arguments)`` and ``list_tools()``. Each call runs
through ``run.acall_tool``: loop checks, a per-call timeout, a breaker per server and
tool, retries at one layer for transport failures, and the ledger for side effects.

What a tool may be is read once from its annotations in ``list_tools()``, with the
protocol's defaults for what it leaves out (``readOnlyHint`` false, ``destructiveHint``
true, ``idempotentHint`` false):

* a tool that declares ``readOnlyHint`` or ``idempotentHint`` is retried through
  transient failures and runs again each time the model calls it;
* every other tool (``destructiveHint`` true or false: a destructive update and an
  additive one both repeat their effect) runs at most once per intent *within the
  request* the run serves (``guard.start(key=...)``; each run is its own request by
  default): a repeat within the request gets the recorded result, a retry never runs it
  twice, and another request or conversation runs it again;
* a tool that declares none of the three hints follows the protocol's defaults, so it is
  such an effect, unless ``unannotated_reads=True`` says that this server's unannotated
  tools are reads (as those of many servers are); ``idempotent={"tool": True}``
  overrides any of it per tool.

``destructiveHint`` changes nothing about retries (an additive update repeated adds
again); with ``approve_destructive=True`` a call of a tool that may be destructive (it says
so, or leaves the hint out, and is not read-only) waits for a person's approval before it
runs (the run stops ``AWAITING_APPROVAL``; ``guard.approve`` and ``guard.resume`` go on),
as the protocol asks clients to confirm destructive operations.

A server that lost the session (restarted: "Session not found") refused the call before
anything ran: a transient failure, never "do not call it again". With ``reconnect=`` (an
async callable returning a new, initialized session) the wrapper takes a new session and
the run retries the call on it.

A result with ``isError: true`` goes back as a :class:`tether.ToolError` with the tool's
(redacted) text, which the model may read: the server said it on purpose.
:func:`agents_server` puts the same guard around an OpenAI Agents SDK MCP server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from tether import Run
from tether._errors import require
from tether.classification._classify import session_lost
from tether.integrations._arguments import same_arguments
from tether.integrations._mcp_core import Tools as _Tools
from tether.integrations._mcp_core import check as _check
from tether.integrations._mcp_core import may_destroy, may_repeat
from tether.integrations._mcp_core import through as _through

__all__ = ["GuardedSession", "agents_server", "guarded", "may_destroy", "may_repeat"]


class GuardedSession:
    """A ``ClientSession`` whose tool calls go through a tether run."""

    def __init__(
        self,
        session: Any,
        run: Run,
        *,
        server: str = "",
        timeout: float | None = None,
        idempotent: Mapping[str, bool] | None = None,
        lookup: Mapping[str, Callable[[str], Any]] | None = None,
        unannotated_reads: bool = False,
        approve_destructive: bool = False,
        reconnect: Callable[[], Awaitable[Any]] | None = None,
    ) -> None:
        _check(run, unannotated_reads, idempotent, approve_destructive)
        if reconnect is not None and not callable(reconnect):
            raise TypeError(f"reconnect must be an async callable, got {reconnect!r}")
        self.session = session
        self.reconnect = reconnect
        self._reconnecting = asyncio.Lock()
        self.run = run
        self.server = server
        self.timeout = timeout
        self.lookups = dict(lookup or {})
        self._tools = _Tools(unannotated_reads, idempotent, approve_destructive)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)

    async def list_tools(self, *args: Any, **kwargs: Any) -> Any:
        """The session's ``list_tools``; the annotations are remembered."""
        result = await self.session.list_tools(*args, **kwargs)
        self._tools.remember(getattr(result, "tools", None))
        return result

    async def _may_repeat(self, name: str) -> bool:
        known = self._tools.lookup(name)
        if known is not None:
            return known
        page = await self.session.list_tools()
        self._tools.remember(getattr(page, "tools", None))
        for _ in range(100):  # later pages, if the server paginates
            cursor = getattr(page, "next_cursor", None)
            if not cursor:
                break
            types: Any = require("mcp.types", "mcp")
            page = await self.session.list_tools(params=types.PaginatedRequestParams(cursor=cursor))
            self._tools.remember(getattr(page, "tools", None))
        return bool(self._tools.lookup(name))

    async def call_tool(
        self, name: str, arguments: dict[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        """``ClientSession.call_tool`` through the run; returns the ``CallToolResult``."""
        safe = await self._may_repeat(name)
        label = f"{self.server}/{name}" if self.server else name

        async def call(args: dict[str, Any]) -> Any:
            session = self.session
            try:
                return await session.call_tool(name, args, **kwargs)
            except Exception as exc:
                if self.reconnect is not None and session_lost(exc):
                    await self._renew(session)
                raise  # transient: the run retries it, on the new session

        approval = self._tools.needs_approval(name)
        return await _through(
            self.run,
            label,
            name,
            call,
            arguments,
            safe,
            self.timeout,
            self.lookups.get(name),
            approval,
        )

    async def _renew(self, lost: Any) -> None:
        """A new session in place of ``lost`` (once, however many calls found it lost)."""
        async with self._reconnecting:
            if self.session is lost and self.reconnect is not None:
                self.session = await self.reconnect()


@same_arguments(GuardedSession)
def guarded(*args: Any, **options: Any) -> GuardedSession:
    """``session`` (an MCP ``ClientSession``) with every tool call under ``run``.

    ``server`` names the server in breaker names and ledger keys (two servers' tools of
    the same name stay apart); ``timeout`` bounds each call; ``idempotent`` overrides
    the annotations per tool; ``lookup`` gives, per tool, the provider's records to ask
    when an earlier call's outcome is unknown; ``unannotated_reads=True`` treats the
    tools that declare no hints as reads (the protocol's default makes them effects);
    ``approve_destructive=True`` makes every call of a tool that may be destructive wait
    for a person's approval (the guard needs ``checkpoints=`` or ``records=``);
    ``reconnect`` (an async callable returning a new, initialized session) replaces a
    session the server lost (it restarted: "Session not found") before the call's retry.
    """
    return GuardedSession(*args, **options)


def agents_server(
    server: Any,
    run: Run,
    *,
    timeout: float | None = None,
    idempotent: Mapping[str, bool] | None = None,
    lookup: Mapping[str, Callable[[str], Any]] | None = None,
    unannotated_reads: bool = False,
    approve_destructive: bool = False,
) -> Any:
    """An OpenAI Agents SDK MCP server (``MCPServerStdio``, ``MCPServerStreamableHttp``...)
    whose tool calls go through ``run``: ``Agent(mcp_servers=[agents_server(server, run)])``.

    The SDK's own handling stays: connecting, the tools list and its filter and cache,
    approvals, prompts and resources are the wrapped server's. The tools' annotations
    decide as for :func:`guarded`; the ledger keys carry the server's name.
    """
    from tether.integrations._mcp_agents import guarded_agents_server

    _check(run, unannotated_reads, idempotent, approve_destructive)
    tools = _Tools(unannotated_reads, idempotent, approve_destructive)
    return guarded_agents_server(server, run, tools, timeout, dict(lookup or {}))
