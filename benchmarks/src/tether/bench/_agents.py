"""The agent suite: every scenario under every policy, on virtual time.

The policies are the loops people run today and tether:

* ``naive``: no guards; an error goes back to the model as raw text and the model
  tries again at once; a 100-step safety cap (hits count as runaway).
* ``tenacity``: tool calls wrapped in the real tenacity package
  (``wait_exponential_jitter`` + ``stop_after_attempt(5)``) and a 25-step cap.
* ``seed-harness``: seed 002's harness with its thresholds (10 steps, 5 retries,
  120 s, 15 s tool timeout, escalate above 5 retries or 8 steps, a repetition detector
  over identical calls after 5 steps).
* ``tether``: a :class:`tether.Guard` with its defaults, the scenario's budget and retry
  count (5 retries, as in seed 002), a memory ledger for the non-idempotent tool, and
  ``Escalation()`` with its default triggers; tool calls get a 15 s timeout.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

from tether import (
    Escalation,
    Guard,
    Ledger,
    Price,
    PriceTable,
    RetryPolicy,
    StopReason,
    ToolError,
    VirtualClock,
)
from tether.bench._worlds import HANG, MODEL, SCENARIOS, Action, Final, Scenario, World
from tether.stores import MemoryStore

__all__ = ["POLICIES", "TaskResult", "run_cell"]

#: every policy is billed at $3 / $15 per million tokens: fixed (not MODEL's list price of the
#: day, $2 / $10 for claude-sonnet-5-5 in 2026-12) so the suite's figures stay comparable
#: across releases and model renames
PRICE_IN, PRICE_OUT = 3.0 / 1e6, 15.0 / 1e6
#: that price, given to the guard as a user may (no per-call look-up in genai-prices)
PRICES = PriceTable({MODEL: Price(3.0, 15.0, 3.75, 0.30)})
SAFETY_CAP = 100


@dataclass
class TaskResult:
    status: str  # success | escalated | stopped | runaway
    reason: str
    steps: int
    attempts: int
    latency: float
    tokens: int
    cost: float
    dependency_calls: int
    duplicates: int


@dataclass
class _Tally:
    steps: int = 0
    tokens: int = 0
    cost: float = 0.0

    def model(self, input_tokens: int, output_tokens: int) -> None:
        self.tokens += input_tokens + output_tokens
        self.cost += input_tokens * PRICE_IN + output_tokens * PRICE_OUT


def _result(world: World, tally: _Tally, status: str, reason: str) -> TaskResult:
    duplicates = sum(n - 1 for n in world.paid.values() if n > 1)
    return TaskResult(
        status,
        reason,
        tally.steps,
        world.dependency_calls,
        world.clock.now(),
        tally.tokens,
        tally.cost,
        world.dependency_calls,
        duplicates,
    )


def _accept(final: Final) -> tuple[str, str]:
    """A loop without guards takes any final reply as the answer; a cut one is wrong."""
    return ("stopped", "ACCEPTED_TRUNCATED") if final.truncated else ("success", "GOAL_REACHED")


# --- naive and tenacity: the loops people run today ---------------------------------


def _unguarded(
    scenario: Scenario, rng: random.Random, cap: int, call: Any, prepare: Any = None
) -> TaskResult:
    """A loop with a step cap and nothing else; ``call(world, move)`` runs one tool call.

    An error goes back to the model as raw text and the model tries again. ``prepare()``
    runs once the world is built.
    """
    world = World(scenario, rng, VirtualClock())
    if prepare is not None:
        prepare()
    tally = _Tally()
    last: Any = None
    while tally.steps < cap and world.clock.now() < HANG:
        tally.steps += 1
        move, i, o = world.model_call(tally.steps, last)
        tally.model(i, o)
        if isinstance(move, Final):
            return _result(world, tally, *_accept(move))
        try:
            last = call(world, move)
        except Exception as exc:
            last = f"Error: {exc}"
    if cap == SAFETY_CAP or world.clock.now() >= HANG:
        return _result(world, tally, "runaway", "SAFETY_CAP" if cap == SAFETY_CAP else "HUNG")
    return _result(world, tally, "stopped", "MAX_STEPS")


def run_naive(scenario: Scenario, rng: random.Random) -> TaskResult:
    return _unguarded(
        scenario, rng, SAFETY_CAP, lambda world, move: world.tool(move.tool)(**move.args)
    )


def run_tenacity(scenario: Scenario, rng: random.Random) -> TaskResult:
    import tenacity

    def seed() -> None:  # tenacity draws its jitter from the global random module
        random.seed(rng.getrandbits(64))

    def call(world: World, move: Action) -> Any:
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(5),
            wait=tenacity.wait_exponential_jitter(multiplier=0.5, max=30),
            sleep=world.clock.sleep,
            reraise=True,
        )
        return retrying(world.tool(move.tool), **move.args)

    return _unguarded(scenario, rng, 25, call, prepare=seed)


# --- seed 002's harness ---------------------------------------------------------------


def run_seed_harness(scenario: Scenario, rng: random.Random) -> TaskResult:
    clock = VirtualClock()
    world = World(scenario, rng, clock)
    tally = _Tally()
    retries = 0
    history: list[str] = []
    last: Any = None
    while tally.steps < 10:
        if clock.now() > 120.0:
            return _result(world, tally, "stopped", "TIMEOUT")
        tally.steps += 1
        if tally.steps > 8:
            return _result(world, tally, "escalated", "ESCALATED")
        move, i, o = world.model_call(tally.steps, last)
        tally.model(i, o)
        if isinstance(move, Final):
            return _result(world, tally, *_accept(move))
        history.append(f"{move.tool}:{sorted(move.args.items())}")
        # the fixed detector: identical calls (arguments included), after 5 steps
        if tally.steps >= 5 and len(history) >= 6 and history[-3:] == history[-6:-3]:
            return _result(world, tally, "escalated", "LOOP_DETECTED")
        try:
            last = world.tool(move.tool)(**move.args)
            if last is None or not isinstance(last, dict):
                raise ValueError(f"Malformed output: {last}")
        except Exception as exc:
            retries += 1
            if retries > 5:
                return _result(world, tally, "escalated", "ESCALATED")
            delay = min(1.0 * 2**retries, 30.0)
            clock.sleep(delay + rng.uniform(0, 0.1 * delay))
            last = f"Error: {exc}"
        if clock.now() >= HANG:
            return _result(world, tally, "runaway", "HUNG")
    return _result(world, tally, "stopped", "MAX_STEPS")


# --- tether ---------------------------------------------------------------------------


def run_tether(scenario: Scenario, rng: random.Random) -> TaskResult:
    clock = VirtualClock()
    world = World(scenario, rng, clock)
    tally = _Tally()
    guard = Guard(
        budget=scenario.budget,
        clock=clock,
        ledger=Ledger.memory(clock=clock),
        retry=RetryPolicy(max_attempts=scenario.max_retries + 1, seed=rng.getrandbits(32)),
        escalation=Escalation(),
        store=MemoryStore(),
        prices=PRICES,
    )
    last: Any = None
    continued = False
    with guard.start(task=scenario.name) as run:
        while run.proceed():
            tally.steps += 1
            move, i, o = world.model_call(tally.steps, last)
            tally.model(i, o)
            run.record_model_call(input_tokens=i, output_tokens=o, model=MODEL)
            if isinstance(move, Final):
                if not move.truncated:
                    run.succeed(move.answer)
                elif not continued:  # cut at max_tokens: continue once with a larger limit
                    continued = True
                    world.memory["continued"] = True
                    last = {"rows": 1, "continue": True}
                    continue
                else:
                    run.stop(StopReason.TRUNCATED, "reply cut at max_tokens twice")
                break
            try:
                last = run.call_tool(
                    move.tool,
                    world.tool(move.tool),
                    move.args,
                    timeout=scenario.tool_timeout,
                    idempotent=scenario.idempotent(move.tool),
                    lookup=world.lookup(move.tool),
                )
            except ToolError as exc:
                last = f"Error: {exc.model_message}"
            if scenario.observe_state and world.state is not None:
                run.observe_state(world.state)
    out = run.outcome
    status = {"success": "success", "escalated": "escalated"}.get(out.status, "stopped")
    if tally.steps >= SAFETY_CAP:
        status = "runaway"
    return _result(world, tally, status, out.stopped_because.name)


POLICIES = {
    "naive": run_naive,
    "tenacity": run_tenacity,
    "seed-harness": run_seed_harness,
    "tether": run_tether,
}


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def run_cell(scenario_name: str, policy: str, tasks: int, seed: int) -> dict[str, Any]:
    """Run ``tasks`` tasks of one scenario under one policy; the DESIGN.md metrics."""
    scenario = SCENARIOS[scenario_name]
    runner = POLICIES[policy]
    results = []
    for i in range(tasks):
        rng = random.Random(f"{seed}:{scenario_name}:{i}")  # the same worlds for every policy
        results.append(runner(scenario, rng))
    n = len(results)
    stopped = Counter(r.reason for r in results if r.status != "success")
    false_stops = 0
    if scenario.legitimate:
        false_stops = sum(1 for r in results if r.status in ("stopped", "escalated"))
    latencies = [r.latency for r in results]
    return {
        "tasks": n,
        "success": round(sum(r.status == "success" for r in results) / n, 4),
        "escalated": round(sum(r.status == "escalated" for r in results) / n, 4),
        "stopped": dict(sorted(stopped.items())),
        "false_stops": false_stops,
        "runaway": sum(r.status == "runaway" for r in results),
        "duplicate_effects": sum(r.duplicates for r in results),
        "avg_steps": round(sum(r.steps for r in results) / n, 2),
        "avg_attempts": round(sum(r.attempts for r in results) / n, 2),
        "p50_latency_s": round(_percentile(latencies, 0.5), 2),
        "p95_latency_s": round(_percentile(latencies, 0.95), 2),
        "tokens": sum(r.tokens for r in results),
        "cost_usd": round(sum(r.cost for r in results), 4),
        "dependency_calls": sum(r.dependency_calls for r in results),
        "latency_samples": sorted(
            round(v, 3) for v in latencies
        ),  # for the report's CDFs, not the JSON
    }
