"""What a ledger writes and reads back: claims, settlements, replays.

Every store step of :meth:`tether.Ledger.once` and :meth:`~tether.Ledger.aonce` is a
method here, so the sync and the async form take the same decisions: whether a claim
is ours, a replay or a conflict; what an effect's failure means for its record (failed,
unknown, or released: nothing happened); what to do when the store lost the record or
another worker fenced us off.
"""

from __future__ import annotations

import builtins
import contextvars
import json
import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from tether._errors import (
    ControlSignal,
    Declined,
    EffectInProgress,
    EffectNotRecorded,
    IdempotencyConflict,
    StoreUnavailable,
    TetherError,
    UnknownOutcome,
)
from tether.classification._classify import Kind, classify
from tether.clock import Clock, VirtualClock
from tether.effects._codec import Codec, JsonCodec
from tether.redaction._redact import redact_text
from tether.stores._ledger_logic import Completion, LedgerBackend, Record, Settlement, State

#: a named tuple from all its fields at once (see :data:`tether.stores._ledger_logic._build`)
_build = tuple.__new__

__all__ = [
    "NOT_FOUND",
    "EffectFailed",
    "LedgerSettings",
    "Recorder",
    "current_key",
    "owner_token",
    "why",
]

_log = logging.getLogger("tether")

#: the intent key of the effect running in this context
current_key: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tether_idempotency_key", default=None
)


class _Missing:
    def __repr__(self) -> str:
        return "NOT_FOUND"


#: no result (yet): the effect must run
NOT_FOUND: Any = _Missing()


class EffectFailed(TetherError):
    """The replay of a recorded permanent failure whose type could not be rebuilt."""

    def __init__(self, type_name: str, message: str) -> None:
        self.type_name = type_name
        super().__init__(f"{type_name}: {message} (recorded failure of an earlier attempt)")


class LedgerSettings(Protocol):
    """What the recorder reads of its ledger (read each time: a backend may be swapped)."""

    backend: LedgerBackend
    ttl: float
    codec: Codec
    clock: Clock


def _said(exc: BaseException) -> str:
    """An error's message, redacted and short (never raising)."""
    try:
        return redact_text(str(exc))[:300]
    except Exception:
        return "its message could not be read"


def why(previous: Record) -> str:
    """Why a record taken over needs reconciling, in words."""
    return previous.detail or (
        "a worker's claim expired before it recorded an outcome"
        if previous.state is State.PENDING
        else "an earlier attempt's outcome is unknown"
    )


def _encode_error(exc: BaseException) -> str:
    try:
        message = redact_text(str(exc))[:2000]
    except Exception as failed:  # an exception whose str() raises is still recorded
        message = f"(its message could not be read: {type(failed).__name__})"
    said = {"type": type(exc).__name__, "module": type(exc).__module__, "message": message}
    return json.dumps(said)


#: the tag of a result that could not be recorded (see :meth:`Recorder.result_text`): the
#: effect ran and is recorded done, its result is lost. A user's own ``$unrecordable`` key
#: is written ``$$unrecordable`` by the codec, so no result is mistaken for it.
UNRECORDABLE = "$unrecordable"
_UNRECORDABLE_AT = '{"' + UNRECORDABLE + '": '


def _storable(text: object) -> str:
    """``text`` if every ledger store can hold it: a str, valid UTF-8 (no lone
    surrogate), without NUL (PostgreSQL's text refuses it); else the error saying why."""
    if type(text) is not str:
        raise TypeError(f"the codec returned a {type(text).__name__}, not a str")
    if not text.isascii():
        text.encode("utf-8")  # UnicodeEncodeError for a lone surrogate
    if "\x00" in text:
        raise ValueError("the codec's text holds a NUL character")
    return text


def owner_token() -> str:
    """A fresh owner token for a claim: 32 random hex digits, drawn from the system on
    every claim. A per-process prefix and a counter (tried: about 1 us less a claim) repeat
    across workers forked below Python (uWSGI's default pre-fork runs no after-fork hook),
    and a claim whose token matches a pending record is taken as its owner's own retry:
    the effect ran twice."""
    return os.urandom(16).hex()


