"""Model prices, for the cost budget: where they come from, and what an unpriced model costs.

Prices are looked up in this order:

1. the prices you pass (``PriceTable({"my-model": Price(1.0, 2.0)})``), which extend the
   shipped ones;
2. ``genai-prices`` (the pydantic project's maintained price data, bundled offline,
   tiered prices included) when it is installed (``pip install 'tether[prices]'``);
3. tether's own dated table (:data:`PRICES`, read on :data:`PRICES_READ_ON`) when it
   is not.

A name matches a table entry when it is the entry itself or the entry followed by a
date or ``-latest`` (``claude-sonnet-4-5-20250929`` takes ``claude-sonnet-4-5``'s
price; ``o3-mini`` never takes ``o3``'s). A model found nowhere has an *unknown* cost:
its tokens are still counted, its cost is not (``Usage.unpriced_calls`` says how many
calls), with one warning per model. A run with a cost budget refuses such a model
before its first request, since the budget could not hold.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["PRICES", "PRICES_READ_ON", "Price", "PriceTable", "UnknownModelError"]

_log = logging.getLogger("tether")

#: When the shipped prices were read: the providers' published list prices for the
#: models below. genai-prices, when installed, is used instead of this table.
PRICES_READ_ON = "2025-11"

_warned: set[str] = set()  # one warning per unpriced model, per process
_warned_lock = threading.Lock()
_SUFFIX = re.compile(r"(-\d{8}|-\d{4}-\d{2}-\d{2}|-latest|@[\w.-]+)?")


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens."""

    input: float
    output: float
    cache_write: float = 0.0
    cache_read: float = 0.0

    def __post_init__(self) -> None:
        for name in ("input", "output", "cache_write", "cache_read"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(
                    f"Price.{name} must be a number >= 0 (USD per million tokens), got {value!r}"
                )

    def cost(
        self, input_tokens: int, output_tokens: int, cache_write: int = 0, cache_read: int = 0
    ) -> float:
        return (
            input_tokens * self.input
            + output_tokens * self.output
            + cache_write * self.cache_write
            + cache_read * self.cache_read
        ) / 1_000_000


PRICES: dict[str, Price] = {
    "claude-opus-4-5": Price(5.0, 25.0, 6.25, 0.50),
    "claude-opus-4-1": Price(15.0, 75.0, 18.75, 1.50),
    "claude-opus-4": Price(15.0, 75.0, 18.75, 1.50),
    "claude-sonnet-4-5": Price(3.0, 15.0, 3.75, 0.30),
    "claude-sonnet-4": Price(3.0, 15.0, 3.75, 0.30),
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
    """A model with no price where a price is needed (a cost budget, ``unknown="error"``)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown model"


def _genai_prices() -> Any:
    try:
        import genai_prices
    except ImportError:
        return None
    return genai_prices


def _match(table: dict[str, Price], model: str) -> Price | None:
    best: tuple[str, Price] | None = None
    for prefix, price in table.items():
        longer = best is None or len(prefix) > len(best[0])
        if longer and model.startswith(prefix) and _SUFFIX.fullmatch(model, len(prefix)):
            best = (prefix, price)
    return best[1] if best else None


class PriceTable:
    """Prices by model name; see the module docstring for the order of the sources.

    ``unknown`` says what an unpriced model costs: ``"unknown"`` (default: tokens
    counted, cost not, one warning per model), ``"error"`` (raise
    :class:`UnknownModelError`) or ``"zero"`` (count it as free). ``source`` is
    ``"auto"`` (genai-prices when installed) or ``"tether"`` (the shipped table only).
    """

    def __init__(
        self,
        prices: dict[str, Price] | None = None,
        *,
        unknown: str = "unknown",
        source: str = "auto",
    ) -> None:
        if unknown not in ("unknown", "error", "zero"):
            raise ValueError(f"unknown must be 'unknown', 'error' or 'zero', got {unknown!r}")
        if source not in ("auto", "tether"):
            raise ValueError(f"source must be 'auto' or 'tether', got {source!r}")
        if prices is not None and not isinstance(prices, dict):
            raise TypeError(f"prices must be a dict of model name to tether.Price, got {prices!r}")
        for name, price in (prices or {}).items():
            if not isinstance(price, Price):
                raise TypeError(f"prices[{name!r}] must be a tether.Price, got {price!r}")
        self.prices = dict(prices or {})
        self.unknown = unknown
        self._genai = _genai_prices() if source == "auto" else None
        self.source = "genai-prices" if self._genai is not None else "tether"

    def __repr__(self) -> str:
        return f"PriceTable({len(self.prices)} own prices, source={self.source!r}, unknown={self.unknown!r})"

    def price(self, model: str) -> Price | None:
        """The table price of ``model`` (yours, then the shipped table), or None."""
        return _match(self.prices, model) or _match(PRICES, model)

    def _genai_cost(
        self, model: str, provider: str | None, usage: tuple[int, int, int, int]
    ) -> float | None:
        if self._genai is None:
            return None
        inp, out, cw, cr = usage
        try:  # genai-prices counts cached tokens inside input_tokens
            calc = self._genai.calc_price(
                self._genai.Usage(input_tokens=inp + cw + cr, output_tokens=out,
                                  cache_write_tokens=cw, cache_read_tokens=cr),
                model_ref=model, provider_id=provider,
            )  # fmt: skip
        except LookupError:
            if provider is None:
                return None
            return self._genai_cost(model, None, usage)
        except Exception as exc:  # its data or code failing never breaks a run
            _log.warning("tether: genai-prices could not price %r: %s", model, exc)
            return None
        return float(calc.total_price)

    def knows(self, model: str, provider: str | None = None) -> bool:
        """True when ``model`` has a price (``unknown="zero"`` does not count as one)."""
        if _match(self.prices, model) is not None:
            return True
        if self._genai is not None:
            return self._genai_cost(model, provider, (1, 1, 0, 0)) is not None
        return _match(PRICES, model) is not None

    def cost(self, model: str, input_tokens: int, output_tokens: int, cache_write: int = 0,
             cache_read: int = 0, *, provider: str | None = None) -> float | None:  # fmt: skip
        """The cost in USD, or None when it is unknown (``unknown="unknown"``)."""
        own = _match(self.prices, model)
        if own is not None:
            return own.cost(input_tokens, output_tokens, cache_write, cache_read)
        usage = (input_tokens, output_tokens, cache_write, cache_read)
        found = self._genai_cost(model, provider, usage)
        if found is not None:
            return found
        if self._genai is None:
            shipped = _match(PRICES, model)
            if shipped is not None:
                return shipped.cost(*usage)
        if self.unknown == "zero":
            return 0.0
        if self.unknown == "error":
            raise UnknownModelError(self.missing(model))
        with _warned_lock:
            first = model not in _warned
            _warned.add(model)
        if first:
            _log.warning("tether: no price for model %r: its tokens are counted, its cost is "
                         "unknown (%s)", model, _WAYS_OUT)  # fmt: skip
        return None

    def missing(self, model: str) -> str:
        """Why ``model`` cannot be priced, and the ways out."""
        return f"no price for model {model!r} (prices from {self.source}): {_WAYS_OUT}"


_WAYS_OUT = (
    "add it with tether.PriceTable({'<model>': tether.Price(input=..., output=...)}), install "
    "genai-prices (pip install 'tether[prices]'), or pass cost_usd= to record_model_call"
)
