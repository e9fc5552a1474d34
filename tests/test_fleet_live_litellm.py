"""The live litellm-router scenario (in ``.venv-crewai``, where LiteLLM is installed): a real
``litellm.Router`` with its own limits in Redis beside tether's fleet token budget, real
worker processes against a loopback provider that enforces one key's RPM and TPM."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from tether.bench._live_litellm import LITELLM_CONFIGS, litellm_missing, run_litellm_router
from tether.bench._live_report import live_tables
from tether.bench._provider import Limits

#: 6 agents need about 1.15 times the tokens the key allows in its first minute (its bucket
#: full at the start): the limit binds for their last seconds
KEY = Limits(requests=600, tokens=40_000)
AGENTS = 6


def test_tether_keeps_a_small_litellm_fleet_under_the_key_the_router_overruns(
    redis_url: str,
) -> None:
    """6 agents in 2 processes through tether.integrations.litellm with tether's token
    budget in Redis: each model turn takes its place in the budget before it is sent, every
    agent finishes and the provider refuses at most 1 request in 5 (each turn sent about once); the same agents through LiteLLM's rate-limit-aware
    Router with the same limits, in the same table."""
    assert litellm_missing() is None
    configs = ("tether-litellm", "litellm-router")
    with ThreadPoolExecutor(2) as pool:  # each run its own provider, processes and keys
        done = pool.map(
            lambda c: run_litellm_router(
                c, agents=AGENTS, workers=2, real=KEY, redis_url=redis_url
            ),
            configs,
        )
        runs = dict(zip(configs, done, strict=True))
    tether = runs["tether-litellm"]
    assert tether["failures"] == []
    assert tether["success"] == 1.0
    assert tether["model_turns"] >= 2 * AGENTS
    assert tether["reserved"] >= tether["model_turns"]  # each turn took its place first
    assert tether["requests"] <= 1.25 * tether["model_turns"]  # tether's side: its share
    assert tether["throttled_per_1000"] <= 200.0
    assert 0.0 < tether["tpm_share_of_limit"] <= 1.0
    router = runs["litellm-router"]
    assert router["requests"] >= router["model_turns"] > 0
    assert router["reserved"] is None
    assert 0.0 < router["tpm_share_of_limit"] <= 1.0
    assert set(runs) <= set(LITELLM_CONFIGS)
    assert tether["redis_keys"] > 0 and router["redis_keys"] > 0  # both counted in Redis
    suite = {
        "litellm-router": {
            "agents": AGENTS,
            "workers": 2,
            "real_limits": {"requests_per_minute": 600, "tokens_per_minute": 40_000},
            "runs": runs,
        }
    }
    ((title, (head, rows)),) = live_tables(suite).items()
    assert title.startswith("fleet-live litellm-router (6 agents in 2 processes")
    assert rows[0][:2] == ["tether-litellm", "100.0%"]
    assert len(head) == len(rows[0]) == len(rows[1])
