"""Guarded runs: budgets checked before the spend, loop detection, graceful stop."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

import tether
from tether import (
    Budget,
    Checkpoints,
    DeadLetters,
    Escalation,
    Guard,
    Handoffs,
    Ledger,
    LoopPolicy,
    RetryPolicy,
    StopReason,
    ToolError,
    VirtualClock,
)


def search(q: str) -> None:
    return None  # never finds anything


def make_guard(**kw: Any) -> Guard:
    kw.setdefault("clock", VirtualClock())
    kw.setdefault("retry", RetryPolicy(max_attempts=3, base=0.1, cap=1.0))
    return Guard(**kw)


# --- seed 000 examples ----------------------------------------------------------------


def test_seed_000_example_4_repeat_detector() -> None:
    """The same search: the third identical call trips the detector and never runs."""
    guard = make_guard()
    calls = []
    with guard.start(task="find invoice 99") as run:
        while run.proceed():
            run.call_tool("search", lambda q: calls.append(q), {"q": "invoice 99"})
    assert calls == ["invoice 99", "invoice 99"]
    assert run.outcome.stopped_because is StopReason.REPEATED_ACTION
    assert run.outcome.status == "partial"


def test_seed_000_example_5_state_cycle() -> None:
    """A -> B -> A: the third state repeats a seen hash; key order cannot hide it."""
    guard = make_guard()
    states = [{"pos": "A", "k": 1}, {"pos": "B", "k": 1}, {"k": 1, "pos": "A"}]
    seen = []
    with guard.start() as run:
        while run.proceed():
            state = states[len(seen)]
            seen.append(state["pos"])
            run.call_tool("move", lambda to: {"at": to}, {"to": state["pos"] + str(len(seen))})
            run.observe_state(state)
    assert seen == ["A", "B", "A"]
    assert run.outcome.stopped_because is StopReason.STATE_CYCLE


def partial_texts(run: tether.Run) -> list[str]:
    return [f"step {e['step'] - 1}: tried {e['tool']}" for e in run.outcome.partial]


def test_seed_000_example_6_three_stops_all_with_partial_results() -> None:
    """Loop, time and step stops each return the work completed so far."""
    # loop detected: same action 3x at step 2
    guard = make_guard()
    with guard.start() as run:
        while run.proceed():
            run.call_tool("search", search, {"q": "invoice 99"})
    assert run.outcome.stopped_because is StopReason.REPEATED_ACTION
    assert "step 3" in run.outcome.detail
    assert partial_texts(run) == ["step 0: tried search", "step 1: tried search"]

    # time budget exceeded at step 3
    clock = VirtualClock()
    guard = make_guard(clock=clock, budget=Budget(max_seconds=30.0))
    with guard.start() as run:
        while run.proceed():
            run.call_tool("search", search, {"q": f"invoice {run.steps}"})
            clock.advance(10.0)
    assert run.outcome.stopped_because is StopReason.TIMEOUT
    assert partial_texts(run) == [
        "step 0: tried search",
        "step 1: tried search",
        "step 2: tried search",
    ]

    # max steps (3) reached
    guard = make_guard(budget=Budget(max_steps=3))
    with guard.start() as run:
        while run.proceed():
            run.call_tool("search", search, {"q": f"invoice {run.steps}"})
    assert run.outcome.stopped_because is StopReason.MAX_STEPS
    assert run.outcome.detail == "max steps (3) reached"
    assert len(run.outcome.partial) == 3


# --- seed 001 budget table: each budget catches its failure ---------------------------


def test_model_calls_per_run_catch_endless_tool_use() -> None:
    """Tool use that never ends: the model-call budget stops it before call N+1."""
    guard = make_guard(budget=Budget(max_model_calls=4), loops=LoopPolicy(max_no_progress=None))
    model_calls = 0
    with guard.start() as run:
        while run.proceed():
            model_calls += 1
            run.record_model_call(input_tokens=100, output_tokens=20, model="claude-sonnet-5-5")
            run.call_tool("lookup", lambda n: n, {"n": run.steps})
    assert model_calls == 4
    assert run.outcome.stopped_because is StopReason.MAX_MODEL_CALLS


def test_time_per_run_catches_a_dragging_run() -> None:
    """A run that drags on stops on its clock."""
    clock = VirtualClock()
    guard = make_guard(clock=clock, budget=Budget(max_seconds=60.0))
    with guard.start() as run:
        while run.proceed():
            clock.advance(25.0)
            run.call_tool("work", lambda n: n, {"n": run.steps})
    assert run.outcome.stopped_because is StopReason.TIMEOUT
    assert run.outcome.usage.seconds == 75.0


def test_money_per_run_stops_before_the_call_that_would_pass_it() -> None:
    """Costs grow each call; the run stops before the call that would break the budget."""
    guard = make_guard(budget=Budget(max_cost_usd=1.0), loops=LoopPolicy(max_no_progress=None))
    spent = []
    with guard.start() as run:
        while run.proceed():
            cost = 0.1 * run.steps
            run.record_model_call(input_tokens=1, output_tokens=1, cost_usd=cost)
            spent.append(cost)
    assert run.outcome.stopped_because is StopReason.MAX_COST
    assert sum(spent) <= 1.0
    assert run.outcome.usage.cost_usd == pytest.approx(sum(spent))


def test_tokens_per_run_stop_before_the_spend() -> None:
    """The token budget is checked against the next call's likely size."""
    guard = make_guard(budget=Budget(max_tokens=1000), loops=LoopPolicy(max_no_progress=None))
    with guard.start() as run:
        while run.proceed():
            run.record_model_call(input_tokens=200 + 10 * run.steps, output_tokens=50)
    assert run.outcome.stopped_because is StopReason.MAX_TOKENS
    assert run.outcome.usage.input_tokens + run.outcome.usage.output_tokens <= 1000


