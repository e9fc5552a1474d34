"""MCP tool sessions, guarded: every ``call_tool`` goes through a tether run.

``guarded(session, run)`` has the surface of the MCP SDK's ``ClientSession``:
``await session.call_tool(name, arguments)`` and ``list_tools()``. Each call runs
through ``run.acall_tool``: loop checks, a per-call timeout, a breaker per server and
tool, retries at one layer for transport failures, and the ledger for side effects.

Whether a tool may be retried comes from its annotations (read once from
``list_tools()``): a read-only or idempotent tool is retried; every other tool is
non-idempotent and runs at most once per intent through the ledger. The protocol's
defaults make a tool that declares nothing non-idempotent, and so does tether;
``idempotent={"tool": True}`` overrides it per tool. A result with ``isError: true``
goes back as a :class:`tether.ToolError` with the tool's (redacted) text, which the
model may read: the server said it on purpose.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tether._errors import require
from tether.run._outcome import ToolError
from tether.run._run import Run

__all__ = ["GuardedSession", "guarded"]


def _text(result: Any) -> str:
    parts = [getattr(c, "text", "") for c in getattr(result, "content", None) or []]
    return " ".join(p for p in parts if p).strip() or "the tool reported an error"


class GuardedSession:
    """A ``ClientSession`` whose tool calls go through a tether run."""

    def __init__(self, session: Any, run: Run, *, server: str = "", timeout: float | None = None,
                 idempotent: Mapping[str, bool] | None = None,
                 lookup: Mapping[str, Callable[[str], Any]] | None = None) -> None:  # fmt: skip
        self.session = session
        self.run = run
        self.server = server
        self.timeout = timeout
        self.overrides = dict(idempotent or {})
        self.lookups = dict(lookup or {})
        self._safe: dict[str, bool] | None = None  # tool -> may be retried, from annotations

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)

    async def list_tools(self, *args: Any, **kwargs: Any) -> Any:
        """The session's ``list_tools``; the annotations are remembered."""
        result = await self.session.list_tools(*args, **kwargs)
        self._remember(result)
        return result

    def _remember(self, result: Any) -> None:
        safe = self._safe if self._safe is not None else {}
        for tool in getattr(result, "tools", None) or []:
            notes = getattr(tool, "annotations", None)
            read_only = bool(getattr(notes, "read_only_hint", None))
            idempotent = bool(getattr(notes, "idempotent_hint", None))
            safe[tool.name] = read_only or idempotent
        self._safe = safe

    async def _annotations(self) -> dict[str, bool]:
        if self._safe is None:
            page = await self.session.list_tools()
            self._remember(page)
            for _ in range(100):  # later pages, if the server paginates
                cursor = getattr(page, "next_cursor", None)
                if not cursor:
                    break
                types: Any = require("mcp.types", "mcp")
                page = await self.session.list_tools(
                    params=types.PaginatedRequestParams(cursor=cursor)
                )
                self._remember(page)
        assert self._safe is not None
        return self._safe

    async def call_tool(
        self, name: str, arguments: dict[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        """``ClientSession.call_tool`` through the run; returns the ``CallToolResult``."""
        safe = self.overrides.get(name)
        if safe is None:
            safe = (await self._annotations()).get(name, False)
        session = self.session

        async def call(**args: Any) -> Any:
            result = await session.call_tool(name, args, **kwargs)
            if getattr(result, "is_error", False):
                raise ToolError(_text(result))
            return result

        label = f"{self.server}/{name}" if self.server else name
        result = await self.run.acall_tool(label, call, dict(arguments or {}), timeout=self.timeout,
                                           idempotent=safe, lookup=self.lookups.get(name))  # fmt: skip
        if isinstance(result, dict):  # replayed from the ledger: the same result again
            types: Any = require("mcp.types", "mcp")
            return types.CallToolResult.model_validate(result)
        return result


def guarded(session: Any, run: Run, *, server: str = "", timeout: float | None = None,
            idempotent: Mapping[str, bool] | None = None,
            lookup: Mapping[str, Callable[[str], Any]] | None = None) -> GuardedSession:  # fmt: skip
    """``session`` (an MCP ``ClientSession``) with every tool call under ``run``.

    ``server`` names the server in breaker names and ledger keys (two servers' tools of
    the same name stay apart); ``timeout`` bounds each call; ``idempotent`` overrides
    the annotations per tool; ``lookup`` gives, per tool, the provider's records to ask
    when an earlier call's outcome is unknown.
    """
    return GuardedSession(
        session, run, server=server, timeout=timeout, idempotent=idempotent, lookup=lookup
    )
