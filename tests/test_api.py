"""The public namespace: the binding names of the design exist, and __all__ is sorted and true."""

from __future__ import annotations

import importlib
import inspect

import pytest

import tether

BINDING = [
    "classify", "Kind", "Verdict", "register_classifier", "RetryPolicy", "retry", "DeadlineExceeded",
    "RetryBudget", "AdaptiveLimiter", "CircuitBreaker", "CircuitOpenError", "intent_key", "Ledger",
    "UnknownOutcome", "wrap", "Guard", "Budget", "LoopPolicy", "Stopped", "Outcome", "StopReason", "Tool",
    "VirtualClock",
]  # fmt: skip


def test_all_is_sorted_and_every_name_exists() -> None:
    """__all__ is sorted and lists only names the package has."""
    assert list(tether.__all__) == sorted(tether.__all__)
    missing = [name for name in tether.__all__ if not hasattr(tether, name)]
    assert missing == []


@pytest.mark.parametrize("name", BINDING)
def test_binding_names(name: str) -> None:
    """Every name of the binding API is public."""
    assert name in tether.__all__


@pytest.mark.parametrize(
    ("module", "names"),
    [
        ("tether.backoff", ["full_jitter", "equal_jitter", "decorrelated_jitter"]),
        ("tether.stores", ["MemoryStore", "RedisStore"]),
        ("tether.integrations.anthropic", ["guarded", "run_agent"]),
        ("tether.integrations.openai", ["guarded", "run_agent"]),
        ("tether.testing", ["VirtualClock", "reset", "capture_logs"]),
        ("tether.bench", ["run"]),
        ("tether.cli", ["main"]),
    ],
)
def test_public_modules(module: str, names: list[str]) -> None:
    """The public modules of the design carry their names."""
    mod = importlib.import_module(module)
    for name in names:
        assert getattr(mod, name) is not None


def test_binding_signatures() -> None:
    """The keyword names and defaults of the design's signatures."""
    policy = inspect.signature(tether.RetryPolicy)
    assert list(policy.parameters)[:11] == ["max_attempts", "base", "cap", "jitter", "deadline", "attempt_timeout",
                                            "budget", "breaker", "limiter", "clock", "seed"]  # fmt: skip
    assert policy.parameters["max_attempts"].default == 5
    budget = inspect.signature(tether.RetryBudget)
    assert {k: v.default for k, v in budget.parameters.items()} == {
        "name": "default", "capacity": 500, "retry_cost": 5, "timeout_cost": 10, "refund": 1, "store": None}  # fmt: skip
    breaker = inspect.signature(tether.CircuitBreaker)
    assert list(breaker.parameters)[:6] == [
        "name",
        "failure_threshold",
        "cooldown",
        "half_open_max_calls",
        "store",
        "clock",
    ]
    assert inspect.signature(tether.intent_key).parameters["scope"].default == ""
    once = inspect.signature(tether.Ledger.once).parameters
    assert (once["lookup"].default, once["lease"].default) == (None, 60.0)
    assert tether.Budget().max_identical_failures == 3
    loops = tether.LoopPolicy()
    assert (loops.max_repeats, dict(loops.allow_repeat), loops.min_steps, loops.max_no_progress, loops.detect_cycles) == (
        3, {"job_status": 30}, 0, 5, True)  # fmt: skip
    tool = inspect.signature(tether.Tool).parameters
    assert list(tool)[:7] == [
        "name",
        "fn",
        "input_schema",
        "description",
        "idempotent",
        "timeout",
        "lookup",
    ]
    guard = inspect.signature(tether.Guard).parameters
    assert list(guard)[:6] == ["budget", "loops", "clock", "ledger", "checkpoints", "dead_letters"]


def test_capture_events() -> None:
    """tether.testing.capture_events collects the frozen events of a block."""
    from tether.testing import capture_events

    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionResetError()
        return "ok"

    with capture_events() as events:
        tether.RetryPolicy(clock=tether.VirtualClock()).call(flaky)
        with tether.Guard(clock=tether.VirtualClock()).start() as run:
            run.proceed()
            run.succeed("done")
    assert [type(e).__name__ for e in events] == ["RetryEvent", "Outcome"]


def test_the_reset_fixture(tether_reset: None) -> None:
    """pytest_plugins = ["tether.testing"] gives a fixture that resets process-wide state."""
    tether.breakers.get("x", failure_threshold=1)
    assert "x" in tether.breakers
