"""tether: keep LLM agents bounded and their side effects safe."""

from tether import backoff, clock, policies, stores, telemetry
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
from tether._version import __version__
from tether.classification._classify import (
    Kind,
    Verdict,
    classify,
    register_classifier,
    unregister_classifier,
)
from tether.clock import SystemClock, VirtualClock
from tether.effects._canonical import VOLATILE_FIELDS, canonical_json, intent_key
from tether.effects._ledger import EffectFailed, Ledger, current_idempotency_key
from tether.effects._wrap import CONNECTORS, CallMeta, Connector, wrap
from tether.effects._wrap import last_call as wrap_last_call
from tether.guards._breaker import BreakerRegistry, CircuitBreaker, breakers
from tether.guards._budget import RetryBudget
from tether.guards._limiter import AdaptiveLimiter
from tether.records._approvals import ApprovalError, ApprovalRecord
from tether.records._collections import (
    CheckpointError,
    Checkpoints,
    DeadLetter,
    DeadLetters,
    Handoffs,
    RedactedArguments,
)
from tether.records._records import Records
from tether.redaction._redact import add_secret_names, add_secret_patterns, redact, register_secrets
from tether.retries._policy import RetryPolicy, RetryStats, retry
from tether.run._governance import ApprovalRejected, PolicyDenied
from tether.run._handoff import CustomerMessages, Escalation, HandoffRecord, webhook
from tether.run._loops import LoopPolicy
from tether.run._outcome import Outcome, Stopped, StopReason, ToolError, Usage
from tether.run._pricing import PRICES, Price, PriceTable, UnknownModelError
from tether.run._run import Budget, Guard, Run
from tether.run._tool import Tool
from tether.telemetry._events import BreakerEvent, RetryEvent

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
