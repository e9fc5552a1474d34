"""Model prices, for the cost budget: where they come from, and what an unpriced model costs.

Prices are looked up in this order:

1. the prices you pass (``PriceTable({"my-model": Price(1.0, 2.0)})``), which extend the
   shipped ones;
2. ``genai-prices`` (the pydantic project's maintained price data, bundled offline,
   tiered prices included) when it is installed (``pip install 'tether[prices]'``);
3. tether's own dated table (:data:`PRICES`, read on :data:`PRICES_READ_ON`) when it
   is not.

A name matches a table entry when it is the entry itself or the entry followed by a
date or ``-latest`` (``claude-haiku-4-5-20251001`` takes ``claude-haiku-4-5``'s
price; ``gpt-4o-transcribe`` never takes ``gpt-4o``'s). A model found nowhere has an *unknown* cost:
its tokens are still counted, its cost is not (``Usage.unpriced_calls`` says how many
calls), with one warning per model. A run with a cost budget refuses such a model
before its first request, since the budget could not hold.
"""

from __future__ import annotations

import copy
import logging
import re
import threading
from collections.abc import Iterable
from typing import Any

from tether._frozen import Value, frozen_dataclass

__all__ = ["PRICES", "PRICES_READ_ON", "Price", "PriceTable", "UnknownModelError"]

_log = logging.getLogger("tether")

#: When the shipped prices were read: the providers' published list prices (below 272k
#: prompt tokens) for the models they serve and have not deprecated on that day.
#: genai-prices, when installed, is used instead of this table.
PRICES_READ_ON = "2026-12"

_warned: set[str] = set()  # one warning per unpriced model, per process
_warned_lock = threading.Lock()
_SUFFIX = re.compile(r"(-\d{8}|-\d{4}-\d{2}-\d{2}|-latest|@[\w.-]+)?")


@frozen_dataclass
class Price(Value):
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
    "claude-opus-5-5": Price(4.0, 20.0, 5.0, 0.20),
    "claude-sonnet-5-5": Price(2.0, 10.0, 2.50, 0.10),
    "claude-opus-4-8": Price(5.0, 25.0, 6.25, 0.50),
    "claude-opus-4-6": Price(5.0, 25.0, 6.25, 0.50),
    "claude-sonnet-4-6": Price(3.0, 15.0, 3.75, 0.30),
    "claude-haiku-4-5": Price(1.0, 5.0, 1.25, 0.10),
    "gpt-6.1-sol": Price(2.0, 10.0, 2.50, 0.10),
    "gpt-6.1-terra": Price(1.0, 5.0, 1.25, 0.05),
    "gpt-5.6-sol": Price(4.0, 20.0, 5.0, 0.40),
    "gpt-5.6-terra": Price(2.0, 12.0, 2.50, 0.20),
    "gpt-5.6-luna": Price(0.20, 1.20, 0.25, 0.02),
    "gpt-4o-mini": Price(0.15, 0.60, 0.0, 0.075),
    "gpt-4o": Price(2.50, 10.0, 0.0, 1.25),
    "gpt-4.1-mini": Price(0.40, 1.60, 0.0, 0.10),
    "gpt-4.1": Price(2.0, 8.0, 0.0, 0.50),
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


def _genai_calc(genai: Any, price: Any, usage: tuple[int, int, int, int]) -> float:
    """genai-prices' own answer for ``usage`` at ``price`` (one of its ``ModelPrice``)."""
    inp, out, cw, cr = usage
    calc = price.calc_price(  # genai-prices counts cached tokens inside input_tokens
        genai.Usage(
            input_tokens=inp + cw + cr,
            output_tokens=out,
            cache_write_tokens=cw,
            cache_read_tokens=cr,
        )
    )
    return float(calc["total_price"])


class _Linear:
    """A price that is linear in the tokens: USD per call and per token of each kind."""

    __slots__ = ("base", "per_token")

    def __init__(self, base: float, per_token: tuple[float, float, float, float]) -> None:
        self.base = base
        self.per_token = per_token

    def cost(self, inp: int, out: int, cw: int, cr: int) -> float:
        a, b, c, d = self.per_token
        return self.base + inp * a + out * b + cw * c + cr * d


