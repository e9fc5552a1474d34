"""The benchmark's event loop on a VirtualClock: the clock's own sleeps are timers of the
loop, so one task's sleep does not move the others' time."""

from __future__ import annotations

import asyncio

import pytest

from tether import VirtualClock
from tether.bench._vloop import run_virtual


def test_concurrent_sleeps_on_the_clock_overlap_as_real_ones_do() -> None:
    """A 10 s and a 3 s sleep through the clock and a 1 s asyncio sleep, at once: each
    wakes at its own time and the whole takes 10 s (a jump per sleep made it 13 s, and
    woke the 1 s sleeper at 13 s)."""
    clock = VirtualClock()
    woke: dict[str, float] = {}

    async def sleeper(name: str, seconds: float, on_clock: bool) -> None:
        await (clock.asleep(seconds) if on_clock else asyncio.sleep(seconds))
        woke[name] = clock.now()

    async def main() -> None:
        await asyncio.gather(
            sleeper("ten", 10.0, True), sleeper("one", 1.0, False), sleeper("three", 3.0, True)
        )

    run_virtual(clock, main())
    assert woke == {"one": 1.0, "three": 3.0, "ten": 10.0}
    assert clock.now() == 10.0
    assert (clock.sleeps, clock.slept) == (2, 13.0)


def test_a_sleep_past_a_timeout_on_the_loop_ends_at_the_deadline() -> None:
    """acall_with_timeout on the loop: a sleep that would cross the deadline sleeps up to it
    and raises TimeoutError; another task's time is not moved past it."""
    clock = VirtualClock()
    woke: list[float] = []

    async def hangs() -> None:
        await clock.asleep(60.0)

    async def other() -> None:
        await asyncio.sleep(2.0)
        woke.append(clock.now())

    async def main() -> None:
        task = asyncio.ensure_future(other())
        with pytest.raises(TimeoutError):
            await clock.acall_with_timeout(5.0, hangs)
        assert clock.now() == 5.0
        await task

    run_virtual(clock, main())
    assert woke == [2.0]


def test_outside_such_a_loop_a_sleep_moves_the_clock_at_once() -> None:
    """Under asyncio.run (real time) the virtual clock jumps, as it always did."""
    clock = VirtualClock()
    asyncio.run(clock.asleep(30.0))
    assert clock.now() == 30.0
