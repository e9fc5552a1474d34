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
    if hasattr(obj, "__slots__") and not isinstance(obj, str | bytes | int | float):
        size += sum(
            _deep_size(getattr(obj, n), seen)
            for n in obj.__slots__
            if hasattr(obj, n) and n != "policy"
        )
    return size


RUN_STATE = (
    "partial",
    "transcript",
    "_effects",
    "_results",
    "_loops",
    "_failures",
    "_tool_counts",
    "_journal",
)


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
    state = run._state  # what the run counts and remembers
    held = sum(_deep_size(getattr(state, name)) for name in RUN_STATE)
    return {"steps": steps, "ns_per_call": round(ns, 1), "run_state_bytes": held}


def _echo(**kwargs: Any) -> int:
    return len(kwargs)


def _skipped(exc: Exception, server: str, variable: str) -> dict[str, str]:
    """A row whose server could not be used: where it was looked for (the password
    masked) and why, and the variable that names it."""
    import os

    from tether.stores._sqlfailures import safe_dsn

    given = os.environ.get(variable)
    if given is None:  # the default address: say which variable gives another
        said = f"no {server} at the default address ({type(exc).__name__}; set {variable})"
    else:
        said = f"{server} unreachable at {safe_dsn(given)} ({type(exc).__name__}; {variable})"
    return {"note": f"skipped: {said}"}


def _ping_redis(url: str) -> None:
    """Raise if Redis at ``url`` does not answer."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=2.0, socket_timeout=2.0)
    try:
        client.ping()
    finally:
        client.close()


def _ping_postgres(dsn: str) -> None:
    """Raise :class:`tether.StoreUnavailable` if PostgreSQL at ``dsn`` does not answer."""
    import psycopg

    try:
        psycopg.connect(dsn, connect_timeout=2).close()
    except psycopg.OperationalError as exc:
        raise tether.StoreUnavailable(f"PostgreSQL did not answer ({exc})") from None


def _breakers(number: int) -> dict[str, dict[str, Any]]:
    """One breaker-guarded call on the success path, per store: time and round trips."""
    import os

    from tether.stores import MemoryStore
    from tether.stores.redis._store import RedisStore

    def target() -> int:
        return 1

    out: dict[str, dict[str, Any]] = {}
    breaker = tether.CircuitBreaker("bench", store=MemoryStore())
    out["memory"] = {
        "ns_per_call": round(_ns_per_call(lambda: breaker.call(target), number=number), 1),
        "round_trips_per_call": 0,
    }
    url = os.environ.get("TETHER_REDIS_URL", "redis://127.0.0.1:6379/0")
    for label, ttl in (("redis", 1.0), ("redis_exact", 0.0)):
        try:
            _ping_redis(url)  # else the store falls back to memory and that would be timed
            with RedisStore(url, prefix="tether-bench", cache_ttl=ttl) as store:
                shared = tether.CircuitBreaker("bench", store=store)
                shared.call(target)
                before = store.round_trips
                calls = 2000
                ns = _ns_per_call(functools.partial(shared.call, target), number=calls // 5)
                trips = (store.round_trips - before) / calls
                store.reset()
        except Exception as exc:  # Redis unreachable: say so, do not fail the bench
            out[label] = _skipped(exc, "Redis", "TETHER_REDIS_URL")
            continue
        out[label] = {
            "ns_per_call": round(ns, 1),
            "round_trips_per_call": round(trips, 3),
            "cache_ttl_s": ttl,
        }
    return out


def _interleaved(
    impls: dict[str, Callable[[], Any]], *, number: int, reps: int
) -> dict[str, list[float]]:
    """ns per call of each implementation in each of ``reps`` rounds, ``number`` calls each.

    The implementations take turns inside every round (the order rotates from round to
    round), so a noisy neighbour slows both sides of a round and hardly moves their ratio.
    """
    names = list(impls)
    times: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            fn = impls[name]
            start = time.perf_counter_ns()
            for _ in range(number):
                fn()
            times[name].append((time.perf_counter_ns() - start) / number)
    return times


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _ratios(ours: list[float], theirs: list[float]) -> dict[str, float]:
    """The median ratio of the rounds, with its min and max."""
    r = [a / b for a, b in zip(ours, theirs, strict=True) if b > 0]
    return {
        "ratio": round(_median(r), 3),
        "ratio_min": round(min(r), 3),
        "ratio_max": round(max(r), 3),
    }


def _row(
    times: dict[str, list[float]],
    *,
    ours: str = "tether",
    peer: str,
    goal: float | None,
    per: int = 1,
    unit: str = "call",
) -> dict[str, dict[str, Any]]:
    """A row of the table: every implementation's median time, and ours against ``peer``."""
    out: dict[str, dict[str, Any]] = {
        name: {"ns_per_call": round(_median(t) / per, 1), "per": unit} for name, t in times.items()
    }
    out[ours].update(_ratios(times[ours], times[peer]), vs=peer)
    if goal is not None:
        out[ours]["goal"] = goal
        out[ours]["holds"] = out[ours]["ratio"] <= goal
    return out


