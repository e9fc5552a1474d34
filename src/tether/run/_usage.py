"""The usage of one model request: a frozen value, made by one converter per provider's
reply shape (``tether.providers``), counted by the run (:meth:`tether.Run.model_turn`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["RequestUsage"]


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

    def counts(self) -> dict[str, Any]:
        """The keywords of :meth:`tether.Run.record_model_call` for this usage."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "model": self.model,
        }