def test_identical_failures_stop_one_call_failing_the_same_way() -> None:
    """The same call failing the same way three times ends the run."""
    guard = make_guard(loops=LoopPolicy(max_repeats=10))
    attempts = 0

    def reject(order: str) -> None:
        nonlocal attempts
        attempts += 1
        raise ValueError("refund rejected by a business rule")

    errors = []
    with guard.start() as run:
        while run.proceed():
            try:
                run.call_tool("refund", reject, {"order": "A-1"})
            except ToolError as exc:
                errors.append(exc.model_message)
    assert attempts == 3
    assert run.outcome.stopped_because is StopReason.IDENTICAL_FAILURES
    assert errors == ["rejected: refund rejected by a business rule"] * 2


def test_max_tool_calls_refuses_the_next_call() -> None:
    """The tool-call budget refuses the call that would break it."""
    guard = make_guard(budget=Budget(max_tool_calls=2))
    ran = []
    with guard.start() as run:
        while run.proceed():
            run.call_tool("t", lambda n: ran.append(n), {"n": run.steps})
    assert ran == [1, 2]
    assert run.outcome.stopped_because is StopReason.MAX_TOOL_CALLS


def test_progress_extends_the_step_budget_up_to_a_ceiling() -> None:
    """Progress earns more steps, never beyond the ceiling."""
    guard = make_guard(budget=Budget(max_steps=3, progress_extension=2, max_steps_ceiling=6))
    with guard.start() as run:
        while run.proceed():
            run.call_tool("fetch", lambda page: {"page": page}, {"page": run.steps})
    assert run.outcome.usage.steps == 6
    assert run.outcome.stopped_because is StopReason.MAX_STEPS


# --- loops without false positives --------------------------------------------------


def test_polling_is_not_stopped() -> None:
    """Legitimate polling of job_status with identical arguments runs to completion."""
    guard = make_guard(budget=Budget(max_steps=40))
    polls = 0

    def job_status(job: str) -> dict[str, str]:
        nonlocal polls
        polls += 1
        return {"state": "done" if polls == 25 else "running"}

    with guard.start() as run:
        while run.proceed():
            status = run.call_tool("job_status", job_status, {"job": "j-1"})
            if status["state"] == "done":
                run.succeed("finished")
    assert run.outcome.status == "success"
    assert polls == 25


def test_polling_has_its_own_cap() -> None:
    """allow_repeat is a cap, not a blank cheque."""
    guard = make_guard(loops=LoopPolicy(allow_repeat={"job_status": 5}))
    with guard.start() as run:
        while run.proceed():
            run.call_tool("job_status", lambda job: {"state": "running"}, {"job": "j-1"})
    assert run.outcome.stopped_because is StopReason.REPEATED_ACTION
    assert len(run.outcome.partial) == 5


