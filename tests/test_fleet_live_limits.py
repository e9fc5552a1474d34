"""The live provider-limits scenario: real worker processes sharing one Redis against a
loopback provider that enforces one key's limits and sends Anthropic's header shapes."""

from __future__ import annotations

from tether.bench._live_limits import run_live_limits
from tether.bench._live_report import live_tables
from tether.bench._provider import Limits


def test_a_small_live_fleet_stays_under_a_key_it_configured_2x_too_high(redis_url: str) -> None:
    """8 agents in 2 processes need more input tokens than the key allows in its first
    minute: with the limits configured 2x too high, the shared budget learns the real ones
    from the headers and no request is refused; every agent finishes."""
    key = Limits(requests=600, input=40_000, output=30_000)
    run = run_live_limits("configured-2x-high", agents=8, workers=2, real=key, redis_url=redis_url)
    assert run["failures"] == []
    assert run["success"] == 1.0
    assert run["throttled_per_1000"] <= 1.0
    assert run["requests"] >= 2 * 8
    assert 0.0 < run["input_share_of_limit"] <= 1.0
    assert 0.0 < run["round_trips_per_call"] < 10.0
    suite = {"provider-limits": {"agents": 8, "workers": 2, "runs": {"configured-2x-high": run}}}
    ((title, (head, rows)),) = live_tables(suite).items()
    assert title.startswith("fleet-live provider-limits (8 agents in 2 processes")
    assert rows[0][:2] == ["configured-2x-high", "100.0%"]
    assert len(head) == len(rows[0])


def test_a_small_live_fleet_stays_under_an_openai_style_key_it_configured_2x_too_low(
    redis_url: str,
) -> None:
    """The same against an OpenAI-style key (RPM and TPM, the x-ratelimit-* headers with
    reset durations) through the real AsyncOpenAI client, its limits configured 2x too low:
    no request refused, every agent finishes."""
    key = Limits(requests=600, tokens=70_000)
    run = run_live_limits("configured-2x-low", style="openai", agents=8, workers=2, real=key,
                          redis_url=redis_url)  # fmt: skip
    assert run["failures"] == []
    assert run["success"] == 1.0
    assert run["throttled_per_1000"] <= 1.0
    assert run["requests"] >= 2 * 8
    assert 0.0 < run["input_share_of_limit"] <= 1.0
    assert run["output_share_of_limit"] is None  # one bucket: counted in the share above
    suite = {"provider-limits": {"agents": 8, "workers": 2, "runs": {"openai / low": run}}}
    ((_, (head, rows)),) = live_tables(suite).items()
    assert rows[0][:2] == ["openai / low", "100.0%"]
    assert rows[0][head.index("OTPM used")] == "-"
