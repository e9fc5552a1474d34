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
def test_volatile_fields_are_dropped_at_any_depth(field: str) -> None:
    """The fresh UUID a model invents on every call does not change the key."""
    a = {"amount": 10, "meta": {"items": [{"sku": "x", field: "one"}]}, field: "one"}
    b = {"amount": 10, "meta": {"items": [{"sku": "x", field: "two"}]}, field: "two"}
    assert intent_key("refund", a) == intent_key("refund", b)
    assert intent_key("refund", a) == intent_key(
        "refund", {"amount": 10, "meta": {"items": [{"sku": "x"}]}}
    )


def test_ignore_replaces_the_volatile_set() -> None:
    """ignore=() keeps every field; a custom set drops just those."""
    a, b = {"uuid": "1", "ts": 1}, {"uuid": "2", "ts": 2}
    assert intent_key("t", a, ignore=()) != intent_key("t", b, ignore=())
    assert intent_key("t", a, ignore=["uuid", "ts"]) == intent_key("t", b, ignore=["uuid", "ts"])


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
    """The C-speed path and the stripping walk give the same key for the same intent."""
    wrapped = {"v": value, "nested": [{"uuid": "drop-me", "v": value}]}
    stripped = {"v": value, "nested": [{"v": value}]}
    assert intent_key("t", wrapped) == intent_key("t", stripped)


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
    from tether._canonical import VOLATILE_FIELDS, _dumps, _Walk

    try:
        walked = _dumps(_Walk(VOLATILE_FIELDS)(args, "args"))
    except ValueError:  # a lone surrogate: both paths refuse it
        with pytest.raises(ValueError):
            canonical_json(args)
        return
    assert canonical_json(args) == walked


def test_intent_keys_match_intent_key_from_one_encoding() -> None:
    from tether._canonical import intent_keys

    args = {"order": "A-1", "amount": 10, "uuid": "fresh"}
    assert intent_keys("refund", args, "tenant-7") == (
        intent_key("refund", args),
        intent_key("refund", args, scope="tenant-7"),
    )
    assert intent_keys("refund", args, "") == (intent_key("refund", args),) * 2
    with pytest.raises(ValueError, match="non-empty"):
        intent_keys("", args, "")
