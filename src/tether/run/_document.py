"""The run document: the one shape every copy of a run is written in and read back from.

A run travels as three copies: the **snapshot** a framework keeps in its own state
(``run.snapshot()``, a LangGraph thread), the **checkpoint** a run leaves when it stops (to
be resumed), and the **record** a records database keeps of how it ended. All three are
written by :func:`write` and read by :func:`read`:

- ``version`` (:data:`DOCUMENT_VERSION`) and ``form`` (:class:`Form`) head every document;
  an older one is migrated forward (:func:`migrate`), a newer, unknown, mistyped or
  corrupt one is refused with :class:`tether.RunDocumentError`.
- the guard's signing key (``Guard(signing_key=...)``) signs each document when written
  (HMAC-SHA256 over its canonical form, ``_signing``) and is checked when read: an unsigned,
  altered or forged document is refused before anything runs.
- a document serves the request it names for the run it names (:func:`check_bound`).
- a run's steps, model calls, tool calls, retries, tokens and spend are entries: each copy
  of the run counts in a row of its own (``counts``), the totals are their sums, and two
  copies of one run merge by the union of their rows (:func:`merge`): parallel tool calls,
  LangGraph ``Send`` branches and two workers on one thread lose no count, and a document
  merged again (a replayed update) counts nothing twice.

The fields of each form are listed in docs/run.md ("The run document").
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from tether._errors import LedgerNotShared, RunDocumentError
from tether.effects._canonical import jsonable
from tether.redaction._redact import redact
from tether.run._runstate import COUNTED, count_rows
from tether.run._signing import SIGNATURE, sign, verify

if TYPE_CHECKING:
    from tether.run._runstate import RunState

__all__ = [
    "DOCUMENT_VERSION",
    "STORE_FIELDS",
    "Form",
    "RunDocumentError",
    "effects_doc",
    "ledger_identity",
    "ledger_not_shared",
    "merge",
    "run_fields",
    "unseen",
    "check_bound",
    "check_version",
    "migrate",
    "read",
    "write",
]

#: The layout of a run document. 1: the snapshot of tether before the three copies shared
#: one shape (checkpoints and records had no version); 2: one shape, ``form`` names the copy;
#: 3: the counts are entries (``counts``: a row per copy of the run), merged by union.
DOCUMENT_VERSION = 3

#: the field of a merged document holding the other copies it was merged with (each a whole
#: document as written, signed by its writer): not part of what the merged one's writer signed
MERGED = "merged"

#: fields a store adds to a document after it was written (a checkpoint's ``format`` and
#: ``id``): not part of what was signed
STORE_FIELDS = ("format", "id")


class Form(StrEnum):
    """Which copy of a run a document is."""

    SNAPSHOT = "snapshot"  # the run as it goes on: run.snapshot(), guard.restore()
    CHECKPOINT = "checkpoint"  # the run as it stopped, to be resumed: guard.resume()
    RECORD = "record"  # how the run ended, in a records database (tether serve)


def write(body: Mapping[str, Any], form: Form, keys: tuple[bytes, ...]) -> dict[str, Any]:
    """The document of ``body`` (its fields, redacted already) as a ``form``: headed by its
    version and form, signed with the first of ``keys`` when there is one."""
    doc = {"version": DOCUMENT_VERSION, "form": _FORMS[form]}
    doc.update(body)  # a body headed already (a snapshot's) keeps its order
    if keys:
        doc[SIGNATURE] = sign(doc, keys)
    return doc


#: each form's text, read without the enum's ``value`` property (a snapshot is written at
#: every hook of a framework that keeps the run in its state)
_FORMS = {form: form.value for form in Form}


def run_fields(s: RunState) -> dict[str, Any]:
    """What every form of a run's document holds alike: the run, its request, the effects
    it made (redacted) and what the customer reads for each, and the in-process ledger it
    ran on (a run read back elsewhere is told its effects there cannot be seen)."""
    return {
        "run_id": s.run_id,
        "key": s.key,
        "request": s._request,
        "effects": effects_doc(s._effects),
        "counts": count_rows(s),  # the counts as entries: a row per copy of the run
        "labels": dict(s._labels),
        "ledger": ledger_identity(s.guard.ledger),
    }


def effects_doc(effects: Any) -> list[list[Any]]:
    """A run's effects, ``(tool, args, ledger key)``, as a document holds them: the
    arguments redacted, here, once (an effect's arguments say what was done: a run read back
    tells the customer of it, never with a secret in clear)."""
    return [[tool, redact(jsonable(args)), key] for tool, args, key in effects]


def ledger_identity(ledger: Any) -> str | None:
    """What a document names its ledger by: an in-process ledger's identity (a run restored
    on another one cannot see the effects made on it), None for a shared store."""
    backend = getattr(ledger, "backend", None)
    if not getattr(backend, "in_memory", False):
        return None
    identity = getattr(backend, "identity", None)
    return identity if isinstance(identity, str) else None


def unseen(ledger: Any, effects: Iterable[tuple[str, Any, str]]) -> str | None:
    """What :func:`ledger_not_shared` says of a run restored with ``effects`` that the
    guard's in-process ``ledger`` has no record of (made by another worker, process or
    guard), or None (a shared store, or every effect seen)."""
    if ledger_identity(ledger) is None:
        return None  # a shared store: what it cannot see, nobody made
    keys = {key: tool for tool, _, key in effects}
    missing = sorted({tool for key, tool in keys.items() if ledger.get(key) is None})
    if not missing:
        return None
    return (
        f"was restored in a process whose ledger cannot see the effects it made "
        f"({', '.join(missing)}): they were made elsewhere (another worker, process or "
        "Guard). An effect the restored run asks for again will run again"
    )


def ledger_not_shared(warned: set[str], run_id: str, what: str) -> None:
    """Say once per run (``warned``: the runs told already), loudly, with the fix, that run
    ``run_id`` ``what``: an ERROR and :class:`tether.LedgerNotShared`."""
    if run_id in warned:
        return
    warned.add(run_id)
    message = (
        f"tether: run {run_id} {what}. This guard's ledger is in this process's memory: "
        "give every worker the same ledger: Guard(ledger=tether.Ledger.postgres(dsn)) or "
        ".redis(url) (.sqlite(path) on one machine)"
    )
    logging.getLogger("tether").error(message)
    warnings.warn(message, LedgerNotShared, stacklevel=4)


def read(doc: Any, form: Form, keys: tuple[bytes, ...], *, bound: bool = True) -> Mapping[str, Any]:
    """``doc`` as a current document of ``form``: its version checked (an older one
    migrated, a newer one refused), its signature checked against ``keys`` (over the
    document as it was written, before any migration), the request it names checked
    against its run (``bound``). Raises :class:`tether.RunDocumentError` for anything else:
    nothing runs from a document that cannot be read."""
    if not isinstance(doc, Mapping):
        raise RunDocumentError(
            f"run {form.value} must be a mapping (a run document), got {type(doc).__name__}: "
            "nothing runs without its run (a thread whose run was cleared or replaced cannot "
            "go on)"
        )
    check_version(doc, form)
    others = doc.get(MERGED)
    if others is not None:
        return _read_merged(doc, others, form, keys, bound)
    if keys:
        verify({k: v for k, v in doc.items() if k not in STORE_FIELDS}, keys)
    current = migrate(doc, form)
    if bound:
        check_bound(current, form)
    return current


def _read_merged(
    doc: Mapping[str, Any], others: Any, form: Form, keys: tuple[bytes, ...], bound: bool
) -> Mapping[str, Any]:
    """A document merged with other copies of its run (:func:`merge`): each copy read as a
    document of its own (its signature, its version, its request), all of one run and one
    request, then made one: the union of their entries and effects."""
    if not isinstance(others, list) or not others:
        raise RunDocumentError(f"run {form.value}: {MERGED!r} must be a list of documents")
    if any(not isinstance(o, Mapping) or MERGED in o for o in others):
        raise RunDocumentError(f"run {form.value}: {MERGED!r} holds a document that is not one")
    main = read({k: v for k, v in doc.items() if k != MERGED}, form, keys, bound=bound)
    copies = [read(o, form, keys, bound=bound) for o in others]
    for copy in copies:
        if [copy.get(f) for f in _BOUND] != [main.get(f) for f in _BOUND]:
            raise RunDocumentError(
                f"run {form.value} of run {main.get('run_id')} was merged with a copy of run "
                f"{copy.get('run_id')!r:.40} / request {copy.get('request')!r:.60}: refused"
            )
    return union(main, copies)


#: what makes two documents copies of one run serving one request
_BOUND = ("run_id", "key", "request")


def union(main: Mapping[str, Any], copies: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``main`` with the entries (``counts``: per copy of the run, its newest row) and the
    effects (by ledger key) of ``copies`` too, its totals their sums; its other fields its
    own (the copy furthest on)."""
    out = dict(main)
    rows = _rows(main)
    effects = list(main.get("effects") or ())
    seen = {e[2] for e in effects if isinstance(e, list | tuple) and len(e) == 3}
    for copy in copies:
        for writer, row in _rows(copy).items():
            if writer not in rows or _seq(rows[writer]) < _seq(row):
                rows[writer] = row
        for effect in copy.get("effects") or ():
            if isinstance(effect, list | tuple) and len(effect) == 3 and effect[2] not in seen:
                seen.add(effect[2])
                effects.append(effect)
    out["counts"] = rows
    out["effects"] = effects
    if out.get("form") == Form.SNAPSHOT.value:  # its totals: what its entries sum to
        for i, name in enumerate(COUNTED):
            values = [r[i + 1] for r in rows.values() if isinstance(r, list | tuple)]
            if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
                out[name] = sum(values) if name == "cost_usd" else int(sum(values))
    return out


