"""Anthropic's Messages API: its model names, rate-limit headers and usage fields."""

from __future__ import annotations

from typing import Any

from tether.providers._usage import RequestUsage, count, model_of

__all__ = ["LIMITS_COUNT_CACHE_READS", "NAME", "PREFIXES", "QUOTA_CODES", "RATE_HEADERS", "usage"]

NAME = "anthropic"
#: the model names of this provider start so
PREFIXES: tuple[str, ...] = ("claude",)
#: its rate-limit headers per bucket: (limit, remaining, reset); reset is RFC 3339
RATE_HEADERS: dict[str, tuple[str, str, str]] = {
    bucket: (
        f"anthropic-ratelimit-{bucket}-limit",
        f"anthropic-ratelimit-{bucket}-remaining",
        f"anthropic-ratelimit-{bucket}-reset",
    )
    for bucket in ("requests", "tokens", "input-tokens", "output-tokens")
}
#: its input-token rate limits count the uncached prompt and the cache writes, not the
#: cache reads
LIMITS_COUNT_CACHE_READS = False


#: the error codes (``error.type``, ``error.details.error_code``) of a billing or spend
#: refusal: a quota, which a retry does not mend
QUOTA_CODES = frozenset(
    {
        "billing_error",
        "enforced_spend_limit_reached",
        "contract_spend_limit_reached",
        "linked_organization_spend_limit_reached",
    }
)


def usage(reply: Any) -> RequestUsage | None:
    """A message (or a stream event carrying ``usage``): ``input_tokens`` are the uncached
    prompt tokens, ``cache_creation_input_tokens`` and ``cache_read_input_tokens`` beside them."""
    used = getattr(reply, "usage", None)
    if used is None:
        return None
    return RequestUsage(
        count(used, "input_tokens"),
        count(used, "output_tokens"),
        count(used, "cache_creation_input_tokens"),
        count(used, "cache_read_input_tokens"),
        model_of(reply),
    )