# --- guarded runs against the loop users write today --------------------------------------


def _tool(**kwargs: Any) -> dict[str, Any]:
    return {"ok": True, "n": kwargs.get("n")}


#: the peers as users write them (each row's peer says so in ``written_as``)
TENACITY_RETRY = "@tenacity.retry(stop=stop_after_attempt, wait=wait_exponential_jitter)"
TENACITY_LOOP = (
    "@tenacity.retry tool, a step counter, a wall-clock deadline, json.dumps + SHA-256 "
    "repeat check, a transcript of each call and its result"
)
#: a guarded step against the loop users write (#45), held by the long run's row
STEP_GOAL = 1.2
#: the deadline of a peer's run, checked at every step (far enough never to be reached)
PEER_DEADLINE_S = 3600.0


def _tenacity_loop(args: dict[str, Any], steps: int) -> Callable[[], Any]:
    """The loop users write for what a guarded run on the defaults gives: the tool under
    tenacity's ``@retry`` decorator (which copies its ``Retrying`` on every call, as users'
    code does), a step counter, a wall-clock deadline checked before each step, a repeat
    check on json.dumps(sort_keys=True) + SHA-256 of the call, and a transcript: each call
    with its step, arguments and result (the record a run keeps)."""
    import tenacity

    @tenacity.retry(
        stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_exponential_jitter(), reraise=True
    )
    def lookup(**kwargs: Any) -> dict[str, Any]:
        return _tool(**kwargs)

    def run() -> list[dict[str, Any]]:
        deadline = time.monotonic() + PEER_DEADLINE_S
        seen: dict[str, int] = {}
        transcript: list[dict[str, Any]] = []
        for step, i in enumerate(range(steps), 1):
            if step > steps + 1:  # the step budget
                raise RuntimeError("step budget")
            if time.monotonic() >= deadline:  # the run's time
                raise TimeoutError("deadline")
            call = {**args, "n": i}
            digest = hashlib.sha256(
                json.dumps({"tool": "lookup", "args": call}, sort_keys=True).encode()
            ).hexdigest()
            seen[digest] = seen.get(digest, 0) + 1
            if seen[digest] > 2:
                raise RuntimeError("repeated call")
            result = lookup(**call)
            transcript.append({"step": step, "tool": "lookup", "args": call, "result": result})
        return transcript

    return run


