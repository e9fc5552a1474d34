"""Sync and async are one behaviour: every case of the core run through both shells.

Each case is a function of the shell ("sync" or "async") that returns what a caller sees:
the result or the error (type and message), how often the dependency was called, the
virtual time that passed, what the ledger recorded, and (with OpenTelemetry configured)
the spans. The two shells must return the same observation, and each case also checks
the observation itself, so a case cannot pass by both shells being wrong alike.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tether import (
    AdaptiveLimiter,
    CircuitBreaker,
    CircuitOpenError,
    DeadlineExceeded,
    EffectInProgress,
    Kind,
    Ledger,
    LimiterTimeout,
    RetryBudget,
    RetryPolicy,
    StoreUnavailable,
    UnknownOutcome,
    VirtualClock,
    classify,
)
from tether.stores import MemoryStore
from tether.stores._ledger_logic import Record, State

SHELLS = ("sync", "async")


class HTTPError(Exception):
    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"HTTP {status}")
        self.status_code = status
        self.headers = headers or {}


class Dependency:
    """A scripted dependency: each call takes the next outcome (an exception is raised);
    after the script, it answers ``default``."""

    def __init__(
        self,
        *script: Any,
        default: Any = "ok",
        clock: VirtualClock | None = None,
        takes: float = 0.0,
    ) -> None:
        self.script = list(script)
        self.default = default
        self.calls = 0
        self.clock = clock
        self.takes = takes

    def _next(self) -> Any:
        self.calls += 1
        outcome = self.script.pop(0) if self.script else self.default
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def __call__(self) -> Any:
        if self.takes and self.clock is not None:
            self.clock.sleep(self.takes)
        return self._next()

    async def acall(self) -> Any:
        if self.takes and self.clock is not None:
            await self.clock.asleep(self.takes)
        return self._next()


def run(
    shell: str, sync: Callable[[], Any], make_async: Callable[[], Awaitable[Any]]
) -> dict[str, Any]:
    """What the caller sees of one call in ``shell``: result or error."""
    try:
        result = sync() if shell == "sync" else asyncio.run(make_async())  # type: ignore[arg-type]
    except Exception as exc:
        return {"error": (type(exc).__name__, str(exc))}
    return {"result": result}


def both(case: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """The observation of ``case``, the same in both shells."""
    sync, async_ = case("sync"), case("async")
    assert sync == async_
    return sync


# --- retries ------------------------------------------------------------------------------


def retry_case(settings: dict[str, Any], *script: Any) -> Callable[[str], dict[str, Any]]:
    def case(shell: str) -> dict[str, Any]:
        clock = VirtualClock()
        policy = RetryPolicy(clock=clock, seed=7, **settings)
        dep = Dependency(*script)
        stats: list[Any] = []

        def sync() -> Any:
            try:
                return policy.call(dep)
            finally:
                stats.append(policy.statistics)

        async def async_() -> Any:  # statistics are per task: read them inside it
            try:
                return await policy.acall(dep.acall)
            finally:
                stats.append(policy.statistics)

        seen = run(shell, sync, async_)
        last = stats[0]
        return {
            **seen,
            "calls": dep.calls,
            "waited": round(clock.now(), 6),
            "stats": (last.attempts, round(last.total_wait, 6)),
        }

    return case


RETRY_CASES: dict[str, tuple[dict[str, Any], tuple[Any, ...], dict[str, Any]]] = {
    "success": ({}, (), {"result": "ok", "calls": 1, "waited": 0.0}),
    "retry then success": (
        {"jitter": "none"},
        (ConnectionResetError("reset"), ConnectionResetError("reset")),
        {"result": "ok", "calls": 3, "waited": 1.5},
    ),
    "give up: the last error itself": (
        {"max_attempts": 3, "jitter": "none"},
        (HTTPError(503), HTTPError(503), HTTPError(502)),
        {"error": ("HTTPError", "HTTP 502"), "calls": 3, "waited": 1.5},
    ),
    "permanent: one call": (
        {"jitter": "none"},
        (ValueError("no such order"),),
        {"error": ("ValueError", "no such order"), "calls": 1, "waited": 0.0},
    ),
    "Retry-After is a floor": (
        {"max_attempts": 2, "jitter": "none"},
        (HTTPError(429, {"retry-after": "7"}),),
        {"result": "ok", "calls": 2, "waited": 7.0},
    ),
    "deadline: stop before a wait past it": (
        {"deadline": 1.0, "base": 2.0, "jitter": "none"},
        (HTTPError(503),),
        {"calls": 1, "waited": 0.0},
    ),
    "a breaker or limiter refusal inside the function ends the call at once": (
        {"jitter": "none"},
        (CircuitOpenError("inner", 10.0, 0.0, retry_in=10.0),),
        {"calls": 1, "waited": 0.0},
    ),
}


@pytest.mark.parametrize("name", list(RETRY_CASES))
def test_retry_behaviour_is_one(name: str) -> None:
    """RetryPolicy.call and .acall: same result or error, calls, waits and statistics."""
    settings, script, expected = RETRY_CASES[name]
    seen = both(retry_case(settings, *script))
    assert {k: seen[k] for k in expected} == expected
    if name.startswith("deadline"):
        assert seen["error"][0] == DeadlineExceeded.__name__
    if name.startswith("a breaker"):
        assert seen["error"][0] == "CircuitOpenError"


def test_retry_budget_refuses_the_same_retries() -> None:
    """A spent retry budget re-raises the last error in both shells, after the same calls."""

    def case(shell: str) -> dict[str, Any]:
        clock = VirtualClock()
        budget = RetryBudget(capacity=10, retry_cost=5, store=MemoryStore())
        policy = RetryPolicy(max_attempts=5, jitter="none", budget=budget, clock=clock)
        dep = Dependency(*[HTTPError(503)] * 5)
        seen = run(shell, lambda: policy.call(dep), lambda: policy.acall(dep.acall))
        return {**seen, "calls": dep.calls, "tokens": budget.tokens}

    assert both(case) == {"error": ("HTTPError", "HTTP 503"), "calls": 3, "tokens": 0.0}


def test_retry_with_breaker_and_limiter_is_one() -> None:
    """The guards' operations (permit, admission, outcomes) in the same order and effect."""

    def case(shell: str) -> dict[str, Any]:
        clock, store = VirtualClock(), MemoryStore()
        breaker = CircuitBreaker("dep", failure_threshold=2, store=store, clock=clock)
        limiter = AdaptiveLimiter("dep", store=store, clock=clock, initial_rate=2.0)
        policy = RetryPolicy(
            max_attempts=5, jitter="none", breaker=breaker, limiter=limiter, clock=clock
        )
        dep = Dependency(*[HTTPError(503)] * 5)
        seen = run(shell, lambda: policy.call(dep), lambda: policy.acall(dep.acall))
        return {
            **seen,
            "calls": dep.calls,
            "state": breaker.state,
            "rate": limiter.rate,
            "waited": round(clock.now(), 6),
        }

    seen = both(case)
    assert (seen["calls"], seen["state"], seen["error"][0]) == (2, "open", "CircuitOpenError")


