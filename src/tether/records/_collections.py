"""Durable records of runs: checkpoints, dead letters and handoffs.

Each is a small document store (JSON by id) in memory, in SQLite (the embedded
default) or in PostgreSQL (for a fleet). Documents carry a format tag; reading a
corrupt or foreign document is a :class:`CheckpointError` that says what is wrong.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Self, TypedDict, Unpack

from tether._errors import CheckpointError, TetherError
from tether.redaction._redact import redact, redacted_paths
from tether.stores._documents import (
    DocKind,
    DocumentStore,
    MemoryDocuments,
    PostgresDocuments,
    SqliteDocuments,
)

if TYPE_CHECKING:
    from tether.effects._ledger import Ledger

__all__ = [
    "RUN_ID_RULE",
    "CaseState",
    "CheckpointError",
    "Checkpoints",
    "DeadLetter",
    "DeadLetters",
    "Handoffs",
    "OnDocuments",
    "RedactedArguments",
    "check_run_id",
    "redact",
]

CHECKPOINT_FORMAT = "tether.checkpoint/1"


class CaseState(enum.StrEnum):
    """A handoff's case state; the values are what the records keep (a case filed before
    cases had a state is open)."""

    OPEN = "open"
    CLAIMED = "claimed"  # a person took it
    RESOLVED = "resolved"  # closed, with a note


#: the order the inbox lists cases in
_CASE_ORDER = {CaseState.OPEN: 0, CaseState.CLAIMED: 1, CaseState.RESOLVED: 2}
#: How long a replay's record is kept: a letter replayed once stays replayed.
REPLAY_TTL = 400 * 86_400.0

#: what a run id (and every record id) may be: it appears in URLs, logs and file names
RUN_ID_RULE = "1 to 128 letters, digits, '.', '_', ':' or '-', starting with a letter or a digit"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def check_run_id(value: object, name: str = "run_id") -> str:
    """``value`` if it is a valid run id (:data:`RUN_ID_RULE`); else a ValueError naming the rule."""
    if not isinstance(value, str) or not _RUN_ID.fullmatch(value):
        raise ValueError(f"{name} must be {RUN_ID_RULE}; got {value!r:.80}")
    return value


class OnDocuments(AbstractContextManager[Any]):
    """Records over one document store, opened where they are kept: ``sqlite(path)``,
    ``postgres(dsn)`` or ``memory()``; :meth:`close` on leaving ``with``."""

    store: DocumentStore

    def __init__(self, store: DocumentStore) -> None:
        self.store = store

    @classmethod
    def memory(cls) -> Self:
        return cls(MemoryDocuments())

    @classmethod
    def sqlite(cls, path: str) -> Self:
        return cls(SqliteDocuments(path))

    @classmethod
    def postgres(cls, dsn: str, table: str = "tether_documents") -> Self:
        return cls(PostgresDocuments(dsn, table))

    def close(self) -> None:
        """Close the store's connection (SQLite, PostgreSQL)."""
        close = getattr(self.store, "close", None)
        if callable(close):
            close()

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Collection(OnDocuments):
    """A kind of record in a document store."""

    kind: DocKind


class Checkpoints(_Collection):
    """Where a run's state is saved on every stop, to resume it later."""

    kind = DocKind.CHECKPOINT

    def save(self, doc: dict[str, Any], created_at: float) -> str:
        checkpoint_id = f"ckpt_{os.urandom(16).hex()[:20]}"
        self.store.put(
            self.kind,
            checkpoint_id,
            {"format": CHECKPOINT_FORMAT, "id": checkpoint_id, **doc},
            created_at,
        )
        return checkpoint_id

    def load(self, checkpoint_id: str) -> dict[str, Any]:
        text = self.store.get(self.kind, checkpoint_id)
        if text is None:
            raise CheckpointError(f"no checkpoint {checkpoint_id!r} in this store")
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise CheckpointError(
                f"checkpoint {checkpoint_id!r} is corrupt (not JSON: {exc})"
            ) from exc
        if not isinstance(doc, dict) or doc.get("format") != CHECKPOINT_FORMAT:
            found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
            raise CheckpointError(
                f"checkpoint {checkpoint_id!r} is not a tether checkpoint (format {found!r}, "
                f"expected {CHECKPOINT_FORMAT!r})"
            )
        _check_shape(checkpoint_id, doc)
        return doc

    def list(self, limit: int = 50) -> list[dict[str, Any]]:
        return [json.loads(text) for _, text in self.store.list(self.kind, limit)]


