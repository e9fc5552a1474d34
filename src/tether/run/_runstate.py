"""The state of one guarded run, shared by its lifecycle, its tool calls and its ending."""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import weakref
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from operator import attrgetter, sub
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from tether import telemetry
from tether._errors import CircuitOpenError
from tether.clock import hung_threads
from tether.records._approvals import ApprovalRecord
from tether.redaction._redact import PlainEntry, RecordedEntry
from tether.run._governance import JournalEntry
from tether.run._health import ToolHealth
from tether.run._loops import LoopState
from tether.run._outcome import Family, Outcome, Stopped, StopReason, Usage
from tether.run._tokens import RunTokens, urgency

if TYPE_CHECKING:
    from collections.abc import Iterable

    from tether.run._settings import RunSettings

T = TypeVar("T")

#: the telemetry event a stop of a family adds
_FAMILY_EVENTS = {Family.LOOP: "tether.loop_detected", Family.BUDGET: "tether.budget_exhausted"}

__all__ = [
    "COUNTED",
    "Entries",
    "HasState",
    "RECOVERY_COOLDOWNS",
    "RunState",
    "Tail",
    "ToolCheck",
    "admit",
    "ask_approval",
    "begin",
    "call_over",
    "close_span",
    "completed",
    "continue_here",
    "count_call",
    "count_failure",
    "count_model_call",
    "count_rows",
    "count_step",
    "decline",
    "effect_failed",
    "end_step",
    "end_step_span",
    "end_with",
    "ended_as",
    "escalate",
    "file_case",
    "identical_failures",
    "inherit",
    "judge_step",
    "keep_error",
    "keep_result",
    "label_effect",
    "load_checkpoint",
    "load_document",
    "mark_uncertain",
    "model_checked",
    "not_made",
    "note_compensations",
    "note_effect",
    "note_filed",
    "note_result",
    "open_issue",
    "open_span",
    "pending_saved",
    "progressed",
    "reach_goal",
    "refer_effect",
    "settled",
    "tool_health",
    "unconfirm_effects",
    "withdraw_effect",
]

#: How long one call may wait for an open breaker's probes, in breaker cooldowns (the
#: probes follow the dependency, so a short outage costs a short wait).
RECOVERY_COOLDOWNS = 3

_log = logging.getLogger("tether")


class Tail(list[Mapping[str, Any]]):
    """The newest ``keep`` entries of a growing record (a run's completed tool calls, its
    transcript), and how many older ones it let go (``omitted``, by tool in ``by_tool``).

    Entries are dropped in chunks, so an append stays O(1) and the list holds between
    ``keep`` and ``2 * keep`` entries; reading it (``list(tail)``) gives the newest ``keep``.
    """

    __slots__ = ("by_tool", "doc", "keep", "omitted", "settled")

    def __init__(self, keep: int | None, entries: Any = ()) -> None:
        super().__init__(entries)
        self.keep = keep
        self.omitted = 0
        self.by_tool: Counter[str] = Counter()
        #: the first entries as a document holds them (JSON), made once each: a snapshot
        #: adds what was appended since (``_snapshot._tail``); None after a trim
        self.doc: list[Any] | None = None
        #: how many of the first entries are a snapshot's JSON already (``_snapshot._settle``)
        self.settled = 0
        self._trim(self.keep or 0)

    def append(self, entry: Mapping[str, Any]) -> None:
        list.append(self, entry)  # not super(): two appends on every tool call
        keep = self.keep
        if keep is not None and len(self) > 2 * keep:
            self._trim(keep)

    def _trim(self, keep: int) -> None:
        if self.keep is None or len(self) <= keep:
            return
        cut = len(self) - keep
        for entry in self[:cut]:
            tool = entry.get("tool")
            if isinstance(tool, str):
                self.by_tool[tool] += 1
        self.omitted += cut
        del self[:cut]
        self.doc = None
        self.settled = max(0, self.settled - cut)

    def as_views(self) -> Tail:
        """This tail with each recorded call as its view, a plain dict (a call kept as its
        canonical text is parsed now, once, and kept so): what ``run.partial`` gives, as a
        list of dicts that ``json.dumps`` and ``dict`` methods take, as before calls were
        kept as text. The calls not made into views yet are always the newest (a call is
        appended, and whatever makes views makes all of them), so only they are looked at."""
        i = len(self)
        while i and type(self[i - 1]) is RecordedEntry:
            i -= 1
            self[i] = PlainEntry(self[i])
        return self

    def newest(self) -> list[Mapping[str, Any]]:
        """The newest ``keep`` entries (all of them when unbounded)."""
        return list(self) if self.keep is None else list(self[-self.keep :])

    def summary(self) -> dict[str, Any]:
        """What was let go, for a checkpoint and the outcome."""
        extra = max(0, len(self) - self.keep) if self.keep is not None else 0
        return {"omitted": self.omitted + extra, "by_tool": dict(self.by_tool)}


def _ref(owner: object) -> Callable[[], Any]:
    """A weak reference to ``owner`` (a call gives it back), or, for an object that cannot
    be referenced weakly, a function that gives it back."""
    try:
        return weakref.ref(owner)
    except TypeError:
        return lambda: owner


