"""The one place events leave tether: the ``tether`` logger, then OpenTelemetry."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tether.telemetry._events import BreakerEvent, RetryEvent

logger = logging.getLogger("tether")


class RedactingFilter(logging.Filter):
    """Redact every record of the ``tether`` logger before any handler sees it: the
    message with its arguments, and the text of an attached traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        from tether.redaction._redact import redact_text

        try:
            message = record.getMessage()
        except Exception:  # a bad format string: keep the raw text, redacted
            message = str(record.msg)
        record.msg, record.args = redact_text(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        return True


logger.addFilter(RedactingFilter())

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
    if logger.isEnabledFor(logging.INFO):  # the text is built only for a logger that writes it
        v = event.verdict
        said = str(event.error).strip()
        text = said.splitlines()[0][:200] if said else ""
        logger.info(
            "retry %s: attempt %d failed (%s%s: %s%s), next attempt in %.3f s",
            event.name,
            event.attempt,
            v.kind.value,
            f" {v.status}" if v.status is not None else "",
            type(event.error).__name__,
            f": {text}" if text else "",
            event.delay,
        )
    from tether import telemetry

    telemetry.record_retry(event)


def emit_breaker(event: BreakerEvent) -> None:
    level = logging.WARNING if event.new == "open" else logging.INFO
    logger.log(level, "breaker %s: %s -> %s (%s)", event.name, event.old, event.new, event.reason)
    from tether import telemetry

    telemetry.record_breaker(event)
