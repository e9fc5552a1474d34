"""The Bedrock Converse shape (Strands' model providers): a message's ``metadata.usage``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tether.providers._usage import RequestUsage, count

__all__ = ["usage"]


def usage(message: Any) -> RequestUsage | None:
    """``inputTokens`` are the uncached prompt tokens; ``cacheReadInputTokens`` and
    ``cacheWriteInputTokens`` beside them."""
    meta = message.get("metadata") if isinstance(message, Mapping) else None
    used = meta.get("usage") if isinstance(meta, Mapping) else None
    if not used:
        return None
    used = dict(used)
    return RequestUsage(
        count(used, "inputTokens"),
        count(used, "outputTokens"),
        count(used, "cacheWriteInputTokens"),
        count(used, "cacheReadInputTokens"),
    )
