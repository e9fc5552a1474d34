"""At most once on every path: the defaults, hung tools, long effects, async tools, replays.

Each test is one case of the effects issue and counts executions of a real effect.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import json
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

import tether
from scripted_server import Reply, ScriptedServer
from tether import (
    EffectInProgress,
    EffectNotRecorded,
    Guard,
    Ledger,
    RetryPolicy,
    StopReason,
    StoreUnavailable,
    Tool,
    UnknownOutcome,
    VirtualClock,
)
from tether.clock import SystemClock
from tether.integrations import anthropic as t_anthropic
from tether.stores._ledger_logic import State
from tether.stores.redis._ledger import LedgerNotDurable

BACKENDS = ["sqlite", "redis", "postgres"]


class Payments:
    """A payment provider that commits every refund it receives (thread-safe)."""

    def __init__(self) -> None:
        self.paid: list[str] = []
        self._lock = threading.Lock()

    def refund(self, order: str, amount: int = 10, **_: Any) -> dict[str, Any]:
        with self._lock:
            self.paid.append(order)
        return {"id": f"re_{len(self.paid)}", "order": order, "amount": amount}


def make_ledger(kind: str, request: pytest.FixtureRequest, tmp_path: Path, **kw: Any) -> Ledger:
    if kind == "memory":
        return Ledger.memory(**kw)
    if kind == "sqlite":
        return Ledger.sqlite(str(tmp_path / "ledger.db"), **kw)
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
        return Ledger.redis(url, prefix=f"tether-test-{uuid.uuid4().hex[:8]}", **kw)
    table = f"ledger_{uuid.uuid4().hex[:8]}"
    return Ledger.postgres(request.getfixturevalue("pg_dsn"), table=table, **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cut_redis(ledger: Ledger) -> None:
    """Point the ledger's Redis client at a port where nothing listens (Redis is down)."""
    client = ledger.backend.client  # type: ignore[attr-defined]
    client.connection_pool.connection_kwargs["port"] = free_port()
    client.connection_pool.disconnect()
    client.connection_pool.reset()


# --- 1. no ledger configured -----------------------------------------------------------


def test_no_ledger_configured_runs_a_timed_out_refund_once() -> None:
    """Guard() without ledger=: a refund that commits then times out runs once, not ten times."""
    pay = Payments()

    def refund(order: str, uuid: str) -> dict[str, Any]:
        pay.refund(order)
        raise TimeoutError("read timed out")

    guard = Guard(clock=VirtualClock())
    with guard.start(task="refund A-1") as run:
        for _ in range(2):
            run.proceed()
            run.call_tool("issue_refund", refund, {"order": "A-1", "uuid": str(uuid.uuid4())},
                          idempotent=False)  # fmt: skip
    assert pay.paid == ["A-1"]
    assert run.outcome.stopped_because is StopReason.UNKNOWN_OUTCOME


def test_no_ledger_configured_run_agent_runs_a_refund_once(server: ScriptedServer) -> None:
    """run_agent with Tool(idempotent=False) and the default Guard: one execution."""
    pay = Payments()

    def refund(order: str, uuid: str = "") -> dict[str, Any]:
        pay.refund(order)
        raise TimeoutError("read timed out")

    def ask_again(seen: Any) -> Reply:
        n = len(server.requests)
        return Reply(200, {"id": f"msg_{n}", "type": "message", "role": "assistant",
                           "model": "claude-haiku-4-5", "stop_reason": "tool_use", "stop_sequence": None,
                           "content": [{"type": "tool_use", "id": f"tu_{n}", "name": "issue_refund",
                                        "input": {"order": "A-1", "uuid": uuid.uuid4().hex}}],
                           "usage": {"input_tokens": 10, "output_tokens": 5}})  # fmt: skip

    server.handler = ask_again
    import anthropic

    with anthropic.Anthropic(api_key="test", base_url=server.url) as raw:
        out = t_anthropic.run_agent(raw, model="claude-haiku-4-5",
                                    messages=[{"role": "user", "content": "refund A-1"}],
                                    tools=[Tool("issue_refund", refund, idempotent=False)],
                                    guard=Guard(clock=VirtualClock(), budget=tether.Budget(max_steps=6)))  # fmt: skip
    assert pay.paid == ["A-1"]
    assert out.stopped_because is StopReason.UNKNOWN_OUTCOME


