"""One model turn (``run.model_turn`` / ``run.amodel_turn``): checks, one price, reservations,
breaker wait, retries within the run's time, usage, settlement and the failure stop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from tether import (
    Budget,
    BudgetScopes,
    CircuitOpenError,
    Guard,
    PriceTable,
    RequestUsage,
    RetryPolicy,
    Run,
    Stopped,
    StopReason,
    UnknownModelError,
    VirtualClock,
)

MODEL = "claude-sonnet-5-5"


class CountedPrices(PriceTable):
    """The guard's prices, with the lookups counted."""

    def __init__(self) -> None:
        super().__init__()
        self.lookups = 0

    def cost(self, *args: Any, **kwargs: Any) -> float | None:
        self.lookups += 1
        return super().cost(*args, **kwargs)


def _guard(clock: VirtualClock, **kw: Any) -> Guard:
    kw.setdefault("retry", RetryPolicy(max_attempts=3, base=0.5, cap=1.0, jitter="none"))
    return Guard(clock=clock, **kw)


def _drive(shell: str, run: Run, body: Callable[[Any], Any], **turn: Any) -> Any:
    """``body(call)`` inside one model turn, through the sync or the async shell; ``call``
    sends a request of the body's through ``turn.call`` / ``turn.acall``."""
    if shell == "sync":
        with run.model_turn(**turn) as t:
            return body(lambda fn, **kw: t.call(fn, **kw), t)

    async def main() -> Any:
        async with run.amodel_turn(**turn) as t:

            async def acall(fn: Callable[[], Any], **kw: Any) -> Any:
                async def afn() -> Any:
                    return fn()

                return await t.acall(afn, **kw)

            out = body(acall, t)
            return await out if asyncio.iscoroutine(out) else out

    return asyncio.run(main())