def test_tool_name_alone_is_never_a_loop() -> None:
    """Different arguments to the same tool are different actions."""
    guard = make_guard(budget=Budget(max_steps=10))
    with guard.start() as run:
        while run.proceed():
            run.call_tool("search", lambda q: {"hits": [q]}, {"q": f"page {run.steps}"})
    assert run.outcome.stopped_because is StopReason.MAX_STEPS


def test_min_steps_delays_detection() -> None:
    """No loop detection before min_steps."""
    guard = make_guard(loops=LoopPolicy(min_steps=5))
    with guard.start() as run:
        while run.proceed():
            run.call_tool("search", search, {"q": "x"})
    assert len(run.outcome.partial) == 5


def test_repeated_sequence_is_detected() -> None:
    """A B A B A B: the period detector stops the third repetition."""
    guard = make_guard()
    with guard.start() as run:
        while run.proceed():
            run.call_tool("act", lambda x: None, {"x": "ab"[(run.steps - 1) % 2]})
    assert run.outcome.stopped_because in (StopReason.REPEATED_SEQUENCE, StopReason.REPEATED_ACTION)
    assert len(run.outcome.partial) == 4


def test_sequence_of_three() -> None:
    """A B C A B C A B C: detected as a sequence before the repeats of any one call."""
    guard = make_guard(loops=LoopPolicy(max_repeats=3, window=64, max_no_progress=None))
    with guard.start() as run:
        while run.proceed():
            run.call_tool("act", lambda x: None, {"x": "abc"[(run.steps - 1) % 3]})
    assert run.outcome.stopped_because is StopReason.REPEATED_ACTION  # each call also repeats
    assert len(run.outcome.partial) == 6


def test_no_progress_stops_novel_but_useless_work() -> None:
    """Every action differs, nothing new is learned: stop after max_no_progress steps."""
    guard = make_guard(loops=LoopPolicy(max_no_progress=4))
    with guard.start() as run:
        while run.proceed():
            run.call_tool("browse", lambda url: {"found": None}, {"url": f"/page/{run.steps}"})
    assert run.outcome.stopped_because is StopReason.NO_PROGRESS
    assert run.outcome.usage.steps == 5  # one new result, then four steps of nothing


def test_explicit_progress_resets_the_counter() -> None:
    """run.progress() counts as a new fact."""
    guard = make_guard(budget=Budget(max_steps=12), loops=LoopPolicy(max_no_progress=3))
    with guard.start() as run:
        while run.proceed():
            run.call_tool("think", lambda n: None, {"n": run.steps})
            run.progress("sub-goal done")
    assert run.outcome.stopped_because is StopReason.MAX_STEPS


def test_detector_memory_is_bounded() -> None:
    """A long run keeps the detectors' memory constant."""
    guard = make_guard(loops=LoopPolicy(max_no_progress=None))

    def measure(steps: int) -> int:
        run = guard.start()
        tracemalloc.start()
        for i in range(steps):
            run._loops.record_action("t", f"{i:064x}")
            run._loops.observe_state(f"{i:064x}", i)
        size, _peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return size

    small, large = measure(5_000), measure(50_000)
    assert large < small * 1.5


# --- failures and the ways out ------------------------------------------------------


def test_transient_failures_are_retried_and_never_reach_the_model() -> None:
    """A blip is retried inside tether; the model sees the result."""
    guard = make_guard()
    calls = 0

    def flaky(q: str) -> dict[str, str]:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionResetError("reset by peer")
        return {"hit": q}

    with guard.start() as run:
        run.proceed()
        assert run.call_tool("search", flaky, {"q": "x"}) == {"hit": "x"}
        run.succeed("ok")
    assert run.outcome.usage.retries == 2


def test_exhausted_retries_give_a_short_fixed_tool_error() -> None:
    """After the retries the model gets 'temporarily unavailable', never the raw error."""
    guard = make_guard()

    def down(q: str) -> None:
        raise ConnectionResetError("10.0.0.7:5432 reset by peer")

    with guard.start() as run:
        run.proceed()
        with pytest.raises(ToolError) as info:
            run.call_tool("search", down, {"q": "x"})
    assert "10.0.0.7" not in info.value.model_message
    assert "temporarily unavailable" in info.value.model_message


