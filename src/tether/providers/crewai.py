"""CrewAI's LLM objects: the running tally of tokens an LLM keeps (``_token_usage``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tether.providers._usage import RequestUsage

__all__ = ["tally", "usage"]

#: the tally's fields: prompt (cached and written ones inside), completion, cached, written
_FIELDS = ("prompt_tokens", "completion_tokens", "cached_prompt_tokens", "cache_creation_tokens")


def tally(llm: Any) -> tuple[int, int, int, int]:
    """The LLM's tally so far, in the order of ``_FIELDS`` (zeros: it keeps none)."""
    kept = getattr(llm, "_token_usage", None)
    if not isinstance(kept, Mapping):
        return 0, 0, 0, 0
    prompt, completion, cached, written = (int(kept.get(k) or 0) for k in _FIELDS)
    return prompt, completion, cached, written


def usage(before: tuple[int, int, int, int], after: tuple[int, int, int, int]) -> RequestUsage:
    """The call between two tallies: the uncached prompt is the prompt less the cached and
    written tokens (nothing counted: a call the LLM did not measure)."""
    prompt, completion, cached, written = (a - b for a, b in zip(after, before, strict=True))
    return RequestUsage(max(0, prompt - cached - written), completion, written, cached)
