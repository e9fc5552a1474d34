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
    "run_fields",
    "unseen",
    "check_bound",
    "check_version",
    "migrate",
    "read",
    "write",
]

#: The layout of a run document. 1: the snapshot of tether before the three copies shared
#: one shape (checkpoints and records had no version); 2: one shape, ``form`` names the copy.
DOCUMENT_VERSION = 2

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
    doc.update(body)
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
    if keys:
        verify({k: v for k, v in doc.items() if k not in STORE_FIELDS}, keys)
    current = migrate(doc, form)
    if bound:
        check_bound(current, form)
    return current


def check_version(doc: Mapping[str, Any], form: Form) -> None:
    """Refuse (:class:`tether.RunDocumentError`) a document that is not a ``form`` of the
    current version or of one :func:`migrate` reads."""
    version = doc.get("version")
    if type(version) is int and version == DOCUMENT_VERSION:
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
    one as it is, not copied). From 1 (a snapshot) and from no version (a checkpoint or a
    record): the same fields, headed by version 2 and the form, its signature gone (checked
    already, over the document as it was written)."""
    if doc.get("version") == DOCUMENT_VERSION:
        return doc
    out = dict(doc)
    out["version"] = DOCUMENT_VERSION
    out["form"] = form.value
    out.pop(SIGNATURE, None)
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
