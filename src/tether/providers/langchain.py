"""LangChain's chat models: an AI message's ``usage_metadata`` (any provider behind it)."""

from __future__ import annotations

from typing import Any

from tether.providers._usage import RequestUsage, count

__all__ = ["usage"]


def usage(message: Any) -> RequestUsage:
    """An AI message: its ``input_tokens`` hold the cached ones
    (``input_token_details.cache_read`` / ``cache_creation``)."""
    meta = getattr(message, "usage_metadata", None) or {}
    details = meta.get("input_token_details") or {}
    cache_read, cache_write = count(details, "cache_read"), count(details, "cache_creation")
    return RequestUsage(
        max(0, count(meta, "input_tokens") - cache_read - cache_write),
        count(meta, "output_tokens"),
        cache_write,
        cache_read,
    )
