"""A ledger record's lifetime: ttl counts from the last renewal or from the settlement,
never from the claim; the memory ledger measures on the monotonic clock.

Real SQLite, Redis and PostgreSQL; the heartbeat that renews leases runs on the real clock.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tether import EffectInProgress, Ledger, UnknownOutcome, VirtualClock
from tether.stores._ledger_logic import Record, State

BACKENDS = ["memory", "sqlite", "redis", "postgres"]


def make_ledger(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, **settings: Any
) -> Ledger:
    if kind == "memory":
        return Ledger.memory(**settings)
    if kind == "sqlite":
        return Ledger.sqlite(str(tmp_path / f"ledger-{uuid.uuid4().hex[:6]}.db"), **settings)
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
        return Ledger.redis(url, prefix=f"tether-test-{uuid.uuid4().hex[:8]}", **settings)
    table = f"ledger_{uuid.uuid4().hex[:8]}"
    return Ledger.postgres(request.getfixturevalue("pg_dsn"), table=table, **settings)


def drop(ledger: Ledger) -> None:
    backend: Any = ledger.backend
    if hasattr(backend, "table"):
        backend._exec(lambda c: c.execute(f"DROP TABLE IF EXISTS {backend.table}"))
    if hasattr(backend, "prefix"):
        for k in backend.client.scan_iter(match=f"{backend.prefix}:*"):
            backend.client.delete(k)
    ledger.close()


@pytest.fixture
def ledgers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    made: list[Ledger] = []

    def make(kind: str, **settings: Any) -> Ledger:
        made.append(make_ledger(kind, request, tmp_path, **settings))
        return made[-1]

    yield make
    for ledger in made:
        drop(ledger)


class Effect:
    """A long effect, counted: it runs ``seconds`` (sync or async) and records each run."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.runs: list[float] = []
        self.lock = threading.Lock()

    def _count(self) -> dict[str, int]:
        with self.lock:
            self.runs.append(time.monotonic())
            return {"run": len(self.runs)}

    def sync(self) -> dict[str, int]:
        result = self._count()
        time.sleep(self.seconds)
        return result

    async def coro(self) -> dict[str, int]:
        result = self._count()
        await asyncio.sleep(self.seconds)
        return result


@pytest.mark.parametrize("shell", ["sync", "async"])
@pytest.mark.parametrize("kind", BACKENDS)
def test_ttl_equal_to_the_lease_never_runs_a_longer_effect_twice(
    ledgers: Any, kind: str, shell: str
) -> None:
    """ttl = lease and an effect three times longer: the renewed record outlives the ttl
    after the claim, replays after the end, and expires ttl after the end."""
    lease = ttl = 0.6
    ledger = ledgers(kind, ttl=ttl, lease=lease)
    effect = Effect(1.8)
    key = f"k-{uuid.uuid4().hex}"
    seen: list[Any] = []

    def second_worker() -> None:  # comes after claim + ttl, while the effect still runs
        time.sleep(1.1)
        try:
            seen.append(ledger.once(key, effect.sync, lease=lease, lookup=lambda k: None))
        except (EffectInProgress, UnknownOutcome) as exc:
            seen.append(type(exc))

    other = threading.Thread(target=second_worker)
    other.start()
    if shell == "sync":
        first = ledger.once(key, effect.sync, lease=lease)
    else:
        first = asyncio.run(ledger.aonce(key, effect.coro, lease=lease))
    other.join()
    assert first == {"run": 1}
    assert seen == [EffectInProgress]
    assert ledger.once(key, effect.sync, lease=lease) == {"run": 1}  # replayed, not run
    record = ledger.get(key)
    assert record is not None and record.state is State.DONE
    time.sleep(ttl + 0.3)
    assert ledger.once(key, lambda: "later") == "later"  # ttl after the end: the key is free
    assert len(effect.runs) == 1