def spans_of(exporter: Any) -> list[tuple[str, str | None, dict[str, Any]]]:
    by_id = {s.context.span_id: s.name for s in exporter.get_finished_spans()}
    return [
        (s.name, by_id.get(s.parent.span_id) if s.parent else None, dict(s.attributes or {}))
        for s in exporter.get_finished_spans()
    ]


def test_retry_spans_are_one(otel: Any) -> None:
    """call and acall make the same spans: one per call, one child per attempt, same attributes."""
    exporter, _ = otel

    def case(shell: str) -> dict[str, Any]:
        exporter.clear()
        policy = RetryPolicy(max_attempts=3, jitter="none", name="pay", clock=VirtualClock())
        dep = Dependency(ConnectionResetError("reset"), HTTPError(429))
        seen = run(shell, lambda: policy.call(dep), lambda: policy.acall(dep.acall))
        return {**seen, "spans": spans_of(exporter)}

    seen = both(case)
    names = [(name, parent) for name, parent, _ in seen["spans"]]
    assert names == [("tether.attempt", "tether.retry pay")] * 3 + [("tether.retry pay", None)]
    assert [a.get("tether.verdict") for _, _, a in seen["spans"]] == [
        "transient",
        "rate_limited",
        None,
        "success",
    ]


def test_spans_through_the_attempt_hook_are_one(otel: Any) -> None:
    """call_within / acall_within with the attempt hook (what a run's tool pipeline uses)."""
    from tether.telemetry._attempts import attempt_spans

    exporter, _ = otel

    def case(shell: str) -> dict[str, Any]:
        exporter.clear()
        policy = RetryPolicy(max_attempts=3, jitter="none", clock=VirtualClock())
        dep = Dependency(ConnectionResetError("reset"))
        hook = attempt_spans({"gen_ai.tool.name": "search"}, metric_name="search")
        seen = run(
            shell,
            lambda: policy.call_within(10.0, dep, hook=hook),
            lambda: policy.acall_within(10.0, dep.acall, hook=hook),
        )
        return {**seen, "spans": spans_of(exporter)}

    seen = both(case)
    assert [(n, a["tether.attempt"]) for n, _, a in seen["spans"]] == [
        ("tether.attempt", 1),
        ("tether.attempt", 2),
    ]


# --- the ledger ---------------------------------------------------------------------------


def ledger_call(shell: str, ledger: Ledger, key: str, dep: Dependency, **kw: Any) -> dict[str, Any]:
    return run(
        shell, lambda: ledger.once(key, dep, **kw), lambda: ledger.aonce(key, dep.acall, **kw)
    )