def _tether_run(
    args: dict[str, Any], steps: int, phases: list[list[float]] | None = None
) -> Callable[[], Any]:
    """One guarded run on the defaults, start to end: ``steps`` times proceed + call_tool.

    Its peer (:func:`_tenacity_loop`) checks a deadline at each step; this run has no time
    budget: ``Budget(max_seconds=)`` does more than a check between steps (it bounds a
    running sync tool in a worker thread), which the peer does not, so the peer's one clock
    read a step is the only work it does that this run does not."""
    guard = tether.Guard(budget=tether.Budget(max_steps=steps + 1))

    def run() -> Any:
        t0 = time.perf_counter_ns()
        with guard.start(task="bench") as r:
            t1 = time.perf_counter_ns()
            for i in range(steps):
                r.proceed()
                r.call_tool("lookup", _tool, {**args, "n": i})
            t2 = time.perf_counter_ns()
            r.succeed("done")
        t3 = time.perf_counter_ns()
        if phases is not None:
            phases.append([t1 - t0, t2 - t1, t3 - t2])
        return r.outcome

    return run


_JSON_ENCODER = ("json/encoder.py", "json\\encoder.py")
_CANONICAL = ("effects/_canonical.py", "effects\\_canonical.py")


def _encodings_per_call(args: dict[str, Any]) -> dict[str, float]:
    """JSON encodings and SHA-256 digests made by one ``call_tool`` (profiled, not timed)."""
    guard = tether.Guard(budget=tether.Budget(max_steps=10**6))
    counts = {"json": 0, "sha256": 0}
    calls = 20

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            # the standard library's encode, or tether's encoder_once, which calls its C
            # encoder directly
            if code.co_name == "encode" and code.co_filename.endswith(_JSON_ENCODER + _CANONICAL):
                counts["json"] += 1
        elif event == "c_call" and getattr(arg, "__name__", "") in ("openssl_sha256", "sha256"):
            counts["sha256"] += 1

    with guard.start(task="bench") as run:
        run.proceed()
        run.call_tool("lookup", _tool, {**args, "n": -1})
        sys.setprofile(profile)
        try:
            for i in range(calls):
                run.proceed()
                run.call_tool("lookup", _tool, {**args, "n": i})
        finally:
            sys.setprofile(None)
        run.succeed("done")
    return {
        "json_encodings_per_call": counts["json"] / calls,
        "sha256_per_call": counts["sha256"] / calls,
    }


def _guarded(quick: bool) -> dict[str, dict[str, dict[str, Any]]]:
    args = _args_of_size(1024)
    reps = 3 if quick else 7
    out: dict[str, dict[str, dict[str, Any]]] = {}
    phases: list[list[float]] = []
    times = _interleaved(
        {"tether": _tether_run(args, 20, phases), "tenacity_loop": _tenacity_loop(args, 20)},
        number=3 if quick else 12,
        reps=reps,
    )
    # no goal: #45 sets one for a step (the long run's row below); this row's time holds a
    # run's start and end as well, that the peer has nothing of (its end is held to its
    # steps by end_of_20_call_run)
    out["guarded_run_20_steps"] = _row(times, peer="tenacity_loop", goal=None, per=20, unit="step")
    out["guarded_run_20_steps"]["tenacity_loop"]["written_as"] = TENACITY_LOOP
    ends = [p[2] / p[1] for p in phases]
    start = _median([p[0] for p in phases])
    steps_ns = _median([p[1] for p in phases])
    end_ns = _median([p[2] for p in phases])
    out["end_of_20_call_run"] = {
        "steps": {"ns_per_call": round(steps_ns, 1), "per": "20 steps"},
        "tether": {
            "ns_per_call": round(end_ns, 1),
            "per": "end (succeed + leaving with)",
            "ratio": round(_median(ends), 3),
            "ratio_min": round(min(ends), 3),
            "ratio_max": round(max(ends), 3),
            "vs": "steps",
            "goal": 0.3,
            "holds": _median(ends) <= 0.3,
            "start_ns": round(start, 1),
        },
    }
    steps = 500 if quick else 2000
    times = _interleaved(
        {"tether": _tether_run(args, steps), "tenacity_loop": _tenacity_loop(args, steps)},
        number=1,
        reps=reps,
    )
    out[f"guarded_run_{steps}_steps"] = _row(
        times, peer="tenacity_loop", goal=STEP_GOAL, per=steps, unit="step"
    )
    out[f"guarded_run_{steps}_steps"]["tenacity_loop"]["written_as"] = TENACITY_LOOP

    # call_tool alone, in a long open run, against json.dumps + SHA-256 of the same call
    guard = tether.Guard(budget=tether.Budget(max_steps=10**7))
    run = guard.start(task="bench")
    counter = [0]

    def call_tool() -> None:
        counter[0] += 1
        run.call_tool("lookup", _tool, {**args, "n": counter[0]})

    floor_counter = [0]

    def floor() -> None:
        floor_counter[0] += 1
        call = {**args, "n": floor_counter[0]}
        hashlib.sha256(
            json.dumps({"tool": "lookup", "args": call}, sort_keys=True).encode()
        ).hexdigest()
        _tool(**call)

    times = _interleaved(
        {"tether": call_tool, "floor": floor}, number=50 if quick else 200, reps=reps
    )
    out["call_tool_1kb"] = _row(times, peer="floor", goal=None)
    out["call_tool_1kb"]["tether"].update(_encodings_per_call(args))
    return out


