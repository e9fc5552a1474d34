"""One usage value per model request, read by one converter per provider's reply shape.

A provider reports a request's tokens in its own fields: Anthropic's ``input_tokens``
(uncached), ``cache_creation_input_tokens`` and ``cache_read_input_tokens``; OpenAI chat's
``prompt_tokens`` with ``prompt_tokens_details.cached_tokens`` inside it; the Responses API's
``input_tokens`` with ``input_tokens_details.cached_tokens`` inside it. Each shape has one
reader here, and a reply read whole and a reply streamed give the same
:class:`RequestUsage`, so the price and the token budget read the same value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tether import RequestUsage

__all__ = [
    "RequestUsage",
    "UsageReader",
    "anthropic_usage",
    "openai_chat_usage",
    "openai_responses_usage",
    "stream_usage",
]


#: reads a reply object (a message, a completion, a response, a stream chunk) -> its usage
UsageReader = Callable[[Any], "RequestUsage | None"]


def _n(obj: Any, name: str) -> int:
    value = getattr(obj, name, 0) if obj is not None else 0
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _model(reply: Any) -> str:
    model = getattr(reply, "model", "")
    return model if isinstance(model, str) else ""


def anthropic_usage(reply: Any) -> RequestUsage | None:
    """An Anthropic message (or a stream event carrying ``usage``)."""
    usage = getattr(reply, "usage", None)
    if usage is None:
        return None
    return RequestUsage(
        _n(usage, "input_tokens"),
        _n(usage, "output_tokens"),
        _n(usage, "cache_creation_input_tokens"),
        _n(usage, "cache_read_input_tokens"),
        _model(reply),
    )


def openai_chat_usage(reply: Any) -> RequestUsage | None:
    """An OpenAI chat completion or chunk: the cached tokens are inside ``prompt_tokens``."""
    usage = getattr(reply, "usage", None)
    if usage is None:
        return None
    cached = _n(getattr(usage, "prompt_tokens_details", None), "cached_tokens")
    return RequestUsage(
        max(0, _n(usage, "prompt_tokens") - cached),
        _n(usage, "completion_tokens"),
        0,
        cached,
        _model(reply),
    )


def openai_responses_usage(reply: Any) -> RequestUsage | None:
    """An OpenAI Responses API response: the cached tokens are inside ``input_tokens``."""
    usage = getattr(reply, "usage", None)
    if usage is None:
        return None
    cached = _n(getattr(usage, "input_tokens_details", None), "cached_tokens")
    return RequestUsage(
        max(0, _n(usage, "input_tokens") - cached),
        _n(usage, "output_tokens"),
        0,
        cached,
        _model(reply),
    )


def stream_usage(read: UsageReader, event: Any) -> RequestUsage | None:
    """The usage one stream event reports, read as its reply shape is: Anthropic's
    ``message_start`` carries the message, the Responses API's ``response.completed`` the
    response, OpenAI's chat chunks and Anthropic's ``message_delta`` their own ``usage``."""
    for name in ("message", "response"):
        inner = getattr(event, name, None)
        if inner is not None and not isinstance(inner, str | bytes):
            return read(inner)
    return read(event)
