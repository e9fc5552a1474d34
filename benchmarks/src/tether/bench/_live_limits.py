"""The provider-limits scenario of the live fleet suite: real worker processes sharing one
Redis, against a loopback model provider that enforces one API key's limits.

The provider (its own process) is :class:`tether.bench._provider.SimulatedProvider`
behind a small HTTP/1.1 server on 127.0.0.1, in one of two styles:

* ``anthropic``: ``POST /v1/messages``; requests, input tokens and output tokens per
  minute as token buckets, the ``anthropic-ratelimit-*`` headers on every answer;
* ``openai``: ``POST /v1/chat/completions``; requests and tokens (input and
  ``max_tokens`` together) per minute, the ``x-ratelimit-{limit,remaining,reset}-
  {requests,tokens}`` headers (resets as durations, ``1.5s``, ``6m0s``) on every answer;

and a 429 with ``retry-after`` for a request that does not fit. It counts a prompt's
tokens with a tokenizer of its own per agent (2.6 to 4.6 characters a token). Worker
processes run the agents as asyncio tasks, each through the real ``AsyncAnthropic`` or
``AsyncOpenAI`` client over HTTP, guarded by tether with one :class:`tether.TokenBudget`
in a :class:`~tether.stores.RedisStore` per process (the same key for all), configured
with the key's limits right (with a Redis that stalls now and then), 2x too high or 2x too
low. Everything runs on real time, scaled down (a small key, short answers) to finish in
about a minute per configuration.
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import os
import random
import statistics
import time
import uuid
from typing import Any

from tether.bench._interrupt import interrupt_ignored
from tether.bench._provider import Limits, SimulatedProvider, Stats, share_of_limit
from tether.bench._wire import serve_until
from tether.bench._workers import start_workers

__all__ = ["LIVE_LIMITS", "LIVE_MISCONFIGS", "message_reply", "run_live_limits"]

#: the key's real limits: RPM, ITPM, OTPM (small, so that a live run binds in seconds)
LIVE_LIMITS = Limits(requests=600, input=360_000, output=100_000)
#: the OpenAI-style key's: RPM and TPM (a prompt and its max_tokens from one bucket)
LIVE_LIMITS_OPENAI = Limits(requests=600, tokens=460_000)
STYLES = {"anthropic": LIVE_LIMITS, "openai": LIVE_LIMITS_OPENAI}
#: the configured limits as a share of the real ones; "redis-timeouts": configured right,
#: the workers' Redis stalls now and then (see _StallingProxy) and they fall back to memory
LIVE_MISCONFIGS = {
    "configured-right": 1.0,
    "configured-2x-high": 2.0,
    "configured-2x-low": 0.5,
    "redis-timeouts": 1.0,
}
AGENTS, WORKERS = 200, 4
#: the Redis of the "redis-timeouts" run stops answering for STALL seconds every STALL_EVERY
#: (longer than the store's 0.5 s socket timeout: each stall is a timeout and a fallback)
STALL, STALL_EVERY = 0.7, 4.0


class _StallingProxy:
    """A TCP proxy in front of Redis that forwards nothing for ``STALL`` seconds every
    ``STALL_EVERY`` seconds: a Redis that times out now and then (a failover, a slow
    command, a network blip), for real sockets and the real client's timeouts."""

    def __init__(self, host: str, port: int) -> None:
        import threading

        self.target = (host, port)
        self.t0 = time.time()
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        threading.Thread(target=self._main, daemon=True).start()
        self._ready.wait(10)

    def stalled(self) -> bool:
        return (time.time() - self.t0) % STALL_EVERY > STALL_EVERY - STALL

    def _main(self) -> None:
        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    while self.stalled():
                        await asyncio.sleep(0.01)
                    w.write(data)
                    await w.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                w.close()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                up_r, up_w = await asyncio.open_connection(*self.target)
            except OSError:
                writer.close()
                return
            await asyncio.gather(pump(reader, up_w), pump(up_r, writer))

        async def main() -> None:
            server = await asyncio.start_server(handle, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            self._loop = asyncio.get_running_loop()
            self._ready.set()
            async with server:
                await server.serve_forever()

        asyncio.run(main())

    def close(self) -> None:
        if self._loop is not None:
            for task in asyncio.all_tasks(self._loop):
                self._loop.call_soon_threadsafe(task.cancel)


MODEL = "claude-sonnet-5-5"
MODELS = {"anthropic": MODEL, "openai": "gpt-6.1-terra"}


def _agent(seed: int, key: str) -> dict[str, Any]:
    """One agent's conversation and the provider's view of it (its tokenizer, its output)."""
    rng = random.Random(f"{seed}:{key}")
    turns = rng.randint(2, 4)
    return {
        "turns": turns,
        "system": "s" * rng.randint(1_000, 8_000),
        "chars_per_token": rng.uniform(2.6, 4.6),
        "max_tokens": [rng.choice((128, 256, 512)) for _ in range(turns)],
        "used": [rng.uniform(0.1, 0.9) for _ in range(turns)],
        "results": [rng.randint(400, 2_000) for _ in range(turns)],
        "start": rng.uniform(0.0, 3.0),
    }


def chat_reply(out: int, used_in: int, model: str) -> dict[str, Any]:
    """A chat completion of ``out`` output tokens (the OpenAI-style loopback provider)."""
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "r" * (out * 4)},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": used_in,
            "completion_tokens": out,
            "total_tokens": used_in + out,
        },
    }


