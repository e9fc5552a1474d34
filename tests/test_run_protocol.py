"""The run protocol: the public methods a shell or an adapter drives a run with (docs/run.md)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import pytest

from tether import (
    Budget,
    CircuitOpenError,
    Guard,
    RetryPolicy,
    Stopped,
    StopReason,
    UnknownModelError,
    VirtualClock,
)

INTEGRATIONS = Path(__file__).resolve().parents[1] / "src" / "tether" / "integrations"


def _names_a_run(node: ast.expr) -> bool:
    """``run``, ``tether_run``, ``live.run``, ``self._owner.run``: an expression that holds a run."""
    if isinstance(node, ast.Name):
        return node.id == "run" or node.id.endswith("_run")
    if isinstance(node, ast.Attribute):
        return node.attr == "run" or node.attr.endswith("_run")
    return False


def test_no_integration_touches_a_private_member_of_a_run() -> None:
    """Adapters drive a run through its public protocol only: no ``run._x`` in integrations/."""
    reaches = []
    for path in sorted(INTEGRATIONS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not (node.attr.startswith("__") and node.attr.endswith("__"))
                and _names_a_run(node.value)
            ):
                reaches.append(f"{path.name}:{node.lineno} .{node.attr}")
            if (  # run.retries += n: the run counts its retries (count_retries)
                isinstance(node, ast.AugAssign)
                and isinstance(node.target, ast.Attribute)
                and _names_a_run(node.target.value)
            ):
                reaches.append(f"{path.name}:{node.lineno} .{node.target.attr} +=")
    assert reaches == []


def test_no_integration_imports_a_private_module_of_the_run_layer() -> None:
    """Adapters take the run layer's names from ``tether`` (Run, Guard, Fallback, ...), not
    from ``tether.run._*``: what they need is public."""
    found = []
    for path in sorted(INTEGRATIONS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tether.run."):
                found.append(f"{path.name}:{node.lineno} {node.module}")
    assert found == []


def test_the_check_finds_a_reach() -> None:
    """The check above is not blind: it names each kind of reach it forbids."""
    code = "run._halt(x)\nlive.run._probe_wait(e)\nself._owner.run.retries += 1\nrun.__enter__()\n"
    found = [
        n.attr
        for n in ast.walk(ast.parse(code))
        if isinstance(n, ast.Attribute) and n.attr.startswith("_") and _names_a_run(n.value)
    ]
    assert found == ["_halt", "_probe_wait", "__enter__"]


def _guard(clock: VirtualClock, **kw: Any) -> Guard:
    kw.setdefault("retry", RetryPolicy(max_attempts=3, base=0.5, cap=1.0, jitter="none"))
    return Guard(clock=clock, **kw)


def test_time_left_stop_detail_and_halt() -> None:
    clock = VirtualClock()
    with _guard(clock).start() as run:
        assert run.time_left() is None  # no time budget
    with _guard(clock, budget=Budget(max_seconds=10)).start() as run:
        clock.sleep(4)
        assert run.time_left() == pytest.approx(6.0)
        clock.sleep(20)
        assert 0 < run.time_left() <= 1e-9  # spent: never zero, never negative
        assert (run.stopped, run.stop_detail) == (None, "")
        first = run.halt(StopReason.TIMEOUT, "out of time")
        second = run.halt(StopReason.ERROR, "later")  # the first stop holds
        assert (first.reason, first.detail) == (second.reason, second.detail)
        assert (run.stopped, run.stop_detail) == (StopReason.TIMEOUT, "out of time")
    assert run.outcome.stopped_because is StopReason.TIMEOUT


def test_begin_model_call_refuses_after_a_stop_and_an_unpriced_model_under_a_cost_budget() -> None:
    clock = VirtualClock()
    with _guard(clock, budget=Budget(max_seconds=30)).start() as run:
        assert run.begin_model_call(model="", max_output_tokens=100) == pytest.approx(30.0)
        run.halt(StopReason.MAX_STEPS, "enough")
        with pytest.raises(Stopped) as stopped:
            run.begin_model_call(model="claude-sonnet-5-5", estimated_input_tokens=10)
        assert (stopped.value.reason, stopped.value.detail) == (StopReason.MAX_STEPS, "enough")
    run = _guard(clock, budget=Budget(max_cost_usd=1.0)).start()
    with run, pytest.raises(UnknownModelError):
        run.begin_model_call(model="a-model-nobody-priced")
    assert run.usage().model_calls == 0


def test_model_call_failed_says_why_and_keeps_the_error() -> None:
    clock = VirtualClock()
    with _guard(clock).start() as run:
        stopped = run.model_call_failed(PermissionError("bad key sk-ant-XXXXXXXXXXXXXXXXXXXXXXXX"))
        assert stopped.reason is StopReason.PERMANENT_ERROR
    assert run.outcome.error is not None and run.outcome.error.startswith("PermissionError")
    with _guard(clock).start() as run:
        assert run.model_call_failed(CircuitOpenError("m", 0.0, retry_in=5.0)).reason is (
            StopReason.CIRCUIT_OPEN
        )


def test_retry_model_call_counts_its_retries_sync_and_async() -> None:
    clock = VirtualClock()
    guard = _guard(clock)
    policy = guard.retry.replace(name="model", clock=clock)

    def flaky(fails: list[int]) -> Any:
        def call() -> str:
            if fails[0]:
                fails[0] -= 1
                raise ConnectionError("reset")
            return "ok"

        return call

    with guard.start() as run:
        assert run.retry_model_call(policy, flaky([2])) == "ok"
        assert run.retries == 2
        with pytest.raises(ConnectionError):
            run.retry_model_call(policy, flaky([9]))
        assert run.retries == 4
        run.count_retries(3)
        assert run.usage().retries == 7

    async def main() -> None:
        with guard.start() as arun:
            call = flaky([1])

            async def acall() -> str:
                return str(call())

            assert await arun.aretry_model_call(policy, acall) == "ok"
            assert arun.retries == 1

    asyncio.run(main())


def _open_until(clock: VirtualClock, until: float) -> Any:
    calls = []

    def fn() -> str:
        calls.append(clock.now())
        if clock.now() < until:
            raise CircuitOpenError("dep", 0.0, retry_in=until - clock.now())
        return "ok"

    return fn, calls


def test_through_breaker_waits_for_the_probe_within_the_run_sync_and_async() -> None:
    clock = VirtualClock()
    guard = _guard(clock, budget=Budget(max_seconds=60), breaker_cooldown=5.0)
    with guard.start() as run:
        fn, calls = _open_until(clock, 4.0)
        assert run.through_breaker(fn) == "ok"
        assert len(calls) == 2 and clock.now() == pytest.approx(4.05)

    async def main() -> None:
        with guard.start() as arun:
            start = clock.now()
            fn, calls = _open_until(clock, start + 4.0)

            async def afn() -> str:
                return str(fn())

            assert await arun.athrough_breaker(afn) == "ok"
            assert len(calls) == 2

    asyncio.run(main())


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_breaker_wait_never_outlasts_the_run(shell: str) -> None:
    """A probe due after the run's time is not waited for: the CircuitOpenError is raised
    at once, and the budget is not overrun."""
    clock = VirtualClock()
    guard = _guard(clock, budget=Budget(max_seconds=10), breaker_cooldown=30.0)
    with guard.start() as run:
        fn, calls = _open_until(clock, 25.0)
        with pytest.raises(CircuitOpenError):
            if shell == "sync":
                run.through_breaker(fn, timeout=2.0)
            else:

                async def afn() -> str:
                    return str(fn())

                asyncio.run(run.athrough_breaker(afn, timeout=2.0))
        assert clock.now() == 0.0 and len(calls) == 1
        exc = CircuitOpenError("dep", 0.0, retry_in=8.0)
        assert run.breaker_wait(exc, timeout=2.0) is None  # 8 + 2 >= 10 left
        assert run.breaker_wait(exc) == pytest.approx(8.05)
        assert run.breaker_wait(exc, waited=85.0) is None  # three cooldowns waited


def test_no_breaker_wait_without_a_time_budget_or_when_the_guard_says_so() -> None:
    clock = VirtualClock()
    exc = CircuitOpenError("dep", 0.0, retry_in=1.0)
    with _guard(clock).start() as run:
        assert run.breaker_wait(exc) is None
    with _guard(clock, budget=Budget(max_seconds=60), wait_for_recovery=False).start() as run:
        assert run.breaker_wait(exc) is None
