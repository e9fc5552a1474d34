"""What both drivers of a tool call decide alike: the checks before, the ledger's part,
and what a success or a failure does to the run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tether import _digest
from tether._errors import (
    CircuitOpenError,
    DeadlineExceeded,
    Declined,
    EffectInProgress,
    UnknownOutcome,
)
from tether.classification._classify import Kind, classify
from tether.clock import hung_threads
from tether.effects._canonical import (
    VOLATILE_FIELDS,
    canonical_and_strings,
    intent_and_text,
    jsonable,
)
from tether.redaction._redact import REDACTED, RecordedEntry, redact, redacted_paths
from tether.retries._policy import RetryPolicy
from tether.run._governance import JournalEntry
from tether.run._health import ToolUnresponsive
from tether.run._hung import HungTools
from tether.run._outcome import Stopped, StopReason, ToolError
from tether.run._runstate import (
    RunState,
    admit,
    begin,
    call_over,
    completed,
    count_failure,
    effect_failed,
    escalate,
    identical_failures,
    judge_step,
    label_effect,
    mark_uncertain,
    not_made,
    note_effect,
    note_result,
    open_issue,
    withdraw_effect,
)
from tether.run._stops import TOOL_CHECKS
from tether.run._toolkit import (
    QUOTA_REACHED,
    REJECTED,
    UNAVAILABLE,
    ReturnedAwaitable,
    _Call,
    _holds_placeholder,
    _Progress,
    _said,
)

__all__ = ["ToolDecisions"]


class ToolDecisions:
    """The decisions of a tool call, shared by the sync and the async driver."""

    def __init__(self, state: RunState, hung: HungTools) -> None:
        self.s = state
        self.hung = hung
        # the retry policy of a (tool, timeout, effect) call, once looked up: the guard
        # makes one per tool and keeps it, and what picks it is fixed for the run
        self._policies: dict[tuple[str, float | None, bool], RetryPolicy] = {}

    def _before_tool(
        self,
        name: str,
        args: Any,
        timeout: float | None,
        idempotent: bool,
        volatile: tuple[str, ...] = (),
        allow_repeat: int | None = None,
    ) -> _Call:
        s = self.s
        stopped = begin(s)
        if stopped is not None:
            raise stopped
        b = s.budget
        # a non-idempotent call's timeout is the ledger's business: the attempt it abandons
        # keeps its claim until it really ends, so that nothing runs it a second time
        effect = not idempotent  # a bool in the key, whatever ``idempotent`` was given as
        policy = self._policies.get((name, timeout, effect))
        if policy is None:
            policy = s.guard._policy(name, self._timed(timeout), effect=effect)
            self._policies[(name, timeout, effect)] = policy
        if b.max_seconds is not None and b.max_seconds - s.elapsed <= 0:
            raise s._halt(StopReason.TIMEOUT, f"time budget ({b.max_seconds:g} s) exceeded")
        hung = hung_threads() - s._hung_base
        if hung >= b.max_hung_threads:
            if s.guard.on_hung_tool == "hand_over":
                escalate(s)
            raise s._halt(StopReason.HUNG_TOOLS, f"{hung} tool calls are still hanging in threads")
        ignore = (*VOLATILE_FIELDS, *volatile) if volatile else None
        action, enc, text, strings = intent_and_text(name, args, ignore)  # enc: the key's text
        # the tool-call budgets, the repeats, the identical failures and the slot: one step
        # under the run's lock, the only place they are checked (another thread may take the
        # last slot). The run's stops come first (an earlier stop, its time, hung tools), a
        # refusal of this call alone last: it never hides a stop.
        # a call that is no allowed repeat judges its step for progress (once it is made: a
        # call holding a placeholder is judged once it is known to be made)
        judged = allow_repeat is None and name not in s.guard.loops.allow_repeat
        placeholder = REDACTED in text if text is not None else _holds_placeholder(args)
        refused = admit(s, name, action, allow_repeat, TOOL_CHECKS, judged and not placeholder)
        if refused is not None:
            if isinstance(refused, str):  # held back: the model is told, the run goes on
                raise ToolError(name, refused, cause_kind="unavailable")
            raise s._halt(*refused)
        if placeholder:
            lost = _placeholders(s, name, args)
            if lost is not None:  # not made: its slot given back
                not_made(s, action)
                raise lost
            if judged:
                judge_step(s)
        return _Call(name, args, action, None, s.steps, policy, allow_repeat, text, strings, enc, s._scope)  # fmt: skip

    def _timed(self, timeout: float | None) -> float | None:
        """The attempt timeout a call's policy is made with: the tool's (or the guard's
        retry policy's); with neither, under a time budget, the budget itself, so that an
        attempt gets at most the time the run has left and the budget cuts it in both
        shells (a sync attempt then runs in a worker thread; without a time budget it runs
        inline, as before)."""
        if timeout is not None or self.s.guard.retry.attempt_timeout is not None:
            return timeout
        return self.s.budget.max_seconds

    def _not_made(self, call: _Call) -> None:
        """A call that a framework's control flow interrupted did not happen: its slot is
        given back."""
        not_made(self.s, call.action)

    def _label(self, name: str, label: str | None) -> None:
        if label is not None:
            if not isinstance(label, str) or not label.strip():
                raise ValueError(
                    f"label of tool {name!r} must be a non-empty string, got {label!r}"
                )
            label_effect(self.s, name, label.strip())

    def _effect_timeout(self, timeout: float | None) -> float | None:
        """An effect's timeout: the tool's (or the policy's), never past the run's time."""
        bounds = [
            t
            for t in (
                timeout if timeout is not None else self.s.guard.retry.attempt_timeout,
                self.s.time_left(),
            )
            if t is not None
        ]
        return min(bounds) if bounds else None

    def _lease(self, timeout: float | None) -> float:
        """A claim's lease covers the call's timeout (the heartbeat renews it anyway)."""
        lease = self.s.guard.ledger.lease
        return lease if timeout is None else max(lease, 2.0 * timeout)

    def _effect(
        self,
        call: _Call,
        attempt: Callable[[], Any],
        idempotent: bool,
        lookup: Callable[[str], Any] | None,
        timeout: float | None,
    ) -> Callable[[], Any]:
        """A non-idempotent call's attempt, run at most once through the guard's ledger."""
        return attempt if idempotent else _Ran(self, call, attempt, lookup, timeout)

    def _effect_key(self, call: _Call) -> str:
        """The ledger key of a non-idempotent call, noted so that the outcome can state
        what the ledger says was done."""
        note_effect(self.s, call.name, call.args, call.key)
        return call.key

    def _after_success(
        self, call: _Call, result: Any, idempotent: bool = True, compensate: Any = None
    ) -> Any:
        s = self.s
        # only completed calls count as repeats: a call that failed is the business of
        # max_identical_failures, so a model retrying a dead dependency is not a "loop"
        allowed = call.allow_repeat is not None  # the call leaves the flight recorded
        journal = (  # how to compensate it; a failed effect of its tool is done after all
            None
            if compensate is None
            else JournalEntry(
                call.name,
                call.args,
                call.action if idempotent else call.key,
                result,
                not idempotent,
                compensate,
            )
        )
        retries = call.policy._retries()
        completed(s, call.name, call.action, allowed, retries, journal)
        try:
            encoded, found = canonical_and_strings(result)
        except (TypeError, ValueError):
            encoded, found = None, None
        # redacted now, once, from these encodings: the ending only gathers the views
        entry = {"step": call.step, "tool": call.name, "args": call.args, "result": result}
        attempts = retries + 1 if idempotent else call.runs  # not waits on another's claim
        if attempts > 1:  # the tool ran more than once for this call: earlier ones failed
            entry["attempts"] = attempts
        if call.replayed:  # the ledger's recorded result: the tool did not run
            entry["replayed"] = True
        texts = {"args": call.text, "result": encoded}
        recorded = RecordedEntry(entry, texts, {"args": call.strings, "result": found})
        self.s.partial.append(recorded.redacted(jsonable))
        s.transcript.append({"step": call.step, "tool": call.name, "ok": True})
        text = encoded if encoded is not None else repr(result)
        digest = _digest.sha256(f"{call.name}\x00{text}".encode()).hexdigest()
        note_result(s, digest)  # progress when not seen before
        if s.guard.escalation is not None:  # no escalation: no retry limit to check
            self._check_retry_escalation()
        return result

    def _check_retry_escalation(self) -> None:
        esc = self.s.guard.escalation
        if esc is not None and esc.max_retries is not None and self.s.retries > esc.max_retries:
            escalate(self.s)
            raise self.s._halt(StopReason.ESCALATED, f"retries passed {esc.max_retries}")

    def _after_failure(self, call: _Call, exc: Exception, flying: bool = False) -> BaseException:
        """The exception to raise for a failed tool call (Stopped or ToolError). ``flying``:
        the call is still under way and leaves the flight here (a failure the identical-
        failures limit counts leaves it as it is counted: a call admitted meanwhile sees it
        either under way or failed)."""
        try:
            if not (isinstance(exc, ToolUnresponsive) and exc.before):
                self.s.count_retries(call.policy._retries())
            entry = {"step": call.step, "tool": call.name, "ok": False, "error": type(exc).__name__}
            if isinstance(exc, UnknownOutcome):  # what a person must check (the case shows it)
                entry.update(args=redact(jsonable(call.args)), key=exc.key)
            self.s.transcript.append(entry)
            if isinstance(exc, Stopped | ReturnedAwaitable):  # the latter: the code's mistake
                return exc
            if isinstance(exc, Declined):  # a "no": nothing done; the run ends at the next step
                withdraw_effect(self.s, call.key)  # none made
                said = _said(exc.reason) if exc.reason else "declined"
                self.s._halt(StopReason.DECLINED, f"{call.name}: {said}")
                return ToolError(call.name, f"declined: {said}", cause_kind="declined")
            if isinstance(exc, ToolUnresponsive):
                return self.hung._not_answering(call, exc)
            if isinstance(exc, CircuitOpenError):
                return self.s.outage(
                    exc.name, f"{call.name}: its dependency is down (circuit open)"
                )
            if isinstance(exc, EffectInProgress):  # one request, two runs: the other one has it
                open_issue(
                    self.s,
                    f"{call.name} is being done by another worker of this request (it holds the "
                    f"claim until its lease ends); its result will be in the ledger (key "
                    f"{exc.key[:16]}…): do not do it again",
                )
                return self.s._halt(
                    StopReason.IN_PROGRESS, f"{call.name} is being done by another worker"
                )
            if isinstance(exc, UnknownOutcome):
                mark_uncertain(
                    self.s,
                    call.name,
                    f"{call.name} may have happened: its outcome is unknown; check the provider's "
                    f"records before trying it again (ledger key {exc.key[:16]}…)",
                )
                return self.s._halt(
                    StopReason.UNKNOWN_OUTCOME, f"{call.name} may or may not have happened"
                )
            verdict = classify(exc)
            if isinstance(exc, DeadlineExceeded) and self.s.budget.max_seconds is not None:
                return self.s._halt(StopReason.TIMEOUT, f"time budget ran out during {call.name}")
            if isinstance(exc, TimeoutError) and call.name in self.s._health:
                unresponsive = self.hung._unresponsive(call.name)
                if unresponsive is not None:
                    return self.hung._not_answering(call, unresponsive)
            signature = (call.action, type(exc).__name__, f"{verdict.status}:{verdict.code}")
            # out of flight as it is counted
            failed, replayed = count_failure(self.s, signature, flying, call.replayed)
            flying = False
            limit = self.s.budget.max_identical_failures
            if limit is not None and failed >= limit:
                self._park(call, exc)
                return self.s._halt(
                    StopReason.IDENTICAL_FAILURES,
                    identical_failures(call.name, type(exc).__name__, failed, replayed),
                )
            try:
                self._check_retry_escalation()
            except Stopped as stopped:
                return stopped
            if verdict.retryable or isinstance(exc, DeadlineExceeded):
                return ToolError(call.name, UNAVAILABLE, cause_kind="unavailable")
            if isinstance(exc, ToolError):  # the tool's own words for the model
                return ToolError(call.name, _said(exc.model_message), cause_kind="rejected")
            self._park(call, exc)
            if any(
                key == call.key for _, _, key in self.s._effects
            ):  # never "success" (Run.succeed)
                text = f"{type(exc).__name__}: {str(exc).strip()}".rstrip(": ")
                effect_failed(self.s, call.name, str(redact(text))[:500])
            if isinstance(exc, self.s.guard.model_errors):  # a business rule, said on purpose
                return ToolError(call.name, f"rejected: {_said(str(exc))}", cause_kind="rejected")
            if verdict.kind is Kind.QUOTA:
                return ToolError(call.name, QUOTA_REACHED, cause_kind="quota")
            return ToolError(call.name, REJECTED, cause_kind="rejected")
        finally:
            if flying:
                call_over(self.s, call.action)

    def _interrupted(
        self, call: _Call, progress: _Progress | None, idempotent: bool, compensate: Any
    ) -> None:
        """What a cancelled (or interrupted) call leaves behind, before the cancellation goes
        on: the result it returned is kept; an effect that may have started stops the run
        UNKNOWN_OUTCOME; one that cannot have started leaves nothing (the ledger gave its
        claim back), unless an attempt failed in a way that may have done it (the ledger
        marked it unknown, and the retry that would have said so never came)."""
        if progress is not None:
            progress.give_up()
        if progress is None or not progress.returned:  # a result settles it as it is recorded
            call_over(self.s, call.action)
        if progress is None:
            return
        # running first: an attempt sets its result or its error before it stops running
        running, error = progress.running, progress.error
        if progress.returned:
            try:
                self._after_success(call, progress.result, idempotent, compensate)
            except Stopped:
                pass  # the cancellation is what the caller gets
        elif running:
            self._after_failure(
                call, UnknownOutcome(call.key, "cancelled while it ran: it may have happened")
            )
        elif error is not None and (
            isinstance(error, UnknownOutcome) or classify(error).outcome_unknown
        ):
            said = f"cancelled after it failed with an unknown outcome ({type(error).__name__})"
            self._after_failure(call, UnknownOutcome(call.key, said))

    def _park(self, call: _Call, exc: BaseException) -> None:
        letters = self.s.guard.dead_letters
        if letters is None:
            return
        letter = letters.park(
            tool=call.name,
            args=call.args,
            error=exc,
            run_id=self.s.run_id,
            task=self.s.task,
            at=self.s.clock.wall(),
            key=call.key,
        )
        issue = f"{call.name} failed permanently; dead letter {letter.id}"
        open_issue(self.s, issue, once=True)  # the model asking again joins the same letter


class _Effect:
    """A side effect's attempt run through the guard's ledger, knowing whether the ledger ran
    the tool (``ran``) or answered without running it (a failure it recorded, replayed: the
    identical-failures stop says how often the tool really ran)."""

    __slots__ = ("call", "decide", "fn", "key", "lease", "ledger", "lookup", "ran", "timeout")

    def __init__(
        self,
        decide: ToolDecisions,
        call: _Call,
        fn: Callable[[], Any],
        lookup: Callable[[str], Any] | None,
        timeout: float | None,
    ) -> None:
        self.decide, self.call, self.fn, self.lookup = decide, call, fn, lookup
        self.ledger, self.key = decide.s.guard.ledger, decide._effect_key(call)
        self.lease, self.timeout, self.ran = decide._lease(timeout), timeout, False

    def _begin(self) -> float | None:
        """An attempt begins (what an earlier one said is forgotten); its timeout."""
        self.ran = self.call.replayed = False
        return self.decide._effect_timeout(self.timeout)

    def _answered(self) -> None:
        """The ledger answered (a result or a failure): noted when it did so without running
        the tool (a recorded outcome replayed), for the call's entry or its failure."""
        self.call.replayed = not self.ran


class _Ran(_Effect):
    def _run(self) -> Any:
        self.ran = True
        self.call.runs += 1
        return self.fn()

    def __call__(self) -> Any:
        timeout = self._begin()
        try:
            return self.ledger.once(
                self.key, self._run, lookup=self.lookup, lease=self.lease, timeout=timeout
            )
        finally:
            self._answered()


class _ARan(_Effect):
    async def _run(self) -> Any:
        self.ran = True
        self.call.runs += 1
        return await self.fn()

    async def __call__(self) -> Any:
        timeout = self._begin()
        try:
            return await self.ledger.aonce(
                self.key, self._run, lookup=self.lookup, lease=self.lease, timeout=timeout
            )
        finally:
            self._answered()


def _placeholders(s: RunState, name: str, args: Any) -> Exception | None:
    """A call whose arguments hold the redaction placeholder never runs: the value was
    lost when the conversation was stored (a secret is never kept in clear), and the
    placeholder is no card number. A resumed run stops FAILED saying so (its pending
    call cannot be completed, nor approved again); the model of a live run is told to
    ask for the value again. Returns what to raise (None: the placeholder is in a key, not
    a value; nothing was lost)."""
    lost = redacted_paths(args)
    if not lost:
        return None
    fields = ", ".join(p.removeprefix("args.") for p in lost)
    if s._resumed_from is not None:
        open_issue(
            s,
            f"{name} was not resumed: its argument {fields} was redacted when the run was "
            "stored (secrets are never kept); ask the customer for it again",
        )
        return s._halt(
            StopReason.FAILED,
            f"{name} cannot be resumed: its argument {fields} was redacted when the run was stored",
        )
    return ToolError(
        name,
        f"rejected: {fields} holds a redacted placeholder, not the value; ask the customer "
        "for it again",
        cause_kind="rejected",
    )
