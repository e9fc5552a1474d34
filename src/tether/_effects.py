"""At-most-once side effects: the ledger.

A record goes through these states (the race diagrams are below)::

    (absent) --claim--> PENDING --fn returns--------------> DONE     (result replayed)
                           |----permanent failure---------> FAILED   (error replayed)
                           |----nothing happened (refused)-> (absent)
                           |----outcome unknown (timeout)--> UNKNOWN
                           '----lease expires (crash)------> treated as UNKNOWN
    UNKNOWN --claim (takeover)--> PENDING --lookup(key) says done----> DONE
                                          --lookup says not done----> fn runs
                                          --no lookup / cannot tell-> UNKNOWN, raise

Two workers racing one key: both ``claim``; the backend lets exactly one insert (a
primary key, ``SET NX`` semantics inside a Lua script, ``INSERT ... ON CONFLICT``); the
other sees PENDING and waits (``wait=``) or gets :class:`tether.EffectInProgress`.

A worker killed between claim and record: its PENDING record outlives its lease; the
next worker takes it over as UNKNOWN and asks ``lookup`` (the provider's records)
before anything runs again. Without ``lookup`` it raises :class:`tether.UnknownOutcome`:
tether never re-executes an effect blindly.

Backends implement only the atomic primitives of :class:`LedgerBackend`; every
decision above lives in :class:`Ledger`.
"""

from __future__ import annotations

import builtins
import contextvars
import enum
import hashlib
import json
import logging
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from tether._canonical import _tag, canonical_json
from tether._classify import Kind, classify
from tether._errors import EffectInProgress, IdempotencyConflict, TetherError, UnknownOutcome
from tether.clock import Clock, system_clock

__all__ = [
    "EffectFailed",
    "JsonCodec",
    "Ledger",
    "LedgerBackend",
    "Record",
    "State",
    "current_idempotency_key",
]

T = TypeVar("T")
_log = logging.getLogger("tether")
_current_key: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tether_idempotency_key", default=None
)


def current_idempotency_key() -> str | None:
    """The intent key of the effect running now, to send upstream as its idempotency key."""
    return _current_key.get()


class State(enum.Enum):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Record:
    """One effect's entry in the ledger."""

    key: str
    state: State
    payload_hash: str | None
    owner: str
    lease_until: float
    expires_at: float
    created_at: float
    result: str | None = None  # the codec's text
    error: str | None = None  # JSON: {"type", "module", "message"}
    detail: str = ""
    attempts: int = 1

    def to_row(self) -> dict[str, Any]:
        return {
            "key": self.key, "state": self.state.value, "payload_hash": self.payload_hash,
            "owner": self.owner, "lease_until": self.lease_until, "expires_at": self.expires_at,
            "created_at": self.created_at, "result": self.result, "error": self.error,
            "detail": self.detail, "attempts": self.attempts,
        }  # fmt: skip

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Record:
        return cls(
            key=str(row["key"]),
            state=State(row["state"]),
            payload_hash=row.get("payload_hash") or None,
            owner=str(row.get("owner") or ""),
            lease_until=float(row.get("lease_until") or 0.0),
            expires_at=float(row.get("expires_at") or 0.0),
            created_at=float(row.get("created_at") or 0.0),
            result=row.get("result"),
            error=row.get("error"),
            detail=str(row.get("detail") or ""),
            attempts=int(row.get("attempts") or 1),
        )


def decide_claim(existing: Record | None, new: Record, now: float) -> tuple[bool, Record | None]:
    """The claim rule every backend applies atomically.

    Returns (claimed, record): claimed with ``None`` for a fresh effect, claimed with
    the previous record for a takeover (UNKNOWN, or PENDING past its lease: reconcile
    first), or not claimed with the current record.
    """
    if existing is None or existing.expires_at <= now:
        return True, None
    reclaimable = existing.state is State.UNKNOWN or (
        existing.state is State.PENDING and existing.lease_until <= now
    )
    if reclaimable and (existing.payload_hash in (None, new.payload_hash) or not new.payload_hash):
        return True, existing
    return False, existing


class LedgerBackend(Protocol):
    """The atomic primitives a ledger store provides."""

    def claim(self, record: Record, now: float) -> tuple[bool, Record | None]:
        """Insert ``record`` (PENDING) or take over a reclaimable one, per :func:`decide_claim`."""
        ...

    def get(self, key: str) -> Record | None: ...

    def complete(self, key: str, owner: str, state: State, result: str | None,
                 error: str | None, now: float) -> None:  # fmt: skip
        """Set DONE or FAILED unless the record is already DONE or FAILED."""
        ...

    def mark_unknown(self, key: str, owner: str, detail: str) -> None:
        """PENDING -> UNKNOWN, if ``owner`` still holds the claim."""
        ...

    def release(self, key: str, owner: str) -> None:
        """Delete a PENDING record held by ``owner`` (nothing happened)."""
        ...

    def forget(self, key: str) -> None:
        """Delete a record whatever its state."""
        ...

    def records(self, state: State | None = None, limit: int = 100) -> list[Record]: ...

    def close(self) -> None: ...