def test_hanging_tool_times_out() -> None:
    """A hanging tool is cut off by its per-call timeout on the run's clock."""
    clock = VirtualClock()
    guard = make_guard(clock=clock, budget=Budget(max_seconds=120.0))

    def hang(q: str) -> None:
        clock.sleep(3600)

    with guard.start() as run:
        while run.proceed():
            try:
                run.call_tool("search", hang, {"q": "x"}, timeout=15.0)
            except ToolError:
                pass
    assert run.outcome.stopped_because in (
        StopReason.IDENTICAL_FAILURES,
        StopReason.TIMEOUT,
        StopReason.CIRCUIT_OPEN,
    )
    assert clock.now() <= 120.0


def test_open_breaker_stops_the_run_and_escalates() -> None:
    """A dead dependency: retries, the breaker opens, the run escalates with a handoff."""
    handoffs: list[tether.HandoffRecord] = []
    guard = make_guard(escalation=Escalation(sink=handoffs.append), breaker_threshold=3)

    def refund(order: str) -> None:
        raise ConnectionRefusedError()

    with guard.start(task="refund order A-1") as run:
        while run.proceed():
            try:
                run.call_tool("issue_refund", refund, {"order": "A-1"}, idempotent=False)
            except ToolError:
                pass  # the model is told "temporarily unavailable" and tries again
    out = run.outcome
    assert (out.status, out.stopped_because) == ("escalated", StopReason.CIRCUIT_OPEN)
    assert len(handoffs) == 1
    assert handoffs[0].task == "refund order A-1"
    assert "ConnectionRefused" not in out.customer_message
    assert "colleague" in out.customer_message or "team" in out.customer_message


def test_customer_is_told_an_effect_happened_only_from_the_ledger() -> None:
    """The refund went through: the message says so because the ledger records it."""
    ledger = Ledger.memory()
    guard = make_guard(ledger=ledger, escalation=Escalation())
    with guard.start(task="refund") as run:
        run.proceed()
        run.call_tool(
            "issue_refund",
            lambda order: {"id": "re_123"},
            {"order": "A-1"},
            idempotent=False,
            label="refund",
        )
        run.escalate("customer asked for a person")
    assert run.outcome.status == "escalated"
    assert "Done: refund completed (reference re_123)" in run.outcome.customer_message
    assert run.outcome.handoff.facts == ("refund completed (reference re_123)",)


@pytest.mark.parametrize(
    "failure", [ConnectionError("the model is overloaded"), PermissionError("denied")]
)
def test_a_failed_run_never_hides_a_done_effect(failure: Exception) -> None:
    """A run that fails after a refund went through says the refund is done, never "try again"."""
    guard = make_guard()
    run = guard.start(task="refund")
    with pytest.raises(type(failure)), run:
        run.proceed()
        run.call_tool(
            "issue_refund", lambda order: {"id": "re_7"}, {"order": "A-1"}, idempotent=False
        )
        raise failure  # e.g. the model call failed after its retries
    assert run.outcome.status == "failed"
    assert "completed (reference re_7)" in run.outcome.customer_message
    assert "try again" not in run.outcome.customer_message.lower()


def test_model_reissue_with_fresh_uuid_pays_once() -> None:
    """The model re-issues the refund with a new uuid: the ledger replays, nothing is paid twice."""
    ledger = Ledger.memory()
    paid = []
    guard = make_guard(ledger=ledger)

    def refund(order: str, uuid: str) -> dict[str, str]:
        paid.append(order)
        return {"id": f"re_{len(paid)}"}

    with guard.start() as run:
        run.proceed()
        a = run.call_tool("issue_refund", refund, {"order": "A-1", "uuid": "u1"}, idempotent=False)
        run.proceed()
        b = run.call_tool("issue_refund", refund, {"order": "A-1", "uuid": "u2"}, idempotent=False)
        run.succeed(b)
    assert a == b == {"id": "re_1"}
    assert paid == ["A-1"]


def test_unknown_outcome_escalates() -> None:
    """A payment whose outcome is unknown and cannot be looked up goes to a person."""
    clock = VirtualClock()
    guard = make_guard(clock=clock, ledger=Ledger.memory(clock=clock), escalation=Escalation())

    def pay(order: str) -> None:
        raise TimeoutError("read timed out")

    with guard.start() as run:
        run.proceed()
        run.call_tool("pay", pay, {"order": "A-1"}, idempotent=False)
    assert (run.outcome.status, run.outcome.stopped_because) == (
        "escalated",
        StopReason.UNKNOWN_OUTCOME,
    )
    assert any("pay may have happened" in issue for issue in run.outcome.open_issues)


