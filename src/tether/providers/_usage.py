"""The usage of one model request: a frozen value, made by one converter per provider
profile (``usage(reply)`` in each module of :mod:`tether.providers`), counted by the run
(:meth:`tether.Run.model_turn`), streamed or not."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tether._frozen import Value, frozen_dataclass

__all__ = ["RequestUsage", "UsageReader", "count", "model_of", "stream_usage"]


@frozen_dataclass
class RequestUsage(Value):
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

    @property
    def prompt(self) -> int:
        """The whole prompt: uncached, written to the cache and read from it."""
        return self.input_tokens + self.cache_write_tokens + self.cache_read_tokens

    def limited(self, cache_reads_count: bool) -> tuple[int, int]:
        """The tokens a provider's rate limits count: (prompt, output); the cache reads only
        where the provider counts them (its profile's ``LIMITS_COUNT_CACHE_READS``)."""
        skipped = 0 if cache_reads_count else self.cache_read_tokens
        return self.prompt - skipped, self.output_tokens

    def counts(self) -> dict[str, Any]:
        """The keywords of :meth:`tether.Run.record_model_call` for this usage."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "model": self.model,
        }


#: reads a reply object (a message, a completion, a response, a stream chunk) -> its usage
UsageReader = Callable[[Any], "RequestUsage | None"]


def count(obj: Any, name: str) -> int:
    """A token count of a usage object or mapping: a positive int, else 0."""
    if obj is None:
        return 0
    value = obj.get(name, 0) if isinstance(obj, dict) else getattr(obj, name, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def model_of(reply: Any, name: str = "model") -> str:
    """The model a reply names (its ``model`` attribute), else ""."""
    model = getattr(reply, name, "")
    return model if isinstance(model, str) else ""


def stream_usage(read: UsageReader, event: Any) -> RequestUsage | None:
    """The usage one stream event reports, read as its reply shape is: Anthropic's
    ``message_start`` carries the message, the Responses API's ``response.completed`` the
    response, OpenAI's chat chunks and Anthropic's ``message_delta`` their own ``usage``."""
    for name in ("message", "response"):
        inner = getattr(event, name, None)
        if inner is not None and not isinstance(inner, str | bytes):
            return read(inner)
    return read(event)
