"""Ready-made argument policies for ``Guard(policies=[...])``.

A policy is any callable ``policy(tool, args) -> None | reason``; it runs before the
breaker, the retry and the ledger, and its reason is what the model reads. These build
the ones users reach for first:

>>> from tether import policies
>>> deny_large = policies.limit("issue_refund", "amount", 5000)
>>> deny_large("issue_refund", {"amount": 9000})
'issue_refund: amount 9000 is over the limit of 5000'
>>> deny_large("issue_refund", {"amount": 100}) is None
True
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["allow", "limit", "max_calls"]

Policy = Callable[..., str | None]


def _field(args: Any, field: str) -> Any:
    value: Any = args
    for part in field.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


_MISSING = object()


def limit(tool: str, field: str, maximum: float, *, minimum: float | None = None) -> Policy:
    """Deny ``tool`` when the number at ``field`` (dots for nesting: ``"refund.amount"``)
    is above ``maximum`` (or below ``minimum``), or is not a number."""
    if isinstance(maximum, bool) or not isinstance(maximum, int | float):
        raise TypeError(f"maximum must be a number, got {maximum!r}")

    def policy(name: str, args: Any) -> str | None:
        if name != tool:
            return None
        value = _field(args, field)
        if value is _MISSING:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            try:
                value = float(value)
            except (TypeError, ValueError):
                return f"{tool}: {field} must be a number"
        if value > maximum:
            return f"{tool}: {field} {value:g} is over the limit of {maximum:g}"
        if minimum is not None and value < minimum:
            return f"{tool}: {field} {value:g} is under the minimum of {minimum:g}"
        return None

    policy.__name__ = f"limit_{tool}_{field}"
    return policy


def allow(tool: str, field: str, values: Iterable[Any]) -> Policy:
    """Deny ``tool`` unless the value at ``field`` is one of ``values``."""
    allowed = frozenset(values)

    def policy(name: str, args: Any) -> str | None:
        if name != tool:
            return None
        value = _field(args, field)
        if value is _MISSING or value not in allowed:
            shown = ", ".join(sorted(map(str, allowed)))
            return f"{tool}: {field} must be one of {shown}"
        return None

    policy.__name__ = f"allow_{tool}_{field}"
    return policy


def max_calls(tool: str, n: int) -> Policy:
    """Deny ``tool`` after ``n`` calls in one run (the denied ones do not count)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")

    def policy(name: str, args: Any, *, run: Any = None) -> str | None:
        if name != tool or run is None:
            return None
        if run._tool_counts[tool] >= n:
            return f"{tool} may be called at most {n} times in one run"
        return None

    policy.__name__ = f"max_calls_{tool}"
    return policy
