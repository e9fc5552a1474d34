"""One effect at most once: the plan both forms of the ledger run, and their two drivers.

:func:`claim_plan` holds the decisions before an effect runs: claim the key (waiting up
to the ledger's ``wait`` for another worker's claim), replay a recorded outcome, or
reconcile a takeover through ``lookup``. It is a plan of tether's one step vocabulary
(:mod:`tether._sansio`): it yields the store steps it needs (a
:class:`~tether._sansio.Call`; from async code, a store that does I/O answers in a
worker thread, never cut in half by a cancellation) and the sleeps between claims, run by
:func:`~tether._sansio.drive` in this thread or :func:`~tether._sansio.adrive` on the
event loop. What follows, running the effect and recording its outcome, is
:func:`execute` and :func:`aexecute`: the same settlements (the :class:`Recorder`'s),
told apart only where Python tells them apart: a sync effect past its timeout cannot be
stopped (it keeps its claim and records itself when it ends), an async one is cancelled.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from tether._context import reset_if_here
from tether._errors import UnknownOutcome
from tether._sansio import Call, Plan, Sleep
from tether.effects._heartbeat import heartbeat
from tether.effects._recorder import NOT_FOUND, Recorder, current_key
from tether.effects._steps import off_loop, settle
from tether.stores._ledger_logic import Record, State

__all__ = ["aexecute", "check_call", "claim_at_once", "claim_plan", "execute"]

T = TypeVar("T")


_NUMBERS = (int, float)


def check_call(key: str, lease: float, timeout: float | None) -> float:
    """The arguments ``once`` and ``aonce`` check alike; the lease, as a float."""
    if not key or not isinstance(key, str):
        raise ValueError("key must be a non-empty string")
    if (type(lease) is not float or not lease > 0) and (  # a float lease: one check
        isinstance(lease, bool) or not isinstance(lease, _NUMBERS) or not lease > 0
    ):
        raise ValueError(f"lease must be > 0, got {lease!r}")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, _NUMBERS) or not timeout > 0
    ):
        raise ValueError(f"timeout must be > 0 or None, got {timeout!r}")
    return float(lease)


def claim_plan(
    r: Recorder,
    wait: float,
    poll_interval: float,
    key: str,
    payload: str | None,
    lease: float,
    lookup: Callable[[str], Any] | None,
) -> Plan[tuple[str, Any]]:
    """Claim ``key``; returns (owner, the outcome to hand back, or NOT_FOUND: run it)."""
    clock = r.ledger.clock
    deadline = clock.now() + wait if wait else 0.0
    backend = r.ledger.backend
    # from async code: a store step off the event loop, undone as ``undo`` says when a
    # cancellation interrupts it (this process's memory: called as it is)
    away = not getattr(backend, "in_memory", False)

    def step(fn: Callable[..., Any], args: tuple[Any, ...], undo: Any, skipped: Any) -> Call:
        off = partial(off_loop, backend, fn, undo=undo, skipped=skipped) if away else None
        return Call(fn, args, off)

    def unclaim(claimed: tuple[str, Record | None, Any] | None) -> None:
        if claimed is not None and claimed[2] is NOT_FOUND:
            r.unclaim(key, claimed[0], claimed[1])

    while True:
        last = not wait or clock.now() >= deadline
        claimed = yield step(r.try_claim, (key, payload, lease, last), unclaim, None)
        if claimed is not None:
            break
        yield Sleep(min(poll_interval, max(0.0, deadline - clock.now())))
    owner, previous, replay = claimed
    if replay is not NOT_FOUND or previous is None:
        return owner, replay

    def give_back(found: Any) -> None:  # lookup said not done, and fn did not run
        if found is NOT_FOUND:
            r.unclaim(key, owner, None)

    def untouched() -> None:  # the lookup never ran: the record is as it was
        r.unclaim(key, owner, previous)

    found = yield step(r.reconcile, (key, owner, previous, lookup), give_back, untouched)
    return owner, found


def claim_at_once(
    r: Recorder, key: str, payload: str | None, lease: float, lookup: Callable[[str], Any] | None
) -> tuple[str, Any]:
    """:func:`claim_plan` for a ledger that does not wait (``wait=0``, the default), run in
    this thread: its one claim, then a takeover's reconciling. The same two steps the plan
    yields, without a generator to drive (the sync success path runs this on every call)."""
    claimed = r.try_claim(key, payload, lease, True)
    assert claimed is not None  # the last attempt claims, replays or raises
    owner, previous, found = claimed
    if previous is not None:
        found = r.reconcile(key, owner, previous, lookup)
    return owner, found


def execute(
    r: Recorder,
    key: str,
    owner: str,
    lease: float,
    timeout: float | None,
    fn: Callable[..., T],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> T:
    """Run the claimed effect, ``fn(*args, **kwargs)``, and record its outcome (sync)."""
    ledger = r.ledger
    beat = not r.virtual
    if beat:
        heartbeat.add(ledger.backend, ledger.ttl, key, owner, lease)
    if timeout is None:  # the common case, without a closure or an event
        try:
            return _run_and_record(r, key, owner, fn, args, kwargs)
        finally:
            if beat:
                heartbeat.remove(owner)
    ended = threading.Event()

    def body() -> T:
        try:
            return _run_and_record(r, key, owner, fn, args, kwargs)
        finally:
            ended.set()
            if beat:
                heartbeat.remove(owner)

    try:
        return ledger.clock.call_with_timeout(timeout, body)
    except TimeoutError as exc:
        if ended.is_set():
            raise  # the effect's own timeout, already recorded
        # abandoned: it keeps its claim (the heartbeat renews it) until it really ends
        detail = f"did not return within {timeout:g} s and may still be running"
        r.mark_unknown(key, owner, detail, keep_lease=True)
        record = ledger.backend.get(key)
        if record is not None and record.state is State.DONE:
            return r.replay(record)  # type: ignore[no-any-return]
        raise UnknownOutcome(key, detail) from exc


def _run_and_record(
    r: Recorder,
    key: str,
    owner: str,
    fn: Callable[..., T],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> T:
    token = current_key.set(key)
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        r.record_failure(key, owner, exc)
        raise
    finally:
        current_key.reset(token)
    r.record_done(key, owner, result)
    return result


async def aexecute(
    r: Recorder,
    key: str,
    owner: str,
    lease: float,
    timeout: float | None,
    fn: Callable[[], Awaitable[T]],
) -> T:
    """Run the claimed effect and record its outcome (async: a timeout cancels it)."""
    ledger = r.ledger
    backend = ledger.backend
    beat = not r.virtual
    if beat:
        heartbeat.add(backend, ledger.ttl, key, owner, lease)
    token = current_key.set(key)
    try:
        if timeout is None:
            result = await fn()
        else:
            result = await ledger.clock.acall_with_timeout(timeout, fn)
    except BaseException as exc:
        if isinstance(exc, TimeoutError) and timeout is not None:
            detail = f"cancelled after {timeout:g} s; it may have happened"
            await settle(backend, r.mark_unknown, key, owner, detail)
            raise UnknownOutcome(key, detail) from exc
        if isinstance(exc, Exception):
            await settle(backend, r.record_failure, key, owner, exc)
        else:  # cancelled (also at loop shutdown): record it unknown before leaving
            r.record_failure(key, owner, exc)
        raise
    finally:
        reset_if_here(current_key, token)  # perhaps closed from another context
        if beat:
            heartbeat.remove(owner)
    await settle(backend, r.record_done, key, owner, result)
    return result
