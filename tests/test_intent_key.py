"""Intent keys: canonical, volatile-free, typed, with errors that name the path."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import json
import uuid
from typing import Any

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether import canonical_json, intent_key


def test_key_order_never_matters_list_order_does() -> None:
    """Dict key order is irrelevant; list order is part of the intent."""
    assert intent_key("t", {"a": 1, "b": {"x": 1, "y": 2}}) == intent_key(
        "t", {"b": {"y": 2, "x": 1}, "a": 1}
    )
    assert intent_key("t", {"a": [1, 2]}) != intent_key("t", {"a": [2, 1]})


def test_tool_and_scope_separate_keys() -> None:
    """The same arguments to another tool or in another scope are another intent."""
    args = {"order": "A-1"}
    assert len({intent_key("refund", args), intent_key("charge", args),
                intent_key("refund", args, scope="customer-9")}) == 3  # fmt: skip


@pytest.mark.parametrize(
    "field", ["idempotency_key", "request_id", "client_request_id", "nonce", "uuid", "trace_id"]
)
def test_volatile_fields_are_dropped_at_the_top_level_only(field: str) -> None:
    """The fresh request id a model invents on every call does not change the key; a field
    of that name deeper down is data (a payee's uuid) and does."""
    a = {"amount": 10, "to": {"account": "x", field: "acct-1"}, field: "one"}
    b = {"amount": 10, "to": {"account": "x", field: "acct-1"}, field: "two"}
    c = {"amount": 10, "to": {"account": "x", field: "acct-2"}, field: "one"}
    assert intent_key("pay", a) == intent_key("pay", b)
    assert intent_key("pay", a) == intent_key("pay", {k: v for k, v in a.items() if k != field})
    assert intent_key("pay", a) != intent_key("pay", c)
    deep = {"items": [{"sku": "x", field: "1"}]}
    assert intent_key("pay", deep) != intent_key("pay", {"items": [{"sku": "x", field: "2"}]})


def test_declared_paths_are_dropped_too() -> None:
    """A tool declares where else its request ids live: dotted paths, * for every item."""
    ignore = ["uuid", "meta.nonce", "items.*.request_id", ("a.b", "c")]
    a = {"meta": {"nonce": "1", "x": 1}, "items": [{"request_id": "r1", "sku": "s"}],
         "a.b": {"c": 1, "d": 2}, "uuid": "u1"}  # fmt: skip
    b = {"meta": {"nonce": "2", "x": 1}, "items": [{"request_id": "r2", "sku": "s"}],
         "a.b": {"c": 9, "d": 2}, "uuid": "u2"}  # fmt: skip
    assert intent_key("t", a, ignore=ignore) == intent_key("t", b, ignore=ignore)
    assert (
        canonical_json(a, ignore=ignore) == '{"a.b":{"d":2},"items":[{"sku":"s"}],"meta":{"x":1}}'
    )
    assert a["meta"] == {"nonce": "1", "x": 1}  # the caller's arguments are left as they were
    changed = {**b, "meta": {"nonce": "2", "x": 2}}
    assert intent_key("t", a, ignore=ignore) != intent_key("t", changed, ignore=ignore)
    assert canonical_json({"meta": 3}, ignore=ignore) == '{"meta":3}'  # no such path: kept


@pytest.mark.parametrize("bad", ["", "a..b", ("a", ""), ("a", 1)])
def test_a_malformed_path_is_refused_naming_it(bad: Any) -> None:
    """A path that names nothing is an error, not a silent no-op."""
    with pytest.raises(ValueError, match="volatile path"):
        canonical_json({"a": 1}, ignore=[bad])
    with pytest.raises(TypeError, match="list of field names"):
        canonical_json({"a": 1}, ignore="uuid")


def test_ignore_replaces_the_volatile_set() -> None:
    """ignore=() keeps every field; a custom set drops just those."""
    a, b = {"uuid": "1", "ts": 1}, {"uuid": "2", "ts": 2}
    assert intent_key("t", a, ignore=()) != intent_key("t", b, ignore=())
    assert intent_key("t", a, ignore=["uuid", "ts"]) == intent_key("t", b, ignore=["uuid", "ts"])


@pytest.mark.parametrize(
    ("a", "b"),
    [({"amount": 9000.0}, {"amount": "9000"}), ({"ok": True}, {"ok": 1}),
     ({"m": {1: "x"}}, {"m": {"1": "x"}}), ({"to": {"uuid": "acct-1"}}, {"to": {"uuid": "acct-2"}}),
     ({"to": {"nonce": "a"}}, {"to": {"nonce": "b"}}),
     ({"to": {"idempotency_key": "a"}}, {"to": {"idempotency_key": "b"}})],
)  # fmt: skip
def test_another_value_is_another_intent(a: Any, b: Any) -> None:
    """Values that differ in type or in a nested field are different intents."""
    assert intent_key("pay", a) != intent_key("pay", b)


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Item:
    sku: str
    price: decimal.Decimal


class Refund(pydantic.BaseModel):
    order: str
    amount: int


def test_types_agents_pass() -> None:
    """bytes, datetimes, Decimal, UUID, Enum, sets, tuples, dataclasses, pydantic models."""
    u = uuid.UUID(int=7)
    args = {
        "blob": b"\x00\xff", "when": dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC),
        "day": dt.date(2026, 1, 1), "price": decimal.Decimal("1.10"), "id": u,
        "color": Color.RED, "tags": {"b", "a"}, "pair": (1, 2), "item": Item("x", decimal.Decimal("2")),
        "model": Refund(order="A", amount=3),
    }  # fmt: skip
    text = canonical_json(args)
    assert json.loads(text)["tags"] == {"$set": ["a", "b"]}
    same_instant = dict(
        args, when=dt.datetime(2026, 1, 1, 13, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    )
    assert intent_key("t", args) == intent_key("t", same_instant)
    assert intent_key("t", args) == intent_key("t", dict(args, price=decimal.Decimal("1.1")))
    assert intent_key("t", args) == intent_key("t", dict(args, tags={"a", "b"}, pair=[1, 2]))


@pytest.mark.parametrize(
    ("args", "error", "path"),
    [
        ({"items": [{}, {}, {}, {"price": float("nan")}]}, ValueError, "args.items[3].price"),
        ({"x": float("inf")}, ValueError, "args.x"),
        ({"x": decimal.Decimal("NaN")}, ValueError, "args.x"),
        ({"x": [object()]}, TypeError, "args.x[0]"),
        ({"x": {("a", "b"): 1}}, TypeError, "args.x"),
    ],
)
def test_bad_arguments_name_their_path(args: object, error: type[Exception], path: str) -> None:
    """NaN, unknown types and odd keys raise an error naming the path inside the arguments."""
    with pytest.raises(error, match=path.replace("[", r"\[").replace("]", r"\]")):
        intent_key("t", args)


def test_cycles_are_an_error() -> None:
    """A cyclic structure raises a ValueError naming where the cycle closes."""
    a: dict[str, object] = {"x": 1}
    a["self"] = [a]
    with pytest.raises(ValueError, match=r"args.self\[0\]: circular reference"):
        intent_key("t", a)


def test_large_arguments_hash_consistently() -> None:
    """1 MB of arguments hashes (in slices) to the same key every time, and differs on change."""
    big = {"rows": [{"id": i, "text": "x" * 90} for i in range(10_000)]}
    assert len(canonical_json(big)) > 1_000_000
    assert intent_key("t", big) == intent_key("t", big)
    big["rows"][-1]["text"] = "y"
    assert intent_key("t", big) != intent_key(
        "t", {"rows": [{"id": i, "text": "x" * 90} for i in range(10_000)]}
    )


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values)
def test_fast_and_slow_paths_agree(value: object) -> None:
    """The C-speed path and the walk give the same key for the same intent."""
    wrapped = {"v": value, "nested": [{"uuid": "kept", "v": value}], "uuid": "drop-me"}
    stripped = {"v": value, "nested": [{"uuid": "kept", "v": value}]}
    assert intent_key("t", wrapped) == intent_key("t", stripped)
    declared = ["nested.*.uuid"]
    assert intent_key("t", wrapped, ignore=declared) == intent_key(
        "t", {"v": value, "nested": [{"v": value}], "uuid": "drop-me"}, ignore=declared
    )