#: what a run counts, in the order of a row of its entries (a document's ``counts``)
COUNTED = (
    "steps",
    "model_calls",
    "tool_calls",
    "retries",
    "input_tokens",
    "output_tokens",
    "cache_write_tokens",
    "cache_read_tokens",
    "unpriced_calls",
    "cost_usd",
)
_ZERO: tuple[float, ...] = (0,) * len(COUNTED)
_totals = attrgetter(*COUNTED)


class Entries:
    """A run's counts as entries (docs/run.md, "counts"): what each copy of the run counted,
    by the copy (its writer id) -> ``[its sequence, its counts in COUNTED's order]``; the
    rows this copy was read with (``rows``), their sums (``base``), and this copy's own row:
    its writer id (drawn when it first counts), sequence and counts (``own``)."""

    __slots__ = ("base", "now", "own", "rows", "seq", "writer")

    def __init__(self, rows: dict[str, list[Any]] | None = None, base: Any = None) -> None:
        self.rows: dict[str, list[Any]] = rows or {}
        self.base: tuple[float, ...] = base or _ZERO
        self.now = self.base  # the totals at the last row written
        self.writer: str | None = None
        self.seq = 0
        self.own: tuple[float, ...] = _ZERO


class RunState:
    """What a run counts and remembers; :class:`tether.Run` owns it and gives it to its
    parts (each a part of the run that gets this state and the guard's frozen settings)."""

    def __init__(
        self,
        owner: object,
        guard: RunSettings,
        task: str,
        run_id: str,
        *,
        key: str | None,
        request: str | None,
    ) -> None:
        self.guard = guard
        self.task = task
        self.run_id = run_id
        #: the request key the run was started with (``guard.start(task, key=...)``), or None
        self.key = key
        # the request this run serves; its effects are at most once within it. None: a
        # checkpoint written before requests existed, whose effects were scoped by the
        # guard's scope alone (kept, so that resuming it repeats nothing)
        self._request = request
        self._scope = (
            guard.scope
            if request is None
            else json.dumps([guard.scope, request], ensure_ascii=False)
        )
        # the run that owns this state, weakly: the run holds its state, so a strong
        # reference back would make every run a cycle that only the cycle collector frees
        # (with all it holds: its records, its conversation)
        self._owner = _ref(owner)
        self.clock = guard.clock
        self.budget = guard.budget
        self._loops = LoopState(guard.loops)
        self._started = self.clock.now()
        self._elapsed_before = 0.0
        self._hung_base = hung_threads()
        self.steps = self.model_calls = self.tool_calls = self.retries = 0
        self.input_tokens = self.output_tokens = self.cache_write_tokens = (
            self.cache_read_tokens
        ) = 0
        self.cost_usd = 0.0
        self.unpriced_calls = 0
        self._tokens = RunTokens(self)  # model calls held in the guard's token budgets
        self.scopes: tuple[str, ...] = ()  # the budget scopes it spends in (guard.start)
        #: the share of its limit the run's nearest scope has used (its last reservation's)
        self.scope_share = 0.0
        self._error: str | None = None  # what ended the run, redacted
        self._checked_models: set[str] = set()
        self.models: list[str] = []  # the models that answered, in the order they first did
        self.messages: list[Any] | None = None  # the conversation, when an agent loop keeps one
        self._last_costs: list[float] = []
        self._last_tokens = 0
        self._max_steps = self.budget.max_steps
        # the newest entries in memory (Guard(keep_last=...)), totals of the rest
        self.partial = Tail(guard.keep_last)
        self.transcript = Tail(guard.keep_last)
        self._effects: list[tuple[str, Any, str]] = []  # (tool, args, ledger key)
        #: restored from a document written on another in-process ledger: its identity (an
        #: effect asked for here may have been made there: tether.LedgerNotShared, once)
        self._written_on: str | None = None
        self._labels: dict[str, str] = {}  # what the customer reads for a tool's effect
        #: the field of a tool's result (or a function of it) that is its effect's reference
        self._references: dict[str, Any] = {}
        #: side effects that failed for good and were not done since: tool -> its error
        self._failed_effects: dict[str, str] = {}
        #: calls a person rejected in this run: intent -> [tool, the person's words]
        self._declined: dict[str, list[str]] = {}
        self._tool_counts: Counter[str] = Counter()  # calls let through, per tool (policies)
        self._journal: list[JournalEntry] = []  # completed calls that can be compensated
        self._compensated: list[dict[str, Any]] = []  # what rollback() undid, newest first
        self._pending: ApprovalRecord | None = None  # the call that waits for approval
        self._unconfirmed: list[str] = []  # tools whose effect may or may not have happened
        self._failures: Counter[tuple[str, str, str]] = Counter()
        #: of those, the failures the ledger gave back without running the tool again (a
        #: side effect that failed for good is not run twice: its failure is replayed)
        self._replayed: Counter[tuple[str, str, str]] = Counter()
        #: the calls (intents) whose failure under way came from the ledger, the tool not run
        self._health: dict[str, ToolHealth] = {}  # per tool: timed-out attempts, hung threads
        self._results: OrderedDict[str, None] = OrderedDict()
        self._no_progress = 0
        self._step_progress = False
        self._step_counted = False
        self._step_calls = 0
        self._stop: tuple[StopReason, str] | None = None
        self._escalate = False
        self._case_filed = False  # the run's handoff reached a sink or the records
        #: the dependency whose outage (its breaker open) stopped the run, e.g.
        #: "anthropic:https://api.anthropic.com": its case is that outage's incident
        self._outage: str | None = None
        self._recovery_waited = 0.0  # seconds this run waited for open breakers' probes
        #: who started the run (a framework's adapter, or the agent's module): its record says
        self.agent = ""
        self._result: Any = None
        self._outcome: Outcome | None = None
        self._issues: list[str] = []
        self._span_cm: Any = None
        # a resumed run: the checkpoint it continues and how that checkpoint had stopped;
        # whether this part of the run began (a step, a tool call) or only rolls back
        self._resumed_from: str | None = None
        self._resumed_stop: tuple[StopReason, str] | None = None
        self._began = False
        self._filed: set[str | None] = set()  # checkpoints of this run object's records
        self._step_span: telemetry.StepSpan | None = None
        self._admission = threading.Lock()  # a tool call admitted or settled (see admit)
        self._entries = Entries()  # what the counts sum: a row per copy of the run

    @property
    def owner(self) -> Any:
        """The run that owns this state: what a policy that takes ``run=`` is given. A
        call runs through its run (which holds it alive); a state read after its run was
        let go raises, never gives None."""
        run = self._owner()
        if run is None:
            raise ReferenceError(f"run {self.run_id} was let go: its state has no run")
        return run

    # --- bookkeeping ------------------------------------------------------------------

    def _restore(
        self, usage: Usage, partial: list[dict[str, Any]], transcript: list[dict[str, Any]]
    ) -> None:
        for name in COUNTED:
            setattr(self, name, getattr(usage, name))
        self._elapsed_before = usage.seconds
        self.partial = Tail(self.guard.keep_last, partial)
        self.transcript = Tail(self.guard.keep_last, transcript)
        # the calls let through before the checkpoint still count (policies.max_calls)
        self._tool_counts.update(
            str(e["tool"])
            for e in transcript
            if "tool" in e and e.get("error") not in ("PolicyDenied", "ApprovalRejected")
        )

    @property
    def urgency(self) -> float:
        """How close the run is to its end, in [0, 1] (a token budget admits an urgent run
        first), or below 0 when a budget scope of the run is near its limit (its runs yield
        to others); see :func:`tether.run._tokens.urgency`."""
        return urgency(self)

    @property
    def elapsed(self) -> float:
        return self._elapsed_before + self.clock.now() - self._started

    @property
    def total_tokens(self) -> int:
        return self.usage().total_tokens

    @property
    def stopped(self) -> StopReason | None:
        return self._stop[0] if self._stop else None

    def usage(self) -> Usage:
        """What the run has used so far."""
        return Usage(
            self.steps,
            self.model_calls,
            self.tool_calls,
            self.input_tokens,
            self.output_tokens,
            self.cache_write_tokens,
            self.cache_read_tokens,
            round(self.cost_usd, 10),
            self.retries,
            self.elapsed,
            self.unpriced_calls,
        )

    def _effect_text(self, tool: str, args: Any, result: Any) -> str | None:
        """An effect in the customer's words: the guard's ``describe_effect``, or (the
        default) the tool's label, never its name."""
        from tether.run._handoff import _describe

        describe = self.guard.describe_effect
        if describe is _describe:
            reference = self._references.get(tool)
            return _describe(self._labels.get(tool, ""), args, result, reference)
        return describe(tool, args, result)

    # --- the run protocol (docs/run.md): the state's part, which the parts use too ----

    def time_left(self) -> float | None:
        """The run's time budget left, in seconds (the deadline of the next call); None
        when the run has no time budget. Never 0: a spent budget is a tiny positive number,
        and :meth:`tether.Run.proceed` stops the run ``TIMEOUT``."""
        b = self.budget.max_seconds
        return None if b is None else max(1e-9, b - self.elapsed)

    @property
    def stop_detail(self) -> str:
        """Why the run stopped, in words ("" while it runs); the reason is :attr:`stopped`."""
        return self._stop[1] if self._stop else ""

    def note_error(self, exc: BaseException) -> None:
        """Keep the (redacted) type and message of the failure that ends the run, for
        ``outcome.error``; the first one noted is kept."""
        if self._error is None:
            from tether.records._collections import redact

            text = str(exc).strip()
            self._error = str(
                redact(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)
            )[:500]

    def count_retries(self, n: int = 1) -> None:
        """Count ``n`` retries into the run's usage (for a framework that makes a request's
        attempts itself); :meth:`tether.Run.retry_model_call` counts its own."""
        self.retries += n

    def breaker_wait(
        self, exc: CircuitOpenError, *, waited: float = 0.0, timeout: float | None = None
    ) -> float | None:
        """How long to wait for the next probe of the open breaker ``exc`` names, or None
        when the run may not wait: the guard does not wait for recovery, the run has no
        time budget, the wait would pass the guard's ``outage_wait`` (seconds for the whole
        run, default 10: a customer in a chat is not kept waiting; ``outage_wait=None``:
        ``RECOVERY_COOLDOWNS`` breaker cooldowns per call), or the wait and then an attempt
        of ``timeout`` would not fit in the time left (so a wait never outlasts the run's
        budget). ``waited``: what this call has waited so far."""
        left = self.time_left()
        wait = exc.retry_in + 0.05
        bound = self.guard.outage_wait
        so_far = waited if bound is None else max(waited, self._recovery_waited)
        if bound is None:
            bound = RECOVERY_COOLDOWNS * self.guard.breaker_cooldown
        if (
            not self.guard.wait_for_recovery
            or left is None
            or so_far + wait > bound
            or wait + (timeout or 0.0) >= left
        ):
            return None
        return wait

    def through_breaker(self, fn: Callable[[], T], *, timeout: float | None = None) -> T:
        """``fn()``; while it raises :class:`tether.CircuitOpenError`, wait for the
        breaker's next probe as :meth:`breaker_wait` allows, then call it again. The
        CircuitOpenError of a breaker the run may not wait for is raised."""
        waited = 0.0
        while True:
            try:
                return fn()
            except CircuitOpenError as exc:
                wait = self.breaker_wait(exc, waited=waited, timeout=timeout)
                if wait is None:
                    raise
                self.clock.sleep(wait)
                waited += wait
                self._recovery_waited += wait

    async def athrough_breaker(
        self, fn: Callable[[], Awaitable[T]], *, timeout: float | None = None
    ) -> T:
        """The async form of :meth:`through_breaker`."""
        waited = 0.0
        while True:
            try:
                return await fn()
            except CircuitOpenError as exc:
                wait = self.breaker_wait(exc, waited=waited, timeout=timeout)
                if wait is None:
                    raise
                await self.clock.asleep(wait)
                waited += wait
                self._recovery_waited += wait

    def outage(self, dependency: str, detail: str) -> Stopped:
        """Stop the run ``CIRCUIT_OPEN``: ``dependency`` is down (its breaker open) and
        the run may wait no longer; the ending files the run under that outage's incident
        (one case for every run it stops). Returns the Stopped to raise."""
        if self._stop is None:
            self._outage = dependency
        return self._halt(StopReason.CIRCUIT_OPEN, detail)

    def _halt(self, reason: StopReason, detail: str = "") -> Stopped:
        """Record that the run stops for ``reason`` without raising; returns the
        :class:`tether.Stopped` to raise. The first stop wins: a later one returns the
        first one's Stopped. (:meth:`tether.Run.stop` is the form that raises.)"""
        if self._stop is None:
            self._stop = (reason, detail)
            _log.info(
                "run %s stops: %s%s", self.run_id, reason.value, f" ({detail})" if detail else ""
            )
            event = _FAMILY_EVENTS.get(reason.family)
            if event is not None:
                telemetry.add_event(event, **{"tether.stop_reason": reason.value})
        reason, detail = self._stop
        return Stopped(reason, detail)

    halt = _halt


