"""PydanticAI's ``ModelResponse``: its ``usage`` (a ``RequestUsage`` of PydanticAI's)."""

from __future__ import annotations

from typing import Any

from tether.providers._usage import RequestUsage, count

__all__ = ["usage"]


def usage(response: Any, model: str) -> RequestUsage:
    """Its ``input_tokens`` hold the cached ones (``cache_read_tokens``,
    ``cache_write_tokens``)."""
    used = response.usage
    cache_read, cache_write = count(used, "cache_read_tokens"), count(used, "cache_write_tokens")
    return RequestUsage(
        max(0, count(used, "input_tokens") - cache_read - cache_write),
        count(used, "output_tokens"),
        cache_write,
        cache_read,
        model,
    )