# --- retries ----------------------------------------------------------------------------------


def _retry_rows(quick: bool, with_success: bool = True) -> dict[str, dict[str, dict[str, Any]]]:
    """RetryPolicy against tenacity's ``@retry`` decorator as users write it: 3 failures
    then success (no sleeping), and the success path (over a bare call). The tool fails as
    users' tools do, with a builtin error (``ConnectionResetError``), not tether's own
    ``TransientError``."""
    import tenacity

    reps = 3 if quick else 7
    state = [0]

    def flaky() -> int:
        state[0] += 1
        if state[0] % 4:
            raise ConnectionResetError(104, "Connection reset by peer")
        return 1

    policy = tether.RetryPolicy(max_attempts=4, clock=tether.VirtualClock())
    flaky_retried = tenacity.retry(
        stop=tenacity.stop_after_attempt(4),
        wait=tenacity.wait_exponential_jitter(),
        sleep=lambda s: None,
        reraise=True,
    )(flaky)

    def ours() -> None:
        state[0] = 0
        policy.call(flaky)

    def theirs() -> None:
        state[0] = 0
        flaky_retried()

    out: dict[str, dict[str, dict[str, Any]]] = {}
    times = _interleaved(
        {"tether": ours, "tenacity": theirs}, number=200 if quick else 500, reps=reps
    )
    row = _row(times, peer="tenacity", goal=1.0)
    row["tether"]["error"] = row["tenacity"]["error"] = "ConnectionResetError"
    row["tenacity"]["written_as"] = TENACITY_RETRY
    out["retry_3_failures_then_success"] = row
    if not with_success:
        return out

    def target() -> int:
        return 1

    success = tether.RetryPolicy()
    plain = tenacity.retry(
        stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_exponential_jitter()
    )(target)
    times = _interleaved(
        {"bare": target, "tether": lambda: success.call(target), "tenacity": plain},
        number=2000 if quick else 5000,
        reps=reps,
    )
    bare = times["bare"]
    over = {
        k: [t - b for t, b in zip(v, bare, strict=True)] for k, v in times.items() if k != "bare"
    }
    row = _row({"bare": bare, **over}, peer="tenacity", goal=0.05)
    for k in over:
        row[k]["overhead_over_bare"] = True
    row["tenacity"]["written_as"] = TENACITY_RETRY
    out["retry_success_path"] = row
    return out


