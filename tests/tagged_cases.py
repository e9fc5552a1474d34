"""Values of every shape the tagged JSON encodes: tests/test_tagged.py checks that the
ledger's result codec and the canonical encoding write them as the code before the shared
codec did (the texts in tests/data/tagged_v1.json, written by that code)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import uuid
from typing import Any


class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


@dataclasses.dataclass
class Point:
    x: int
    y: float


class Model:
    """A pydantic-like model: ``model_dump``."""

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        return {"name": "m", "n": 1}


class Legacy:
    """An object with ``to_dict``."""

    def to_dict(self) -> dict[str, Any]:
        return {"legacy": True}


UTC2 = dt.timezone(dt.timedelta(hours=2))

#: name -> value; each is encoded by JsonCodec, RedactingCodec and canonical_json
CASES: dict[str, Any] = {
    "scalars": {"s": "text", "i": 7, "f": 1.5, "b": True, "n": None},
    "unicode": {"name": "Zoë ✓", "emoji": "🙂"},
    "nested": {"a": [1, [2, [3, {"b": []}]]], "c": {}},
    "decimal": {"amount": decimal.Decimal("49.90"), "neg": decimal.Decimal("-0.001")},
    "decimal_exp": decimal.Decimal("1E+3"),
    "datetime_naive": dt.datetime(2026, 3, 1, 12, 30, 5, 123456),
    "datetime_tz": dt.datetime(2026, 3, 1, 12, 30, tzinfo=UTC2),
    "date": dt.date(2026, 3, 1),
    "time": dt.time(9, 15, 30),
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "bytes": b"\x00\x01binary\xff",
    "bytearray": bytearray(b"abc"),
    "tuple": (1, "two", (3.0,)),
    "set": {3, 1, 2},
    "frozenset": frozenset({5, 4}),  # ints: the order of a set of strings varies by process
    "enum": {"color": Color.RED, "level": Level.HIGH},
    "dollar_keys": {"$dec": "not a tag", "$$x": 1, "plain$": 2},
    "dollar_text": {"note": "$dec", "list": ["$tuple"]},
    "int_keys": {1: "a", 2: "b"},
    "mixed_keys": {1: "a", "1": "b", None: "c", 2.5: "d", False: "e"},
    "tuple_keys": {(1, 2): "pair"},
    "dataclass": Point(1, 2.5),
    "model": Model(),
    "to_dict": Legacy(),
    "deep_tags": {"rows": [{"when": dt.date(2026, 1, 2), "ids": (uuid.UUID(int=1),)}]},
    "secretish": {"api_key": "sk-live-1234567890abcdef", "card": "4242 4242 4242 4242"},
}


def cases() -> dict[str, Any]:
    return dict(CASES)
