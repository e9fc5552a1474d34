"""tether inside Temporal activities, driven through ``temporalio.testing.ActivityEnvironment``
(a real activity context: info, heartbeats, cancellation). Temporal's server is not run
here: a re-delivery is the same activity run again with the next attempt number, in a new
process after a SIGKILL; the interceptor is driven by a stand-in for the worker's last link."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import inspect
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from temporalio import activity
from temporalio.common import RetryPolicy as TemporalRetryPolicy
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput

import tether
from tether.integrations import temporal as tether_temporal

WORKER = Path(__file__).with_name("temporal_worker.py")


def environment(attempt: int = 1, **info: Any) -> ActivityEnvironment:
    env = ActivityEnvironment()
    fields = {
        "workflow_id": "order-42",
        "workflow_run_id": "run-1",
        "activity_id": "1",
        "activity_type": "charge",
        "attempt": attempt,
        **info,
    }
    env.info = dataclasses.replace(env.info, **fields)
    return env


def run_in(env: ActivityEnvironment, fn: Callable[..., Any], *args: Any) -> Any:
    """One attempt, as the worker runs it (an async activity on an event loop)."""
    result = env.run(fn, *args)
    return asyncio.run(result) if inspect.iscoroutine(result) else result


def activities(
    calls: list[str], ledger: tether.Ledger, **settings: Any
) -> dict[str, Callable[..., Any]]:
    """The same charge activity, sync and async."""

    @activity.defn(name="charge")
    @tether_temporal.effect(ledger, **settings)
    def charge(order: str, amount: int) -> dict[str, Any]:
        calls.append(order)
        return {"charge": f"ch_{order}", "amount": amount}

    @activity.defn(name="charge")
    @tether_temporal.effect(ledger, **settings)
    async def acharge(order: str, amount: int) -> dict[str, Any]:
        calls.append(order)
        return {"charge": f"ch_{order}", "amount": amount}

    return {"sync": charge, "async": acharge}


SHELLS = ["sync", "async"]


# --- re-delivery -----------------------------------------------------------------------------


@pytest.mark.parametrize("shell", SHELLS)
def test_a_redelivered_activity_returns_the_recorded_result(shell: str) -> None:
    """Attempt 2 of the same scheduled activity (another worker, the same ledger) replays."""
    calls: list[str] = []
    ledger = tether.Ledger.memory()
    charge = activities(calls, ledger)[shell]
    first = run_in(environment(1), charge, "A-1", 10)
    again = run_in(environment(2), charge, "A-1", 10)
    assert first == again == {"charge": "ch_A-1", "amount": 10}
    assert calls == ["A-1"]


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(
    "other", [{"activity_id": "2"}, {"workflow_run_id": "run-2"}, {"workflow_id": "order-43"}]
)
def test_another_scheduled_activity_is_its_own_effect(shell: str, other: dict[str, str]) -> None:
    """The same charge scheduled again (a second activity, a workflow continued as new, a
    second workflow) runs again: the identity is the scheduled activity, not the arguments."""
    calls: list[str] = []
    charge = activities(calls, tether.Ledger.memory())[shell]
    run_in(environment(1), charge, "A-1", 10)
    run_in(environment(1, **other), charge, "A-1", 10)
    assert calls == ["A-1", "A-1"]


@pytest.mark.parametrize("shell", SHELLS)
def test_an_unknown_outcome_is_not_retried(shell: str) -> None:
    """A reset after sending: attempt 1 is retryable; attempt 2 finds the outcome unknown and
    raises a non-retryable ApplicationError (never a second charge)."""
    calls: list[str] = []

    def body(order: str) -> None:
        calls.append(order)
        raise ConnectionResetError("reset by peer")

    async def abody(order: str) -> None:
        body(order)

    ledger = tether.Ledger.memory()
    fn = activity.defn(name="charge")(
        tether_temporal.effect(ledger)(abody if shell == "async" else body)
    )
    with pytest.raises(ApplicationError) as first:
        run_in(environment(1), fn, "A-1")
    assert (first.value.non_retryable, first.value.type) == (False, "ConnectionResetError")
    with pytest.raises(ApplicationError) as second:
        run_in(environment(2), fn, "A-1")
    assert (second.value.non_retryable, second.value.type) == (True, "UnknownOutcome")
    assert calls == ["A-1"]


@pytest.mark.parametrize("shell", SHELLS)
def test_lookup_settles_an_unknown_outcome(shell: str) -> None:
    """With lookup, the re-delivered attempt asks the provider's records."""
    calls: list[str] = []
    settled = {"charge": "ch_A-1", "amount": 10, "from": "lookup"}
    ledger = tether.Ledger.memory()
    key = None

    def body(order: str, amount: int) -> dict[str, Any]:
        nonlocal key
        calls.append(order)
        key = tether.current_idempotency_key()
        raise TimeoutError("read timed out")

    async def abody(order: str, amount: int) -> dict[str, Any]:
        return body(order, amount)

    fn = activity.defn(name="charge")(
        tether_temporal.effect(ledger, lookup=lambda k: settled if k == key else None)(
            abody if shell == "async" else body
        )
    )
    with pytest.raises(ApplicationError):
        run_in(environment(1), fn, "A-1", 10)
    assert run_in(environment(2), fn, "A-1", 10) == settled
    assert run_in(environment(3), fn, "A-1", 10) == settled
    assert calls == ["A-1"]


