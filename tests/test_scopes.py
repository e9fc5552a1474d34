"""Budget scopes (#44): limits that span runs, reserved before each model call in all of a
run's scopes at once, settled once per call, pausing the run when spent. Every test runs
through the memory store, real Redis, a real Redis Cluster, SQLite and real PostgreSQL
(``tether.Records``)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import tether
from tether import StopReason
from tether.stores import MemoryStore
from tether.stores.redis._store import RedisStore

MODEL = "gpt-4o"  # $2.50 in, $10 out per million tokens
#: one request's reservation: 1,000 prompt tokens and max_tokens=1,000
RESERVED = (1000 * 2.5 + 1000 * 10.0) / 1e6  # $0.0125
#: what one reply of 1,000 in, 500 out costs
USED = (1000 * 2.5 + 500 * 10.0) / 1e6  # $0.0075


def drop_tables(dsn: str, prefix: str) -> None:
    """Drop every table of a test's records (named ``<prefix>...``) on PostgreSQL."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE %s", [prefix + "%"]
        ).fetchall()
        for (table,) in tables:
            conn.execute(f"DROP TABLE IF EXISTS {table}")


@pytest.fixture(params=["memory", "redis", "redis-cluster", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryStore()
        return
    if request.param == "sqlite":
        records = tether.Records.sqlite(str(tmp_path / "scopes.db"))
        yield records
        records.close()
        return
    if request.param == "postgres":
        dsn, table = request.getfixturevalue("pg_dsn"), f"t_scopes_{uuid.uuid4().hex[:8]}"
        records = tether.Records.postgres(dsn, table)
        yield records
        records.close()
        drop_tables(dsn, table)
        return
    prefix = f"tether-test-{uuid.uuid4().hex[:8]}"
    if request.param == "redis-cluster":
        client = request.getfixturevalue("redis_cluster").client()
        s = RedisStore(client=client, prefix=prefix, server_time=False)
    else:
        s = RedisStore(request.getfixturevalue("redis_url"), prefix=prefix, server_time=False)
    yield s
    s.reset()
    s.close()


@pytest.fixture
def clock() -> tether.VirtualClock:
    return tether.VirtualClock()


def guard_of(scopes: tether.BudgetScopes, **kw: Any) -> tether.Guard:
    return tether.Guard(
        scopes=scopes, clock=scopes.clock, checkpoints=tether.Checkpoints.memory(), **kw
    )


def one_call(run: tether.Run, model: str = MODEL, output_tokens: int = 500) -> None:
    run.begin_model_call(model=model, estimated_input_tokens=1000, max_output_tokens=1000)
    run.record_model_call(model=model, input_tokens=1000, output_tokens=output_tokens)
    run.progress()


def work(guard: tether.Guard, calls: int, scopes: tuple[str, ...], **kw: Any) -> tether.Outcome:
    with guard.start("answer the ticket", scopes=scopes, **kw) as run:
        while run.proceed():
            if run.model_calls >= calls:
                run.succeed("done")
                break
            one_call(run)
    return run.outcome


async def awork(guard: tether.Guard, calls: int, run: tether.Run) -> tether.Outcome:
    async with run:
        while run.proceed():
            if run.model_calls >= calls:
                run.succeed("done")
                break
            await run.abegin_model_call(
                model=MODEL, estimated_input_tokens=1000, max_output_tokens=1000
            )
            run.record_model_call(model=MODEL, input_tokens=1000, output_tokens=500)
            run.progress()
    return run.outcome


def test_a_reply_settles_its_reservation_in_every_scope(store: Any, clock: Any) -> None:
    """Each call reserves its priced estimate and is counted at its usage, in each scope."""
    scopes = tether.BudgetScopes(store, clock=clock)
    scopes.limit("tenant:acme", max_cost_usd=1.0)
    outcome = work(guard_of(scopes), 3, ("tenant:acme", "user:u-7"))
    assert outcome.status == "success"
    for name in ("tenant:acme", "user:u-7"):
        spent = scopes.spent(name)
        assert (spent.model_calls, spent.input_tokens, spent.output_tokens) == (3, 3000, 1500)
        assert spent.cost_usd == pytest.approx(3 * USED)
        assert scopes.view(name).held == tether.Usage()
    assert scopes.names() == ["tenant:acme", "user:u-7"]


def test_a_spent_scope_pauses_the_run_before_the_request(store: Any, clock: Any) -> None:
    """The call whose reservation would pass the limit is never sent: BUDGET_REACHED,
    "paused", the scope named, the customer told it is paused, a checkpoint kept."""
    scopes = tether.BudgetScopes(store, clock=clock)
    scopes.limit("tenant:acme", max_cost_usd=2 * USED + RESERVED - 1e-6)
    sent: list[int] = []
    guard = guard_of(scopes)
    with guard.start("answer", scopes=("tenant:acme", "user:u-7")) as run:
        while run.proceed():
            one_call(run)
            sent.append(1)
    outcome = run.outcome
    assert (outcome.status, outcome.stopped_because) == ("paused", StopReason.BUDGET_REACHED)
    assert len(sent) == 2 and outcome.usage.model_calls == 2
    assert "'tenant:acme'" in outcome.detail and "no request was sent" in outcome.detail
    assert "paused" in outcome.customer_message and "try again" not in outcome.customer_message
    assert outcome.checkpoint_id is not None
    assert scopes.waiting("tenant:acme") == {run.run_id: outcome.checkpoint_id}
    # all or nothing: the user's scope holds nothing of the refused call
    assert scopes.view("user:u-7").held == tether.Usage()
    assert scopes.spent("user:u-7").model_calls == 2


def test_raising_the_limit_lets_the_paused_run_resume_and_finish(store: Any, clock: Any) -> None:
    """guard.resume(checkpoint) after scopes.limit(...) raised it: the run goes on in the
    same scopes, and no longer waits."""
    scopes = tether.BudgetScopes(store, clock=clock)
    scopes.limit("tenant:acme", max_cost_usd=RESERVED)
    guard = guard_of(scopes)
    first = work(guard, 3, ("tenant:acme",))
    assert first.status == "paused" and first.usage.model_calls == 1
    assert first.checkpoint_id is not None
    still = guard.resume(first.checkpoint_id)  # no room yet: paused again, waits again
    with still:
        while still.proceed():
            one_call(still)
    assert still.outcome.status == "paused" and still.outcome.usage.model_calls == 1
    waiting = scopes.waiting("tenant:acme")
    assert list(waiting) == [still.run_id]
    scopes.limit("tenant:acme", max_cost_usd=1.0)
    run = guard.resume(waiting[still.run_id])
    assert scopes.waiting("tenant:acme") == {}
    with run:
        while run.proceed():
            if run.model_calls >= 3:
                run.succeed("done")
                break
            one_call(run)
    assert run.outcome.status == "success" and run.outcome.usage.model_calls == 3
    assert scopes.spent("tenant:acme").model_calls == 3


def test_the_async_shell_pauses_and_counts_the_same(store: Any, clock: Any) -> None:
    """abegin_model_call reserves as begin_model_call does."""
    scopes = tether.BudgetScopes(store, clock=clock)
    scopes.limit("tenant:acme", max_cost_usd=USED + RESERVED)
    guard = guard_of(scopes)

    async def main() -> tether.Outcome:
        try:
            return await awork(guard, 5, guard.start("t", scopes=("tenant:acme",)))
        finally:
            if isinstance(store, RedisStore) and store._conn._aclient_made is not None:
                await store.aclose()  # the asyncio client this loop made

    outcome = asyncio.run(main())
    assert (outcome.status, outcome.usage.model_calls) == ("paused", 2)
    assert scopes.spent("tenant:acme").cost_usd == pytest.approx(2 * USED)


def test_a_replayed_record_counts_once(store: Any, clock: Any) -> None:
    """A run restored from a snapshot taken before a call (an engine's recovery) makes the
    call again under the same id: the scope counts it once."""
    scopes = tether.BudgetScopes(store, clock=clock)
    scopes.limit("tenant:acme", max_cost_usd=1.0)
    guard = guard_of(scopes)
    run = guard.start("t", scopes=("tenant:acme",))
    run.proceed()
    before = run.snapshot()
    one_call(run)
    again = guard.restore(before)
    one_call(again)
    one_call(again)
    assert again.model_calls == 2
    assert scopes.spent("tenant:acme").model_calls == 2  # not 3
    assert scopes.spent("tenant:acme").cost_usd == pytest.approx(2 * USED)


def test_an_unpriced_model_is_refused_under_a_cost_limited_scope(store: Any, clock: Any) -> None:
    """No price, a cost limit: UnknownModelError before the first request; a scope limited
    only in calls lets it through."""
    scopes = tether.BudgetScopes(store, clock=clock)
    scopes.limit("tenant:acme", max_cost_usd=1.0)
    scopes.limit("user:u-7", max_model_calls=5)
    guard = guard_of(scopes)
    run = guard.start("t", scopes=("user:u-7", "tenant:acme"))
    with run, pytest.raises(tether.UnknownModelError, match="tenant:acme"):
        run.begin_model_call(model="my-own-llm", max_output_tokens=100)
    assert scopes.view("user:u-7").held == tether.Usage()
    with guard.start("t", scopes=("user:u-7",)) as run:
        run.begin_model_call(model="my-own-llm", max_output_tokens=100)
        run.record_model_call(model="my-own-llm", input_tokens=10, output_tokens=10)
    assert scopes.spent("user:u-7").model_calls == 1


def test_token_and_call_limits(store: Any, clock: Any) -> None:
    """max_tokens counts a reservation's prompt and max_tokens; max_model_calls counts calls."""
    scopes = tether.BudgetScopes(store, clock=clock)
    scopes.limit("team:a", max_tokens=2000 + 1500)  # one reply (1,500) + one reservation (2,000)
    scopes.limit("team:b", max_model_calls=3)
    guard = guard_of(scopes)
    assert work(guard, 9, ("team:a",)).usage.model_calls == 2
    b = work(guard, 9, ("team:b",))
    assert (b.status, b.usage.model_calls) == ("paused", 3)
    assert "max_model_calls" in b.detail


def test_a_rolling_window_gives_room_back(store: Any, clock: Any) -> None:
    """A scope with a window: what was spent leaves it once the window has passed."""
    scopes = tether.BudgetScopes(store, clock=clock)
    scopes.limit("tenant:acme", max_cost_usd=USED + RESERVED, window=3600)
    guard = guard_of(scopes)
    first = work(guard, 5, ("tenant:acme",))
    assert (first.status, first.usage.model_calls) == ("paused", 2)
    clock.advance(1800)
    assert scopes.spent("tenant:acme").model_calls == 2
    clock.advance(1900)  # past the window and its last slice
    assert scopes.spent("tenant:acme") == tether.Usage()
    assert first.checkpoint_id is not None
    run = guard.resume(first.checkpoint_id)
    with run:
        while run.proceed():
            one_call(run)
    assert run.outcome.usage.model_calls == 4  # two more in the new window


def test_a_reservation_never_settled_counts_as_spent_after_its_lease(
    store: Any, clock: Any
) -> None:
    """A process that died with a call in flight: after the lease its reservation counts as
    spent (its cost is unknown), never given back."""
    scopes = tether.BudgetScopes(store, clock=clock)
    scopes.limit("tenant:acme", max_cost_usd=1.0)
    run = guard_of(scopes).start("t", scopes=("tenant:acme",))
    run.begin_model_call(model=MODEL, estimated_input_tokens=1000, max_output_tokens=1000)
    assert scopes.view("tenant:acme").in_flight == 1
    clock.advance(601)
    view = scopes.view("tenant:acme")
    assert view.in_flight == 0 and view.spent.cost_usd == pytest.approx(RESERVED)


def test_a_failed_call_gives_its_reservation_back(store: Any, clock: Any) -> None:
    scopes = tether.BudgetScopes(store, clock=clock)
    scopes.limit("tenant:acme", max_cost_usd=1.0)
    with guard_of(scopes).start("t", scopes=("tenant:acme",)) as run:
        run.begin_model_call(model=MODEL, estimated_input_tokens=1000, max_output_tokens=1000)
        raise run.model_call_failed(ConnectionError("reset"))
    assert scopes.view("tenant:acme").held == tether.Usage()
    assert scopes.spent("tenant:acme") == tether.Usage()


def test_scope_names_are_checked() -> None:
    scopes = tether.BudgetScopes()
    with pytest.raises(TypeError, match="tuple of scope names"):
        tether.Guard(scopes=scopes).start("t", scopes="tenant:acme")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="has none"):
        tether.Guard().start("t", scopes=("tenant:acme",))
    with pytest.raises(ValueError, match="max_cost_usd"):
        scopes.limit("tenant:acme", max_cost_usd=-1)
    # a store that cannot hold scopes is refused, never a budget of this process alone
    with pytest.raises(TypeError, match="cannot hold budget scopes"):
        tether.BudgetScopes(tether.Checkpoints.memory())


def test_an_unreachable_redis_refuses_the_call(redis_url: str) -> None:
    """Fail closed: a scope that cannot be read sends no request."""
    store = RedisStore("redis://127.0.0.1:1/0", socket_timeout=0.2)
    scopes = tether.BudgetScopes(store)
    run = tether.Guard(scopes=scopes).start("t", scopes=("tenant:acme",))
    with run, pytest.raises(tether.StoreUnavailable, match="no request was sent"):
        run.begin_model_call(model=MODEL, estimated_input_tokens=10, max_output_tokens=10)
    store.close()


def _tenant_worker(
    url: str, prefix: str, runs: int, calls: int, out: Any, exact: bool = True
) -> None:
    """One process of the fleet (on Redis, or on PostgreSQL when ``url`` is a DSN: then
    ``prefix`` names its records' table): ``runs`` runs in tenant:acme, each up to ``calls`` calls
    whose replies use all of their max_tokens (exact: the reservation is the cost; else the
    request gives no max_tokens and the reservation holds its prompt alone)."""
    store: Any = (
        tether.Records.postgres(url, prefix)
        if tether.Records.is_dsn(url)
        else RedisStore(url, prefix=prefix)
    )
    scopes = tether.BudgetScopes(store)
    guard = tether.Guard(scopes=scopes)
    sent = 0
    for _ in range(runs):
        with guard.start("t", scopes=("tenant:acme",)) as run:
            while run.proceed() and run.model_calls < calls:
                run.begin_model_call(
                    model=MODEL,
                    estimated_input_tokens=1000,
                    max_output_tokens=1000 if exact else None,
                )
                sent += 1
                run.record_model_call(model=MODEL, input_tokens=1000, output_tokens=1000)
                run.progress()
    store.close()
    out.put(sent)


def test_two_processes_sharing_one_tenant_never_pass_its_limit(redis_url: str) -> None:
    """Two processes, four runs each, one tenant on Redis: with exact reservations the
    combined spend stops at the limit, every request counted once."""
    import multiprocessing

    prefix = f"tether-test-{uuid.uuid4().hex[:8]}"
    store = RedisStore(redis_url, prefix=prefix)
    scopes = tether.BudgetScopes(store)
    scopes.limit("tenant:acme", max_cost_usd=10.5 * RESERVED)  # room for 10 calls, not 11
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_tenant_worker, args=(redis_url, prefix, 4, 5, out)) for _ in range(2)
    ]
    for p in procs:
        p.start()
    sent = sum(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    try:
        spent = scopes.spent("tenant:acme")
        assert sent == spent.model_calls == 10  # 40 asked for; 10 fit; none past the limit
        assert spent.cost_usd == pytest.approx(10 * RESERVED)
        assert spent.cost_usd <= 10.5 * RESERVED
    finally:
        store.reset()
        store.close()


def test_two_processes_sharing_one_tenant_on_postgres_never_pass_its_limit(pg_dsn: str) -> None:
    """The same fleet on PostgreSQL (tether.Records): two processes, four runs each, one
    tenant; the combined spend stops at the limit, every request counted once."""
    import multiprocessing

    table = f"t_scopes_{uuid.uuid4().hex[:8]}"
    records = tether.Records.postgres(pg_dsn, table)
    scopes = tether.BudgetScopes(records)
    scopes.limit("tenant:acme", max_cost_usd=10.5 * RESERVED)  # room for 10 calls, not 11
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_tenant_worker, args=(pg_dsn, table, 4, 5, out)) for _ in range(2)]
    try:
        for p in procs:
            p.start()
        sent = [out.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        spent = scopes.spent("tenant:acme")
        assert sum(sent) == spent.model_calls == 10  # 40 asked for; 10 fit; none past it
        assert spent.cost_usd == pytest.approx(10 * RESERVED)
        assert scopes.view("tenant:acme").held == tether.Usage()
    finally:
        records.close()
        drop_tables(pg_dsn, table)


def test_two_records_on_one_database_share_a_scope(pg_dsn: str, tmp_path: Any) -> None:
    """Two Records objects on one database (PostgreSQL, a SQLite file) are one budget: what
    one spent the other sees, and refuses past the limit; not a budget per process."""
    table = f"t_scopes_{uuid.uuid4().hex[:8]}"
    pairs = [
        (tether.Records.postgres(pg_dsn, table), tether.Records.postgres(pg_dsn, table)),
        (
            tether.Records.sqlite(str(tmp_path / "s.db")),
            tether.Records.sqlite(str(tmp_path / "s.db")),
        ),
    ]
    try:
        for a, b in pairs:
            first, second = tether.BudgetScopes(a), tether.BudgetScopes(b)
            first.limit("tenant:acme", max_cost_usd=RESERVED)
            assert work(tether.Guard(scopes=first), 1, ("tenant:acme",)).status == "success"
            assert second.spent("tenant:acme").model_calls == 1
            outcome = work(guard_of(second), 1, ("tenant:acme",))
            assert outcome.stopped_because is StopReason.BUDGET_REACHED
            assert list(first.waiting("tenant:acme")) == [outcome.run_id]
            # one transaction to reserve a call in all of its scopes, one to settle it
            ops = a.scopes()
            with tether.Guard(scopes=first).start("t", scopes=("user:u-1", "team:t")) as run:
                before = ops.transactions
                run.begin_model_call(model=MODEL, estimated_input_tokens=10, max_output_tokens=10)
                assert ops.transactions == before + 1
                run.record_model_call(model=MODEL, input_tokens=10, output_tokens=10)
                assert ops.transactions == before + 2
                run.succeed("done")
            assert second.spent("team:t").model_calls == 1
    finally:
        for a, b in pairs:
            a.close()
            b.close()
        drop_tables(pg_dsn, table)


def test_a_database_gone_refuses_the_call(pg_dsn: str) -> None:
    """Fail closed: scopes on a PostgreSQL pool that can no longer be used send no request."""
    table = f"t_scopes_{uuid.uuid4().hex[:8]}"
    records = tether.Records.postgres(pg_dsn, table)
    scopes = tether.BudgetScopes(records)
    scopes.limit("tenant:acme", max_cost_usd=1.0)
    run = tether.Guard(scopes=scopes).start("t", scopes=("tenant:acme",))
    records.close()
    try:
        with run, pytest.raises(tether.StoreUnavailable, match="no request was sent"):
            run.begin_model_call(model=MODEL, estimated_input_tokens=10, max_output_tokens=10)
    finally:
        drop_tables(pg_dsn, table)


def test_two_processes_without_max_tokens_pass_it_by_one_call_per_run_at_most(
    redis_url: str,
) -> None:
    """The same fleet with requests that give no max_tokens (the reservation holds the
    prompt alone): the tenant's spend passes its limit by at most one call in flight per
    concurrent run (two processes, one run at a time each: two calls)."""
    import multiprocessing

    prefix = f"tether-test-{uuid.uuid4().hex[:8]}"
    store = RedisStore(redis_url, prefix=prefix)
    scopes = tether.BudgetScopes(store)
    limit = 10.5 * RESERVED
    scopes.limit("tenant:acme", max_cost_usd=limit)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_tenant_worker, args=(redis_url, prefix, 4, 5, out, False))
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    sent = sum(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    try:
        spent = scopes.spent("tenant:acme")
        assert sent == spent.model_calls
        assert limit < spent.cost_usd <= limit + 2 * RESERVED  # each reply costs RESERVED
    finally:
        store.reset()
        store.close()


def test_the_command_line_raises_a_limit_and_lists_the_waiting_runs(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """tether scopes set / list on the fleet's Redis: the paused run is listed, the raise
    keeps the limits not given, and the run resumes."""
    from tether.cli import main

    prefix = f"tether-test-{uuid.uuid4().hex[:8]}"
    store = RedisStore(redis_url, prefix=prefix)
    scopes = tether.BudgetScopes(store)
    where = ["--redis", redis_url, "--prefix", prefix]
    try:
        assert main(["scopes", "set", "tenant:acme", "--max-cost-usd", str(RESERVED), *where]) == 0
        assert main(["scopes", "set", "tenant:acme", "--max-model-calls", "9", *where]) == 0
        assert scopes.view("tenant:acme").limits == tether.stores._scopes.ScopeLimits(
            RESERVED, None, 9, None
        )
        guard = tether.Guard(scopes=scopes, checkpoints=tether.Checkpoints.memory())
        first = work(guard, 3, ("tenant:acme",))
        assert first.status == "paused" and first.checkpoint_id is not None
        capsys.readouterr()
        assert main(["scopes", "list", *where]) == 0
        listed = capsys.readouterr().out
        assert "tenant:acme" in listed and "1 calls" in listed
        assert main(["scopes", "set", "tenant:acme", "--max-cost-usd", "1", *where]) == 0
        said = capsys.readouterr().out
        assert "$1.0000, 9 calls" in said and first.checkpoint_id in said
        run = guard.resume(first.checkpoint_id)
        with run:
            while run.proceed():
                if run.model_calls >= 3:
                    run.succeed("done")
                    break
                one_call(run)
        assert run.outcome.status == "success"
        assert main(["scopes", "list", "--json", *where]) == 0
        (doc,) = json.loads(capsys.readouterr().out)
        assert (doc["name"], doc["spent"]["model_calls"], doc["waiting"]) == ("tenant:acme", 3, {})
    finally:
        store.reset()
        store.close()


def test_the_command_line_sets_and_lists_the_scopes_of_a_postgres_fleet(
    pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """tether scopes set / list --db DSN: the scopes a fleet keeps in its records database
    on PostgreSQL; the raise lists the paused run, which resumes."""
    from tether.cli import main

    table = f"t_scopes_{uuid.uuid4().hex[:8]}"
    records = tether.Records.postgres(pg_dsn, table)
    scopes = tether.BudgetScopes(records)
    name = "tenant:acme"
    where = ["--db", pg_dsn, "--table", table]
    try:
        assert main(["scopes", "set", name, "--max-cost-usd", str(RESERVED), *where]) == 0
        assert scopes.view(name).limits.max_cost_usd == RESERVED
        guard = tether.Guard(scopes=scopes, checkpoints=tether.Checkpoints.memory())
        first = work(guard, 3, (name,))
        assert first.status == "paused" and first.checkpoint_id is not None
        capsys.readouterr()
        assert main(["scopes", "list", "--json", *where]) == 0
        (doc,) = json.loads(capsys.readouterr().out)
        assert doc["spent"]["model_calls"] == 1
        assert doc["waiting"] == {first.run_id: first.checkpoint_id}
        assert main(["scopes", "set", name, "--max-cost-usd", "1", *where]) == 0
        assert first.checkpoint_id in capsys.readouterr().out
        run = guard.resume(first.checkpoint_id)
        with run:
            while run.proceed():
                if run.model_calls >= 3:
                    run.succeed("done")
                    break
                one_call(run)
        assert run.outcome.status == "success"
        assert scopes.spent(name).model_calls == 3
    finally:
        records.close()
        drop_tables(pg_dsn, table)


def test_run_agent_passes_its_scopes_through(store: Any, server: Any) -> None:
    """run_agent(..., scopes=...) over the real Anthropic SDK: the third request would pass
    the tenant's limit and is never sent; the run is paused, the two replies counted."""
    import anthropic

    from scripted_server import Reply
    from tether.integrations import anthropic as t_anthropic

    def tool_use(q: str) -> dict[str, Any]:
        return {"id": f"msg_{q}", "type": "message", "role": "assistant",
                "model": "claude-haiku-4-5", "stop_reason": "tool_use", "stop_sequence": None,
                "content": [{"type": "tool_use", "id": f"tu_{q}", "name": "search", "input": {"q": q}}],
                "usage": {"input_tokens": 100, "output_tokens": 20}}  # fmt: skip

    server.script = [
        Reply(200, tool_use("a")),
        Reply(200, tool_use("b")),
        Reply(200, tool_use("c")),
    ]
    scopes = tether.BudgetScopes(store)
    # max_tokens=1024 at $5/M reserves $0.00512; each reply costs $0.0002: room for two
    scopes.limit("tenant:acme", max_cost_usd=0.0055)
    guard = tether.Guard(scopes=scopes, checkpoints=tether.Checkpoints.memory())
    tool = tether.Tool("search", lambda q: f"found {q}", input_schema={"type": "object"})
    with anthropic.Anthropic(api_key="test", base_url=server.url) as raw:
        outcome = t_anthropic.run_agent(raw, model="claude-haiku-4-5", guard=guard, tools=[tool],
                                        messages=[{"role": "user", "content": "find it"}],
                                        max_tokens=1024, scopes=("tenant:acme",))  # fmt: skip
    assert (outcome.status, outcome.stopped_because) == ("paused", StopReason.BUDGET_REACHED)
    assert len(server.requests) == 2
    assert scopes.spent("tenant:acme").model_calls == 2
    assert scopes.spent("tenant:acme").cost_usd == pytest.approx(0.0004)


def test_the_tenants_scenario_of_the_bench() -> None:
    """tether bench --suite fleet --scenario tenants: exact reservations never pass a
    tenant's limit; without max_tokens at most one call in flight per run; a per-run budget
    and an after-the-call check pass it; the other tenants finish; paused runs resume."""
    from tether import bench

    cells = bench.run(["fleet"], scenarios=["tenants"], workers=1)["suites"]["fleet"]["tenants"]
    p = cells["policies"]
    assert p["tether"]["max_overspend_usd"] == 0.0 and p["tether"]["low_tenants_over"] == 0
    assert p["tether-no-max-tokens"]["within_one_call_per_run"]
    assert p["per-run-budget"]["low_tenants_over"] == p["per-run-budget"]["low_tenants"]
    assert p["after-the-call"]["max_overspend_usd"] > p["tether"]["max_overspend_usd"]
    for name, cell in p.items():
        assert cell["other_tenants_runs_completed"] == 1.0, name
    assert p["tether"]["paused_runs"] == p["tether"]["resumed_completed"] > 0


@pytest.mark.parametrize("scenario", ["tenants-redis", "tenants-postgres"])
def test_the_tenants_scenario_on_a_fleets_store(scenario: str, redis_url: str, pg_dsn: str) -> None:
    """The same scenario with the scopes in real Redis or PostgreSQL (the tether policies):
    the same overspend as in memory, every paused run resumed, and the time per call."""
    from tether import bench

    fleet = bench.run(["fleet"], scenarios=["tenants", scenario], workers=1)["suites"]["fleet"]
    here, there = fleet["tenants"]["policies"], fleet[scenario]["policies"]
    assert set(there) == {"tether", "tether-no-max-tokens"}
    for policy, cell in there.items():
        assert cell["store"] == scenario.removeprefix("tenants-")
        assert cell["max_overspend_usd"] == pytest.approx(here[policy]["max_overspend_usd"])
        assert cell["paused_runs"] == cell["resumed_completed"] > 0
        assert cell["other_tenants_runs_completed"] == 1.0
        assert cell["ms_per_call"] > 0


def test_the_agents_sdk_run_passes_its_scopes_through() -> None:
    """openai_agents.run_sync(..., scopes=...): the tenant's spent scope pauses the run
    before the next request (no max_tokens: the reservation holds the prompt alone, so the
    call that passes the limit is the last one sent)."""
    from agents import Agent, function_tool, set_tracing_disabled
    from agents.testing import ScriptedModel, function_call
    from agents.usage import Usage as SdkUsage

    from tether.integrations import openai_agents as ta_agents

    set_tracing_disabled(True)

    class Priced(ScriptedModel):
        model = "scripted-model"

    @function_tool
    def page(n: int) -> str:
        """Read a page."""
        return f"page {n}"

    usage = SdkUsage(requests=1, input_tokens=1000, output_tokens=100, total_tokens=1100)
    steps = [[function_call("page", {"n": i}, call_id=f"call_{i}")] for i in range(6)]
    scripted = Priced(steps, default_usage=usage)
    scopes = tether.BudgetScopes()
    scopes.limit("tenant:acme", max_cost_usd=0.025)  # $0.01 a call
    guard = tether.Guard(
        scopes=scopes,
        loops=tether.LoopPolicy(max_repeats=None),
        prices=tether.PriceTable({"scripted-model": tether.Price(input=10.0, output=0.0)}),
        checkpoints=tether.Checkpoints.memory(),
    )
    agent = Agent(name="reader", model=scripted, tools=[page])
    outcome = ta_agents.run_sync(agent, "read", guard=guard, scopes=("tenant:acme",))
    assert (outcome.status, outcome.stopped_because) == ("paused", StopReason.BUDGET_REACHED)
    assert outcome.usage.model_calls == 3 and scripted.remaining_steps == 3
    assert scopes.spent("tenant:acme").cost_usd == pytest.approx(0.03)


def test_the_langchain_middleware_passes_its_scopes_through() -> None:
    """TetherMiddleware(guard, scopes=...): the run of each turn spends in the tenant's
    scope (restored at every hook from its snapshot), and pauses when it is spent."""
    import itertools

    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    from tether.integrations.langchain import TetherMiddleware

    class FakeToolModel(GenericFakeChatModel):
        model_name: str = "fake-model"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    def pages() -> Iterator[AIMessage]:
        for i in itertools.count():
            yield AIMessage(content="", tool_calls=[{"name": "page", "args": {"n": i}, "id": f"c{i}"}],
                            usage_metadata={"input_tokens": 1000, "output_tokens": 0, "total_tokens": 1000})  # fmt: skip

    @tool
    def page(n: int) -> str:
        """Read a page."""
        return f"page {n}"

    scopes = tether.BudgetScopes()
    scopes.limit("tenant:acme", max_model_calls=3)
    guard = tether.Guard(
        scopes=scopes,
        prices=tether.PriceTable({"fake-model": tether.Price(input=10.0, output=0.0)}),
        loops=tether.LoopPolicy(max_repeats=None),
        checkpoints=tether.Checkpoints.memory(),
    )
    middleware = TetherMiddleware(guard, scopes=("tenant:acme",))
    agent = create_agent(FakeToolModel(messages=pages()), tools=[page], middleware=[middleware])
    outcome = agent.invoke({"messages": [("user", "read")]})["tether_outcome"]
    assert (outcome.status, outcome.stopped_because) == ("paused", StopReason.BUDGET_REACHED)
    assert outcome.usage.model_calls == 3
    assert scopes.spent("tenant:acme").model_calls == 3
    assert scopes.spent("tenant:acme").cost_usd == pytest.approx(0.03)


def test_pydantic_ai_run_passes_its_scopes_through() -> None:
    """pydantic_ai.run_sync(..., scopes=...): the 4th request of a run over the tenant's
    3-call limit is never sent; the run is paused."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.usage import RequestUsage

    from tether.integrations import pydantic_ai as ta_pydantic

    sent: list[int] = []

    def respond(messages: list[Any], info: AgentInfo) -> ModelResponse:
        sent.append(1)
        part = ToolCallPart("page", {"n": len(sent)}, tool_call_id=f"call_{len(sent)}")
        return ModelResponse(parts=[part], usage=RequestUsage(input_tokens=1000, output_tokens=0))

    agent: Agent[None, Any] = Agent(FunctionModel(respond, model_name="scripted-model"))

    @agent.tool_plain
    def page(n: int) -> str:
        """Read a page."""
        return f"page {n}"

    scopes = tether.BudgetScopes()
    scopes.limit("tenant:acme", max_model_calls=3)
    guard = tether.Guard(
        scopes=scopes,
        prices=tether.PriceTable({"scripted-model": tether.Price(input=10.0, output=0.0)}),
        loops=tether.LoopPolicy(max_repeats=None),
        checkpoints=tether.Checkpoints.memory(),
    )
    outcome = ta_pydantic.run_sync(agent, "read", guard=guard, scopes=("tenant:acme",))
    assert (outcome.status, outcome.stopped_because) == ("paused", StopReason.BUDGET_REACHED)
    assert len(sent) == 3 and scopes.spent("tenant:acme").model_calls == 3


def test_a_model_call_event_names_its_scopes(otel: Any) -> None:
    """OpenTelemetry: the model call's event carries the scopes it was counted in."""
    exporter, _ = otel
    scopes = tether.BudgetScopes()
    with tether.Guard(scopes=scopes).start("t", scopes=("tenant:acme", "user:u-7")) as run:
        run.proceed()
        one_call(run)
        run.succeed()
    events = [e for s in exporter.get_finished_spans() for e in s.events
              if e.name == "gen_ai.client.inference"]  # fmt: skip
    assert [tuple(e.attributes["tether.scopes"]) for e in events] == [("tenant:acme", "user:u-7")]


def test_the_operator_page_shows_each_scopes_spend_limit_and_waiting_runs(
    redis_url: str, tmp_path: Any
) -> None:
    """tether serve --redis: /scopes lists each scope with its spend against its limit and
    the runs paused on it (linked to their pages); without --redis, the scopes kept in the
    records database."""
    from starlette.testclient import TestClient

    from tether.serve import create_app

    prefix = f"tether-test-{uuid.uuid4().hex[:8]}"
    store = RedisStore(redis_url, prefix=prefix)
    records = tether.Records.sqlite(str(tmp_path / "records.db"))
    try:
        scopes = tether.BudgetScopes(store)
        scopes.limit("tenant:acme", max_cost_usd=RESERVED, window=3600)
        guard = tether.Guard(scopes=scopes, records=records)
        outcome = work(guard, 3, ("tenant:acme", "user:u-7"))
        assert outcome.status == "paused"
        base = "http://127.0.0.1:8765"
        page = TestClient(create_app(records, redis=store), base_url=base).get("/scopes").text
        assert "tenant:acme" in page and "user:u-7" in page
        assert f"${USED:.4f} of ${RESERVED:.4f}" in page and "3600.0 s" in page
        assert f'href="/runs/{outcome.run_id}"' in page
        alone = TestClient(create_app(records), base_url=base).get("/scopes").text
        assert "--redis" in alone and "No budget scope in this store yet" in alone
        # without Redis: the scopes kept in the records database itself
        kept = tether.BudgetScopes(records)
        kept.limit("tenant:own", max_cost_usd=RESERVED)
        paused = work(tether.Guard(scopes=kept, records=records), 3, ("tenant:own",))
        assert paused.status == "paused"
        alone = TestClient(create_app(records), base_url=base).get("/scopes").text
        assert "tenant:own" in alone and "tenant:acme" not in alone
        assert f"${USED:.4f} of ${RESERVED:.4f}" in alone
        assert f'href="/runs/{paused.run_id}"' in alone
    finally:
        records.close()
        store.reset()
        store.close()


# --- a scope near its limit yields in the fleet's token budget ----------------------------


def race(budget: tether.TokenBudget, clock: tether.VirtualClock, plans: dict[str, Any]) -> dict:
    """Drive token reservations together on virtual time (each pause a timer, each ask a
    round trip to the budget's store); when each one's call goes out."""
    import heapq

    from tether._sansio import Call

    timers = [(clock.now(), i, name) for i, name in enumerate(plans)]
    started: set[str] = set()
    out: dict[str, float] = {}
    order = len(timers)
    while timers:
        at, _, name = heapq.heappop(timers)
        clock.advance(at - clock.now())
        plan = plans[name]
        try:
            step = plan.send(None) if name in started else next(plan)
            started.add(name)
            while isinstance(step, Call):
                step = plan.send(step.fn(*step.args))
        except StopIteration:
            out[name] = clock.now()
            continue
        order += 1
        heapq.heappush(timers, (clock.now() + step.seconds, order, name))
    return out


@pytest.mark.parametrize("drive", ["sync", "async"])
def test_a_tenant_near_its_limit_yields_to_others_in_the_token_budget(
    store: Any, clock: Any, drive: str
) -> None:
    """Four runs ask a busy fleet token budget for a place at once; the first to ask is of a
    tenant that has spent nearly all its limit: its call goes out after the other tenants'
    (it used to go first: its priority was a run's like any other)."""
    from tether.guards._tokens import reserve_plan

    scopes = tether.BudgetScopes(store, clock=clock)
    scopes.limit("tenant:near", max_cost_usd=10 * USED + RESERVED + 1e-6)
    scopes.limit("tenant:far", max_cost_usd=100.0)
    guard = guard_of(scopes)
    assert work(guard, 10, ("tenant:near",)).status == "success"
    budget = tether.TokenBudget("openai", "gpt-4o", store=MemoryStore(), clock=clock,
                                requests_per_minute=10_000, tokens_per_minute=6_000)  # fmt: skip
    probe = budget.reserve(estimated_input_tokens=0, max_output_tokens=0)
    budget.settle(probe, input_tokens=0, output_tokens=0, status=200)
    budget.reserve(estimated_input_tokens=0, max_output_tokens=6_000)  # the bucket is spent
    runs = {n: guard.start("answer", scopes=(f"tenant:{n.rstrip('0123')}",))
            for n in ("near", "far1", "far2", "far3")}  # fmt: skip
    if drive == "sync":
        for run in runs.values():
            run.begin_model_call(model=MODEL, estimated_input_tokens=1000, max_output_tokens=1000)
    else:

        async def begin() -> None:
            for run in runs.values():
                await run.abegin_model_call(
                    model=MODEL, estimated_input_tokens=1000, max_output_tokens=1000
                )
            if hasattr(store, "aclose"):
                await store.aclose()  # the asyncio client this loop made

        asyncio.run(begin())
    plans = {n: reserve_plan(budget, 1000, 1000, None, run.urgency) for n, run in runs.items()}
    assert runs["near"].urgency < 0 <= runs["far1"].urgency
    out = race(budget, clock, plans)
    assert out["near"] > max(out["far1"], out["far2"], out["far3"]), out
    for run in runs.values():
        run.record_model_call(model=MODEL, input_tokens=1000, output_tokens=500)
        run.succeed("done")
