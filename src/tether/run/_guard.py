"""The guards' configuration: run budgets and the Guard that opens runs."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from tether.clock import Clock, system_clock
from tether.effects._ledger import Ledger
from tether.guards._breaker import CircuitBreaker
from tether.records._approvals import APPROVED, REJECTED, ApprovalError, ApprovalRecord, Approvals
from tether.redaction._redact import redact
from tether.retries._policy import RetryPolicy
from tether.run._budget import Budget
from tether.run._governance import takes_run
from tether.run._handoff import CustomerMessages, Escalation, _describe
from tether.run._health import HUNG_TOOL_MODES, HungToolMode
from tether.run._loops import LoopPolicy
from tether.run._outcome import STATUSES, Outcome, StopReason
from tether.run._pricing import PriceTable
from tether.run._scopes import BudgetScopes, scope_names
from tether.run._signing import signing_keys

if TYPE_CHECKING:
    from tether.guards._tokens import TokenBudget
    from tether.records._collections import Checkpoints, DeadLetters
    from tether.records._records import Records
    from tether.run._fallbacks import Fallback
    from tether.run._run import Run
    from tether.stores._base import Store

__all__ = ["Budget", "Guard", "agent_of", "request_of"]

_log = logging.getLogger("tether")

#: ``Guard(outage_wait=...)``'s default: a chat customer waits at most this many seconds
#: for a provider that is down before the run ends with an honest message
OUTAGE_WAIT = 10.0


class Guard:
    """The guards around an agent's loop; ``guard.start(task)`` opens one run.

    >>> guard = Guard(budget=Budget(max_steps=5))
    >>> with guard.start(task="find invoice 99") as run:
    ...     while run.proceed():
    ...         run.call_tool("search", lambda q: None, {"q": "invoice 99"})
    >>> run.outcome.status, run.outcome.stopped_because.name, len(run.outcome.partial)
    ('partial', 'REPEATED_ACTION', 2)
    """

    def __init__(
        self,
        budget: Budget | None = None,
        loops: LoopPolicy | None = None,
        clock: Clock | None = None,
        ledger: Ledger | None = None,
        checkpoints: Checkpoints | None = None,
        dead_letters: DeadLetters | None = None,
        *,
        retry: RetryPolicy | None = None,
        escalation: Escalation | None = None,
        prices: PriceTable | None = None,
        messages: CustomerMessages | None = None,
        store: Store | None = None,
        breaker_threshold: int | None = None,
        wait_for_recovery: bool = True,
        outage_wait: float | None = OUTAGE_WAIT,
        breaker_cooldown: float = 30.0,
        on_hung_tool: HungToolMode = "hand_over",
        describe_effect: Callable[[str, Any, Any], str | None] | None = None,
        on_stop: Callable[[Outcome], object] | None = None,
        scope: str = "",
        model_errors: tuple[type[BaseException], ...] = (ValueError,),
        policies: Iterable[Callable[..., str | None]] = (),
        rollback_on: Iterable[StopReason | str] = (),
        records: Records | None = None,
        keep_last: int | None = 1000,
        token_budget: TokenBudget | Iterable[TokenBudget] | None = None,
        fallbacks: Iterable[Fallback | str] | None = None,
        signing_key: bytes | str | Iterable[bytes | str] | None = None,
        scopes: BudgetScopes | None = None,
    ) -> None:
        _expect("budget", budget, Budget, "tether.Budget(max_steps=...)")
        _expect("loops", loops, LoopPolicy, "tether.LoopPolicy(...)")
        _expect("ledger", ledger, Ledger, "tether.Ledger.sqlite(path)")
        _expect("retry", retry, RetryPolicy, "tether.RetryPolicy(...)")
        _expect_stores(checkpoints, dead_letters)
        _expect("escalation", escalation, Escalation, "tether.Escalation(...)")
        _expect("prices", prices, PriceTable, "tether.PriceTable({...})")
        _expect("messages", messages, CustomerMessages, "tether.CustomerMessages(...)")
        if records is not None:  # the records' modules load when records are given
            from tether.records._records import Records

            _expect("records", records, Records, "tether.Records.sqlite(path)")
        _expect("scopes", scopes, BudgetScopes, "tether.BudgetScopes(store)")
        self.scopes = scopes  #: budgets that span runs (a tenant's): guard.start(scopes=...)
        if records is not None:  # one database for the run's records, unless told otherwise
            checkpoints = checkpoints if checkpoints is not None else records.checkpoints
            dead_letters = dead_letters if dead_letters is not None else records.dead_letters
        #: where every ended run's outcome, handoff and approval is recorded (tether serve)
        self.records = records
        _at_least_one("keep_last", keep_last, " (keep everything)")
        #: how many completed tool calls (``outcome.partial``) and transcript entries a run
        #: keeps in memory; older ones are counted (``outcome.partial_omitted``), not kept
        self.keep_last = keep_last
        if clock is not None and not isinstance(clock, Clock):
            raise TypeError(f"clock must be a tether clock (tether.VirtualClock()), got {clock!r}")
        _at_least_one("breaker_threshold", breaker_threshold)
        if (
            isinstance(breaker_cooldown, bool)
            or not isinstance(breaker_cooldown, int | float)
            or not breaker_cooldown > 0
        ):
            raise ValueError(f"breaker_cooldown must be a number > 0, got {breaker_cooldown!r}")
        if not isinstance(scope, str):
            raise TypeError(f"scope must be a str, got {scope!r}")
        self.budget = budget or Budget()
        self.loops = loops or LoopPolicy()
        self.clock: Clock = clock or system_clock
        # every guard has a ledger: a non-idempotent tool is never re-executed blindly. The
        # default lives in this process; a durable one (SQLite, Redis, PostgreSQL) survives
        # a restart
        # records= brings a durable one in the same database, unless a ledger is given
        if ledger is not None:
            self.ledger = ledger
        elif records is not None:
            self.ledger = records.ledger(clock=self.clock)
        else:
            self.ledger = Ledger.memory(clock=self.clock)
        self.checkpoints = checkpoints
        self.dead_letters = dead_letters
        self.retry = (retry or RetryPolicy()).replace(clock=self.clock)
        # records are somewhere to file a case: the default escalation triggers hand a run
        # over to the inbox (an unknown outcome, a permanent error...), unless told otherwise
        self.escalation = escalation if escalation is not None or records is None else Escalation()
        self.prices = prices or PriceTable()
        self.messages = messages or CustomerMessages()
        self.store = store
        #: the provider token budgets every model call of the guard's runs is admitted by
        self.token_budgets: tuple[TokenBudget, ...] = _token_budgets(token_budget)
        #: the models a run's model call goes to when its own cannot answer (tether.Fallback)
        self.fallbacks: tuple[Fallback, ...] = _fallback_chain(fallbacks)
        self.prices.check_chain(self.fallbacks, self.budget.max_cost_usd)
        # one unlucky call's retries alone never trip a tool's breaker
        self.breaker_threshold = breaker_threshold or max(5, 2 * self.retry.max_attempts)
        self.wait_for_recovery = wait_for_recovery
        if outage_wait is not None and (
            isinstance(outage_wait, bool)
            or not isinstance(outage_wait, int | float)
            or outage_wait < 0
        ):
            raise ValueError(f"outage_wait must be a number >= 0 or None, got {outage_wait!r}")
        #: the longest a run waits, in all, for a dependency that is down (its breaker
        #: open: the model provider, a tool's service) before it ends CIRCUIT_OPEN with an
        #: honest message and joins that outage's incident (one case); only a run with a
        #: time budget waits. None: as the time budget allows, three breaker cooldowns a call
        self.outage_wait = None if outage_wait is None else float(outage_wait)
        if on_hung_tool not in HUNG_TOOL_MODES:
            raise ValueError(
                f"on_hung_tool must be one of {', '.join(map(repr, HUNG_TOOL_MODES))}, "
                f"got {on_hung_tool!r}"
            )
        #: what a run does with a tool that stopped answering (timed out UNRESPONSIVE_AFTER
        #: times while its breaker is not closed, or holding that many hung threads):
        #: "hand_over" ends the run HUNG_TOOLS with a handoff, "tell_model" tells the model
        #: it is unavailable, "wait" retries and waits for the breaker's probes
        self.on_hung_tool: HungToolMode = on_hung_tool
        self.breaker_cooldown = breaker_cooldown
        self.describe_effect = describe_effect or _describe
        self.on_stop = on_stop
        self.scope = scope
        if not isinstance(model_errors, tuple) or not all(
            isinstance(t, type) and issubclass(t, BaseException) for t in model_errors
        ):
            raise TypeError(
                f"model_errors must be a tuple of exception classes, got {model_errors!r}"
            )
        self.policies = tuple(policies)
        for policy in self.policies:
            if not callable(policy):
                raise TypeError(
                    f"policies must be callables policy(tool, args) -> None | reason, "
                    f"got {policy!r}"
                )
        # whether each takes the run, read from its signature once, not on every call
        self._policy_calls = tuple((p, takes_run(p)) for p in self.policies)
        self.rollback_on = frozenset(rollback_on)
        for when in self.rollback_on:
            if not isinstance(when, StopReason) and when not in STATUSES:
                raise ValueError(
                    f"rollback_on takes StopReason members or statuses "
                    f"({', '.join(sorted(STATUSES))}), got {when!r}"
                )
        #: exceptions whose (redacted) message the model may read: failures a tool raises on
        #: purpose (business rules); every other failure reaches it as a short generic text
        self.model_errors = model_errors
        #: the keys its run documents are signed with (the first) and checked against (any);
        #: empty: documents are not signed (``signing_key``, default ``$TETHER_SIGNING_KEY``)
        self.signing_keys = signing_keys(signing_key)
        self._breakers: dict[str, CircuitBreaker] = {}
        self._policies: dict[tuple[str, float | None, bool], RetryPolicy] = {}
        # runs restored here whose effects this (in-memory) ledger could not see: told once
        self._unseen_warned: set[str] = set()

    def breaker(self, tool: str) -> CircuitBreaker:
        """The breaker that guards ``tool`` (one per tool name, shared by this guard's runs
        and by every guard with the same breaker settings and store; a guard with other
        settings has breakers of its own, named with them)."""
        breaker = self._breakers.get(tool)
        if breaker is None:
            name = f"tool:{tool}"
            if (self.breaker_threshold, self.breaker_cooldown) != (10, 30.0):  # not the usual
                name += f"[failure_threshold={self.breaker_threshold}, cooldown={self.breaker_cooldown:g}]"
            breaker = CircuitBreaker(
                name,
                failure_threshold=self.breaker_threshold,
                cooldown=self.breaker_cooldown,
                store=self.store,
                clock=self.clock,
            )
            self._breakers[tool] = breaker
        return breaker

    def _policy(self, tool: str, timeout: float | None, *, effect: bool = False) -> RetryPolicy:
        """The retry policy of a tool's calls; an effect's attempts are timed by the ledger."""
        policy = self._policies.get((tool, timeout, effect))
        if policy is None:
            attempt_timeout = timeout if timeout is not None else self.retry.attempt_timeout
            policy = self.retry.replace(
                name=tool,
                breaker=self.breaker(tool),
                attempt_timeout=None if effect else attempt_timeout,
            )
            self._policies[(tool, timeout, effect)] = policy
        return policy

    def start(
        self,
        task: str = "",
        key: str | None = None,
        *,
        run_id: str | None = None,
        scopes: Iterable[str] | None = None,
    ) -> Run:
        """Open a run (use it as a context manager).

        ``key`` names the request the run serves (a ticket, a conversation turn: like an
        Idempotency-Key): runs started with the same key are one request, and their
        effects happen at most once across them (a caller re-running a request after a
        crash pays nothing twice). Without a key the run is its own request: a second
        conversation that asks for the same thing gets it done. ``run_id``, when given,
        must follow :data:`tether.records._collections.RUN_ID_RULE` (it appears in URLs and logs).
        ``scopes``: the budget scopes each model call reserves its price in (docs/budgets.md).
        """
        from tether.run._run import Run

        if key is not None and (not isinstance(key, str) or not key.strip()):
            raise ValueError(f"key must be a non-empty string (a request id) or None, got {key!r}")
        names = scope_names(scopes, self.scopes)
        run_id = _run_id(run_id)
        run = Run(self, task, run_id, key=key, request=request_of(key, run_id))
        run._state.scopes = names
        run._state.agent = agent_of(sys._getframe(1))
        return run

    # --- approvals ------------------------------------------------------------------------

    def _approvals(self) -> Approvals:
        if self.checkpoints is None:
            raise ValueError(
                "a call that requires approval needs somewhere to wait: pass checkpoints= to "
                "Guard (e.g. tether.Checkpoints.sqlite(path)); nothing was executed"
            )
        return Approvals(self.checkpoints.store)

    def _decide(self, checkpoint_id: str, status: str, by: str, note: str) -> ApprovalRecord:
        if not isinstance(by, str) or not by.strip():
            raise ValueError("by must name who decides (a non-empty string)")
        approvals = self._approvals()  # raises when there is no checkpoints store
        assert self.checkpoints is not None
        from tether.run._document import Form, read

        doc = read(self.checkpoints.load(checkpoint_id), Form.CHECKPOINT, self.signing_keys)
        pending = doc.get("pending")
        if not isinstance(pending, Mapping) or not isinstance(pending.get("id"), str):
            raise ApprovalError(f"checkpoint {checkpoint_id!r} has no call waiting for approval")
        return approvals.decide(
            pending["id"], status, by.strip(), str(redact(note or "")), self.clock.wall()
        )

    def approve(self, checkpoint_id: str, *, by: str, note: str = "", reason: str = "") -> Any:
        """Approve exactly the call the run of ``checkpoint_id`` waits for, once; then ``resume``
        it. ``note``: the person's words (``reason=`` its alias). An ApprovalRecord."""
        return self._decide(checkpoint_id, APPROVED, by, _words(note, reason))

    def reject(self, checkpoint_id: str, *, by: str, note: str = "", reason: str = "") -> Any:
        """Reject it: the model reads ``note`` (alias ``reason=``), never who; ends DECLINED."""
        return self._decide(checkpoint_id, REJECTED, by, _words(note, reason))

    def approvals(self, limit: int = 50) -> list[ApprovalRecord]:
        """Approval records, newest first (pending, approved, rejected, used)."""
        return self._approvals().list(limit)

    def restore(self, snapshot: Mapping[str, Any], *, reuse: Run | None = None) -> Run:
        """The run that ``snapshot`` (``run.snapshot()``) describes, continuing under this
        guard: its budgets spent, its loop detectors, its request. Raises
        :class:`tether.CheckpointError` for a snapshot it cannot read. ``reuse``: the run
        ``snapshot`` was taken of, untouched since (a framework that restores at each of its
        hooks knows): that run, made what the rebuilt one would be, when it can be (else a
        rebuilt one)."""
        from tether.run._run import Run
        from tether.run._snapshot import restore

        run = restore(self, snapshot, Run, reuse)
        if run is not reuse:  # a run continued as it was in this process was seen already
            _check_ledger_sees(self, run)
        return run

    def resume(self, checkpoint_id: str) -> Run:
        """A run that continues a checkpointed one, with the budget it had left."""
        if self.checkpoints is None:
            raise ValueError("this guard has no checkpoints store: pass checkpoints= to Guard")
        from tether.run._resume import resume
        from tether.run._run import Run

        run, ended = resume(self, checkpoint_id, Run)
        # a run that goes on no longer waits on its scopes (it waits again if refused)
        run._ended_as(ended) if ended is not None else run._models.scopes.resumed()
        _check_ledger_sees(self, run)
        return run

    def _ledger_not_shared(self, run_id: str, what: str) -> None:
        """Say once per run that run ``run_id`` ``what`` (``_document.ledger_not_shared``)."""
        from tether.run._document import ledger_not_shared

        ledger_not_shared(self._unseen_warned, run_id, what)