# --- 2. a non-idempotent tool that outlives its timeout --------------------------------


def test_effect_that_outlives_its_timeout_is_never_run_again() -> None:
    """sync: sleeps 1.2 s then pays, timeout 0.3 s: one execution, UNKNOWN_OUTCOME, honest words."""
    pay = Payments()

    def refund(order: str) -> dict[str, Any]:
        time.sleep(1.2)
        return pay.refund(order)

    guard = Guard(retry=RetryPolicy(max_attempts=5, base=0.01, cap=0.02))
    with guard.start(task="refund A-1", key="ticket-1") as run:
        run.proceed()
        run.call_tool("issue_refund", refund, {"order": "A-1"}, idempotent=False, timeout=0.3)
    out = run.outcome
    assert out.stopped_because is StopReason.UNKNOWN_OUTCOME
    assert any("issue_refund may have happened" in issue for issue in out.open_issues)
    assert "could not complete" not in out.customer_message
    assert "do not repeat" in out.customer_message
    key = tether.intent_key("issue_refund", {"order": "A-1"}, scope=run._scope)
    assert guard.ledger.get(key).state is State.UNKNOWN  # type: ignore[union-attr]
    time.sleep(1.3)  # the abandoned attempt finishes and records what it did
    assert pay.paid == ["A-1"]
    assert guard.ledger.get(key).state is State.DONE  # type: ignore[union-attr]
    with guard.start(key="ticket-1") as again:  # the same request again: replayed, not paid
        again.proceed()
        assert (
            again.call_tool("issue_refund", refund, {"order": "A-1"}, idempotent=False)["id"]
            == "re_1"
        )
    assert pay.paid == ["A-1"]


def test_async_effect_that_outlives_its_timeout_is_unknown_not_failed() -> None:
    """async: a timed-out coroutine is cancelled and its record is unknown, never failed."""
    pay = Payments()

    async def refund(order: str) -> dict[str, Any]:
        pay.refund(order)  # the request went out
        await asyncio.sleep(1.2)  # the response never comes in time
        return {"id": "re_1"}

    guard = Guard(retry=RetryPolicy(max_attempts=5, base=0.01, cap=0.02))

    async def main() -> tether.Outcome:
        async with guard.start(task="refund A-1") as run:
            run.proceed()
            await run.acall_tool(
                "issue_refund", refund, {"order": "A-1"}, idempotent=False, timeout=0.3
            )
        return run.outcome

    out = asyncio.run(main())
    assert pay.paid == ["A-1"]
    assert out.stopped_because is StopReason.UNKNOWN_OUTCOME
    scope = json.dumps(["", f"run:{out.run_id}"])  # the guard's scope and the run's request
    record = guard.ledger.get(tether.intent_key("issue_refund", {"order": "A-1"}, scope=scope))
    assert record is not None and record.state is State.UNKNOWN


def test_effect_cancelled_at_loop_shutdown_is_unknown() -> None:
    """A CancelledError when the event loop shuts down records the effect unknown."""
    ledger = Ledger.memory()
    started = []

    async def refund() -> str:
        started.append(1)
        await asyncio.sleep(10)
        return "re_1"

    async def main() -> None:
        task = asyncio.create_task(ledger.aonce("k-shutdown", refund))
        while not started:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    record = ledger.get("k-shutdown")
    assert record is not None and record.state is State.UNKNOWN
    with pytest.raises(UnknownOutcome):
        ledger.once("k-shutdown", lambda: "again")


# --- 3. an effect that runs longer than its lease --------------------------------------


