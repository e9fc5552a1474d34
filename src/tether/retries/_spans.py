"""Spans of ``RetryPolicy.call`` and ``acall`` outside a run: one ``tether.retry NAME`` span
per call and one ``tether.attempt`` child per attempt (only when OpenTelemetry is
configured), with the HTTP client conventions' resend count and tether's verdict."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from tether.classification._classify import classify

if TYPE_CHECKING:
    from tether.retries._policy import RetryPolicy

__all__ = ["atraced", "traced"]

T = TypeVar("T")


def _telemetry() -> Any:
    from tether import telemetry

    return telemetry


def traced(policy: RetryPolicy, fn: Callable[..., T], args: Any, kwargs: Any) -> T:
    """One ``tether.retry`` span per call, one ``tether.attempt`` child per attempt."""
    telemetry, name, attempts = _telemetry(), policy._span_name(fn), [0]

    @functools.wraps(fn)
    def attempt(*a: Any, **k: Any) -> T:
        attempts[0] += 1
        with telemetry.span("tether.attempt", **_attempt_attrs(name, attempts[0])) as span:
            try:
                return fn(*a, **k)
            except Exception as exc:
                _mark(span, exc)
                raise

    with telemetry.span(f"tether.retry {name}", **{"tether.name": name}) as span:
        try:
            result = policy._call_loop(
                attempt, args, kwargs, first_error=None, deadline=policy.deadline
            )
        except Exception as exc:
            _close(span, attempts[0], exc)
            raise
        _close(span, attempts[0], None)
        return result


async def atraced(
    policy: RetryPolicy, fn: Callable[..., Awaitable[T]], args: Any, kwargs: Any
) -> T:
    telemetry, name, attempts = _telemetry(), policy._span_name(fn), [0]

    @functools.wraps(fn)
    async def attempt(*a: Any, **k: Any) -> T:
        attempts[0] += 1
        with telemetry.span("tether.attempt", **_attempt_attrs(name, attempts[0])) as span:
            try:
                return await fn(*a, **k)
            except Exception as exc:
                _mark(span, exc)
                raise

    with telemetry.span(f"tether.retry {name}", **{"tether.name": name}) as span:
        try:
            result = await policy._aloop(attempt, args, kwargs, policy.deadline)
        except Exception as exc:
            _close(span, attempts[0], exc)
            raise
        _close(span, attempts[0], None)
        return result


def _attempt_attrs(name: str, attempt: int) -> dict[str, Any]:
    # the HTTP client semantic conventions' resend count: the 2nd attempt is resend 1
    return {"tether.name": name, "tether.attempt": attempt,
            "http.request.resend_count": attempt - 1 if attempt > 1 else None}  # fmt: skip


def _mark(span: Any, exc: Exception) -> None:
    _telemetry().set_attributes(span, **{"tether.verdict": classify(exc).kind.value,
                                         "error.type": type(exc).__name__})  # fmt: skip


def _close(span: Any, attempts: int, exc: Exception | None) -> None:
    verdict = "success" if exc is None else classify(exc).kind.value
    _telemetry().set_attributes(span, **{"tether.attempts": attempts, "tether.verdict": verdict,
                                         "http.request.resend_count": max(0, attempts - 1),
                                         "error.type": None if exc is None else type(exc).__name__})  # fmt: skip