def test_escalation_triggers_on_retries_and_steps() -> None:
    """Seed 002's triggers: retries above N, steps above M."""
    guard = make_guard(escalation=Escalation(max_steps=3))
    with guard.start() as run:
        while run.proceed():
            run.call_tool("t", lambda n: n, {"n": run.steps})
    assert (run.outcome.status, run.outcome.stopped_because) == ("escalated", StopReason.ESCALATED)


def test_permanent_exception_in_the_loop_fails_the_run_and_propagates() -> None:
    """A bug in the agent's own code ends the run as failed and is not swallowed."""
    guard = make_guard()
    with pytest.raises(KeyError), guard.start() as run:
        run.proceed()
        raise KeyError("missing field")
    assert (run.outcome.status, run.outcome.stopped_because) == (
        "failed",
        StopReason.PERMANENT_ERROR,
    )


def test_leaving_the_loop_without_a_result_says_so() -> None:
    """Never swallow the stop reason: a loop left early is NO_RESULT."""
    guard = make_guard()
    with guard.start() as run:
        run.proceed()
    assert (run.outcome.status, run.outcome.stopped_because) == ("failed", StopReason.NO_RESULT)


def test_unknown_model_price_is_explicit() -> None:
    """A model with no price is an error, or an explicit zero."""
    guard = make_guard(budget=Budget(max_cost_usd=1.0))
    with guard.start() as run:
        run.proceed()
        with pytest.raises(KeyError, match="no price for model"):
            run.record_model_call(input_tokens=10, output_tokens=10, model="mystery-model")
        run.succeed()
    free = make_guard(prices=tether.PriceTable(unknown="zero"))
    with free.start() as run:
        run.proceed()
        assert (
            run.record_model_call(input_tokens=10, output_tokens=10, model="mystery-model") == 0.0
        )
        run.succeed()


def test_async_tool_calls_and_cancellation_of_a_hang() -> None:
    """acall_tool retries and times out a hanging coroutine."""
    clock = VirtualClock()
    guard = make_guard(clock=clock)

    async def slow(q: str) -> str:
        await clock.asleep(100)
        return "late"

    async def fast(q: str) -> str:
        return q

    async def main() -> tether.Run:
        async with guard.start() as run:
            run.proceed()
            assert await run.acall_tool("fast", fast, {"q": "x"}) == "x"
            with pytest.raises(ToolError):
                await run.acall_tool("slow", slow, {"q": "y"}, timeout=5.0)
            run.succeed()
        return run

    run = asyncio.run(main())
    assert run.outcome.status == "success"


# --- checkpoints, dead letters, handoffs --------------------------------------------


def test_checkpoint_on_stop_and_resume_with_the_remaining_budget(tmp_path: Path) -> None:
    """Every stop saves a checkpoint; resume continues with what was left."""
    checkpoints = Checkpoints.sqlite(str(tmp_path / "runs.db"))
    guard = make_guard(budget=Budget(max_steps=5), checkpoints=checkpoints)
    with guard.start(task="collect pages") as run:
        while run.proceed():
            run.call_tool("fetch", lambda page: {"page": page}, {"page": run.steps})
            if run.steps == 2:
                break
    ckpt = run.outcome.checkpoint_id
    assert ckpt is not None
    with guard.resume(ckpt) as resumed:
        while resumed.proceed():
            resumed.call_tool("fetch", lambda page: {"page": page}, {"page": resumed.steps})
    assert resumed.outcome.usage.steps == 5
    assert [e["args"]["page"] for e in resumed.outcome.partial] == [1, 2, 3, 4, 5]
    assert resumed.task == "collect pages"


def test_corrupt_or_foreign_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    """A checkpoint that is not ours, or broken, says so."""
    path = str(tmp_path / "runs.db")
    checkpoints = Checkpoints.sqlite(path)
    guard = make_guard(checkpoints=checkpoints)
    db = sqlite3.connect(path)
    db.execute("INSERT INTO tether_documents VALUES ('checkpoint', 'bad', 0, '{not json')")
    db.execute(
        "INSERT INTO tether_documents VALUES ('checkpoint', 'foreign', 0, ?)",
        (json.dumps({"format": "x"}),),
    )
    db.commit()
    db.close()
    with pytest.raises(tether.CheckpointError, match="corrupt"):
        guard.resume("bad")
    with pytest.raises(tether.CheckpointError, match="not a tether checkpoint"):
        guard.resume("foreign")
    with pytest.raises(tether.CheckpointError, match="no checkpoint"):
        guard.resume("missing")


