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
decision above lives in :class:`Ledger`.
"""

from __future__ import annotations

import builtins
import contextvars
import hashlib
import json
import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tether._errors import (
    EffectInProgress,
    EffectNotRecorded,
    IdempotencyConflict,
    StoreUnavailable,
    TetherError,
    UnknownOutcome,
)
from tether.classification._classify import Kind, classify
from tether.clock import Clock, VirtualClock, system_clock
from tether.effects._canonical import canonical_json
from tether.effects._codec import Codec, JsonCodec
from tether.redaction._redact import redact_text
from tether.stores._ledger_logic import Completion, LedgerBackend, Record, State

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


class EffectFailed(TetherError):
    """The replay of a recorded permanent failure whose type could not be rebuilt."""

    def __init__(self, type_name: str, message: str) -> None:
        self.type_name = type_name
        super().__init__(f"{type_name}: {message} (recorded failure of an earlier attempt)")


def _encode_error(exc: BaseException) -> str:
    return json.dumps(
        {"type": type(exc).__name__, "module": type(exc).__module__,
         "message": redact_text(str(exc))[:2000]}
    )  # fmt: skip


def _payload_hash(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    if not args and not kwargs:
        return None
    try:
        # the request ids of each argument (at its top level) are not the intent
        text = f"[[{','.join(canonical_json(a) for a in args)}],{canonical_json(kwargs)}]"
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
        # a virtual clock drives leases itself (tests, the bench); any real clock defers to
        # the store's own clock, so that one fleet measures leases on one clock
        self._virtual = isinstance(self.clock, VirtualClock)
        self._heartbeat = None if self._virtual else _Heartbeat(backend, self.ttl)
        self._errors: OrderedDict[str, BaseException] = OrderedDict()

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

        backend = RedisLedgerBackend(url, client=client, prefix=prefix, assume_durable=assume_durable,
                                     allow_lost_records=allow_lost_records)  # fmt: skip
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

    # --- the one entry point --------------------------------------------------------

    def _now(self) -> float | None:
        return self.clock.wall() if self._virtual else None

    def _try_claim(
        self, key: str, payload: str | None, lease: float, last: bool
    ) -> tuple[str, Record | None, Any] | None:
        """One claim attempt: (owner, previous record of a takeover, a replay or _NOT_FOUND),
        or None while another worker holds the key (ask again, unless ``last``)."""
        owner = uuid.uuid4().hex
        try:
            claimed, record = self.backend.claim(
                Record.claim_of(key, payload, owner, lease, self.ttl), self._now()
            )
        except StoreUnavailable as exc:
            raise StoreUnavailable(
                f"{exc}; nothing was executed: retry when the ledger's store answers"
            ) from exc
        if claimed:
            return owner, record, _NOT_FOUND
        assert record is not None
        if payload and record.payload_hash and record.payload_hash != payload:
            raise IdempotencyConflict(
                f"intent key {key[:16]}… was used before with different arguments; "
                "an idempotency key names one request: derive it with tether.intent_key"
            )
        if record.state is State.DONE:
            return owner, None, self._replay(record)
        if record.state is State.FAILED:
            raise self._replay_error(record)
        if not last:
            return None
        if record.state is State.UNKNOWN:
            raise UnknownOutcome(key, record.detail or "an attempt may still be running")
        raise EffectInProgress(key, record.lease_until)

    def _claim(self, key: str, payload: str | None, lease: float) -> tuple[str, Record | None, Any]:
        """Claim ``key``, waiting up to ``wait`` seconds for another worker's claim to end."""
        deadline = self.clock.now() + self.wait
        while True:
            claimed = self._try_claim(key, payload, lease, self.clock.now() >= deadline)
            if claimed is not None:
                return claimed
            self.clock.sleep(min(self.poll_interval, max(0.0, deadline - self.clock.now())))

    async def _aclaim(
        self, key: str, payload: str | None, lease: float
    ) -> tuple[str, Record | None, Any]:
        """The async form of :meth:`_claim`: it waits on the event loop, not in a thread."""
        deadline = self.clock.now() + self.wait

        def unclaim(claimed: tuple[str, Record | None, Any] | None) -> None:
            if claimed is not None and claimed[2] is _NOT_FOUND:
                self._unclaim(key, claimed[0], claimed[1])

        while True:
            last = self.clock.now() >= deadline
            claimed = await self._off_loop(self._try_claim, key, payload, lease, last, undo=unclaim)
            if claimed is not None:
                return claimed
            await self.clock.asleep(min(self.poll_interval, max(0.0, deadline - self.clock.now())))

    def _unclaim(self, key: str, owner: str, previous: Record | None) -> None:
        """Give a claim back before its effect started (the caller was cancelled): delete
        a fresh one; leave a takeover's record UNKNOWN again, as it was."""
        try:
            if previous is None:
                self.backend.release(key, owner)
            else:
                self.backend.mark_unknown(key, owner, _why(previous), self._now(), self.ttl)
        except Exception as exc:  # the claim stays pending until its lease runs out
            _log.error("tether: effect %s…: its claim could not be given back: %s", key[:16], exc)

    def _check_call(self, key: str, lease: float, timeout: float | None) -> float:
        """The arguments :meth:`once` and :meth:`aonce` check alike; the lease, as a float."""
        if not key or not isinstance(key, str):
            raise ValueError("key must be a non-empty string")
        if isinstance(lease, bool) or not isinstance(lease, int | float) or not lease > 0:
            raise ValueError(f"lease must be > 0, got {lease!r}")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
        ):
            raise ValueError(f"timeout must be > 0 or None, got {timeout!r}")
        return float(lease)

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
        lease = self._check_call(key, lease, timeout)
        payload = _payload_hash(args, kwargs)
        owner, previous, replay = self._claim(key, payload, lease)
        if replay is not _NOT_FOUND:
            return replay  # type: ignore[no-any-return]
        if previous is not None:  # a takeover: the earlier attempt may have happened
            found = self._reconcile(key, owner, previous, lookup)
            if found is not _NOT_FOUND:
                return found  # type: ignore[no-any-return]
        return self._execute(key, owner, lease, timeout, lambda: fn(*args, **kwargs))

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
        lease = self._check_call(key, lease, timeout)
        payload = _payload_hash(args, kwargs)
        owner, previous, replay = await self._aclaim(key, payload, lease)
        if replay is not _NOT_FOUND:
            return replay  # type: ignore[no-any-return]
        if previous is not None:

            def give_back(found: Any) -> None:  # lookup said not done, and fn did not run
                if found is _NOT_FOUND:
                    self._unclaim(key, owner, None)

            found = await self._off_loop(
                self._reconcile,
                key,
                owner,
                previous,
                lookup,
                undo=give_back,
                skipped=lambda: self._unclaim(key, owner, previous),
            )
            if found is not _NOT_FOUND:
                return found  # type: ignore[no-any-return]
        if self._heartbeat is not None:
            self._heartbeat.add(key, owner, lease)
        token = _current_key.set(key)
        try:
            if timeout is None:
                result = await fn(*args, **kwargs)
            else:
                result = await self.clock.acall_with_timeout(timeout, lambda: fn(*args, **kwargs))
        except BaseException as exc:
            if isinstance(exc, TimeoutError) and timeout is not None:
                detail = f"cancelled after {timeout:g} s; it may have happened"
                await self._settle(self._mark_unknown, key, owner, detail)
                raise UnknownOutcome(key, detail) from exc
            if isinstance(exc, Exception):
                await self._settle(self._record_failure, key, owner, exc)
            else:  # cancelled (also at loop shutdown): record it unknown before leaving
                self._record_failure(key, owner, exc)
            raise
        finally:
            _current_key.reset(token)
            if self._heartbeat is not None:
                self._heartbeat.remove(key, owner)
        await self._settle(self._record_done, key, owner, result)
        return result

    async def _off_loop(
        self,
        fn: Callable[..., T],
        *args: Any,
        undo: Callable[[T], None] | None = None,
        skipped: Callable[[], object] | None = None,
    ) -> T:
        """A ledger step from async code: in a worker thread when the backend does I/O,
        directly when it is this process's memory (no thread hop on the success path).

        A cancellation never cuts the step in half: a step its thread began is waited for
        (one store round trip) and ``undo`` gets what it returned; a step its thread had
        not begun never runs, and ``skipped`` is called instead. Both run before the
        cancellation goes on, on the event loop's thread (rarely: only when cancelled).
        """
        if getattr(self.backend, "in_memory", False):
            return fn(*args)
        import asyncio  # imported when first used: `import tether` loads no asyncio

        step = _Step(fn, args)
        try:
            return await asyncio.to_thread(step)
        except asyncio.CancelledError:
            if not step.abandon():
                if skipped is not None:
                    try:
                        skipped()
                    except Exception:  # logged where it failed; the cancellation goes on
                        pass
            elif step.error is None and undo is not None:
                undo(step.result)
            raise

    async def _settle(self, fn: Callable[..., object], *args: Any) -> None:
        """A step that records an effect's outcome: a cancellation never leaves it unwritten
        (a step its thread had not begun runs here, before the cancellation goes on)."""
        await self._off_loop(fn, *args, skipped=lambda: fn(*args))

    def _reconcile(
        self, key: str, owner: str, previous: Record, lookup: Callable[[str], Any] | None
    ) -> Any:
        why = _why(previous)
        if lookup is None:
            self._mark_unknown(key, owner, why)
            raise UnknownOutcome(key, why)
        try:
            found = lookup(key)
        except Exception as exc:
            said = redact_text(str(exc))[:300]
            self._mark_unknown(key, owner, f"{why}; lookup failed: {type(exc).__name__}: {said}")
            raise UnknownOutcome(key, f"lookup failed: {type(exc).__name__}: {said}") from exc
        if found is None:
            _log.info("effect %s…: lookup says it did not happen; running it", key[:16])
            return _NOT_FOUND
        _log.info("effect %s…: lookup found it done; recording, not repeating", key[:16])
        self._record_done(key, owner, found)
        return found

    def _execute(
        self, key: str, owner: str, lease: float, timeout: float | None, fn: Callable[[], T]
    ) -> T:
        ended = threading.Event()
        if self._heartbeat is not None:
            self._heartbeat.add(key, owner, lease)

        def body() -> T:
            token = _current_key.set(key)
            try:
                try:
                    result = fn()
                except BaseException as exc:
                    self._record_failure(key, owner, exc)
                    raise
                finally:
                    _current_key.reset(token)
                self._record_done(key, owner, result)
                return result
            finally:
                ended.set()
                if self._heartbeat is not None:
                    self._heartbeat.remove(key, owner)

        if timeout is None:
            return body()
        try:
            return self.clock.call_with_timeout(timeout, body)
        except TimeoutError as exc:
            if ended.is_set():
                raise  # the effect's own timeout, already recorded
            # abandoned: it keeps its claim (the heartbeat renews it) until it really ends
            detail = f"did not return within {timeout:g} s and may still be running"
            self._mark_unknown(key, owner, detail, keep_lease=True)
            record = self.backend.get(key)
            if record is not None and record.state is State.DONE:
                return self._replay(record)  # type: ignore[no-any-return]
            raise UnknownOutcome(key, detail) from exc

    def _mark_unknown(self, key: str, owner: str, detail: str, *, keep_lease: bool = False) -> None:
        try:
            self.backend.mark_unknown(key, owner, detail, self._now(), self.ttl, keep_lease)
        except Exception as exc:  # the record stays PENDING: its lease runs out, then unknown
            _log.error("tether: effect %s…: could not mark it unknown: %s", key[:16], exc)

    def _record_done(self, key: str, owner: str, result: Any) -> None:
        try:
            verdict = self.backend.complete(
                key, owner, State.DONE, self._encode(result), None, self._now(), self.ttl
            )
        except Exception as exc:
            raise self._not_recorded(
                key, result, f"the ledger's store failed ({redact_text(str(exc))})"
            ) from exc
        if verdict is Completion.MISSING:
            self._restore_unknown(key, owner)
            raise self._not_recorded(
                key, result, "the ledger no longer has its record (a store that lost data, "
                "for example a Redis restarted without persistence)",
            )  # fmt: skip
        if verdict is Completion.LOST:
            raise self._not_recorded(
                key, result, "another worker took its claim over after the lease ran out "
                "without renewal; the other worker's record stands",
            )  # fmt: skip
        if verdict is Completion.FINAL:
            _log.warning("tether: effect %s… was settled by someone else while it ran", key[:16])

    def _restore_unknown(self, key: str, owner: str) -> None:
        """Write back a record the store lost, as UNKNOWN: whoever asks next must reconcile
        through ``lookup`` instead of running the effect again."""
        try:
            self.backend.claim(Record.claim_of(key, None, owner, 60.0, self.ttl), self._now())
            why = "the store lost this record after the effect ran; check the provider's records"
            self.backend.mark_unknown(key, owner, why, self._now(), self.ttl)
        except Exception as exc:
            _log.error(
                "tether: effect %s…: its lost record could not be restored: %s", key[:16], exc
            )

    def _not_recorded(self, key: str, result: Any, why: str) -> EffectNotRecorded:
        error = EffectNotRecorded(key, result, why)
        _log.error("tether: %s", error)
        return error

    def _record_failure(self, key: str, owner: str, exc: BaseException) -> None:
        try:
            if not isinstance(exc, Exception):  # cancelled mid-effect: nobody knows
                self._mark_unknown(key, owner, f"interrupted by {type(exc).__name__}")
                return
            verdict = classify(exc)
            if verdict.kind is Kind.PERMANENT and not verdict.outcome_unknown:
                self._remember_error(key, exc)
                self.backend.complete(
                    key, owner, State.FAILED, None, _encode_error(exc), self._now(), self.ttl
                )
            elif verdict.outcome_unknown:
                self._mark_unknown(
                    key, owner, redact_text(f"{type(exc).__name__}: {verdict.reason}")
                )
            else:  # refused before sending, rate limited, quota: nothing happened
                self.backend.release(key, owner)
        except Exception as store_error:  # the effect's own error is what the caller gets
            _log.error("tether: effect %s…: its failure could not be recorded (%s); the "
                       "record stays pending until its lease runs out", key[:16], store_error)  # fmt: skip

    def _encode(self, value: Any) -> str:
        try:
            return self.codec.encode(value)
        except Exception as exc:
            _log.warning(
                "effect result of type %s cannot be encoded (%s); its repr is recorded. "
                "Return JSON-able results or pass codec= to the Ledger",
                type(value).__name__,
                exc,
            )
            return JsonCodec().encode({"$repr": repr(value)[:2000]})

    def _replay(self, record: Record) -> Any:
        if record.result is None:
            return None
        try:
            return self.codec.decode(record.result)
        except Exception:
            return JsonCodec().decode(record.result)

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
        owner = uuid.uuid4().hex
        self.backend.forget(key)
        self.backend.claim(Record.claim_of(key, None, owner, 60.0, self.ttl), self._now())
        self._record_done(key, owner, result)

    def forget(self, key: str) -> None:
        """Delete a record: the effect did not happen and may run again."""
        self.backend.forget(key)

    def records(self, state: State | None = None, limit: int = 100) -> list[Record]:
        return self.backend.records(state, limit)


