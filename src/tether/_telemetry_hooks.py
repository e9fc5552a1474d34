"""The one place events leave tether: the ``tether`` logger, then OpenTelemetry."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tether._events import BreakerEvent, RetryEvent

logger = logging.getLogger("tether")

__all__ = ["emit_breaker", "emit_retry", "logger", "safe_call"]


def safe_call(hook: Callable[[Any], object] | None, event: object) -> None:
    """Call a user hook; a failing hook is logged, never raised into the agent."""
    if hook is None:
        return
    try:
        hook(event)
    except Exception:
        logger.exception("tether hook %r raised; ignored", hook)


def emit_retry(event: RetryEvent) -> None:
    v = event.verdict
    logger.info(
        "retry %s: attempt %d failed (%s%s: %s), next attempt in %.3f s",
        event.name,
        event.attempt,
        v.kind.value,
        f" {v.status}" if v.status is not None else "",
        v.reason,
        event.delay,
    )
    from tether import telemetry

    telemetry.record_retry(event)


def emit_breaker(event: BreakerEvent) -> None:
    level = logging.WARNING if event.new == "open" else logging.INFO
    logger.log(level, "breaker %s: %s -> %s (%s)", event.name, event.old, event.new, event.reason)
    from tether import telemetry

    telemetry.record_breaker(event)
