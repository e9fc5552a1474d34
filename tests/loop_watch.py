"""Whether an event loop keeps running other tasks while a coroutine waits."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def watched(work: Awaitable[T]) -> tuple[T, float]:
    """``work``'s result, and the longest the loop went without running a task that ticks
    every 10 ms beside it (a blocking wait in ``work`` shows as a gap that long)."""
    ticks: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    task = asyncio.create_task(ticker())
    try:
        result = await work
    finally:
        done.set()
        await task
    return result, max((b - a for a, b in itertools.pairwise(ticks)), default=0.0)
