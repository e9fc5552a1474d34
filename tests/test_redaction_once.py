"""Redacting once: texts remembered with what they redact to, and the recorded JSON view."""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

import tether
from tether.effects._canonical import canonical_json, jsonable
from tether.redaction._redact import PlainEntry, _reset, redact, redact_text, redacted_json


@pytest.fixture(autouse=True)
def fresh_secrets() -> Iterator[None]:
    _reset()
    yield
    _reset()


def test_a_remembered_text_follows_new_patterns() -> None:
    """A text seen before is scanned again once the patterns change."""
    text = "ticket ZZ-123456 opened"
    assert redact_text(text) == text
    assert redact({"note": text}) == {"note": text}
    tether.add_secret_patterns(r"ZZ-\d{6}")
    assert redact_text(text) == "ticket [redacted] opened"
    assert redact({"note": text}) == {"note": "ticket [redacted] opened"}


def test_a_remembered_field_follows_new_names() -> None:
    """A field name seen before is a secret once it is registered as one."""
    assert redact({"zorkword": "abcdef123"}) == {"zorkword": "abcdef123"}
    tether.add_secret_names("zorkword")
    assert redact({"zorkword": "abcdef123"}) == {"zorkword": "[redacted]"}


def test_the_same_text_under_another_name_is_judged_again() -> None:
    """The memo keeps the field a text sat under: a card number named an order stays."""
    card = "4242424242424242"
    assert redact({"note": card}) == {"note": "[redacted]"}
    assert redact({"order_id": card}) == {"order_id": card}
    assert redact({"note": card}) == {"note": "[redacted]"}


