"""One τ² episode: the database, the virtual clock, the seeded faults, the model endpoint.

Faults (ReliabilityBench's taxonomy), each logical call hit with probability λ:

* a read fails transiently: the retail API answers ``503`` (``ConnectionError``) to every
  attempt for 0.5 to 3 s from the first one;
* a write commits, then its response is lost: the caller waits 5 s and gets a
  ``TimeoutError`` (a later attempt meets the domain as it now is);
* the model endpoint is rate limited (``429`` with ``Retry-After`` of 1, 2 or 4 s, every
  attempt in that window refused) or overloaded (``529`` for 0.5 to 3 s).

A logical call is one request of the model, or one tool call of one model turn: the
attempts a retry layer makes are the same call; a call the model re-issues in a later
turn is a new one. Every draw comes from the seed, the task, λ and the call, so each
policy meets the same faults at the same point of the conversation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tether import Price, VirtualClock, current_idempotency_key
from tether.bench._tau_domain import READS, RetailData, RetailDB
from tether.bench._tau_model import Answer, Call, ScriptedModel, draw

__all__ = ["MODEL", "PRICE", "Episode", "current", "execute", "set_current"]

MODEL = "claude-sonnet-4-6"
#: The model's list price per million tokens: every policy is billed the same.
PRICE = Price(3.0, 15.0, 3.75, 0.30)
READ_S, WRITE_S, LOST_S = 0.1, 0.4, 5.0
ANSWER_S, ERROR_S = 0.8, 0.1


@dataclass
class _Fault:
    until: float = 0.0
    status: int = 0
    used: bool = False


@dataclass
class Episode:
    """Everything one run of one task under one policy touches."""

    data: RetailData
    task: Mapping[str, Any]
    lam: float
    seed: int
    clock: VirtualClock = field(default_factory=VirtualClock)
    tool_executions: int = 0
    model_requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    answered: int = 0
    _faults: dict[Any, _Fault | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.db = RetailDB(self.data)
        #: seeds the jitter of every retry layer in the episode (tether's and the libraries')
        self.rng_seed = int(self._draw("rng") * 2**32)
        self.model = ScriptedModel(
            self.task["actions"], f"{self.seed}|{self.task['id']}|{self.lam}"
        )

    def _draw(self, *parts: object) -> float:
        return draw(self.seed, self.task["id"], self.lam, *parts)

    # --- the model endpoint ---------------------------------------------------------

    def model_fault(self) -> tuple[int, float] | None:
        """The refusal of this request, (status, seconds left), or None to answer it."""
        self.model_requests += 1
        key = ("model", self.answered)
        if key not in self._faults:
            fault = None
            if self._draw(*key) < self.lam:
                now = self.clock.now()
                if self._draw(*key, "kind") < 0.5:
                    fault = _Fault(now + (1.0, 2.0, 4.0)[int(self._draw(*key, "s") * 3)], 429)
                else:
                    fault = _Fault(now + 0.5 + 2.5 * self._draw(*key, "s"), 529)
            self._faults[key] = fault
        fault = self._faults[key]
        if fault is not None and self.clock.now() < fault.until:
            self.clock.advance(ERROR_S)
            return fault.status, max(0.0, fault.until - self.clock.now())
        return None

    def respond(self, results: Mapping[str, tuple[str, bool]]) -> Call | Answer:
        """The model's next turn (a request that got through), billed and timed."""
        turn = self.model.decide(results)
        self.answered += 1
        self.input_tokens += self.model.input_tokens
        out = self.model.output_tokens
        self.output_tokens += out
        self.clock.advance(ANSWER_S + out / 100)
        return turn

    # --- the tools ----------------------------------------------------------------------

    def tool(self, name: str, args: dict[str, Any], request_id: str | None) -> str:
        """One attempt of a tool call: the domain, behind the seeded faults."""
        self.tool_executions += 1
        key = (name, json.dumps(args, sort_keys=True), self.answered)
        if key not in self._faults:
            self._faults[key] = _Fault() if self._draw(*key) < self.lam else None
        fault = self._faults[key]
        if name in READS:
            self.clock.advance(READ_S)
            if fault is not None:
                if not fault.used:
                    fault.used = True
                    fault.until = self.clock.now() + 0.5 + 2.5 * self._draw(*key, "s")
                if self.clock.now() < fault.until:
                    raise ConnectionError("the retail API answered 503 Service Unavailable")
            return self.db.call(name, args)
        self.clock.advance(WRITE_S)
        result = self.db.call(name, args, request_id)
        if fault is not None and not fault.used:
            fault.used = True
            self.clock.advance(LOST_S)
            raise TimeoutError(f"the retail API did not answer {name} within {LOST_S:g} s")
        return result


_current: list[Episode] = []


def set_current(episode: Episode | None) -> None:
    """The episode the tools of this process act on (one at a time)."""
    _current[:] = [episode] if episode is not None else []


def current() -> Episode:
    if not _current:
        raise RuntimeError("no τ² episode is running in this process")
    return _current[0]


def execute(name: str, args: dict[str, Any]) -> str:
    """A tool call of the running episode; a write carries the effect's idempotency key
    (``tether.current_idempotency_key()``, None outside tether's ledger) to the domain."""
    return current().tool(name, args, current_idempotency_key())