# --- the verdict as Temporal's retry -------------------------------------------------------------


def _http(status: int, **headers: str) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "https://api.example.com/v1/charges")
    return httpx.HTTPStatusError(
        str(status),
        request=request,
        response=httpx.Response(status, headers=headers, request=request),
    )


@pytest.mark.parametrize(
    ("error", "non_retryable", "delay"),
    [
        (_http(429, **{"Retry-After": "7"}), False, 7.0),
        (_http(503), False, None),
        (_http(400), True, None),
        (ValueError("no such order"), True, None),
        (tether.UnknownOutcome("k"), True, None),
        (tether.CircuitOpenError("stripe", 0.0, retry_in=12.0), False, 12.0),
        (tether.StoreUnavailable("redis down"), False, None),
        (tether.IdempotencyConflict("other arguments"), True, None),
    ],
)
def test_engine_error_carries_the_verdict(
    error: Exception, non_retryable: bool, delay: float | None
) -> None:
    """non_retryable and next_retry_delay from tether's classification."""
    mapped = tether_temporal.engine_error(error)
    assert isinstance(mapped, ApplicationError)
    assert mapped.non_retryable is non_retryable
    assert (mapped.next_retry_delay.total_seconds() if mapped.next_retry_delay else None) == delay


def test_an_effect_in_progress_comes_back_after_the_lease() -> None:
    """Another attempt holds the claim: retry once its lease could have run out."""
    mapped = tether_temporal.engine_error(
        tether.EffectInProgress("k", tether.SystemClock().wall() + 30.0)
    )
    assert isinstance(mapped, ApplicationError) and not mapped.non_retryable
    assert (
        mapped.next_retry_delay is not None
        and 28.0 < mapped.next_retry_delay.total_seconds() <= 30.0
    )


def test_cancellations_and_application_errors_pass_unchanged() -> None:
    """What Temporal raises or the activity decided itself is left as it is."""
    for error in (CancelledError("cancelled"), ApplicationError("mine", non_retryable=True)):
        assert tether_temporal.engine_error(error) is error
    assert (
        tether.classify(
            ApplicationError("later", next_retry_delay=timedelta(seconds=3))
        ).retry_after
        == 3.0
    )
    assert not tether.classify(ApplicationError("never", non_retryable=True)).retryable


def test_retry_policy_has_tethers_numbers() -> None:
    """retry_policy: Temporal's RetryPolicy from a tether policy."""
    policy = tether_temporal.retry_policy(tether.RetryPolicy(max_attempts=4, base=0.5, cap=20.0))
    assert policy == TemporalRetryPolicy(
        initial_interval=timedelta(seconds=0.5),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=20),
        maximum_attempts=4,
    )


def engine_retries(
    env_for: Callable[[int], ActivityEnvironment], fn: Callable[..., Any], attempts: int
) -> Any:
    """Temporal's retry loop, as the server drives it: attempts until success, a
    non-retryable error, or ``maximum_attempts``."""
    for attempt in range(1, attempts + 1):
        try:
            return run_in(env_for(attempt), fn)
        except ApplicationError as exc:
            if exc.non_retryable or attempt == attempts:
                return exc.type
        except Exception as exc:  # the activity alone: Temporal retries every error
            if attempt == attempts:
                return type(exc).__name__
    return None


