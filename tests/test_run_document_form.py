"""The run document (#38): snapshot, checkpoint and record written by one writer and read by
one reader, with a version, a migration from the versions already written, a refusal of a
newer one, and signatures on every copy (an altered record or checkpoint is refused)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import tether
from tether import Guard, RunDocumentError
from tether.run._document import DOCUMENT_VERSION, Form, read
from tether.testing import VirtualClock

KEY = b"k" * 32


def refund(order: str, card: str) -> str:
    return f"refunded {order}"


def guard(tmp_path: Path, **kw: Any) -> tuple[Guard, tether.Records]:
    records = tether.Records.sqlite(str(tmp_path / "records.db"))
    return Guard(
        records=records,
        budget=tether.Budget(max_steps=2),
        clock=VirtualClock(),
        **kw,
    ), records


def ended_run(g: Guard) -> tether.Run:
    """A run with one refund (an effect with a secret in its arguments), stopped MAX_STEPS."""
    run = g.start(task="refund A-1", key="conv-1")
    with run:
        while run.proceed():
            run.call_tool(
                "refund",
                refund,
                {"order": "A-1", "card": "4242424242424242"},
                idempotent=False,
                label="your refund",
            )
            run.progress("refunded")
    return run


def three_copies(tmp_path: Path, **kw: Any) -> tuple[Guard, tether.Records, dict[Form, Any]]:
    g, records = guard(tmp_path, **kw)
    run = ended_run(g)
    checkpoint_id = run.outcome.checkpoint_id
    assert checkpoint_id is not None
    copies = {
        Form.SNAPSHOT: json.loads(json.dumps(run.snapshot())),
        Form.CHECKPOINT: records.checkpoints.load(checkpoint_id),
        Form.RECORD: records.runs.get(run.run_id),
    }
    return g, records, copies


@pytest.mark.parametrize("signing_key", [None, KEY])
def test_the_three_copies_are_one_document_read_by_one_reader(
    tmp_path: Path, signing_key: bytes | None
) -> None:
    """A run's snapshot, checkpoint and record carry the same version, their form, the run,
    its request and its effects (redacted), and the one reader takes all three."""
    g, records, copies = three_copies(tmp_path, signing_key=signing_key)
    read_back = {form: read(doc, form, g.signing_keys) for form, doc in copies.items()}
    common = {
        form: (
            doc["version"],
            doc["form"],
            doc["run_id"],
            doc["key"],
            doc["request"],
            doc["effects"],
            doc["labels"],
        )
        for form, doc in read_back.items()
    }
    effects = common[Form.SNAPSHOT][5]
    assert {e[0] for e in effects} == {"refund"}
    assert "4242424242424242" not in json.dumps(copies)
    assert {c[0] for c in common.values()} == {DOCUMENT_VERSION}
    assert {form: c[1] for form, c in common.items()} == {f: f.value for f in Form}
    assert len({json.dumps(c[2:]) for c in common.values()}) == 1
    if signing_key is not None:
        assert all("signature" in doc for doc in copies.values())
    records.close()


@pytest.mark.parametrize("form", list(Form))
def test_a_copy_read_as_another_form_is_refused(tmp_path: Path, form: Form) -> None:
    """A snapshot is not a checkpoint, a checkpoint is not a record: refused by name."""
    _, records, copies = three_copies(tmp_path)
    other = next(f for f in Form if f is not form)
    with pytest.raises(RunDocumentError, match=other.value):
        read(copies[form], other, ())
    records.close()


@pytest.mark.parametrize("form", list(Form))
@pytest.mark.parametrize("version", [DOCUMENT_VERSION + 1, 99, "2", True, None])
def test_a_newer_or_unknown_version_is_refused(tmp_path: Path, form: Form, version: Any) -> None:
    """A document of a newer tether (or a version that is not one) is refused, never read as
    if it were current."""
    _, records, copies = three_copies(tmp_path)
    doc = {**copies[form], "version": version}
    with pytest.raises(RunDocumentError, match="version"):
        read(doc, form, ())
    records.close()


def _as_written_before(doc: dict[str, Any], form: Form) -> dict[str, Any]:
    """``doc`` as the tether before the one document wrote it: a snapshot at version 1, a
    checkpoint and a record without a version, none with a form."""
    old = {k: v for k, v in doc.items() if k not in ("version", "form", "signature")}
    if form is Form.SNAPSHOT:
        old["version"] = 1
    if form is Form.RECORD:  # records of before kept neither the request nor the effects
        for name in ("key", "request", "effects", "labels"):
            old.pop(name)
    return old


def test_a_version_1_snapshot_is_migrated_and_goes_on(tmp_path: Path) -> None:
    """A snapshot written by the tether before (version 1) is migrated: the run goes on with
    its steps, its effects and its request (the refund is not made again)."""
    made: list[str] = []

    def counted(order: str) -> str:
        made.append(order)
        return "ok"

    g = Guard(budget=tether.Budget(max_steps=5))
    run = g.start(task="t", key="conv-2")
    assert run.proceed()
    run.call_tool("refund", counted, {"order": "A-1"}, idempotent=False)
    old = _as_written_before(json.loads(json.dumps(run.snapshot())), Form.SNAPSHOT)
    again = g.restore(old)
    assert again.snapshot()["version"] == DOCUMENT_VERSION
    assert again.proceed()
    again.call_tool("refund", counted, {"order": "A-1"}, idempotent=False)
    assert made == ["A-1"] and again.snapshot()["steps"] == 2


def test_an_unversioned_checkpoint_is_migrated_and_resumed(tmp_path: Path) -> None:
    """A checkpoint written before checkpoints had a version is resumed, effects included."""
    g, records, copies = three_copies(tmp_path)
    old = _as_written_before(copies[Form.CHECKPOINT], Form.CHECKPOINT)
    records.checkpoints.store.put("checkpoint", old["id"], old, 1.0)
    assert "version" not in records.checkpoints.load(old["id"])
    run = g.resume(old["id"])
    assert run.run_id == copies[Form.CHECKPOINT]["run_id"]
    assert {e[0] for e in run.snapshot()["effects"]} == {"refund"}
    records.close()


def test_an_unversioned_record_is_migrated(tmp_path: Path) -> None:
    """A record filed before records had a version reads as a current one."""
    _, records, copies = three_copies(tmp_path)
    old = _as_written_before(copies[Form.RECORD], Form.RECORD)
    doc = read(old, Form.RECORD, ())
    assert (doc["version"], doc["form"], doc["status"]) == (DOCUMENT_VERSION, "record", "partial")
    records.close()


def test_a_version_1_checkpoint_or_record_is_refused(tmp_path: Path) -> None:
    """Version 1 was a snapshot's only: a checkpoint or a record that says 1 was not written
    by tether, and is refused."""
    _, records, copies = three_copies(tmp_path)
    for form in (Form.CHECKPOINT, Form.RECORD):
        with pytest.raises(RunDocumentError, match="version"):
            read({**_as_written_before(copies[form], form), "version": 1}, form, ())
    records.close()


# --- records and checkpoints signed like snapshots ----------------------------------------


def test_an_altered_checkpoint_is_refused_on_resume(tmp_path: Path) -> None:
    """With a signing key, a checkpoint altered in the store (its spend wiped) is refused
    by guard.resume before anything runs; unaltered, it resumes."""
    g, records, copies = three_copies(tmp_path, signing_key=KEY)
    doc = copies[Form.CHECKPOINT]
    usage = {**doc["usage"], "steps": 0}
    records.checkpoints.store.put("checkpoint", doc["id"], {**doc, "usage": usage}, 2.0)
    with pytest.raises(RunDocumentError, match="signature"):
        g.resume(doc["id"])
    records.checkpoints.store.put("checkpoint", doc["id"], doc, 3.0)
    assert g.resume(doc["id"]).snapshot()["steps"] == 2
    records.close()


def test_an_unsigned_checkpoint_is_refused_by_a_signing_guard(tmp_path: Path) -> None:
    """A checkpoint written without the key is refused by a guard that holds one."""
    _, records, copies = three_copies(tmp_path)
    signing = Guard(records=records, signing_key=KEY)
    with pytest.raises(RunDocumentError, match="not signed"):
        signing.resume(copies[Form.CHECKPOINT]["id"])
    records.close()


def test_an_altered_record_is_refused_on_resume(tmp_path: Path) -> None:
    """A run resumed and ended again is recorded (signed); resuming its first checkpoint
    again reads that record to know the run moved past it: a record altered in the store
    (to say the run never went on, or ended otherwise) is refused, nothing resumed."""
    g, records, copies = three_copies(tmp_path, signing_key=KEY)
    first = copies[Form.CHECKPOINT]["id"]
    later = g.resume(first)
    with later:
        later.succeed("done")
    record = records.runs.get(later.run_id)
    assert record is not None and record["checkpoint_id"] not in (None, first)
    assert g.resume(first).outcome.status == "success"  # the record stands: ended as it was
    records.runs.save({**record, "status": "failed"}, 5.0)
    with pytest.raises(RunDocumentError, match="signature"):
        g.resume(first)
    records.close()


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_an_effect_asked_again_is_one_entry_of_every_copy(tmp_path: Path, shell: str) -> None:
    """An effect's id is its ledger key: asked twice in a run (the second replayed by the
    ledger), it is one entry of the snapshot, the checkpoint and the record (it was two)."""
    import asyncio

    made: list[str] = []

    def refund(order: str) -> str:
        made.append(order)
        return "ok"

    async def arefund(order: str) -> str:
        return refund(order)

    g, records = guard(tmp_path)
    run = g.start(task="refund A-1")
    with run:
        for _ in range(2):
            run.proceed()
            if shell == "sync":
                run.call_tool("refund", refund, {"order": "A-1"}, idempotent=False)
            else:
                asyncio.run(run.acall_tool("refund", arefund, {"order": "A-1"}, idempotent=False))
    assert made == ["A-1"]
    checkpoint_id = run.outcome.checkpoint_id
    assert checkpoint_id is not None
    copies = [
        run.snapshot(),
        records.checkpoints.load(checkpoint_id),
        records.runs.get(run.run_id),
    ]
    assert [len(doc["effects"]) for doc in copies] == [1, 1, 1]
    records.close()