def _check_ledger_sees(guard: Guard, run: Run) -> None:
    """A run restored in a process whose ledger is this process's memory, while it made
    effects this ledger has no record of: say so, once per run, loudly, with the fix
    (an effect asked again would run again: a fork replayed on another worker)."""
    from tether.run._document import unseen

    what = unseen(guard.ledger, run._state._effects)
    if what is not None:
        guard._ledger_not_shared(run.run_id, what)


def _expect_stores(checkpoints: object, dead_letters: object) -> None:
    """``checkpoints=`` and ``dead_letters=`` checked (their module loads with them)."""
    if checkpoints is not None or dead_letters is not None:
        from tether.records._collections import Checkpoints, DeadLetters

        _expect("checkpoints", checkpoints, Checkpoints, "tether.Checkpoints.sqlite(path)")
        _expect("dead_letters", dead_letters, DeadLetters, "tether.DeadLetters.sqlite(path)")


def _token_budgets(budgets: object) -> tuple[TokenBudget, ...]:
    """``token_budget=`` as a tuple (the token budgets' modules load with the first one)."""
    if budgets is None:
        return ()
    from tether.guards._tokens import budgets_for

    return budgets_for(budgets)


def _fallback_chain(fallbacks: object) -> tuple[Fallback, ...]:
    """``fallbacks=`` as a chain (the fallbacks' module loads with the first one)."""
    if fallbacks is None:
        return ()
    from tether.run._fallbacks import Fallback

    return Fallback.chain(fallbacks)