def message_reply(out: int, used_in: int, model: str = MODEL) -> dict[str, Any]:
    """A Messages API answer of ``out`` output tokens (the scenarios' loopback providers)."""
    return {
        "id": "msg",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": "r" * (out * 4)}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": used_in, "output_tokens": out},
    }


def _provider_main(
    port_q: Any, result_q: Any, stop: Any, real: Limits, seed: int, start_at: float, style: str
) -> None:
    """The provider: answers ``POST /v1/messages`` (``anthropic``) or ``POST
    /v1/chat/completions`` (``openai``) on loopback until told to stop."""
    provider = SimulatedProvider(style, real, start_at)
    agents: dict[str, dict[str, Any]] = {}
    throttles: list[tuple[float, str]] = []  # (when, the agent) of every 429

    def answer(status: str, body: dict[str, Any], headers: dict[str, str]) -> bytes:
        data = json.dumps(body).encode()
        lines = [f"HTTP/1.1 {status}", "content-type: application/json"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines.append(f"content-length: {len(data)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + data

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readline():
                length = 0
                while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = header.decode().partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                body = json.loads(await reader.readexactly(length))
                key = body["metadata"]["user_id"]
                agent = agents.setdefault(key, _agent(seed, key))
                chars = len(json.dumps([body.get("system"), body["messages"]]))
                used_in = math.ceil(chars / agent["chars_per_token"])
                max_out = int(body.get("max_tokens") or body["max_completion_tokens"])
                ok, headers = provider.admit(time.time(), used_in, max_out)
                if not ok:
                    throttles.append((time.time(), key))
                    if style == "anthropic":
                        error = {"type": "rate_limit_error", "message": "rate limit exceeded"}
                        reply = {"type": "error", "error": error}
                    else:
                        reply = {"error": {"type": "requests", "code": "rate_limit_exceeded",
                                           "message": "Rate limit reached", "param": None}}  # fmt: skip
                    writer.write(answer("429 Too Many Requests", reply, headers))
                    await writer.drain()
                    continue
                turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
                out = max(1, int(max_out * agent["used"][min(turn, agent["turns"] - 1)]))
                await asyncio.sleep(0.3 + out / 400.0)  # first token, then 400 tokens a second
                provider.finish(time.time(), used_in, out, max_out)
                if style == "anthropic":
                    done = message_reply(out, used_in)
                else:
                    done = chat_reply(out, used_in, MODELS["openai"])
                writer.write(answer("200 OK", done, headers))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    levels: list[tuple[float, float]] = []  # (when, the binding bucket's level) every 0.5 s

    async def sample() -> None:
        bucket = provider.buckets["input" if style == "anthropic" else "tokens"]
        while True:
            now = time.time()
            with provider._lock:
                bucket.refill(now)
                levels.append((now, bucket.level))
            await asyncio.sleep(0.5)

    async def main() -> None:
        sampler = asyncio.create_task(sample())
        await serve_until(handle, port_q, stop)
        sampler.cancel()
        s = provider.stats
        result_q.put(
            {
                "requests": s.requests,
                "throttled": s.throttled,
                "admitted": s.admitted,
                "served": s.served,
                "throttles": throttles,
                "levels": levels,
            }
        )

    asyncio.run(main())


def _worker_main(
    redis_url: str,
    prefix: str,
    port: int,
    keys: list[str],
    configured: Limits,
    seed: int,
    start: Any,
    ready_q: Any,
    result_q: Any,
    style: str = "anthropic",
) -> None:
    """One worker process: its agents through the guarded client, one TokenBudget in Redis.
    It says when it is ready (its imports done), then waits for the common start."""
    import logging

    import anthropic
    import openai

    from tether import RetryPolicy, TokenBudget
    from tether.integrations import anthropic as tanthropic
    from tether.integrations import openai as topenai
    from tether.stores.redis._store import RedisStore

    logging.getLogger("tether").setLevel(logging.WARNING)
    logging.getLogger("tether").propagate = False
    for noisy in ("anthropic", "openai", "httpx"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    store = RedisStore(redis_url, prefix=prefix)
    family = "claude" if style == "anthropic" else "gpt-"
    budget = TokenBudget(style, family, store=store, **configured.as_budget())
    model = MODELS[style]
    fallbacks = [0]  # the times this process's store fell back to memory (a Redis timeout)

    class _Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "is unavailable" in record.getMessage():
                fallbacks[0] += 1

    logging.getLogger("tether").addHandler(_Count(logging.WARNING))
    finished: list[float] = []
    failed: list[str] = []
    states: list[tuple[float, str]] = []  # (when, state): this process's token budget's store
    lags: list[tuple[float, float]] = []  # (when, how late a 20 ms sleep woke): the event loop

    async def agent(key: str, client: Any) -> None:
        a = _agent(seed, key)
        await asyncio.sleep(max(0.0, start_at + a["start"] - time.time()))
        messages: list[dict[str, Any]] = [{"role": "user", "content": "q" * 400}]
        for turn in range(a["turns"]):
            try:
                if style == "anthropic":
                    reply = await client.messages.create(
                        model=model,
                        max_tokens=a["max_tokens"][turn],
                        system=a["system"],
                        messages=messages,
                        metadata={"user_id": key},
                    )
                    text = reply.content[0].text
                else:
                    reply = await client.chat.completions.create(
                        model=model,
                        max_tokens=a["max_tokens"][turn],
                        messages=[{"role": "system", "content": a["system"]}, *messages],
                        metadata={"user_id": key},
                    )
                    text = reply.choices[0].message.content
            except Exception as exc:
                failed.append(f"{type(exc).__name__}: {exc}"[:200])
                return
            messages = [
                *messages,
                {"role": "assistant", "content": text},
                {"role": "user", "content": "t" * a["results"][turn]},
            ]
        finished.append(time.time() - start_at)

    ready_q.put(os.getpid())
    start["go"].wait()
    start_at = start["at"].value

    async def main() -> None:
        raw: Any
        client: Any
        if style == "anthropic":
            raw = anthropic.AsyncAnthropic(
                api_key="bench", base_url=f"http://127.0.0.1:{port}", max_retries=0
            )
            client = tanthropic.guarded(raw, policy=RetryPolicy(), token_budget=budget)
        else:
            raw = openai.AsyncOpenAI(
                api_key="bench", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0
            )
            client = topenai.guarded(raw, policy=RetryPolicy(), token_budget=budget)
        watch = asyncio.create_task(_watch(store, budget.name, states, lags))
        await asyncio.gather(*(agent(k, client) for k in keys))
        watch.cancel()
        await raw.close()
        await store.aclose()

    asyncio.run(main())
    result_q.put(
        {
            "finished": finished,
            "failed": failed,
            "round_trips": store.round_trips,
            "fallbacks": fallbacks[0],
            "states": states,
            "lags": lags,
            "scripts": dict(store.scripts_run),
            "answers": dict(store._tokens.answers),
        }
    )


async def _watch(
    store: Any, name: str, states: list[tuple[float, str]], lags: list[tuple[float, float]]
) -> None:
    """Note each change of where this process's token budget stands (every 20 ms): ``redis``
    (its store answers), ``grace`` (Redis away, nothing admitted from memory yet),
    ``local`` (admitting its share from memory)."""
    from tether.stores.redis._tokens import AWAY_GRACE

    tokens = store._tokens
    asked = time.time()
    while True:
        now = time.time()
        lags.append((now, now - asked - 0.02))
        since = tokens.away.get(name)
        state = "redis" if since is None else "grace" if now - since < AWAY_GRACE else "local"
        if not states or states[-1][1] != state:
            states.append((now, state))
        asked = time.time()
        await asyncio.sleep(0.02)


def run_live_limits(
    misconfig: str,
    *,
    style: str = "anthropic",
    agents: int = AGENTS,
    workers: int = WORKERS,
    real: Limits | None = None,
    redis_url: str | None = None,
    seed: int = 7,
) -> dict[str, Any]:
    """One live run: ``agents`` agents in ``workers`` processes against a provider of
    ``style`` (its key's limits ``real``, by default the style's), configured per
    ``misconfig``."""
    real = real or STYLES[style]
    url = redis_url or os.environ.get("TETHER_REDIS_URL", "redis://127.0.0.1:6379/0")
    proxy = None
    if misconfig == "redis-timeouts":
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        proxy = _StallingProxy(parts.hostname or "127.0.0.1", parts.port or 6379)
        url = f"redis://127.0.0.1:{proxy.port}{parts.path or '/0'}"
    ctx = multiprocessing.get_context("spawn")
    port_q, provider_q, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    start: dict[str, Any] = {"go": ctx.Event(), "at": ctx.Value("d", 0.0)}
    provider = ctx.Process(
        target=_provider_main,
        args=(port_q, provider_q, stop, real, seed, time.time(), style),
        daemon=True,
    )
    with interrupt_ignored():
        provider.start()
    port = port_q.get(timeout=30)
    prefix = f"tether-live-limits-{uuid.uuid4().hex[:8]}"
    keys = [f"a{i}" for i in range(agents)]
    configured = real.scaled(LIVE_MISCONFIGS[misconfig])
    workers_args = [
        {
            "redis_url": url,
            "prefix": prefix,
            "port": port,
            "keys": keys[i::workers],
            "configured": configured,
            "seed": seed,
            "start": start,
            "style": style,
        }
        for i in range(workers)
    ]
    # the clock starts when every worker has its imports done
    started = start_workers(ctx, _worker_main, workers_args, ready_timeout=120)
    start_at = start["at"].value = time.time() + 0.2
    start["go"].set()
    store_levels: list[tuple[float, float, float]] = []
    poller = _poll_store(
        redis_url or os.environ.get("TETHER_REDIS_URL", "redis://127.0.0.1:6379/0"),
        f"{prefix}:tokens:{{{'anthropic:claude' if style == 'anthropic' else 'openai:gpt-'}}}",
        "lvl1" if style == "anthropic" else "lvl3",
        store_levels,
    )
    results = started.results(timeout=300)
    stop.set()
    served = provider_q.get(timeout=30)
    provider.join(timeout=5)
    if proxy is not None:
        proxy.close()
    poller.set()
    served["store_levels"] = store_levels
    stats = Stats(requests=served["requests"], throttled=served["throttled"])
    stats.admitted = [tuple(e) for e in served["admitted"]]
    stats.served = [tuple(e) for e in served["served"]]
    finished = sorted(t for r in results for t in r["finished"])
    failures = [f for r in results for f in r["failed"]]
    ended = sorted(finished + [0.0] * len(failures))
    # the busy time: from the start (the buckets full: the key's whole minute counted) until
    # 90% of the agents ended (after that, fewer agents than the limit can serve are left)
    end = start_at + (_quantile(ended, 0.9) if ended else 0.0)
    admitted = stats.requests - stats.throttled
    round_trips = sum(r["round_trips"] for r in results)
    if style == "anthropic":
        input_share = share_of_limit(stats, real.input, start_at, end, 1, real.input)
        output_share: float | None = share_of_limit(
            stats, real.output, start_at, end, 2, real.output
        )
    else:  # one bucket: input tokens as admitted and output tokens as generated, against TPM
        input_share = share_of_limit(stats, real.tokens, start_at, end, 1, real.tokens)
        input_share += share_of_limit(stats, real.tokens, start_at, end, 2, real.tokens)
        output_share = None
    return {
        "style": style,
        "agents": agents,
        "workers": workers,
        "success": round(len(finished) / agents, 4),
        "requests": stats.requests,
        "throttled_per_1000": round(1000.0 * stats.throttled / max(1, stats.requests), 2),
        "input_share_of_limit": round(input_share, 3),
        "output_share_of_limit": None if output_share is None else round(output_share, 3),
        "p50_completion_s": round(statistics.median(finished), 1) if finished else None,
        "p95_completion_s": round(_quantile(finished, 0.95), 1) if finished else None,
        "round_trips_per_call": round(round_trips / max(1, admitted), 2),
        "redis_fallbacks": sum(r["fallbacks"] for r in results),
        "failures": failures[:5],
        "trace": _trace(served, results, keys, workers, start_at, end, proxy, real, style),
    }


def _poll_store(url: str, key: str, field: str, out: list[tuple[float, float, float]]) -> Any:
    """Sample the shared bucket every 0.5 s in a thread: (when, its line, its level at the
    line's end); returns the event that stops it."""
    import threading

    import redis

    stop = threading.Event()
    client = redis.Redis.from_url(url)

    def loop() -> None:
        while not stop.wait(0.5):
            seconds, micros = client.time()
            now = int(seconds) + micros / 1e6
            t, lvl = client.hmget(key, "t", field)
            if t is not None and lvl is not None:
                out.append((time.time(), float(t) - now, float(lvl)))

    threading.Thread(target=loop, daemon=True).start()
    return stop


def _state_at(states: list[Any], at: float) -> tuple[str, float]:
    """A worker's state at ``at`` and how long it had been in it."""
    state, since = "redis", -math.inf
    for t, s in states:
        if t > at:
            break
        state, since = s, t
    return state, at - since


def _trace(
    served: dict[str, Any],
    results: list[dict[str, Any]],
    keys: list[str],
    workers: int,
    start_at: float,
    end: float,
    proxy: _StallingProxy | None,
    real: Limits,
    style: str,
) -> dict[str, Any]:
    """Where the 429s came from (when, which process, its store's state then, the stall's
    phase) and the input admitted per second while processes were in grace or local."""
    worker_of = {k: i % workers for i, k in enumerate(keys)}
    states = [r.get("states", []) for r in results]
    throttles = []
    for t, key in served.get("throttles", []):
        w = worker_of.get(key, -1)
        mine = _state_at(states[w], t) if 0 <= w < len(states) else ("?", 0.0)
        throttles.append(
            {
                "t": round(t - start_at, 2),
                "worker": w,
                "state": mine[0],
                "for": round(mine[1], 2),
                "others": [_state_at(st, t)[0] for st in states],
                "stall_phase": None
                if proxy is None
                else round((t - proxy.t0) % STALL_EVERY - (STALL_EVERY - STALL), 2),
            }
        )
    # input admitted per 1 s bin, by how many processes were away (grace or local) then
    limit = real.input if style == "anthropic" else real.tokens
    bins: dict[int, float] = {}
    for e in served.get("admitted", []):
        if start_at <= e[0] < end:
            bins[int(e[0] - start_at)] = bins.get(int(e[0] - start_at), 0.0) + e[1]
    by_away: dict[str, list[float]] = {}
    time_in: dict[str, float] = {"redis": 0.0, "grace": 0.0, "local": 0.0}
    for b in range(int(end - start_at)):
        mid = start_at + b + 0.5
        now_states = [_state_at(st, mid)[0] for st in states]
        away = sum(1 for x in now_states if x != "redis")
        by_away.setdefault(str(away), []).append(bins.get(b, 0.0) * 60.0 / limit)
        for x in now_states:
            time_in[x] = time_in.get(x, 0.0) + 1.0
    total = sum(time_in.values()) or 1.0
    # per 5 s: the input admitted as a share of the limit, the agents not ended yet, the
    # provider's bucket (mean level, share of its capacity), the shared line (mean seconds)
    # and the workers' event loops (mean lateness of a 20 ms sleep, seconds)
    ended = sorted(start_at + t for r in results for t in r.get("finished", []))

    def per_5s(points: list[Any], at: int) -> list[tuple[float, float]]:
        return [(e[0], e[-1]) for e in points if start_at + at <= e[0] < start_at + at + 5]

    lags = [e for r in results for e in r.get("lags", [])]
    series = []
    for b in range(0, int(end - start_at) + 5, 5):
        got = sum(bins.get(b + i, 0.0) for i in range(5)) * 12.0 / limit
        left = len(keys) - sum(1 for t in ended if t < start_at + b + 5)
        level = [v for _, v in per_5s(served.get("levels", []), b)]
        line = [e[1] for e in served.get("store_levels", []) if 0 <= e[0] - start_at - b < 5]
        lag = [v for _, v in per_5s(lags, b)]
        series.append(
            (
                b,
                round(got, 2),
                left,
                round(statistics.mean(level) / limit, 3) if level else None,
                round(statistics.mean(line), 2) if line else None,
                round(statistics.mean(lag), 3) if lag else None,
            )
        )
    return {
        "throttles": throttles,
        "series": series,
        "share_per_s_by_processes_away": {
            k: {"seconds": len(v), "mean": round(statistics.mean(v), 3)}
            for k, v in sorted(by_away.items())
        },
        "process_time": {k: round(v / total, 3) for k, v in time_in.items()},
        "scripts": [r.get("scripts", {}) for r in results],
        "answers": [r.get("answers", {}) for r in results],
    }


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def run_live_limits_suite(seed: int = 7) -> dict[str, Any]:
    """Every configuration of both styles, one after the other (with the load average
    before each: the machine's other work)."""
    runs = {}
    for style in STYLES:
        for m in LIVE_MISCONFIGS:
            load = os.getloadavg()[0]
            runs[f"{style} / {m}"] = {**run_live_limits(m, style=style, seed=seed), "load": load}
    return {
        "agents": AGENTS,
        "workers": WORKERS,
        "real_limits": {
            "anthropic": {
                "requests_per_minute": LIVE_LIMITS.requests,
                "input_tokens_per_minute": LIVE_LIMITS.input,
                "output_tokens_per_minute": LIVE_LIMITS.output,
            },
            "openai": {
                "requests_per_minute": LIVE_LIMITS_OPENAI.requests,
                "tokens_per_minute": LIVE_LIMITS_OPENAI.tokens,
            },
        },
        "runs": runs,
    }
