"""A run resumed from its checkpoint: its budgets spent, its journal, how it had stopped."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from tether._errors import RunDocumentError
from tether.records._collections import CheckpointError, check_run_id
from tether.run._document import Form, ledger_identity, read
from tether.run._outcome import Usage
from tether.run._runstate import HasState, inherit, load_checkpoint

if TYPE_CHECKING:
    from tether.run._settings import RunSettings

__all__ = ["resume"]

R = TypeVar("R", bound=HasState)


def resume(
    guard: RunSettings, checkpoint_id: str, make: Callable[..., R]
) -> tuple[R, dict[str, Any] | None]:
    """The run that continues checkpoint ``checkpoint_id`` under ``guard`` (``make`` builds
    it: the Guard passes its Run class, so that this module imports neither), and the run's
    record when the run has ended again since that checkpoint (None otherwise)."""
    checkpoints = guard.checkpoints
    assert checkpoints is not None  # the Guard checked it
    keys = guard.signing_keys
    doc = read(
        checkpoints.load(check_run_id(checkpoint_id, "checkpoint_id")), Form.CHECKPOINT, keys
    )
    run_id = str(doc.get("run_id") or checkpoint_id)
    ended = _moved_past(guard, run_id, checkpoint_id)
    if ended is not None:  # continue from the run's newest state, which has ended
        try:
            doc = read(checkpoints.load(str(ended["checkpoint_id"])), Form.CHECKPOINT, keys)
        except CheckpointError as exc:  # never the older state in its place: refused
            raise RunDocumentError(
                f"run {run_id} went on past checkpoint {checkpoint_id!r} and its newest "
                f"checkpoint cannot be read ({exc}): resume that one, or repair it"
            ) from exc
    key, request = doc.get("key"), doc.get("request")  # the run keeps its request
    run = make(
        guard,
        str(doc["task"]),
        str(doc.get("run_id") or checkpoint_id),
        key=key if isinstance(key, str) else None,
        request=request if isinstance(request, str) else None,
    )
    s = run._state
    try:
        usage = Usage(**doc["usage"])
    except TypeError as exc:
        raise CheckpointError(
            f"checkpoint {checkpoint_id!r} is corrupt: bad usage ({exc})"
        ) from exc
    s._restore(usage, list(doc["partial"]), list(doc["transcript"]))
    try:  # the counts: what its entries sum to (a checkpoint of before: its usage, one row)
        inherit(s, doc.get("counts"))
    except ValueError as exc:
        raise CheckpointError(f"checkpoint {checkpoint_id!r} is corrupt: {exc}") from exc
    omitted: Any = doc.get("omitted")
    for name in ("partial", "transcript"):  # what the earlier part let go still counts
        info: Any = omitted.get(name) if isinstance(omitted, Mapping) else None
        if not isinstance(info, Mapping):
            continue
        tail = getattr(s, name)
        if isinstance(info.get("omitted"), int):
            tail.omitted += info["omitted"]
        by_tool = info.get("by_tool")
        if isinstance(by_tool, Mapping):
            tail.by_tool.update({str(k): int(v) for k, v in by_tool.items() if isinstance(v, int)})
    s.models = [str(m) for m in doc.get("models") or ()]  # the models that answered so far
    s.scopes = tuple(str(n) for n in doc.get("scopes") or ())  # its budget scopes
    written, mine = doc.get("ledger"), ledger_identity(guard.ledger)
    on = written if isinstance(written, str) and mine not in (None, written) else None
    load_checkpoint(s, doc, str(doc.get("id") or checkpoint_id), on)
    return run, ended


def _moved_past(guard: RunSettings, run_id: str, checkpoint_id: str) -> dict[str, Any] | None:
    """The run's record when the run has ended again since ``checkpoint_id`` (it was
    resumed from there and went on), else None."""
    if guard.records is None:
        return None
    try:
        record = guard.records.runs.get(run_id)
    except Exception as exc:  # never resumed on a guess: the run may have gone on since
        raise RunDocumentError(
            f"run {run_id}: its record could not be read ({type(exc).__name__}: {exc}), so "
            f"whether it went on past checkpoint {checkpoint_id!r} is unknown; nothing was "
            "resumed (retry when the records can be read)"
        ) from exc
    if record is None:
        return None
    if not isinstance(record, Mapping):
        raise RunDocumentError(f"run {run_id}: its record is not a run record: {record!r:.60}")
    record = dict(read(record, Form.RECORD, guard.signing_keys))
    if record.get("run_id") != run_id:
        raise RunDocumentError(f"run {run_id}: its record names run {record.get('run_id')!r:.40}")
    if record.get("checkpoint_id") in (None, checkpoint_id):
        return None
    return record
