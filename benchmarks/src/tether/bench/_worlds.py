"""The scenarios of the agent suite: a scripted model and fault-injecting tools.

Each task builds one :class:`World`. The simulated model is a small stochastic
policy (it picks the next tool call the way a healthy or a stuck model would);
the tools inject the faults. Time is the task's :class:`tether.VirtualClock`. The
payment tool keeps the provider's own records, so duplicates are counted by the
"provider", not by tether.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tether import Budget, TransientError
from tether._errors import Picklable
from tether.clock import VirtualClock

__all__ = ["SCENARIOS", "Action", "Final", "HTTPError", "Malformed", "Scenario", "World"]

MODEL_LATENCY = 1.5  # seconds per model call
TOOL_LATENCY = 0.2  # seconds per healthy tool call
HANG = 3600.0  # a hung call gives up (a socket timeout) after an hour
MODEL = "claude-sonnet-5-5"


class HTTPError(Picklable, Exception):
    """A dependency's HTTP error, shaped like the SDKs' (status_code, headers)."""

    def __init__(self, status: int, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status} from upstream 10.2.3.4:8443")
        self.status_code = status
        self.headers = {"retry-after": f"{retry_after:g}"} if retry_after is not None else {}


class Malformed(TransientError):
    """A tool answered with output that fails validation (a retry may be fine)."""


@dataclass(frozen=True, slots=True)
class Action:
    tool: str
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Final:
    answer: str
    truncated: bool = False


class World:
    """One task's world: the model's next move, the tools, the ground truth."""

    def __init__(self, scenario: Scenario, rng: random.Random, clock: VirtualClock) -> None:
        self.scenario = scenario
        self.rng = rng
        self.clock = clock
        self.dependency_calls = 0
        self.paid: Counter[str] = Counter()  # the payment provider's own records, by order
        self.state: dict[str, Any] | None = None
        self.done = False
        self.memory: dict[str, Any] = {}
        scenario.setup(self)

    # the model
    def model_call(self, step: int, last: Any) -> tuple[Action | Final, int, int]:
        """The model's next move, and its input/output tokens; takes model latency."""
        self.clock.advance(MODEL_LATENCY)
        move = self.scenario.model(self, step, last)
        input_tokens = self.scenario.input_tokens(step)
        return move, input_tokens, 150

    def tool(self, name: str) -> Callable[..., Any]:
        def call(**args: Any) -> Any:
            self.dependency_calls += 1
            return self.scenario.tool(self, name, args)

        return call

    def lookup(self, name: str) -> Callable[[str], Any] | None:
        return self.scenario.lookup(self, name)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    setup: Callable[[World], None]
    model: Callable[[World, int, Any], Action | Final]
    tool: Callable[[World, str, dict[str, Any]], Any]
    budget: Budget = field(default_factory=lambda: Budget(max_steps=25, max_seconds=600.0))
    legitimate: bool = False  # every task is legitimate work: any stop is a false stop
    tool_timeout: float = 15.0
    idempotent: Callable[[str], bool] = lambda name: True
    lookup: Callable[[World, str], Callable[[str], Any] | None] = lambda world, name: None
    tokens_growth: int = 300
    max_retries: int = 5  # attempts = max_retries + 1
    observe_state: bool = False

    def input_tokens(self, step: int) -> int:
        return 800 + self.tokens_growth * step


def _healthy(world: World) -> None:
    world.clock.advance(TOOL_LATENCY)


# --- seed-profile ---------------------------------------------------------------------


def _process_model(world: World, step: int, last: Any) -> Action | Final:
    if isinstance(last, dict) and last.get("success"):
        return Final("summary of the ticket")
    return Action("process", {"task": "summarize ticket"})


def _process_tool(world: World, name: str, args: dict[str, Any]) -> Any:
    r = world.rng.random()
    if r < 0.3:
        world.clock.sleep(16.0)  # hangs past the 15 s tool timeout
        raise TimeoutError("tool timed out")
    _healthy(world)
    if r < 0.4:
        raise Malformed("Malformed output: 'not a dict'")
    return {"success": True, "data": "processed"}