class Recorder:
    """The store steps of one ledger, and the decisions taken on their answers."""

    def __init__(self, ledger: LedgerSettings) -> None:
        self.ledger = ledger
        # a virtual clock drives leases itself (tests, the bench); any real clock defers to
        # the store's own clock, so that one fleet measures leases on one clock
        self.virtual = isinstance(ledger.clock, VirtualClock)
        self._errors: OrderedDict[str, BaseException] = OrderedDict()

    def now(self) -> float | None:
        return self.ledger.clock.wall() if self.virtual else None

    # --- claims -----------------------------------------------------------------------

    def try_claim(
        self, key: str, payload: str | None, lease: float, last: bool
    ) -> tuple[str, Record | None, Any] | None:
        """One claim attempt: (owner, previous record of a takeover, a replay or NOT_FOUND),
        or None while another worker holds the key (ask again, unless ``last``)."""
        ledger = self.ledger
        owner = owner_token()  # the claim's owner and fencing token
        now = ledger.clock.wall() if self.virtual else None
        try:
            claimed, record = ledger.backend.claim(
                Record.claim_of(key, payload, owner, lease, ledger.ttl), now
            )
        except StoreUnavailable as exc:
            raise StoreUnavailable(
                f"{exc}; nothing was executed: retry when the ledger's store answers"
            ) from exc
        if claimed:
            return owner, record, NOT_FOUND
        assert record is not None
        if payload and record.payload_hash and record.payload_hash != payload:
            raise IdempotencyConflict(
                f"intent key {key[:16]}… was used before with different arguments; "
                "an idempotency key names one request: derive it with tether.intent_key"
            )
        if record.state is State.DONE:
            return owner, None, self.replay(record)
        if record.state is State.FAILED:
            raise self.replay_error(record)
        if not last:
            return None
        if record.state is State.UNKNOWN:
            raise UnknownOutcome(key, record.detail or "an attempt may still be running")
        raise EffectInProgress(key, record.lease_until)

    def unclaim(self, key: str, owner: str, previous: Record | None) -> None:
        """Give a claim back before its effect started (the caller was cancelled): delete
        a fresh one; leave a takeover's record UNKNOWN again, as it was."""
        ledger = self.ledger
        try:
            if previous is None:
                ledger.backend.release(key, owner)
            else:
                ledger.backend.mark_unknown(self._unknown(key, owner, why(previous)))
        except Exception as exc:  # the claim stays pending until its lease runs out
            _log.error("tether: effect %s…: its claim could not be given back: %s", key[:16], exc)

    def reconcile(
        self, key: str, owner: str, previous: Record, lookup: Callable[[str], Any] | None
    ) -> Any:
        """A takeover: ask ``lookup`` whether the earlier attempt happened."""
        said_why = why(previous)
        if lookup is None:
            self.mark_unknown(key, owner, said_why)
            raise UnknownOutcome(key, said_why)
        try:
            found = lookup(key)
        except Exception as exc:
            said = f"lookup failed: {type(exc).__name__}: {redact_text(str(exc))[:300]}"
            self.mark_unknown(key, owner, f"{said_why}; {said}")
            raise UnknownOutcome(key, said) from exc
        if found is None:
            _log.info("effect %s…: lookup says it did not happen; running it", key[:16])
            return NOT_FOUND
        _log.info("effect %s…: lookup found it done; recording, not repeating", key[:16])
        self.record_done(key, owner, found)
        return found

    # --- settlements ------------------------------------------------------------------

    def _unknown(self, key: str, owner: str, detail: str, keep_lease: bool = False) -> Settlement:
        now, ttl = self.now(), self.ledger.ttl
        return Settlement(key, owner, State.UNKNOWN, now, ttl, detail=detail, keep_lease=keep_lease)

    def mark_unknown(self, key: str, owner: str, detail: str, *, keep_lease: bool = False) -> None:
        try:
            self.ledger.backend.mark_unknown(self._unknown(key, owner, detail, keep_lease))
        except Exception as exc:  # the record stays PENDING: its lease runs out, then unknown
            _log.error("tether: effect %s…: could not mark it unknown: %s", key[:16], exc)

    def record_done(self, key: str, owner: str, result: Any) -> None:
        ledger = self.ledger
        text = self.result_text(key, result)
        try:
            now = ledger.clock.wall() if self.virtual else None
            # Settlement(key, owner, State.DONE, now, ttl, text) from its fields at once (its
            # constructor's keyword handling is a tenth of a memory ledger's once())
            done = _build(
                Settlement, (key, owner, State.DONE, now, ledger.ttl, text, None, "", False)
            )
            verdict = ledger.backend.complete(done)
        except Exception as exc:
            said = f"the ledger's store failed ({redact_text(str(exc))})"
            raise self._not_recorded(key, result, said) from exc
        if verdict is Completion.MISSING:
            self._restore_unknown(key, owner)
            said = (
                "the ledger no longer has its record (a store that lost data, "
                "for example a Redis restarted without persistence)"
            )
            raise self._not_recorded(key, result, said)
        if verdict is Completion.LOST:
            said = (
                "another worker took its claim over after the lease ran out "
                "without renewal; the other worker's record stands"
            )
            raise self._not_recorded(key, result, said)
        if verdict is Completion.FINAL:
            _log.warning("tether: effect %s… was settled by someone else while it ran", key[:16])

    def record_failure(self, key: str, owner: str, exc: BaseException) -> None:
        """Settle a failed effect: FAILED (permanent), UNKNOWN (it may have happened), or
        released (it provably did not: refused, rate limited, quota)."""
        ledger = self.ledger
        try:
            if isinstance(exc, ControlSignal | Declined):  # control flow, or a "no": not done
                ledger.backend.release(key, owner)
                return
            if not isinstance(exc, Exception):  # cancelled mid-effect: nobody knows
                self.mark_unknown(key, owner, f"interrupted by {type(exc).__name__}")
                return
            verdict = classify(exc)
            if verdict.kind is Kind.PERMANENT and not verdict.outcome_unknown:
                self._remember_error(key, exc)
                now, error = self.now(), _encode_error(exc)
                ledger.backend.complete(
                    Settlement(key, owner, State.FAILED, now, ledger.ttl, None, error)
                )
            elif verdict.outcome_unknown:
                detail = redact_text(f"{type(exc).__name__}: {verdict.reason}")
                self.mark_unknown(key, owner, detail)
            else:  # refused before sending, rate limited, quota: nothing happened
                ledger.backend.release(key, owner)
        except Exception as store_error:  # the effect's own error is what the caller gets
            _log.error(
                "tether: effect %s…: its failure could not be recorded (%s); the "
                "record stays pending until its lease runs out",
                key[:16],
                store_error,
            )

    def _restore_unknown(self, key: str, owner: str) -> None:
        """Write back a record the store lost, as UNKNOWN: whoever asks next must reconcile
        through ``lookup`` instead of running the effect again."""
        ledger = self.ledger
        try:
            ledger.backend.claim(Record.claim_of(key, None, owner, 60.0, ledger.ttl), self.now())
            said = "the store lost this record after the effect ran; check the provider's records"
            ledger.backend.mark_unknown(self._unknown(key, owner, said))
        except Exception as exc:
            _log.error(
                "tether: effect %s…: its lost record could not be restored: %s", key[:16], exc
            )

    def _not_recorded(self, key: str, result: Any, said: str) -> EffectNotRecorded:
        error = EffectNotRecorded(key, result, said)
        _log.error("tether: %s", error)
        return error

    # --- results ----------------------------------------------------------------------

    def result_text(self, key: str, result: Any) -> str:
        """What is recorded of an effect's ``result``: the codec's text; else its repr;
        else a marker that it ran and its result could not be recorded. Never raises:
        the effect ran, and its claim must be settled done (a replay of the marker
        raises :class:`tether.EffectNotRecorded`, it never runs the effect again)."""
        try:
            return _storable(self.ledger.codec.encode(result))
        except Exception as exc:
            failed = exc
        try:
            return _storable(self._encode_repr(result, failed))
        except Exception as exc:
            why = (
                f"the ledger's codec could not encode a {type(result).__name__} "
                f"({type(failed).__name__}: {_said(failed)}), nor its repr "
                f"({type(exc).__name__}: {_said(exc)})"
            )
        _log.error(
            "tether: effect %s… ran, but its result cannot be recorded: %s; it is recorded "
            "done with an unrecordable result (it is not run again)",
            key[:16],
            why,
        )
        return json.dumps({UNRECORDABLE: why})

    def _encode_repr(self, value: Any, exc: Exception) -> str:
        """What is stored of a result the codec cannot encode: its repr (said in the log)."""
        _log.warning(
            "effect result of type %s cannot be encoded (%s); its repr is recorded. "
            "Return JSON-able results or pass codec= to the Ledger",
            type(value).__name__,
            exc,
        )
        return JsonCodec().encode({"$repr": repr(value)[:2000]})

    def replay(self, record: Record) -> Any:
        if record.result is None:
            return None
        if record.result.startswith(_UNRECORDABLE_AT):
            why = str(json.loads(record.result).get(UNRECORDABLE, ""))
            raise EffectNotRecorded(
                record.key, None, f"{why}. It ran and is recorded done: it is not run again"
            )
        try:
            return self.ledger.codec.decode(record.result)
        except Exception:
            return JsonCodec().decode(record.result)

    def _remember_error(self, key: str, exc: BaseException) -> None:
        self._errors[key] = exc
        while len(self._errors) > 1024:
            self._errors.popitem(last=False)

    def replay_error(self, record: Record) -> BaseException:
        known = self._errors.get(record.key)
        if known is not None:
            return known
        data = json.loads(record.error or "{}")
        name, message = str(data.get("type", "Exception")), str(data.get("message", ""))
        cls = getattr(builtins, name, None)
        if (
            data.get("module") == "builtins"
            and isinstance(cls, type)
            and issubclass(cls, Exception)
        ):
            return cls(message)
        return EffectFailed(name, message)