def test_tool_must_be_named() -> None:
    """An empty tool name is an error."""
    with pytest.raises(ValueError, match="tool must be a non-empty string"):
        intent_key("", {})


_KEYS = st.sampled_from(
    ["a", "b", "id", "uuid", "request_id", "$ref", "$$x", "nonce", "n"]
) | st.text(max_size=4)
_JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=20,
)


@given(_JSONISH)
def test_the_fast_path_and_the_walk_give_the_same_text(args: Any) -> None:
    """Plain inputs take the C encoder; the rest the walk: one text either way."""
    from tether.effects._canonical import VOLATILE_FIELDS, _dumps, _Walk

    top = (
        {k: v for k, v in args.items() if k not in VOLATILE_FIELDS}
        if isinstance(args, dict)
        else args
    )
    try:
        walked = _dumps(_Walk()(top, "args"))
    except ValueError:  # a lone surrogate: both paths refuse it
        with pytest.raises(ValueError):
            canonical_json(args)
        return
    assert canonical_json(args) == walked


def test_intent_keys_match_intent_key_from_one_encoding() -> None:
    from tether.effects._canonical import intent_keys

    args = {"order": "A-1", "amount": 10, "uuid": "fresh"}
    assert intent_keys("refund", args, "tenant-7") == (
        intent_key("refund", args),
        intent_key("refund", args, scope="tenant-7"),
    )
    assert intent_keys("refund", args, "") == (intent_key("refund", args),) * 2
    with pytest.raises(ValueError, match="non-empty"):
        intent_keys("", args, "")
