"""The ledger: at most once, in memory, SQLite, real Redis and real PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import tether
from tether import (
    EffectInProgress,
    EffectNotRecorded,
    IdempotencyConflict,
    Ledger,
    UnknownOutcome,
    VirtualClock,
)
from tether.effects._codec import JsonCodec
from tether.stores._ledger_logic import State

BACKENDS = ["memory", "sqlite", "redis", "redis-cluster", "postgres"]


def make_ledger(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, **settings: Any
) -> Ledger:
    if kind == "memory":
        return Ledger.memory(**settings)
    if kind == "sqlite":
        return Ledger.sqlite(str(tmp_path / "ledger.db"), **settings)
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
        return Ledger.redis(url, prefix=f"tether-test-{uuid.uuid4().hex[:8]}", **settings)
    if kind == "redis-cluster":
        client = request.getfixturevalue("redis_cluster").client()
        return Ledger.redis(client=client, prefix=f"tether-test-{uuid.uuid4().hex[:8]}", **settings)
    dsn = request.getfixturevalue("pg_dsn")
    return Ledger.postgres(dsn, table=f"tether_ledger_{uuid.uuid4().hex[:8]}", **settings)


def drop(ledger: Ledger) -> None:
    backend: Any = ledger.backend
    if hasattr(backend, "table"):
        backend._exec(lambda c: c.execute(f"DROP TABLE IF EXISTS {backend.table}"))
    if hasattr(backend, "prefix"):
        for k in backend.client.scan_iter(match=f"{backend.prefix}:*"):
            backend.client.delete(k)
    ledger.close()


@pytest.fixture(params=BACKENDS)
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    led = make_ledger(request.param, request, tmp_path, clock=VirtualClock())
    yield led
    drop(led)


class Payments:
    """A payment provider's own records: it counts what was really paid."""

    def __init__(self) -> None:
        self.paid: list[str] = []
        self.keys: list[str | None] = []

    def refund(self, order: str, amount: int) -> dict[str, Any]:
        self.keys.append(tether.current_idempotency_key())
        self.paid.append(order)
        return {"id": f"re_{len(self.paid)}", "order": order, "amount": amount}


def key_for(order: str = "A-1", amount: int = 10) -> str:
    return tether.intent_key("refund", {"order": order, "amount": amount})


def test_once_runs_once_and_replays(ledger: Ledger) -> None:
    """A second call with the same key returns the recorded result without calling fn."""
    pay = Payments()
    first = ledger.once(key_for(), pay.refund, "A-1", 10)
    second = ledger.once(key_for(), pay.refund, "A-1", 10)
    assert first == second == {"id": "re_1", "order": "A-1", "amount": 10}
    assert pay.paid == ["A-1"]
    assert pay.keys == [key_for()]
    record = ledger.get(key_for())
    assert record is not None
    assert record.state is State.DONE


def test_permanent_failure_is_recorded_and_replayed(ledger: Ledger) -> None:
    """A business-rule rejection is recorded and replayed as the same error."""
    calls = 0

    def reject() -> None:
        nonlocal calls
        calls += 1
        raise ValueError("refund exceeds the original charge")

    for _ in range(2):
        with pytest.raises(ValueError, match="exceeds the original charge"):
            ledger.once("k-perm", reject)
    assert calls == 1


def test_failure_that_proves_nothing_happened_releases(ledger: Ledger) -> None:
    """Connection refused: nothing was sent, so the next call runs the effect."""
    calls = 0

    def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionRefusedError()
        return "paid"

    with pytest.raises(ConnectionRefusedError):
        ledger.once("k-refused", flaky)
    assert ledger.once("k-refused", flaky) == "paid"
    assert calls == 2


def test_unknown_outcome_without_lookup_is_never_repeated(ledger: Ledger) -> None:
    """A timeout leaves the outcome unknown; with no lookup, tether refuses to guess."""
    calls = 0

    def slow() -> str:
        nonlocal calls
        calls += 1
        raise TimeoutError("read timed out")

    with pytest.raises(TimeoutError):
        ledger.once("k-unknown", slow)
    with pytest.raises(UnknownOutcome, match="lookup"):
        ledger.once("k-unknown", slow)
    assert calls == 1


