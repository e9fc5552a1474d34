"""Undoing what a run did: compensations newest first, each at most once."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tether import telemetry
from tether._errors import EffectInProgress, UnknownOutcome
from tether.effects._canonical import jsonable
from tether.redaction._redact import redact
from tether.run._governance import JournalEntry
from tether.run._handoff import SOME_STEP
from tether.run._runstate import RunState, escalate, open_issue
from tether.run._toolfn import _is_async

__all__ = ["Rollback"]


@dataclass(frozen=True, slots=True)
class _Undo:
    """One compensation to make: the call it undoes, how, under which ledger key."""

    entry: JournalEntry
    fn: Callable[[Any], Any]
    original: Any  # what the call returned: the compensation's argument
    key: str
    ledger: Any
    policy: Any

    async def aattempt(self) -> Any:
        """One attempt from async code: an async compensation awaited, a sync one in a thread."""
        import asyncio

        if _is_async(self.fn):

            async def undo() -> Any:
                return await self.fn(self.original)

            return await self.ledger.aonce(self.key, undo)
        return await asyncio.to_thread(self.ledger.once, self.key, lambda: self.fn(self.original))


_log = logging.getLogger("tether")

Compensations = Mapping[str, Callable[[Any], Any]] | None


class Rollback:
    """The compensations of a run (a part of :class:`tether.Run`): each undone at most once."""

    def __init__(self, state: RunState) -> None:
        self.s = state

    def rollback(self, compensations: Compensations = None) -> list[dict[str, Any]]:
        """Make the compensations still to make, newest first; what this call undid."""
        done = []
        for undo in self._undos(compensations):
            if _is_async(undo.fn):
                raise TypeError(
                    f"the compensation of {undo.entry.tool} is a coroutine function: "
                    "use `await run.arollback()`"
                )
            try:
                value = undo.policy.call(
                    lambda u=undo: u.ledger.once(u.key, lambda: u.fn(u.original))
                )
            except Exception as exc:
                self._not_undone(undo.entry, exc)
            else:
                done.append(self._undone(undo, value))
        return done

    async def arollback(self, compensations: Compensations = None) -> list[dict[str, Any]]:
        """The async form of :meth:`rollback` (async compensations awaited, sync ones in a
        worker thread)."""
        done = []
        for undo in self._undos(compensations):
            try:
                value = await undo.policy.acall(undo.aattempt)
            except Exception as exc:
                self._not_undone(undo.entry, exc)
            else:
                done.append(self._undone(undo, value))
        return done

    def _undos(self, given: Compensations) -> Iterator[_Undo]:
        """The compensations still to make, newest first, each with what it needs."""
        for index in reversed(range(len(self.s._journal))):
            entry = self.s._journal[index]
            fn = self._compensation(entry, given)
            if fn is not None:
                yield _Undo(
                    entry,
                    fn,
                    self._original(entry),
                    self._undo_key(entry, index),
                    self.s.guard.ledger,
                    self.s.guard._policy(f"undo:{entry.tool}", None, effect=True),
                )

    # --- the parts both shells share ----------------------------------------------------

    def _compensation(
        self, entry: JournalEntry, given: Compensations
    ) -> Callable[[Any], Any] | None:
        """The function that undoes ``entry``, or None when it is undone already (or was
        tried and failed: a person has it) or nobody said how."""
        if entry.state != "done":
            return None
        fn = entry.compensate or (given or {}).get(entry.tool)
        if fn is None:
            entry.state = "failed"
            escalate(
                self.s, f"{entry.tool} completed and has no compensation here: undo it by hand"
            )
        return fn

    def _undo_key(self, entry: JournalEntry, index: int) -> str:
        """The ledger key of an undo: the original call's ledger key (one per intent), or for
        an idempotent call, its intent and place in this run."""
        return (
            f"undo:{entry.key}" if entry.in_ledger else f"undo:{self.s.run_id}:{index}:{entry.key}"
        )

    def _original(self, entry: JournalEntry) -> Any:
        """What the call returned: kept in memory, or read back from the ledger."""
        if entry.compensate is not None or not entry.in_ledger:
            return entry.result
        return self.s.guard.ledger.result(entry.key)

    def _undone(self, undo: _Undo, value: Any) -> dict[str, Any]:
        """A compensation made: the entry is undone, and what the outcome says of it."""
        entry = undo.entry
        entry.state = "compensated"
        effect = self.s._effect_text(entry.tool, entry.args, undo.original) or SOME_STEP
        record = {
            "tool": entry.tool,
            "args": redact(jsonable(entry.args)),
            "result": redact(jsonable(value)),
            "effect": str(redact(effect.replace(" completed", "", 1))),
        }
        _log.info("tether: run %s: compensated %s", self.s.run_id, entry.tool)
        telemetry.add_event("tether.compensated", **{"gen_ai.tool.name": entry.tool})
        return record

    def _not_undone(self, entry: JournalEntry, exc: Exception) -> None:
        """A compensation that did not complete here: being done by another worker, or
        failed (or unknown) and handed to a person."""
        if isinstance(exc, EffectInProgress):
            self._undo_elsewhere(entry, exc)
        else:
            self._undo_failed(entry, exc)

    def _undo_elsewhere(self, entry: JournalEntry, exc: EffectInProgress) -> None:
        """Another worker holds this compensation's claim: it is being done there (or, if
        that worker died, it is taken over once its lease ends). Nothing for a person yet."""
        open_issue(
            self.s,
            f"undoing {entry.tool} is being done by another worker (it holds the claim "
            "until its lease ends): roll back again after that to confirm it",
        )
        _log.info(
            "tether: run %s: the compensation of %s is being done by another worker",
            self.s.run_id,
            entry.tool,
        )

    def _undo_failed(self, entry: JournalEntry, exc: Exception) -> None:
        """A compensation that failed (after its retries) or may have happened: a person
        takes over, with the facts."""
        self.s.note_error(exc)
        if isinstance(exc, UnknownOutcome):
            entry.state = "unknown"
            escalate(
                self.s,
                f"undoing {entry.tool} may or may not have happened: check before "
                "undoing it by hand",
                unconfirmed=entry.tool,
            )
        else:
            entry.state = "failed"
            escalate(
                self.s,
                f"undoing {entry.tool} failed ({type(exc).__name__}): it is still done; "
                "undo it by hand",
            )
        _log.error(
            "tether: run %s: the compensation of %s failed: %s",
            self.s.run_id,
            entry.tool,
            redact(f"{type(exc).__name__}: {exc}"),
        )