def test_permanent_failures_are_dead_lettered_with_secrets_redacted() -> None:
    """A permanent failure is parked with its inputs, secrets removed."""
    letters = DeadLetters.memory()
    guard = make_guard(dead_letters=letters)

    def send(to: str, api_key: str, body: str) -> None:
        raise ValueError("mailbox does not exist")

    with guard.start(task="email") as run:
        run.proceed()
        with pytest.raises(ToolError):
            run.call_tool(
                "send_email",
                send,
                {"to": "a@b.c", "api_key": "sk-live-abcdef123456", "body": "Bearer abc.def"},
            )
        run.succeed()
    (letter,) = letters.list()
    assert letter.args == {"to": "a@b.c", "api_key": "[redacted]", "body": "Bearer [redacted]"}
    assert letter.redacted == ("args.api_key", "args.body")
    assert letter.error == "mailbox does not exist"
    replayed = letters.replay(letter.id, lambda redacted, **kw: (sorted(kw), redacted))
    assert replayed == (["api_key", "body", "to"], ["args.api_key", "args.body"])
    assert letters.get(letter.id).replayed


def test_handoff_table_sink(tmp_path: Path) -> None:
    """Handoffs can go to a table."""
    table = Handoffs.sqlite(str(tmp_path / "h.db"))
    guard = make_guard(escalation=Escalation(sink=table))
    with guard.start(task="t") as run:
        run.proceed()
        run.escalate("needs a person")
    (doc,) = table.list()
    assert doc["reason"] == "escalated"
    assert doc["task"] == "t"


def test_a_broken_sink_never_loses_the_outcome() -> None:
    """A sink that raises is logged; the outcome still says escalated."""

    def broken(record: Any) -> None:
        raise OSError("webhook down")

    guard = make_guard(escalation=Escalation(sink=broken))
    with guard.start() as run:
        run.proceed()
        run.escalate()
    assert run.outcome.status == "escalated"
    assert any("handoff delivery failed" in i for i in run.outcome.open_issues)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"max_steps": 0}, "max_steps must be an int >= 1"), ({"max_cost_usd": 0}, "max_cost_usd must be a number > 0"),
     ({"progress_extension": 2}, "progress_extension needs max_steps"),
     ({"max_steps": 5, "max_steps_ceiling": 3}, "max_steps_ceiling must be >= max_steps")],
)  # fmt: skip
def test_budget_validation(kwargs: dict[str, Any], message: str) -> None:
    """Bad budgets fail at construction, naming the field."""
    with pytest.raises(ValueError, match=message):
        Budget(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"max_repeats": 1}, "max_repeats must be an int >= 2"), ({"allow_repeat": {"poll": 0}}, "allow_repeat"),
     ({"max_no_progress": 0}, "max_no_progress must be an int >= 1")],
)  # fmt: skip
def test_loop_policy_validation(kwargs: dict[str, Any], message: str) -> None:
    """Bad loop settings fail at construction."""
    with pytest.raises(ValueError, match=message):
        LoopPolicy(**kwargs)


def test_unserialisable_arguments_name_the_path() -> None:
    """Tool arguments that cannot be encoded fail clearly, before the tool runs."""
    guard = make_guard()
    with guard.start() as run:
        run.proceed()
        with pytest.raises(TypeError, match=r"args.when.obj"):
            run.call_tool("t", lambda when: None, {"when": {"obj": object()}})
        run.succeed()


def test_hung_threads_piling_up_stop_the_run() -> None:
    """A sync tool that hangs past its timeout leaves a thread behind; too many stop the run."""
    import threading

    release = threading.Event()
    guard = Guard(budget=Budget(max_hung_threads=2, max_identical_failures=None),
                  retry=RetryPolicy(max_attempts=1), breaker_threshold=100)  # fmt: skip

    def hang(n: int) -> None:
        release.wait(10)

    try:
        with guard.start() as run:
            while run.proceed():
                try:
                    run.call_tool("hang", hang, {"n": run.steps}, timeout=0.05)
                except ToolError:
                    pass
        assert run.outcome.stopped_because is StopReason.HUNG_TOOLS
        assert run.outcome.usage.tool_calls == 2
    finally:
        release.set()
