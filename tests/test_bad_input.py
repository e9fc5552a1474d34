"""Bad input: a clear error that names the parameter, at construction, and nothing lost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import tether
from tether import Budget, CircuitBreaker, Guard, LoopPolicy, VirtualClock
from tether.cli import main
from tether.records._collections import CHECKPOINT_FORMAT, CheckpointError, Checkpoints


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_cost_usd": "0.5"}, "max_cost_usd must be a number > 0 or None, got '0.5'"),
        ({"max_seconds": True}, "max_seconds must be a number > 0"),
        ({"max_steps": "5"}, "max_steps must be an int >= 1 or None, got '5'"),
        ({"progress_extension": 1.5, "max_steps": 3}, "progress_extension must be an int"),
    ],
)
def test_budget_names_the_field(kwargs: dict[str, Any], message: str) -> None:
    """Budget fields of the wrong type fail at construction with the field's name."""
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Budget(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"budget": {"max_steps": 5}}, "budget must be a Budget"),
        ({"loops": False}, "loops must be a LoopPolicy"),
        ({"ledger": "ledger.db"}, "ledger must be a Ledger"),
        ({"retry": 3}, "retry must be a RetryPolicy"),
        ({"clock": 5}, "clock must be a tether clock"),
        ({"breaker_cooldown": 0}, "breaker_cooldown must be a number > 0"),
        ({"breaker_threshold": "5"}, "breaker_threshold must be an int >= 1"),
    ],
)
def test_guard_names_the_field(kwargs: dict[str, Any], message: str) -> None:
    """Guard refuses a wrong type at construction instead of failing later in a run."""
    with pytest.raises((TypeError, ValueError), match=message):
        Guard(**kwargs)


def test_loop_window_follows_max_repeats() -> None:
    """max_repeats=100 is accepted; the window grows with it; a window the user set is checked."""
    policy = LoopPolicy(max_repeats=100)
    assert policy.window == 400
    assert LoopPolicy().window == 64
    with pytest.raises(ValueError, match=r"window must be >= max_repeats \(10\), got 5"):
        LoopPolicy(max_repeats=10, window=5)


def test_max_repeats_none_switches_repeat_detection_off() -> None:
    """LoopPolicy(max_repeats=None): the same call may repeat; other detectors still work."""
    guard = Guard(loops=LoopPolicy(max_repeats=None, max_no_progress=None), clock=VirtualClock(),
                  budget=Budget(max_steps=10))  # fmt: skip
    ran = []
    with guard.start() as run:
        while run.proceed():
            run.call_tool("search", lambda q: ran.append(q), {"q": "invoice 99"})
    assert len(ran) == 10
    assert run.outcome.stopped_because is tether.StopReason.MAX_STEPS


def test_allow_repeat_takes_a_list_of_names() -> None:
    """allow_repeat=["job_status"] gives each name the default polling cap."""
    policy = LoopPolicy(allow_repeat=["job_status", "queue_depth"])
    assert dict(policy.allow_repeat) == {"job_status": 30, "queue_depth": 30}
    with pytest.raises(TypeError, match="allow_repeat must be a mapping"):
        LoopPolicy(allow_repeat="job_status")  # type: ignore[arg-type]


def test_call_tool_args_must_be_a_mapping() -> None:
    """run.call_tool("x", fn, [1]) says that args must be a mapping."""
    ran = []
    with (
        pytest.raises(TypeError, match="args of tool 'x' must be a mapping"),
        Guard().start() as run,
    ):
        run.proceed()
        run.call_tool("x", lambda *a: ran.append(a), [1])  # type: ignore[arg-type]
    assert ran == []


def _saved(tmp_path: Path, **changes: Any) -> tuple[Checkpoints, str]:
    store = Checkpoints.sqlite(str(tmp_path / "ckpt.db"))
    doc = {"run_id": "run_1", "task": "refund A-1", "status": "partial", "reason": "max_steps",
           "detail": "", "usage": {"steps": 3, "model_calls": 2, "tool_calls": 1, "input_tokens": 10,
           "output_tokens": 5, "cache_write_tokens": 0, "cache_read_tokens": 0, "cost_usd": 0.1,
           "retries": 0, "seconds": 1.5}, "partial": [{"tool": "search", "result": "x"}],
           "transcript": [], "open_issues": []}  # fmt: skip
    for path, value in changes.items():
        head, _, tail = path.partition("__")
        if tail:
            doc[head][tail] = value  # type: ignore[index]
        else:
            doc[head] = value
    return store, store.save(doc, 0.0)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"partial": None}, "partial"),
        ({"partial": "abc"}, "partial"),
        ({"usage__steps": "3"}, "usage.steps"),
        ({"usage__steps": -100}, "usage.steps"),
        ({"usage__cost_usd": "free"}, "usage.cost_usd"),
        ({"usage": [1]}, "usage"),
        ({"task": 7}, "task"),
        ({"transcript": [1, 2]}, "transcript"),
    ],
)
def test_corrupt_checkpoints_name_the_field(
    tmp_path: Path, changes: dict[str, Any], field: str
) -> None:
    """A checkpoint's whole shape is checked on load; the error names the field."""
    store, checkpoint_id = _saved(tmp_path, **changes)
    guard = Guard(checkpoints=store)
    with pytest.raises(CheckpointError, match=f"corrupt: {field.replace('.', '[.]')} "):
        guard.resume(checkpoint_id)


