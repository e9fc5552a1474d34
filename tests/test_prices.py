"""Prices read once per model and provider: the cached answer is genai-prices' answer."""

from __future__ import annotations

import logging

import genai_prices
import pytest

import tether
from tether.run._pricing import _GenaiModel

#: token counts on both sides of the tiers genai-prices knows (200k for Claude Sonnet 4.5,
#: 128k and 200k for others): cached tokens, none, all of them
USAGES = [
    (1234, 567, 0, 0),
    (1000, 200, 300, 400),
    (0, 0, 0, 0),
    (150_000, 2_000, 30_000, 40_000),
    (250_000, 1_000, 0, 0),
    (10**6, 10**5, 10**5, 10**5),
]


def genai_answer(
    model: str, provider: str | None, usage: tuple[int, int, int, int]
) -> float | None:
    """What genai-prices says, called as tether called it before prices were cached."""
    inp, out, cw, cr = usage
    calc_usage = genai_prices.Usage(
        input_tokens=inp + cw + cr, output_tokens=out, cache_write_tokens=cw, cache_read_tokens=cr
    )
    try:
        return float(
            genai_prices.calc_price(calc_usage, model_ref=model, provider_id=provider).total_price
        )
    except LookupError:
        return None if provider is None else genai_answer(model, None, usage)


@pytest.mark.parametrize(
    ("model", "provider"),
    [
        ("claude-sonnet-5-5", "anthropic"),
        ("claude-haiku-4-5-20251001", None),
        ("claude-haiku-4-5", None),
        ("gpt-4o", "openai"),
        ("gpt-4.1-mini", None),
        ("gemini-3.8-flash", "google"),
        ("o3", None),
        ("deepseek-chat", "deepseek"),
    ],
)
def test_a_cached_price_is_genai_prices_answer(model: str, provider: str | None) -> None:
    """Every usage, on both sides of a tier, costs what genai-prices says, from the cache."""
    table = tether.PriceTable()
    assert table.source == "genai-prices"
    for usage in USAGES:
        want = genai_answer(model, provider, usage)
        assert want is not None, (model, usage)
        assert table.cost(model, *usage, provider=provider) == pytest.approx(
            want, rel=1e-12, abs=1e-15
        )
    assert isinstance(table._cache[(model, provider)], _GenaiModel)


def test_every_model_genai_prices_knows_is_priced_as_it_says() -> None:
    """All models of all providers, each usage: the cached price never differs from genai-prices."""
    table = tether.PriceTable()
    snapshot = genai_prices.data_snapshot.get_snapshot()
    checked = 0
    for provider in snapshot.providers:
        for model in provider.models[:25]:
            for usage in USAGES[::2]:
                try:
                    want = genai_answer(model.id, provider.id, usage)
                except Exception:  # genai-prices cannot price it: nor can the cache
                    continue
                got = table.cost(model.id, *usage, provider=provider.id)
                assert (want is None) == (got is None), model.id
                if want is not None:
                    assert got == pytest.approx(want, rel=1e-9, abs=1e-15), (model.id, usage)
                    checked += 1
    assert checked > 1000


def test_the_price_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first call, genai-prices is not asked again for that model and provider."""
    table = tether.PriceTable()
    run = tether.Guard(prices=table).start()
    first = run.record_model_call(
        input_tokens=1000, output_tokens=100, model="claude-sonnet-5-5", provider="anthropic"
    )
    asked: list[str] = []
    real = genai_prices.types.ModelPrice.calc_price

    def counting(self: object, usage: object) -> object:
        asked.append("calc")
        return real(self, usage)  # type: ignore[arg-type]

    monkeypatch.setattr(genai_prices.types.ModelPrice, "calc_price", counting)
    again = [
        run.record_model_call(
            input_tokens=1000, output_tokens=100, model="claude-sonnet-5-5", provider="anthropic"
        )
        for _ in range(50)
    ]
    assert asked == []
    assert again == [first] * 50
    assert first == pytest.approx(genai_answer("claude-sonnet-5-5", "anthropic", (1000, 100, 0, 0)))


def test_an_unknown_model_stays_unpriced_never_zero(caplog: pytest.LogCaptureFixture) -> None:
    """A model nobody prices costs None (not $0) on every call, the cached ones too."""
    run = tether.Guard().start()
    with caplog.at_level(logging.WARNING, logger="tether"):
        costs = [
            run.record_model_call(input_tokens=10, output_tokens=10, model="no-such-model-xyz")
            for _ in range(3)
        ]
    assert costs == [None, None, None]
    usage = run.usage()
    assert (usage.unpriced_calls, usage.input_tokens) == (3, 30)
    assert not tether.PriceTable().knows("no-such-model-xyz")
    assert (
        tether.PriceTable(unknown="zero").cost("no-such-model-xyz", 10, 10) == 0.0
    )  # only when asked


def test_own_prices_come_first_and_are_cached() -> None:
    """Your own price wins over genai-prices', from the first call on."""
    table = tether.PriceTable({"claude-sonnet-5-5": tether.Price(1.0, 2.0)})
    assert table.cost("claude-sonnet-5-5", 10**6, 10**6) == 3.0
    assert table.cost("claude-sonnet-5-5", 10**6, 10**6) == 3.0
    assert table._cache[("claude-sonnet-5-5", None)] == tether.Price(1.0, 2.0)


def test_a_new_genai_prices_snapshot_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """When genai-prices' data changes (its auto-update), the cache starts afresh."""
    table = tether.PriceTable()
    table.cost("gpt-4o", 100, 100)
    assert table._cache
    old = genai_prices.data_snapshot.get_snapshot()
    fresh = genai_prices.data_snapshot.DataSnapshot(providers=old.providers, from_auto_update=True)
    monkeypatch.setattr(genai_prices.data_snapshot, "get_snapshot", lambda: fresh)
    table.cost("gpt-4o", 100, 100)
    assert table._snapshot is fresh
    assert list(table._cache) == [("gpt-4o", None)]
    assert table._cache[("gpt-4o", None)].info in [m for p in fresh.providers for m in p.models]