def state_of(ledger: Ledger, key: str) -> str | None:
    record = ledger.get(key)
    return None if record is None else record.state.value


LEDGERS = {
    "memory, virtual clock": lambda: Ledger.memory(clock=VirtualClock()),
    "memory, real clock": Ledger.memory,
}


@pytest.mark.parametrize("kind", list(LEDGERS))
def test_ledger_new_and_replay_are_one(kind: str) -> None:
    """A new key runs the effect and records it; the next call replays it."""

    def case(shell: str) -> dict[str, Any]:
        ledger, dep = LEDGERS[kind](), Dependency(default={"refund": "re_1"})
        first = ledger_call(shell, ledger, "k", dep)
        again = ledger_call(shell, ledger, "k", dep)
        return {"first": first, "again": again, "calls": dep.calls, "state": state_of(ledger, "k")}

    assert both(case) == {
        "first": {"result": {"refund": "re_1"}},
        "again": {"result": {"refund": "re_1"}},
        "calls": 1,
        "state": "done",
    }


def test_ledger_permanent_failure_replays() -> None:
    """A permanent failure is recorded and raised again, without a second call."""

    def case(shell: str) -> dict[str, Any]:
        ledger, dep = Ledger.memory(), Dependency(ValueError("card declined"))
        first = ledger_call(shell, ledger, "k", dep)
        again = ledger_call(shell, ledger, "k", dep)
        return {"first": first, "again": again, "calls": dep.calls, "state": state_of(ledger, "k")}

    seen = both(case)
    assert seen["first"] == seen["again"] == {"error": ("ValueError", "card declined")}
    assert (seen["calls"], seen["state"]) == (1, "failed")


def test_ledger_in_progress_is_one() -> None:
    """Another worker's live claim: EffectInProgress (same message), the effect does not run."""

    def case(shell: str) -> dict[str, Any]:
        clock = VirtualClock()
        ledger, dep = Ledger.memory(clock=clock), Dependency()
        ledger.backend.claim(Record.claim_of("k", None, "other", 30.0, 60.0), clock.wall())
        return {**ledger_call(shell, ledger, "k", dep), "calls": dep.calls}

    seen = both(case)
    assert (seen["error"][0], seen["calls"]) == ("EffectInProgress", 0)


@pytest.mark.parametrize(
    ("lookup", "expected"),
    [
        (None, {"calls": 0, "state": "unknown"}),
        (lambda key: {"found": key}, {"result": {"found": "k"}, "calls": 0, "state": "done"}),
        (lambda key: None, {"result": "ok", "calls": 1, "state": "done"}),
    ],
)
def test_ledger_unknown_outcome_and_lookup_are_one(lookup: Any, expected: dict[str, Any]) -> None:
    """A claim whose owner died: UnknownOutcome without lookup; lookup's answer, or fn runs."""

    def case(shell: str) -> dict[str, Any]:
        clock = VirtualClock()
        ledger, dep = Ledger.memory(clock=clock), Dependency()
        ledger.backend.claim(Record.claim_of("k", None, "dead", 5.0, 60.0), clock.wall())
        clock.advance(10.0)  # its lease ran out without renewal: the worker crashed
        seen = ledger_call(shell, ledger, "k", dep, lookup=lookup)
        return {**seen, "calls": dep.calls, "state": state_of(ledger, "k")}

    seen = both(case)
    assert {k: seen[k] for k in expected} == expected
    if lookup is None:
        assert seen["error"][0] == UnknownOutcome.__name__


def test_ledger_timeout_leaves_the_outcome_unknown() -> None:
    """An effect past its timeout: UnknownOutcome and an UNKNOWN record in both shells (the
    message says what each shell could do: a sync effect keeps running, an async one is
    cancelled)."""

    def case(shell: str) -> dict[str, Any]:
        ledger = Ledger.memory()

        def slow() -> str:
            time.sleep(0.3)
            return "late"

        async def aslow() -> str:
            await asyncio.sleep(0.3)
            return "late"

        seen = run(
            shell,
            lambda: ledger.once("k", slow, timeout=0.05),
            lambda: ledger.aonce("k", aslow, timeout=0.05),
        )
        return {"error": seen["error"][0], "state": state_of(ledger, "k")}

    assert both(case) == {"error": "UnknownOutcome", "state": "unknown"}


