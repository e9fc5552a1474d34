"""Frozen event objects handed to hooks, logs and telemetry."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from tether._frozen import Value, frozen_dataclass

if TYPE_CHECKING:
    from tether.classification._classify import Verdict

__all__ = ["BreakerEvent", "RetryEvent", "RetryHook"]


@frozen_dataclass
class RetryEvent(Value):
    """One failed attempt that will be retried after ``delay`` seconds."""

    name: str
    attempt: int  # the attempt that failed, from 1
    verdict: Verdict
    delay: float
    error: BaseException
    elapsed: float  # seconds since the call started


@frozen_dataclass
class BreakerEvent(Value):
    """A circuit breaker changed state."""

    name: str
    old: str
    new: str
    at: float
    reason: str


class RetryHook(Protocol):
    def __call__(self, event: RetryEvent, /) -> None: ...
