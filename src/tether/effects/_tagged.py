"""Tagged JSON: the one format in which tether writes values JSON has no type for.

A value of a type JSON lacks becomes a one-key object whose key is a tag
(``{"$dec": "49.90"}``, ``{"$bytes": "..."}``); a user's own key that starts with ``$``
is written with one more ``$`` (:func:`escape_key`), so no stored value can be mistaken
for a tag. Two encoders write it, each walking containers its own way:

* the ledger's result codec (:mod:`tether.effects._codec`), which must give the same
  value back on a replay: ``Decimal("49.90")`` keeps its zero, a tuple is tagged
  ``$tuple``, a frozenset ``$frozenset``, a mapping with other keys is ``$map`` in its
  order, and a dataclass or model becomes its fields;
* the canonical encoding of tool arguments (:mod:`tether.effects._canonical`), which must
  give equal intents one text: a Decimal is normalised (``49.9``), an aware datetime is
  written in UTC, a tuple is a list, sets and ``$map`` pairs are sorted, and a dataclass
  or model is ``$obj`` with its class's name.

Both take the tags and the way each type is written from here (:func:`tag`, with
``canonical`` saying which of the differences above applies); :func:`decode_object`
reads them back.
"""

from __future__ import annotations

import binascii
import dataclasses
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

__all__ = [
    "DECODERS",
    "NO_FIELDS",
    "Tag",
    "decode_object",
    "escape_key",
    "fields_of",
    "tag",
]


class Tag:
    """The tags (the one key of a tagged value)."""

    DEC = "$dec"
    DT = "$dt"
    DATE = "$date"
    TIME = "$time"
    UUID = "$uuid"
    BYTES = "$bytes"
    TUPLE = "$tuple"
    SET = "$set"
    FROZENSET = "$frozenset"
    MAP = "$map"
    OBJ = "$obj"  # canonical only: [class name, fields]
    REPR = "$repr"  # a value that could not be encoded: its repr


def escape_key(key: str) -> str:
    """A user's key as written: one more ``$`` when it starts with ``$``."""
    return "$" + key if key[:1] == "$" else key


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


def _loaded(*names: str) -> ModuleType | None:
    """The first of these modules already imported, else None. A value of the types a tag
    stands for (datetime, Decimal, UUID) cannot exist before its module is imported, so
    :func:`tag` asks only the loaded ones: a run that never meets them never imports them."""
    for name in names:
        found = sys.modules.get(name)
        if found is not None:
            return found
    return None


def _datetime() -> Any:
    import datetime

    return datetime


def _decimal(text: str) -> Any:
    import decimal

    return decimal.Decimal(text)


def _uuid(text: str) -> Any:
    import uuid

    return uuid.UUID(text)


#: tag -> how its value is read back (the result codec's replay); a decoder imports its
#: type's module when a value of it is read
DECODERS: dict[str, Callable[[Any], Any]] = {
    Tag.DEC: _decimal,
    Tag.DT: lambda text: _datetime().datetime.fromisoformat(text),
    Tag.DATE: lambda text: _datetime().date.fromisoformat(text),
    Tag.TIME: lambda text: _datetime().time.fromisoformat(text),
    Tag.UUID: _uuid,
    Tag.BYTES: lambda text: binascii.a2b_base64(text.encode("ascii")),  # as base64.b64decode
    Tag.TUPLE: tuple,
    Tag.SET: set,
    Tag.FROZENSET: frozenset,
    Tag.MAP: lambda pairs: {_hashable(k): v for k, v in pairs},
    Tag.REPR: lambda text: {Tag.REPR: text},
}


def decode_object(obj: dict[str, Any]) -> Any:
    """A JSON object read back (``json.loads``'s ``object_hook``): a tagged value rebuilt,
    else the mapping with its keys unescaped."""
    if len(obj) == 1:
        ((key, value),) = obj.items()
        decoder = DECODERS.get(key)
        if decoder is not None:
            return decoder(value)
    return {(k[1:] if k[:2] == "$$" else k): v for k, v in obj.items()}


#: what :func:`fields_of` answers for an object without fields
NO_FIELDS: Any = object()


def fields_of(obj: Any, *, mapping: bool = True) -> Any:
    """The fields of a dataclass instance, a pydantic model (``model_dump``) or an object
    with ``to_dict``; :data:`NO_FIELDS` for anything else. ``mapping``: only a dump that is
    a mapping counts (the canonical encoding); else the first dump, whatever it holds (the
    result codec)."""
    if isinstance(obj, type):
        return NO_FIELDS
    if dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    for method, kwargs in (("model_dump", {"mode": "python"}), ("to_dict", {})):
        fn = getattr(obj, method, None)
        if callable(fn):
            found = fn(**kwargs)
            if not mapping or isinstance(found, Mapping):
                return found
    return NO_FIELDS


def tag(obj: Any, *, canonical: bool) -> dict[str, Any] | None:
    """The tagged form of a scalar JSON lacks (datetime, date, time, Decimal, UUID, bytes),
    or None for anything else; ``canonical`` normalises (module docstring).

    Raises ValueError for a NaN or infinite Decimal when ``canonical``."""
    if isinstance(obj, bytes | bytearray | memoryview):  # as base64.b64encode
        return {Tag.BYTES: binascii.b2a_base64(bytes(obj), newline=False).decode("ascii")}
    dt = _loaded("datetime", "_datetime")
    if dt is not None:
        if isinstance(obj, dt.datetime):
            if canonical and obj.tzinfo is not None:
                obj = obj.astimezone(dt.timezone.utc)
            return {Tag.DT: obj.isoformat()}
        if isinstance(obj, dt.date):
            return {Tag.DATE: obj.isoformat()}
        if isinstance(obj, dt.time):
            return {Tag.TIME: obj.isoformat()}
    dec = _loaded("decimal", "_decimal")
    if dec is not None and isinstance(obj, dec.Decimal):
        if not canonical:
            return {Tag.DEC: str(obj)}
        if not obj.is_finite():
            raise ValueError("NaN and infinite Decimals are not allowed")
        return {Tag.DEC: str(obj.normalize())}
    ids = _loaded("uuid")
    if ids is not None and isinstance(obj, ids.UUID):
        return {Tag.UUID: str(obj)}
    return None