@pytest.mark.parametrize("kind", BACKENDS)
def test_ttl_counts_from_the_settlement(ledgers: Any, kind: str) -> None:
    """On the ledger's clock: a record settled at t is replayed until t + ttl, whatever
    the claim's time, and any ttl works with any lease."""
    clock = VirtualClock(start=1_000.0)
    ledger = ledgers(kind, ttl=10.0, lease=60.0, clock=clock)
    runs: list[float] = []

    def pay() -> str:
        runs.append(clock.now())
        clock.advance(30.0)  # the effect takes 30 s; the claim was 30 s ago when it ends
        return "paid"

    assert ledger.once("k-settled", pay) == "paid"
    clock.advance(5.0)
    assert ledger.once("k-settled", pay) == "paid"  # 35 s after the claim: still known
    record = ledger.get("k-settled")
    assert record is not None and record.expires_at == pytest.approx(record.created_at + 40.0)
    clock.advance(6.0)
    assert ledger.once("k-settled", pay) == "paid"  # 11 s after the end: it ran again
    assert len(runs) == 2


@pytest.mark.parametrize("kind", BACKENDS)
def test_crashed_claim_is_remembered_ttl_past_its_lease(ledgers: Any, kind: str) -> None:
    """A claim whose owner vanished stays to be reconciled ttl past its lease, not ttl past
    the claim (ttl shorter than the lease used to free the key before the lease ended)."""
    clock = VirtualClock(start=1_000.0)
    ledger = ledgers(kind, ttl=5.0, lease=20.0, clock=clock)
    # a worker claims and dies before it records anything
    ledger.backend.claim(Record.claim_of("k-crash", None, "dead", 20.0, 5.0), clock.wall())
    clock.advance(10.0)
    with pytest.raises(EffectInProgress):  # its lease still runs
        ledger.once("k-crash", lambda: "again")
    clock.advance(12.0)  # the lease ran out 2 s ago: a takeover, reconciled, never blind
    with pytest.raises(UnknownOutcome):
        ledger.once("k-crash", lambda: "again")


@pytest.mark.parametrize("kind", ["memory", "redis", "postgres"])
def test_stepping_the_wall_clock_never_frees_a_running_effect(
    ledgers: Any, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The system clock jumps 120 s ahead while an effect runs: the memory ledger measures
    on the monotonic clock, Redis and PostgreSQL on the server's; the claim holds."""
    ledger = ledgers(kind)  # the defaults: lease 60 s, the real clock
    started, release = threading.Event(), threading.Event()
    runs: list[int] = []

    def pay() -> str:
        runs.append(1)
        started.set()
        release.wait(10.0)
        return "paid"

    worker = threading.Thread(target=lambda: ledger.once("k-step", pay))
    worker.start()
    assert started.wait(10.0)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 120.0)  # NTP steps the clock
    try:
        with pytest.raises(EffectInProgress):
            ledger.once("k-step", pay, lookup=lambda key: None)
    finally:
        release.set()
        worker.join()
    monkeypatch.setattr(time, "time", real)
    assert runs == [1]
    assert ledger.once("k-step", pay) == "paid"


def test_lease_and_timeout_are_checked_alike_by_once_and_aonce() -> None:
    """once and aonce refuse the same bad arguments, with the same words."""
    ledger = Ledger.memory()

    async def coro() -> int:
        return 1

    for bad in (
        {"lease": 0},
        {"lease": True},
        {"timeout": -1},
        {"timeout": 0},
        {"timeout": True},
        {"timeout": float("nan")},
    ):
        with pytest.raises(ValueError) as sync_error:
            ledger.once("k", lambda: 1, **bad)
        with pytest.raises(ValueError) as async_error:
            asyncio.run(ledger.aonce("k", coro, **bad))
        assert str(sync_error.value) == str(async_error.value)
    assert ledger.get("k") is None  # nothing was claimed


@pytest.mark.parametrize(("kind", "reading"), [("memory", "monotonic"), ("sqlite", "time")])
def test_a_patched_system_clock_moves_a_local_ledgers_leases(
    ledgers: Any, kind: str, reading: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tests freeze or move time by patching the ``time`` module (monkeypatch,
    freezegun): a local ledger reads its clock through the module at each call, so a
    dead worker's claim runs out when the patched clock passes its lease."""
    ledger = ledgers(kind, lease=20.0)
    ledger.backend.claim(Record.claim_of("k-dead", None, "dead", 20.0, 3600.0), time.time())
    with pytest.raises(EffectInProgress):  # its lease still runs
        ledger.once("k-dead", lambda: "again")
    real = getattr(time, reading)
    monkeypatch.setattr(time, reading, lambda: real() + 30.0)
    with pytest.raises(UnknownOutcome):  # the lease ran out: a takeover, never blind
        ledger.once("k-dead", lambda: "again")
