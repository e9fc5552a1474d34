"""tether's classification for stamina users, as a backoff hook.

>>> import stamina
>>> from tether.integrations.stamina import retryable
>>> @stamina.retry(on=retryable, attempts=5)
... def call(): ...

``retryable(exc)`` says no for a quota, a spend limit or a permanent failure, yes for
a transient or rate-limited one, and gives the server's ``Retry-After`` (capped at 60 s)
as the wait when the failure carries one: stamina then waits exactly that.
"""

from __future__ import annotations

from tether.classification._classify import classify

__all__ = ["RETRY_AFTER_CAP", "retryable"]

#: The longest Retry-After the hook hands to stamina, in seconds.
RETRY_AFTER_CAP = 60.0


def retryable(exc: Exception) -> bool | float:
    """stamina's ``on=`` hook: False, True, or the seconds to wait before the next try."""
    verdict = classify(exc)
    if not verdict.retryable:
        return False
    if verdict.retry_after is not None:
        return min(verdict.retry_after, RETRY_AFTER_CAP)
    return True
