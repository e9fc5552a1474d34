"""Sync and async are one behaviour: every run behaviour through both shells, compared.

Each case is one story (a tool, the calls a loop makes, what ends it); it runs once with
``run.call_tool`` and a plain function, once with ``await run.acall_tool`` and an
``async def`` of the same body, on a virtual clock each. The outcomes (status, reason,
detail, partial results, usage, open issues, customer message, error, compensations,
pending approval), what the model was told, how often the tool ran, what was raised
and the OpenTelemetry spans (names, tool, attempt) must be equal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import tether
from tether import (
    Budget,
    Checkpoints,
    Escalation,
    Guard,
    Ledger,
    RetryPolicy,
    Stopped,
    ToolError,
    VirtualClock,
)
from tether.stores import MemoryStore


@dataclass
class World:
    """What one shell's run saw: the clock, the tool's executions, what the model was told."""

    clock: VirtualClock
    ran: list[Any] = field(default_factory=list)
    told: list[str] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)


@dataclass
class Case:
    name: str
    body: Callable[[World, dict[str, Any]], Any]  # the tool: the same body in both shells
    args: Callable[[int], dict[str, Any]] = lambda step: {"q": "invoice 99"}
    call: dict[str, Any] = field(default_factory=dict)  # call_tool's keywords
    guard: Callable[[World, Path], dict[str, Any]] = lambda world, tmp: {}
    steps: int = 30  # how many loop turns at most
    succeed_when: Callable[[Any], bool] = lambda result: False
    after: str = ""  # "rollback": roll back then fail; "approve": approve, resume, once more


def _plain(world: World, case: Case) -> Callable[..., Any]:
    def tool(**args: Any) -> Any:
        world.ran.append(args)
        return case.body(world, args)

    return tool


def _async(world: World, case: Case) -> Callable[..., Any]:
    async def tool(**args: Any) -> Any:
        world.ran.append(args)
        await world.clock.asleep(0)
        return case.body(world, args)

    return tool


def _sleepy(world: World, seconds: float) -> None:
    world.clock.sleep(seconds)


# --- the stories ------------------------------------------------------------------------


def _found(world: World, args: dict[str, Any]) -> Any:
    return {"hit": args["q"]}


def _nothing(world: World, args: dict[str, Any]) -> Any:
    return {"results": []}


def _flaky(world: World, args: dict[str, Any]) -> Any:
    world.memory["n"] = world.memory.get("n", 0) + 1
    if world.memory["n"] <= 2:
        raise ConnectionResetError("reset by peer")
    return {"hit": args["q"]}


def _down(world: World, args: dict[str, Any]) -> Any:
    raise ConnectionRefusedError("connection refused")


def _denied(world: World, args: dict[str, Any]) -> Any:
    raise PermissionError("denied by the provider")


def _business(world: World, args: dict[str, Any]) -> Any:
    raise ValueError("order W1 was already refunded")


def _slow(world: World, args: dict[str, Any]) -> Any:
    world.clock.sleep(7.0)
    return {"hit": args["q"], "at": world.clock.now()}


def _hangs(world: World, args: dict[str, Any]) -> Any:
    world.clock.sleep(3600.0)  # past any timeout: the virtual clock's deadline cuts it
    return None


def _refund(world: World, args: dict[str, Any]) -> Any:
    return {"id": f"re_{len(world.ran)}", "order": args["order"]}


def _lost_response(world: World, args: dict[str, Any]) -> Any:
    raise TimeoutError("read timed out")  # did it happen? nobody knows


def _steps(n: int) -> Callable[[int], dict[str, Any]]:
    return lambda step: {"q": f"page {step}"}


def _records(world: World, tmp: Path) -> dict[str, Any]:
    return {
        "checkpoints": Checkpoints.sqlite(tmp / "cp.db"),
        "ledger": Ledger.memory(clock=world.clock),
    }


CASES = [
    Case("success", _found, succeed_when=lambda r: r is not None),
    Case("repeated_action", _nothing),
    Case(
        "max_steps", _nothing, args=_steps(99), guard=lambda w, t: {"budget": Budget(max_steps=4)}
    ),
    Case(
        "max_tool_calls",
        _nothing,
        args=_steps(99),
        guard=lambda w, t: {"budget": Budget(max_tool_calls=3)},
    ),
    Case(
        "time_budget",
        _slow,
        args=_steps(99),
        call={"timeout": 10.0},
        guard=lambda w, t: {"budget": Budget(max_seconds=20)},
    ),
    Case(
        "time_budget_untimed_tool",
        _slow,
        args=_steps(99),
        guard=lambda w, t: {"budget": Budget(max_seconds=20)},
    ),
    Case("retried_then_found", _flaky, succeed_when=lambda r: r is not None),
    Case("identical_failures", _denied),
    Case(
        "business_rule",
        _business,
        args=_steps(99),
        guard=lambda w, t: {"budget": Budget(max_steps=3)},
    ),
    Case(
        "breaker_open",
        _down,
        args=_steps(99),
        guard=lambda w, t: {"breaker_threshold": 3, "escalation": Escalation()},
    ),
    Case(
        "breaker_open_waits_within_the_budget",
        _down,
        args=_steps(99),
        guard=lambda w, t: {
            "breaker_threshold": 3,
            "breaker_cooldown": 5.0,
            "budget": Budget(max_seconds=40, max_identical_failures=None),
        },
    ),
    Case(
        "hung_tool_hands_over",
        _hangs,
        call={"timeout": 2.0},
        guard=lambda w, t: {"budget": Budget(max_seconds=60)},
    ),
    Case(
        "hung_tool_told_to_the_model",
        _hangs,
        call={"timeout": 2.0},
        steps=6,
        guard=lambda w, t: {"budget": Budget(max_seconds=300), "on_hung_tool": "tell_model"},
    ),
    Case(
        "hung_tool_waited_for",
        _hangs,
        call={"timeout": 2.0},
        guard=lambda w, t: {"budget": Budget(max_seconds=60), "on_hung_tool": "wait"},
    ),
    Case(
        "effect_once",
        _refund,
        args=lambda step: {"order": "A-1"},
        call={"idempotent": False},
        steps=3,
    ),
    Case(
        "effect_unknown_outcome",
        _lost_response,
        args=lambda step: {"order": "A-1"},
        call={"idempotent": False},
    ),
    Case(
        "rollback",
        _refund,
        args=lambda step: {"order": f"A-{step}"},
        steps=2,
        call={"idempotent": False, "compensate": lambda result: {"undone": result["id"]}},
        after="rollback",
    ),
    Case(
        "approval",
        _refund,
        args=lambda step: {"order": "A-1", "amount": 9000},
        call={"idempotent": False, "requires_approval": True},
        guard=_records,
        after="approve",
    ),
]


def _guard(world: World, case: Case, tmp: Path) -> Guard:
    kw = {
        "clock": world.clock,
        "store": MemoryStore(),
        "retry": RetryPolicy(max_attempts=3, base=0.2, cap=1.0, seed=1),
        **case.guard(world, tmp),
    }
    return Guard(**kw)


def _sync_story(world: World, case: Case, guard: Guard, run: tether.Run) -> None:
    tool = _plain(world, case)
    for _ in range(case.steps):
        if not run.proceed():
            return
        run.record_model_call(input_tokens=100, output_tokens=10)
        try:
            result = run.call_tool("search", tool, case.args(run.steps), **case.call)
        except ToolError as exc:
            world.told.append(exc.model_message)
            continue
        if case.succeed_when(result):
            run.succeed(result)


async def _async_story(world: World, case: Case, guard: Guard, run: tether.Run) -> None:
    tool = _async(world, case)
    for _ in range(case.steps):
        if not run.proceed():
            return
        run.record_model_call(input_tokens=100, output_tokens=10)
        try:
            result = await run.acall_tool("search", tool, case.args(run.steps), **case.call)
        except ToolError as exc:
            world.told.append(exc.model_message)
            continue
        if case.succeed_when(result):
            run.succeed(result)


def _outcome(out: tether.Outcome) -> dict[str, Any]:
    usage = out.usage
    return {
        "status": out.status,
        "stopped_because": out.stopped_because,
        "detail": out.detail,
        "result": out.result,
        "partial": out.partial,
        "open_issues": out.open_issues,
        "customer_message": out.customer_message,
        "error": out.error,
        "compensated": out.compensated,
        "handoff": out.handoff is not None,
        "pending": None if out.pending_approval is None else out.pending_approval["tool"],
        "usage": (
            usage.steps,
            usage.model_calls,
            usage.tool_calls,
            usage.retries,
            usage.input_tokens,
            round(usage.seconds, 6),
        ),
    }


def _spans(exporter: Any) -> list[tuple[Any, ...]]:
    found = [
        (
            s.name,
            s.attributes.get("gen_ai.tool.name"),
            s.attributes.get("tether.attempt"),
            s.attributes.get("tether.step"),
            tuple(e.name for e in s.events),
        )
        for s in exporter.get_finished_spans()
    ]
    exporter.clear()
    return found


def _play(shell: str, case: Case, tmp: Path, exporter: Any) -> dict[str, Any]:
    world = World(VirtualClock())
    (tmp / shell).mkdir()
    guard = _guard(world, case, tmp / shell)
    raised: list[str] = []

    def one(run: tether.Run) -> None:
        try:
            if shell == "sync":
                with run:
                    _sync_story(world, case, guard, run)
                    if case.after == "rollback":
                        run.rollback()
                        run.fail("the customer changed their mind")
            else:

                async def main() -> None:
                    async with run:
                        await _async_story(world, case, guard, run)
                        if case.after == "rollback":
                            await run.arollback()
                            run.fail("the customer changed their mind")

                asyncio.run(main())
        except Exception as exc:  # what the code sees (a mistake of the code, ...)
            raised.append(f"{type(exc).__name__}: {exc}")

    run = guard.start(task=case.name, key="request-1")
    one(run)
    outcomes = [_outcome(run.outcome)]
    if case.after == "approve":
        assert run.outcome.checkpoint_id is not None
        guard.approve(run.outcome.checkpoint_id, by="alice")
        resumed = guard.resume(run.outcome.checkpoint_id)
        one(resumed)
        outcomes.append(_outcome(resumed.outcome))
    return {
        "outcomes": outcomes,
        "ran": world.ran,
        "told": world.told,
        "raised": raised,
        "clock": world.clock.now(),
        "spans": _spans(exporter),
    }


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_both_shells_behave_alike(case: Case, tmp_path: Path, otel: Any) -> None:
    exporter, _ = otel
    sync = _play("sync", case, tmp_path, exporter)
    async_ = _play("async", case, tmp_path, exporter)
    assert sync == async_
    assert sync["spans"], "telemetry recorded nothing: the comparison of spans would be empty"


def test_the_stories_cover_every_way_a_run_ends(tmp_path: Path, otel: Any) -> None:
    """The parity cases are not one story told many times: they end in many ways."""
    exporter, _ = otel
    reasons = {
        _play("sync", case, tmp_path / case.name, exporter)["outcomes"][0]["stopped_because"].name
        for case in CASES
        if (tmp_path / case.name).mkdir() is None
    }
    assert {
        "GOAL_REACHED",
        "REPEATED_ACTION",
        "MAX_STEPS",
        "MAX_TOOL_CALLS",
        "TIMEOUT",
        "IDENTICAL_FAILURES",
        "CIRCUIT_OPEN",
        "UNKNOWN_OUTCOME",
        "AWAITING_APPROVAL",
        "FAILED",
    } <= reasons


# --- the drift cases of #27 ---------------------------------------------------------------


def test_a_plain_function_returning_a_coroutine_is_refused_by_both_shells() -> None:
    """One behaviour: refused with ReturnedAwaitable (a TypeError) raised to the code, the
    coroutine closed (never started), nothing shown to the model; never handed back."""
    started: list[int] = []

    async def work() -> int:
        started.append(1)
        return 1

    seen = []
    with Guard(clock=VirtualClock()).start() as run:
        run.proceed()
        with pytest.raises(TypeError, match="returned an awaitable") as sync_exc:
            run.call_tool("t", lambda: work(), {})
        seen.append(type(sync_exc.value))

    async def main() -> None:
        with Guard(clock=VirtualClock()).start() as arun:
            arun.proceed()
            with pytest.raises(TypeError, match="returned an awaitable") as async_exc:
                await arun.acall_tool("t", lambda: work(), {})
            seen.append(type(async_exc.value))

    asyncio.run(main())
    assert seen[0] is seen[1] and started == []


def test_acall_tool_makes_attempt_spans_like_call_tool(otel: Any) -> None:
    exporter, _ = otel

    def names() -> list[str]:
        found = [s.name for s in exporter.get_finished_spans()]
        exporter.clear()
        return found

    with Guard(clock=VirtualClock()).start() as run:
        run.proceed()
        run.call_tool("t", lambda: 1, {})
        run.succeed()
    sync = names()

    async def one() -> int:
        return 1

    async def main() -> None:
        with Guard(clock=VirtualClock()).start() as arun:
            arun.proceed()
            await arun.acall_tool("t", one, {})
            arun.succeed()

    asyncio.run(main())
    assert sync == names() == ["tether.attempt", "tether.tool_call", "tether.step", "tether.run"]


def test_stopped_is_raised_alike() -> None:
    """A call after the run stopped raises the same Stopped in both shells."""
    got = []
    with Guard(clock=VirtualClock()).start() as run:
        run.halt(tether.StopReason.MAX_STEPS, "enough")
        with pytest.raises(Stopped) as first:
            run.call_tool("t", lambda: 1, {})
        got.append((first.value.reason, first.value.detail))

    async def main() -> None:
        async def one() -> int:
            return 1

        with Guard(clock=VirtualClock()).start() as arun:
            arun.halt(tether.StopReason.MAX_STEPS, "enough")
            with pytest.raises(Stopped) as second:
                await arun.acall_tool("t", one, {})
            got.append((second.value.reason, second.value.detail))

    asyncio.run(main())
    assert got[0] == got[1]