def count_rows(s: RunState) -> dict[str, list[Any]]:
    """The run's entries as a document holds them: for each copy of the run that counted
    something, its writer id -> ``[sequence, *counts]`` (``COUNTED``'s order). This copy's
    row is what it counted since it was read (its totals less the rows it was read with),
    its sequence raised whenever that changed: two copies read from one document count in
    rows of their own, and a row seen twice (the same document merged again) is one row.
    A copy of the rows, O(copies) (not O(steps)): a hook that writes it costs the same at
    any length of the run."""
    e = s._entries
    now = _totals(s)
    if now != e.now:  # counted since the last row written
        e.now = now
        own = tuple(map(sub, now, e.base))
        if own != e.own:
            if e.writer is None:
                e.writer = os.urandom(6).hex()  # not secrets: it loads hmac and base64
            e.seq += 1
            e.own = own
    rows = {w: [*r] for w, r in e.rows.items()} if e.rows else {}
    if e.writer is not None:
        rows[e.writer] = [e.seq, *e.own]
    return rows


def inherit(s: RunState, rows: Any) -> None:
    """Take the entries a document was read with (``rows``, see :func:`count_rows`; None:
    a document of before entries, whose totals ``s`` holds already, as one row): the run's
    counts are their sums, and this copy counts in a row of its own from here. Raises
    ``ValueError`` for rows that are not counts (negative, not numbers): a corrupt or
    altered document."""
    if rows is None:
        rows = {"0": [1, *_totals(s)]}
    if not isinstance(rows, Mapping):
        raise ValueError(f"counts must be a mapping, got {type(rows).__name__}")
    taken: dict[str, list[Any]] = {}
    for writer, row in rows.items():
        if not isinstance(row, list | tuple) or len(row) != len(COUNTED) + 1:
            raise ValueError(f"counts of {writer!r:.20} must be {len(COUNTED) + 1} numbers")
        *ints, cost = row
        if not all(type(n) is int and n >= 0 for n in ints):
            raise ValueError(f"counts of {writer!r:.20} must be counts, got {row!r:.80}")
        if type(cost) not in (int, float) or not math.isfinite(cost) or cost < 0:
            raise ValueError(f"cost of {writer!r:.20} must be a cost, got {cost!r:.20}")
        taken[str(writer)] = [*ints, float(cost)]
    sums = [sum(r[i + 1] for r in taken.values()) for i in range(len(COUNTED))]
    for name, total in zip(COUNTED, sums, strict=True):
        setattr(s, name, total)
    s._entries = Entries(taken, _totals(s))


