"""How the ledger stores an effect's result so that a replay returns the same value.

JSON with tags for the types JSON lacks; a replay rebuilds them, so ``Decimal("49.90")``
comes back as ``Decimal("49.90")`` (the trailing zero kept), a tuple as a tuple, bytes
as bytes. A user's own key that starts with ``$`` is written with one more ``$``, and a
mapping with keys that are not strings is written as a list of pairs, so no stored
value can be mistaken for a tag.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import decimal
import enum
import json
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol

__all__ = ["Codec", "JsonCodec", "RedactingCodec"]


class Codec(Protocol):
    """Turns results into text and back."""

    def encode(self, value: Any) -> str: ...
    def decode(self, text: str) -> Any: ...


_DECODERS: dict[str, Callable[[Any], Any]] = {
    "$dec": decimal.Decimal,
    "$dt": _dt.datetime.fromisoformat,
    "$date": _dt.date.fromisoformat,
    "$time": _dt.time.fromisoformat,
    "$uuid": uuid.UUID,
    "$bytes": lambda text: base64.b64decode(text.encode("ascii")),
    "$tuple": tuple,
    "$set": set,
    "$frozenset": frozenset,
    "$map": lambda pairs: {_hashable(k): v for k, v in pairs},
    "$repr": lambda text: {"$repr": text},  # a value that could not be encoded: its repr
}


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


def _to_json(obj: Any, depth: int = 0) -> Any:
    if depth > 200:
        raise ValueError("result nested deeper than 200 levels")
    if obj is None or (
        isinstance(obj, bool | int | float | str) and not isinstance(obj, enum.Enum)
    ):
        return obj
    if isinstance(obj, dict | Mapping):
        if all(isinstance(k, str) for k in obj):
            return {
                ("$" + k if k[:1] == "$" else k): _to_json(v, depth + 1) for k, v in obj.items()
            }
        return {"$map": [[_to_json(k, depth + 1), _to_json(v, depth + 1)] for k, v in obj.items()]}
    if isinstance(obj, list):
        return [_to_json(v, depth + 1) for v in obj]
    if isinstance(obj, tuple):
        return {"$tuple": [_to_json(v, depth + 1) for v in obj]}
    if isinstance(obj, enum.Enum):
        return _to_json(obj.value, depth + 1)
    if isinstance(obj, decimal.Decimal):
        return {"$dec": str(obj)}
    if isinstance(obj, _dt.datetime):
        return {"$dt": obj.isoformat()}
    if isinstance(obj, _dt.date):
        return {"$date": obj.isoformat()}
    if isinstance(obj, _dt.time):
        return {"$time": obj.isoformat()}
    if isinstance(obj, uuid.UUID):
        return {"$uuid": str(obj)}
    if isinstance(obj, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(obj)).decode("ascii")}
    if isinstance(obj, set | frozenset):
        tag = "$set" if isinstance(obj, set) else "$frozenset"
        return {tag: [_to_json(v, depth + 1) for v in obj]}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        return _to_json(fields, depth + 1)
    for method, kwargs in (("model_dump", {"mode": "python"}), ("to_dict", {})):
        fn = getattr(obj, method, None)
        if callable(fn) and not isinstance(obj, type):
            return _to_json(fn(**kwargs), depth + 1)
    raise TypeError(f"cannot store a {type(obj).__name__} as a result")


def _from_json(obj: dict[str, Any]) -> Any:
    if len(obj) == 1:
        ((key, value),) = obj.items()
        decoder = _DECODERS.get(key)
        if decoder is not None:
            return decoder(value)
    return {(k[1:] if k[:2] == "$$" else k): v for k, v in obj.items()}


class JsonCodec:
    """Results as JSON text; Decimal, datetime, date, time, UUID, bytes, tuples and sets
    come back as themselves (dataclasses and pydantic models come back as dicts)."""

    def encode(self, value: Any) -> str:
        return json.dumps(_to_json(value), sort_keys=True, allow_nan=True)

    def decode(self, text: str) -> Any:
        return json.loads(text, object_hook=_from_json)


class RedactingCodec(JsonCodec):
    """:class:`JsonCodec` that stores results with their secrets redacted
    (``tether.redact``): for a ledger in a database people read, such as the one
    ``Guard(records=...)`` keeps. A replay returns the redacted value."""

    def encode(self, value: Any) -> str:
        from tether.redaction._redact import redact_tagged

        return json.dumps(redact_tagged(_to_json(value), _DECODERS), sort_keys=True, allow_nan=True)