def test_the_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Long texts are not remembered, and the memo starts afresh when full."""
    from tether.redaction import _secret_text

    monkeypatch.setattr(_secret_text, "_MEMO_SIZE", 10)
    for i in range(25):
        redact_text(f"plain text number {i}")
    redact_text("x" * (_secret_text._MEMO_TEXT + 1))
    memo = _secret_text._compiled()["memo"]
    assert 0 < len(memo) <= 10
    assert all(len(text) <= _secret_text._MEMO_TEXT for text, _, _ in memo)


@pytest.mark.parametrize(
    "value",
    [
        {"order": "A-1", "api_key": "sk-live-1234567890", "note": "token=abc123def456"},
        {
            "items": [{"sku": "S-1", "qty": 2}],
            "headers": [["Authorization", "Bearer abcdefghijkl"]],
        },
        {"when": dt.datetime(2026, 1, 2, 3, 4, 5), "amount": Decimal("12.50"), "tags": ("a", "b")},
        ["mail me at someone@example.com", 3, None, True],
    ],
)
def test_the_recorded_view_is_what_redacting_at_the_end_gave(value: object) -> None:
    """redacted_json from the canonical text equals redact(jsonable(value)) as the ending made it."""
    assert redacted_json(value, canonical_json(value, ignore=())) == redact(jsonable(value))


def test_the_recorded_view_of_what_json_cannot_hold() -> None:
    """A value with no JSON form is its redacted repr, as redact gives it."""

    class Opaque:
        def __repr__(self) -> str:
            return "Opaque(password=hunter2hunter2)"

    assert redacted_json({"x": Opaque()}) == {"x": "Opaque(password=[redacted])"}


def test_a_recorded_call_is_redacted_once_as_the_ending_redacted_it() -> None:
    """The view of a recorded call equals redact(jsonable(call)) and is made only once."""
    from tether.effects._canonical import intent_keys, intent_keys_and_text
    from tether.redaction._redact import RecordedEntry, redacted_entries

    args = {"to": "a@example.com", "api_key": "sk-live-1234567890abcdef", "items": [1, 2]}
    result = {"id": "R-1", "note": "token=abc123def456", "when": dt.datetime(2026, 1, 2)}
    action, key, text, _ = intent_keys_and_text("refund", args, "scope")
    assert (action, key) == intent_keys("refund", args, "scope")
    assert text == canonical_json(args, ignore=())
    entry = {"step": 3, "tool": "refund", "args": args, "result": result}
    recorded = RecordedEntry(entry, {"args": text, "result": canonical_json(result, ignore=())})
    assert recorded == entry  # the raw call, as a plain dict, until it is redacted
    want = redact(jsonable(entry))
    view = recorded.redacted(jsonable)
    assert view is recorded and view == want
    assert view["args"]["api_key"] == "[redacted]" and "abc123def456" not in str(view)
    assert recorded._texts is None  # only the view is kept: no raw value, no text
    assert recorded.redacted(jsonable) == want  # made once: asking again changes nothing
    restored = redact(jsonable(entry))  # an entry read back from a checkpoint: as before
    gathered = redacted_entries([recorded, restored], jsonable)
    assert gathered == [want, redact(jsonable(restored))]
    assert [type(e) for e in gathered] == [dict, dict]
    lazy = RecordedEntry(entry, {"args": text, "result": None})  # redacted when gathered
    assert redacted_entries([lazy], jsonable) == [want]


def test_no_text_when_the_intent_left_fields_out() -> None:
    """Arguments with a volatile field (or declared ones) give no text: the record encodes them."""
    from tether.effects._canonical import intent_keys_and_text

    assert intent_keys_and_text("t", {"q": 1, "request_id": "r-1"}, "")[2] is None
    assert intent_keys_and_text("t", {"q": 1, "at": 2}, "", ("at",))[2] is None
    assert intent_keys_and_text("t", {"q": 1, "at": 2}, "", ())[2] == '{"at":2,"q":1}'
    assert intent_keys_and_text("t", [1, 2], "")[2] == "[1,2]"


def _nested(depth: int, leaf: object) -> object:
    value = leaf
    for _ in range(depth):
        value = {"in": value}
    return value


@pytest.mark.parametrize(
    "args",
    [
        {"to": "a@example.com", "items": [{"sku": "A-1", "n": 2}, ("x", None, 1.5, True)]},
        ["one", "two", "one"],
        "alone",
        {"line\nbreak": "tab\there", "é": "ü"},
        _nested(30, "deep"),
    ],
)
def test_an_encoding_collects_the_strings_its_text_holds(args: object) -> None:
    """The keys and string values the encoding hands to the record's redaction are the
    strings of its text (what the redaction judged by splitting the text before)."""
    from tether.effects._canonical import intent_keys_and_text

    text = canonical_json(args, ignore=())
    strings = intent_keys_and_text("t", args, "", ())[3]
    assert strings is not None
    assert set(strings) == {json.loads(f'"{s}"') for s in re.findall(r'"((?:[^"\\]|\\.)*)"', text)}


@pytest.mark.parametrize(
    "args",
    [
        {"$set": [1]},  # escaped by the walk: the text's key is not the argument's
        {"when": dt.datetime(2026, 1, 2)},  # tagged by the walk
        {1: "a"},
        _nested(40, "deep"),  # nested past what a record's redaction judges from strings
        {"q": 1, "request_id": "r-1"},  # a field left out: no text to record from
    ],
)
def test_no_strings_when_the_text_is_not_the_arguments_own(args: object) -> None:
    from tether.effects._canonical import intent_keys_and_text

    assert intent_keys_and_text("t", args, "")[3] is None


@pytest.mark.parametrize("leaf", ["api_key=sk-live-1234567890abcdef", "plain words"])
@pytest.mark.parametrize("depth", [31, 33, 62, 63, 64])
def test_a_deeply_nested_call_is_recorded_as_the_ending_redacted_it(depth: int, leaf: str) -> None:
    """Past 64 levels of the record the redaction cuts a value: a call nested that deep
    (its strings are not judged, its text is walked) is recorded as before."""
    args = {"deep": _nested(depth, leaf), "note": "ok"}
    with tether.Guard().start(task="deep") as run:
        run.proceed()
        run.call_tool("echo", lambda **kw: "done", args)
        run.succeed("done")
    raw = {"step": 1, "tool": "echo", "args": args, "result": "done"}
    assert list(run.outcome.partial) == [redact(jsonable(raw))]
    assert "sk-live" not in str(run.outcome.partial)


_NAMES = [
    "order",
    "api_key",
    "password",
    "token",
    "session",
    "auth",
    "name",
    "key",
    "value",
    "header",
    "note",
    "headers",
    "card_number",
    "order_id",
    "accessToken",
    "X-Api-Key",
    "pin",
]
_TEXTS = [
    "ok",
    "refund line item",
    "sk-live-1234567890abcdef",
    "Bearer abcdefghijklmnop",
    "4242424242424242",
    "token=abc123def456",
    "my password is hunter2hunter2",
    "api_key",
    "postgres://user:secret@db:5432/x",
    "someone@example.com",
    "",
    "1234",
    "X-Api-Key",
]


def _json_values() -> object:
    from hypothesis import strategies as st

    leaves = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(10**6), 10**6),
        st.sampled_from(_TEXTS),
        st.text(max_size=30),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(
                st.one_of(st.sampled_from(_NAMES), st.text(max_size=10)), inner, max_size=5
            ),
        ),
        max_leaves=25,
    )


def test_redacting_in_place_is_redacting_a_copy() -> None:
    """The view made in place from a JSON text equals redact() of the value, for any JSON."""
    import json

    from hypothesis import given, settings

    @settings(max_examples=400, deadline=None)
    @given(_json_values())
    def check(value: object) -> None:
        text = json.dumps(value)
        assert redacted_json(value, text) == redact(json.loads(text))

    check()


def test_a_run_redacts_each_call_when_it_records_it() -> None:
    """call_tool keeps the call's redacted view, made once; the ending gathers it unchanged,
    and a snapshot of the run (a framework's thread state) holds no secret."""
    from tether.redaction._redact import RecordedEntry

    def pay(card_number: str, amount: int, note: str) -> dict[str, object]:
        return {"ok": True, "receipt": "token=abc123def456ghi", "when": dt.datetime(2026, 1, 2)}

    args = {
        "card_number": "4242424242424242",
        "amount": 5,
        "note": "api_key=sk-live-1234567890abcdef",
    }
    with tether.Guard().start(task="pay") as run:
        run.proceed()
        assert run.call_tool("pay", pay, args)["ok"] is True
        recorded = run._state.partial[-1]
        assert isinstance(recorded, RecordedEntry) and recorded._texts is None  # the view, made now
        raw = {"step": 1, "tool": "pay", "args": args, "result": pay(**args)}
        assert recorded == redact(jsonable(raw))  # what the ending made of it before
        state = str(run.snapshot())
        assert (
            "4242424242424242" not in state
            and "sk-live" not in state
            and "abc123def456" not in state
        )
        run.succeed("paid")
    assert list(run.outcome.partial) == [redact(jsonable(raw))]
    assert "4242424242424242" not in str(run.outcome.partial)


def _lookup(**kwargs: object) -> dict[str, object]:
    return {"ok": True, "n": kwargs.get("n")}


def _args(n: int) -> dict[str, object]:
    return {
        "customer": "C-1042",
        "items": [{"sku": f"SKU-{i}", "qty": i} for i in range(3)],
        "n": n,
    }


def _raw(step: int, n: int) -> dict[str, object]:
    return {"step": step, "tool": "lookup", "args": _args(n), "result": _lookup(n=n)}


def _kept_as_text(entry: object) -> bool:
    from tether.redaction._redact import RecordedEntry

    return isinstance(entry, RecordedEntry) and entry._kept is not None


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_clean_call_is_kept_as_its_text_until_its_view_is_read(shell: str) -> None:
    """A call that redacts to itself keeps its canonical texts (no raw value, no parsed
    view) until an audience reads it; the outcome's calls are made when read, the same
    views as before."""
    import asyncio

    guard = tether.Guard(keep_last=3)
    run = guard.start(task="lookups")
    with run:
        for n in range(5):
            run.proceed()
            if shell == "sync":
                run.call_tool("lookup", _lookup, _args(n))
            else:
                asyncio.run(run.acall_tool("lookup", _async_lookup, _args(n)))
        assert all(_kept_as_text(e) for e in run._state.partial)  # nothing parsed while it runs
        assert run._state.partial[-1]["tool"] == "lookup" and _kept_as_text(run._state.partial[-1])
        run.succeed("done")
    kept = list(run._state.partial)[-3:]
    assert all(_kept_as_text(e) for e in kept)  # the ending did not parse them either
    want = [redact(jsonable(_raw(step, step - 1))) for step in (3, 4, 5)]
    assert list(run.outcome.partial) == want  # made on this first read
    assert [type(e) for e in run.outcome.partial] == [dict, dict, dict]
    assert not any(_kept_as_text(e) for e in kept)  # the view is kept from now on
    assert run.outcome.partial is run.outcome.partial and run.outcome.partial_omitted == 2
    assert kept[0] == want[0] and repr(kept[0]) == repr(run.outcome.partial[0])


async def _async_lookup(**kwargs: object) -> dict[str, object]:
    return _lookup(**kwargs)


def test_a_call_with_a_secret_is_scrubbed_at_once() -> None:
    """No text is kept of a call that does not redact to itself: its view is made now."""
    with tether.Guard().start(task="pay") as run:
        run.proceed()
        run.call_tool("pay", _lookup, {"card_number": "4242424242424242", "n": 1})
        recorded = run._state.partial[-1]
        assert not _kept_as_text(recorded) and recorded._entry is not None
        assert recorded["args"] == {"card_number": "[redacted]", "n": 1}
        run.succeed("paid")


def test_the_outcome_of_kept_calls_reads_as_a_plain_outcome() -> None:
    """An outcome whose calls are made on first read compares, prints, pickles, copies
    and replaces as the outcome with those calls given."""
    import copy
    import dataclasses
    import pickle

    def play() -> tuple[tether.Outcome, tether.Outcome]:
        """An outcome whose calls are not made yet, and the same outcome given them."""
        with tether.Guard().start(task="t") as run:
            run.proceed()
            run.call_tool("lookup", _lookup, _args(1))
            run.succeed("done")
        out = run.outcome
        args, result = jsonable(_args(1)), jsonable(_lookup(n=1))  # sorted, as encoded
        want = ({"step": 1, "tool": "lookup", "args": args, "result": result},)
        fields = [f.name for f in dataclasses.fields(tether.Outcome)]
        given = tether.Outcome(*(want if n == "partial" else getattr(out, n) for n in fields))
        assert _kept_as_text(run._state.partial[-1])  # nothing read the calls of ``out`` yet
        return out, given

    out, given = play()
    assert out == given
    out, given = play()
    assert repr(out) == repr(given)
    out, given = play()
    assert pickle.loads(pickle.dumps(out)) == given
    out, given = play()
    assert copy.deepcopy(out) == given
    out, given = play()
    assert dataclasses.replace(out, status="partial").partial == given.partial
    out, given = play()
    assert dataclasses.asdict(out)["partial"] == given.partial
    out, given = play()
    assert copy.copy(out) == given and isinstance(out.partial, tuple)
    out, given = play()
    assert dataclasses.fields(out) == dataclasses.fields(given)
    for outcome in play():  # unhashable alike: its calls are dicts
        with pytest.raises(TypeError, match="unhashable"):
            hash(outcome)
    out, given = play()
    assert json.dumps(dataclasses.asdict(out), default=str) == json.dumps(
        dataclasses.asdict(given), default=str
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.partial = ()  # type: ignore[misc]


@pytest.mark.parametrize("what", ["outcome", "entry"])
def test_threads_reading_kept_calls_at_once_get_the_same_objects(what: str) -> None:
    """The calls of an outcome (and a kept entry's view) are made once, whoever reads first."""
    import threading

    with tether.Guard().start(task="t") as run:
        for n in range(50):
            run.proceed()
            run.call_tool("lookup", _lookup, _args(n))
        run.succeed("done")
    entry = run._state.partial[-1]
    start = threading.Barrier(8)
    seen: list[object] = []

    def read() -> None:
        start.wait()
        seen.append(run.outcome.partial if what == "outcome" else entry["args"])

    threads = [threading.Thread(target=read) for _ in range(8)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch inside the parsing, if nothing stops them
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert len(seen) == 8 and all(s is seen[0] for s in seen)


def test_a_snapshot_and_a_checkpoint_hold_the_views_of_kept_calls() -> None:
    """The audiences that write JSON read kept calls as their views."""
    guard = tether.Guard(checkpoints=tether.Checkpoints.memory())
    run = guard.start(task="t")
    with run:
        run.proceed()
        run.call_tool("lookup", _lookup, _args(1))
        doc = json.loads(json.dumps(run.snapshot()))
        assert doc["partial"]["entries"] == [redact(jsonable(_raw(1, 1)))]
        run.succeed("done")
    assert list(run.outcome.partial) == [redact(jsonable(_raw(1, 1)))]
    assert guard.checkpoints is not None and run.outcome.checkpoint_id is not None
    saved = guard.checkpoints.load(run.outcome.checkpoint_id)
    assert saved["partial"] == [redact(jsonable(_raw(1, 1)))]


def test_run_partial_gives_plain_dicts_while_it_runs() -> None:
    """``run.partial`` mid-run is a list of plain dicts, as before calls were kept as text:
    ``json.dumps`` takes it, dict methods work, and the outcome gives the same views."""
    import json

    guard = tether.Guard()
    with guard.start(task="views") as run:
        run.call_tool("lookup", lambda **kw: {"ok": True, **kw}, {"order": "A-1", "n": 1})
        run.call_tool("lookup", lambda **kw: {"ok": True, **kw}, {"card": "4242 4242 4242 4242"})
        entries = run.partial
        assert all(type(e) is PlainEntry for e in entries)  # a dict, its view
        text = json.dumps(entries)
        assert "4242 4242" not in text and '"order": "A-1"' in text
        first = entries[0].copy() | {"seen": True}
        assert first["args"] == {"order": "A-1", "n": 1} and first["seen"]
        run.call_tool("lookup", lambda **kw: {"ok": True, **kw}, {"order": "A-2", "n": 3})
        assert all(type(e) is PlainEntry for e in run.partial)  # the newer call too
        assert run.partial[0] is entries[0] and run.partial[-1]["args"]["order"] == "A-2"
        run.succeed("done")
    assert [dict(e) for e in run.outcome.partial][:2] == json.loads(text)


@pytest.mark.parametrize("status", ["success", "partial"])
def test_the_outcomes_conversation_is_redacted_when_first_read(
    status: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``outcome.messages`` is made on first read, from the conversation as it was when
    the run ended: the same redacted tuple as one made at the ending, a later change to
    the framework's list changes nothing, and it pickles and compares as a plain one."""
    import pickle

    import tether.run._ending as ending
    from tether.redaction._redact import redact_conversation

    made: list[int] = []

    def counted(*args: object, **kwargs: Any) -> tuple[object, ...]:
        made.append(1)
        return redact_conversation(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ending, "redact_conversation", counted)
    card = "4242 4242 4242 4242"
    messages: list[Any] = [
        {"role": "user", "content": f"refund order A-1 to card {card}"},
        {"role": "assistant", "content": "looking it up"},
        {"role": "tool", "content": json.dumps({"card": card, "ok": True})},
    ]
    with tether.Guard().start(task="t") as run:
        run.messages = messages
        run.proceed()
        run.call_tool("lookup", _lookup, _args(1))
        if status == "success":
            run.succeed("done")
        else:
            run.stop(tether.StopReason.FAILED, "stopped by the test")
    assert made == []  # the ending made no conversation: nobody read it yet
    want = redact_conversation(list(messages), keep_last=status != "success")
    messages.append({"role": "user", "content": f"and again {card}"})  # after the end
    out = run.outcome
    assert pickle.loads(pickle.dumps(out)).messages == want
    assert out.messages == want and isinstance(out.messages, tuple)
    assert card not in repr(out.messages[:-1]) and len(out.messages) == 3
    assert made == [1]  # made once, on the first read
