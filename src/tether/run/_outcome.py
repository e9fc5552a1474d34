"""How a run ends: the stop reason, the outcome, and the exceptions that carry them."""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Sequence
from dataclasses import field
from typing import Any, cast

from tether._errors import TetherError
from tether._frozen import Value, frozen_dataclass

__all__ = [
    "MEANINGS",
    "STATUSES",
    "Meaning",
    "Outcome",
    "Status",
    "StopReason",
    "Stopped",
    "ToolError",
    "Usage",
]


class StopReason(enum.Enum):
    """Why a run stopped."""

    GOAL_REACHED = "goal_reached"
    REPEATED_ACTION = "repeated_action"
    REPEATED_SEQUENCE = "repeated_sequence"
    STATE_CYCLE = "state_cycle"
    NO_PROGRESS = "no_progress"
    MAX_STEPS = "max_steps"
    MAX_MODEL_CALLS = "max_model_calls"
    MAX_TOOL_CALLS = "max_tool_calls"
    MAX_TOKENS = "max_tokens"
    MAX_COST = "max_cost"
    TIMEOUT = "timeout"
    IDENTICAL_FAILURES = "identical_failures"
    PERMANENT_ERROR = "permanent_error"
    CIRCUIT_OPEN = "circuit_open"
    UNKNOWN_OUTCOME = "unknown_outcome"
    HUNG_TOOLS = "hung_tools"
    TRUNCATED = "truncated"
    REFUSED = "refused"
    ESCALATED = "escalated"
    NO_RESULT = "no_result"
    ERROR = "error"
    FAILED = "failed"  # the agent's code said so: run.fail(...)
    AWAITING_APPROVAL = "awaiting_approval"  # a call needs a person's approval first
    IN_PROGRESS = "in_progress"  # another worker is doing this call (one request, two runs)
    BUDGET_REACHED = "budget_reached"  # a budget scope is spent: paused until it has room
    DECLINED = "declined"  # a person said no, or a business rule refused: nothing was done
    HANDED_OVER = "handed_over"  # a hand-over tool gave the customer to a person

    @property
    def meaning(self) -> Meaning:
        """What this reason means for the run's ending (:data:`MEANINGS`)."""
        return MEANINGS[self]

    @property
    def family(self) -> Family:
        """The kind of stop: a loop, a budget, a failure, a person, a wait, done."""
        return MEANINGS[self].family


class Stopped(TetherError):
    """A guard stopped the run; the with-block of ``guard.start()`` swallows it."""

    def __init__(self, reason: StopReason, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason.value}: {detail}" if detail else reason.value)


class ToolError(TetherError):
    """A tool call failed in a way the model should hear about, in a short safe text.

    Raise ``tether.ToolError("refund rejected: order older than 90 days")`` from a tool
    to tell the model why on purpose: the text reaches it (redacted). tether raises it
    with the tool's name for every failed call the run survives.
    """

    def __init__(
        self, tool_or_message: str, model_message: str | None = None, *, cause_kind: str = ""
    ) -> None:
        if model_message is None:  # raised by a tool: ToolError("why")
            tool, model_message = "", tool_or_message
        else:
            tool = tool_or_message
        self.tool = tool
        self.model_message = model_message
        self.cause_kind = cause_kind
        super().__init__(f"{tool}: {model_message}" if tool else model_message)


@frozen_dataclass
class Usage(Value):
    """What a run spent."""

    steps: int = 0
    model_calls: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0
    cost_usd: float = 0.0
    retries: int = 0
    seconds: float = 0.0
    #: model calls whose cost is unknown (no price): ``cost_usd`` counts the others
    unpriced_calls: int = 0

    @property
    def total_tokens(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_write_tokens
            + self.cache_read_tokens
        )


class Status(enum.StrEnum):
    """What an outcome's ``status`` can be, in the order of how well the run went (str
    values: ``outcome.status == "success"`` holds)."""

    SUCCESS = "success"
    PARTIAL = "partial"
    AWAITING_APPROVAL = "awaiting_approval"
    PAUSED = "paused"
    ESCALATED = "escalated"
    FAILED = "failed"


#: What an outcome's ``status`` can be, in the order of how well the run went.
STATUSES: tuple[Status, ...] = tuple(Status)