class _Heartbeat:
    """Renews the leases of the effects a ledger is running, from one daemon thread.

    Each lease is renewed every third of its length while its effect runs; an effect
    shorter than that costs one dict insert and one removal. A renewal the store
    refuses means another worker took the claim over: it is logged, and the effect's
    result will be refused when it tries to record it.
    """

    def __init__(self, backend: LedgerBackend, ttl: float) -> None:
        self._backend = backend
        self._ttl = ttl
        self._active: dict[tuple[str, str], tuple[float, float]] = {}  # -> (lease, next due)
        self._cond = threading.Condition()
        self._running = False

    def add(self, key: str, owner: str, lease: float) -> None:
        with self._cond:
            self._active[(key, owner)] = (lease, system_clock.now() + lease / 3)
            if not self._running:
                self._running = True
                threading.Thread(target=self._loop, name="tether-lease-heartbeat",
                                 daemon=True).start()  # fmt: skip
            self._cond.notify()

    def remove(self, key: str, owner: str) -> None:
        with self._cond:
            self._active.pop((key, owner), None)

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._active:
                    self._cond.wait(5.0)
                    if not self._active:
                        self._running = False
                        return
                    continue
                now = system_clock.now()
                wait = min(due for _, due in self._active.values()) - now
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                due = [(k, lease) for k, (lease, at) in self._active.items() if at <= now]
                for k, lease in due:
                    self._active[k] = (lease, now + lease / 3)
            for (key, owner), lease in due:
                self._renew(key, owner, lease)

    def _renew(self, key: str, owner: str, lease: float) -> None:
        try:
            kept = self._backend.renew(key, owner, lease, None, self._ttl)
        except Exception as exc:  # try again at the next beat
            _log.warning("tether: effect %s…: lease renewal failed: %s", key[:16], exc)
            return
        if not kept:
            _log.error("tether: effect %s…: lost its claim while running (another worker "
                       "took it over, or the store forgot it)", key[:16])  # fmt: skip
            self.remove(key, owner)


def _why(previous: Record) -> str:
    """Why a record taken over needs reconciling, in words."""
    return previous.detail or (
        "a worker's claim expired before it recorded an outcome"
        if previous.state is State.PENDING
        else "an earlier attempt's outcome is unknown"
    )


class _Step:
    """One blocking ledger step for a worker thread, that a cancellation cannot cut in half.

    Once the thread began the step, a cancelled caller waits for its end (:meth:`abandon`)
    and learns what it did; a step the thread had not begun yet never runs.
    """

    __slots__ = ("_args", "_began", "_ended", "_fn", "_lock", "_off", "error", "result")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._fn, self._args = fn, args
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._began = self._off = False
        self.result: Any = None
        self.error: BaseException | None = None

    def __call__(self) -> Any:
        with self._lock:
            if self._off:
                return None
            self._began = True
        try:
            self.result = self._fn(*self._args)
            return self.result
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            self._ended.set()

    def abandon(self) -> bool:
        """The caller gives up: True once the step that began has ended, False if it never
        began (and never will)."""
        with self._lock:
            self._off = True
            began = self._began
        if began:
            self._ended.wait()
        return began


class _Missing:
    def __repr__(self) -> str:
        return "NOT_FOUND"


_NOT_FOUND: Any = _Missing()