def _regions(genai: Any, price: Any) -> list[tuple[int, _Linear]]:
    """A genai-prices ``ModelPrice`` read once, as linear prices by prompt size.

    A tiered price applies its tier to every token once the prompt (input tokens, cached
    ones included) exceeds the tier's start: between two starts the price is linear. Each
    region's price is found by asking genai-prices itself about that region's flat price
    (a million tokens of each kind, and none), so its rules hold: cached tokens priced as
    input when the model has no cache price, a per-request fee.
    """
    tiered = {k: v for k, v in vars(price).items() if isinstance(v, genai.types.TieredPrices)}
    starts = sorted({t.start for v in tiered.values() for t in v.tiers})
    out = []
    for lower in [-1, *starts]:  # the region of prompts longer than ``lower`` tokens
        flat = copy.copy(price)
        for key, value in tiered.items():
            chosen = value.base
            for tier in reversed(value.tiers):
                if lower >= tier.start:
                    chosen = tier.price
                    break
            flat.__dict__[key] = chosen
        base = _genai_calc(genai, flat, (0, 0, 0, 0))
        million = ((10**6, 0, 0, 0), (0, 10**6, 0, 0), (0, 0, 10**6, 0), (0, 0, 0, 10**6))
        a, b, c, d = ((_genai_calc(genai, flat, u) - base) / 10**6 for u in million)
        out.append((lower, _Linear(base, (a, b, c, d))))
    return out


class _GenaiModel:
    """A model genai-prices knows, at one provider: its prices read once per ``ModelPrice``
    (a model whose price changes with the date or the time of day picks the one in force
    on every call, as genai-prices does, and reads each of them once)."""

    __slots__ = ("_read", "genai", "info", "provider")

    def __init__(self, genai: Any, provider: Any, info: Any) -> None:
        self.genai = genai
        self.provider = provider
        self.info = info
        self._read: dict[int, tuple[Any, list[tuple[int, _Linear]] | None]] = {}

    def cost(self, inp: int, out: int, cw: int, cr: int) -> float:
        prices = self.info.prices
        if not isinstance(prices, self.genai.types.ModelPrice):
            from datetime import UTC, datetime

            prices = self.info.get_prices(datetime.now(tz=UTC))
        try:
            regions = self._read[id(prices)][1]
        except KeyError:
            try:
                regions = _regions(self.genai, prices)
            except Exception:  # a price genai-prices computes otherwise: ask it every call
                regions = None
            self._read[id(prices)] = (prices, regions)  # the price is kept: its id stays its own
        if regions is None or (self.provider.id == "groq" and "whisper" in self.info.id):
            usage = self.genai.Usage(
                input_tokens=inp + cw + cr,
                output_tokens=out,
                cache_write_tokens=cw,
                cache_read_tokens=cr,
            )
            return float(self.info.calc_price(usage, self.provider).total_price)
        prompt = inp + cw + cr
        for lower, linear in reversed(regions):
            if prompt > lower:
                return linear.cost(inp, out, cw, cr)
        return regions[0][1].cost(inp, out, cw, cr)  # pragma: no cover - lower -1 always holds


#: a cached lookup: your own price (or the shipped one), a model genai-prices knows, or
#: no price at all
_Found = Price | _GenaiModel | None