class HasState(Protocol):
    """What owns a run's state (a :class:`tether.Run`), for the modules that rebuild one."""

    _state: RunState


class ToolCheck(Protocol):
    """A stop condition of the run's tool calls (a ``run._stops.Check``): its reason, and
    why it holds for a run (None: it does not)."""

    @property
    def reason(self) -> StopReason: ...

    def __call__(self, s: RunState, /) -> str | None: ...


# --- a tool call's slot: taken, given back, settled, each in one step among the run's threads
# (a framework may run one reply's calls in threads: a check apart from its count lets them all
# pass). The state's lock is held only for that bookkeeping, never while a tool runs.


def admit(
    s: RunState,
    tool: str,
    action: str,
    cap: int | None,
    budgets: Iterable[ToolCheck],
    judged: bool = False,
) -> tuple[StopReason, str] | str | None:
    """The tool-call budgets (``budgets``: the run's tool checks, ``run._stops``), the
    repeat checks and the identical-failures limit for a call, and when none holds, the call
    counted (its slot taken, its action in flight), as one step: calls made from several
    threads at once cannot all pass one check before any is counted; ``judged``: the call
    judges its step for progress (no allowed repeat), once admitted. Returns why the run
    stops (nothing taken), what the model is told of a call held back (a str: identical
    calls under way could reach the identical-failures limit), or None."""
    with s._admission:
        if s._stop is not None:  # stopped by another thread since this call began
            return s._stop
        for check in budgets:  # run._stops.first_stop, without a frame of its own per call
            detail = check(s)
            if detail is not None:
                return check.reason, detail
        loops = s._loops
        if loops._done:  # calls completed since: recorded before the check reads them
            loops.settle()
        loop = loops.check_action(tool, action, s.steps, cap=cap)
        if loop is not None:
            return loop[0], f"{loop[1]} (step {s.steps})"
        if s._failures or loops._flying:
            held = _failing(s, tool, action)
            if held is not None:
                return held
        loops.begin_action(action)  # ended when the call is settled, whatever it became
        s.tool_calls += 1
        s._step_calls += 1
        if judged:
            s._step_counted = True
    return None


