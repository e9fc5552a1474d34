"""The keyword sets of a run's public calls, declared once for both shells.

:meth:`tether.Run.call_tool` and ``acall_tool`` take :class:`ToolOptions`,
``begin_model_call`` and ``abegin_model_call`` take :class:`ModelRequest`, and
``record_model_call`` takes :class:`ModelUsage`; the part that does the work has the one
signature with the defaults (an unknown keyword is a TypeError naming it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypedDict

__all__ = ["ModelRequest", "ModelUsage", "ToolOptions"]


class ToolOptions(TypedDict, total=False):
    """The options of one tool call (see :meth:`tether.Run.call_tool`)."""

    timeout: float | None
    idempotent: bool
    lookup: Callable[[str], Any] | None
    requires_approval: bool | Callable[[Mapping[str, Any]], bool]
    compensate: Callable[[Any], Any] | None
    volatile: Iterable[str]
    label: str | None
    allow_repeat: int | None
    passthrough: tuple[type[BaseException], ...]
    hands_over: bool
    reference: str | Callable[[Any], Any] | None


class ModelRequest(TypedDict, total=False):
    """A paid model request about to be sent (see :meth:`tether.Run.begin_model_call`)."""

    model: str
    provider: str | None
    estimated_input_tokens: int | None
    max_output_tokens: int | None


class ModelUsage(TypedDict, total=False):
    """What one model call used (see :meth:`tether.Run.record_model_call`)."""

    input_tokens: int
    output_tokens: int
    model: str
    cache_write_tokens: int
    cache_read_tokens: int
    cost_usd: float | None
    provider: str | None
    unmeasured: bool
