"""The hook of an attempt loop, and the spans it makes.

A retry driver tells an :class:`AttemptHook` when each attempt begins and how it ended;
it never builds anything itself. :func:`attempt_spans` gives the hook that makes one
``tether.attempt`` span per attempt (current while the attempt runs, so the spans of
the call it makes nest under it) and counts ``tether.attempts``; :class:`RetrySpans`
adds the ``tether.retry NAME`` span of a whole call around them. Both exist only while
something records: when nothing does, :func:`attempt_spans` returns None and a driver
pays one check.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Protocol, cast

from tether import telemetry
from tether.classification._classify import classify

__all__ = ["AttemptHook", "AttemptSpans", "RetrySpans", "attempt_spans", "retry_spans"]


class AttemptHook(Protocol):
    """What an attempt loop tells an observer, attempt by attempt."""

    def begin(self, attempt: int) -> object:
        """Attempt ``attempt`` (from 1) starts now; returns a mark handed back to :meth:`end`."""
        ...

    def end(self, mark: object, error: BaseException | None) -> None:
        """The attempt of ``mark`` ended: returned (``error`` None) or raised ``error``."""
        ...


class AttemptSpans:
    """One ``tether.attempt`` span per attempt, with ``attributes`` (e.g. the tool's
    name) and the attempt's number; a failed attempt carries its verdict and error type."""

    __slots__ = ("_attributes", "_metric", "attempts")

    def __init__(self, attributes: dict[str, Any], metric_name: str | None = None) -> None:
        self._attributes = attributes
        self._metric = metric_name
        self.attempts = 0

    def begin(self, attempt: int) -> object:
        self.attempts = attempt
        if self._metric is not None:
            telemetry.record_attempt(self._metric, attempt)
        # the HTTP client semantic conventions' resend count: the 2nd attempt is resend 1
        resend = attempt - 1 if attempt > 1 else None
        attributes = {"tether.attempt": attempt, "http.request.resend_count": resend}
        cm = telemetry.span("tether.attempt", **self._attributes, **attributes)
        return cm, cm.__enter__()

    def end(self, mark: object, error: BaseException | None) -> None:
        cm, span = cast("tuple[Any, Any]", mark)
        if error is None:
            cm.__exit__(None, None, None)
            return
        marks = {"tether.verdict": classify(error).kind.value, "error.type": type(error).__name__}
        telemetry.set_attributes(span, **marks)
        cm.__exit__(type(error), error, error.__traceback__)


class RetrySpans(AttemptSpans):
    """The ``tether.retry NAME`` span of one call (a context manager around the loop),
    and the ``tether.attempt`` spans of its attempts under it."""

    __slots__ = ("_call", "_span")

    def __init__(self, name: str) -> None:
        super().__init__({"tether.name": name})
        self._call = telemetry.span(f"tether.retry {name}", **{"tether.name": name})
        self._span: Any = None

    def __enter__(self) -> RetrySpans:
        self._span = self._call.__enter__()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        n = self.attempts
        closing = {
            "tether.attempts": n,
            "http.request.resend_count": max(0, n - 1),
            "tether.verdict": "success" if e is None else classify(e).kind.value,
            "error.type": None if e is None else type(e).__name__,
        }
        telemetry.set_attributes(self._span, **closing)
        return self._call.__exit__(et, e, tb)


def attempt_spans(
    attributes: dict[str, Any], metric_name: str | None = None
) -> AttemptSpans | None:
    """The hook that makes ``tether.attempt`` spans (and counts ``tether.attempts`` under
    ``metric_name``, if given), or None when nothing records."""
    if not telemetry.enabled():
        return None
    return AttemptSpans(attributes, metric_name)


def retry_spans(name: str) -> RetrySpans | None:
    """The spans of one retried call, or None when nothing records."""
    if not telemetry.enabled():
        return None
    return RetrySpans(name)
