"""A tool's function as a call reads it: whether it is async, and its reference (what
every ``call_tool`` asks, apart from :class:`tether.Tool`, which loads with the first
tool)."""

from __future__ import annotations

import functools
import inspect
from inspect import CO_COROUTINE
from types import FunctionType
from typing import Any

__all__ = ["check_reference"]


def check_reference(name: str, reference: object) -> None:
    """A tool's ``reference``: a field name, a function of the result, or None."""
    if (
        reference is not None
        and not callable(reference)
        and (not isinstance(reference, str) or not reference.strip())
    ):
        raise TypeError(
            f"Tool {name!r}: reference must name a field of the result (str) or be a "
            f"function of the result, got {reference!r}"
        )


def _is_async(fn: Any) -> bool:
    """A coroutine function, also behind functools.partial or an async ``__call__``."""
    if type(fn) is FunctionType:  # most tools: no partial, no __call__ to look at
        # the flag inspect.iscoroutinefunction reads, without its calls (asked on every
        # call_tool); a function marked by inspect.markcoroutinefunction (3.12+) is
        # judged by inspect itself
        if fn.__code__.co_flags & CO_COROUTINE:
            return True
        return hasattr(fn, "_is_coroutine_marker") and inspect.iscoroutinefunction(fn)
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - the method, not callable()
    )