def _failing(s: RunState, tool: str, action: str) -> tuple[StopReason, str] | str | None:
    """max_identical_failures for a call about to be admitted (under the lock): each
    identical call under way counts as a failure to come, so that no more of them run than
    the limit leaves, whatever threads make them (one after another nothing is held)."""
    limit = s.budget.max_identical_failures
    if limit is None:
        return None
    failed, signature = max(
        ((n, sig) for sig, n in s._failures.items() if sig[0] == action),
        default=(0, ("", "", "")),
    )
    if failed >= limit:
        replayed = s._replayed.get(signature, 0)
        return StopReason.IDENTICAL_FAILURES, identical_failures(
            tool, signature[1], failed, replayed
        )
    flying = s._loops._flying.get(action, 0)
    if failed + flying < limit:
        return None
    before = f"{tool} failed {failed} times the same way and " if failed else ""
    return (
        f"not run: {before}{flying} identical calls of {tool} are under way; wait for their "
        "results before calling it again"
    )


def _times(n: int) -> str:
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


def identical_failures(tool: str, error: str, failed: int, replayed: int) -> str:
    """Why a call stops the run for failing the same way ``failed`` times, ``replayed`` of
    them answered from the ledger without running the tool: what ran, and what was only
    given back (what the operator reads in ``open_issues``)."""
    ran = failed - replayed
    if not replayed:
        return f"{tool} failed {failed} times the same way ({error})"
    if not ran:
        return (
            f"{tool} was not run: the model asked {_times(replayed)} and was given the "
            f"failure ({error}) the ledger holds from an earlier attempt each time"
        )
    more = "1 more time" if replayed == 1 else f"{replayed} more times"
    return (
        f"{tool} ran {_times(ran)} and failed ({error}); the model asked {more} and was "
        "given the same failure from the ledger, without running it again"
    )


def count_call(s: RunState, tool: str, limit: int | None) -> bool:
    """A call the policies let through, counted for its tool as one step with the check of
    its limit (``policies.max_calls``: ``limit`` calls of ``tool`` per run): False, not
    counted, when the limit is reached (another thread's call took the last one)."""
    with s._admission:
        made = s._tool_counts.get(tool, 0)
        if limit is not None and made >= limit:
            return False
        s._tool_counts[tool] = made + 1
    return True


def count_failure(
    s: RunState, signature: tuple[str, str, str], flying: bool, replayed: bool = False
) -> tuple[int, int]:
    """A failure counted for the identical-failures limit (``signature``: the call's action,
    the error's type and its verdict), and the call out of flight when it still was
    (``flying``), as one step: a call admitted meanwhile sees it either under way or failed.
    ``replayed``: the ledger gave the failure back without running the tool. Returns how
    many times the call failed that way, and how many of those were replays."""
    with s._admission:
        if flying:
            s._loops.end_action(signature[0])
        n = s._failures.get(signature, 0) + 1
        s._failures[signature] = n
        if replayed:
            s._replayed[signature] += 1
        return n, s._replayed.get(signature, 0)