_USAGE_INTS = (
    "steps",
    "model_calls",
    "tool_calls",
    "input_tokens",
    "output_tokens",
    "cache_write_tokens",
    "cache_read_tokens",
    "retries",
    "unpriced_calls",
)


def _check_shape(checkpoint_id: str, doc: dict[str, Any]) -> None:
    """Every field a resumed run reads, checked on load; the error names the field."""

    def corrupt(field: str, why: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {checkpoint_id!r} is corrupt: {field} {why}")

    for field in ("task", "usage", "partial", "transcript"):
        if field not in doc:
            raise corrupt(field, "is missing")
    if not isinstance(doc["task"], str):
        raise corrupt("task", f"must be a string, got {doc['task']!r:.60}")
    if doc.get("run_id") is not None and (
        not isinstance(doc["run_id"], str) or not _RUN_ID.fullmatch(doc["run_id"])
    ):
        raise corrupt("run_id", f"must be {RUN_ID_RULE}, got {doc['run_id']!r:.60}")
    for field in ("partial", "transcript"):
        value = doc[field]
        if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
            raise corrupt(field, f"must be a list of objects, got {value!r:.60}")
    effects = doc.get("effects")
    if effects is not None and not (
        isinstance(effects, list)
        and all(
            isinstance(e, list) and len(e) == 3 and isinstance(e[0], str) and isinstance(e[2], str)
            for e in effects
        )
    ):
        raise corrupt("effects", f"must be a list of [tool, arguments, key], got {effects!r:.60}")
    usage = doc["usage"]
    if not isinstance(usage, dict):
        raise corrupt("usage", f"must be an object, got {usage!r:.60}")
    unknown = set(usage) - {*_USAGE_INTS, "cost_usd", "seconds"}
    if unknown:
        raise corrupt("usage", f"has unknown fields {sorted(unknown)}")
    for name, value in usage.items():
        whole = name in _USAGE_INTS
        ok = isinstance(value, int) if whole else isinstance(value, int | float)
        if not ok or isinstance(value, bool) or value < 0 or value != value:
            kind = "an int" if whole else "a number"
            raise corrupt(f"usage.{name}", f"must be {kind} >= 0, got {value!r:.60}")


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A permanent failure parked for a person to fix and replay: one per intent (the same
    call asked again, with a fresh request id, joins it: ``asked`` counts the asks)."""

    id: str
    tool: str
    args: Any
    error_type: str
    error: str
    run_id: str
    task: str
    at: float
    replayed: bool = False
    #: the argument paths whose values were redacted before the letter was stored
    redacted: tuple[str, ...] = ()
    #: the intent's ledger key (tool, arguments, request): what a replay runs under
    key: str = ""
    #: how many times the call failed so (re-asks of the same intent join one letter)
    asked: int = 1
    last_at: float | None = None
    #: who replayed it (the operator page's "by"; "" before a replay, or from the CLI) and when
    replayed_by: str = ""
    replayed_at: float | None = None
    #: who holds its replay's claim, or held it last, and since when (written before the
    #: handler is called: a replay that finds the letter's replay in flight names them)
    replaying_by: str = ""
    replaying_at: float | None = None

    def to_doc(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tool": self.tool,
            "args": self.args,
            "error_type": self.error_type,
            "error": self.error,
            "run_id": self.run_id,
            "task": self.task,
            "at": self.at,
            "replayed": self.replayed,
            "redacted": list(self.redacted),
            "key": self.key,
            "asked": self.asked,
            "last_at": self.last_at,
            "replayed_by": self.replayed_by,
            "replayed_at": self.replayed_at,
            "replaying_by": self.replaying_by,
            "replaying_at": self.replaying_at,
        }

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> DeadLetter:
        known = {k: v for k, v in doc.items() if k in _LETTER_FIELDS}  # a newer writer's too
        return cls(**{**known, "redacted": tuple(doc.get("redacted") or ())})


_LETTER_FIELDS = frozenset(DeadLetter.__dataclass_fields__)


class RedactedArguments(TetherError, ValueError):
    """A dead letter's arguments were redacted and the handler cannot fill them in."""

    def __init__(self, letter: DeadLetter) -> None:
        self.paths = list(letter.redacted)
        super().__init__(
            f"dead letter {letter.id} was stored with these arguments redacted: "
            f"{', '.join(self.paths)}. Give a handler that takes a `redacted` keyword (the list "
            "of those paths) and fills their values itself, e.g. from your secret store"
        )


def _takes_keyword(fn: Callable[..., Any], name: str) -> bool:
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)


