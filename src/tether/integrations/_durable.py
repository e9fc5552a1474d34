"""What the durable-execution adapters (Temporal's activities, DBOS's steps) share: the
engine's retry decision from tether's verdict, the warning about two retry layers, and
the checks of an effect's ledger, lease and lookup."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from tether._errors import (
    CircuitOpenError,
    EffectInProgress,
    EffectNotRecorded,
    IdempotencyConflict,
    StoreUnavailable,
    UnknownOutcome,
)
from tether.classification._classify import classify
from tether.clock import system_clock
from tether.effects._ledger import Ledger

__all__ = ["F", "Lookup", "RetryLayersWarning", "check_effect", "engine_verdict"]

F = TypeVar("F", bound=Callable[..., Any])
Lookup = Callable[[str], Any]


class RetryLayersWarning(UserWarning):
    """A tether RetryPolicy retried inside a step or an activity that its engine (DBOS,
    Temporal) retries too: the attempts multiply (5 x 5 = 25 calls to a struggling
    dependency)."""


def check_effect(ledger: Any, lease: Any, lookup: Any = None) -> None:
    """Refuse, naming the field, a ledger that is not a :class:`tether.Ledger`, a lease
    that is not a positive number, a lookup that cannot be called."""
    if ledger is not None and not isinstance(ledger, Ledger):
        raise TypeError(
            f"ledger must be a tether.Ledger (e.g. tether.Ledger.postgres(dsn)), got {ledger!r}"
        )
    if lookup is not None and not callable(lookup):
        raise TypeError(f"lookup must be a callable lookup(key) -> result | None, got {lookup!r}")
    if lease is not None and (
        isinstance(lease, bool) or not isinstance(lease, int | float) or lease <= 0
    ):
        raise ValueError(f"lease must be a number > 0 or None, got {lease!r}")


def engine_verdict(exc: BaseException) -> tuple[bool, float | None]:
    """Whether the engine should run a step or activity that raised ``exc`` again, and
    after how long (None: the engine's own backoff): never an effect whose outcome is
    unknown or a conflicting one; a claim another attempt holds once its lease ran out; an
    open breaker after its cooldown; our own store down (nothing was executed) at once;
    anything else as tether's classification says."""
    if isinstance(exc, UnknownOutcome | EffectNotRecorded | IdempotencyConflict):
        return False, None
    if isinstance(exc, EffectInProgress):  # another attempt holds the claim: come back later
        return True, max(1.0, exc.lease_until - system_clock.wall())
    if isinstance(exc, CircuitOpenError):
        return True, max(exc.retry_in, 0.1)
    if isinstance(exc, StoreUnavailable):
        return True, None
    verdict = classify(exc)
    return verdict.retryable, verdict.retry_after
