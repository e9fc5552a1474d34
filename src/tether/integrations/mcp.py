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

A result with ``isError: true`` goes back as a :class:`tether.ToolError` with the tool's
(redacted) text, which the model may read: the server said it on purpose.
:func:`agents_server` puts the same guard around an OpenAI Agents SDK MCP server.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tether._errors import require
from tether.run._outcome import ToolError
from tether.run._run import Run

__all__ = ["GuardedSession", "agents_server", "guarded", "may_destroy", "may_repeat"]

#: The hints of ``ToolAnnotations`` that say what a call does (``title`` says nothing).
HINTS = ("read_only_hint", "destructive_hint", "idempotent_hint")


def _text(result: Any) -> str:
    parts = [getattr(c, "text", "") for c in getattr(result, "content", None) or []]
    return " ".join(p for p in parts if p).strip() or "the tool reported an error"


def may_repeat(tool: Any, unannotated_reads: bool = False) -> bool:
    """Whether a call of the MCP ``tool`` may run again (a read or an idempotent tool),
    from its annotations and the protocol's defaults for the hints it leaves out."""
    notes = getattr(tool, "annotations", None)
    hints = [getattr(notes, hint, None) for hint in HINTS]
    if all(h is None for h in hints):
        return unannotated_reads
    read_only, _destructive, idempotent = hints
    return bool(read_only) or bool(idempotent)


def may_destroy(tool: Any, unannotated_reads: bool = False) -> bool:
    """Whether a call of the MCP ``tool`` may destroy something: not read-only, and
    ``destructiveHint`` true or left out (the protocol's default)."""
    notes = getattr(tool, "annotations", None)
    hints = [getattr(notes, hint, None) for hint in HINTS]
    if all(h is None for h in hints):
        return not unannotated_reads
    read_only, destructive, _idempotent = hints
    return not read_only and destructive is not False


def _check(
    run: Any, unannotated_reads: Any, idempotent: Any, approve_destructive: Any = False
) -> None:
    for name, flag in (
        ("unannotated_reads", unannotated_reads),
        ("approve_destructive", approve_destructive),
    ):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    if approve_destructive:
        from tether.integrations._common import require_a_place_to_wait

        require_a_place_to_wait(getattr(run, "guard", None), ["destructive MCP tools"])
    if idempotent is not None and (
        not isinstance(idempotent, Mapping)
        or not all(isinstance(k, str) and isinstance(v, bool) for k, v in idempotent.items())
    ):
        raise TypeError(f"idempotent must map tool names to True or False, got {idempotent!r}")


class _Tools:
    """What the listed tools may be: name -> may run again."""

    def __init__(
        self,
        unannotated_reads: bool,
        overrides: Mapping[str, bool] | None,
        approve_destructive: bool = False,
    ) -> None:
        self.unannotated_reads = unannotated_reads
        self.overrides = dict(overrides or {})
        self.approve_destructive = approve_destructive
        self.known: dict[str, bool] | None = None
        self.destructive: set[str] = set()

    def remember(self, tools: Any) -> None:
        known = self.known if self.known is not None else {}
        for tool in tools or []:
            known[tool.name] = may_repeat(tool, self.unannotated_reads)
            if may_destroy(tool, self.unannotated_reads):
                self.destructive.add(tool.name)
            else:
                self.destructive.discard(tool.name)
        self.known = known

    def needs_approval(self, name: str) -> bool:
        """Under ``approve_destructive``: a listed tool that may destroy, or an unlisted one."""
        if not self.approve_destructive:
            return False
        known = self.known or {}
        return name in self.destructive or (name not in known and not self.unannotated_reads)

    def lookup(self, name: str) -> bool | None:
        """Known for ``name`` (an override first); None until the tools were listed."""
        if name in self.overrides:
            return self.overrides[name]
        if self.known is None:
            return None
        return self.known.get(name, self.unannotated_reads)


async def _through(
    run: Run,
    label: str,
    name: str,
    call: Callable[..., Any],
    arguments: Mapping[str, Any] | None,
    safe: bool,
    timeout: float | None,
    lookup: Callable[[str], Any] | None,
    approval: bool = False,
) -> Any:
    """One MCP tool call under ``run``; a result replayed from the ledger comes back as a
    ``CallToolResult`` again."""

    async def attempt(**args: Any) -> Any:
        result = await call(args)
        if getattr(result, "is_error", False):
            raise ToolError(_text(result))
        return result

    result = await run.acall_tool(
        label,
        attempt,
        dict(arguments or {}),
        timeout=timeout,
        idempotent=safe,
        lookup=lookup,
        requires_approval=approval,
    )
    if isinstance(result, dict):  # replayed from the ledger: the same result again
        types: Any = require("mcp.types", "mcp")
        return types.CallToolResult.model_validate(result)
    return result


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
    ) -> None:
        _check(run, unannotated_reads, idempotent, approve_destructive)
        self.session = session
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
        session = self.session
        label = f"{self.server}/{name}" if self.server else name

        async def call(args: dict[str, Any]) -> Any:
            return await session.call_tool(name, args, **kwargs)

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


def guarded(
    session: Any,
    run: Run,
    *,
    server: str = "",
    timeout: float | None = None,
    idempotent: Mapping[str, bool] | None = None,
    lookup: Mapping[str, Callable[[str], Any]] | None = None,
    unannotated_reads: bool = False,
    approve_destructive: bool = False,
) -> GuardedSession:
    """``session`` (an MCP ``ClientSession``) with every tool call under ``run``.

    ``server`` names the server in breaker names and ledger keys (two servers' tools of
    the same name stay apart); ``timeout`` bounds each call; ``idempotent`` overrides
    the annotations per tool; ``lookup`` gives, per tool, the provider's records to ask
    when an earlier call's outcome is unknown; ``unannotated_reads=True`` treats the
    tools that declare no hints as reads (the protocol's default makes them effects);
    ``approve_destructive=True`` makes every call of a tool that may be destructive wait
    for a person's approval (the guard needs ``checkpoints=`` or ``records=``).
    """
    return GuardedSession(
        session,
        run,
        server=server,
        timeout=timeout,
        idempotent=idempotent,
        lookup=lookup,
        unannotated_reads=unannotated_reads,
        approve_destructive=approve_destructive,
    )


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