class ReplayOptions(TypedDict, total=False):
    """How :meth:`DeadLetters.replay` replays a letter (each optional)."""

    force: bool  # run the handler again whatever happened before (False)
    ledger: Ledger | None  # the ledger to go through (one beside the letters)
    lookup: Callable[[str], Any] | None  # asked when an earlier outcome is unknown
    by: str  # who replays it, kept on the letter ("")


@dataclass(frozen=True, slots=True)
class Replayed:
    """What a replay did: the handler's result (or the one recorded before), whether this
    replay called the handler, the letter after it, and whether it marked the letter for an
    earlier replay whose handler ran but whose mark was not written (``repaired``)."""

    result: Any
    ran: bool
    letter: DeadLetter
    repaired: bool = False


class DeadLetters(_Collection):
    """Permanent failures, with their (redacted) inputs, for a person to fix and replay."""

    kind = DocKind.DEAD_LETTER

    def __init__(self, store: DocumentStore, *, redact_pattern: str | None = None) -> None:
        super().__init__(store)
        self.extra = re.compile(redact_pattern) if redact_pattern else None
        self._ledger: Ledger | None = None

    def park(
        self,
        *,
        tool: str,
        args: Any,
        error: BaseException,
        run_id: str,
        task: str,
        at: float,
        key: str = "",
    ) -> DeadLetter:
        """File a permanent failure. ``key`` is the call's intent (its ledger key): a call
        of the same intent parked again joins its letter (``asked`` grows, the newest error
        is kept) instead of filing another one that a person could replay again."""
        error_text = redact(str(error), extra=self.extra)
        letter_id = (
            f"dl_{hashlib.sha256(key.encode()).hexdigest()[:20]}"
            if key
            else f"dl_{os.urandom(16).hex()[:20]}"
        )
        if key:
            found = self.store.get(self.kind, letter_id)
            if found is not None:
                old = DeadLetter.from_doc(json.loads(found))
                joined = replace(
                    old,
                    asked=old.asked + 1,
                    last_at=at,
                    error_type=type(error).__name__,
                    error=error_text,
                )
                self.store.put(self.kind, letter_id, joined.to_doc(), old.at)
                return joined
        stored = redact(args, extra=self.extra)
        letter = DeadLetter(
            id=letter_id,
            tool=tool,
            args=stored,
            error_type=type(error).__name__,
            error=error_text,
            run_id=run_id,
            task=redact(task, extra=self.extra),
            at=at,
            redacted=tuple(redacted_paths(stored)),
            key=key,
        )
        self.store.put(self.kind, letter.id, letter.to_doc(), at)
        return letter

    def get(self, letter_id: str) -> DeadLetter:
        text = self.store.get(self.kind, letter_id)
        if text is None:
            raise KeyError(f"no dead letter {letter_id!r}")
        return DeadLetter.from_doc(json.loads(text))

    def list(self, limit: int = 50) -> list[DeadLetter]:
        return [
            DeadLetter.from_doc(json.loads(text)) for _, text in self.store.list(self.kind, limit)
        ]

    def replay(
        self,
        letter_id: str,
        handler: Callable[..., Any],
        *,
        force: bool = False,
        ledger: Ledger | None = None,
        lookup: Callable[[str], Any] | None = None,
        by: str = "",
    ) -> Any:
        """Call ``handler(**args)`` (or ``handler(args)``) at most once per intent.

        The call goes through a ledger under the letter's intent (by default a ledger
        beside the letters: the same SQLite file or PostgreSQL database), so replaying a
        letter twice, from two terminals, after a crash, or another letter of the same
        intent, runs the handler once; a later replay returns the first one's result.
        A replay whose handler raised is remembered as failed, and the next replay (once
        the handler is fixed) calls it again; one whose outcome is unknown (a timeout) goes
        through ``lookup(key)`` (your records: the result if it happened, else None), and
        without one raises :class:`tether.UnknownOutcome`. ``force=True`` runs the handler
        again whatever happened before; ``by`` names who replays it (kept on the letter; ""
        by default); ``ledger`` is the ledger to go through.

        A letter stores its arguments redacted. When some were, the handler must take a
        ``redacted`` keyword (the list of redacted paths, e.g. ``["args.api_key"]``) and
        fill those values itself (from your secret store); a handler without it is
        refused with :class:`RedactedArguments` before it is called.

        A replay that does not call the handler (the letter was replayed before: its
        recorded result is returned) leaves the letter as it was: who replayed it and when
        stay those of the replay that ran, even when the two replays raced. Where the
        replay that ran could not mark the letter (its write failed after the handler
        returned), the next replay marks it in that replay's name.
        """
        return self._replay(
            letter_id, handler, force=force, ledger=ledger, lookup=lookup, by=by
        ).result

    def _replay(
        self, letter_id: str, handler: Callable[..., Any], **options: Unpack[ReplayOptions]
    ) -> Replayed:
        """:meth:`replay`, and what it did to the letter."""
        from tether.clock import system_clock

        force, lookup = options.get("force", False), options.get("lookup")
        letter = self.get(letter_id)
        extra: dict[str, Any] = {}
        if letter.redacted:
            if not _takes_keyword(handler, "redacted"):
                raise RedactedArguments(letter)
            extra["redacted"] = list(letter.redacted)
        ledger = options.get("ledger") or self._replay_ledger()
        base = f"dead-letter:{letter.key or letter.id}"
        key = f"{base}:forced:{os.urandom(16).hex()}" if force else _next_replay(ledger, base)
        # who replays it (``by``: the operator page's name; "" from code)
        by = options.get("by", "").strip()[:100]
        ran: list[bool] = []
        unmarked: list[Exception] = []

        def call() -> Any:
            # Both marks are written while this replay holds the ledger's claim, so a replay
            # that loses the race reads them: the first names who is replaying it, the
            # second (before the ledger records the result) who replayed it.
            self._mark(letter.id, replaying_by=by, replaying_at=system_clock.wall())
            ran.append(True)
            by_name = isinstance(letter.args, dict)
            result = handler(**letter.args, **extra) if by_name else handler(letter.args, **extra)
            try:
                self._mark(
                    letter.id, replayed=True, replayed_by=by, replayed_at=system_clock.wall()
                )
            except Exception as exc:  # the handler ran: the ledger must record its result
                unmarked.append(exc)
            return result

        result = ledger.once(key, call, lookup=lookup)
        if unmarked:
            raise unmarked[0]
        if ran:
            return Replayed(result, ran=True, letter=self.get(letter.id))
        now = self.get(letter.id)
        if now.replayed:  # a recorded result: the letter stays as the replay that ran left it
            return Replayed(result, ran=False, letter=now)
        # The handler ran in an earlier replay (the ledger has its result) that could not mark
        # the letter: it is marked now, in that replay's name (the last to hold the claim).
        marked = self._mark(
            letter.id,
            replayed=True,
            replayed_by=now.replaying_by or by,
            replayed_at=now.replaying_at or system_clock.wall(),
        )
        return Replayed(result, ran=False, letter=marked, repaired=True)

    def _mark(self, letter_id: str, **changes: Any) -> DeadLetter:
        """The letter as it is now (a park may have joined it), with ``changes``, stored."""
        now = self.get(letter_id)
        marked = replace(now, **changes)
        self.store.put(self.kind, now.id, marked.to_doc(), now.at)
        return marked

    def last_replay(self, letter_id: str) -> dict[str, Any] | None:
        """The letter's latest replay, as its ledger records it: ``{"state": "done",
        "result": ...}`` (or ``"failed"`` with the ``error``, or ``"pending"``/``"unknown"``);
        None before any replay (what the operator page shows)."""
        letter = self.get(letter_id)
        ledger = self._replay_ledger()
        base = f"dead-letter:{letter.key or letter.id}"
        found: dict[str, Any] | None = None
        n = 0
        while True:
            key = base if n == 0 else f"{base}:again:{n}"
            record = ledger.get(key)
            if record is None:
                return found
            state = record.state.value
            found = {"state": state, "at": record.created_at}
            if state == "done":
                found["result"] = redact(ledger.result(key))
            elif record.error:
                found["error"] = redact(json.loads(record.error).get("message", ""))
            n += 1

    def _replay_ledger(self) -> Ledger:
        from tether.effects._ledger import Ledger

        if self._ledger is None:
            if isinstance(self.store, SqliteDocuments) and self.store.path != ":memory:":
                self._ledger = Ledger.sqlite(self.store.path, ttl=REPLAY_TTL)
            elif isinstance(self.store, PostgresDocuments):
                self._ledger = Ledger.postgres(
                    self.store.dsn, table="tether_replays", ttl=REPLAY_TTL
                )
            else:
                self._ledger = Ledger.memory(ttl=REPLAY_TTL)
        return self._ledger

    def close(self) -> None:
        if self._ledger is not None:
            self._ledger.close()
        super().close()