class JsonCodec:
    """Results stored as JSON; types JSON lacks are tagged as in intent keys."""

    def encode(self, value: Any) -> str:
        return json.dumps(value, default=_tag, sort_keys=True, allow_nan=False)

    def decode(self, text: str) -> Any:
        return json.loads(text)


class Codec(Protocol):
    def encode(self, value: Any) -> str: ...
    def decode(self, text: str) -> Any: ...


class EffectFailed(TetherError):
    """The replay of a recorded permanent failure whose type could not be rebuilt."""

    def __init__(self, type_name: str, message: str) -> None:
        self.type_name = type_name
        super().__init__(f"{type_name}: {message} (recorded failure of an earlier attempt)")


def _encode_error(exc: BaseException) -> str:
    return json.dumps(
        {"type": type(exc).__name__, "module": type(exc).__module__, "message": str(exc)}
    )


def _payload_hash(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    if not args and not kwargs:
        return None
    try:
        text = canonical_json([list(args), kwargs])  # the volatile fields are not the intent
    except (TypeError, ValueError):
        return None  # arguments that are objects (clients, sessions): no payload check
    return hashlib.sha256(text.encode("ascii")).hexdigest()


class Ledger:
    """Run each effect at most once, across retries, re-issues and processes.

    >>> ledger = Ledger.memory()
    >>> paid = []
    >>> def refund(order, amount):
    ...     paid.append(order)
    ...     return {"refund": "re_1", "amount": amount}
    >>> key = tether.intent_key("refund", {"order": "A-1", "amount": 10})
    >>> ledger.once(key, refund, "A-1", 10), ledger.once(key, refund, "A-1", 10)
    ({'refund': 're_1', 'amount': 10}, {'refund': 're_1', 'amount': 10})
    >>> paid
    ['A-1']
    """

    def __init__(
        self,
        backend: LedgerBackend,
        *,
        ttl: float = 86_400.0,
        wait: float = 0.0,
        poll_interval: float = 0.05,
        codec: Codec | None = None,
        clock: Clock | None = None,
    ) -> None:
        if ttl <= 0:
            raise ValueError(f"ttl must be > 0, got {ttl!r}")
        if wait < 0:
            raise ValueError(f"wait must be >= 0, got {wait!r}")
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0, got {poll_interval!r}")
        self.backend = backend
        self.ttl = float(ttl)
        self.wait = float(wait)
        self.poll_interval = float(poll_interval)
        self.codec: Codec = codec or JsonCodec()
        self.clock: Clock = clock or system_clock
        self._errors: OrderedDict[str, BaseException] = OrderedDict()

    # --- constructors ---------------------------------------------------------------

    @classmethod
    def memory(cls, **settings: Any) -> Ledger:
        """A ledger in this process's memory (tests, single-process agents)."""
        from tether.stores._ledger_memory import MemoryLedgerBackend

        return cls(MemoryLedgerBackend(), **settings)

    @classmethod
    def sqlite(cls, path: str, **settings: Any) -> Ledger:
        """A ledger in a SQLite file (WAL): durable, safe for processes on one machine."""
        from tether.stores._ledger_sqlite import SqliteLedgerBackend

        return cls(SqliteLedgerBackend(path), **settings)

    @classmethod
    def redis(cls, url: str = "redis://127.0.0.1:6379/0", **settings: Any) -> Ledger:
        """A ledger in Redis, shared by a fleet (``pip install 'tether[redis]'``)."""
        from tether.stores._ledger_redis import RedisLedgerBackend

        prefix = settings.pop("prefix", "tether")
        return cls(RedisLedgerBackend(url, prefix=prefix), **settings)

    @classmethod
    def postgres(cls, dsn: str, **settings: Any) -> Ledger:
        """A ledger in PostgreSQL, shared by a fleet (``pip install 'tether[postgres]'``)."""
        from tether.stores._ledger_postgres import PostgresLedgerBackend

        table = settings.pop("table", "tether_ledger")
        return cls(PostgresLedgerBackend(dsn, table=table), **settings)

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the one entry point --------------------------------------------------------

    def once(
        self,
        key: str,
        fn: Callable[..., T],
        *args: Any,
        lookup: Callable[[str], Any] | None = None,
        lease: float = 60.0,
        **kwargs: Any,
    ) -> T:
        """Run ``fn(*args, **kwargs)`` at most once for ``key``; replay its outcome after.

        ``lookup(key)`` is asked only when an earlier attempt's outcome is unknown: it
        returns the effect's result if it did happen (recorded and returned), or None
        if it did not (then ``fn`` runs).
        """
        if not key:
            raise ValueError("key must be a non-empty string")
        if lease <= 0:
            raise ValueError(f"lease must be > 0, got {lease!r}")
        payload = _payload_hash(args, kwargs)
        deadline = self.clock.now() + self.wait
        while True:
            now = self.clock.wall()
            owner = uuid.uuid4().hex
            new = Record(key, State.PENDING, payload, owner, now + lease, now + self.ttl, now)
            claimed, record = self.backend.claim(new, now)
            if claimed:
                break
            assert record is not None
            if payload and record.payload_hash and record.payload_hash != payload:
                raise IdempotencyConflict(
                    f"intent key {key[:16]}… was used before with different arguments; "
                    "an idempotency key names one request: derive it with tether.intent_key"
                )
            if record.state is State.DONE:
                return self._replay(record)  # type: ignore[no-any-return]
            if record.state is State.FAILED:
                raise self._replay_error(record)
            if record.state is State.UNKNOWN:  # a payload mismatch kept it from us
                raise UnknownOutcome(key, record.detail)
            if self.clock.now() >= deadline:
                raise EffectInProgress(key, record.lease_until)
            self.clock.sleep(min(self.poll_interval, max(0.0, deadline - self.clock.now())))
        if record is not None:  # a takeover: the earlier attempt may have happened
            found = self._reconcile(key, owner, record, lookup)
            if found is not _NOT_FOUND:
                return found  # type: ignore[no-any-return]
        return self._execute(key, owner, fn, args, kwargs)

    def _reconcile(
        self, key: str, owner: str, previous: Record, lookup: Callable[[str], Any] | None
    ) -> Any:
        why = previous.detail or (
            "a worker's claim expired before it recorded an outcome"
            if previous.state is State.PENDING
            else "an earlier attempt's outcome is unknown"
        )
        if lookup is None:
            self.backend.mark_unknown(key, owner, why)
            raise UnknownOutcome(key, why)
        try:
            found = lookup(key)
        except Exception as exc:
            self.backend.mark_unknown(key, owner, f"{why}; lookup failed: {exc}")
            raise UnknownOutcome(key, f"lookup failed: {type(exc).__name__}: {exc}") from exc
        if found is None:
            _log.info("effect %s…: lookup says it did not happen; running it", key[:16])
            return _NOT_FOUND
        _log.info("effect %s…: lookup found it done; recording, not repeating", key[:16])
        self.backend.complete(key, owner, State.DONE, self._encode(found), None, self.clock.wall())
        return found

    def _execute(self, key: str, owner: str, fn: Callable[..., T], args: Any, kwargs: Any) -> T:
        token = _current_key.set(key)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self._record_failure(key, owner, exc)
            raise
        finally:
            _current_key.reset(token)
        self.backend.complete(key, owner, State.DONE, self._encode(result), None, self.clock.wall())
        return result

    def _record_failure(self, key: str, owner: str, exc: BaseException) -> None:
        if not isinstance(exc, Exception):  # cancelled mid-effect: nobody knows
            self.backend.mark_unknown(key, owner, f"interrupted by {type(exc).__name__}")
            return
        verdict = classify(exc)
        if verdict.kind is Kind.PERMANENT and not verdict.outcome_unknown:
            self._remember_error(key, exc)
            self.backend.complete(key, owner, State.FAILED, None, _encode_error(exc),
                                  self.clock.wall())  # fmt: skip
        elif verdict.outcome_unknown:
            self.backend.mark_unknown(key, owner, f"{type(exc).__name__}: {verdict.reason}")
        else:  # refused before sending, rate limited, quota: nothing happened
            self.backend.release(key, owner)

    def _encode(self, value: Any) -> str:
        try:
            return self.codec.encode(value)
        except (TypeError, ValueError) as exc:
            _log.warning(
                "effect result of type %s cannot be encoded (%s); its repr is recorded. "
                "Return JSON-able results or pass codec= to the Ledger",
                type(value).__name__,
                exc,
            )
            return self.codec.encode({"$repr": repr(value)[:2000]})

    def _replay(self, record: Record) -> Any:
        return None if record.result is None else self.codec.decode(record.result)

    def _remember_error(self, key: str, exc: BaseException) -> None:
        self._errors[key] = exc
        while len(self._errors) > 1024:
            self._errors.popitem(last=False)

    def _replay_error(self, record: Record) -> BaseException:
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

    # --- for people -------------------------------------------------------------------

    def get(self, key: str) -> Record | None:
        """The record of ``key``, or None."""
        return self.backend.get(key)

    def result(self, key: str) -> Any:
        """The recorded result of a DONE effect (None otherwise)."""
        record = self.backend.get(key)
        return self._replay(record) if record and record.state is State.DONE else None

    def resolve(self, key: str, result: Any) -> None:
        """Settle an effect by hand: it happened, with ``result``."""
        now = self.clock.wall()
        owner = uuid.uuid4().hex
        record = self.backend.get(key)
        base = record or Record(key, State.PENDING, None, owner, now, now + self.ttl, now)
        self.backend.forget(key)
        self.backend.claim(
            replace(base, state=State.PENDING, owner=owner, lease_until=now + 60), now
        )
        self.backend.complete(key, owner, State.DONE, self._encode(result), None, now)

    def forget(self, key: str) -> None:
        """Delete a record: the effect did not happen and may run again."""
        self.backend.forget(key)

    def records(self, state: State | None = None, limit: int = 100) -> list[Record]:
        return self.backend.records(state, limit)


class _Missing:
    def __repr__(self) -> str:
        return "NOT_FOUND"


_NOT_FOUND: Any = _Missing()
