"""The state machines' tables, run through the memory store and the Redis store alike.

Each table is a list of steps: a store operation on one name, its arguments, and the
answer the state machines of ``tether.stores._logic`` give. The same table runs through
``MemoryStore`` (the Python functions) and ``RedisStore`` (their Lua twins on a real
server), through the sync operations and the async ones, and must give the same answers.
The tables are built from the constants of ``_logic`` (``OUTAGE_FAILURES``, ...) at the
boundaries those constants decide, so a number written into a Lua script instead of
substituted from Python fails here; the tables are also run with the constants changed,
which only passes while the scripts take their numbers from Python.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tether.stores import MemoryStore, RedisStore
from tether.stores import _logic as logic
from tether.stores._base import async_ops
from tether.stores._logic import BreakerConfig, LimiterConfig
from tether.stores.redis import _connection, _scripts

#: a step's expected answer that a Redis store may give differently by design: a
#: limiter's success is deferred to the next request, which answers the rate it had
DEFERRED = object()

Step = tuple[str, tuple[Any, ...], Any]
T0 = 1_000_000.0  # a wall-clock time: the stores keep times as seconds since the epoch


def _breaker_cfg(**kw: Any) -> BreakerConfig:
    base: dict[str, Any] = {
        "failure_threshold": 3,
        "cooldown": 10.0,
        "half_open_max_calls": 2,
        "window": 0,
        "min_calls": 0,
        "failure_rate": 0.0,
        "probe_interval": 0.0,
    }
    return BreakerConfig(**{**base, **kw})


def _limiter_cfg(**kw: Any) -> LimiterConfig:
    base: dict[str, Any] = {
        "initial_rate": 50.0,
        "min_rate": 1.0,
        "max_rate": 1000.0,
        "burst": 1.0,
        "horizon": 0.5,
        "beta": 0.5,
        "increase": 0.0,
        "decrease_interval": 0.0,
    }
    return LimiterConfig(**{**base, **kw})


# --- the tables --------------------------------------------------------------------------


def breaker_trips_and_recovers() -> list[Step]:
    """Closed, tripped by consecutive failures, open, half-open with slow-start probes, closed."""
    cfg = _breaker_cfg()
    ask_again = min(logic.PROBE_ASK_AGAIN, cfg.cooldown)
    opened = T0 + 1 + cfg.cooldown
    return [
        ("breaker_acquire", (T0, cfg), ("closed", "closed", 0.0, "call")),
        ("breaker_record", (T0, "call", True, cfg), ("closed", "closed", 0.0)),
        ("breaker_record", (T0, "call", False, cfg), ("closed", "closed", 0.0)),  # resets
        ("breaker_record", (T0, "call", True, cfg), ("closed", "closed", 0.0)),
        ("breaker_record", (T0, "call", True, cfg), ("closed", "closed", 0.0)),
        ("breaker_record", (T0 + 1, "call", True, cfg), ("closed", "open", opened)),
        ("breaker_acquire", (T0 + 2, cfg), ("open", "open", opened, "deny")),
        ("breaker_state", (T0 + 2,), ("open", opened)),
        ("breaker_state", (opened,), ("half_open", opened)),
        ("breaker_acquire", (opened, cfg), ("open", "half_open", 0.0, "probe")),
        # one probe in flight: the others are told to ask again soon, not after a cooldown
        ("breaker_acquire", (opened, cfg), ("half_open", "half_open", opened + ask_again, "deny")),
        ("breaker_record", (opened + 0.5, "probe", False, cfg), ("half_open", "half_open", opened)),
        # a probe succeeded: two may be in flight now, but only half_open_max_calls (2)
        # probes in all: one more
        ("breaker_acquire", (opened + 0.5, cfg), ("half_open", "half_open", 0.0, "probe")),
        (
            "breaker_acquire",
            (opened + 0.5, cfg),
            ("half_open", "half_open", opened + 0.5 + ask_again, "deny"),
        ),
        # closed: a retry_at is 0 again (the same in both stores, whatever the permit)
        ("breaker_record", (opened + 1, "probe", False, cfg), ("half_open", "closed", 0.0)),
        ("breaker_state", (opened + 1,), ("closed", 0.0)),
        ("breaker_acquire", (opened + 1, cfg), ("closed", "closed", 0.0, "call")),
        # a probe's answer that comes after the breaker closed: nothing moves
        ("breaker_record", (opened + 1, "probe", False, cfg), ("closed", "closed", 0.0)),
    ]


def breaker_failed_probe_reopens() -> list[Step]:
    """A failed probe opens the breaker again for a full cooldown (no adaptive probing)."""
    cfg = _breaker_cfg(failure_threshold=1, half_open_max_calls=1)
    opened = T0 + cfg.cooldown
    return [
        ("breaker_record", (T0, "call", True, cfg), ("closed", "open", opened)),
        ("breaker_acquire", (opened, cfg), ("open", "half_open", 0.0, "probe")),
        (
            "breaker_record",
            (opened + 2, "probe", True, cfg),
            ("half_open", "open", opened + 2 + cfg.cooldown),
        ),
        ("breaker_acquire", (opened + 3, cfg), ("open", "open", opened + 2 + cfg.cooldown, "deny")),
        # a probe whose caller vanished is given up after a cooldown: a new one goes out
        ("breaker_acquire", (opened + 2 + cfg.cooldown, cfg), ("open", "half_open", 0.0, "probe")),
        (
            "breaker_acquire",
            (opened + 2 + 2 * cfg.cooldown, cfg),
            ("half_open", "half_open", 0.0, "probe"),
        ),
        (
            "breaker_record",
            (opened + 2 + 2 * cfg.cooldown, "probe", False, cfg),
            ("half_open", "closed", 0.0),
        ),
    ]


def breaker_probes_follow_the_outage() -> list[Step]:
    """Adaptive probing: the first probe after ``probe_interval``, then waits that grow by at
    most PROBE_GROWTH and at most PROBE_SHARE of the time open, never over the cooldown."""
    cfg = _breaker_cfg(
        failure_threshold=1, half_open_max_calls=1, cooldown=60.0, probe_interval=1.0
    )
    steps: list[Step] = []
    now, wait = T0, cfg.probe_interval
    steps.append(("breaker_record", (now, "call", True, cfg), ("closed", "open", now + wait)))
    opened_at = now
    while wait < cfg.cooldown and len(steps) < 200:
        now += wait
        steps.append(("breaker_acquire", (now, cfg), ("open", "half_open", 0.0, "probe")))
        grown = max(cfg.probe_interval, logic.PROBE_SHARE * (now - opened_at))
        wait = min(cfg.cooldown, logic.PROBE_GROWTH * max(wait, cfg.probe_interval), grown)
        steps.append(
            ("breaker_record", (now, "probe", True, cfg), ("half_open", "open", now + wait))
        )
    assert wait == cfg.cooldown  # the table reaches the cooldown
    now += wait
    steps.append(("breaker_acquire", (now, cfg), ("open", "half_open", 0.0, "probe")))
    steps.append(
        ("breaker_record", (now, "probe", True, cfg), ("half_open", "open", now + cfg.cooldown))
    )
    return steps


def breaker_probe_wait_at_most_grows() -> list[Step]:
    """A probe that fails long after the trip: its wait grows by PROBE_GROWTH at most, however
    long the breaker has been open."""
    cfg = _breaker_cfg(
        failure_threshold=1, half_open_max_calls=1, cooldown=60.0, probe_interval=1.0
    )
    late = T0 + 100.0
    wait = min(cfg.cooldown, logic.PROBE_GROWTH * cfg.probe_interval, logic.PROBE_SHARE * 100.0)
    return [
        ("breaker_record", (T0, "call", True, cfg), ("closed", "open", T0 + cfg.probe_interval)),
        ("breaker_acquire", (late, cfg), ("open", "half_open", 0.0, "probe")),
        ("breaker_record", (late, "probe", True, cfg), ("half_open", "open", late + wait)),
    ]


def breaker_failure_rate_window() -> list[Step]:
    """The failure-rate rule: a window of calls with enough failures trips the breaker."""
    cfg = _breaker_cfg(failure_threshold=100, window=4, min_calls=4, failure_rate=0.5)
    steps: list[Step] = [
        ("breaker_record", (T0, "call", True, cfg), ("closed", "closed", 0.0)),
        ("breaker_record", (T0, "call", False, cfg), ("closed", "closed", 0.0)),
        ("breaker_record", (T0, "call", False, cfg), ("closed", "closed", 0.0)),
        ("breaker_record", (T0, "call", False, cfg), ("closed", "closed", 0.0)),  # 1 in 4
        ("breaker_record", (T0, "call", True, cfg), ("closed", "closed", 0.0)),  # 1 in 4 (slid)
        (
            "breaker_record",
            (T0, "call", True, cfg),
            ("closed", "open", T0 + cfg.cooldown),
        ),  # 2 in 4
    ]
    return steps


def budget_spend_and_refund() -> list[Step]:
    """A token bucket: spends while it holds enough, refunds up to its capacity."""
    return [
        ("budget_tokens", (10.0,), 10.0),
        ("budget_spend", (10.0, 4.0), (True, 6.0)),
        ("budget_spend", (10.0, 4.0), (True, 2.0)),
        ("budget_spend", (10.0, 4.0), (False, 2.0)),
        ("budget_tokens", (10.0,), 2.0),
        ("budget_refund", (10.0, 0.5), 2.5),
        ("budget_spend", (10.0, 2.5), (True, 0.0)),
        ("budget_refund", (10.0, 7.0), 7.0),
        ("budget_refund", (10.0, 7.0), 10.0),  # never above capacity
    ]


def limiter_outage_cuts_the_rate() -> list[Step]:
    """Plain failures cut the rate only as an outage: OUTAGE_FAILURES failures, and at least
    OUTAGE_RATIO for every success since the last cut."""
    cfg = _limiter_cfg()
    oks = 3
    steps: list[Step] = [("limiter_feedback", (T0, "ok", cfg), DEFERRED) for _ in range(oks)]
    rate = cfg.initial_rate + oks * logic.RATE_STEP  # slow start: one more per success
    cut_at = max(logic.OUTAGE_FAILURES, logic.OUTAGE_RATIO * oks)
    for failures in range(1, cut_at):
        if logic.BROWNOUT_RATIO * oks >= failures:  # still a brownout: slow start goes on
            rate += logic.RATE_STEP
        steps.append(("limiter_feedback", (T0, "failed", cfg), rate))
    rate *= cfg.beta
    steps.append(("limiter_feedback", (T0, "failed", cfg), rate))
    # with no success since the cut, OUTAGE_FAILURES failures are the next outage
    for _ in range(logic.OUTAGE_FAILURES - 1):
        steps.append(("limiter_feedback", (T0, "failed", cfg), rate))
    steps.append(("limiter_feedback", (T0, "failed", cfg), rate * cfg.beta))
    return steps


def limiter_throttles_and_grows() -> list[Step]:
    """A throttle cuts at once, at most once per decrease_interval; growth is additive above
    the slow-start threshold (the rate a throttle cut to)."""
    cfg = _limiter_cfg(decrease_interval=1.0, increase=0.1)
    rate = (cfg.initial_rate + logic.RATE_STEP) * cfg.beta
    above = rate + max(logic.RATE_STEP, cfg.increase * rate) / rate
    return [
        ("limiter_feedback", (T0, "ok", cfg), DEFERRED),
        ("limiter_feedback", (T0, "throttled", cfg), rate),  # the first cut: NEVER was long ago
        ("limiter_feedback", (T0 + 0.5, "throttled", cfg), rate),  # within decrease_interval
        ("limiter_feedback", (T0 + 0.5, "ok", cfg), DEFERRED),
        ("limiter_feedback", (T0 + 0.5, "failed", cfg), above),  # congestion avoidance
    ]


def limiter_admits_and_queues() -> list[Step]:
    """GCRA slots at the rate, at most ``horizon`` ahead; callers turned away queue up, each
    told to come back at its turn, at most QUEUE_WAIT_CAP later. (Each comes back when told:
    a Redis store turns this process's other callers away until then without asking.)"""
    cfg = _limiter_cfg(initial_rate=0.5, min_rate=0.1, horizon=1.0)
    interval, cap = 1.0 / cfg.initial_rate, logic.QUEUE_WAIT_CAP
    first_wait = interval - 0.5 - cfg.horizon + min(interval, cap)  # the first one queued
    back = T0 + 0.5 + first_wait  # when it is back: its slot is free (the rate is 1 per 2 s)
    # the second one queued: the first was served meanwhile, at the rate
    queued = 1.0 + max(0.0, 1.0 - first_wait * cfg.initial_rate)
    second_wait = interval - cfg.horizon + min(queued * interval, cap)
    return [
        ("limiter_acquire", (T0, cfg), (0.0, True)),
        ("limiter_acquire", (T0 + 0.5, cfg), (first_wait, False)),
        ("limiter_acquire", (back, cfg), (0.0, True)),
        ("limiter_acquire", (back, cfg), (second_wait, False)),
        ("limiter_acquire", (back + second_wait, cfg), (0.0, True)),
    ]


TABLES: dict[str, Callable[[], list[Step]]] = {
    f.__name__: f
    for f in (
        breaker_trips_and_recovers,
        breaker_failed_probe_reopens,
        breaker_probes_follow_the_outage,
        breaker_probe_wait_at_most_grows,
        breaker_failure_rate_window,
        budget_spend_and_refund,
        limiter_outage_cuts_the_rate,
        limiter_throttles_and_grows,
        limiter_admits_and_queues,
    )
}


# --- the runner --------------------------------------------------------------------------


def _closed_port() -> int:
    """A port of this machine that nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(params=["memory", "redis", "redis-down"])
def make_store(request: pytest.FixtureRequest) -> Iterator[Callable[[], Any]]:
    """Makes a fresh store of one kind: memory; Redis (on the callers' clock, no cache); or
    a Redis store whose server is away, answering from its fallback (our store failing)."""
    made: list[Any] = []

    def make() -> Any:
        prefix = f"tether-tables-{uuid.uuid4().hex[:8]}"
        if request.param == "memory":
            store: Any = MemoryStore()
        elif request.param == "redis":
            url = request.getfixturevalue("redis_url")
            store = RedisStore(url, prefix=prefix, cache_ttl=0.0, server_time=False)
        else:
            url = f"redis://127.0.0.1:{_closed_port()}/0"
            store = RedisStore(
                url, prefix=prefix, cache_ttl=0.0, server_time=False, socket_timeout=0.2
            )
        made.append(store)
        return store

    yield make
    for store in made:
        if isinstance(store, RedisStore):
            # every answer came from Redis, or (its server away) every one from the fallback
            assert store.degraded == (request.param == "redis-down")
            store.reset()
            store.close()


def run_sync(store: Any, steps: list[Step]) -> list[Any]:
    return [getattr(store, op)("t", *args) for op, args, _ in steps]


def run_async(store: Any, steps: list[Step]) -> list[Any]:
    """The same steps through the async operations (``RetryPolicy.acall``'s view)."""
    ops = async_ops(store)

    async def main() -> list[Any]:
        answers = []
        for op, args, _ in steps:
            if op in ("breaker_state", "budget_tokens"):  # read-only: no async twin
                answers.append(getattr(store, op)("t", *args))
            else:
                answers.append(await getattr(ops, "a" + op)("t", *args))
        if isinstance(store, RedisStore):
            await store.aclose()  # the asyncio client belongs to this event loop
        return answers

    return asyncio.run(main())


def expected(steps: list[Step], answers: list[Any]) -> list[Any]:
    """The table's answers, each float as pytest.approx; a DEFERRED step takes the answer."""
    out: list[Any] = []
    for (_, _, want), got in zip(steps, answers, strict=True):
        if want is DEFERRED:
            out.append(got)
        elif isinstance(want, tuple):
            out.append(
                tuple(pytest.approx(w, rel=1e-12) if isinstance(w, float) else w for w in want)
            )
        else:
            out.append(pytest.approx(want, rel=1e-12))
    return out


@pytest.mark.parametrize("table", sorted(TABLES))
@pytest.mark.parametrize("shell", ["sync", "async"])
def test_table(table: str, shell: str, make_store: Callable[[], Any]) -> None:
    """Every store gives the table's answers, step by step, through both shells."""
    steps = TABLES[table]()
    answers = (run_sync if shell == "sync" else run_async)(make_store(), steps)
    assert answers == expected(steps, answers)


#: other values for the constants: the tables are rebuilt from them and run again
CHANGED = {
    "OUTAGE_FAILURES": 5,
    "OUTAGE_RATIO": 2,
    "BROWNOUT_RATIO": 1,
    "RATE_STEP": 2.0,
    "QUEUE_WAIT_CAP": 3.5,
    "PROBE_SHARE": 0.3,
    "PROBE_GROWTH": 1.5,
    "PROBE_ASK_AGAIN": 0.25,
}


@pytest.fixture
def changed_constants(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_logic``'s constants changed, and the Redis store's scripts rendered from them."""
    for name, value in CHANGED.items():
        monkeypatch.setattr(logic, name, value)
    monkeypatch.setattr(_connection, "SCRIPTS", _scripts.rendered())


@pytest.mark.usefixtures("changed_constants")
@pytest.mark.parametrize("table", sorted(TABLES))
def test_table_with_other_constants(table: str, make_store: Callable[[], Any]) -> None:
    """The scripts take their numbers from Python: change one there and Redis follows."""
    steps = TABLES[table]()
    answers = run_sync(make_store(), steps)
    assert answers == expected(steps, answers)


def test_every_constant_is_used_by_a_script(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each substituted constant appears in some script, and no ``${`` is left unrendered."""
    assert not [name for name, src in _scripts.SCRIPTS.items() if "${" in src]
    unused = []
    for name in _scripts.CONSTANTS:
        with monkeypatch.context() as m:
            m.setattr(logic, name, 12345.5)
            if _scripts.rendered() == _scripts.SCRIPTS:
                unused.append(name)
    assert unused == []
    assert set(CHANGED) | {"NEVER"} == set(_scripts.CONSTANTS)


def test_an_unknown_constant_in_a_script_is_refused() -> None:
    """A script naming a constant _logic does not export fails to render (at import)."""
    with pytest.raises(KeyError, match="OUTAGE_FAILUES"):
        _scripts.render("return ${OUTAGE_FAILUES}")