class PriceTable:
    """Prices by model name; see the module docstring for the order of the sources.

    ``unknown`` says what an unpriced model costs: ``"unknown"`` (default: tokens
    counted, cost not, one warning per model), ``"error"`` (raise
    :class:`UnknownModelError`) or ``"zero"`` (count it as free). ``source`` is
    ``"auto"`` (genai-prices when installed) or ``"tether"`` (the shipped table only).

    A model's price is looked up once per model and provider, then kept (genai-prices is
    imported on the first lookup, not when the table is made); a new genai-prices data
    snapshot (its auto-update) starts the cache afresh.
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
        #: "genai-prices" or "tether"; with source="auto", looked up on first use (a guard's
        #: default table costs nothing until a model call is priced)
        self._source: str | None = None if source == "auto" else "tether"
        self._genai: Any = None  # the module, imported on the first lookup
        self._cache: dict[tuple[str, str | None], _Found] = {}
        self._snapshot: Any = None

    @property
    def source(self) -> str:
        """Where the prices not given come from: ``"genai-prices"`` when it is installed and
        the table was made with ``source="auto"``, else ``"tether"``."""
        if self._source is None:
            import importlib.util

            found = importlib.util.find_spec("genai_prices") is not None
            self._source = "genai-prices" if found else "tether"
        return self._source

    def __repr__(self) -> str:
        return f"PriceTable({len(self.prices)} own prices, source={self.source!r}, unknown={self.unknown!r})"

    def price(self, model: str) -> Price | None:
        """The table price of ``model`` (yours, then the shipped table), or None."""
        return _match(self.prices, model) or _match(PRICES, model)

    def _lookup(self, model: str, provider: str | None) -> _Found:
        """The price of ``model`` at ``provider``, from the cache or found once."""
        if self.source == "genai-prices":
            if self._genai is None:
                self._genai = _genai_prices()
            snapshot = self._genai.data_snapshot.get_snapshot()
            if snapshot is not self._snapshot:  # genai-prices' data changed: look again
                self._cache.clear()
                self._snapshot = snapshot
        key = (model, provider)
        try:
            return self._cache[key]
        except KeyError:
            pass
        found: _Found = _match(self.prices, model)
        if found is None:
            found = self._genai_find(model, provider) if self.source == "genai-prices" else None
        if found is None and self.source != "genai-prices":
            found = _match(PRICES, model)
        if len(self._cache) < 4096:  # model names come from responses: keep the cache bounded
            self._cache[key] = found
        return found

    def _genai_find(self, model: str, provider: str | None) -> _Found:
        try:
            provider_info, info = self._snapshot.find_provider_model(model, None, provider, None)
        except LookupError:
            return None if provider is None else self._genai_find(model, None)
        except Exception as exc:  # its data or code failing never breaks a run
            _log.warning("tether: genai-prices could not price %r: %s", model, exc)
            return None
        return _GenaiModel(self._genai, provider_info, info)

    def knows(self, model: str, provider: str | None = None) -> bool:
        """True when ``model`` has a price (``unknown="zero"`` does not count as one)."""
        found = self._lookup(model, provider)
        if isinstance(found, _GenaiModel):
            try:
                found.cost(1, 1, 0, 0)
            except Exception:  # genai-prices knows the name but cannot price it
                return False
        return found is not None

    def cost(
        self,
        model: str,
        input_tokens: int,
        output_tokens: int,
        cache_write: int = 0,
        cache_read: int = 0,
        *,
        provider: str | None = None,
    ) -> float | None:
        """The cost in USD, or None when it is unknown (``unknown="unknown"``)."""
        found = self._lookup(model, provider)
        if found is not None:
            try:
                return found.cost(input_tokens, output_tokens, cache_write, cache_read)
            except Exception as exc:  # genai-prices' data or code failing never breaks a run
                _log.warning("tether: genai-prices could not price %r: %s", model, exc)
        if self.unknown == "zero":
            return 0.0
        if self.unknown == "error":
            raise UnknownModelError(self.missing(model))
        with _warned_lock:
            first = model not in _warned
            _warned.add(model)
        if first:
            _log.warning(
                "tether: no price for model %r: its tokens are counted, its cost is unknown (%s)",
                model,
                _WAYS_OUT,
            )
        return None

    def check_chain(
        self, chain: Iterable[Any], max_cost_usd: float | None, field: str = "fallbacks"
    ) -> None:
        """Under a cost budget, every model of a fallback chain (``tether.Fallback`` entries)
        must have a price: refused here (a ValueError naming the entry and its model), not
        with UnknownModelError at the first quota refusal, in the middle of an incident.
        ``unknown="zero"`` counts an unpriced model as free: allowed."""
        if max_cost_usd is None or self.unknown == "zero":
            return
        for i, entry in enumerate(chain):
            model = entry.priced_as
            if not self.knows(model, entry.provider):
                raise ValueError(
                    f"{field}[{i}] ({model!r}) cannot be counted by the cost budget "
                    f"(max_cost_usd={max_cost_usd:g}): {self.missing(model)}"
                )

    def missing(self, model: str) -> str:
        """Why ``model`` cannot be priced, and the ways out."""
        return f"no price for model {model!r} (prices from {self.source}): {_WAYS_OUT}"


_WAYS_OUT = (
    "add it with tether.PriceTable({'<model>': tether.Price(input=..., output=...)}), install "
    "genai-prices (pip install 'tether[prices]'), or pass cost_usd= to record_model_call"
)
