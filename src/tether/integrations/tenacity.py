"""tether's classification for tenacity users: retry what may clear, wait what the server asks.

>>> import tenacity
>>> from tether.integrations.tenacity import retry_if_retryable, wait_retry_after
>>> @tenacity.retry(retry=retry_if_retryable(), stop=tenacity.stop_after_attempt(5),
...                 wait=wait_retry_after(fallback=tenacity.wait_exponential_jitter()))
... def call(): ...
"""

from __future__ import annotations

from typing import Any

from tether._errors import require
from tether.classification._classify import classify

__all__ = ["retry_if_retryable", "wait_retry_after"]

_tenacity: Any = require("tenacity", "tenacity")


def _error(retry_state: Any) -> BaseException | None:
    outcome = retry_state.outcome
    if outcome is None or not outcome.failed:
        return None
    error: BaseException | None = outcome.exception()
    return error


class retry_if_retryable(_tenacity.retry_base):  # type: ignore[misc]
    """Retry transient and rate-limited failures only (``tether.classify``): never a quota,
    a spend limit or a permanent failure (a 400, a business rule)."""

    def __call__(self, retry_state: Any) -> bool:
        error = _error(retry_state)
        return error is not None and classify(error).retryable


class wait_retry_after(_tenacity.wait.wait_base):  # type: ignore[misc]
    """Wait what the failure asks for (``Retry-After``, ``retry-after-ms``, provider reset
    headers), at most ``cap`` seconds; otherwise what ``fallback`` says."""

    def __init__(self, fallback: Any = None, cap: float = 60.0) -> None:
        if not cap > 0:
            raise ValueError(f"cap must be > 0, got {cap!r}")
        self.fallback = fallback if fallback is not None else _tenacity.wait_exponential_jitter()
        self.cap = float(cap)

    def __call__(self, retry_state: Any) -> float:
        error = _error(retry_state)
        if error is not None:
            wait = classify(error).retry_after
            if wait is not None:
                return min(wait, self.cap)
        return float(self.fallback(retry_state))