def _retry_without_otel(quick: bool) -> dict[str, dict[str, Any]]:
    """The 3-failures row in a fresh interpreter where opentelemetry cannot be imported."""
    import subprocess

    code = (
        "import sys, json; sys.modules['opentelemetry'] = None\n"
        "from tether.bench._overhead import _retry_rows\n"
        f"print(json.dumps(_retry_rows({quick}, False)['retry_3_failures_then_success']))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if out.returncode:
        return {"tether": {"note": f"skipped: {out.stderr.strip().splitlines()[-1:]}"}}
    row: dict[str, dict[str, Any]] = json.loads(out.stdout)
    return row


# --- ledgers: a new key each call, against the statements they stand for ----------------------


def _pg_floor(dsn: str, table: str) -> dict[str, Callable[[], Any]]:
    """INSERT … ON CONFLICT alone, and the two-statement floor (claim, then record the result),
    on one psycopg connection in autocommit, as the ledger's pool connections are."""
    import psycopg

    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {table} (key TEXT PRIMARY KEY, state TEXT NOT NULL, result TEXT)"
    )
    n = [0]

    def insert() -> None:
        n[0] += 1
        conn.execute(
            f"INSERT INTO {table} (key, state) VALUES (%s, 'pending') ON CONFLICT (key) DO NOTHING "
            "RETURNING key",
            (f"i-{n[0]}",),
        ).fetchone()

    def two() -> None:
        n[0] += 1
        key = f"t-{n[0]}"
        conn.execute(
            f"INSERT INTO {table} (key, state) VALUES (%s, 'pending') ON CONFLICT (key) DO NOTHING "
            "RETURNING key",
            (key,),
        ).fetchone()
        conn.execute(
            f"UPDATE {table} SET state = 'done', result = %s WHERE key = %s AND state = 'pending' "
            "RETURNING key",
            ('{"ok": true}', key),
        ).fetchone()

    def close() -> None:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.close()

    return {"insert_on_conflict": insert, "two_statements": two, "close": close}


def _sqlite_floor(path: str) -> dict[str, Callable[[], Any]]:
    import sqlite3

    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(
        "CREATE TABLE IF NOT EXISTS floor (key TEXT PRIMARY KEY, state TEXT NOT NULL, result TEXT)"
    )
    n = [0]

    def two() -> None:
        n[0] += 1
        key = f"k-{n[0]}"
        db.execute(
            "INSERT INTO floor (key, state) VALUES (?, 'pending') ON CONFLICT (key) DO NOTHING",
            (key,),
        )
        db.execute(
            "UPDATE floor SET state = 'done', result = ? WHERE key = ?", ('{"ok": true}', key)
        )

    return {"insert_update": two, "close": db.close}


