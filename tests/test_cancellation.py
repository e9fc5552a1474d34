"""Cancellation at any point: never twice, an honest outcome, and no claim left blocking.

An effect cancelled at a point where it may have started ends the run UNKNOWN_OUTCOME and
stays UNKNOWN in the ledger (the next caller asks ``lookup``); one cancelled before it
could start leaves no claim behind, so the next call runs it at once. Every trial is
followed by a second caller with a lookup on the provider's records: in total the effect
happens exactly once.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import tether
from tether import EffectInProgress, Guard, Ledger, StopReason, UnknownOutcome
from tether.stores._ledger_logic import State

BACKENDS = ["memory", "sqlite", "redis", "postgres"]
#: cancel after this many event-loop turns, then after this many half-milliseconds
POINTS = [("turns", n) for n in range(30)] + [("time", n) for n in range(1, 21)]


def make_ledger(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Ledger:
    if kind == "memory":
        return Ledger.memory()
    if kind == "sqlite":
        return Ledger.sqlite(str(tmp_path / "ledger.db"))
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
        return Ledger.redis(url, prefix=f"tether-test-{uuid.uuid4().hex[:8]}")
    table = f"ledger_{uuid.uuid4().hex[:8]}"
    return Ledger.postgres(request.getfixturevalue("pg_dsn"), table=table)


@pytest.fixture(params=BACKENDS)
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    led = make_ledger(request.param, request, tmp_path)
    yield led
    backend: Any = led.backend
    if hasattr(backend, "table"):
        backend._exec(lambda c: c.execute(f"DROP TABLE IF EXISTS {backend.table}"))
    if hasattr(backend, "prefix"):
        for k in backend.client.scan_iter(match=f"{backend.prefix}:*"):
            backend.client.delete(k)
    led.close()


class Provider:
    """A payment provider: what it committed, and a lookup of its records by order."""

    def __init__(self) -> None:
        self.paid: list[str] = []
        self._lock = threading.Lock()

    def commit(self, order: str) -> dict[str, str]:
        with self._lock:
            self.paid.append(order)
        return {"paid": order}

    def lookup_for(self, order: str) -> Callable[[str], Any]:
        return lambda key: {"paid": order} if order in self.paid else None

    async def pay(self, order: str) -> dict[str, str]:
        for _ in range(3):  # the request is built and sent
            await asyncio.sleep(0)
        result = self.commit(order)
        for _ in range(3):  # the response comes back
            await asyncio.sleep(0)
        return result

    def pay_sync(self, order: str) -> dict[str, str]:
        time.sleep(0.001)
        result = self.commit(order)
        time.sleep(0.001)
        return result


async def cancel_at(point: tuple[str, int], coro: Awaitable[Any]) -> None:
    """Run ``coro`` and cancel it at ``point``; whatever it raises or returns is dropped."""
    task = asyncio.ensure_future(coro)
    how, n = point
    if how == "turns":
        for _ in range(n):
            await asyncio.sleep(0)
    else:
        await asyncio.sleep(n * 0.0005)
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass


class Workers:
    """The event loop's worker threads, one pool per trial: a sync tool's thread that began
    goes on to its end (it claims, runs and records), however late the machine lets it."""

    def __init__(self) -> None:
        self.pool = self._fresh()

    @staticmethod
    def _fresh() -> ThreadPoolExecutor:
        pool = ThreadPoolExecutor()
        asyncio.get_running_loop().set_default_executor(pool)
        return pool

    def join(self) -> None:
        """Wait until every thread of this trial ended; the loop gets a fresh pool."""
        self.pool.shutdown(wait=True)
        self.pool = self._fresh()


def settled(ledger: Ledger, key: str, workers: Workers) -> Any:
    """The record once no worker thread is still running the effect."""
    deadline = time.monotonic() + 5.0
    workers.join()
    record = ledger.get(key)
    while record is not None and record.state is State.PENDING and time.monotonic() < deadline:
        time.sleep(0.01)
        record = ledger.get(key)
    return record


def honest(record: Any, outcome: tether.Outcome, executed: int) -> bool:
    """The outcome says what the ledger knows: UNKNOWN_OUTCOME while it may have happened,
    the completed call when it returned, and neither when nothing can have happened."""
    reason = outcome.stopped_because
    if record is None:
        return executed == 0 and reason is not StopReason.UNKNOWN_OUTCOME and not outcome.partial
    if record.state is State.UNKNOWN:
        return reason is StopReason.UNKNOWN_OUTCOME and outcome.status != "success"
    if record.state is State.DONE:
        return executed == 1 and (
            reason in (StopReason.UNKNOWN_OUTCOME, StopReason.GOAL_REACHED) or bool(outcome.partial)
        )
    return False  # PENDING: a claim nobody will settle


async def refund_run(
    guard: Guard, provider: Provider, order: str, tool: str, runs: list[tether.Run]
) -> None:
    """One guarded run that refunds ``order`` (through an async or a sync tool)."""
    async with guard.start(task=f"refund {order}") as run:
        runs.append(run)
        run.proceed()
        fn = provider.pay if tool == "async" else provider.pay_sync
        await run.acall_tool("pay", fn, {"order": order}, idempotent=False)
        run.succeed("refunded")


def count_trials(ledger: Ledger, tool: str) -> dict[str, Any]:
    """Cancel one guarded refund at every point; count what went wrong."""
    counts: dict[str, Any] = {"trials": 0, "twice": 0, "dishonest": [], "stuck": 0, "not_done": 0}

    async def trials() -> None:
        workers = Workers()
        for point in POINTS:
            provider = Provider()
            order = f"A-{uuid.uuid4().hex[:8]}"
            guard = Guard(ledger=ledger)
            runs: list[tether.Run] = []
            await cancel_at(point, refund_run(guard, provider, order, tool, runs))
            counts["trials"] += 1
            if not runs:  # cancelled before the run began: nothing to judge
                continue
            key = tether.intent_key("pay", {"order": order}, scope=runs[0]._scope)
            record = settled(ledger, key, workers)
            executed = len(provider.paid)
            outcome = runs[0].outcome
            if not honest(record, outcome, executed):
                state = record.state.value if record else None
                counts["dishonest"].append((point, state, outcome.stopped_because.value, executed))
            if record is not None and record.state is State.PENDING and not executed:
                counts["stuck"] += 1
            try:  # a second worker asks for the same refund, with a lookup
                await ledger.aonce(key, provider.pay, order, lookup=provider.lookup_for(order))
            except (EffectInProgress, UnknownOutcome):
                counts["not_done"] += 1
            counts["twice"] += len(provider.paid) > 1

    asyncio.run(trials())
    return counts


@pytest.mark.parametrize("tool", ["async", "sync"])
def test_cancelled_tool_call_is_never_twice_and_its_outcome_is_honest(
    ledger: Ledger, tool: str
) -> None:
    """run.acall_tool cancelled at 50 points: once in all, UNKNOWN_OUTCOME when it may have
    happened, no claim left pending when it cannot have."""
    counts = count_trials(ledger, tool)
    assert counts == {"trials": len(POINTS), "twice": 0, "dishonest": [], "stuck": 0, "not_done": 0}


def test_cancelled_aonce_is_never_twice_and_leaves_no_claim(ledger: Ledger) -> None:
    """Ledger.aonce cancelled at 50 points: never PENDING afterwards; once in all."""
    counts = {"twice": 0, "pending": 0, "not_done": 0}

    async def trials() -> None:
        for point in POINTS:
            provider = Provider()
            order, key = f"A-{uuid.uuid4().hex[:8]}", f"k-{uuid.uuid4().hex}"
            await cancel_at(point, ledger.aonce(key, provider.pay, order))
            record = ledger.get(key)
            if record is not None and record.state is State.PENDING:
                counts["pending"] += 1
            try:
                await ledger.aonce(key, provider.pay, order, lookup=provider.lookup_for(order))
            except (EffectInProgress, UnknownOutcome):
                counts["not_done"] += 1
            counts["twice"] += len(provider.paid) > 1

    asyncio.run(trials())
    assert counts == {"twice": 0, "pending": 0, "not_done": 0}


def test_cancelled_while_waiting_for_another_worker_takes_nothing(ledger: Ledger) -> None:
    """A caller cancelled while it polls another worker's claim (wait=) claims nothing."""
    waiting = Ledger(ledger.backend, wait=5.0, poll_interval=0.01)
    provider = Provider()
    held = threading.Event()
    release = threading.Event()

    def long_pay() -> dict[str, str]:
        held.set()
        release.wait(5.0)
        return provider.commit("A-1")

    worker = threading.Thread(target=lambda: ledger.once("k-wait", long_pay))
    worker.start()
    held.wait(5.0)

    async def main() -> None:
        task = asyncio.ensure_future(waiting.aonce("k-wait", provider.pay, "A-1"))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    started = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - started < 2.0  # it stopped polling at once
    release.set()
    worker.join()
    assert provider.paid == ["A-1"]
    record = ledger.get("k-wait")
    assert record is not None and record.state is State.DONE


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("when", ["before", "after"])
def test_interrupted_sync_tool_call_ends_unknown_outcome(
    interrupt: type[BaseException], when: str
) -> None:
    """Sync shell: an interrupt inside a non-idempotent call ends the run UNKNOWN_OUTCOME,
    its record UNKNOWN (the ledger cannot tell whether the request went out)."""
    provider = Provider()
    guard = Guard()

    def pay(order: str) -> dict[str, str]:
        if when == "after":
            provider.commit(order)
        raise interrupt()

    with pytest.raises(interrupt), guard.start(task="refund A-1") as run:
        run.proceed()
        run.call_tool("pay", pay, {"order": "A-1"}, idempotent=False)
    assert run.outcome.stopped_because is StopReason.UNKNOWN_OUTCOME
    assert run.outcome.status != "success"
    record = guard.ledger.get(tether.intent_key("pay", {"order": "A-1"}, scope=run._scope))
    assert record is not None and record.state is State.UNKNOWN
    with pytest.raises(UnknownOutcome):  # never run again blindly
        guard.ledger.once(record.key, provider.commit, "A-1")
    assert len(provider.paid) == (1 if when == "after" else 0)


