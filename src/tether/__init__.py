"""tether: keep LLM agents bounded and their side effects safe."""

from tether import backoff, clock, policies, stores, telemetry
from tether._breaker import BreakerRegistry, CircuitBreaker, breakers
from tether._budget import RetryBudget
from tether._canonical import VOLATILE_FIELDS, canonical_json, intent_key
from tether._classify import Kind, Verdict, classify, register_classifier, unregister_classifier
from tether._effects import EffectFailed, Ledger, current_idempotency_key
from tether._errors import (
    CircuitOpenError,
    DeadlineExceeded,
    EffectInProgress,
    EffectNotRecorded,
    IdempotencyConflict,
    LimiterTimeout,
    MissingExtraError,
    StoreUnavailable,
    TetherError,
    TransientError,
    UnknownOutcome,
)
from tether._events import BreakerEvent, RetryEvent
from tether._governance import ApprovalError, ApprovalRecord, ApprovalRejected, PolicyDenied
from tether._handoff import CustomerMessages, Escalation, HandoffRecord, webhook
from tether._limiter import AdaptiveLimiter
from tether._loops import LoopPolicy
from tether._outcome import Outcome, Stopped, StopReason, ToolError, Usage
from tether._persist import (
    CheckpointError,
    Checkpoints,
    DeadLetter,
    DeadLetters,
    Handoffs,
    RedactedArguments,
)
from tether._pricing import PRICES, Price, PriceTable, UnknownModelError
from tether._records import Records
from tether._redact import add_secret_names, add_secret_patterns, redact, register_secrets
from tether._retry import RetryPolicy, RetryStats, retry
from tether._run import Budget, Guard, Run
from tether._version import __version__
from tether._wrap import CONNECTORS, CallMeta, Connector, wrap
from tether._wrap import last_call as wrap_last_call
from tether.clock import SystemClock, VirtualClock
from tether.integrations._common import Tool

__all__ = [
    "AdaptiveLimiter",
    "ApprovalError",
    "ApprovalRecord",
    "ApprovalRejected",
    "BreakerEvent",
    "BreakerRegistry",
    "Budget",
    "CONNECTORS",
    "CallMeta",
    "CheckpointError",
    "Checkpoints",
    "CircuitBreaker",
    "CircuitOpenError",
    "Connector",
    "CustomerMessages",
    "DeadLetter",
    "DeadLetters",
    "DeadlineExceeded",
    "EffectFailed",
    "EffectInProgress",
    "EffectNotRecorded",
    "Escalation",
    "Guard",
    "HandoffRecord",
    "Handoffs",
    "IdempotencyConflict",
    "Kind",
    "Ledger",
    "LimiterTimeout",
    "LoopPolicy",
    "MissingExtraError",
    "Outcome",
    "PRICES",
    "PolicyDenied",
    "Price",
    "PriceTable",
    "Records",
    "RedactedArguments",
    "RetryBudget",
    "RetryEvent",
    "RetryPolicy",
    "RetryStats",
    "Run",
    "StopReason",
    "Stopped",
    "StoreUnavailable",
    "SystemClock",
    "TetherError",
    "Tool",
    "ToolError",
    "TransientError",
    "UnknownModelError",
    "UnknownOutcome",
    "Usage",
    "VOLATILE_FIELDS",
    "Verdict",
    "VirtualClock",
    "__version__",
    "add_secret_names",
    "add_secret_patterns",
    "backoff",
    "breakers",
    "canonical_json",
    "classify",
    "clock",
    "current_idempotency_key",
    "intent_key",
    "policies",
    "redact",
    "register_classifier",
    "register_secrets",
    "retry",
    "stores",
    "telemetry",
    "unregister_classifier",
    "webhook",
    "wrap",
    "wrap_last_call",
]