@pytest.mark.parametrize("kind", BACKENDS)
def test_effect_longer_than_its_lease_keeps_its_claim(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """lease 1 s, effect 2.5 s, a second worker at 1.5 s whose lookup says "not yet": one run."""
    first = make_ledger(kind, request, tmp_path)
    pay = Payments()

    def slow_refund() -> dict[str, Any]:
        time.sleep(2.5)
        return pay.refund("A-1")

    worker = threading.Thread(target=lambda: first.once("k-long", slow_refund, lease=1.0))
    worker.start()
    time.sleep(1.5)
    second = make_ledger(kind, request, tmp_path) if kind == "sqlite" else first
    with pytest.raises(EffectInProgress):
        second.once("k-long", pay.refund, "A-1", lookup=lambda key: None, lease=1.0)
    worker.join()
    assert pay.paid == ["A-1"]
    assert second.once("k-long", pay.refund, "A-1", lease=1.0)["id"] == "re_1"
    first.close()
    if second is not first:
        second.close()


@pytest.mark.parametrize("kind", ["memory", *BACKENDS])
def test_late_completion_of_a_lost_claim_is_refused(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A worker whose claim was taken over cannot overwrite the new owner's record (fencing)."""
    clock = VirtualClock(wall_start=time.time())
    ledger = make_ledger(kind, request, tmp_path, clock=clock)
    pay = Payments()

    def stalled() -> dict[str, Any]:
        clock.advance(61.0)  # the worker stalls past its lease: others may take over
        ledger.once("k-fence", pay.refund, "A-1", lookup=lambda key: None)  # the takeover pays
        return {"id": "stale"}

    with pytest.raises(EffectNotRecorded, match="another worker took its claim over") as caught:
        ledger.once("k-fence", stalled)
    assert caught.value.result == {"id": "stale"}
    assert ledger.result("k-fence") == {"id": "re_1", "order": "A-1", "amount": 10}
    ledger.close()


class AheadClock(SystemClock):
    """A worker whose clock runs two minutes ahead."""

    def wall(self) -> float:
        return super().wall() + 120.0


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_clock_ahead_cannot_take_over_early(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Leases are measured on the store's clock: a skewed worker sees the lease still live."""
    ledger = make_ledger(kind, request, tmp_path)
    skewed = Ledger(ledger.backend, clock=AheadClock())
    pay = Payments()
    release = threading.Event()

    def long_refund() -> dict[str, Any]:
        release.wait(5)
        return pay.refund("A-1")

    worker = threading.Thread(target=lambda: ledger.once("k-skew", long_refund, lease=60.0))
    worker.start()
    time.sleep(0.2)
    with pytest.raises(EffectInProgress):
        skewed.once("k-skew", pay.refund, "A-1", lookup=lambda key: None)
    release.set()
    worker.join()
    assert pay.paid == ["A-1"]
    ledger.close()


def test_call_tool_lease_covers_its_timeout() -> None:
    """A guarded call's lease is at least its timeout (twice it), whatever the default."""
    guard = Guard(ledger=Ledger.memory(lease=1.0))
    with guard.start() as run:
        run.proceed()
        run.call_tool(
            "pay", lambda order: {"ok": True}, {"order": "A"}, idempotent=False, timeout=5.0
        )
        record = guard.ledger.get(tether.intent_key("pay", {"order": "A"}, scope=run._scope))
        assert record is not None and record.lease_until - record.created_at >= 10.0
        run.succeed()


# --- 4. a Redis ledger that forgets ----------------------------------------------------


def test_redis_ledger_refuses_a_server_that_does_not_persist(tmp_path: Any) -> None:
    """appendonly off: refused, with the way out named; allow_lost_records accepts the risk.
    A server of its own: turning off the shared server's appendonly would refuse every other
    ledger on it meanwhile."""
    import shutil

    redis_server = shutil.which("redis-server")
    assert redis_server, "redis-server must be installed for this test (Debian: redis-server)"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = f"--port {port} --bind 127.0.0.1 --appendonly no --dir {tmp_path}".split()
    proc = subprocess.Popen(
        [redis_server, *argv, "--save", ""],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        for _ in range(200):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        with pytest.raises(LedgerNotDurable, match="allow_lost_records=True"):
            Ledger.redis(url)
        Ledger.redis(url, allow_lost_records=True).close()
        Ledger.redis(url, assume_durable=True).close()
        client.close()
    finally:
        proc.terminate()
        proc.wait(10)


def _forget(ledger: Ledger) -> None:
    """A restart without persistence, for this ledger's keys only (never FLUSHDB: the
    server is shared with whatever else runs on it)."""
    client = ledger.backend.client  # type: ignore[attr-defined]
    for key in client.scan_iter(match=f"{ledger.backend.prefix}:*"):  # type: ignore[attr-defined]
        client.delete(key)


def test_redis_ledger_that_forgets_mid_effect_never_reports_success(redis_url: str) -> None:
    """The record vanishes while the effect runs: complete() raises, the outcome is unknown."""
    ledger = Ledger.redis(redis_url, prefix=f"tether-test-{uuid.uuid4().hex[:8]}")
    pay = Payments()

    def refund() -> dict[str, Any]:
        out = pay.refund("A-1")
        _forget(ledger)
        return out

    guard = Guard(ledger=ledger)
    with guard.start() as run:
        run.proceed()
        run.call_tool("issue_refund", lambda: refund(), {}, idempotent=False)
    assert pay.paid == ["A-1"]
    assert run.outcome.stopped_because is StopReason.UNKNOWN_OUTCOME
    with pytest.raises(EffectNotRecorded, match="no longer has its record"):
        ledger.once("k-forget", lambda: (pay.refund("B-1"), _forget(ledger))[0])
    ledger.close()


# --- 5. the store is down at the end of a run ------------------------------------------


def test_store_down_at_the_end_still_gives_an_outcome(redis_url: str) -> None:
    """The ledger's Redis goes away before the run ends: an Outcome that says so, no raise."""
    ledger = Ledger.redis(redis_url, prefix=f"tether-test-{uuid.uuid4().hex[:8]}")
    pay = Payments()
    guard = Guard(ledger=ledger)
    with guard.start(task="refund A-1") as run:
        run.proceed()
        run.call_tool("issue_refund", pay.refund, {"order": "A-1"}, idempotent=False)
        cut_redis(ledger)
        run.succeed("refunded")
    out = run.outcome
    assert out.status == "success"
    assert any("ledger could not be read" in issue for issue in out.open_issues)
    assert pay.paid == ["A-1"]


# --- 6. complete() fails after the effect ran ------------------------------------------


def test_failed_record_after_the_effect_says_the_effect_ran(redis_url: str) -> None:
    """The store fails between the effect and its record: the error says it ran."""
    ledger = Ledger.redis(redis_url, prefix=f"tether-test-{uuid.uuid4().hex[:8]}")
    pay = Payments()

    def refund() -> dict[str, Any]:
        out = pay.refund("A-1")
        cut_redis(ledger)
        return out

    with pytest.raises(EffectNotRecorded) as caught:
        ledger.once("k-ran", refund)
    text = str(caught.value)
    assert "ran, but its result could not be recorded" in text
    assert "has not run" not in text and "nothing was executed" not in text
    assert caught.value.result["id"] == "re_1"
    assert pay.paid == ["A-1"]


def test_unreachable_store_before_the_effect_says_nothing_ran(redis_url: str) -> None:
    """The store is down at the claim: nothing runs, and the error says so."""
    ledger = Ledger.redis(redis_url, prefix=f"tether-test-{uuid.uuid4().hex[:8]}")
    cut_redis(ledger)
    pay = Payments()
    with pytest.raises(StoreUnavailable, match="nothing was executed"):
        ledger.once("k-down", pay.refund, "A-1")
    assert pay.paid == []


# --- 7. PostgreSQL restarts ------------------------------------------------------------


def test_postgres_ledger_reconnects_after_its_connections_die(pg_dsn: str) -> None:
    """The server drops every connection (as a restart does): the next calls still work."""
    import psycopg

    table = f"ledger_{uuid.uuid4().hex[:8]}"
    ledger = Ledger.postgres(pg_dsn, table=table)
    assert ledger.once("k-pg-1", lambda: "one") == "one"
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name LIKE %s AND pid <> pg_backend_pid()",
            (f"%{table}%",),
        )
        killed = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = current_user AND pid <> pg_backend_pid()"
        ).fetchone()
    assert killed is not None
    for i in range(3):
        assert ledger.once(f"k-pg-after-{i}", lambda i=i: i) == i
    ledger.close()


# --- 8. async tools --------------------------------------------------------------------


def test_sync_call_tool_refuses_a_coroutine_function() -> None:
    """call_tool given an async tool raises TypeError before anything runs."""
    ran = []

    async def search(q: str) -> str:
        ran.append(q)
        return "found"

    guard = Guard(clock=VirtualClock())
    with pytest.raises(TypeError, match="acall_tool"), guard.start() as run:
        run.proceed()
        run.call_tool("search", search, {"q": "invoice 99"})
    assert ran == []
    assert run.tool_calls == 0


def test_acall_tool_runs_a_sync_tool_in_a_thread() -> None:
    """acall_tool given a plain function runs it (off the loop) and returns its result."""
    threads = []

    def search(q: str) -> str:
        threads.append(threading.current_thread().name)
        return f"found {q}"

    async def main() -> Any:
        async with Guard().start() as run:
            run.proceed()
            result = await run.acall_tool("search", search, {"q": "invoice 99"})
            refund = await run.acall_tool("refund", lambda order: {"id": "re_1"}, {"order": "A"},
                                          idempotent=False)  # fmt: skip
            run.succeed(result)
        return run.outcome, refund

    out, refund = asyncio.run(main())
    assert (out.status, out.result, refund) == ("success", "found invoice 99", {"id": "re_1"})
    assert threads and threads[0] != threading.main_thread().name


def test_run_agent_refuses_async_tools_before_the_first_request(server: ScriptedServer) -> None:
    """The sync loop says so before it pays for a model call."""
    import anthropic

    async def search(q: str) -> str:
        return "x"

    with (
        anthropic.Anthropic(api_key="test", base_url=server.url) as raw,
        pytest.raises(TypeError, match="arun_agent"),
    ):
        t_anthropic.run_agent(raw, model="claude-haiku-4-5", messages=[{"role": "user", "content": "x"}],
                              tools=[Tool("search", search)])  # fmt: skip
    assert server.requests == []


# --- 9. dead-letter replay -------------------------------------------------------------


def test_dead_letter_replay_runs_once_unless_forced(tmp_path: Path) -> None:
    """Replaying one letter twice calls the handler once; force=True calls it again."""
    from tether.records._collections import DeadLetters

    path = str(tmp_path / "letters.db")
    letters = DeadLetters.sqlite(path)
    letter = letters.park(tool="refund", args={"order": "A-1"}, error=ValueError("card declined"),
                          run_id="run_1", task="refund A-1", at=0.0)  # fmt: skip
    pay = Payments()
    assert letters.replay(letter.id, pay.refund)["id"] == "re_1"
    letters.close()
    again = DeadLetters.sqlite(path)  # another terminal, another process
    assert again.replay(letter.id, pay.refund)["id"] == "re_1"
    assert pay.paid == ["A-1"]
    assert again.replay(letter.id, pay.refund, force=True)["id"] == "re_2"
    assert pay.paid == ["A-1", "A-1"]
    again.close()


# --- 10. one encoding of intents -------------------------------------------------------


def test_int_keys_encode_the_same_with_or_without_volatile_fields() -> None:
    """Int keys sort the same way on both paths."""
    plain = {"items": {2: "two", 10: "ten"}}
    with_uuid = {"items": {2: "two", 10: "ten"}, "uuid": "u-1"}
    assert tether.intent_key("t", plain) == tether.intent_key("t", with_uuid)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({1: "a", "1": "b"}, {"1": "b"}),
        ({"x": {"$bytes": "aGk="}}, {"x": b"hi"}),
        ({"x": {"$dec": "1"}}, {"x": decimal.Decimal(1)}),
        ({1: "a"}, {"1": "a"}),
        ({"x": {"$$set": [1]}}, {"x": {"$set": [1]}}),
    ],
)
def test_distinct_arguments_never_share_a_key(a: Any, b: Any) -> None:
    """Mixed key types, tag look-alikes and escaped look-alikes all get their own key."""
    assert tether.intent_key("t", a) != tether.intent_key("t", b)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ({"a": {"b": {"c": "\ud800"}}}, ValueError, r"args\.a\.b\.c: .*lone surrogate"),
        ({"n": 10**5000}, ValueError, r"args\.n: an integer too long"),
        ({"deep": "placeholder"}, ValueError, r"nested deeper than 64 levels"),
    ],
)
def test_bad_intents_name_their_path(args: Any, error: type[Exception], match: str) -> None:
    """Lone surrogates, huge integers and runaway nesting get errors naming the path."""
    if "deep" in args:
        nested: Any = "leaf"
        for _ in range(100):
            nested = {"d": nested}
        args = {"deep": nested}
    with pytest.raises(error, match=match):
        tether.intent_key("t", args)


