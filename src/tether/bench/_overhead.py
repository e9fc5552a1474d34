"""The overhead suite (real time, the success path, side by side in one process) and the
soak suite (one run of 10^6 guarded steps, bounded and unbounded; the detectors' memory)."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import tether
from tether.run._loops import LoopPolicy, LoopState

__all__ = ["run_overhead", "run_soak"]

Progress = Callable[[str, int], None]


def _silent(message: str, total: int) -> None:
    pass


def _ns_per_call(fn: Callable[[], Any], *, number: int, repeat: int = 5) -> float:
    """The best of ``repeat`` timings of ``number`` calls, in ns per call."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter_ns()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter_ns() - start) / number)
    return best


def _args_of_size(size: int) -> dict[str, Any]:
    """Tool arguments of about ``size`` bytes of JSON: an order with its line items."""
    row = {"id": 0, "sku": "SKU-00000", "qty": 0, "note": "refund line item"}
    count = max(1, (size - 60) // (len(json.dumps(row)) + 2))
    rows = [
        {"id": n, "sku": f"SKU-{n:05d}", "qty": n % 7, "note": "refund line item"}
        for n in range(count)
    ]
    return {"customer": "C-1042", "reason": "damaged in transit", "items": rows}


def _deep_size(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes held by ``obj`` and everything it contains (slots, dicts, containers)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(_deep_size(k, seen) + _deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, list | tuple | set | frozenset | deque):
        size += sum(_deep_size(v, seen) for v in obj)
    elif hasattr(obj, "__slots__") and not isinstance(obj, str | bytes | int | float):
        size += sum(
            _deep_size(getattr(obj, n), seen)
            for n in obj.__slots__
            if hasattr(obj, n) and n != "policy"
        )
    return size


RUN_STATE = ("partial", "transcript", "_effects", "_results", "_loops", "_failures", "_tool_counts",
             "_journal")  # fmt: skip


def _long_run(steps: int, keep: int | None) -> dict[str, Any]:
    """One run of ``steps`` guarded steps (proceed + call_tool, ~100 B of arguments): time
    per step and the bytes its state holds at the end."""
    import gc
    import time

    guard = tether.Guard(loops=LoopPolicy(max_no_progress=None), keep_last=keep)
    run = guard.start()
    args = {"q": "x" * 64}
    gc.collect()
    start = time.perf_counter()
    for i in range(steps):
        run.proceed()
        run.call_tool("lookup", _echo, {**args, "n": i})
    ns = (time.perf_counter() - start) / steps * 1e9
    held = sum(_deep_size(getattr(run, name)) for name in RUN_STATE)
    return {"steps": steps, "ns_per_call": round(ns, 1), "run_state_bytes": held}


def _echo(**kwargs: Any) -> int:
    return len(kwargs)


def _breakers(number: int) -> dict[str, dict[str, Any]]:
    """One breaker-guarded call on the success path, per store: time and round trips."""
    import os

    from tether.stores import MemoryStore
    from tether.stores.redis._store import RedisStore

    def target() -> int:
        return 1

    out: dict[str, dict[str, Any]] = {}
    breaker = tether.CircuitBreaker("bench", store=MemoryStore())
    out["memory"] = {"ns_per_call": round(_ns_per_call(lambda: breaker.call(target), number=number), 1),
                     "round_trips_per_call": 0}  # fmt: skip
    url = os.environ.get("TETHER_REDIS_URL", "redis://127.0.0.1:6379/0")
    for label, ttl in (("redis", 1.0), ("redis_exact", 0.0)):
        try:
            with RedisStore(url, prefix="tether-bench", cache_ttl=ttl) as store:
                shared = tether.CircuitBreaker("bench", store=store)
                shared.call(target)
                before = store.round_trips
                calls = 2000
                ns = _ns_per_call(functools.partial(shared.call, target), number=calls // 5)
                trips = (store.round_trips - before) / calls
                store.reset()
        except Exception as exc:  # Redis unreachable: say so, do not fail the bench
            out[label] = {"note": f"skipped: {type(exc).__name__} (set TETHER_REDIS_URL)"}
            continue
        out[label] = {
            "ns_per_call": round(ns, 1),
            "round_trips_per_call": round(trips, 3),
            "cache_ttl_s": ttl,
        }
    return out


def _ledgers() -> dict[str, dict[str, Any]]:
    """Ledger.once on the success path (a new key each call), per backend."""
    import os
    import tempfile
    import uuid

    out: dict[str, dict[str, Any]] = {}
    tmp = tempfile.mkdtemp(prefix="tether-bench-")
    makers: dict[str, Callable[[], tether.Ledger]] = {
        "memory": lambda: tether.Ledger.memory(),
        "sqlite": lambda: tether.Ledger.sqlite(os.path.join(tmp, "ledger.db")),
        "redis": lambda: tether.Ledger.redis(os.environ.get("TETHER_REDIS_URL", "redis://127.0.0.1:6379/0"),
                                             prefix=f"tether-bench-{uuid.uuid4().hex[:6]}"),
        "postgres": lambda: tether.Ledger.postgres(
            os.environ.get("TETHER_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test"),
            table=f"tether_bench_{uuid.uuid4().hex[:6]}"),
    }  # fmt: skip
    for name, make in makers.items():
        try:
            ledger = make()
        except Exception as exc:
            out[name] = {
                "note": f"skipped: {type(exc).__name__} (set TETHER_REDIS_URL / TETHER_PG_DSN)"
            }
            continue
        counter = [0]

        def once(ledger: tether.Ledger = ledger, counter: list[int] = counter) -> None:
            counter[0] += 1
            ledger.once(f"bench-{counter[0]}", lambda: {"ok": True})

        backend: Any = ledger.backend
        once()
        before = getattr(backend, "round_trips", 0)
        calls = 300
        ns = _ns_per_call(once, number=calls // 3, repeat=3)
        trips = (getattr(backend, "round_trips", 0) - before) / calls
        out[name] = {"ns_per_call": round(ns, 1), "round_trips_per_call": round(trips, 2)}
        if hasattr(backend, "table"):
            table = backend.table
            backend._exec(lambda c, table=table: c.execute(f"DROP TABLE IF EXISTS {table}"))
        if hasattr(backend, "prefix"):
            for k in backend.client.scan_iter(match=f"{backend.prefix}:*"):
                backend.client.delete(k)
        ledger.close()
    return out


def _paired(
    floor: Callable[[], Any], impl: Callable[[], Any], *, number: int, repeat: int = 15
) -> dict[str, Any]:
    """Floor and implementation timed back to back in ``repeat`` rounds.

    The ratio is the median of the per-round ratios: both sides of a round see the same
    machine, so a noisy neighbour moves the times but hardly the ratio. The times shown
    are the best round of each.
    """
    rounds = []
    for _ in range(repeat):
        f = _ns_per_call(floor, number=number, repeat=1)
        i = _ns_per_call(impl, number=number, repeat=1)
        rounds.append((f, i))
    ratios = sorted(i / f for f, i in rounds)
    best_f = min(f for f, _ in rounds)
    best_i = min(i for _, i in rounds)
    return {"floor": {"ns_per_call": round(best_f, 1)},
            "tether": {"ns_per_call": round(best_i, 1), "ratio": round(ratios[len(ratios) // 2], 2)}}  # fmt: skip


def _hash_floor(args: Any) -> Callable[[], str]:
    """json.dumps(sort_keys=True) + SHA-256 of the same arguments: the floor."""
    return lambda: hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()


def run_overhead(
    quick: bool = False, progress: Progress | None = None
) -> dict[str, dict[str, dict[str, float]]]:
    """ns per call of each case; ratios against the floor of each case."""
    number = 5_000 if quick else 20_000
    note = progress or _silent
    total = 5
    logging.getLogger("tether").setLevel(logging.ERROR)

    def target() -> int:
        return 1

    out: dict[str, dict[str, dict[str, float]]] = {}
    bare = _ns_per_call(target, number=number)
    policy = tether.RetryPolicy()
    impls: dict[str, float] = {
        "bare": bare,
        "tether": _ns_per_call(lambda: policy.call(target), number=number),
    }
    try:
        import tenacity

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_exponential_jitter()
        )
        impls["tenacity"] = _ns_per_call(lambda: retrying(target), number=number // 5)
    except ImportError:  # pragma: no cover - the bench extra brings it
        pass
    try:
        import stamina

        wrapped = stamina.retry(on=Exception, attempts=3)(target)
        impls["stamina"] = _ns_per_call(wrapped, number=number // 5)
    except ImportError:  # pragma: no cover
        pass
    out["retry_success_path"] = {k: {"ns_per_call": round(v, 1)} for k, v in impls.items()}
    for k, v in impls.items():
        if k != "bare":
            out["retry_success_path"][k]["overhead_ns"] = round(v - bare, 1)
    note("overhead: retry success path", total)

    # one guarded step: proceed + call_tool with 1 KB of arguments
    args_1k = _args_of_size(1024)
    loops = LoopPolicy(max_no_progress=None, max_repeats=2**30, window=2**30)
    guard = tether.Guard(budget=tether.Budget(), loops=loops)
    runs = [guard.start()]
    counter = [0]

    def step() -> None:
        counter[0] += 1
        if counter[0] % 50 == 0:  # runs are short: a fresh one every 50 steps
            runs[0] = guard.start()
        run = runs[0]
        run.proceed()
        run.call_tool("lookup", lambda **kw: counter[0], {**args_1k, "n": counter[0]})

    out["guarded_step_1kb"] = _paired(_hash_floor(args_1k), step, number=200)
    note("overhead: one guarded step", total)
    out["intent_key_1kb"] = _paired(
        _hash_floor(args_1k), lambda: tether.intent_key("refund", args_1k), number=200
    )
    args_1m = _args_of_size(1024 * 1024)
    out["intent_key_1mb"] = _paired(_hash_floor(args_1m), lambda: tether.intent_key("refund", args_1m),
                                    number=2, repeat=5)  # fmt: skip
    note("overhead: intent_key", total)
    out["breaker_success_path"] = _breakers(number)
    note("overhead: breaker", total)
    out["ledger_once_success_path"] = _ledgers()
    note("overhead: ledger", total)
    return out


def run_soak(quick: bool = False, progress: Progress | None = None) -> dict[str, dict[str, Any]]:
    """One run of 10^6 guarded steps (10^5 with ``quick``) with the default ``keep_last=1000``
    and unbounded: time per step and the bytes its state holds; the detectors' memory."""
    note = progress or _silent
    logging.getLogger("tether").setLevel(logging.ERROR)
    out: dict[str, dict[str, Any]] = {}
    # one long run: the memory its state holds after 10^6 guarded steps, bounded (the default,
    # Guard(keep_last=1000)) and unbounded (keep_last=None: what every run held before)
    long_steps = 100_000 if quick else 1_000_000
    note(f"soak: {long_steps:,} guarded steps, keep_last=1000", 4)
    bounded = _long_run(long_steps, 1000)
    note(f"soak: {long_steps:,} guarded steps, unbounded", 4)
    out["long_run"] = {"keep_last=1000": bounded, "unbounded": _long_run(long_steps, None)}
    note("soak: the detectors' memory", 4)

    # the detectors' memory after a long run (their containers, measured deeply)
    steps = 100_000 if quick else 1_000_000
    state = LoopState(LoopPolicy())
    at_10k = 0
    for i in range(steps):
        digest = f"{i:064x}"
        state.record_action("search", digest)
        state.observe_state(digest, i)
        if i + 1 == 10_000:
            at_10k = _deep_size(state)
    out["detector_memory"] = {"tether": {"steps": steps, "bytes_after_10k_steps": at_10k,
                                         "bytes_after_all_steps": _deep_size(state)}}  # fmt: skip
    note("soak: done", 4)
    return out
