"""The litellm-router scenario of the live fleet suite: LiteLLM's ``Router`` with its own
limits beside tether's fleet token budget, on real time, against one API key's real limit.

The provider is the provider-limits scenario's loopback server in the OpenAI style
(:mod:`tether.bench._live_limits`: ``POST /v1/chat/completions``, requests and tokens per
minute as token buckets, input and ``max_tokens`` admitted together, a 429 with
``retry-after`` and the ``x-ratelimit-*`` headers). Worker processes run the agents as
asyncio tasks, each through LiteLLM's ``openai/`` provider (the OpenAI SDK over HTTP):

* ``litellm-router``: a real ``litellm.Router`` configured as LiteLLM's docs write a
  rate-limit-aware fleet: the deployment's ``tpm`` / ``rpm`` (the key's real limits) in
  its ``litellm_params``, ``routing_strategy="usage-based-routing-v2"``,
  ``enable_pre_call_checks=True``, ``redis_host`` / ``redis_port`` (every process counts
  in the same Redis) and ``num_retries=3``;
* ``litellm-shuffle``: the same with the Router's default (and recommended) strategy,
  ``simple-shuffle``;
* ``tether-litellm``: ``tether.integrations.litellm.acompletion(run, ...)`` (tether the one
  retry layer), each agent's conversation one run of a guard whose ``token_budget`` is a
  :class:`tether.TokenBudget` with the same limits in a :class:`tether.stores.RedisStore`.

The agents (their turns, prompt sizes, ``max_tokens``, and the provider's tokenizer of
2.6 to 4.6 characters a token) are the provider-limits scenario's; their text is words, so
that LiteLLM's tokenizer (tiktoken) counts it as it would a real prompt. Needs LiteLLM and
``redis`` (``.venv-crewai``) and Redis at ``TETHER_REDIS_URL``.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import os
import random
import time
import uuid
from typing import Any

from tether.bench._interrupt import interrupt_ignored
from tether.bench._provider import Limits, Stats
from tether.bench._workers import start_workers

__all__ = ["LITELLM_CONFIGS", "LITELLM_LIMITS", "litellm_missing", "run_litellm_router"]

#: the key's real limits: RPM and TPM (small, so that 40 agents bind them for about a minute)
LITELLM_LIMITS = Limits(requests=600, tokens=140_000)
#: the configurations, one run each, one after the other
LITELLM_CONFIGS = ("litellm-router", "litellm-shuffle", "tether-litellm")
#: the Router's strategies (LiteLLM's names)
_STRATEGIES = {"litellm-router": "usage-based-routing-v2", "litellm-shuffle": "simple-shuffle"}
AGENTS, WORKERS = 40, 2
#: the Router's retries, as LiteLLM's reliability docs write them
NUM_RETRIES = 3
MODEL = "gpt-6.1-terra"
#: the words of the agents' text
_WORDS = "the order of customer was shipped to address and refund item payment account return"
_WORDS += " exchange cancel status tracking number please check update delivery date product"
_WORDS += " price total policy reason details confirm request support agent ticket"

_VOCABULARY = _WORDS.split(" ")

#: how to run the scenario where LiteLLM is installed (the main venv cannot hold its pins)
RUN_IT = (
    "the litellm-router scenario needs LiteLLM and redis (pip install 'tether[litellm,redis]'); "
    "from a checkout: PYTHONPATH=benchmarks/src .venv-crewai/bin/tether bench "
    "--suite fleet-live --scenario litellm-router"
)


def litellm_missing() -> str | None:
    """Why the scenario cannot run here (what to run instead), or None when it can."""
    import importlib.util

    missing = [m for m in ("litellm", "redis") if importlib.util.find_spec(m) is None]
    return f"{RUN_IT} (missing here: {', '.join(missing)})" if missing else None


def _text(chars: int, seed: str) -> str:
    """``chars`` characters of words (a prompt a tokenizer counts as a real one)."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(_VOCABULARY)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:chars]


