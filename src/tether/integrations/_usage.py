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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tether import Run

__all__ = [
    "RequestUsage",
    "UsageReader",
    "anthropic_usage",
    "openai_chat_usage",
    "openai_responses_usage",
    "stream_usage",
]


@dataclass(frozen=True, slots=True)
class RequestUsage:
    """The tokens of one model request, as the price reads them: ``input_tokens`` are the
    prompt tokens neither written to nor read from a cache."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0
    model: str = ""

    def merged(self, later: RequestUsage) -> RequestUsage:
        """This usage and a later report of the same request (a stream reports running
        totals, some fields only in its first or its last event): the larger of each."""
        return RequestUsage(
            max(self.input_tokens, later.input_tokens),
            max(self.output_tokens, later.output_tokens),
            max(self.cache_write_tokens, later.cache_write_tokens),
            max(self.cache_read_tokens, later.cache_read_tokens),
            later.model or self.model,
        )

    @property
    def counted(self) -> bool:
        return bool(
            self.input_tokens or self.output_tokens or self.cache_write_tokens
            or self.cache_read_tokens
        )  # fmt: skip

    def record(self, run: Run) -> None:
        """Count this request in ``run`` (its cost at the guard's price for the model)."""
        run.record_model_call(
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cache_write_tokens=self.cache_write_tokens,
            cache_read_tokens=self.cache_read_tokens,
            model=self.model,
        )


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
