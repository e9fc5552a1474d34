"""Human handoff: when to escalate, the record a person receives, what the customer reads."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tether._frozen import Value, frozen_dataclass
from tether.run._outcome import MEANINGS, Status, StopReason

__all__ = ["SOME_STEP", "CustomerMessages", "Escalation", "HandoffRecord", "webhook"]

_log = logging.getLogger("tether")

#: what the customer reads for an effect whose tool declares no label (tool names stay inside)
SOME_STEP = "a step of your request"

#: the reasons that need a person (``Meaning.person``): circuit open, identical failures,
#: an unknown outcome, hung tools, a permanent error (an explicit handoff always escalates)
DEFAULT_TRIGGERS = frozenset(
    reason
    for reason, meaning in MEANINGS.items()
    if meaning.person and meaning.status is not Status.ESCALATED
)


@frozen_dataclass
class HandoffRecord(Value):
    """What a person gets when a run is handed over: the case, its history, the facts."""

    id: str
    run_id: str
    task: str
    reason: StopReason
    detail: str
    history: tuple[dict[str, Any], ...]
    facts: tuple[str, ...]  # read from the ledger, never from the model's text
    open_issues: tuple[str, ...]
    customer_message: str
    at: float

    def to_doc(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "run_id": self.run_id,
            "task": self.task,
            "reason": self.reason.value,
            "detail": self.detail,
            "history": list(self.history),
            "facts": list(self.facts),
            "open_issues": list(self.open_issues),
            "customer_message": self.customer_message,
            "at": self.at,
        }


Sink = Callable[[HandoffRecord], object]


@frozen_dataclass
class Escalation(Value):
    """When a run goes to a person, and where the handoff record is delivered.

    A run escalates when it stops for one of ``on`` (default: circuit open, identical
    failures, an unknown outcome of an effect, hung tools, a permanent error), when its
    retries pass ``max_retries`` or its steps pass ``max_steps`` (seed 002 used 5 and 8),
    or when the code calls ``run.escalate()``; and when a ``sink`` is configured, every
    run that stops short of its goal is handed over. ``sink`` receives the
    :class:`HandoffRecord`: a callable, ``tether.Handoffs.sqlite(path)``, or
    ``tether.webhook(url)``. With ``Guard(records=...)``, the runs one outage stops are one
    incident and the sink gets one handoff for it, the first run's, whose ``id`` is the
    incident's case (``records.incidents.runs(handoff.id)`` lists its conversations); the
    runs that join it later do not call the sink again.
    """

    on: frozenset[StopReason] = DEFAULT_TRIGGERS
    max_retries: int | None = None
    max_steps: int | None = None
    sink: Sink | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "on", frozenset(self.on))
        for name in ("max_retries", "max_steps"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 or None, got {value!r}")


def webhook(url: str, *, timeout: float = 10.0, headers: dict[str, str] | None = None) -> Sink:
    """A sink that POSTs the handoff record as JSON to ``url``."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"url must be http:// or https://, got {url!r}")

    def send(record: HandoffRecord) -> None:
        import urllib.request  # imported when first used: `import tether` loads no HTTP client

        body = json.dumps(record.to_doc(), default=str).encode()
        req = urllib.request.Request(
            url,
            data=body,
            method="POST",
            headers={"content-type": "application/json", **(headers or {})},
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()

    return send


@frozen_dataclass
class CustomerMessages(Value):
    """Short, honest texts for the customer: no stack trace, no internals, no hostnames.

    ``{done}`` is filled with facts read from the ledger ("Done: ..."), so an
    effect is stated as done only when the records say so; an effect is named by its
    tool's ``label``, never by the tool's name.

    A person is promised only when one has the case: ``escalated``, ``handed_over``,
    ``partial`` and ``unconfirmed`` are said when the run's handoff was filed (in ``Guard(records=...)``,
    or delivered to an ``Escalation(sink=...)``); otherwise their ``*_no_case`` forms,
    which promise nobody.

    "Try again later" is said only when it is true: ``failed`` for a cause that may pass
    (``StopReason.X.meaning.retry_helps``: a dependency that failed or is down);
    ``needs_attention`` when trying again meets the same stop (a permanent error, a loop, a
    budget). A run whose tool calls ran, none of them an effect the ledger records (a tool
    left ``idempotent=True`` may be one), reads ``acted``: steps were carried out, and the
    customer is asked not to repeat the request before someone checks.
    """

    escalated: str = (
        "We could not finish this for you automatically. A member of our team now has your "
        "case, with everything so far, and will get back to you here.{done}"
    )
    partial: str = (
        "We could only finish part of this automatically.{done} A member of our team can "
        "pick up the rest if you reply here."
    )
    failed: str = (
        "We could not complete this request right now.{done} Please try again later, or reply "
        "here for help."
    )
    needs_attention: str = (
        "We could not complete this request automatically: it needs a person to look at it."
        "{done} Please reply here for help."
    )
    acted: str = (
        "We could not finish this automatically, and some steps of your request were already "
        "carried out.{done} So that nothing is done twice, please do not repeat the request: "
        "reply here so that someone can check what was done first."
    )
    success: str = "Your request is complete.{done}"
    unconfirmed: str = (
        "We could not confirm whether every step of your request went through.{done} Please "
        "do not repeat it: a member of our team will check our records and get back to you here."
    )
    awaiting_approval: str = (
        "Part of your request needs a person's approval before we go on.{done} We will get "
        "back to you here as soon as it is decided."
    )
    paused: str = (
        "Your request is paused: the usage limit it runs under has been reached.{done} Nothing "
        "has failed: it can go on from here once the limit is raised."
    )
    rolled_back: str = (
        "We could not complete this request, so we reversed what had already been done.{done} "
        "You can try again, or reply here for help."
    )
    refused: str = "We can't help with this request.{done}"
    in_progress: str = (
        "Your request is being completed.{done} We will confirm here as soon as it is done; "
        "there is no need to ask again."
    )
    handed_over: str = (
        "A member of our team now has your case, with everything so far, and will get back to "
        "you here.{done}"
    )
    declined: str = (
        "This was not done: it was declined.{done} Reply here if anything should change."
    )
    outage: str = (
        "We're having trouble reaching one of our systems right now, so we could not finish "
        "this.{done} A member of our team has your case and will get back to you here; you can "
        "also try again in a few minutes."
    )
    escalated_no_case: str = (
        "We could not finish this for you automatically.{done} Please try again later."
    )
    partial_no_case: str = (
        "We could only finish part of this automatically.{done} Please reply here for help with "
        "the rest."
    )
    handed_over_no_case: str = (
        "We could not pass your case to a member of our team right now.{done} Please try again "
        "later."
    )
    unconfirmed_no_case: str = (
        "We could not confirm whether every step of your request went through.{done} Please "
        "do not repeat it yet: check first whether it went through, so that nothing is done twice."
    )
    outage_no_case: str = (
        "We're having trouble reaching one of our systems right now, so we could not finish "
        "this.{done} Please try again in a few minutes."
    )
    done_prefix: str = " Done: "
    undone_prefix: str = " Undone: "

    def render(
        self,
        status: str,
        facts: Iterable[str],
        *,
        unconfirmed: Iterable[str] = (),
        undone: Iterable[str] = (),
        case_filed: bool = True,
        acted: bool = False,
        retry_helps: bool = True,
    ) -> str:
        """The message for a run that ended with ``status``; a run with an effect whose
        outcome is unknown never tells the customer that nothing happened, a failed run
        that did something says what it did (the ``partial`` text, never "try again"), and a
        person is promised only when ``case_filed`` (someone has the case).

        ``acted``: tool calls of the run completed (whatever the ledger records): a run
        that did something the ledger cannot name reads ``acted``, never "try again".
        ``retry_helps``: the cause may pass (the stop reason's ``meaning.retry_helps``);
        otherwise a run with nothing done reads ``needs_attention``, not "try again later".
        """
        facts = [f for f in facts if f]
        undone = [u for u in undone if u]
        done = f"{self.done_prefix}{'; '.join(facts)}." if facts else ""
        if undone:
            done += f"{self.undone_prefix}{'; '.join(undone)}."
        if status in _UNCONFIRMABLE and any(True for _ in unconfirmed):
            status = "unconfirmed"
        elif status in ("failed", "partial", "declined") and undone and not facts:
            status = "rolled_back"
        elif status in ("failed", "declined") and facts:  # something was done: never "try again"
            status = "partial"
        elif status == "partial" and not facts:  # "part of this" only when a part was done
            status = "failed"
        if not case_filed and status in _PROMISES:
            status = f"{status}_no_case"
        if status in _TRY_AGAIN and not facts:  # advice that is true only if nothing ran
            if acted:  # calls ran that the ledger cannot name: never "nothing happened"
                status = "acted"
            elif not retry_helps and status != "outage_no_case":  # the same stop again
                status = "needs_attention"
        template = getattr(self, status, self.failed)
        return str(template).format(done=done)


#: the endings whose message gives way to "unconfirmed" when an effect's outcome is unknown
_UNCONFIRMABLE = frozenset(
    {"failed", "partial", "escalated", "refused", "handed_over", "declined", "outage"}
)
#: the messages that tell the customer to try again: true only when nothing was done (else
#: ``acted``) and the cause may pass (else ``needs_attention``; an outage always may)
_TRY_AGAIN = frozenset({"failed", "escalated_no_case", "outage_no_case"})
#: the messages that promise a person: their ``*_no_case`` form when no case was filed
_PROMISES = frozenset({"escalated", "partial", "unconfirmed", "handed_over", "outage"})


class _Delivery:
    """Where an ending's handoff goes, and what went wrong on the way."""

    __slots__ = ("errors", "sink")

    def __init__(self, sink: Sink | None) -> None:
        self.sink = sink
        self.errors: list[str] = []

    def deliver(self, record: HandoffRecord) -> bool:
        """True when the record reached the sink (someone has the case)."""
        if self.sink is None:
            return False
        try:
            self.sink(record)
        except Exception as exc:  # a broken sink never loses the run's outcome
            _log.error("tether: handoff %s could not be delivered: %s", record.id, exc)
            self.errors.append(f"handoff delivery failed: {type(exc).__name__}")
            return False
        return True


def _describe(label: str, args: Any, result: Any, reference: Any = None) -> str | None:
    """The default words for a completed effect: its tool's label ("refund completed"), or
    a neutral phrase when the tool declares none; with a reference: the result's field the
    tool names (``Tool(reference="refund_id")``), a function of the result, or its ``id``."""
    ref = _reference(result, reference)
    return f"{label or SOME_STEP} completed" + (f" (reference {ref})" if ref else "")


def _reference(result: Any, reference: Any = None) -> Any:
    """The reference of an effect's result (None: none to show)."""
    if callable(reference):
        try:
            found = reference(result)
        except Exception:  # the customer's message never fails on a reference
            _log.warning("tether: a tool's reference function raised; no reference shown")
            return None
        return found if isinstance(found, str | int) and not isinstance(found, bool) else None
    field = reference if isinstance(reference, str) else "id"
    found = result.get(field) if isinstance(result, Mapping) else getattr(result, field, None)
    return found if isinstance(found, str | int) and not isinstance(found, bool) else None