class Family(enum.StrEnum):
    """The kind of stop a reason is (``StopReason.X.family``): what telemetry and the
    operator group stops by."""

    DONE = "done"  # the agent's own ending: an answer, a failure it said
    LOOP = "loop"  # a loop detector: the same action, sequence or state again, no progress
    BUDGET = "budget"  # a run budget spent: steps, calls, tokens, money, time
    FAILURE = "failure"  # a dependency or a tool failed
    PERSON = "person"  # a person decides: a hand-over, a refusal, an escalation
    WAIT = "wait"  # the run waits and goes on later: an approval, a scope, another worker


@frozen_dataclass
class Meaning(Value):
    """What a stop reason means for the run's ending, in one place (:data:`MEANINGS`).

    ``status``: the status the reason always gives (None: decided by what was done:
    ``"failed"`` with no completed call, else ``"partial"``; a handoff makes it
    ``"escalated"``). ``person``: a person is needed (the default escalation triggers: the
    run is handed over when the guard keeps cases). ``final``: a decision that stands (a
    person's "no"): never handed over for having stopped short. ``message``: the
    :class:`tether.CustomerMessages` field the customer reads when the run ends with
    ``status`` (None: the status's own). ``family``: the kind of stop (:class:`Family`).
    ``retry_helps``: the cause may pass by itself (a dependency that failed, hung or is
    down), so "please try again later" is honest advice; otherwise (a loop, a budget, a
    permanent error, a refusal...) trying again meets the same stop, and a run that ends
    with nothing done tells the customer it needs a person's attention instead
    (``CustomerMessages.needs_attention``).
    """

    status: Status | None = None
    person: bool = False
    final: bool = False
    message: str | None = None
    family: Family = Family.FAILURE
    retry_helps: bool = False


#: Every stop reason's meaning: status, whether a person is needed, the customer message.
_LOOP, _BUDGET = Meaning(family=Family.LOOP), Meaning(family=Family.BUDGET)
MEANINGS: dict[StopReason, Meaning] = {
    StopReason.GOAL_REACHED: Meaning(Status.SUCCESS, family=Family.DONE),
    StopReason.REPEATED_ACTION: _LOOP,
    StopReason.REPEATED_SEQUENCE: _LOOP,
    StopReason.STATE_CYCLE: _LOOP,
    StopReason.NO_PROGRESS: _LOOP,
    StopReason.MAX_STEPS: _BUDGET,
    StopReason.MAX_MODEL_CALLS: _BUDGET,
    StopReason.MAX_TOOL_CALLS: _BUDGET,
    StopReason.MAX_TOKENS: _BUDGET,
    StopReason.MAX_COST: _BUDGET,
    StopReason.TIMEOUT: _BUDGET,
    StopReason.IDENTICAL_FAILURES: Meaning(person=True),
    StopReason.PERMANENT_ERROR: Meaning(Status.FAILED, person=True),
    # a dependency is down: its own words, whether a person has the case or not
    StopReason.CIRCUIT_OPEN: Meaning(person=True, message="outage", retry_helps=True),
    StopReason.UNKNOWN_OUTCOME: Meaning(person=True),
    StopReason.HUNG_TOOLS: Meaning(person=True, retry_helps=True),
    StopReason.TRUNCATED: Meaning(),
    StopReason.REFUSED: Meaning(message="refused", family=Family.PERSON),
    StopReason.ESCALATED: Meaning(Status.ESCALATED, person=True, family=Family.PERSON),
    StopReason.NO_RESULT: Meaning(family=Family.DONE),
    # a failure classified retryable (a permanent one ends PERMANENT_ERROR)
    StopReason.ERROR: Meaning(Status.FAILED, retry_helps=True),
    StopReason.FAILED: Meaning(Status.FAILED, family=Family.DONE),
    StopReason.AWAITING_APPROVAL: Meaning(Status.AWAITING_APPROVAL, family=Family.WAIT),
    # the run goes on once a scope has room
    StopReason.BUDGET_REACHED: Meaning(Status.PAUSED, family=Family.WAIT),
    StopReason.IN_PROGRESS: Meaning(Status.PARTIAL, message="in_progress", family=Family.WAIT),
    StopReason.DECLINED: Meaning(final=True, message="declined", family=Family.PERSON),
    StopReason.HANDED_OVER: Meaning(
        Status.ESCALATED, person=True, message="handed_over", family=Family.PERSON
    ),
}


