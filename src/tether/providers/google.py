"""Google's Gemini (Google ADK): an ``LlmResponse``'s ``usage_metadata``."""

from __future__ import annotations

from typing import Any

from tether.providers._usage import RequestUsage, count, model_of

__all__ = ["usage"]


def usage(reply: Any) -> RequestUsage | None:
    """``prompt_token_count`` holds the cached ones (``cached_content_token_count``); the
    output is the candidates' tokens and the thoughts'."""
    used = getattr(reply, "usage_metadata", None)
    if used is None:
        return None
    cached = count(used, "cached_content_token_count")
    return RequestUsage(
        max(0, count(used, "prompt_token_count") - cached),
        count(used, "candidates_token_count") + count(used, "thoughts_token_count"),
        0,
        cached,
        model_of(reply, "model_version"),
    )