def _worker_main(
    config: str,
    redis_url: str,
    prefix: str,
    port: int,
    keys: list[str],
    real: Limits,
    seed: int,
    start: Any,
    ready_q: Any,
    result_q: Any,
) -> None:
    """One worker process: its agents through LiteLLM's Router or through tether. It says
    when it is ready (its imports done), then waits for the common start."""
    import logging

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    from tether.bench._live_limits import _agent

    litellm.suppress_debug_info = True
    for noisy in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "httpx", "openai", "tether"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
        logging.getLogger(noisy).propagate = False
    base = f"http://127.0.0.1:{port}/v1"
    finished: list[float] = []
    failed: list[str] = []
    turns = [0]
    send: Any

    if config in _STRATEGIES:
        from urllib.parse import urlsplit

        where = urlsplit(redis_url)
        router = litellm.Router(
            model_list=[
                {
                    "model_name": MODEL,
                    "litellm_params": {
                        "model": f"openai/{MODEL}",
                        "api_base": base,
                        "api_key": "bench",
                        "tpm": int(real.tokens),
                        "rpm": int(real.requests),
                    },
                    # this run's own counters (a deployment's id names its Redis keys)
                    "model_info": {"id": prefix},
                }
            ],
            routing_strategy=_STRATEGIES[config],
            enable_pre_call_checks=True,
            redis_host=where.hostname or "127.0.0.1",
            redis_port=where.port or 6379,
            num_retries=NUM_RETRIES,
        )

        async def send(key: str, messages: list[Any], max_tokens: int) -> Any:
            return await router.acompletion(
                model=MODEL,
                messages=messages,
                max_tokens=max_tokens,
                extra_body={"metadata": {"user_id": key}},  # the provider's tokenizer per agent
            )

    else:
        import tether
        from tether.integrations.litellm import acompletion
        from tether.stores.redis._store import RedisStore

        store = RedisStore(redis_url, prefix=prefix)
        budget = tether.TokenBudget("openai", "gpt-", store=store, **real.as_budget())
        guard = tether.Guard(budget=tether.Budget(max_seconds=600.0), token_budget=budget)
        runs: dict[str, Any] = {}

        async def send(key: str, messages: list[Any], max_tokens: int) -> Any:
            return await acompletion(
                runs[key],
                model=f"openai/{MODEL}",
                api_base=base,
                api_key="bench",
                messages=messages,
                max_tokens=max_tokens,
                extra_body={"metadata": {"user_id": key}},
            )

    async def conversation(key: str) -> None:
        a = _agent(seed, key)
        await asyncio.sleep(max(0.0, start_at + a["start"] - time.time()))
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": _text(len(a["system"]), f"{key}:system")},
            {"role": "user", "content": _text(400, f"{key}:ask")},
        ]
        for turn in range(a["turns"]):
            try:
                reply = await send(key, messages, a["max_tokens"][turn])
            except Exception as exc:
                failed.append(f"{type(exc).__name__}: {exc}"[:200])
                return
            turns[0] += 1
            messages = [
                *messages,
                {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": _text(a["results"][turn], f"{key}:{turn}")},
            ]
        finished.append(time.time() - start_at)

    async def agent(key: str) -> None:
        if config in _STRATEGIES:
            await conversation(key)
            return
        async with guard.start(f"agent {key}") as run:
            runs[key] = run
            await conversation(key)
            if run.stopped is None:
                run.succeed("done")

    ready_q.put(os.getpid())
    start["go"].wait()
    start_at = start["at"].value

    async def main() -> None:
        await asyncio.gather(*(agent(k) for k in keys))
        if config not in _STRATEGIES:
            await store.aclose()

    asyncio.run(main())
    # tether's side: the model turns reserved in the fleet's token budget, and their waits
    reserved = None if config in _STRATEGIES else budget.reserved
    waited = None if config in _STRATEGIES else round(budget.waited, 1)
    result_q.put(
        {"finished": finished, "failed": failed, "turns": turns[0], "reserved": reserved,
         "waited": waited}
    )  # fmt: skip


def _clear(redis_url: str, prefix: str) -> int:
    """Remove the run's keys (LiteLLM's counters name the deployment's id, tether's the
    prefix); how many there were (the fleet counted in Redis: more than 0)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"*{prefix}*", count=500))
        for key in keys:
            client.delete(key)
        return len(keys)
    finally:
        client.close()


def run_litellm_router(
    config: str,
    *,
    agents: int = AGENTS,
    workers: int = WORKERS,
    real: Limits = LITELLM_LIMITS,
    redis_url: str | None = None,
    seed: int = 7,
) -> dict[str, Any]:
    """One live run of ``config`` (one of :data:`LITELLM_CONFIGS`): ``agents`` agents in
    ``workers`` processes against the loopback provider with the key's limits ``real``."""
    from tether.bench._live_limits import _provider_main

    if config not in LITELLM_CONFIGS:
        raise ValueError(f"config must be one of {', '.join(LITELLM_CONFIGS)}, got {config!r}")
    url = redis_url or os.environ.get("TETHER_REDIS_URL", "redis://127.0.0.1:6379/0")
    ctx = multiprocessing.get_context("spawn")
    port_q, provider_q, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    start: dict[str, Any] = {"go": ctx.Event(), "at": ctx.Value("d", 0.0)}
    provider = ctx.Process(
        target=_provider_main,
        args=(port_q, provider_q, stop, real, seed, time.time(), "openai"),
        daemon=True,
    )
    with interrupt_ignored():
        provider.start()
    port = port_q.get(timeout=60)
    prefix = f"tether-live-litellm-{uuid.uuid4().hex[:8]}"
    keys = [f"a{i}" for i in range(agents)]
    workers_args = [
        {
            "config": config,
            "redis_url": url,
            "prefix": prefix,
            "port": port,
            "keys": keys[i::workers],
            "real": real,
            "seed": seed,
            "start": start,
        }
        for i in range(workers)
    ]
    # the clock starts when every worker has its imports done
    started = start_workers(ctx, _worker_main, workers_args, ready_timeout=180)
    load = os.getloadavg()[0]
    start_at = start["at"].value = time.time() + 0.2
    start["go"].set()
    results = started.results(timeout=600)
    stop.set()
    served = provider_q.get(timeout=30)
    provider.join(timeout=5)
    redis_keys = _clear(url, prefix)
    stats = Stats(requests=served["requests"], throttled=served["throttled"])
    stats.admitted = [tuple(e) for e in served["admitted"]]
    stats.served = [tuple(e) for e in served["served"]]
    finished = sorted(t for r in results for t in r["finished"])
    failures = [f for r in results for f in r["failed"]]
    wall = max(finished, default=0.0)
    if failures and len(finished) < agents:
        wall = max(wall, time.time() - start_at)  # the failures ended by now at the latest
    # the busy time: from the start until 90% of the agents ended (after it, fewer agents
    # than the limit can serve are left); the bucket was full at the start (``real.tokens``)
    ended = sorted(finished + [wall] * len(failures))
    end = start_at + (ended[min(len(ended) - 1, math.ceil(0.9 * len(ended)) - 1)] if ended else 0)
    counted = sum(e[1] for e in stats.admitted if start_at <= e[0] < end)
    counted += sum(e[2] for e in stats.served if start_at <= e[0] < end)
    allowed = real.tokens * (end - start_at) / 60.0 + real.tokens
    return {
        "config": config,
        "agents": agents,
        "workers": workers,
        "success": round(len(finished) / agents, 4),
        "model_turns": sum(r["turns"] for r in results),
        # tether's side only (None: LiteLLM's): turns reserved in its token budget, seconds
        # waited for their places in all
        "reserved": _total([r["reserved"] for r in results]),
        "waited_s": _total([r["waited"] for r in results]),
        "requests": stats.requests,
        "throttled": stats.throttled,
        "throttled_per_1000": round(1000.0 * stats.throttled / max(1, stats.requests), 2),
        "tpm_share_of_limit": round(counted / allowed, 3) if allowed > 0 else 0.0,
        "wall_s": round(wall, 1),
        "load": round(load, 1),
        "started_at_second": round(start_at % 60.0, 1),
        "redis_keys": redis_keys,
        "failures": failures[:5],
    }


def _total(values: list[Any]) -> Any:
    """The sum of the workers' figures; None when they have none (LiteLLM's runs)."""
    return None if any(v is None for v in values) else round(sum(values), 1)


def run_litellm_suite(
    seed: int = 7, *, agents: int = AGENTS, workers: int = WORKERS
) -> dict[str, Any]:
    """Every configuration of :data:`LITELLM_CONFIGS`, one after the other (the load
    average at each start: the machine's other work)."""
    runs = {c: run_litellm_router(c, agents=agents, workers=workers, seed=seed) for c in
            LITELLM_CONFIGS}  # fmt: skip
    return {
        "agents": agents,
        "workers": workers,
        "real_limits": {
            "requests_per_minute": LITELLM_LIMITS.requests,
            "tokens_per_minute": LITELLM_LIMITS.tokens,
        },
        "num_retries": NUM_RETRIES,
        "runs": runs,
    }
