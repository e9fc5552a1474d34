"""What the MCP adapters share: a tool's hints read with the protocol's defaults, and one
tool call through a run. :mod:`tether.integrations.mcp` (a guarded ``ClientSession``) and
:mod:`tether.integrations._mcp_agents` (a guarded Agents SDK MCP server) both use it, so
neither imports the other's module for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tether import Run, ToolError
from tether._errors import require

__all__ = ["HINTS", "Tools", "check", "may_destroy", "may_repeat", "through"]


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


def check(
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


class Tools:
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


async def through(
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