def test_ledger_interrupted_effect_is_unknown() -> None:
    """An effect interrupted mid-way (KeyboardInterrupt / cancellation) is recorded UNKNOWN."""
    sync_ledger, async_ledger = Ledger.memory(), Ledger.memory()

    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sync_ledger.once("k", interrupted)

    async def cancelled() -> None:
        task = asyncio.create_task(async_ledger.aonce("k", asyncio.sleep, 10))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    assert state_of(sync_ledger, "k") == state_of(async_ledger, "k") == "unknown"
    assert sync_ledger.get("k").detail == "interrupted by KeyboardInterrupt"  # type: ignore[union-attr]
    assert async_ledger.get("k").detail == "interrupted by CancelledError"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("key", "settings", "message"),
    [
        ("", {}, "key must be a non-empty string"),
        ("k", {"timeout": -1}, "timeout must be > 0 or None, got -1"),
        ("k", {"timeout": 0}, "timeout must be > 0 or None, got 0"),
        ("k", {"lease": 0}, "lease must be > 0, got 0"),
        ("k", {"lease": True}, "lease must be > 0, got True"),
    ],
)
def test_ledger_invalid_arguments_are_refused_alike(
    key: str, settings: dict[str, Any], message: str
) -> None:
    """Bad arguments: the same ValueError, and the effect never runs, in both shells."""

    def case(shell: str) -> dict[str, Any]:
        ledger, dep = Ledger.memory(), Dependency()
        return {**ledger_call(shell, ledger, key, dep, **settings), "calls": dep.calls}

    assert both(case) == {"error": ("ValueError", message), "calls": 0}


# --- breaker and limiter ------------------------------------------------------------------


def test_breaker_counts_alike() -> None:
    """breaker.call and .acall: the same errors, trip and refusal."""

    def case(shell: str) -> dict[str, Any]:
        clock = VirtualClock()
        breaker = CircuitBreaker(
            "dep", failure_threshold=2, cooldown=5.0, store=MemoryStore(), clock=clock
        )
        dep = Dependency(ValueError("bad request"), HTTPError(503), HTTPError(502))
        seen = [
            run(shell, lambda: breaker.call(dep), lambda: breaker.acall(dep.acall))
            for _ in range(4)
        ]
        return {"seen": seen, "calls": dep.calls, "state": breaker.state}

    seen = both(case)
    # a 400 is the caller's fault: it does not count; the 2nd retryable failure trips it
    assert [s.get("error", ("", ""))[0] for s in seen["seen"]] == [
        "ValueError",
        "HTTPError",
        "HTTPError",
        "CircuitOpenError",
    ]
    assert (seen["calls"], seen["state"]) == (3, "open")


def test_limiter_admission_is_one() -> None:
    """acquire and aacquire: the same waits, the same LimiterTimeout."""

    def case(shell: str) -> dict[str, Any]:
        clock = VirtualClock()
        limiter = AdaptiveLimiter(
            "dep", store=MemoryStore(), clock=clock, initial_rate=1.0, min_rate=1.0
        )
        waits = [
            run(
                shell, lambda: limiter.acquire(max_wait=0.5), lambda: limiter.aacquire(max_wait=0.5)
            )
            for _ in range(4)
        ]
        return {"waits": waits, "now": round(clock.now(), 6)}

    seen = both(case)
    errors = [w["error"][0] for w in seen["waits"] if "error" in w]
    assert errors and set(errors) == {LimiterTimeout.__name__}


# --- classification of tether's own errors ------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [EffectInProgress("k", 0.0), StoreUnavailable("redis did not answer")],
)
def test_tethers_own_refusals_are_transient_and_local(error: Exception) -> None:
    """In progress is no failure of the dependency, an unavailable store executed nothing:
    both transient (a retry may clear them), neither counted against the dependency."""
    verdict = classify(error)
    assert (verdict.kind, verdict.retryable, verdict.local, verdict.outcome_unknown) == (
        Kind.TRANSIENT,
        True,
        True,
        False,
    )

    def case(shell: str) -> dict[str, Any]:
        clock = VirtualClock()
        breaker = CircuitBreaker("dep", failure_threshold=1, store=MemoryStore(), clock=clock)
        policy = RetryPolicy(max_attempts=2, jitter="none", breaker=breaker, clock=clock)
        dep = Dependency(error)
        seen = run(shell, lambda: policy.call(dep), lambda: policy.acall(dep.acall))
        return {**seen, "calls": dep.calls, "state": breaker.state}

    # retried, and the breaker (threshold 1) did not trip on it
    assert both(case) == {"result": "ok", "calls": 2, "state": "closed"}


def test_an_effect_that_hits_another_claim_is_not_recorded_failed() -> None:
    """An effect that raised EffectInProgress (a nested claim) ran nothing: its claim is
    released, not recorded FAILED, so a later call runs it."""
    ledger = Ledger.memory()
    dep = Dependency(EffectInProgress("inner", 0.0))
    with pytest.raises(EffectInProgress):
        ledger.once("outer", dep)
    assert ledger.get("outer") is None
    assert ledger.once("outer", dep) == "ok"
    assert ledger.get("outer").state is State.DONE  # type: ignore[union-attr]