def not_made(s: RunState, action: str) -> None:
    """A call admitted that did not happen (a framework's control flow interrupted it):
    its slot is given back."""
    with s._admission:
        s._loops.end_action(action)
        s.tool_calls -= 1
        s._step_calls -= 1


def call_over(s: RunState, action: str) -> None:
    """A call admitted is over without completing (failed, refused, interrupted): no
    longer in flight; its slot stays taken."""
    with s._admission:
        s._loops.end_action(action)


def completed(
    s: RunState,
    tool: str,
    action: str,
    allowed: bool,
    retries: int,
    journal: JournalEntry | None = None,
) -> None:
    """A call completed: recorded as a repeat candidate as it leaves the flight, at the
    next admission (or snapshot), under the lock: no lock taken here, so a call's success
    path takes the lock once. Its retries counted; ``journal``: how to compensate it; a
    failed effect of its tool is done after all (the model tried again)."""
    s._loops.complete(tool, action, allowed)
    s.retries += retries
    if journal is not None:
        s._journal.append(journal)
    s._failed_effects.pop(tool, None)


def settled(s: RunState) -> LoopState:
    """The loop detectors with every completed call recorded (what a snapshot reads)."""
    if s._loops._done:
        with s._admission:
            s._loops.settle()
    return s._loops


# --- a run read back from its document: the state takes what it says (its own module) ----


def load_document(
    s: RunState, doc: Mapping[str, Any], max_steps: int | None, written_on: str | None
) -> None:
    """Take what a run document (a snapshot, read and checked by ``_snapshot``) says of
    the run beyond its counts; ``max_steps``: the limit the guard allows it (never the
    document's), ``written_on``: the other in-process ledger it was written on."""
    s._error = doc.get("error") if isinstance(doc.get("error"), str) else None
    s._checked_models = {str(m) for m in doc.get("checked_models") or ()}
    s.models = [str(m) for m in doc.get("models") or ()]
    s._last_costs = [float(c) for c in doc.get("last_costs") or ()]
    s._last_tokens = int(doc.get("last_tokens") or 0)
    s._max_steps = max_steps
    s._written_on = written_on
    if not isinstance(doc.get("labels") or {}, Mapping):
        raise TypeError(f"labels must be a mapping, got {type(doc.get('labels')).__name__}")
    _load_effects(s, doc)
    s._failed_effects = {str(k): str(v) for k, v in (doc.get("failed_effects") or {}).items()}
    s._declined = {str(k): [str(v) for v in tw] for k, tw in (doc.get("declined") or {}).items()}
    s._tool_counts = Counter({str(k): int(v) for k, v in (doc.get("tool_counts") or {}).items()})
    s._compensated = list(doc.get("compensated") or ())
    pending = doc.get("pending")
    s._pending = ApprovalRecord.from_doc(dict(pending)) if isinstance(pending, Mapping) else None
    s._unconfirmed = [str(t) for t in doc.get("unconfirmed") or ()]
    s._failures = Counter(
        {(str(a), str(b), str(c)): int(n) for a, b, c, n in doc.get("failures") or ()}
    )
    s._results = OrderedDict((str(r), None) for r in doc.get("results") or ())
    s._no_progress = int(doc.get("no_progress") or 0)
    s._step_progress = bool(doc.get("step_progress"))
    s._step_counted = bool(doc.get("step_counted"))
    s._step_calls = int(doc.get("step_calls") or 0)
    stop = doc.get("stop")
    if stop:
        s._stop = (StopReason(stop[0]), str(stop[1]))
    s._escalate = bool(doc.get("escalate"))
    s._result = doc.get("result")
    s._issues = [str(i) for i in doc.get("issues") or ()]
    resumed = doc.get("resumed_from")
    s._resumed_from = resumed if isinstance(resumed, str) else None
    s._began = bool(doc.get("began"))
    resumed_stop = doc.get("resumed_stop")
    if resumed_stop:
        s._resumed_stop = (StopReason(resumed_stop[0]), str(resumed_stop[1]))
    s._loops.load(doc.get("loops") or {})


def load_checkpoint(
    s: RunState, doc: Mapping[str, Any], resumed_from: str, written_on: str | None
) -> None:
    """Take what a checkpoint (read and checked by ``_resume``) says of the run beyond
    its counts and calls: its effects, their labels, its journal, how it had stopped."""
    _load_effects(s, doc)
    s._written_on = written_on
    s._resumed_from = resumed_from
    try:
        s._resumed_stop = (StopReason(doc.get("reason")), str(doc.get("detail") or ""))
    except ValueError:
        s._resumed_stop = None


def _load_effects(s: RunState, doc: Mapping[str, Any]) -> None:
    """The effects made, what the customer reads for each, the compensable calls (a
    document written before it kept its effects has none: the run says what it makes)."""
    s._effects = [(str(t), a, str(k)) for t, a, k in doc.get("effects") or ()]
    labels = doc.get("labels")
    s._labels = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {}
    s._journal = [JournalEntry.from_doc(e) for e in doc.get("journal") or ()]


