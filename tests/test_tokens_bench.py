"""The provider-limits scenario of the fleet suite, small: the real SDK against the simulated
provider on virtual time, tether's budget beside the SDK's own retries."""

from __future__ import annotations

import pytest

from tether.bench._provider import Limits, SimulatedProvider, go_duration
from tether.bench._provider_limits import REAL_LIMITS, run_provider_limits


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.02, "20ms"), (1.5, "1.5s"), (360.0, "6m0s"), (61.25, "1m1.25s")]
)
def test_resets_are_written_as_openai_writes_them(seconds: float, text: str) -> None:
    """x-ratelimit-reset-* durations."""
    assert go_duration(seconds) == text


def test_the_simulated_provider_refuses_what_its_buckets_cannot_hold() -> None:
    """A request larger than what is left is a 429 with Retry-After; max_tokens is taken at
    the start and what was not generated comes back at the end."""
    p = SimulatedProvider("anthropic", Limits(requests=60, input=6000, output=600), 0.0)
    ok, headers = p.admit(0.0, 100, 600)
    assert ok and headers["anthropic-ratelimit-output-tokens-remaining"] == "0"
    ok, headers = p.admit(0.0, 100, 60)
    assert not ok and headers["retry-after"] == "6"
    p.finish(0.0, 100, 100, 600)
    assert p.admit(0.0, 100, 500)[0]


SMALL = REAL_LIMITS.scaled(0.1)


@pytest.mark.parametrize("misconfig", ["configured-2x-high", "configured-2x-low"])
def test_tether_keeps_a_fleet_under_the_limit_that_the_sdk_retries_break(misconfig: str) -> None:
    """100 agents on a tenth of the bench's limits, configured 2x wrong: tether makes a
    handful of 429s in the last agents' long prompts (under 1%) and uses the limit; the SDK's
    two retries alone end most runs on a 429. (The full scenario, 1000 agents: 0 429s.)"""
    ours = run_provider_limits("tether", misconfig, agents=100, real=SMALL)
    sdk = run_provider_limits("sdk-default", misconfig, agents=100, real=SMALL)
    assert ours["success"] == 1.0
    assert ours["throttled_per_1000"] <= 10.0
    assert max(ours["input_share_of_limit"], ours["output_share_of_limit"]) >= 0.9
    assert sdk["throttled_per_1000"] > 100
    assert sdk["success"] < 0.9


@pytest.mark.parametrize("seed", [3, 4, 7])
def test_a_small_fleet_on_a_tenth_of_the_limits_stays_under_one_429_per_1000(seed: int) -> None:
    """100 agents on a tenth of the limits, the seeds that made 8 to 38 429s per 1000 when a
    bucket waiting for another counted refill past its capacity: at most 1 per 1000."""
    for misconfig in ("configured-2x-high", "configured-2x-low"):
        ours = run_provider_limits("tether", misconfig, agents=100, seed=seed, real=SMALL)
        assert ours["success"] == 1.0
        assert ours["throttled_per_1000"] <= 1.0, (misconfig, ours)
