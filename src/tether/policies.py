"""Ready-made argument policies for ``Guard(policies=[...])``.

A policy is any callable ``policy(tool, args) -> None | reason``; it runs before the
breaker, the retry and the ledger, and its reason is what the model reads. These build
the ones users reach for first; ``needs_approval(rule, args)`` reads a tool's
``requires_approval`` rule the way the run does (for adapters that ask in the framework's
own terms first). They fail closed: a call they cannot check (the field is
missing or misspelt, the value is not what the rule is about) is denied, with the reason.

>>> from tether import policies
>>> deny_large = policies.limit("issue_refund", "amount", 5000)
>>> deny_large("issue_refund", {"amount": 9000})
'issue_refund: amount 9000 is over the limit of 5000'
>>> deny_large("issue_refund", {"amount": 100}) is None
True
>>> deny_large("issue_refund", {"amount": float("nan")})
'issue_refund: amount must be a finite number, got nan'
>>> deny_large("issue_refund", {"amout": 100})
'issue_refund: amount is missing (it must be a number of at most 5000)'
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from fractions import Fraction
from typing import Any

from tether.run._governance import CallLimit, needs_approval

__all__ = ["allow", "limit", "max_calls", "needs_approval"]

Policy = Callable[..., str | None]

#: A number written as text that a limit accepts: digits, one point, an exponent; no
#: spaces, underscores, hex, "nan" or "inf" (what Python's float() would also take).
_NUMERAL = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_MISSING = object()


def _field(args: Any, field: str) -> Any:
    value: Any = args
    for part in field.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _names(tool: Any, field: Any) -> None:
    if not isinstance(tool, str) or not tool:
        raise ValueError(f"tool must be a non-empty string (a tool's name), got {tool!r}")
    if not isinstance(field, str) or not all(field.split(".")):
        raise ValueError(
            f"field must be a non-empty string, with dots between the names of nested "
            f"arguments (e.g. 'refund.amount'), got {field!r}"
        )


def _bound(name: str, value: Any) -> float | int | Decimal | Fraction:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float | Decimal | Fraction)
        or (isinstance(value, float | Decimal) and not _finite(value))
    ):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return value


def _finite(value: float | Decimal) -> bool:
    return value.is_finite() if isinstance(value, Decimal) else math.isfinite(value)


def _number(value: Any) -> int | float | Decimal | Fraction | str:
    """The value as a number to compare, or the reason it is none (a str)."""
    if isinstance(value, bool):
        return f"must be a number, got {value!r}"
    if isinstance(value, str):
        if not _NUMERAL.fullmatch(value):
            return f"must be a number, got the text {value[:40]!r}"
        return Decimal(value)  # exact: "5000.0000000001" is over 5000
    if isinstance(value, int | Fraction):
        return value
    if isinstance(value, float | Decimal):
        return value if _finite(value) else f"must be a finite number, got {value!r}"
    return f"must be a number, got {type(value).__name__}"


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def limit(tool: str, field: str, maximum: float, *, minimum: float | None = None) -> Policy:
    """Deny ``tool`` when the number at ``field`` (dots for nesting: ``"refund.amount"``)
    is above ``maximum`` (or below ``minimum``).

    Fails closed: a call without the field, or whose value is not a finite number (a
    bool, NaN, infinity, None, a text that is not a plain numeral), is denied with the
    reason. A numeral in a string (``"49.90"``, as money often travels) is compared
    exactly.
    """
    _names(tool, field)
    top = _bound("maximum", maximum)
    low = None if minimum is None else _bound("minimum", minimum)
    if low is not None and low > top:
        raise ValueError(f"minimum ({_show(low)}) must be <= maximum ({_show(top)})")
    wanted = f"a number of at most {_show(top)}" + (
        f" and at least {_show(low)}" if low is not None else ""
    )

    def policy(name: str, args: Any) -> str | None:
        if name != tool:
            return None
        value = _field(args, field)
        if value is _MISSING:
            return f"{tool}: {field} is missing (it must be {wanted})"
        number = _number(value)
        if isinstance(number, str):
            return f"{tool}: {field} {number}"
        if number > top:
            return f"{tool}: {field} {_show(number)} is over the limit of {_show(top)}"
        if low is not None and number < low:
            return f"{tool}: {field} {_show(number)} is under the minimum of {_show(low)}"
        return None

    policy.__name__ = f"limit_{tool}_{field}"
    return policy


def allow(tool: str, field: str, values: Iterable[Any]) -> Policy:
    """Deny ``tool`` unless the value at ``field`` is one of ``values``.

    Fails closed: a call without the field is denied, and so is a value that only
    compares equal to an allowed one across types (``True`` is not ``1``).
    """
    _names(tool, field)
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise TypeError(
            f"values must be a collection of allowed values (e.g. {{'EUR', 'USD'}}), got {values!r}"
        )
    try:
        allowed = frozenset((isinstance(v, bool), v) for v in values)
    except TypeError as exc:
        raise TypeError(f"values must be hashable (strings, numbers): {exc}") from exc
    if not allowed:
        raise ValueError(
            f"values must not be empty: allow({tool!r}, {field!r}, ...) would deny every call"
        )
    shown = ", ".join(sorted(str(v) for _, v in allowed))

    def policy(name: str, args: Any) -> str | None:
        if name != tool:
            return None
        value = _field(args, field)
        if value is _MISSING:
            return f"{tool}: {field} is missing (it must be one of {shown})"
        try:
            if (isinstance(value, bool), value) in allowed:
                return None
        except TypeError:  # an unhashable value (a list, a dict) is none of them
            pass
        return f"{tool}: {field} must be one of {shown}"

    policy.__name__ = f"allow_{tool}_{field}"
    return policy


def max_calls(tool: str, n: int) -> Policy:
    """Deny ``tool`` after ``n`` calls in one run (the denied ones do not count; a run
    resumed from a checkpoint keeps counting the calls made before; calls made from several
    threads at once are counted one at a time: ``n`` of them run)."""
    if not isinstance(tool, str) or not tool:
        raise ValueError(f"tool must be a non-empty string (a tool's name), got {tool!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    return CallLimit(tool, n)