def continue_here(s: RunState, elapsed: float) -> None:
    """Go on in this process as a run restored from its own snapshot would: the clock
    from ``elapsed`` (time outside a framework's hooks is not the run's), and anew what a
    restore makes anew (token reservations, tools' health, the hung-thread base, spans,
    records filed)."""
    s._started = s.clock.now()
    s._elapsed_before = elapsed
    s._hung_base = hung_threads()
    s._tokens = RunTokens(s)
    s._health = {}
    s._case_filed = False
    s._span_cm = None
    s._filed = set()
    s._step_span = None


def note_effect(s: RunState, tool: str, args: Any, key: str) -> None:
    """Note an effect the run asks for (its outcome states what the ledger says was done),
    once per ledger key: asked again (the ledger replays it), it is the same effect.
    A run restored from a document written on another in-process ledger says, once, that
    the effect may have been made there."""
    if s._written_on is not None:
        s.guard._ledger_not_shared(s.run_id, _elsewhere(tool))
    if all(key != k for _, _, k in s._effects):  # an effect's id is its ledger key: once
        s._effects.append((tool, args, key))


def _elsewhere(tool: str) -> str:
    """What ``_document.ledger_not_shared`` says of a run restored from a document written on
    another in-process ledger, at its first effect (``tool``)."""
    return (
        f"was restored from a document written on another in-process ledger and now asks "
        f"for an effect ({tool}) that this ledger has no record of: if the run made it there "
        "after that document (a LangGraph fork replayed from before the effect, a thread "
        "picked up by another worker), it runs again"
    )


# --- what the parts decide of a run's ending, applied here (one owner of these fields) ------


def escalate(s: RunState, *issues: str, unconfirmed: str | None = None) -> None:
    """The run is a person's at its end (a handoff filed): ``issues`` are what is open for
    them, ``unconfirmed`` the tool whose effect may or may not have happened."""
    for issue in issues:
        open_issue(s, issue)
    if unconfirmed is not None:
        s._unconfirmed.append(unconfirmed)
    s._escalate = True


def open_issue(s: RunState, issue: str, *, once: bool = False) -> None:
    """Something a person must know or do when the run ends (its outcome's ``open_issues``);
    ``once``: not again when it is open already."""
    if not (once and issue in s._issues):
        s._issues.append(issue)


# --- what the parts decide, applied here: the one module that writes these fields ----
# (tests/test_run_state_owner.py counts writes from elsewhere: the parts read the state
# and call these, each named for the change it makes)


def begin(s: RunState) -> Stopped | None:
    """A step or a tool call begins (the run does more than roll back); returns the
    :class:`tether.Stopped` to raise instead when the run has stopped (nothing begins)."""
    if s._stop is not None:
        return Stopped(*s._stop)
    s._began = True
    return None


def count_step(s: RunState) -> None:
    """A new step: counted, nothing said of it yet (its progress, its judged calls); its
    telemetry span follows the last one's (while nothing records, one check)."""
    s.steps += 1
    s._step_progress = False
    s._step_counted = False
    s._step_calls = 0
    if s._step_span is not None:
        telemetry.end_step(s._step_span)
    s._step_span = (
        telemetry.start_step(**{"tether.run_id": s.run_id, "tether.step": s.steps})
        if telemetry.enabled()
        else None
    )


def end_step(s: RunState) -> tuple[StopReason, str] | None:
    """The step that just ended, accounted for the no-progress detector: progress resets
    its count (and extends ``max_steps`` by ``progress_extension``, up to its ceiling);
    a step without it counts, unless its only calls were allowed repeats (polling is
    not judged). Returns the stop the detector calls for, or None."""
    budget = s.budget
    if s._step_progress:
        s._no_progress = 0
        if budget.progress_extension and s._max_steps is not None:
            ceiling = budget.max_steps_ceiling
            extended = s._max_steps + budget.progress_extension
            s._max_steps = extended if ceiling is None else min(extended, ceiling)
    elif s._step_counted or s._step_calls <= 0:
        s._no_progress += 1
    limit = s.guard.loops.max_no_progress
    if limit is not None and s._no_progress >= limit and s.steps >= s.guard.loops.min_steps:
        return StopReason.NO_PROGRESS, f"{s._no_progress} steps in a row added nothing new"
    return None


def progressed(s: RunState) -> None:
    """This step made progress (a new fact, a result not seen before, a new state)."""
    s._step_progress = True


def judge_step(s: RunState) -> None:
    """This step made a call that is no allowed repeat: the step is judged for progress."""
    s._step_counted = True


def note_result(s: RunState, digest: str) -> None:
    """A call's result (its digest): one not among the last ``state_window`` is progress."""
    results = s._results
    if digest not in results:
        results[digest] = None
        if len(results) > s.guard.loops.state_window:
            results.popitem(last=False)
        s._step_progress = True


# --- a tool's options and its health ------------------------------------------------


def label_effect(s: RunState, tool: str, text: str) -> None:
    """What the customer reads for ``tool``'s effect, from here on."""
    s._labels[tool] = text


def refer_effect(s: RunState, tool: str, reference: Any) -> None:
    """The field of ``tool``'s result (or a function of it) that is its effect's
    reference, from here on (None: none)."""
    if reference is None:
        s._references.pop(tool, None)
    else:
        s._references[tool] = reference


