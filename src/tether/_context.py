"""Taking a context variable's value back where it may not be ours to take."""

from __future__ import annotations

import contextvars
from typing import Any

__all__ = ["reset_if_here"]


def reset_if_here(var: contextvars.ContextVar[Any], token: contextvars.Token[Any]) -> None:
    """``var.reset(token)`` in the context that set it; elsewhere, nothing.

    A coroutine or generator closed or collected elsewhere (a task cancelled, its loop shut
    down, Ctrl-C) runs its ``finally`` in whatever context is current there: the context
    that set the value goes with it, and the current one is not ours to change (``reset``
    would raise ``ValueError`` there, printed as "Exception ignored" once per coroutine).
    """
    try:
        var.reset(token)
    except ValueError:
        pass
