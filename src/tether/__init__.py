"""tether: keep LLM agents bounded and their side effects safe."""

from tether import backoff, clock, stores, telemetry
from tether._breaker import BreakerRegistry, CircuitBreaker, breakers
from tether._budget import RetryBudget
from tether._classify import Kind, Verdict, classify, register_classifier, unregister_classifier
from tether._errors import (
    CircuitOpenError,
    DeadlineExceeded,
    EffectInProgress,
    IdempotencyConflict,
    LimiterTimeout,
    MissingExtraError,
    StoreUnavailable,
    TetherError,
    UnknownOutcome,
)
from tether._events import BreakerEvent, RetryEvent
from tether._limiter import AdaptiveLimiter
from tether._retry import RetryPolicy, RetryStats, retry
from tether._version import __version__
from tether.clock import SystemClock, VirtualClock

__all__ = [
    "AdaptiveLimiter",
    "BreakerEvent",
    "BreakerRegistry",
    "CircuitBreaker",
    "CircuitOpenError",
    "DeadlineExceeded",
    "EffectInProgress",
    "IdempotencyConflict",
    "Kind",
    "LimiterTimeout",
    "MissingExtraError",
    "RetryBudget",
    "RetryEvent",
    "RetryPolicy",
    "RetryStats",
    "StoreUnavailable",
    "SystemClock",
    "TetherError",
    "UnknownOutcome",
    "Verdict",
    "VirtualClock",
    "__version__",
    "backoff",
    "breakers",
    "classify",
    "clock",
    "register_classifier",
    "retry",
    "stores",
    "telemetry",
    "unregister_classifier",
]