class InterruptedBackoff(tether.VirtualClock):
    """The run is interrupted while its retry policy waits to try a call again: Ctrl-C in
    the sync shell, a cancellation in the async one."""

    def sleep(self, seconds: float) -> None:
        raise KeyboardInterrupt

    async def asleep(self, seconds: float) -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(0)


@pytest.mark.parametrize("shell", ["sync", "async-thread", "async"])
def test_interrupted_after_an_unknown_failure_still_ends_unknown_outcome(
    ledger: Ledger, shell: str
) -> None:
    """The effect was sent and its answer lost (the ledger marks it UNKNOWN); the run is
    interrupted before its retry asks the ledger again: it still ends UNKNOWN_OUTCOME,
    never as if nothing had happened."""
    provider = Provider()
    guard = Guard(ledger=ledger, clock=InterruptedBackoff())

    def pay(order: str) -> dict[str, str]:
        provider.commit(order)
        raise ConnectionResetError("connection reset after the request was sent")

    async def apay(order: str) -> dict[str, str]:
        return pay(order)

    runs: list[tether.Run] = []

    async def refund() -> None:
        async with guard.start(task="refund A-1") as run:
            runs.append(run)
            run.proceed()
            fn = apay if shell == "async" else pay
            await run.acall_tool("pay", fn, {"order": "A-1"}, idempotent=False)

    if shell == "sync":
        with pytest.raises(KeyboardInterrupt), guard.start(task="refund A-1") as run:
            runs.append(run)
            run.proceed()
            run.call_tool("pay", pay, {"order": "A-1"}, idempotent=False)
    else:
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(refund())
    run = runs[0]
    record = ledger.get(tether.intent_key("pay", {"order": "A-1"}, scope=run._scope))
    assert record is not None and record.state is State.UNKNOWN
    assert run.outcome.stopped_because is StopReason.UNKNOWN_OUTCOME
    assert run.outcome.status != "success"
    assert ledger.once(record.key, provider.commit, "A-1", lookup=provider.lookup_for("A-1"))
    assert provider.paid == ["A-1"]
