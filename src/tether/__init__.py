"""tether: keep LLM agents bounded and their side effects safe."""

from tether import backoff, clock, stores, telemetry
from tether._breaker import BreakerRegistry, CircuitBreaker, breakers
from tether._budget import RetryBudget
from tether._canonical import VOLATILE_FIELDS, canonical_json, intent_key
from tether._classify import Kind, Verdict, classify, register_classifier, unregister_classifier
from tether._effects import EffectFailed, Ledger, current_idempotency_key
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
from tether._wrap import CONNECTORS, CallMeta, Connector, wrap
from tether._wrap import last_call as wrap_last_call
from tether.clock import SystemClock, VirtualClock

__all__ = [
    "CONNECTORS",
    "VOLATILE_FIELDS",
    "AdaptiveLimiter",
    "BreakerEvent",
    "BreakerRegistry",
    "CircuitBreaker",
    "CallMeta",
    "CircuitOpenError",
    "Connector",
    "DeadlineExceeded",
    "EffectFailed",
    "EffectInProgress",
    "IdempotencyConflict",
    "Kind",
    "Ledger",
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
    "canonical_json",
    "classify",
    "clock",
    "current_idempotency_key",
    "intent_key",
    "register_classifier",
    "retry",
    "stores",
    "telemetry",
    "unregister_classifier",
    "wrap",
    "wrap_last_call",
]
