"""Provider profiles: what differs per model provider, one module each.

Each module holds its provider's facts, read by the layers that need them: the model name
prefixes that tell its models apart (``PREFIXES``), the rate-limit headers its replies carry
(``RATE_HEADERS``, read by classification and the token budgets), the error codes that say a
quota or a billing refusal (``QUOTA_CODES``), and ``usage(reply)``: its one converter from a
reply (whole or a stream's event) to a :class:`tether.RequestUsage`.

* :mod:`~tether.providers.anthropic`: the Messages API
* :mod:`~tether.providers.openai_chat`: OpenAI chat completions
* :mod:`~tether.providers.openai_responses`: the OpenAI Responses API (and the Agents SDK)
* :mod:`~tether.providers.langchain`: a LangChain AI message's ``usage_metadata``
* :mod:`~tether.providers.google`: Gemini's ``usage_metadata`` (Google ADK)
* :mod:`~tether.providers.bedrock`: the Bedrock Converse ``usage`` (Strands)
* :mod:`~tether.providers.litellm`: LiteLLM's ``ModelResponse`` (OpenAI's chat shape)
* :mod:`~tether.providers.crewai`: a CrewAI LLM's running token tally
* :mod:`~tether.providers.pydantic_ai`: a PydanticAI ``ModelResponse``'s ``usage``

No other module reads a provider's token fields: the token budgets, the telemetry and the
run's price all read the one :class:`tether.RequestUsage` a profile made.

Pure data and functions: no I/O, no import outside the standard library.
"""

from __future__ import annotations

from tether.providers import (
    anthropic,
    bedrock,
    crewai,
    google,
    langchain,
    litellm,
    openai_chat,
    openai_responses,
    pydantic_ai,
)

__all__ = [
    "anthropic",
    "bedrock",
    "crewai",
    "google",
    "langchain",
    "limits_count_cache_reads",
    "litellm",
    "openai_chat",
    "openai_responses",
    "provider_of",
    "pydantic_ai",
]


def provider_of(model: str) -> str | None:
    """The provider whose name prefixes ``model`` starts with (None: none of them)."""
    for profile in (anthropic, openai_chat):
        if model.startswith(profile.PREFIXES):
            return str(profile.NAME)
    return None


def limits_count_cache_reads(provider: str) -> bool:
    """Whether the rate limits of ``provider`` (a profile's ``NAME``) count the prompt's
    cache reads (its profile's ``LIMITS_COUNT_CACHE_READS``; an unknown one: they do)."""
    for profile in (anthropic, openai_chat):
        if provider == profile.NAME:
            return bool(profile.LIMITS_COUNT_CACHE_READS)
    return True
