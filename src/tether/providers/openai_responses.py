"""The OpenAI Responses API (what the Agents SDK calls): its usage fields (its names,
headers and errors are OpenAI's: :mod:`tether.providers.openai_chat`)."""

from __future__ import annotations

from typing import Any

from tether.providers._usage import RequestUsage, count, model_of
from tether.providers.openai_chat import (
    LIMITS_COUNT_CACHE_READS,
    NAME,
    PREFIXES,
    QUOTA_CODES,
    RATE_HEADERS,
)

__all__ = ["LIMITS_COUNT_CACHE_READS", "NAME", "PREFIXES", "QUOTA_CODES", "RATE_HEADERS", "usage"]


def usage(reply: Any) -> RequestUsage | None:
    """A response (or the Agents SDK's ModelResponse): the cached tokens are inside
    ``input_tokens``."""
    used = getattr(reply, "usage", None)
    if used is None:
        return None
    cached = count(getattr(used, "input_tokens_details", None), "cached_tokens")
    return RequestUsage(
        max(0, count(used, "input_tokens") - cached),
        count(used, "output_tokens"),
        0,
        cached,
        model_of(reply),
    )
