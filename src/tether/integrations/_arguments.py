"""One parameter list for the twin entry points of an adapter (``run`` and
``run_streamed``, ``tool_wrapper`` and ``atool_wrapper``, ``guarded`` and its class): the
twin takes ``**options`` and declares, for type checkers, ``help()`` and
``inspect.signature``, the parameters of the one it forwards to."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, cast

__all__ = ["same_arguments"]

P = ParamSpec("P")
R = TypeVar("R")


def same_arguments(model: Callable[P, Any]) -> Callable[[Callable[..., R]], Callable[P, R]]:
    """Give the decorated function the parameters of ``model`` (a function, or a class:
    its constructor's), keeping its own return type.

    >>> def greet(name: str, *, loud: bool = False) -> str: ...
    >>> @same_arguments(greet)
    ... def shout(*args: Any, **kwargs: Any) -> int: ...
    >>> str(inspect.signature(shout))
    "(name: 'str', *, loud: 'bool' = False) -> 'int'"
    """

    def take(fn: Callable[..., R]) -> Callable[P, R]:
        own = inspect.signature(fn).return_annotation
        fn.__signature__ = inspect.signature(model).replace(  # type: ignore[attr-defined]
            return_annotation=own
        )
        return cast("Callable[P, R]", fn)

    return take