def tool_health(s: RunState, tool: str) -> ToolHealth:
    """The health record of ``tool`` in this run (its timed-out attempts, hung threads)."""
    health = s._health.get(tool)
    if health is None:
        health = s._health[tool] = ToolHealth()
    return health


# --- effects, failures, approvals ---------------------------------------------------


def withdraw_effect(s: RunState, key: str) -> None:
    """The effect under ledger ``key`` was not made (a person declined it)."""
    s._effects = [e for e in s._effects if e[2] != key]


def effect_failed(s: RunState, tool: str, error: str) -> None:
    """``tool``'s effect failed for good (``error``, redacted) and is not done: the run
    may not end ``success`` unless it is done after all."""
    s._failed_effects[tool] = error


def mark_uncertain(s: RunState, tool: str, issue: str) -> None:
    """``tool``'s effect may or may not have happened: a person checks (``issue``)."""
    s._unconfirmed.append(tool)
    s._issues.append(issue)


def unconfirm_effects(s: RunState) -> None:
    """What the run's effects did could not be read: none of them is confirmed."""
    s._unconfirmed.extend(tool for tool, _, _ in s._effects)


def ask_approval(s: RunState, record: ApprovalRecord) -> None:
    """The call that waits for a person's approval (``record``, redacted)."""
    s._pending = record


def pending_saved(s: RunState, checkpoint_id: str) -> ApprovalRecord:
    """The pending approval, now naming the checkpoint the run was saved in."""
    from dataclasses import replace  # a run waiting for approval only

    assert s._pending is not None
    s._pending = replace(s._pending, checkpoint_id=checkpoint_id)
    return s._pending


def decline(s: RunState, action: str, tool: str, why: str) -> bool:
    """A person rejected the call ``action`` (of ``tool``) for ``why``; returns whether
    it had been rejected already (asked again after the model was told: the run ends)."""
    again = action in s._declined
    s._declined[action] = [tool, why]
    return again


# --- model calls --------------------------------------------------------------------


def model_checked(s: RunState, model: str) -> None:
    """``model`` was checked against the cost budget once (priced, or known free)."""
    s._checked_models.add(model)


def count_model_call(
    s: RunState,
    model: str,
    input_tokens: int,
    output_tokens: int,
    cache_write_tokens: int,
    cache_read_tokens: int,
    cost_usd: float | None,
) -> None:
    """A model call counted into the run's usage (``cost_usd`` None: unpriced), and kept
    as the last call's cost and tokens (what the next one is estimated from)."""
    s.model_calls += 1
    if model and model not in s.models:
        s.models.append(model)
    s.input_tokens += input_tokens
    s.output_tokens += output_tokens
    s.cache_write_tokens += cache_write_tokens
    s.cache_read_tokens += cache_read_tokens
    if cost_usd is None:
        s.unpriced_calls += 1
    else:
        s.cost_usd += cost_usd
        s._last_costs = [*s._last_costs[-1:], cost_usd]
    s._last_tokens = input_tokens + output_tokens + cache_write_tokens + cache_read_tokens


# --- the ending ---------------------------------------------------------------------


def keep_result(s: RunState, result: Any) -> None:
    """The run's result (``run.succeed(result)``)."""
    s._result = result


def keep_error(s: RunState, error: str) -> None:
    """The failure that ends the run, already redacted (unless one was kept)."""
    s._error = s._error or error


def reach_goal(s: RunState) -> None:
    """The goal is reached: the run stops ``GOAL_REACHED`` whatever stopped it before."""
    s._stop = None
    s._halt(StopReason.GOAL_REACHED)


def note_compensations(s: RunState, done: list[dict[str, Any]]) -> None:
    """What a rollback undid (newest first)."""
    s._compensated.extend(done)


def file_case(s: RunState, filed: bool = True) -> None:
    """Whether the run's handoff reached a sink or the records (once it did, it did)."""
    s._case_filed = filed or s._case_filed


def note_filed(s: RunState, checkpoint_id: str | None) -> None:
    """The run's record was filed, at ``checkpoint_id``."""
    s._filed.add(checkpoint_id)


def end_with(s: RunState, outcome: Outcome) -> None:
    """The run's outcome."""
    s._outcome = outcome


def ended_as(s: RunState, reason: StopReason, detail: str, result: Any) -> None:
    """The run ended as a record of it says (another worker ended it first): its stop
    and its result (its outcome follows, :func:`end_with`)."""
    s._stop, s._result = (reason, detail), result


def open_span(s: RunState) -> None:
    """The run's telemetry span begins (``with guard.start(...)``)."""
    s._span_cm = telemetry.span(
        "tether.run", **{"tether.run_id": s.run_id, "tether.task": s.task[:200]}
    )
    s._span_cm.__enter__()


def close_span(s: RunState) -> None:
    """The run's telemetry span ends, with its last step's."""
    if s._span_cm is not None:
        s._span_cm.__exit__(None, None, None)


def end_step_span(s: RunState) -> None:
    """The last step's telemetry span ends (the run ended)."""
    telemetry.end_step(s._step_span)
    s._step_span = None
