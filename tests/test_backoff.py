"""Backoff schedules: bounds hold for every attempt, base and cap."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether import backoff

attempts = st.integers(min_value=0, max_value=5000)
bases = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)
extra = st.floats(min_value=0.0, max_value=1000.0, allow_nan=False)
seeds = st.integers(min_value=0, max_value=2**32)


@given(attempts, bases, extra, seeds)
def test_full_jitter_bounds(attempt: int, base: float, more: float, seed: int) -> None:
    """Full jitter stays in [0, min(cap, base * 2**attempt)]."""
    cap = base + more
    wait = backoff.full_jitter(attempt, base, cap, random.Random(seed))
    assert 0.0 <= wait <= backoff.exponential(attempt, base, cap) <= cap


@given(attempts, bases, extra, seeds)
def test_equal_jitter_bounds(attempt: int, base: float, more: float, seed: int) -> None:
    """Equal jitter stays in [ceiling / 2, ceiling]."""
    cap = base + more
    ceiling = backoff.exponential(attempt, base, cap)
    wait = backoff.equal_jitter(attempt, base, cap, random.Random(seed))
    assert ceiling / 2 <= wait <= ceiling


@given(st.floats(min_value=0.0, max_value=1e6, allow_nan=False), bases, extra, seeds)
def test_decorrelated_jitter_bounds(prev: float, base: float, more: float, seed: int) -> None:
    """Decorrelated jitter stays in [base, min(cap, max(base, 3 * prev))]."""
    cap = base + more
    wait = backoff.decorrelated_jitter(prev, base, cap, random.Random(seed))
    assert min(base, cap) <= wait <= min(cap, max(base, 3 * prev))


def test_exponential_schedule() -> None:
    """Plain exponential doubles from base and stops at cap."""
    assert [backoff.exponential(n, 0.5, 30.0) for n in range(8)] == [
        0.5,
        1.0,
        2.0,
        4.0,
        8.0,
        16.0,
        30.0,
        30.0,
    ]


def test_seeded_is_deterministic() -> None:
    """The same seed gives the same waits."""
    a = [backoff.full_jitter(n, rng=random.Random(3)) for n in range(6)]
    b = [backoff.full_jitter(n, rng=random.Random(3)) for n in range(6)]
    assert a == b


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: backoff.exponential(-1), "attempt must be >= 0"),
        (lambda: backoff.full_jitter(1, base=-1.0), "base must be >= 0"),
        (lambda: backoff.equal_jitter(1, base=2.0, cap=1.0), "cap must be >= base"),
        (lambda: backoff.decorrelated_jitter(-1.0), "prev must be >= 0"),
    ],
)
def test_bad_arguments(call: object, message: str) -> None:
    """Bad arguments name the argument."""
    with pytest.raises(ValueError, match=message):
        call()  # type: ignore[operator]
