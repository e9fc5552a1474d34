"""What every adapter is put through: the cells, the scripted model turns, the tools, and
the :class:`Adapter` a framework's driver implements.

A driver builds its framework's real agent from a :class:`World` (the model's scripted
turns and the tools, counted), runs it under a ``tether.Guard`` the way a user would, and
returns the run's ``tether.Outcome`` (or the adapter's outcome type, which has the same
fields). The cells in ``cells.py`` decide what must hold. A cell an adapter cannot run is
named in its ``not_applicable`` with the reason, which the docs' table shows.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import tether
from tether import Guard, RetryPolicy, VirtualClock

Mode = Literal["sync", "async", "stream"]


class Cell(enum.Enum):
    """The behaviours every adapter is checked for (the columns of the table)."""

    SYNC = "sync"
    ASYNC = "async"
    PARALLEL = "parallel tool calls"
    PAUSE_RESUME = "pause and resume"
    HAND_OVER = "hand-over to a person"
    NESTED = "handoff / nested agent"
    BUSINESS_ERROR = "business error"
    TRANSIENT_ERROR = "transient tool error"
    TRANSIENT_MODEL_ERROR = "transient model error"
    STOP = "stop (budget)"
    CONVERSATION = "conversation id"
    STREAMING = "streaming"


@dataclass(frozen=True)
class Call:
    """One tool call the model asks for."""

    name: str
    args: Mapping[str, Any]


#: one model turn: the tool calls it asks for (in parallel when several), or its final answer
Turn = tuple[Call, ...] | str


class Overloaded(Exception):
    """The provider is busy this time (503): what a fake model raises for a :data:`BUSY` turn
    (a loopback server answers 503 instead)."""

    status_code = 503


#: a turn the provider fails with a 503 (the request is counted, no reply comes)
BUSY = "<the provider is busy: 503>"


def ask(*calls: tuple[str, Mapping[str, Any]]) -> tuple[Call, ...]:
    """A turn asking for these tool calls: ``ask(("search", {"q": "A-1"}))``."""
    return tuple(Call(name, dict(args)) for name, args in calls)


#: each model reply's usage, in every adapter's fake model
INPUT_TOKENS, OUTPUT_TOKENS = 10, 5


@dataclass
class World:
    """The model's scripted turns and the tools' world: what ran, how often the model was
    asked. A script that runs out repeats its last turn."""

    turns: list[Turn]
    ran: Counter[str] = field(default_factory=Counter)
    requests: int = 0
    failed_once: set[str] = field(default_factory=set)

    def next_turn(self) -> Turn:
        """The reply to the model request being made now (counted); raises
        :class:`Overloaded` for a :data:`BUSY` turn."""
        turn = self.turns[min(self.requests, len(self.turns) - 1)]
        self.requests += 1
        if turn == BUSY:
            raise Overloaded("503: the model is overloaded")
        return turn

    # --- the tools (one body each, sync and async twins) ---------------------------------

    def search(self, q: str) -> str:
        """Search the orders."""
        self.ran["search"] += 1
        return f"order {q}: paid, 40 EUR"

    def issue_refund(self, order: str) -> str:
        """Refund an order (a side effect)."""
        self.ran["issue_refund"] += 1
        return f"refunded {order}: re_{self.ran['issue_refund']}"

    def check_status(self, order: str) -> str:
        """The shipping status of an order (its service fails once, then answers)."""
        self.ran["check_status"] += 1
        if order not in self.failed_once:
            self.failed_once.add(order)
            raise ConnectionResetError("the status service reset the connection")
        return f"order {order}: shipped"

    def charge_card(self, order: str) -> str:
        """Charge the customer's card for an order (a side effect)."""
        self.ran["charge_card"] += 1
        raise ValueError("card expired")

    def transfer_to_human(self, reason: str) -> str:
        """Transfer the customer to a human agent."""
        self.ran["transfer_to_human"] += 1
        return "transferred"

    TOOLS: ClassVar[tuple[str, ...]] = (
        "search",
        "issue_refund",
        "check_status",
        "charge_card",
        "transfer_to_human",
    )

    def tools(self, asynchronous: bool = False) -> list[Callable[..., Any]]:
        """The tools as plain functions (named, documented and annotated as a framework
        reads them), or as coroutine functions that yield to the event loop once first."""
        return [self._tool(name, asynchronous) for name in self.TOOLS]

    def _tool(self, name: str, asynchronous: bool) -> Callable[..., Any]:
        body = getattr(self, name)
        signature = inspect.signature(body)
        if asynchronous:

            async def fn(*args: Any, **kwargs: Any) -> Any:
                await asyncio.sleep(0)  # parallel calls interleave here
                bound = signature.bind(*args, **kwargs)
                return body(*bound.args, **bound.kwargs)

        else:

            def fn(*args: Any, **kwargs: Any) -> Any:
                bound = signature.bind(*args, **kwargs)
                return body(*bound.args, **bound.kwargs)

        fn.__name__ = fn.__qualname__ = name
        fn.__doc__ = body.__doc__
        fn.__signature__ = signature  # type: ignore[attr-defined]
        fn.__annotations__ = {"return": str, **dict.fromkeys(signature.parameters, str)}
        return fn


def guard(tmp_path: Path, **options: Any) -> Guard:
    """The guard of a cell: records (approvals, cases, checkpoints) on SQLite, quick
    retries, a virtual clock."""
    records = tether.Records.sqlite(str(tmp_path / "records.db"))
    options.setdefault("retry", RetryPolicy(max_attempts=3, base=0.01, cap=0.05))
    return Guard(records=records, clock=VirtualClock(), **options)


class Adapter:
    """A framework's driver. Subclasses set ``name`` (the table's row), ``venv``
    (``"frameworks"`` for Google ADK and Strands) and ``not_applicable`` (cell → why), and
    implement :meth:`run` (and :meth:`resume` unless pause and resume is not applicable)."""

    #: the row's id in test names
    id: ClassVar[str] = ""
    #: the row's name in the docs' table
    name: ClassVar[str] = ""
    #: where its tests run: the main venv, ``.venv-frameworks`` (Google ADK, Strands) or
    #: ``.venv-crewai`` (CrewAI)
    venv: ClassVar[Literal["main", "frameworks", "crewai"]] = "main"
    #: the cells that do not apply to this adapter, each with its reason
    not_applicable: ClassVar[Mapping[Cell, str]] = {}
    #: after a pause for approval, the model is asked again (the pending call is not kept)
    reasks_after_resume: ClassVar[bool] = False
    #: a side effect's business error is raised out of the framework's run, as it is without
    #: tether (the run is filed first); else the run ends and the outcome says so
    raises_tool_errors: ClassVar[bool] = False
    #: the fake model reports a streamed reply's usage as scripted (else it estimates it)
    streamed_usage_exact: ClassVar[bool] = True

    def run(self, world: World, guard: Guard, mode: Mode, **rules: Any) -> Any:
        """Run the framework's agent on ``world`` under ``guard`` (``mode``: its sync,
        async or streaming entry point; ``rules``: the per-tool options, e.g.
        ``side_effects=["issue_refund"]``, and ``key``, the conversation the run serves) to
        its end; the outcome."""
        raise NotImplementedError

    def resume(self, world: World, guard: Guard, paused: Any, mode: Mode, **rules: Any) -> Any:
        """Continue the run ``paused`` for approval (``guard`` has approved it) to its end;
        the outcome."""
        raise NotImplementedError

    def nested(self, world: World, guard: Guard, mode: Mode) -> Any:
        """Run an agent that hands off to (or runs) a second agent, both on ``world``'s
        script; the outcome of the one run."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.id