def test_lookup_settles_an_unknown_outcome(ledger: Ledger) -> None:
    """The payment committed, the response was lost: lookup finds it, nothing is paid twice."""
    pay = Payments()

    def commit_then_lose(order: str, amount: int) -> dict[str, Any]:
        pay.refund(order, amount)
        raise TimeoutError("response lost")

    def lookup(key: str) -> dict[str, Any] | None:
        return {"id": "re_1", "order": "A-1", "amount": 10} if pay.paid else None

    with pytest.raises(TimeoutError):
        ledger.once(key_for(), commit_then_lose, "A-1", 10, lookup=lookup)
    result = ledger.once(key_for(), pay.refund, "A-1", 10, lookup=lookup)
    assert result == {"id": "re_1", "order": "A-1", "amount": 10}
    assert pay.paid == ["A-1"]
    assert ledger.once(key_for(), pay.refund, "A-1", 10) == result  # now recorded


def test_lookup_saying_not_done_runs_the_effect(ledger: Ledger) -> None:
    """lookup returns None: the effect did not happen, so it runs now."""
    pay = Payments()
    with pytest.raises(TimeoutError):
        ledger.once("k-nd", lambda: (_ for _ in ()).throw(TimeoutError()))
    assert ledger.once("k-nd", pay.refund, "A-2", 5, lookup=lambda k: None)["order"] == "A-2"
    assert pay.paid == ["A-2"]


def test_lookup_that_fails_keeps_it_unknown(ledger: Ledger) -> None:
    """A lookup that raises leaves the record unknown, and says so."""
    with pytest.raises(TimeoutError):
        ledger.once("k-lf", lambda: (_ for _ in ()).throw(TimeoutError()))

    def broken(key: str) -> None:
        raise ConnectionError("records unavailable")

    with pytest.raises(UnknownOutcome, match="lookup failed"):
        ledger.once("k-lf", lambda: "x", lookup=broken)
    record = ledger.get("k-lf")
    assert record is not None
    assert record.state is State.UNKNOWN


def test_pending_within_lease_is_in_progress(ledger: Ledger) -> None:
    """Another worker's live claim: EffectInProgress, the effect does not run."""
    ran = []

    def inner() -> str:
        with pytest.raises(EffectInProgress):
            ledger.once("k-busy", lambda: ran.append("second"))
        return "first"

    assert ledger.once("k-busy", inner) == "first"
    assert ran == []


def test_expired_lease_is_reconciled(ledger: Ledger) -> None:
    """A claim whose lease ran out (a crashed worker) is treated as unknown."""
    clock = ledger.clock
    assert isinstance(clock, VirtualClock)
    pay = Payments()

    def crash_mid_effect() -> str:
        pay.refund("A-1", 10)
        clock.advance(120.0)  # the worker stalls past its lease
        with pytest.raises(UnknownOutcome):
            ledger.once(key_for(), pay.refund, "A-1", 10)  # no lookup: refuse to guess
        return "late"

    with pytest.raises(EffectNotRecorded, match="another worker took its claim over"):
        ledger.once(key_for(), crash_mid_effect, lease=60.0)  # its late result is fenced off
    assert pay.paid == ["A-1"]
    record = ledger.get(key_for())
    assert record is not None and record.state is State.UNKNOWN


def test_same_key_different_arguments_is_a_conflict(ledger: Ledger) -> None:
    """Reusing a key for other arguments is an error, as Stripe and the IETF draft have it."""
    ledger.once("k-order-7", lambda order, amount: "ok", "A-7", 10)
    with pytest.raises(IdempotencyConflict, match="different arguments"):
        ledger.once("k-order-7", lambda order, amount: "ok", "A-7", 99)


@pytest.mark.parametrize("wait", [0.0, 1.0])
@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_waiting_ledger_decides_alike(wait: float, shell: str) -> None:
    """Without a wait, once() claims directly; with one (and aonce always) it drives the
    claim plan: a replay, a takeover's lookup and a live claim come out the same."""
    import asyncio

    ledger = Ledger.memory(clock=VirtualClock(), wait=wait)

    def call(key: str, fn: Any, **kw: Any) -> Any:
        if shell == "sync":
            return ledger.once(key, fn, **kw)

        async def afn() -> Any:
            return fn()

        return asyncio.run(ledger.aonce(key, afn, **kw))

    def lost() -> None:
        raise TimeoutError("response lost")

    for key in ("found", "absent", "blind"):
        with pytest.raises(TimeoutError):
            call(key, lost)
    assert call("found", lambda: "again", lookup=lambda k: "paid") == "paid"
    assert call("absent", lambda: "ran", lookup=lambda k: None) == "ran"
    with pytest.raises(UnknownOutcome):
        call("blind", lambda: "ran")
    assert call("found", lambda: "again") == "paid"  # recorded by the lookup
    assert call("absent", lambda: "again") == "ran"

    def inner() -> str:
        with pytest.raises(EffectInProgress):
            ledger.once("busy", lambda: "second")  # the outer call holds it
        return "first"

    assert call("busy", inner) == "first"
    assert [r.state for r in ledger.records()].count(State.UNKNOWN) == 1  # "blind"


