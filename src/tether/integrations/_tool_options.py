"""The per-tool options every adapter takes, declared once: ``side_effects`` (positional,
after the guard or run) and :class:`ToolOptions` (keywords), by tool name."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeAlias, TypedDict

__all__ = ["SideEffects", "ToolOptions"]

#: the non-idempotent tools: a list of names, or a mapping of name to its ``lookup`` (None when
#: it has none); they run at most once per intent through the guard's ledger
SideEffects: TypeAlias = Mapping[str, Callable[[str], Any] | None] | Iterable[str] | None


class ToolOptions(TypedDict, total=False):
    """The per-tool options of every adapter that takes a framework's tools by name
    (``**options: Unpack[ToolOptions]``), each a mapping by tool name (``hand_over`` a list
    of names); what ``tether.Tool`` says of one tool, said of a framework's tools."""

    #: seconds per attempt
    timeouts: Mapping[str, float] | None
    #: True, or a predicate of the arguments: the call waits for a person's approval
    requires_approval: Mapping[str, bool | Callable[[Mapping[str, Any]], bool]] | None
    #: how to undo the tool's effect (``run.rollback()``): a function of its result
    compensate: Mapping[str, Callable[[Any], Any]] | None
    #: what the customer reads for the tool's effect (``{"issue_refund": "refund"}``)
    labels: Mapping[str, str] | None
    #: the tools whose call hands the customer to a person (the run ends "escalated")
    hand_over: Iterable[str] | None
    #: the argument paths the model fills anew on every call (``{"pay": ["meta.nonce"]}``)
    volatile: Mapping[str, Iterable[str]] | None