# --- rate-limit-storm -----------------------------------------------------------------


def _rl_setup(world: World) -> None:
    world.memory["limited"] = world.rng.randint(1, 6)  # 429s before the burst clears


def _fetch_model(world: World, step: int, last: Any) -> Action | Final:
    if isinstance(last, dict) and last.get("ok"):
        return Final("report")
    return Action("fetch", {"report": "q3"})


def _rl_tool(world: World, name: str, args: dict[str, Any]) -> Any:
    _healthy(world)
    if world.memory["limited"] > 0:
        world.memory["limited"] -= 1
        raise HTTPError(429, retry_after=world.rng.choice([1.0, 2.0, 3.0]))
    return {"ok": True}


# --- outage ---------------------------------------------------------------------------


def _outage_setup(world: World) -> None:
    world.memory["up_at"] = world.rng.uniform(0.0, 90.0)


def _outage_tool(world: World, name: str, args: dict[str, Any]) -> Any:
    _healthy(world)
    if world.clock.now() < world.memory["up_at"]:
        raise HTTPError(503)
    return {"ok": True}


# --- stuck-search, no-progress, state-cycle -------------------------------------------


def _stuck_model(world: World, step: int, last: Any) -> Action | Final:
    return Action("search", {"q": "invoice 99"})


def _search_tool(world: World, name: str, args: dict[str, Any]) -> Any:
    _healthy(world)
    return {"results": []}


def _novel_model(world: World, step: int, last: Any) -> Action | Final:
    return Action("browse", {"url": f"https://intranet/page/{step}-{world.rng.randrange(10**6)}"})


def _useless_tool(world: World, name: str, args: dict[str, Any]) -> Any:
    _healthy(world)
    return {"relevant": False}


def _cycle_setup(world: World) -> None:
    world.state = {"page": "A", "cart": 1}


def _cycle_model(world: World, step: int, last: Any) -> Action | Final:
    return Action(
        "navigate", {"click": f"link-{step}", "from": world.state["page"] if world.state else ""}
    )


def _cycle_tool(world: World, name: str, args: dict[str, Any]) -> Any:
    _healthy(world)
    assert world.state is not None
    world.state = {"cart": 1, "page": "B" if world.state["page"] == "A" else "A"}
    return {"page": world.state["page"], "step": args["click"]}


# --- polling --------------------------------------------------------------------------


def _poll_setup(world: World) -> None:
    world.memory["polls_needed"] = world.rng.randint(3, 20)


def _poll_model(world: World, step: int, last: Any) -> Action | Final:
    if isinstance(last, dict) and last.get("state") == "done":
        return Final("the export is ready")
    return Action("job_status", {"job": "export-7"})


def _poll_tool(world: World, name: str, args: dict[str, Any]) -> Any:
    _healthy(world)
    world.clock.advance(2.0)  # the model waits between polls
    world.memory["polls_needed"] -= 1
    return {"state": "done" if world.memory["polls_needed"] <= 0 else "running"}


# --- duplicate-payment ----------------------------------------------------------------


def _pay_setup(world: World) -> None:
    world.memory["lost"] = world.rng.randint(1, 8)  # responses lost before one gets through
    world.memory["by_uuid"] = {}


def _pay_model(world: World, step: int, last: Any) -> Action | Final:
    if isinstance(last, dict) and last.get("refund"):
        return Final("refund issued")
    # the model mints a fresh idempotency key on every attempt: it protects nothing
    return Action(
        "issue_refund",
        {"order": "A-1001", "amount": 4999, "uuid": f"{world.rng.getrandbits(64):016x}"},
    )


def _pay_tool(world: World, name: str, args: dict[str, Any]) -> Any:
    _healthy(world)
    by_uuid = world.memory["by_uuid"]
    if args["uuid"] not in by_uuid:  # the provider deduplicates by the key it is sent
        world.paid[args["order"]] += 1
        by_uuid[args["uuid"]] = {"refund": f"re_{sum(world.paid.values())}", "order": args["order"]}
    if world.memory["lost"] > 0:
        world.memory["lost"] -= 1
        raise TimeoutError("read timed out")  # committed, but the response is lost
    return by_uuid[args["uuid"]]