def test_records_expire_after_ttl(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """After ttl the key is free again."""
    clock = VirtualClock()
    led = make_ledger("sqlite", request, tmp_path, clock=clock, ttl=10.0, lease=5.0)
    calls = []
    led.once("k-ttl", lambda: calls.append(1), lease=5.0)
    clock.advance(11.0)
    led.once("k-ttl", lambda: calls.append(1), lease=5.0)
    assert len(calls) == 2
    led.close()


def test_resolve_and_forget(ledger: Ledger) -> None:
    """A person settles an unknown effect by hand."""
    with pytest.raises(TimeoutError):
        ledger.once("k-hand", lambda: (_ for _ in ()).throw(TimeoutError()))
    ledger.resolve("k-hand", {"id": "re_9"})
    assert ledger.once("k-hand", lambda: "again") == {"id": "re_9"}
    ledger.forget("k-hand")
    assert ledger.once("k-hand", lambda: "again") == "again"


def test_unencodable_result_is_kept_as_repr(ledger: Ledger) -> None:
    """A result JSON cannot hold is recorded as its repr, never lost."""

    class Receipt:
        def __repr__(self) -> str:
            return "<Receipt re_1>"

    first = ledger.once("k-repr", Receipt)
    assert isinstance(first, Receipt)
    assert ledger.once("k-repr", Receipt) == {"$repr": "<Receipt re_1>"}


class NoRepr:
    """A result with no JSON form whose repr fails too: nothing of it can be recorded."""

    def __repr__(self) -> str:
        raise RuntimeError("repr of a half-built object")


class Refusing(JsonCodec):
    """A codec that cannot encode anything (its decode is JSON's)."""

    def encode(self, value: Any) -> str:
        raise TypeError("this codec encodes nothing")


class Unstorable(JsonCodec):
    """A codec whose text no store can hold: a NUL (PostgreSQL's text refuses it) and a
    lone surrogate (not UTF-8: SQLite, Redis and PostgreSQL refuse it)."""

    def encode(self, value: Any) -> str:
        return '"\x00\ud800"'


class NotText(JsonCodec):
    """A codec that returns bytes, not text."""

    def encode(self, value: Any) -> Any:
        return b"{}"


#: a result the ledger's codec cannot encode: (codec, the result, what a replay answers:
#: the repr kept, or EffectNotRecorded when nothing of the result could be recorded)
UNENCODABLE: dict[str, tuple[Any, Callable[[], Any], Any]] = {
    "no-json-no-repr": (None, NoRepr, EffectNotRecorded),
    "codec-refuses-no-repr": (Refusing(), NoRepr, EffectNotRecorded),
    "codec-text-unstorable": (Unstorable(), lambda: {"id": "re_1"}, {"$repr": "{'id': 're_1'}"}),
    "codec-returns-bytes": (NotText(), lambda: {"id": "re_1"}, {"$repr": "{'id': 're_1'}"}),
}


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("case", sorted(UNENCODABLE))
@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_result_that_cannot_be_encoded_settles_the_claim(
    kind: str, case: str, shell: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """An effect that ran but whose result the codec cannot encode is recorded done (its
    repr, or an unrecordable marker), never left pending: the next identical call runs
    nothing and gets a clear answer, not EffectInProgress until the lease ends."""
    import asyncio

    codec, make, replayed = UNENCODABLE[case]
    settings: dict[str, Any] = {"clock": VirtualClock()}
    if codec is not None:
        settings["codec"] = codec
    ledger = make_ledger(kind, request, tmp_path, **settings)
    ran: list[Any] = []

    def effect() -> Any:
        ran.append(make())
        return ran[-1]

    def call() -> Any:
        if shell == "sync":
            return ledger.once("k-unencodable", effect, lease=600.0)

        async def aeffect() -> Any:
            return effect()

        return asyncio.run(ledger.aonce("k-unencodable", aeffect, lease=600.0))

    try:
        assert call() is ran[0]  # the caller that ran it gets its result
        record = ledger.get("k-unencodable")
        assert record is not None and record.state is State.DONE
        if replayed is EffectNotRecorded:
            with pytest.raises(EffectNotRecorded, match="it is not run again") as caught:
                call()
            assert "NoRepr" in str(caught.value) and "half-built" in str(caught.value)
            with pytest.raises(EffectNotRecorded):
                ledger.result("k-unencodable")
        else:
            assert call() == replayed
        assert len(ran) == 1  # never run again
    finally:
        drop(ledger)


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_failure_whose_message_cannot_be_read_is_recorded(ledger: Ledger, shell: str) -> None:
    """A permanent failure whose str() raises is still recorded failed, not left pending."""
    import asyncio

    class Rejected(ValueError):
        def __str__(self) -> str:
            raise RuntimeError("no message")

    def reject() -> None:
        raise Rejected()

    async def areject() -> None:
        reject()

    for _ in range(2):
        with pytest.raises(Rejected):
            if shell == "sync":
                ledger.once("k-no-message", reject)
            else:
                asyncio.run(ledger.aonce("k-no-message", areject))
        record = ledger.get("k-no-message")
        assert record is not None and record.state is State.FAILED


def test_ledger_settings_are_validated() -> None:
    """Bad ledger settings fail at construction."""
    with pytest.raises(ValueError, match="ttl must be a number > 0"):
        Ledger.memory(ttl=0)
    with pytest.raises(ValueError, match="lease must be > 0"):
        Ledger.memory().once("k", lambda: 1, lease=0)


def test_sqlite_bad_file_is_a_clear_error(tmp_path: Path) -> None:
    """A file that is not a SQLite database says so."""
    bad = tmp_path / "not-a-db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(Exception, match="tether ledger"):
        Ledger.sqlite(str(bad))


# --- real processes ------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import os, sys, time
    import tether
    kind, target, key, log = sys.argv[1:5]
    mode = sys.argv[5] if len(sys.argv) > 5 else "race"
    if kind == "sqlite":
        ledger = tether.Ledger.sqlite(target, wait=30.0)
    elif kind == "redis":
        url, prefix = target.split("|")
        ledger = tether.Ledger.redis(url, prefix=prefix, wait=30.0)
    else:
        dsn, table = target.split("|")
        ledger = tether.Ledger.postgres(dsn, table=table, wait=30.0)

    def pay():
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, f"{os.getpid()}\\n".encode())
        os.close(fd)
        if mode == "hang":
            print("paid", flush=True)
            time.sleep(600)
        time.sleep(0.2)
        return {"paid_by": os.getpid()}

    def lookup(k):
        with open(log) as f:
            lines = f.read().split()
        return {"paid_by": int(lines[0])} if lines else None

    lease = 1.0 if mode == "hang" else 60.0
    print(ledger.once(key, pay, lookup=lookup, lease=lease)["paid_by"], flush=True)
    """
)


def _target(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Any]:
    if kind == "sqlite":
        return str(tmp_path / "shared.db"), None
    if kind == "redis":
        prefix = f"tether-test-{uuid.uuid4().hex[:8]}"
        return f"{request.getfixturevalue('redis_url')}|{prefix}", prefix
    table = f"tether_ledger_{uuid.uuid4().hex[:8]}"
    return f"{request.getfixturevalue('pg_dsn')}|{table}", table


def _cleanup(kind: str, request: pytest.FixtureRequest, extra: Any) -> None:
    if kind == "redis":
        import redis

        client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
        for k in client.scan_iter(match=f"{extra}:*"):
            client.delete(k)
        client.close()
    elif kind == "postgres":
        import psycopg

        with psycopg.connect(request.getfixturevalue("pg_dsn"), autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {extra}")


@pytest.mark.parametrize("kind", ["sqlite", "redis", "postgres"])
def test_eight_processes_race_one_key(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """8 OS processes racing one key: exactly one execution, all see its result."""
    target, extra = _target(kind, request, tmp_path)
    log = tmp_path / "paid.log"
    if kind != "sqlite":  # create the table/keys once, before the race
        make = {
            "redis": lambda: Ledger.redis(target.split("|")[0], prefix=extra),
            "postgres": lambda: Ledger.postgres(target.split("|")[0], table=extra),
        }[kind]
        make().close()
    else:
        Ledger.sqlite(target).close()
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, kind, target, "race-key", str(log)],
                              stdout=subprocess.PIPE, text=True) for _ in range(8)]  # fmt: skip
    outputs = [p.communicate(timeout=60)[0].strip() for p in procs]
    try:
        assert [p.returncode for p in procs] == [0] * 8
        assert len(log.read_text().split()) == 1
        assert len(set(outputs)) == 1
    finally:
        _cleanup(kind, request, extra)


@pytest.mark.parametrize("kind", ["sqlite", "redis", "postgres"])
def test_worker_killed_between_claim_and_record(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """kill -9 after the payment, before the record: the next worker reconciles, no double pay."""
    target, extra = _target(kind, request, tmp_path)
    log = tmp_path / "paid.log"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, kind, target, "kill-key", str(log), "hang"],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "paid"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        time.sleep(1.2)  # the dead worker's 1 s lease runs out
        second = subprocess.run([sys.executable, "-c", CHILD, kind, target, "kill-key", str(log)],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert second.returncode == 0, second.stderr
        assert len(log.read_text().split()) == 1
        assert int(second.stdout.strip()) == proc.pid
    finally:
        if proc.poll() is None:
            proc.kill()
        if proc.stdout:
            proc.stdout.close()
        _cleanup(kind, request, extra)


#: a Redis record as the claim script that decoded the client's JSON stored it (cjson's
#: encoding, its times on the server's clock; the fields are filled in by each test)
OLD_REDIS_RECORD = (
    '{{"expires_at":{expires},"owner":"{owner}","created_at":{created},"state":"{state}",'
    '"detail":"{detail}","key":"{key}","lease_until":{lease},"payload_hash":null,'
    '"error":{error},"result":{result},"attempts":1}}'
)


def test_redis_records_of_the_previous_format_are_read(redis_url: str) -> None:
    """Records the previous scripts wrote (the client's JSON of the claim, re-encoded by
    cjson) replay, fail, take over and refuse as before; new records have its fields."""
    import json as _json

    import redis

    prefix = f"tether-test-{uuid.uuid4().hex[:8]}"
    ledger = Ledger.redis(redis_url, prefix=prefix, allow_lost_records=True)
    client = redis.Redis.from_url(redis_url)
    now = time.time()
    done = {"result": _json.dumps('{"id": "re_1"}'), "error": "null"}
    failed = {
        "result": "null",
        "error": _json.dumps(
            '{"type": "ValueError", "module": "builtins", "message": "bad amount"}'
        ),
    }
    open_ = {"result": "null", "error": "null"}
    old = {
        "done": ("done", now + 60, "", done),
        "failed": ("failed", now + 60, "", failed),
        "crashed": ("pending", now - 1, "", open_),  # its owner stopped renewing its lease
        "busy": ("pending", now + 60, "", open_),
        "unknown": ("unknown", now - 1, "timed out", open_),
    }
    for key, (state, lease, detail, texts) in old.items():
        text = OLD_REDIS_RECORD.format(
            expires=now + 3600,
            owner="f" * 32,
            created=now - 5,
            state=state,
            detail=detail,
            key=key,
            lease=lease,
            **texts,
        )
        client.set(f"{prefix}:ledger:{{{key}}}", text, px=3_600_000)
    try:
        assert ledger.once("done", lambda: "again") == {"id": "re_1"}
        with pytest.raises(ValueError, match="bad amount"):
            ledger.once("failed", lambda: "again")
        assert ledger.once("crashed", lambda: "again", lookup=lambda k: "it was paid") == (
            "it was paid"
        )
        with pytest.raises(EffectInProgress):
            ledger.once("busy", lambda: "again")
        with pytest.raises(UnknownOutcome, match="timed out"):
            ledger.once("unknown", lambda: "again")
        crashed = ledger.get("crashed")
        assert crashed is not None and crashed.state is State.DONE and crashed.attempts == 2
        ledger.once("new", lambda order: {"id": order}, "A-1")
        stored = _json.loads(client.get(f"{prefix}:ledger:{{new}}") or b"")
        assert sorted(stored) == sorted(
            _json.loads(
                OLD_REDIS_RECORD.format(
                    expires=1,
                    owner="o",
                    created=1,
                    state="done",
                    detail="",
                    key="k",
                    lease=1,
                    result="null",
                    error="null",
                )
            )
        )
        assert stored["state"] == "done" and stored["error"] is None and stored["detail"] == ""
        assert stored["result"] == '{"id": "A-1"}' and len(stored["payload_hash"]) == 64
        assert stored["attempts"] == 1
        assert stored["lease_until"] == pytest.approx(stored["created_at"] + 60, abs=1e-3)
    finally:
        drop(ledger)
        client.close()


def test_sqlite_rows_of_the_previous_claim_are_read(tmp_path: Path) -> None:
    """The claim is written with its fixed fields as literals now: its row is the one the
    previous eleven-value INSERT wrote, and rows written that way are read as before."""
    from tether.stores._ledger_logic import COLUMNS, Record

    ledger = Ledger.sqlite(str(tmp_path / "ledger.db"), clock=VirtualClock())
    backend: Any = ledger.backend
    now = ledger.clock.wall()
    insert = f"INSERT INTO tether_ledger ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * 11)})"
    for key, state, lease in (("done", "done", 60.0), ("crashed", "pending", -1.0)):
        row = Record.claim_of(key, None, "f" * 32, lease, 3600.0).at(now).values()
        row = (*row[:1], state, *row[2:7], '{"id": "re_1"}' if state == "done" else None, *row[8:])
        backend._db.execute(insert, row)
    seen: list[Any] = []

    def effect() -> str:
        seen.append(ledger.get("crashed"))
        return "ran"

    assert ledger.once("done", lambda: "again") == {"id": "re_1"}
    assert ledger.once("crashed", effect, lookup=lambda k: None) == "ran"
    claim = seen[0]
    assert claim.state is State.PENDING and claim.attempts == 2  # a takeover: decided
    ledger.once("fresh", lambda: seen.append(ledger.get("fresh")))
    fresh = seen[1]
    expected = Record.claim_of("fresh", None, fresh.owner, 60.0, ledger.ttl).at(now)
    assert fresh == expected  # all eleven fields, as the eleven-value INSERT wrote them
    ledger.close()


@pytest.mark.parametrize("kind", ["redis", "redis-cluster"])
def test_redis_ledger_loads_its_scripts_again_after_a_flush(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A server that does not know the scripts (restarted, SCRIPT FLUSH) is sent them again:
    the claim and the settlement still happen once each. The test's own cluster is flushed;
    on the shared server, the ledger is made to ask for scripts the server never had."""
    ledger = make_ledger(kind, request, tmp_path)
    backend: Any = ledger.backend
    calls: list[int] = []
    try:
        assert ledger.once("k-before", lambda: calls.append(1) or "a") == "a"
        if kind == "redis-cluster":
            backend.client.script_flush()
        else:
            backend._claim.sha = backend._update.sha = "0" * 40
        trips = backend.round_trips
        assert ledger.once("k-after", lambda: calls.append(2) or "b") == "b"
        assert backend.round_trips - trips == 6  # each script: EVALSHA, SCRIPT LOAD, EVALSHA
        assert ledger.once("k-after", lambda: calls.append(3) or "c") == "b"
        assert calls == [1, 2]
        record = ledger.get("k-after")
        assert record is not None and record.state is State.DONE
    finally:
        drop(ledger)


def test_workers_forked_below_python_run_a_pending_effect_once(tmp_path: Path) -> None:
    """Two workers forked by libc's fork() (uWSGI's default pre-fork: no after-fork hook
    runs) ask for one effect while it runs: the second is told it is in progress, never
    given the claim as if it were the first's own retry."""
    script = tmp_path / "fork.py"
    ran = tmp_path / "ran.txt"
    script.write_text(
        textwrap.dedent(
            f"""
            import ctypes, os, time
            import tether
            ledger = tether.Ledger.sqlite({str(tmp_path / "l.db")!r})
            def refund():
                with open({str(ran)!r}, "a") as f:
                    f.write(f"{{os.getpid()}}\\n")
                time.sleep(1.0)
                return "ok"
            pid = ctypes.CDLL(None).fork()
            if pid == 0:
                time.sleep(0.3)  # the parent's claim is pending now
                try:
                    ledger.once("refund:order-1", refund)
                    print("child ran", flush=True)
                except tether.EffectInProgress:
                    print("child refused", flush=True)
                os._exit(0)
            ledger.once("refund:order-1", refund)
            os.waitpid(pid, 0)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "child refused" in out.stdout, out.stdout + out.stderr
    assert len(ran.read_text().split()) == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_owner_tokens_are_unique_across_claims_and_a_forked_child() -> None:
    """Each claim's token is new, and a forked child does not repeat its parent's."""
    from tether.effects._recorder import owner_token

    mine = {owner_token() for _ in range(1000)}
    assert len(mine) == 1000
    read, write = os.pipe()
    with warnings.catch_warnings():  # 3.12+ warns of forking a threaded process
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: its next tokens, then out at once
        os.write(write, " ".join(owner_token() for _ in range(10)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    theirs = os.read(read, 4096).decode().split()
    os.close(read)
    assert len(theirs) == 10
    assert not set(theirs) & mine