#: the result written only while the writer still holds its claim (its token is the value)
REDIS_CAS = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return false
"""


def _redis_floor(url: str, prefix: str) -> dict[str, Callable[[], Any]]:
    """What users write in Redis for the ledger's guarantee (``set_nx_cas``): a claim that
    lapses with its lease (``SET NX PX``, a fresh token in the value), then the result
    written only if the claim is still the writer's (a compare-and-set script, as
    PostgreSQL's peer updates only a pending row): without that check, a worker whose
    lease ran out overwrites the record of the worker that took its claim over. Beside it
    ``set_nx_set``, the two plain SETs, without lease or fencing."""
    import os

    import redis

    client = redis.Redis.from_url(url)
    settle = client.register_script(REDIS_CAS)
    done = '{"state": "done", "result": {"ok": true}}'
    n = [0]

    def cas() -> None:
        n[0] += 1
        key = f"{prefix}:floor:{n[0]}"
        pending = '{"state": "pending", "owner": "' + os.urandom(16).hex() + '"}'
        if client.set(key, pending, nx=True, px=60_000):
            settle(keys=[key], args=[pending, done, 86_400_000])

    def two() -> None:
        n[0] += 1
        key = f"{prefix}:floor:{n[0]}"
        client.set(key, '{"state": "pending"}', nx=True, px=86_400_000)
        client.set(key, done, px=86_400_000)

    def close() -> None:
        for k in client.scan_iter(match=f"{prefix}:*"):
            client.delete(k)
        client.close()

    return {"set_nx_cas": cas, "set_nx_set": two, "close": close}


def _once_of(ledger: tether.Ledger, tag: str) -> Callable[[], Any]:
    n = [0]

    def once() -> Any:
        n[0] += 1
        return ledger.once(f"{tag}-{n[0]}", _ok)

    return once


def _ok() -> dict[str, bool]:
    return {"ok": True}


def _round_trips(
    make: Callable[[str], tether.Ledger], url: str, tag: str, calls: int = 20
) -> float:
    """Round trips per new-key once(), counted on the wire by a relay (untimed)."""
    from tether.bench._wire import Relay

    with Relay.to(url) as relay:
        ledger = make(relay.url(url))
        try:
            once = _once_of(ledger, tag)
            for _ in range(6):  # past psycopg's prepare threshold (5): the steady state
                once()
            before = relay.round_trips
            for _ in range(calls):
                once()
            return (relay.round_trips - before) / calls
        finally:
            _drop(ledger, url)


def _drop(ledger: tether.Ledger, url: str) -> None:
    """Close a bench ledger and remove what it stored, through the backend's public
    attributes (its table, or its client and prefix) and a connection of our own to ``url``
    (the backend keeps only a redacted DSN)."""
    backend: Any = ledger.backend
    try:
        if hasattr(backend, "prefix") and hasattr(backend, "client"):
            for k in backend.client.scan_iter(match=f"{backend.prefix}:*"):
                backend.client.delete(k)
    finally:
        ledger.close()  # its pool closed first: no connection of it holds the table
    if hasattr(backend, "table") and hasattr(backend, "dsn"):
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {backend.table}")


def _against(
    ledger: tether.Ledger,
    tag: str,
    floor: dict[str, Callable[[], Any]],
    peer: str,
    *,
    number: int,
    reps: int,
    beside: tuple[str, ...] = (),
) -> dict[str, dict[str, Any]]:
    """A ledger's new-key ``once`` interleaved with the floor's ``peer`` statements (and
    the ``beside`` ones, shown with their ratio; the floor is closed after); its goal:
    1.5x the floor."""
    impls = {"tether": _once_of(ledger, tag), peer: floor[peer]}
    impls.update({name: floor[name] for name in beside})
    times = _interleaved(impls, number=number, reps=reps)
    floor["close"]()
    row = _row(times, peer=peer, goal=1.5)
    for name in beside:
        row["tether"][f"vs_{name}"] = _ratios(times["tether"], times[name])["ratio"]
    return row


def _ledgers(quick: bool) -> dict[str, dict[str, dict[str, Any]]]:
    import os
    import tempfile
    import uuid

    reps = 3 if quick else 7
    out: dict[str, dict[str, dict[str, Any]]] = {}
    tag = uuid.uuid4().hex[:8]

    # memory: against a dict
    memory = tether.Ledger.memory()
    table: dict[str, Any] = {}
    n = [0]

    def dict_once() -> None:
        n[0] += 1
        key = f"m-{n[0]}"
        if key not in table:
            table[key] = "pending"
            table[key] = _ok()

    times = _interleaved(
        {"tether": _once_of(memory, "m"), "dict": dict_once},
        number=300 if quick else 1000,
        reps=reps,
    )
    out["ledger_memory_new_key"] = _row(times, peer="dict", goal=None)
    out["ledger_memory_new_key"]["tether"]["goal_ns"] = 10_000
    memory.close()

    # SQLite: the same file settings, INSERT + UPDATE
    tmp = tempfile.mkdtemp(prefix="tether-bench-")
    sqlite = tether.Ledger.sqlite(os.path.join(tmp, "ledger.db"))
    floor = _sqlite_floor(os.path.join(tmp, "floor.db"))
    out["ledger_sqlite_new_key"] = _against(
        sqlite, "s", floor, "insert_update", number=60 if quick else 200, reps=reps
    )
    sqlite.close()

    # Redis: SET NX + SET on the same server
    url = os.environ.get("TETHER_REDIS_URL", "redis://127.0.0.1:6379/0")
    prefix = f"tether-bench-{tag}"
    try:  # the ledger connects on its first call: a server that is not there fails in here
        redis_ledger = tether.Ledger.redis(url, prefix=prefix, allow_lost_records=True)
        rfloor = _redis_floor(url, prefix + "-floor")
        row = _against(
            redis_ledger,
            "r",
            rfloor,
            "set_nx_cas",
            number=30 if quick else 60,
            reps=reps,
            beside=("set_nx_set",),
        )
        _drop(redis_ledger, url)
        row["set_nx_cas"]["round_trips_per_call"] = 2
        row["set_nx_cas"]["written_as"] = "SET NX PX lease, then a compare-and-set script"
        row["tether"]["round_trips_per_call"] = _round_trips(
            lambda u: tether.Ledger.redis(u, prefix=prefix + "-rt", allow_lost_records=True),
            url,
            "r",
        )
    except Exception as exc:  # Redis unreachable: say so, as for PostgreSQL, and go on
        out["ledger_redis_new_key"] = {"tether": _skipped(exc, "Redis", "TETHER_REDIS_URL")}
    else:
        out["ledger_redis_new_key"] = row

    # PostgreSQL: INSERT … ON CONFLICT, and the two-statement floor, on the same server
    dsn = os.environ.get("TETHER_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
    try:
        _ping_postgres(dsn)  # before the ledger's pool, which logs each refused connection
        pg = tether.Ledger.postgres(dsn, table=f"tether_bench_{tag}")
        pfloor = _pg_floor(dsn, f"tether_bench_floor_{tag}")
    except Exception as exc:
        out["ledger_postgres_new_key"] = {"tether": _skipped(exc, "PostgreSQL", "TETHER_PG_DSN")}
    else:
        times = _interleaved(
            {
                "tether": _once_of(pg, "p"),
                "two_statements": pfloor["two_statements"],
                "insert_on_conflict": pfloor["insert_on_conflict"],
            },
            number=10 if quick else 25,
            reps=reps,
        )
        out["ledger_postgres_new_key"] = _row(times, peer="two_statements", goal=1.5)
        out["ledger_postgres_new_key"]["tether"]["vs_insert_on_conflict"] = _ratios(
            times["tether"], times["insert_on_conflict"]
        )["ratio"]
        pfloor["close"]()
        _drop(pg, dsn)
        out["ledger_postgres_new_key"]["tether"]["round_trips_per_call"] = _round_trips(
            lambda u: tether.Ledger.postgres(u, table=f"tether_bench_rt_{tag}"), dsn, "p"
        )
        out["ledger_postgres_new_key"]["two_statements"]["round_trips_per_call"] = 2
    return out


# --- prices and the import ----------------------------------------------------------------------


def _prices(quick: bool) -> dict[str, dict[str, Any]]:
    """record_model_call priced by genai-prices (the prices extra) against an own table."""
    model = "claude-sonnet-5-5"
    kw: dict[str, Any] = {
        "input_tokens": 1200,
        "output_tokens": 300,
        "model": model,
        "provider": "anthropic",
    }
    extra = tether.Guard(prices=tether.PriceTable()).start(task="bench")
    own = tether.Guard(prices=tether.PriceTable({model: tether.Price(3.0, 15.0)})).start(
        task="bench"
    )
    if extra.guard.prices.source != "genai-prices":
        return {
            "tether": {
                "note": "skipped: genai-prices is not installed (pip install 'tether[prices]')"
            }
        }
    times = _interleaved(
        {
            "tether": lambda: extra.record_model_call(**kw),
            "own_table": lambda: own.record_model_call(**kw),
        },
        number=200 if quick else 1000,
        reps=3 if quick else 7,
    )
    row = _row(times, peer="own_table", goal=None)
    row["tether"]["goal_ns"] = 10_000
    return row


def _import_times(quick: bool) -> dict[str, dict[str, Any]]:
    """``import tether`` and the first run (import, ``Guard().start()``, one ``call_tool``,
    its end: goal 1.5x) against ``import tenacity`` and stamina: fresh interpreters,
    bytecode cached (a private cache folder, written by a first run), interleaved, the
    median."""
    import os
    import subprocess
    import tempfile

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="tether-bench-pycache-")
    probe = (
        "import sys, time; n = len(sys.modules); t = time.perf_counter(); import {m}; "
        "print(time.perf_counter() - t, len(sys.modules) - n)"
    )
    names = {
        "tether": "tether",
        "tenacity": "tenacity",
        "stamina": "stamina",
        "tether_first_run": "tether; r = tether.Guard().start(task='first'); "
        "r.call_tool('lookup', lambda order: {'order': order}, {'order': 'A1'}); "
        "r.succeed('done')",
    }

    def once(stmt: str) -> tuple[float, int]:
        out = subprocess.run(
            [sys.executable, "-c", probe.format(m=stmt)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        seconds, count = out.stdout.split()
        return float(seconds) * 1e9, int(count)

    for name in ("tenacity", "stamina", "tether_first_run"):
        once(names[name])  # writes the bytecode cache (the run's modules include tether's)
    times: dict[str, list[float]] = {n: [] for n in names}
    modules: dict[str, int] = {}
    for rep in range(3 if quick else 7):
        order = list(names)[rep % len(names) :] + list(names)[: rep % len(names)]
        for name in order:
            ns, count = once(names[name])
            times[name].append(ns)
            modules[name] = count
    row = _row(times, peer="tenacity", goal=1.2, unit="import")
    for name, count in modules.items():
        row[name]["modules"] = count
    first = row["tether_first_run"]
    first.update(_ratios(times["tether_first_run"], times["tenacity"]), vs="tenacity", goal=1.5)
    first["holds"] = first["ratio"] <= first["goal"]
    return row


def run_overhead(
    quick: bool = False, progress: Progress | None = None
) -> dict[str, dict[str, dict[str, Any]]]:
    """Every row of the success-path table, each against its peer measured in the same run:
    implementations interleaved, 7 rounds (3 with ``quick``), the median ratio with its
    min and max."""
    note = progress or _silent
    # tether's logger as users have it (not silenced): its retry lines are INFO, off by default
    out: dict[str, dict[str, dict[str, Any]]] = {}

    def retries() -> None:
        out.update(_retry_rows(quick))
        out["retry_3_failures_no_opentelemetry"] = _retry_without_otel(quick)

    def prices() -> None:
        from tether.bench._scale import langchain_middleware

        out["record_model_call_prices_extra"] = _prices(quick)
        out["langchain_middleware"] = langchain_middleware(_interleaved, _row, quick)

    def breaker() -> None:
        out["breaker_success_path"] = _breakers(2_000 if quick else 10_000)

    def imports() -> None:
        out["import_tether"] = _import_times(quick)

    steps: list[tuple[str, Callable[[], None]]] = [
        ("guarded runs against tenacity + a counter", lambda: out.update(_guarded(quick))),
        ("retries against tenacity", retries),
        ("ledgers against their statements", lambda: out.update(_ledgers(quick))),
        ("prices and LangChain's middlewares", prices),
        ("breaker", breaker),
        ("import time", imports),
    ]
    for label, step in steps:  # "…": the step now running; then its end, counted
        note(f"overhead: {label} …", len(steps))
        step()
        note(f"overhead: {label}", len(steps))
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
    out["detector_memory"] = {
        "tether": {
            "steps": steps,
            "bytes_after_10k_steps": at_10k,
            "bytes_after_all_steps": _deep_size(state),
        }
    }
    from tether.bench._scale import run_scale

    out.update(run_scale(quick))
    note("soak: done", 4)
    return out