@pytest.mark.parametrize(
    ("failure", "alone", "inner_policy", "with_tether"),
    [(_http(503), 5, 25, 5), (_http(400), 5, 5, 1)],
)
def test_retry_layers(failure: Exception, alone: int, inner_policy: int, with_tether: int) -> None:
    """Calls to a failing dependency under Temporal's maximum_attempts=5: the activity alone,
    with a tether RetryPolicy(max_attempts=5) inside (25 on a 503), with tether's layer."""
    policy = TemporalRetryPolicy(maximum_attempts=5)
    counts = dict.fromkeys(("alone", "inner", "tether"), 0)

    def dependency(which: str) -> None:
        counts[which] += 1
        raise failure

    def env_for(attempt: int) -> ActivityEnvironment:
        return environment(attempt, retry_policy=policy)

    engine_retries(env_for, activity.defn(name="alone")(lambda: dependency("alone")), 5)
    inner = tether.RetryPolicy(max_attempts=5, base=0.001, cap=0.001)
    warned = (
        pytest.warns(tether_temporal.RetryLayersWarning)
        if inner_policy > alone
        else contextlib.nullcontext()
    )
    with warned:
        engine_retries(
            env_for, activity.defn(name="inner")(lambda: inner.call(dependency, "inner")), 5
        )
    guarded = tether_temporal.effect(None, name="charge")(lambda: dependency("tether"))
    engine_retries(env_for, activity.defn(name="tether")(guarded), 5)
    assert counts == {"alone": alone, "inner": inner_policy, "tether": with_tether}


def test_no_warning_when_temporal_does_not_retry() -> None:
    """A tether policy inside an activity with maximum_attempts=1 is the one layer."""
    attempts = [0]

    def flaky() -> str:
        attempts[0] += 1
        if attempts[0] == 1:
            raise _http(503)
        return "ok"

    env = environment(1, retry_policy=TemporalRetryPolicy(maximum_attempts=1))
    assert (
        run_in(env, activity.defn(name="once")(lambda: tether.RetryPolicy(base=0.001).call(flaky)))
        == "ok"
    )


@pytest.mark.parametrize("shell", SHELLS)
def test_budget_spent_means_not_retried(shell: str, redis_url: str) -> None:
    """A fleet's RetryBudget (Redis) pays for Temporal's retries; when it cannot, the
    activity fails non-retryable (the first attempts still go)."""
    name = f"pay-{uuid.uuid4().hex[:8]}"
    budget = tether.RetryBudget(
        name, capacity=10, retry_cost=5, store=tether.stores.RedisStore(redis_url)
    )

    def body() -> None:
        raise _http(503)

    async def abody() -> None:
        body()

    fn = activity.defn(name="charge")(
        tether_temporal.effect(None, budget=budget)(abody if shell == "async" else body)
    )
    types = []
    for attempt in (1, 2, 3):
        with pytest.raises(ApplicationError) as caught:
            run_in(environment(attempt, activity_id=str(attempt)), fn)
        types.append((caught.value.type, caught.value.non_retryable))
    assert types == [
        ("HTTPStatusError", False),
        ("HTTPStatusError", False),
        ("RetryBudgetExhausted", True),
    ]


# --- heartbeats and cancellation -----------------------------------------------------------------


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("heartbeat", [True, False])
def test_a_long_effect_heartbeats(shell: str, heartbeat: bool) -> None:
    """An activity with a heartbeat timeout heartbeats while its effect runs, so that
    Temporal does not hand it to another worker meanwhile (heartbeat=False: it does not)."""
    beats: list[tuple[Any, ...]] = []

    def body() -> str:
        time.sleep(0.5)
        return "done"

    async def abody() -> str:
        await asyncio.sleep(0.5)
        return "done"

    fn = tether_temporal.effect(tether.Ledger.memory(), heartbeat=heartbeat)(
        abody if shell == "async" else body
    )
    env = environment(1, heartbeat_timeout=timedelta(seconds=0.3))
    env.on_heartbeat = lambda *details: beats.append(details)
    assert run_in(env, activity.defn(name="long")(fn)) == "done"
    assert (len(beats) >= 3) if heartbeat else beats == []


def test_a_cancelled_async_effect_is_unknown_not_failed() -> None:
    """Cancelled mid-effect, the charge may have been sent: the next attempt asks lookup
    (here: it was not made, so it runs) instead of replaying a failure or charging blindly."""
    ledger = tether.Ledger.memory()
    started, calls = threading.Event(), []

    async def charge(order: str) -> str:
        calls.append(order)
        started.set()
        await asyncio.sleep(30)
        return "charged"

    fn = activity.defn(name="charge")(tether_temporal.effect(ledger, lookup=lambda k: None)(charge))
    env = environment(1)

    async def cancel_soon() -> None:
        task = asyncio.ensure_future(env.run(fn, "A-1"))
        while not started.is_set():
            await asyncio.sleep(0.01)
        env.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_soon())
    assert ledger.records()[0].state.value == "unknown"

    async def quick(order: str) -> str:
        calls.append(order)
        return "charged"

    again = activity.defn(name="charge")(
        tether_temporal.effect(ledger, lookup=lambda k: None, name="charge")(quick)
    )
    assert run_in(environment(2), again, "A-1") == "charged"
    assert calls == ["A-1", "A-1"]


