"""A long run keeps its newest entries in memory and counts the rest (Guard(keep_last=))."""

from __future__ import annotations

import pytest

import tether
from tether import Checkpoints, Guard, LoopPolicy


def long_run(guard: Guard, steps: int) -> tether.Run:
    with guard.start(task="crawl") as run:
        for i in range(steps):
            run.proceed()
            run.call_tool("fetch" if i % 2 else "parse", lambda n: n * 2, {"n": i})
        run.succeed()
    return run


def test_a_long_run_keeps_the_newest_calls_and_counts_the_rest() -> None:
    guard = Guard(
        keep_last=10, loops=LoopPolicy(max_no_progress=None), checkpoints=Checkpoints.memory()
    )
    run = long_run(guard, 1000)
    outcome = run.outcome
    assert [p["args"]["n"] for p in outcome.partial] == list(range(990, 1000))
    assert outcome.partial_omitted == 990 and outcome.usage.tool_calls == 1000
    assert len(run.partial) <= 20 and len(run.transcript) <= 20  # memory stays bounded
    doc = guard.checkpoints.load(outcome.checkpoint_id)  # type: ignore[union-attr]
    assert len(doc["partial"]) == 10
    assert doc["omitted"]["partial"] == {"omitted": 990, "by_tool": {"parse": 495, "fetch": 495}}

    resumed = guard.resume(outcome.checkpoint_id)  # type: ignore[arg-type]
    with resumed:
        resumed.call_tool("fetch", lambda n: n, {"n": -1})
        resumed.succeed()
    assert resumed.outcome.partial_omitted == 991  # the earlier part's count carries over


def test_keep_last_none_keeps_everything_and_bad_values_are_refused() -> None:
    run = long_run(Guard(keep_last=None, loops=LoopPolicy(max_no_progress=None)), 300)
    assert len(run.outcome.partial) == 300 and run.outcome.partial_omitted == 0
    for bad in (0, -1, 2.5, True, "10"):
        with pytest.raises(ValueError, match="keep_last"):
            Guard(keep_last=bad)  # type: ignore[arg-type]
