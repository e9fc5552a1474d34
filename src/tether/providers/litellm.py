"""LiteLLM's ``ModelResponse``: OpenAI's chat shape for every provider behind it."""

from __future__ import annotations

from typing import Any

from tether.providers._usage import RequestUsage, count
from tether.providers.openai_chat import usage as openai_chat_usage

__all__ = ["usage"]


def usage(reply: Any) -> RequestUsage | None:
    """OpenAI's chat usage (the cached tokens inside ``prompt_tokens``), with an Anthropic
    cache write in ``cache_creation_input_tokens`` (inside ``prompt_tokens`` too)."""
    found = openai_chat_usage(reply)
    if found is None:
        return None
    written = count(getattr(reply, "usage", None), "cache_creation_input_tokens")
    return RequestUsage(
        max(0, found.input_tokens - written),
        found.output_tokens,
        written,
        found.cache_read_tokens,
        found.model,
    )