def test_a_good_checkpoint_resumes(tmp_path: Path) -> None:
    """The shape check accepts what tether writes."""
    store, checkpoint_id = _saved(tmp_path)
    run = Guard(checkpoints=store).resume(checkpoint_id)
    assert (run.steps, run.task) == (3, "refund A-1")
    text = store.store.get("checkpoint", checkpoint_id)
    assert json.loads(text)["format"] == CHECKPOINT_FORMAT


def test_breaker_cooldown_ignores_the_system_clock_stepping_back() -> None:
    """Durations are monotonic: a wall clock stepped back an hour does not extend the cooldown."""

    class SteppedBack(VirtualClock):
        def wall(self) -> float:
            return super().wall() - (3600.0 if self.now() >= 1.0 else 0.0)

    clock = SteppedBack()
    breaker = CircuitBreaker(
        "stepped", failure_threshold=1, cooldown=5.0, clock=clock, probe_interval=None
    )
    with pytest.raises(TimeoutError):
        breaker.call(lambda: (_ for _ in ()).throw(TimeoutError()))
    assert breaker.state == "open"
    clock.advance(6.0)  # the wall clock has now gone back an hour
    assert breaker.state == "half_open"
    assert breaker.call(lambda: "ok") == "ok"


def test_redis_store_treats_error_replies_as_unavailable(redis_url: str) -> None:
    """An error reply (here NOSCRIPT-like: a script the server refuses) falls back, once."""
    import redis

    from tether.stores import RedisStore
    from tether.testing import capture_logs

    class Refusing(redis.Redis):  # type: ignore[type-arg]
        def evalsha(self, *args: Any, **kwargs: Any) -> Any:
            raise redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'")

        def eval(self, *args: Any, **kwargs: Any) -> Any:
            raise redis.ResponseError("READONLY You can't write against a read only replica.")

    store = RedisStore(client=Refusing.from_url(redis_url), cache_ttl=0.0, server_time=False)
    breaker = CircuitBreaker("refusing", store=store, clock=VirtualClock())
    with capture_logs() as records:
        assert breaker.call(lambda: "ok") == "ok"
        assert breaker.call(lambda: "ok") == "ok"
    assert store.degraded
    assert len([r for r in records if "is unavailable" in r.getMessage()]) == 1


def test_bench_lists_each_scenario_once(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown scenario's error names every valid one once."""
    assert main(["bench", "--scenario", "nope"]) == 2
    agents, fleet = capsys.readouterr().err.split("fleet:")
    assert agents.split(", ").count("outage") == 1
    assert fleet.strip().split(", ").count("outage") == 1


@pytest.mark.parametrize(
    ("module", "missing", "extra"),
    [("tether.integrations.openai_agents", "agents", "openai-agents"),
     ("tether.integrations.pydantic_ai", "pydantic_ai", "pydantic-ai"),
     ("tether.serve", "jinja2", "serve"),
     ("tether.integrations.temporal", "temporalio", "temporal"),
     ("tether.integrations.dbos", "dbos", "dbos"),
     ("tether.integrations.adk", "google.adk", "adk"),
     ("tether.integrations.strands", "strands", "strands"),
     ("tether.integrations.crewai", "crewai", "crewai"),
     ("tether.integrations.litellm", "litellm", "litellm")],
)  # fmt: skip
def test_a_missing_extra_names_the_extra_to_install(module: str, missing: str, extra: str) -> None:
    import importlib
    import sys

    saved = {
        k: v
        for k, v in sys.modules.items()
        if k in (module, missing) or k.startswith(missing + ".")
    }
    for name in saved:
        del sys.modules[name]
    sys.modules[missing] = None  # type: ignore[assignment]
    try:
        with pytest.raises(tether.MissingExtraError, match=f"tether\\[{extra}\\]"):
            importlib.import_module(module)
    finally:
        del sys.modules[missing]
        sys.modules.update(saved)