@frozen_dataclass
class Outcome(Value):
    """The end of a run: a result, or a partial result and a reason.

    ``status``: ``"success"`` (goal reached), ``"escalated"`` (a handoff was made),
    ``"partial"`` (a guard stopped the run after at least one successful tool call),
    ``"failed"`` (stopped with nothing done, or on a permanent error),
    ``"awaiting_approval"`` (a call waits for a person: ``guard.approve``, then
    ``guard.resume``), ``"paused"`` (a budget scope is spent: raise its limit, then
    ``guard.resume``).
    """

    status: str
    stopped_because: StopReason
    result: Any = None
    partial: tuple[dict[str, Any], ...] = ()
    detail: str = ""
    open_issues: tuple[str, ...] = ()
    usage: Usage = field(default_factory=Usage)
    checkpoint_id: str | None = None
    customer_message: str = ""
    run_id: str = ""
    handoff: Any = None
    #: the whole conversation in the provider's own message format (agent loops), so a
    #: chat can append the customer's next message and run again
    messages: Sequence[Any] = ()
    #: the redacted type and message of the failure that ended the run, if one did
    error: str | None = None
    #: what ``run.rollback()`` undid, newest first: ``{"tool", "args", "result"}`` (redacted)
    compensated: tuple[dict[str, Any], ...] = ()
    #: the call that waits for a person's approval (``AWAITING_APPROVAL``): its tool, its
    #: (redacted) arguments and the approval's id
    pending_approval: dict[str, Any] | None = None
    #: completed tool calls older than ``partial`` holds (``Guard(keep_last=...)``)
    partial_omitted: int = 0
    #: the models that answered the run's model calls, each once, in the order they first
    #: answered: a fallback model (``tether.Fallback``) that stood in shows here
    models: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "success"


class _Deferred:
    """A field's value, made when it is first read: an outcome's completed calls are the
    run's recorded entries (their clean texts) until someone reads ``outcome.partial``;
    a run whose audiences never do parses none of them."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make


_MAKING = threading.Lock()  # held only while a deferred field is made, on its first read


class _MadeOnRead:
    """The slot of an :class:`Outcome` field, read through: a :class:`_Deferred` value is
    made on the first read and stored in the slot, so the field is the plain value it
    always was for every reader (``==``, ``repr``, pickling and ``replace`` read it as an
    attribute too). A frozen dataclass sets its fields with ``object.__setattr__``, which
    comes through :meth:`__set__` to the slot."""

    __slots__ = ("slot",)

    def __init__(self, slot: Any) -> None:
        self.slot = slot

    def __get__(self, outcome: Any, owner: type | None = None) -> Any:
        if outcome is None:
            return self.slot
        value = self.slot.__get__(outcome, owner)
        if type(value) is _Deferred:
            with _MAKING:  # made once: threads reading at once get the same objects
                value = self.slot.__get__(outcome, owner)
                if type(value) is _Deferred:
                    value = value.make()
                    self.slot.__set__(outcome, value)
        return value

    def __set__(self, outcome: Any, value: Any) -> None:
        self.slot.__set__(outcome, value)


setattr(Outcome, "partial", _MadeOnRead(Outcome.__dict__["partial"]))  # noqa: B010
setattr(Outcome, "messages", _MadeOnRead(Outcome.__dict__["messages"]))  # noqa: B010


def deferred_partial(make: Callable[[], tuple[dict[str, Any], ...]]) -> tuple[dict[str, Any], ...]:
    """What an Outcome is given as its ``partial`` to make it from ``make`` on first read
    (typed as the tuple it reads as)."""
    return cast("tuple[dict[str, Any], ...]", _Deferred(make))


def deferred_messages(make: Callable[[], tuple[Any, ...]]) -> tuple[Any, ...]:
    """What an Outcome is given as its ``messages`` to make them from ``make`` on first
    read: the redacted conversation (typed as the tuple it reads as)."""
    return cast("tuple[Any, ...]", _Deferred(make))