def _pay_lookup(world: World, name: str) -> Callable[[str], Any] | None:
    def lookup(key: str) -> Any:
        world.dependency_calls += 1
        world.clock.advance(TOOL_LATENCY)
        found = [v for v in world.memory["by_uuid"].values() if v["order"] == "A-1001"]
        return found[0] if found else None

    return lookup


# --- hanging-tool ---------------------------------------------------------------------


def _hang_tool(world: World, name: str, args: dict[str, Any]) -> Any:
    world.clock.sleep(HANG)  # never returns in any useful time
    raise TimeoutError("socket timeout after an hour")


# --- cost-blowup ----------------------------------------------------------------------


def _blowup_setup(world: World) -> None:
    world.memory["needed"] = world.rng.randint(20, 60)


def _blowup_model(world: World, step: int, last: Any) -> Action | Final:
    if isinstance(last, dict) and last.get("complete"):
        return Final("analysis")
    return Action("read_chunk", {"n": step})


def _blowup_tool(world: World, name: str, args: dict[str, Any]) -> Any:
    _healthy(world)
    return {"chunk": args["n"], "complete": args["n"] >= world.memory["needed"]}


# --- truncated ------------------------------------------------------------------------


def _trunc_model(world: World, step: int, last: Any) -> Action | Final:
    if isinstance(last, dict) and last.get("rows"):
        cut = world.rng.random() < (0.5 if not world.memory.get("continued") else 0.1)
        return Final("the quarterly summary ...", truncated=cut)
    return Action("query", {"sql": "select * from sales"})


def _trunc_tool(world: World, name: str, args: dict[str, Any]) -> Any:
    _healthy(world)
    return {"rows": 1200}


def _nothing(world: World) -> None:
    pass


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario(
            "seed-profile",
            "seed 002: 30% of attempts hang past the 15 s tool timeout, 10% malformed",
            _nothing,
            _process_model,
            _process_tool,
            budget=Budget(max_steps=10, max_seconds=120.0),
            tokens_growth=100,
        ),
        Scenario(
            "rate-limit-storm", "bursts of 429 with Retry-After", _rl_setup, _fetch_model, _rl_tool
        ),
        Scenario(
            "outage",
            "the dependency answers 503 for up to 90 s",
            _outage_setup,
            _fetch_model,
            _outage_tool,
        ),
        Scenario(
            "stuck-search",
            'the model repeats search("invoice 99")',
            _nothing,
            _stuck_model,
            _search_tool,
        ),
        Scenario(
            "state-cycle",
            "A -> B -> A with different actions",
            _cycle_setup,
            _cycle_model,
            _cycle_tool,
            observe_state=True,
        ),
        Scenario(
            "polling",
            "legitimate repeats of job_status until the job is done",
            _poll_setup,
            _poll_model,
            _poll_tool,
            legitimate=True,
        ),
        Scenario(
            "no-progress",
            "novel but useless actions",
            _nothing,
            _novel_model,
            _useless_tool,
        ),
        Scenario(
            "duplicate-payment",
            "the refund commits, the response is lost, the model re-issues",
            _pay_setup,
            _pay_model,
            _pay_tool,
            idempotent=lambda name: name != "issue_refund",
            lookup=_pay_lookup,
        ),
        Scenario("hanging-tool", "the tool never returns", _nothing, _fetch_model, _hang_tool),
        Scenario(
            "cost-blowup",
            "each model call costs more than the last",
            _blowup_setup,
            _blowup_model,
            _blowup_tool,
            budget=Budget(max_steps=100, max_seconds=3600.0, max_cost_usd=1.0),
            tokens_growth=4000,
        ),
        Scenario("truncated", "replies cut at max_tokens", _nothing, _trunc_model, _trunc_tool),
    ]
}