def test_a_cancelled_sync_effect_is_unknown_not_failed() -> None:
    """A sync activity cancelled mid-effect (Temporal raises CancelledError in its thread):
    the record is unknown and the next attempt, without lookup, is not retried."""
    ledger = tether.Ledger.memory()
    started = threading.Event()

    def charge(order: str) -> str:
        started.set()
        while True:
            time.sleep(0.01)

    fn = activity.defn(name="charge")(tether_temporal.effect(ledger)(charge))
    env = environment(1)
    raised: list[BaseException] = []

    def attempt() -> None:
        try:
            env.run(fn, "A-1")
        except BaseException as exc:
            raised.append(exc)

    worker = threading.Thread(target=attempt)
    worker.start()
    assert started.wait(5)
    env.cancel()
    worker.join(5)
    assert [type(e) for e in raised] == [CancelledError]
    assert ledger.records()[0].state.value == "unknown"
    with pytest.raises(ApplicationError) as second:
        run_in(environment(2), fn, "A-1")
    assert (second.value.type, second.value.non_retryable) == ("UnknownOutcome", True)


# --- the interceptor -------------------------------------------------------------------------


class WorkerLastLink(ActivityInboundInterceptor):
    """A stand-in for the worker's own last link (no server here): it awaits an async
    activity, and runs a sync one on the activity's executor in the activity's context."""

    def __init__(self) -> None:
        pass

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        if inspect.iscoroutinefunction(input.fn):
            return await input.fn(*input.args)
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(
            input.executor, context.run, input.fn, *input.args
        )


@pytest.fixture
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(4) as executor:
        yield executor


def intercepted(
    interceptor: tether_temporal.TetherInterceptor,
    env: ActivityEnvironment,
    fn: Callable[..., Any],
    *args: Any,
    executor: Any = None,
) -> Any:
    chain = interceptor.intercept_activity(WorkerLastLink())
    return asyncio.run(
        env.run(
            chain.execute_activity,
            ExecuteActivityInput(fn=fn, args=args, executor=executor, headers={}),
        )
    )


@pytest.mark.parametrize("shell", SHELLS)
def test_interceptor_guards_the_side_effects_it_names(shell: str, pg_dsn: str, pool: Any) -> None:
    """Two workers with their own interceptor on one PostgreSQL ledger: the re-delivered
    charge replays; an activity not named a side effect runs every time."""
    table = f"t_{uuid.uuid4().hex[:10]}"
    calls: list[str] = []
    charge = activities(calls, tether.Ledger.memory())[shell].__wrapped__  # the undecorated body
    try:
        workers = [
            tether_temporal.TetherInterceptor(
                tether.Ledger.postgres(pg_dsn, table=table), side_effects={"charge": None}
            )
            for _ in range(2)
        ]
        first = intercepted(workers[0], environment(1), charge, "A-1", 10, executor=pool)
        again = intercepted(workers[1], environment(2), charge, "A-1", 10, executor=pool)
        assert first == again and calls == ["A-1"]
        for n, worker in enumerate(workers, start=1):
            intercepted(
                worker,
                environment(n, activity_type="lookup_order", activity_id="2"),
                charge,
                "B-2",
                10,
                executor=pool,
            )
        assert calls == ["A-1", "B-2", "B-2"]
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")


@pytest.mark.parametrize("shell", SHELLS)
def test_the_fleets_breaker_refuses_every_worker(shell: str, redis_url: str, pool: Any) -> None:
    """Worker A's failures open the activity's breaker in Redis; worker B's attempt is
    refused without calling the dependency, retryable at the breaker's next probe."""
    store = tether.stores.RedisStore(redis_url)
    kind = f"charge-{uuid.uuid4().hex[:8]}"
    calls: list[int] = []

    def body() -> None:
        calls.append(1)
        raise _http(503)

    async def abody() -> None:
        body()

    fn = abody if shell == "async" else body
    a, b = (
        tether_temporal.TetherInterceptor(store=store, breaker_threshold=3, breaker_cooldown=20.0)
        for _ in range(2)
    )
    for attempt in (1, 2, 3):
        with pytest.raises(ApplicationError):
            intercepted(a, environment(attempt, activity_type=kind), fn, executor=pool)
    with pytest.raises(ApplicationError) as refused:
        intercepted(b, environment(4, activity_type=kind), fn, executor=pool)
    assert (refused.value.type, refused.value.non_retryable) == ("CircuitOpenError", False)
    assert (
        refused.value.next_retry_delay is not None
        and refused.value.next_retry_delay.total_seconds() > 0  # the breaker's next probe
    )
    assert len(calls) == 3
    assert b.breaker(kind) is not None and b.breaker(kind).state == "open"  # type: ignore[union-attr]


