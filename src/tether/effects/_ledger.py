"""At-most-once side effects: the ledger.

A record goes through these states (the race diagrams are below)::

    (absent) --claim--> PENDING --fn returns--------------> DONE     (result replayed)
                           |----permanent failure---------> FAILED   (error replayed)
                           |----nothing happened (refused)-> (absent)
                           |----outcome unknown (timeout)--> UNKNOWN
                           '----lease expires (crash)------> treated as UNKNOWN
    UNKNOWN --claim (takeover, once no lease is live)--> PENDING
                                          --lookup(key) says done----> DONE
                                          --lookup says not done----> fn runs
                                          --no lookup / cannot tell-> UNKNOWN, raise

The worker that holds a claim renews its lease while the effect runs (a heartbeat
thread, every third of the lease), so an effect longer than its lease keeps its claim;
a takeover happens only once the owner stopped renewing (it crashed). An attempt
abandoned after ``timeout`` keeps renewing until it really ends, and records what it
did; until then its record is UNKNOWN and nobody can take it over. The owner token is
also a fence: a worker that lost its claim cannot record anything over the new owner's
record (:class:`tether.EffectNotRecorded` tells it so).

A record lives ``ttl`` seconds past its lease while it is live, and ``ttl`` seconds past
the moment it was settled: never ``ttl`` after the claim.

Cancelling :meth:`Ledger.aonce` never cuts a store step in half: a step already sent
to the store is waited for, then a claim whose effect never started is released (and
a takeover's record is left UNKNOWN again), so nothing blocks the next call; an
effect cancelled while it ran is recorded UNKNOWN.

Two workers racing one key: both ``claim``; the backend lets exactly one insert (a
primary key, ``SET NX`` semantics inside a Lua script, ``INSERT ... ON CONFLICT``); the
other sees PENDING and waits (``wait=``) or gets :class:`tether.EffectInProgress`.

A worker killed between claim and record: its PENDING record outlives its lease; the
next worker takes it over as UNKNOWN and asks ``lookup`` (the provider's records)
before anything runs again. Without ``lookup`` it raises :class:`tether.UnknownOutcome`:
tether never re-executes an effect blindly.

Backends implement only the atomic primitives of :class:`LedgerBackend`; every
decision above lives in the plan that :meth:`Ledger.once` and :meth:`Ledger.aonce` both
run (:mod:`tether.effects._once`) and the recorder's settlements
(:mod:`tether.effects._recorder`), so the two forms cannot drift.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tether import _digest
from tether._sansio import Plan, adrive, drive
from tether.clock import Clock, system_clock
from tether.effects._canonical import canonical_json
from tether.effects._codec import Codec, JsonCodec
from tether.effects._once import aexecute, check_call, claim_at_once, claim_plan, execute
from tether.effects._recorder import NOT_FOUND, EffectFailed, Recorder, current_key
from tether.stores._ledger_logic import LedgerBackend, Record, State

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


def current_idempotency_key() -> str | None:
    """The intent key of the effect running now, to send upstream as its idempotency key."""
    return current_key.get()


def _payload_hash(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    try:
        # the request ids of each argument (at its top level) are not the intent
        text = f"[[{','.join(canonical_json(a) for a in args)}],{canonical_json(kwargs)}]"
    except (TypeError, ValueError):
        return None  # arguments that are objects (clients, sessions): no payload check
    return _digest.sha256(text.encode("ascii")).hexdigest()


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
        lease: float = 60.0,
        wait: float = 0.0,
        poll_interval: float = 0.05,
        codec: Codec | None = None,
        clock: Clock | None = None,
    ) -> None:
        for name, value in (("ttl", ttl), ("lease", lease), ("poll_interval", poll_interval)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name} must be a number > 0, got {value!r}")
        if isinstance(wait, bool) or not isinstance(wait, int | float) or wait < 0:
            raise ValueError(f"wait must be a number >= 0, got {wait!r}")
        # any ttl works with any lease: a record lives ttl past its lease, and ttl past the
        # moment it was settled (see the module docstring)
        self.backend = backend
        self.ttl = float(ttl)
        self.lease = float(lease)
        self.wait = float(wait)
        self.poll_interval = float(poll_interval)
        self.codec: Codec = codec or JsonCodec()
        self.clock: Clock = clock or system_clock
        self._records = Recorder(self)

    def __repr__(self) -> str:
        return f"Ledger({self.backend!r})"

    # --- constructors ---------------------------------------------------------------

    @classmethod
    def memory(cls, **settings: Any) -> Ledger:
        """A ledger in this process's memory: it does not survive a restart (use
        :meth:`sqlite`, :meth:`redis` or :meth:`postgres` for that)."""
        from tether.stores._ledger_memory import MemoryLedgerBackend

        return cls(MemoryLedgerBackend(), **settings)

    @classmethod
    def sqlite(cls, path: str, **settings: Any) -> Ledger:
        """A ledger in a SQLite file (WAL): durable, safe for processes on one machine."""
        from tether.stores._ledger_sqlite import SqliteLedgerBackend

        return cls(SqliteLedgerBackend(path), **settings)

    @classmethod
    def redis(
        cls,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        client: Any = None,
        prefix: str = "tether",
        assume_durable: bool = False,
        allow_lost_records: bool = False,
        **settings: Any,
    ) -> Ledger:
        """A ledger in Redis, shared by a fleet (``pip install 'tether[redis]'``).

        The server must persist its writes (``appendonly yes``): it is checked here.
        Where ``CONFIG`` is not allowed, ``assume_durable=True`` says you know it does;
        ``allow_lost_records=True`` accepts a server that does not, and with it the risk
        that a restart forgets a claim and an effect runs twice. ``client`` takes a
        ready ``redis.Redis`` (or cluster) client instead of ``url``.
        """
        from tether.stores.redis._ledger import RedisLedgerBackend

        backend = RedisLedgerBackend(
            url,
            client=client,
            prefix=prefix,
            assume_durable=assume_durable,
            allow_lost_records=allow_lost_records,
        )
        return cls(backend, **settings)

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

    # --- the two entry points: one plan, two drivers --------------------------------

    def once(
        self,
        key: str,
        fn: Callable[..., T],
        *args: Any,
        lookup: Callable[[str], Any] | None = None,
        lease: float = 60.0,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> T:
        """Run ``fn(*args, **kwargs)`` at most once for ``key``; replay its outcome after.

        ``lookup(key)`` is asked only when an earlier attempt's outcome is unknown: it
        returns the effect's result if it did happen (recorded and returned), or None
        if it did not (then ``fn`` runs). ``lease`` is how long
        the claim lives without renewal; it is renewed while ``fn`` runs. ``timeout``
        bounds the call: past it the call is abandoned (it keeps its claim until it
        really ends) and :class:`tether.UnknownOutcome` is raised.
        """
        lease = check_call(key, lease, timeout)
        if self.wait:  # it may wait for another worker's claim: the plan, with its sleeps
            plan = self._claim_plan(key, lease, lookup, args, kwargs)
            owner, found = drive(plan, self.clock)
        else:
            payload = _payload_hash(args, kwargs) if args or kwargs else None
            owner, found = claim_at_once(self._records, key, payload, lease, lookup)
        if found is not NOT_FOUND:
            return found  # type: ignore[no-any-return]
        return execute(self._records, key, owner, lease, timeout, fn, args, kwargs)

    async def aonce(
        self,
        key: str,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        lookup: Callable[[str], Any] | None = None,
        lease: float = 60.0,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> T:
        """The async form of :meth:`once`: ``fn`` is a coroutine function, awaited here.

        A timed-out or cancelled attempt is cancelled and its record becomes unknown
        (the effect may have been sent), never failed. Cancelled before ``fn`` started,
        the claim is given back: nothing waits for its lease.
        """
        lease = check_call(key, lease, timeout)
        plan = self._claim_plan(key, lease, lookup, args, kwargs)
        owner, found = await adrive(plan, self.clock)
        if found is not NOT_FOUND:
            return found  # type: ignore[no-any-return]
        call = lambda: fn(*args, **kwargs)  # noqa: E731
        return await aexecute(self._records, key, owner, lease, timeout, call)

    def _claim_plan(
        self,
        key: str,
        lease: float,
        lookup: Callable[[str], Any] | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Plan[tuple[str, Any]]:
        payload = _payload_hash(args, kwargs) if args or kwargs else None
        return claim_plan(self._records, self.wait, self.poll_interval, key, payload, lease, lookup)

    # --- for people -------------------------------------------------------------------

    def get(self, key: str) -> Record | None:
        """The record of ``key``, or None."""
        return self.backend.get(key)

    def result(self, key: str) -> Any:
        """The recorded result of a DONE effect (None otherwise)."""
        record = self.backend.get(key)
        return self._records.replay(record) if record and record.state is State.DONE else None

    def resolve(self, key: str, result: Any) -> None:
        """Settle an effect by hand: it happened, with ``result``."""
        owner = os.urandom(16).hex()
        self.backend.forget(key)
        self.backend.claim(Record.claim_of(key, None, owner, 60.0, self.ttl), self._records.now())
        self._records.record_done(key, owner, result)

    def forget(self, key: str) -> None:
        """Delete a record: the effect did not happen and may run again."""
        self.backend.forget(key)

    def records(self, state: State | None = None, limit: int = 100) -> list[Record]:
        return self.backend.records(state, limit)