def _flaky(fails: int, reply: str = "ok") -> Callable[[], str]:
    left = [fails]

    def call() -> str:
        if left[0]:
            left[0] -= 1
            raise ConnectionError("reset")
        return reply

    return call


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_turn_retries_within_the_run_counts_its_usage_and_settles(shell: str) -> None:
    """Two retries, then an answer: counted once, priced, the retries in the usage."""
    clock = VirtualClock()
    scopes = BudgetScopes(clock=clock)
    scopes.limit("tenant:a", max_cost_usd=1.0)
    guard = _guard(clock, budget=Budget(max_cost_usd=1.0, max_seconds=60), scopes=scopes)
    policy = guard.retry.replace(name="model", clock=clock)
    with guard.start(scopes=("tenant:a",)) as run:

        def body(call: Any, turn: Any) -> Any:
            async def go() -> Any:
                reply = await call(_flaky(2), policy=policy)
                return reply, turn.record(RequestUsage(1000, 200, model=MODEL))

            if shell == "async":
                return go()
            reply = call(_flaky(2), policy=policy)
            return reply, turn.record(RequestUsage(1000, 200, model=MODEL))

        reply, cost = _drive(shell, run, body, model=MODEL, estimate=1000, max_output=500)
        assert reply == "ok"
        usage = run.usage()
        assert (usage.model_calls, usage.retries, usage.input_tokens) == (1, 2, 1000)
        assert cost is not None and cost > 0 and usage.cost_usd == pytest.approx(cost)
    spent = scopes.spent("tenant:a")
    assert (spent.model_calls, spent.cost_usd) == (1, pytest.approx(cost))


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_turn_prices_its_request_once_for_the_cost_budget_and_the_scopes(shell: str) -> None:
    """Under a cost budget and budget scopes, the request's worst case is looked up once
    (it was priced twice: by the cost check and by the scopes' reservation)."""
    clock = VirtualClock()
    prices = CountedPrices()
    scopes = BudgetScopes(clock=clock)
    scopes.limit("tenant:a", max_cost_usd=1.0)
    guard = _guard(clock, budget=Budget(max_cost_usd=1.0), scopes=scopes, prices=prices)
    with guard.start(scopes=("tenant:a",)) as run:
        before = prices.lookups

        def body(call: Any, turn: Any) -> Any:
            assert prices.lookups - before == 1
            turn.record(RequestUsage(10, 10, model=MODEL))

        _drive(shell, run, body, model=MODEL, estimate=1000, max_output=500)
        assert prices.lookups - before == 2  # the request's worst case, then the reply's price
        before = prices.lookups
        run.begin_model_call(model=MODEL, estimated_input_tokens=10, max_output_tokens=10)
        assert prices.lookups - before == 1


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_failed_turn_stops_the_run_with_its_reason_and_gives_back_its_reservation(
    shell: str,
) -> None:
    """A transient failure after the retries: Stopped(ERROR) from the failure; nothing
    counted, nothing held in the scopes."""
    clock = VirtualClock()
    scopes = BudgetScopes(clock=clock)
    scopes.limit("tenant:a", max_cost_usd=1.0)
    guard = _guard(clock, budget=Budget(max_cost_usd=1.0), scopes=scopes)
    policy = guard.retry.replace(name="model", clock=clock)
    run = guard.start(scopes=("tenant:a",))
    with run:

        def body(call: Any, turn: Any) -> Any:
            return call(_flaky(9), policy=policy)

        with pytest.raises(Stopped) as stopped:
            _drive(shell, run, body, model=MODEL, estimate=100, max_output=100)
        assert stopped.value.reason is StopReason.ERROR
        assert isinstance(stopped.value.__cause__, ConnectionError)
        assert run.usage().model_calls == 0 and run.usage().retries == 2
    assert run.outcome.stopped_because is StopReason.ERROR
    assert scopes.spent("tenant:a").model_calls == 0
    assert scopes.view("tenant:a").in_flight == 0


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_programming_error_is_raised_as_it_is_with_the_run_filed(shell: str) -> None:
    clock = VirtualClock()
    run = _guard(clock).start()
    with run:

        def body(call: Any, turn: Any) -> Any:
            def bad() -> Any:
                raise TypeError("create() got an unexpected keyword argument 'modle'")

            return call(bad)

        with pytest.raises(TypeError):
            _drive(shell, run, body, model=MODEL)
    assert run.outcome.stopped_because is StopReason.PERMANENT_ERROR


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_turn_left_without_usage_is_an_unmeasured_call_never_a_free_one(shell: str) -> None:
    clock = VirtualClock()
    with _guard(clock).start() as run:
        _drive(shell, run, lambda call, turn: None, model=MODEL)
        assert (run.usage().model_calls, run.usage().unpriced_calls) == (1, 1)
    run = _guard(clock, budget=Budget(max_cost_usd=1.0)).start()
    with run, pytest.raises(UnknownModelError):
        _drive(shell, run, lambda call, turn: None, model=MODEL)


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_turn_waits_out_an_open_breaker_within_the_run(shell: str) -> None:
    clock = VirtualClock()
    guard = _guard(clock, budget=Budget(max_seconds=60), breaker_cooldown=5.0)
    with guard.start() as run:
        calls: list[float] = []

        def opened() -> str:
            calls.append(clock.now())
            if clock.now() < 4.0:
                raise CircuitOpenError("dep", 0.0, retry_in=4.0 - clock.now())
            return "ok"

        def body(call: Any, turn: Any) -> Any:
            out = call(opened)
            if asyncio.iscoroutine(out):

                async def then() -> Any:
                    reply = await out
                    turn.record(input_tokens=1, output_tokens=1)
                    return reply

                return then()
            turn.record(input_tokens=1, output_tokens=1)
            return out

        assert _drive(shell, run, body, model=MODEL) == "ok"
        assert len(calls) == 2 and run.usage().model_calls == 1


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_stopped_run_refuses_the_turn_before_any_request(shell: str) -> None:
    clock = VirtualClock()
    with _guard(clock).start() as run:
        run.halt(StopReason.MAX_STEPS, "enough")
        sent: list[int] = []
        with pytest.raises(Stopped) as stopped:
            _drive(shell, run, lambda call, turn: sent.append(1), model=MODEL)
        assert stopped.value.reason is StopReason.MAX_STEPS and sent == []


def test_hooks_drive_a_turn_by_hand_open_then_record_or_fail() -> None:
    """A framework with a before- and an after-model hook opens the turn in one and
    records (or fails) it in the other."""
    clock = VirtualClock()
    run = _guard(clock).start()
    with run:
        turn = run.model_turn(MODEL, max_output=100).open()
        assert turn.time_left is None
        turn.record(RequestUsage(5, 5))
        assert run.usage().model_calls == 1
        later = run.model_turn(MODEL).open()
        stopped = later.fail(ConnectionError("reset"))
        assert stopped.reason is StopReason.ERROR
    assert run.usage().model_calls == 1