def _run_id(run_id: str | None) -> str:
    """The caller's run id, checked (its rule's module loads with the first), or a new one."""
    if run_id is None:
        return f"run_{os.urandom(16).hex()[:16]}"
    from tether.records._collections import check_run_id

    return check_run_id(run_id)


def request_of(key: str | None, run_id: str) -> str:
    """The request a run serves: the caller's key, or the run itself."""
    return f"key:{key}" if key is not None else f"run:{run_id}"


def _at_least_one(name: str, value: object, none: str = "") -> None:
    """An int setting that may be None: below 1 (or not an int) fails here, naming it."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be an int >= 1 or None{none}, got {value!r}")


def _expect(name: str, value: object, kind: type, example: str) -> None:
    """A configuration value of the wrong type fails here, naming the field."""
    if value is not None and not isinstance(value, kind):
        raise TypeError(f"{name} must be a {kind.__name__} (e.g. {example}) or None, got {value!r}")


def _words(note: str, reason: str) -> str:
    """The person's words on a decision: ``note=``, or its alias ``reason=`` (not both)."""
    if note and reason and note != reason:
        raise TypeError("give the person's words once: note= (or its alias reason=), not both")
    return note or reason


def agent_of(frame: Any) -> str:
    """Who started a run, for the operator page: the framework whose tether adapter did
    (``tether.integrations.langchain`` -> ``"langchain"``), else the module of the agent's
    own code that called ``guard.start`` (through an agent loop such as ``run_agent``)."""
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module.startswith("tether.integrations.") and not module.rpartition(".")[2].startswith(
            "_"
        ):
            return module.rpartition(".")[2]
        if not module.startswith(("tether.", "contextlib")):
            return module
        frame = frame.f_back
    return ""