def _next_replay(ledger: Ledger, base: str) -> str:
    """The ledger key of a letter's next replay: the first attempt that did not fail (one
    that succeeded replays its result; one in flight or unknown is reconciled, never run
    beside it); a failed attempt leaves the next one free to call the fixed handler."""
    from tether.effects._ledger import State

    n = 0
    while True:
        key = base if n == 0 else f"{base}:again:{n}"
        record = ledger.get(key)
        if record is None or record.state is not State.FAILED:
            return key
        n += 1


class Handoffs(_Collection):
    """A table of handoff records (a sink for :class:`tether.Escalation`), each with its
    case state: ``open`` -> ``claimed`` (by a person) -> ``resolved`` (with a note)."""

    kind = DocKind.HANDOFF

    def __call__(self, record: Any) -> None:
        doc = record.to_doc()
        doc.setdefault("state", CaseState.OPEN)
        self.store.put(self.kind, doc["id"], doc, doc["at"])

    def get(self, handoff_id: str) -> dict[str, Any]:
        text = self.store.get(self.kind, handoff_id)
        if text is None:
            raise KeyError(f"no handoff {handoff_id!r}")
        doc: dict[str, Any] = json.loads(text)
        doc.setdefault("state", CaseState.OPEN)
        return doc

    def list(self, limit: int = 50) -> list[dict[str, Any]]:
        """Open cases first (then claimed, then resolved), newest first in each."""
        docs = [json.loads(text) for _, text in self.store.list(self.kind, limit)]
        for doc in docs:
            doc.setdefault("state", CaseState.OPEN)
        return sorted(
            docs, key=lambda d: (_CASE_ORDER.get(d["state"], 3), -float(d.get("at") or 0))
        )

    def claim(self, handoff_id: str, *, by: str, at: float) -> dict[str, Any]:
        """A person takes the case (a resolved case cannot be claimed again)."""
        doc = self.get(handoff_id)
        if doc["state"] == CaseState.RESOLVED:
            raise ValueError(f"handoff {handoff_id} is resolved already")
        doc.update(state=CaseState.CLAIMED, claimed_by=_who(by), claimed_at=at)
        self.store.put(self.kind, handoff_id, doc, float(doc["at"]))
        return doc

    def resolve(
        self, handoff_id: str, *, by: str, note: str, at: float, dead_letter: str | None = None
    ) -> dict[str, Any]:
        """The case is closed, with what was done (the note is redacted); ``dead_letter``:
        the letter whose successful replay closed it (the page links the two)."""
        doc = self.get(handoff_id)
        if doc["state"] == CaseState.RESOLVED:
            raise ValueError(f"handoff {handoff_id} is resolved already")
        doc.update(
            state=CaseState.RESOLVED, resolved_by=_who(by), resolved_at=at, resolution=redact(note)
        )
        if dead_letter is not None:
            doc["dead_letter"] = dead_letter
        self.store.put(self.kind, handoff_id, doc, float(doc["at"]))
        return doc


def _who(by: str) -> str:
    if not isinstance(by, str) or not by.strip():
        raise ValueError("by must name who acts (a non-empty string)")
    return by.strip()[:100]