def test_interceptor_configuration_errors(pool: Any) -> None:
    """Wrong values fail at construction; a sync activity on a process pool is refused."""
    with pytest.raises(ValueError, match="ledger"):
        tether_temporal.TetherInterceptor(side_effects=["charge"])
    with pytest.raises(TypeError, match="side_effects"):
        tether_temporal.TetherInterceptor(tether.Ledger.memory(), side_effects="charge")
    with pytest.raises(TypeError, match="lookup"):
        tether_temporal.TetherInterceptor(tether.Ledger.memory(), side_effects={"charge": "no"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="ledger"):
        tether_temporal.effect("ledger.db")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lease"):
        tether_temporal.effect(tether.Ledger.memory(), lease=-1)
    with (
        concurrent.futures.ProcessPoolExecutor(1) as processes,
        pytest.raises(ApplicationError, match="thread pool"),
    ):
        intercepted(
            tether_temporal.TetherInterceptor(), environment(1), len, "x", executor=processes
        )


def test_identity_outside_an_activity() -> None:
    """Outside an activity the key is the arguments alone (a test calling it directly)."""
    assert tether_temporal.identity() == ""
    calls: list[str] = []
    charge = activities(calls, tether.Ledger.memory())["sync"]
    assert charge("A-1", 10) == charge("A-1", 10) and calls == ["A-1"]
    assert run_in(
        environment(1, workflow_id=None, activity_id="standalone-7", activity_run_id="r1"),
        tether_temporal.identity,
    ) == ("temporal:default/activity/standalone-7/r1")


# --- a worker killed mid-activity, re-delivered to a new process ------------------------------


@pytest.fixture
def effects_table(pg_dsn: str) -> Iterator[str]:
    table = f"t_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table}_effects (what TEXT)")
    yield table
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}_effects")
        conn.execute(f"DROP TABLE IF EXISTS {table}_ledger")


def _attempt(n: int, env: dict[str, str]) -> tuple[int, dict[str, Any] | None]:
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(n)], env=env, capture_output=True, text=True, timeout=60
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return proc.returncode, (json.loads(lines[-1][7:]) if lines else None)


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(
    ("guarded", "crash", "lookup", "charges", "reported"),
    [
        (False, "after_effect", False, 2, "ok"),  # the activity alone: charged twice
        (True, "after_effect", True, 1, "found"),  # died mid-effect: lookup settles it
        (True, "after_effect", False, 1, "UnknownOutcome"),  # nothing can tell: not retried
        (True, "after_record", False, 1, "ok"),  # recorded, not reported: replayed
        (False, "before_effect", False, 1, "ok"),
        (True, "before_effect", True, 1, "ok"),  # lookup says it never happened: it runs
        (True, "before_effect", False, 0, "UnknownOutcome"),
    ],
)
def test_a_worker_killed_mid_activity(
    pg_dsn: str,
    effects_table: str,
    shell: str,
    guarded: bool,
    crash: str,
    lookup: bool,
    charges: int,
    reported: str,
) -> None:
    """Attempt 1 SIGKILLs its process at ``crash``; attempt 2 (a re-delivery to a new
    process, after the dead one's lease) is what Temporal would get."""
    env = {
        **os.environ,
        "TETHER_PG_DSN": pg_dsn,
        "TABLE": effects_table,
        "GUARDED": str(int(guarded)),
        "LOOKUP": str(int(lookup)),
        "ASYNC": str(int(shell == "async")),
        "CRASH": crash,
    }
    code, report = _attempt(1, env)
    assert (code, report) == (-9, None)
    code, report = _attempt(2, env)
    assert code == 0 and report is not None
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM {effects_table}_effects").fetchone()
    assert row is not None and row[0] == charges
    if reported == "UnknownOutcome":
        assert report == {"error": "UnknownOutcome", "non_retryable": True}
    else:
        assert report == {
            "ok": {
                "charge": "ch_A-1",
                "amount": 10,
                **({"found": True} if reported == "found" else {}),
            }
        }
