"""OpenAI chat completions: model names, rate-limit headers and usage fields."""

from __future__ import annotations

from typing import Any

from tether.providers._usage import RequestUsage, count, model_of

__all__ = ["LIMITS_COUNT_CACHE_READS", "NAME", "PREFIXES", "QUOTA_CODES", "RATE_HEADERS", "usage"]

NAME = "openai"
#: the model names of this provider start so
PREFIXES: tuple[str, ...] = ("gpt-", "o1", "o3", "o4", "chatgpt")
#: its rate-limit headers per bucket: (limit, remaining, reset); reset is a duration (6m0s)
RATE_HEADERS: dict[str, tuple[str, str, str]] = {
    bucket: (
        f"x-ratelimit-limit-{bucket}",
        f"x-ratelimit-remaining-{bucket}",
        f"x-ratelimit-reset-{bucket}",
    )
    for bucket in ("requests", "tokens")
}
#: its token rate limits count the whole prompt, the cached tokens too
LIMITS_COUNT_CACHE_READS = True


#: the error codes of a quota or billing refusal, which a retry does not mend
QUOTA_CODES = frozenset(
    {
        "insufficient_quota",
        "credit_balance_exhausted",
        "organization_spend_limit_exceeded",
        "project_spend_limit_exceeded",
        "organization_usage_limit_exceeded",
        "billing_hard_limit_reached",
        "billing_not_active",
    }
)


def usage(reply: Any) -> RequestUsage | None:
    """A chat completion or chunk: the cached tokens are inside ``prompt_tokens``."""
    used = getattr(reply, "usage", None)
    if used is None:
        return None
    cached = count(getattr(used, "prompt_tokens_details", None), "cached_tokens")
    return RequestUsage(
        max(0, count(used, "prompt_tokens") - cached),
        count(used, "completion_tokens"),
        0,
        cached,
        model_of(reply),
    )
