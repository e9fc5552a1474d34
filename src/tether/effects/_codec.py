"""How the ledger stores an effect's result so that a replay returns the same value.

Tagged JSON (:mod:`tether.effects._tagged`, the format the canonical encoding of
arguments writes too) for the types JSON lacks; a replay rebuilds them, so ``Decimal("49.90")``
comes back as ``Decimal("49.90")`` (the trailing zero kept), a tuple as a tuple, bytes
as bytes. A user's own key that starts with ``$`` is written with one more ``$``, and a
mapping with keys that are not strings is written as a list of pairs, so no stored
value can be mistaken for a tag.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from typing import Any, Protocol

from tether.effects._canonical import encoder_once
from tether.effects._tagged import (
    DECODERS,
    NO_FIELDS,
    Tag,
    decode_object,
    escape_key,
    fields_of,
    tag,
)

__all__ = ["Codec", "JsonCodec", "RedactingCodec"]


class Codec(Protocol):
    """Turns results into text and back."""

    def encode(self, value: Any) -> str: ...
    def decode(self, text: str) -> Any: ...


#: ``json.dumps(value, sort_keys=True, allow_nan=True)`` with its C encoder built once; no
#: circular check: it only ever sees the fresh tree :func:`_to_json` builds, whose depth
#: limit stops a cycle first
_encode = encoder_once(json.JSONEncoder(sort_keys=True, allow_nan=True, check_circular=False))
#: the types :func:`_to_json` returns as they are, looked up by exact type first
_PLAIN = frozenset({str, int, float, bool, type(None)})


def _to_json(obj: Any, depth: int = 0) -> Any:
    """``obj`` in JSON types, tagged so that :func:`decode_object` gives it back."""
    if depth > 200:
        raise ValueError("result nested deeper than 200 levels")
    cls = type(obj)
    if cls in _PLAIN:  # the common case, before the isinstance checks below
        return obj
    if cls is dict:
        return _dict_to_json(obj, depth)
    if obj is None or (
        isinstance(obj, bool | int | float | str) and not isinstance(obj, enum.Enum)
    ):
        return obj
    if isinstance(obj, dict | Mapping):
        if all(isinstance(k, str) for k in obj):
            return {escape_key(k): _to_json(v, depth + 1) for k, v in obj.items()}
        pairs = [[_to_json(k, depth + 1), _to_json(v, depth + 1)] for k, v in obj.items()]
        return {Tag.MAP: pairs}
    if isinstance(obj, list):
        return [_to_json(v, depth + 1) for v in obj]
    if isinstance(obj, tuple):
        return {Tag.TUPLE: [_to_json(v, depth + 1) for v in obj]}
    if isinstance(obj, enum.Enum):
        return _to_json(obj.value, depth + 1)
    tagged = tag(obj, canonical=False)
    if tagged is not None:
        return tagged
    if isinstance(obj, set | frozenset):
        name = Tag.SET if isinstance(obj, set) else Tag.FROZENSET
        return {name: [_to_json(v, depth + 1) for v in obj]}
    fields = fields_of(obj, mapping=False)
    if fields is not NO_FIELDS:
        return _to_json(fields, depth + 1)
    raise TypeError(f"cannot store a {type(obj).__name__} as a result")


def _dict_to_json(obj: dict[Any, Any], depth: int) -> Any:
    """A plain dict in JSON types: the mapping branch of :func:`_to_json` in one loop
    (a dict of plain values, the usual result, costs no call per value). A dict that is
    JSON as it is (string keys without a ``$``, plain values) is returned itself: the
    encoders only read it."""
    if depth < 200:
        for k, v in obj.items():
            if type(k) is not str or k[:1] == "$" or type(v) not in _PLAIN:
                return _dict_rebuilt(obj, depth)
        return obj
    return _dict_rebuilt(obj, depth)


def _dict_rebuilt(obj: dict[Any, Any], depth: int) -> Any:
    """:func:`_dict_to_json` for a dict that changes: a new dict, or a ``$map``."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        if not isinstance(k, str):  # keys that are not strings: a list of pairs
            pairs = [[_to_json(k, depth + 1), _to_json(v, depth + 1)] for k, v in obj.items()]
            return {Tag.MAP: pairs}
        if depth >= 200 or type(v) not in _PLAIN:  # depth + 1 > 200 raises in _to_json
            v = _to_json(v, depth + 1)
        out["$" + k if k[:1] == "$" else k] = v  # escape_key, inlined
    return out


class JsonCodec:
    """Results as JSON text; Decimal, datetime, date, time, UUID, bytes, tuples and sets
    come back as themselves (dataclasses and pydantic models come back as dicts)."""

    def encode(self, value: Any) -> str:
        if type(value) is dict:  # the usual result: one call less
            return _encode(_dict_to_json(value, 0))
        return _encode(_to_json(value))

    def decode(self, text: str) -> Any:
        return json.loads(text, object_hook=decode_object)


class RedactingCodec(JsonCodec):
    """:class:`JsonCodec` that stores results with their secrets redacted
    (``tether.redact``): for a ledger in a database people read, such as the one
    ``Guard(records=...)`` keeps. A replay returns the redacted value."""

    def encode(self, value: Any) -> str:
        from tether.redaction._redact import redact_tagged

        return _encode(redact_tagged(_to_json(value), DECODERS))
