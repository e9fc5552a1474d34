"""Run is a front that owns its state and its parts, and the parts need neither Run nor Guard."""

from __future__ import annotations

import ast
import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest

import tether
from tether import Budget, Guard, VirtualClock

RUN = Path(__file__).resolve().parents[1] / "src" / "tether" / "run"

#: the modules of the run layer that may know the front and the guard
FRONTS = {"_run.py", "_guard.py", "__init__.py"}


def _classes() -> dict[str, tuple[int, list[str]]]:
    """Every class of the run layer: its own lines and the names of its bases."""
    found = {}
    for path in sorted(RUN.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
                found[node.name] = (node.end_lineno - node.lineno + 1, bases)
    return found


def test_no_class_of_the_run_layer_passes_300_lines_with_its_bases() -> None:
    """A class is read in one sitting: at most 300 lines, counting what it inherits."""
    classes = _classes()

    def size(name: str) -> int:
        own, bases = classes[name]
        return own + sum(size(b) for b in bases if b in classes)

    assert {n: size(n) for n in classes if size(n) > 300} == {}


def test_run_owns_its_state_instead_of_inheriting_it() -> None:
    """No base class: the state is a part the run holds, and the parts share it."""
    assert tether.Run.__bases__ == (object,)
    run = Guard().start()
    parts = [run._steps, run._tools, run._models, run._undo, run._ending]
    assert all(part.s is run._state for part in parts)


def test_no_part_imports_the_run_or_the_guard() -> None:
    """The parts get the state and the settings; only the front knows Run and Guard."""
    reaches = []
    for path in sorted(RUN.glob("*.py")):
        if path.name in FRONTS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in (
                "tether.run._run",
                "tether.run._guard",
            ):
                reaches.append(f"{path.name}:{node.lineno} {node.module}")
    assert reaches == []


def test_the_counters_read_and_write_through_the_run() -> None:
    """``run.messages = ...`` (what adapters do) and ``run.steps`` are the state's."""
    clock = VirtualClock()
    with Guard(clock=clock, budget=Budget(max_seconds=10)).start(task="t", key="k") as run:
        run.proceed()
        run.messages = [{"role": "user", "content": "hi"}]
        run.record_model_call(input_tokens=3, output_tokens=2)
        clock.sleep(4)
        assert (run.steps, run.model_calls, run.total_tokens) == (1, 1, 5)
        assert run._state.messages == run.messages and run.key == "k"
        assert run.elapsed == pytest.approx(4.0) and run.urgency == pytest.approx(0.4)
        run.succeed("done")
    assert run.stopped is tether.StopReason.GOAL_REACHED and run.stop_detail == ""


def test_a_policy_that_takes_the_run_gets_the_run() -> None:
    """What a policy's ``run=`` receives is the Run the caller holds, not its state."""
    seen: list[Any] = []

    def policy(tool: str, args: Any, *, run: Any = None) -> str | None:
        seen.append(run)
        return None

    with Guard(policies=[policy]).start() as run:
        run.proceed()
        run.call_tool("t", lambda: 1)
        run.succeed()
    assert seen == [run]


@pytest.mark.parametrize(
    "call",
    [
        lambda run: run.call_tool("t", lambda: 1, {}, timeuot=1.0),
        lambda run: run.record_model_call(input_tokens=1, modle="m"),
        lambda run: run.begin_model_call(modle="m"),
    ],
)
def test_an_unknown_keyword_is_refused_naming_it(call: Any) -> None:
    """The keyword sets are declared once, and a misspelt keyword still fails at once."""
    with Guard().start() as run:
        run.proceed()
        with pytest.raises(TypeError, match=r"timeuot|modle"):
            call(run)
        run.succeed()
    assert run.tool_calls == 0 and run.model_calls == 0


def test_a_misspelt_keyword_to_acall_tool_is_refused_before_the_tool_runs() -> None:
    """``idempotnt=False`` must not pass as an idempotent call that may be retried."""
    ran: list[int] = []

    async def main() -> None:
        async with Guard().start() as run:
            run.proceed()
            with pytest.raises(TypeError, match="idempotnt"):
                await run.acall_tool("pay", lambda: ran.append(1), {}, idempotnt=False)
            run.succeed()

    asyncio.run(main())
    assert ran == []


def test_async_methods_stay_coroutine_functions() -> None:
    """A method the run's parts answer keeps its shell: an async one is awaited."""
    for name in ("abegin_model_call", "aretry_model_call", "athrough_breaker", "acall_tool"):
        assert inspect.iscoroutinefunction(getattr(tether.Run, name)), name
    for name in ("time_left", "halt", "retry_model_call", "through_breaker", "progress"):
        assert not inspect.iscoroutinefunction(getattr(tether.Run, name)), name

    async def main() -> int:
        async with Guard().start() as run:
            run.proceed()
            await run.abegin_model_call(model="")

            async def answer() -> int:
                return 42

            got: int = await run.athrough_breaker(answer)
            run.succeed(got)
        return int(run.outcome.result)

    assert asyncio.run(main()) == 42
