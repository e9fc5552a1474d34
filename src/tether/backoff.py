"""Backoff schedules: pure functions of the attempt number, seeded through ``rng``.

``attempt`` counts failed attempts from 0: the wait after the first failure is
``backoff(0)``. Every function returns a wait in ``[0, cap]``.

>>> import random
>>> exponential(3, base=0.5, cap=30.0)
4.0
>>> 0.0 <= full_jitter(3, rng=random.Random(7)) <= 4.0
True
"""

from __future__ import annotations

import random as _random

__all__ = ["decorrelated_jitter", "equal_jitter", "exponential", "full_jitter"]

_MAX_EXPONENT = 1000  # 2.0 ** 1024 overflows a float; any cap is reached long before


def _check(base: float, cap: float) -> None:
    if base < 0:
        raise ValueError(f"base must be >= 0, got {base!r}")
    if cap < base:
        raise ValueError(f"cap must be >= base ({base!r}), got {cap!r}")


def exponential(attempt: int, base: float = 0.5, cap: float = 30.0) -> float:
    """Plain capped exponential: ``min(cap, base * 2 ** attempt)``, no randomness."""
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt!r}")
    _check(base, cap)
    return min(cap, base * 2.0 ** min(attempt, _MAX_EXPONENT))


def full_jitter(
    attempt: int, base: float = 0.5, cap: float = 30.0, rng: _random.Random | None = None
) -> float:
    """A uniform wait in ``[0, min(cap, base * 2 ** attempt)]``: the best herd-breaker."""
    ceiling = exponential(attempt, base, cap)
    return (rng or _random).uniform(0.0, ceiling)


def equal_jitter(
    attempt: int, base: float = 0.5, cap: float = 30.0, rng: _random.Random | None = None
) -> float:
    """Half the ceiling, plus a uniform wait in the other half: never a near-zero wait."""
    half = exponential(attempt, base, cap) / 2.0
    return half + (rng or _random).uniform(0.0, half)


def decorrelated_jitter(
    prev: float, base: float = 0.5, cap: float = 30.0, rng: _random.Random | None = None
) -> float:
    """A uniform wait in ``[base, 3 * prev]``, capped: grows from the previous wait.

    Pass the previous wait as ``prev`` (``base`` before the first retry).
    """
    _check(base, cap)
    if prev < 0:
        raise ValueError(f"prev must be >= 0, got {prev!r}")
    high = max(base, prev * 3.0)
    return min(cap, (rng or _random).uniform(base, high))
