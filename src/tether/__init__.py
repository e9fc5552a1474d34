"""tether: keep LLM agents bounded and their side effects safe.

``import tether`` loads the retry surface (``retry``, ``RetryPolicy``, ``classify``, the
clock, backoff and telemetry hooks and every exception); each other public name is
imported on first use, from the module named below, so an import costs what a retry
library's does and a guard's modules load when the first guard does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tether import backoff, clock, telemetry
from tether._errors import (
    CircuitOpenError,
    DeadlineExceeded,
    Declined,
    EffectInProgress,
    EffectNotRecorded,
    IdempotencyConflict,
    LedgerNotShared,
    LimiterTimeout,
    MissingExtraError,
    RunDocumentError,
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
from tether.retries._policy import RetryPolicy, RetryStats, retry
from tether.telemetry._events import BreakerEvent, RetryEvent


def _extend_path() -> None:
    """Take in the folders that add modules to ``tether`` from another distribution.

    ``tether.bench`` ships in the tether-bench distribution. Installed from a wheel it lands
    in this package's folder. Installed editable (``make install``) its ``tether`` folder is
    elsewhere on ``sys.path``, without an ``__init__.py``; this appends each such folder to
    ``__path__`` so ``import tether.bench`` finds it. It costs one ``stat`` per
    ``sys.path`` entry and imports nothing.
    """
    import os
    import sys

    for entry in sys.path:
        folder = os.path.join(entry or os.curdir, "tether")
        if (
            folder not in __path__
            and os.path.isdir(folder)
            and not os.path.isfile(os.path.join(folder, "__init__.py"))
        ):
            __path__.append(folder)


_extend_path()

if TYPE_CHECKING:
    from tether import policies, stores
    from tether.effects._canonical import VOLATILE_FIELDS, canonical_json, intent_key
    from tether.effects._ledger import EffectFailed, Ledger, current_idempotency_key
    from tether.effects._wrap import (
        CONNECTORS,
        CallMeta,
        Connector,
        wrap,
    )
    from tether.effects._wrap import (
        last_call as wrap_last_call,
    )
    from tether.guards._breaker import BreakerRegistry, CircuitBreaker, breakers
    from tether.guards._budget import RetryBudget
    from tether.guards._limiter import AdaptiveLimiter
    from tether.guards._tokens import TokenBudget
    from tether.providers._usage import RequestUsage
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
    from tether.redaction._redact import (
        add_secret_names,
        add_secret_patterns,
        redact,
        register_secrets,
    )
    from tether.run._budget import Budget
    from tether.run._fallbacks import Fallback
    from tether.run._governance import ApprovalRejected, PolicyDenied
    from tether.run._guard import Guard
    from tether.run._handoff import CustomerMessages, Escalation, HandoffRecord, webhook
    from tether.run._loops import LoopPolicy
    from tether.run._outcome import Outcome, Stopped, StopReason, ToolError, Usage
    from tether.run._pricing import PRICES, Price, PriceTable, UnknownModelError
    from tether.run._run import Run
    from tether.run._scopes import BudgetScopes
    from tether.run._tool import Tool
    from tether.run._turn import ModelTurn

#: public name -> the module it is imported from on first use
_LAZY: dict[str, str] = {
    "policies": "",
    "stores": "",
    "AdaptiveLimiter": "tether.guards._limiter",
    "ApprovalError": "tether.records._approvals",
    "ApprovalRecord": "tether.records._approvals",
    "ApprovalRejected": "tether.run._governance",
    "BreakerRegistry": "tether.guards._breaker",
    "Budget": "tether.run._budget",
    "BudgetScopes": "tether.run._scopes",
    "CONNECTORS": "tether.effects._wrap",
    "CallMeta": "tether.effects._wrap",
    "CheckpointError": "tether.records._collections",
    "Checkpoints": "tether.records._collections",
    "CircuitBreaker": "tether.guards._breaker",
    "Connector": "tether.effects._wrap",
    "CustomerMessages": "tether.run._handoff",
    "DeadLetter": "tether.records._collections",
    "DeadLetters": "tether.records._collections",
    "EffectFailed": "tether.effects._ledger",
    "Escalation": "tether.run._handoff",
    "Fallback": "tether.run._fallbacks",
    "Guard": "tether.run._guard",
    "HandoffRecord": "tether.run._handoff",
    "Handoffs": "tether.records._collections",
    "Ledger": "tether.effects._ledger",
    "LoopPolicy": "tether.run._loops",
    "ModelTurn": "tether.run._turn",
    "Outcome": "tether.run._outcome",
    "PRICES": "tether.run._pricing",
    "PolicyDenied": "tether.run._governance",
    "Price": "tether.run._pricing",
    "PriceTable": "tether.run._pricing",
    "Records": "tether.records._records",
    "RedactedArguments": "tether.records._collections",
    "RequestUsage": "tether.providers._usage",
    "RetryBudget": "tether.guards._budget",
    "Run": "tether.run._run",
    "StopReason": "tether.run._outcome",
    "Stopped": "tether.run._outcome",
    "TokenBudget": "tether.guards._tokens",
    "Tool": "tether.run._tool",
    "ToolError": "tether.run._outcome",
    "UnknownModelError": "tether.run._pricing",
    "Usage": "tether.run._outcome",
    "VOLATILE_FIELDS": "tether.effects._canonical",
    "add_secret_names": "tether.redaction._redact",
    "add_secret_patterns": "tether.redaction._redact",
    "breakers": "tether.guards._breaker",
    "canonical_json": "tether.effects._canonical",
    "current_idempotency_key": "tether.effects._ledger",
    "intent_key": "tether.effects._canonical",
    "redact": "tether.redaction._redact",
    "register_secrets": "tether.redaction._redact",
    "webhook": "tether.run._handoff",
    "wrap": "tether.effects._wrap",
    "wrap_last_call": "tether.effects._wrap",
}
#: names imported under another name: public name -> the module's own name
_RENAMED = {"wrap_last_call": "last_call"}


def __getattr__(name: str) -> Any:
    """The first use of a public name imports its module (PEP 562) and keeps the name."""
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'tether' has no attribute {name!r}") from None
    if not module:  # a public submodule: tether.policies, tether.stores
        value = importlib.import_module(f"tether.{name}")
    else:
        value = getattr(importlib.import_module(module), _RENAMED.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "AdaptiveLimiter",
    "ApprovalError",
    "ApprovalRecord",
    "ApprovalRejected",
    "BreakerEvent",
    "BreakerRegistry",
    "Budget",
    "BudgetScopes",
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
    "Declined",
    "EffectFailed",
    "EffectInProgress",
    "EffectNotRecorded",
    "Escalation",
    "Fallback",
    "Guard",
    "HandoffRecord",
    "Handoffs",
    "IdempotencyConflict",
    "Kind",
    "Ledger",
    "LedgerNotShared",
    "LimiterTimeout",
    "LoopPolicy",
    "MissingExtraError",
    "ModelTurn",
    "Outcome",
    "PRICES",
    "PolicyDenied",
    "Price",
    "PriceTable",
    "Records",
    "RedactedArguments",
    "RequestUsage",
    "RetryBudget",
    "RetryEvent",
    "RetryPolicy",
    "RetryStats",
    "Run",
    "RunDocumentError",
    "StopReason",
    "Stopped",
    "StoreUnavailable",
    "SystemClock",
    "TetherError",
    "TokenBudget",
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
