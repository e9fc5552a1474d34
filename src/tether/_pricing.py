"""Model prices, for the cost budget. Data, dated, overridable; unknown models are explicit."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PRICES", "PRICES_READ_ON", "Price", "PriceTable", "UnknownModelError"]

#: When the shipped prices were read: the providers' published list prices of 2025 for
#: the models below. Newer models are deliberately absent (they raise, or count as zero
#: if you choose so): check your provider's price page and pass your own table.
PRICES_READ_ON = "2025-11"


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens."""

    input: float
    output: float
    cache_write: float = 0.0
    cache_read: float = 0.0

    def cost(
        self, input_tokens: int, output_tokens: int, cache_write: int = 0, cache_read: int = 0
    ) -> float:
        return (
            input_tokens * self.input
            + output_tokens * self.output
            + cache_write * self.cache_write
            + cache_read * self.cache_read
        ) / 1_000_000


# Matched as a prefix of the model name (the longest prefix wins), so dated snapshots
# ("claude-sonnet-4-5-20250929") take their family's price.
PRICES: dict[str, Price] = {
    "claude-opus-4-5": Price(5.0, 25.0, 6.25, 0.50),
    "claude-opus-4-1": Price(15.0, 75.0, 18.75, 1.50),
    "claude-opus-4-2025": Price(15.0, 75.0, 18.75, 1.50),
    "claude-sonnet-4-5": Price(3.0, 15.0, 3.75, 0.30),
    "claude-sonnet-4-2025": Price(3.0, 15.0, 3.75, 0.30),
    "claude-3-7-sonnet": Price(3.0, 15.0, 3.75, 0.30),
    "claude-haiku-4-5": Price(1.0, 5.0, 1.25, 0.10),
    "claude-3-5-haiku": Price(0.80, 4.0, 1.0, 0.08),
    "gpt-4o-mini": Price(0.15, 0.60, 0.0, 0.075),
    "gpt-4o": Price(2.50, 10.0, 0.0, 1.25),
    "gpt-4.1-mini": Price(0.40, 1.60, 0.0, 0.10),
    "gpt-4.1-nano": Price(0.10, 0.40, 0.0, 0.025),
    "gpt-4.1": Price(2.0, 8.0, 0.0, 0.50),
    "o3": Price(2.0, 8.0, 0.0, 0.50),
    "o4-mini": Price(1.10, 4.40, 0.0, 0.275),
}


class UnknownModelError(KeyError):
    """A model with no price: the cost budget cannot count it."""


class PriceTable:
    """Prices by model-name prefix; ``unknown="error"`` (default) or ``"zero"``."""

    def __init__(self, prices: dict[str, Price] | None = None, *, unknown: str = "error") -> None:
        if unknown not in ("error", "zero"):
            raise ValueError(f"unknown must be 'error' or 'zero', got {unknown!r}")
        self.prices = dict(PRICES if prices is None else prices)
        self.unknown = unknown

    def price(self, model: str) -> Price | None:
        best = None
        for prefix, price in self.prices.items():
            if model.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
                best = (prefix, price)
        return best[1] if best else None

    def cost(self, model: str, input_tokens: int, output_tokens: int, cache_write: int = 0,
             cache_read: int = 0) -> float:  # fmt: skip
        price = self.price(model)
        if price is None:
            if self.unknown == "zero":
                return 0.0
            raise UnknownModelError(
                f"no price for model {model!r}: pass cost_usd= to record_model_call, add it with "
                "PriceTable({...}), or choose PriceTable(unknown='zero') to count it as free"
            )
        return price.cost(input_tokens, output_tokens, cache_write, cache_read)
