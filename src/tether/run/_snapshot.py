"""A run as plain data, and a run rebuilt from it.

A framework that persists its own state (LangGraph's checkpoint, keyed by thread) keeps the
run there: ``run.snapshot()`` is JSON-able (str, int, float, bool, None, lists and dicts),
and ``guard.restore(doc)`` continues the run in any process, with its budgets, its loop
detectors, its progress and its request (so that the ledger knows its effects). Nothing of
the run stays in memory between the two.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from operator import itemgetter
from typing import TYPE_CHECKING, Any, TypeVar

from tether._errors import RunDocumentError
from tether.effects._canonical import jsonable
from tether.redaction._redact import PlainEntry, RecordedEntry, redact
from tether.run._document import (
    DOCUMENT_VERSION,
    MERGED,
    Form,
    check_version,
    ledger_identity,
    read,
    run_fields,
    write,
)
from tether.run._outcome import Usage
from tether.run._runstate import (
    COUNTED,
    HasState,
    RunState,
    Tail,
    continue_here,
    inherit,
    load_document,
    settled,
)

if TYPE_CHECKING:
    from tether.run._settings import RunSettings

R = TypeVar("R", bound=HasState)

__all__ = ["SNAPSHOT_VERSION", "restore", "snapshot"]

#: The layout of a snapshot: the run document's (``_document``); a newer one is refused.
SNAPSHOT_VERSION = DOCUMENT_VERSION

#: the whole-number counts: ``COUNTED`` but its last, ``cost_usd`` (a float, read on its own)
_COUNTS = COUNTED[:-1]


def _tail(tail: Tail) -> dict[str, Any]:
    """A tail as a document holds it: each entry made JSON once, when first written (the
    tail keeps what it made, ``tail.doc``; an entry is never changed once appended), so a
    hook's snapshot costs the entries appended since the last one, not the run's length."""
    done = tail.doc
    if done is None or len(done) > len(tail):
        done = []
    if len(done) < len(tail):
        # a recorded call is its redacted JSON view already, and an entry read back from a
        # snapshot is JSON as it was written: both kept as they are (no secret in the state)
        # PlainEntry's type first: isinstance of RecordedEntry (a Mapping) asks the ABC's
        # registry
        done = done + [
            dict(e)
            if type(e) is PlainEntry or isinstance(e, RecordedEntry)
            else _flat(e) or jsonable(e)
            for e in tail[len(done) :]
        ]
        tail.doc = done
    return {"entries": list(done), "omitted": tail.omitted, "by_tool": dict(tail.by_tool)}


def _flat(entry: Any) -> dict[str, Any] | None:
    """``jsonable(entry)`` without encoding it, for an entry that is a flat dict of ASCII
    keys (none starting with ``$``, which the canonical form escapes) and values that are
    their own JSON (None, bool, a small int, a finite float, an ASCII str): a model
    call's line of the transcript, a tool call's. Its keys sorted, as the canonical text
    has them. None for anything else (the encoding decides)."""
    if type(entry) is not dict:
        return None
    for k, v in entry.items():
        if type(k) is not str or not k.isascii() or k[:1] == "$":
            return None
        kind = type(v)
        if v is None or kind is bool:
            continue
        if kind is int:
            if -(2**53) <= v <= 2**53:
                continue
        elif kind is float:
            if math.isfinite(v):
                continue
        elif kind is str and v.isascii():
            continue
        return None
    return {k: entry[k] for k in sorted(entry)}


def _untail(keep: int | None, doc: Any) -> Tail:
    entries = doc.get("entries") or () if isinstance(doc, Mapping) else ()
    plain = PlainEntry  # a dict first: isinstance of Mapping asks the ABC's registry
    tail = Tail(
        keep, [plain(e) if type(e) is dict or isinstance(e, Mapping) else e for e in entries]
    )
    if isinstance(doc, Mapping):
        tail.omitted += int(doc.get("omitted") or 0)
        tail.by_tool.update({str(k): int(v) for k, v in (doc.get("by_tool") or {}).items()})
    return tail


def snapshot(run: RunState) -> dict[str, Any]:
    """Everything the guards of ``run`` need to go on, as plain data: redacted (no secret
    in clear: an effect's arguments, the result), and signed when the guard has a key."""
    doc = _document(run)  # headed by its version and form already: not copied to be
    keys = run.guard.signing_keys
    return write(doc, Form.SNAPSHOT, keys) if keys else doc


#: the head of every snapshot (a snapshot is written at every hook of a framework that keeps
#: the run in its state: its fields are laid out once, in the dict it is returned in)
_VERSION, _FORM = DOCUMENT_VERSION, Form.SNAPSHOT.value


def _document(run: RunState) -> dict[str, Any]:
    loops = settled(run)
    stop = run._stop
    return {
        "version": _VERSION,
        "form": _FORM,
        **run_fields(run),  # the run, its request, its effects (redacted), its ledger
        "task": run.task,
        "scopes": list(run.scopes),
        "elapsed": run.elapsed,
        "cost_usd": run.cost_usd,
        **{name: getattr(run, name) for name in _COUNTS},
        "error": run._error,
        "checked_models": sorted(run._checked_models),
        "models": list(run.models),
        "last_costs": list(run._last_costs),
        "last_tokens": run._last_tokens,
        "max_steps": run._max_steps,
        "partial": _tail(run.partial),
        "transcript": _tail(run.transcript),
        # an effect's arguments say what was done (the customer is told); redacted here, once
        "failed_effects": dict(run._failed_effects),
        "declined": dict(run._declined),
        "tool_counts": dict(run._tool_counts),
        "journal": [entry.to_doc() for entry in run._journal],
        # None and [] are their own JSON (most runs compensate nothing, return nothing yet):
        # not encoded and parsed back at every hook of a framework that snapshots at each
        "compensated": jsonable(list(run._compensated)) if run._compensated else [],
        "pending": run._pending.to_doc() if run._pending is not None else None,
        "unconfirmed": list(run._unconfirmed),
        "failures": [[*sig, n] for sig, n in run._failures.items()],
        "results": list(run._results),
        "no_progress": run._no_progress,
        "step_progress": run._step_progress,
        "step_counted": run._step_counted,
        "step_calls": run._step_calls,
        "stop": [stop[0].value, stop[1]] if stop is not None else None,
        "escalate": run._escalate,
        "result": None if run._result is None else redact(jsonable(run._result)),
        "issues": list(run._issues),
        "resumed_from": run._resumed_from,
        "began": run._began,
        "resumed_stop": [run._resumed_stop[0].value, run._resumed_stop[1]]
        if run._resumed_stop
        else None,
        "loops": {
            "recent": list(loops._recent),
            "counts": dict(loops._counts),
            "allowed": dict(loops._allowed),
            "seq": list(loops._seq),
            "states": [[k, v] for k, v in loops._states.items()],
        },
    }


def _field(doc: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = doc.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise RunDocumentError(f"run snapshot: {name!r} must be {kind}, got {value!r:.60}")
    return value


def restore(
    guard: RunSettings, doc: Mapping[str, Any], make: Callable[..., R], reuse: R | None = None
) -> R:
    """The run that ``doc`` (a :func:`snapshot`) describes, continuing under ``guard``
    (``make`` builds the run: the Guard passes its Run class, so that this module imports
    neither). ``reuse``: the run ``doc`` was taken of, untouched since (the caller knows):
    made what the rebuilt run would be and returned, when it can be (see :func:`_settle`)."""
    if not isinstance(doc, Mapping):
        read(doc, Form.SNAPSHOT, ())  # refused: not a document
    check_version(doc, Form.SNAPSHOT)
    # the run's own snapshot, untouched since (the caller knows; _settle checks its counts):
    # that run, made what the rebuilt one would be; nothing of the document is trusted
    if reuse is not None and _settle(reuse._state, guard, doc):
        return reuse
    doc = read(doc, Form.SNAPSHOT, guard.signing_keys)
    try:
        return _rebuild(guard, doc, make)
    except RunDocumentError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        raise RunDocumentError(f"run snapshot is corrupt: {type(exc).__name__}: {exc}") from None


def _max_steps(guard: RunSettings, written: Any, steps: int) -> int | None:
    """The step limit of a restored run, from the guard: its ``max_steps``, raised by
    ``progress_extension`` for each step that made progress (at most one per step taken) up
    to ``max_steps_ceiling``. What the document says of the limit never widens it."""
    budget = guard.budget
    base, extension = budget.max_steps, budget.progress_extension
    if base is None:
        return None
    if not extension or type(written) is not int or written <= base:
        return base
    extended = base + extension * min((written - base) // extension, steps)
    ceiling = budget.max_steps_ceiling
    return extended if ceiling is None else max(base, min(extended, ceiling))


def _rebuild(guard: RunSettings, doc: Mapping[str, Any], make: Callable[..., R]) -> R:
    key, request = doc.get("key"), doc.get("request")
    run = make(
        guard,
        str(_field(doc, "task", str)),
        str(_field(doc, "run_id", str)),
        key=key if isinstance(key, str) else None,
        request=request if isinstance(request, str) else None,
    )
    s = run._state
    usage = Usage(
        **{name: int(_field(doc, name, int)) for name in _COUNTS},
        cost_usd=float(_field(doc, "cost_usd", (int, float))),
        seconds=float(_field(doc, "elapsed", (int, float))),
    )
    s._restore(usage, [], [])
    if "counts" not in doc:
        raise RunDocumentError("run snapshot: it has no counts (entries)")
    inherit(s, doc["counts"])  # the counts: what its entries sum to, never its totals
    s.scopes = tuple(str(n) for n in doc.get("scopes") or ())
    s.partial = _untail(guard.keep_last, doc.get("partial"))
    s.transcript = _untail(guard.keep_last, doc.get("transcript"))
    load_document(s, doc, _max_steps(guard, doc.get("max_steps"), s.steps), _written_on(guard, doc))
    return run


def _written_on(guard: RunSettings, doc: Mapping[str, Any]) -> str | None:
    """The in-process ledger ``doc`` was written on, when it is not ``guard``'s own (which
    is in-process too): the run's effects made there since (a fork replayed from before
    them) are not seen here. None when the ledgers are one, or either is shared."""
    written, mine = doc.get("ledger"), ledger_identity(guard.ledger)
    return written if isinstance(written, str) and mine is not None and written != mine else None


def _rebuilt_as_is(s: RunState) -> bool:
    """Whether restoring ``s``'s snapshot gives back what ``s`` holds, its tails' entry types
    aside: none of what a snapshot keeps in another form (a journal's compensations and raw
    arguments, effects' raw arguments, a pending approval, a result, the compensated
    calls, the conversation) and no tail longer than a restore would keep."""
    keep = s.guard.keep_last
    return not (
        s._journal
        or s._effects
        or s._compensated
        or s._pending is not None
        or s._result is not None
        or s.messages is not None
        or s._outcome is not None
        or (keep is not None and (len(s.partial) > keep or len(s.transcript) > keep))
    )


#: what :func:`_unchanged_since` reads of a snapshot: its counts and flags, and what it
#: takes the lengths of (in the order that function lists the run's)
_SCALARS = itemgetter(
    *_COUNTS,
    *("cost_usd", "error", "last_tokens", "max_steps", "no_progress", "step_progress"),
    *("step_counted", "step_calls", "escalate", "began", "resumed_from", "stop"),
)
_SIZED = itemgetter(
    *("checked_models", "models", "last_costs", "labels", "tool_counts", "unconfirmed"),
    *("failures", "results", "issues"),
)
_LOOPS_SIZED = itemgetter("recent", "seq", "states", "allowed")


def _unchanged_since(s: RunState, doc: Mapping[str, Any]) -> bool:
    """Whether ``doc`` still is ``s`` as it stands: every count, flag and length that a
    step, a model call (begun or recorded), a tool call, a retry, a stop or an ending moves
    is what ``doc`` says (two tuples compared, where a snapshot would encode it all); False
    for a document without them."""
    stop, loops, partial, transcript = s._stop, settled(s), s.partial, s.transcript
    now = (
        *(s.steps, s.model_calls, s.tool_calls, s.retries, s.input_tokens, s.output_tokens),
        *(s.cache_write_tokens, s.cache_read_tokens, s.unpriced_calls),
        *(s.cost_usd, s._error, s._last_tokens, s._max_steps, s._no_progress),
        *(s._step_progress, s._step_counted, s._step_calls, s._escalate, s._began),
        s._resumed_from,
        None if stop is None else [stop[0].value, stop[1]],
    )
    sizes = (
        *(len(s._checked_models), len(s.models), len(s._last_costs), len(s._labels)),
        *(len(s._tool_counts), len(s._unconfirmed), len(s._failures), len(s._results)),
        len(s._issues),
        *(len(loops._recent), len(loops._seq), len(loops._states), len(loops._allowed)),
        *(len(partial), partial.omitted, len(transcript), transcript.omitted),
    )
    try:
        was_partial, was_transcript = doc["partial"], doc["transcript"]
        was = (
            *map(len, _SIZED(doc)),
            *map(len, _LOOPS_SIZED(doc["loops"])),
            *(len(was_partial["entries"]), was_partial["omitted"]),
            *(len(was_transcript["entries"]), was_transcript["omitted"]),
        )
        return now == _SCALARS(doc) and sizes == was
    except (KeyError, TypeError, IndexError):  # not a snapshot of this layout: rebuilt
        return False


def _settle(s: RunState, guard: RunSettings, doc: Mapping[str, Any]) -> bool:
    """Make ``s``, the state ``doc`` is the snapshot of (untouched since), what
    :func:`restore` would rebuild from ``doc``, in place; False (``s`` unchanged) when it
    cannot be (another guard, another run, a run that changed since: see
    :func:`_unchanged_since` and :func:`_rebuilt_as_is`).

    A framework that restores the run at each of its hooks (LangChain's middleware: twelve
    times in a turn of four model calls) spends most of a restore rebuilding what it
    already holds. What a restore makes anew is made anew here: the clock starts again at
    the snapshot's elapsed time (time outside the hooks is not the run's, as after a
    restore), the token reservations, the tools' health, the hung-thread base, the span
    and the records filed; the tails' entries become the snapshot's (JSON, as restored)."""
    if (
        s.guard is not guard
        or MERGED in doc  # merged with other copies: their entries are not in s
        or s.run_id != doc.get("run_id")
        or not _rebuilt_as_is(s)
        or not _unchanged_since(s, doc)
    ):
        return False
    elapsed = doc.get("elapsed")
    tails = ((s.partial, doc["partial"]["entries"]), (s.transcript, doc["transcript"]["entries"]))
    if not isinstance(elapsed, (int, float)) or isinstance(elapsed, bool):
        return False
    if not all(isinstance(entries, list) for _, entries in tails):  # as long as the tails
        return False
    for tail, entries in tails:
        for i in range(tail.settled, len(tail)):  # the new entries: the snapshot's JSON of each
            e = entries[i]
            tail[i] = PlainEntry(e) if isinstance(e, Mapping) else e
        tail.settled = len(tail)
    continue_here(s, float(elapsed))
    return True