def _rows(doc: Mapping[str, Any]) -> dict[str, Any]:
    rows = doc.get("counts")
    if not isinstance(rows, Mapping):
        raise RunDocumentError(f"run document: counts must be a mapping, got {rows!r:.40}")
    return dict(rows)


def _seq(row: Any) -> int:
    seq = row[0] if isinstance(row, list | tuple) and row else None
    if type(seq) is not int:
        raise RunDocumentError(f"run document: a row of counts is unreadable: {row!r:.60}")
    return seq


def merge(old: Any, new: Any) -> Any:
    """Two copies of one run's document as one (a framework's reducer: LangGraph's
    ``tether_run`` channel, where parallel tool calls and ``Send`` branches each write the
    copy they made): the one that holds every entry and effect of the other, as it is
    (still signed); else the one further on, with the other copies it lacks in
    ``merged`` (each as written, still signed by its writer), which :func:`read` makes one
    by the union of their entries. A document merged with itself, or again, is itself: a
    replayed update counts nothing twice. A run started anew, ended (None), another run or
    a document of before entries replaces the old one, as it did."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return new
    if old.get("run_id") != new.get("run_id") or old is new:
        return new
    try:
        further, other = (new, old) if _progress(new) >= _progress(old) else (old, new)
        if _holds(further, other):  # one entry for entry as the other: the one further on
            return further
        if _holds(other, further):
            return other
        main = {k: v for k, v in further.items() if k != MERGED}
        copies = [*_copies(further)[1:], *_copies(other)]
        kept: list[Mapping[str, Any]] = []
        for copy in copies:
            if not _holds(main, copy) and not any(_holds(k, copy) for k in kept):
                kept.append(copy)
        if kept:
            main[MERGED] = kept
        return main
    except (TypeError, ValueError, KeyError, IndexError, RunDocumentError):
        return new  # one cannot be read: the new one, refused when read


def _copies(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """``doc`` (without what it was merged with) and the copies it was merged with."""
    others = doc.get(MERGED)
    if not others:
        return [doc]
    return [{k: v for k, v in doc.items() if k != MERGED}, *others]


def _holds(doc: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """Whether ``doc`` (with the copies it was merged with) holds every entry and effect
    of ``other`` (and of the copies it was merged with)."""
    rows: dict[str, int] = {}
    keys: set[Any] = set()
    for copy in _copies(doc):
        for writer, row in _rows(copy).items():
            rows[writer] = max(rows.get(writer, 0), _seq(row))
        keys.update(e[2] for e in copy.get("effects") or ())
    for copy in _copies(other):
        for writer, row in _rows(copy).items():
            if rows.get(writer, -1) < _seq(row):
                return False
        if any(e[2] not in keys for e in copy.get("effects") or ()):
            return False
    return True


def _progress(doc: Mapping[str, Any]) -> tuple[int, ...]:
    """How far on a copy of a run is: its steps, calls, transcript and whether it stopped."""
    found = doc.get("transcript")
    transcript: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    entries = len(transcript.get("entries") or ()) + int(transcript.get("omitted") or 0)
    return (
        int(doc.get("steps") or 0),
        int(doc.get("model_calls") or 0),
        int(doc.get("tool_calls") or 0),
        entries,
        int(doc.get("stop") is not None),
    )


def check_version(doc: Mapping[str, Any], form: Form) -> None:
    """Refuse (:class:`tether.RunDocumentError`) a document that is not a ``form`` of the
    current version or of one :func:`migrate` reads."""
    version = doc.get("version")
    if type(version) is int and version in (2, DOCUMENT_VERSION):
        if doc.get("form") != _FORMS[form]:
            raise RunDocumentError(
                f"run document is a {doc.get('form')!r:.20}, not a {form.value}: refused"
            )
        return
    if version == 1 and type(version) is int and form is Form.SNAPSHOT:
        return  # a snapshot of before the one shape
    if version is None and "version" not in doc and form is not Form.SNAPSHOT:
        return  # a checkpoint or a record of before the one shape (they had no version)
    raise RunDocumentError(
        f"run {form.value} version {version!r:.20} is not {DOCUMENT_VERSION} (made by another "
        "tether: deploy the same tether everywhere that reads this run before it goes on)"
    )


def migrate(doc: Mapping[str, Any], form: Form) -> Mapping[str, Any]:
    """``doc`` (a document :func:`check_version` accepts) in the current layout (a current
    one as it is, not copied). From 1 (a snapshot), 2, and no version (a checkpoint or a
    record): the same fields, headed by version 3 and the form, its signature gone (checked
    already, over the document as it was written), and its counts as one row of entries
    (``counts``: ``{"0": [1, *totals]}``, the same row in every copy migrated from one
    document, so that two such copies merged count it once)."""
    if doc.get("version") == DOCUMENT_VERSION:
        return doc
    out = dict(doc)
    out["version"] = DOCUMENT_VERSION
    out["form"] = form.value
    out.pop(SIGNATURE, None)
    if "counts" not in out:
        totals = out if form is Form.SNAPSHOT else out.get("usage")
        if isinstance(totals, Mapping):
            out["counts"] = {"0": [1, *(totals.get(name) or 0 for name in COUNTED)]}
    return out


def check_bound(doc: Mapping[str, Any], form: Form) -> None:
    """A document serves the request it names for the run it names: its ``request`` is what
    its ``run_id`` and ``key`` make (a run started without a key is its own request), so
    that a document edited to another run or request (to use that run's approval, to replay
    another conversation's effects) is refused (a signed one is refused for any edit)."""
    run_id, key, request = doc.get("run_id"), doc.get("key"), doc.get("request")
    if run_id is None and key is None and request is None:  # a checkpoint of before runs had ids
        return
    if not isinstance(run_id, str) or (key is not None and not isinstance(key, str)):
        raise RunDocumentError(
            f"run {form.value}: run_id {run_id!r:.40} / key {key!r:.40} unreadable"
        )
    if request is None and key is None:  # a run of before requests
        return
    expected = f"key:{key}" if key is not None else f"run:{run_id}"
    if request != expected:
        raise RunDocumentError(
            f"run {form.value} of run {run_id} names request {request!r:.60}, not its own "
            f"({expected!r:.60}): a document made for another run or request is refused"
        )