def test_scope_none_is_a_clear_error() -> None:
    """scope=None is refused with the fix."""
    with pytest.raises(TypeError, match="scope must be a str"):
        tether.intent_key("t", {}, scope=None)  # type: ignore[arg-type]


# --- 11. replays keep their types ------------------------------------------------------

TYPED = {
    "amount": decimal.Decimal("49.90"),
    "at": dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC),
    "day": dt.date(2026, 11, 30),
    "id": uuid.UUID(int=42),
    "receipt": b"\x00pdf",
    "pair": ("re_1", 2),
    "tags": {"refund"},
    "$note": "a key that starts with $",
    "by_int": {1: "one", 2: ("two",)},
}


@pytest.mark.parametrize("kind", ["memory", *BACKENDS])
def test_replays_keep_their_types(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A replayed result is the same type and value as the first."""
    ledger = make_ledger(kind, request, tmp_path)
    first = ledger.once("k-typed", lambda: dict(TYPED))
    replay = ledger.once("k-typed", lambda: pytest.fail("must not run again"))
    assert replay == first == TYPED
    assert str(replay["amount"]) == "49.90"
    assert {k: type(v) for k, v in replay.items()} == {k: type(v) for k, v in TYPED.items()}
    ledger.close()


def test_a_result_the_codec_cannot_encode_is_still_recorded() -> None:
    """A codec that raises anything leaves the record done (as a repr), never pending."""

    class Broken:
        def encode(self, value: Any) -> str:
            raise RuntimeError("codec bug")

        def decode(self, text: str) -> Any:
            raise RuntimeError("codec bug")

    ledger = Ledger.memory(codec=Broken())
    assert ledger.once("k-broken", lambda: "re_1") == "re_1"
    record = ledger.get("k-broken")
    assert record is not None and record.state is State.DONE
    assert ledger.once("k-broken", lambda: "again") == {"$repr": "'re_1'"}


def test_redis_ledger_on_a_ready_client(redis_url: str) -> None:
    """Ledger.redis(client=...) takes a client the caller built; replays as usual."""
    client = redis.Redis.from_url(redis_url)
    ledger = Ledger.redis(client=client, prefix=f"tether-test-{uuid.uuid4().hex[:8]}")
    pay = Payments()
    assert ledger.once("k-client", pay.refund, "A-1")["id"] == "re_1"
    assert ledger.once("k-client", pay.refund, "A-1")["id"] == "re_1"
    assert pay.paid == ["A-1"]
    ledger.close()


def test_dead_letter_replay_runs_once_on_postgres(pg_dsn: str) -> None:
    """Letters in PostgreSQL: the replay ledger sits in the same database."""
    from tether.records._collections import DeadLetters

    table = f"letters_{uuid.uuid4().hex[:8]}"
    letters = DeadLetters.postgres(pg_dsn, table=table)
    letter = letters.park(tool="refund", args={"order": "A-1"}, error=ValueError("declined"),
                          run_id="run_1", task="refund A-1", at=0.0)  # fmt: skip
    pay = Payments()
    assert letters.replay(letter.id, pay.refund)["id"] == "re_1"
    letters.close()
    again = DeadLetters.postgres(pg_dsn, table=table)
    assert again.replay(letter.id, pay.refund)["id"] == "re_1"
    assert pay.paid == ["A-1"]
    again.close()
