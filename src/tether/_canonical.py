"""Canonical encoding of tool arguments, and the intent key built on it.

The encoding is JSON with sorted keys, no whitespace and ASCII only, produced by the
standard library's C encoder; types JSON lacks are tagged (``{"$dt": ...}``,
``{"$set": [...]}``...). Volatile fields that a model invents on every call are left
out at any depth. Inputs without volatile fields take a single C-speed pass; the rare
input that has one, or that fails to encode, goes through a Python walk that strips
the fields and names the exact path of anything it cannot encode.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import decimal
import enum
import hashlib
import json
import math
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["VOLATILE_FIELDS", "canonical_json", "intent_key"]

#: Fields a model (or an SDK) invents anew on every call: never part of an intent.
VOLATILE_FIELDS: frozenset[str] = frozenset(
    {"idempotency_key", "request_id", "client_request_id", "nonce", "uuid", "trace_id"}
)
_PREFIX = b"tether-intent-v1\x00"
_CHUNK = 1 << 16


def _tag(obj: Any) -> Any:
    """A JSON-able stand-in for a value of a type JSON lacks; TypeError if unknown."""
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, _dt.datetime):
        if obj.tzinfo is not None:
            obj = obj.astimezone(_dt.UTC)
        return {"$dt": obj.isoformat()}
    if isinstance(obj, _dt.date):
        return {"$date": obj.isoformat()}
    if isinstance(obj, _dt.time):
        return {"$time": obj.isoformat()}
    if isinstance(obj, decimal.Decimal):
        if not obj.is_finite():
            raise ValueError("NaN and infinite Decimals are not allowed")
        return {"$dec": str(obj.normalize())}
    if isinstance(obj, uuid.UUID):
        return {"$uuid": str(obj)}
    if isinstance(obj, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(obj)).decode("ascii")}
    if isinstance(obj, set | frozenset):
        return {"$set": sorted(obj, key=_dumps)}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        return {"$type": type(obj).__qualname__, **fields}
    dump = getattr(obj, "model_dump", None)  # pydantic v2
    if callable(dump) and not isinstance(obj, type):
        return {"$type": type(obj).__qualname__, **dump(mode="python")}
    to_dict = getattr(obj, "to_dict", None)  # stripe objects and the like
    if callable(to_dict) and not isinstance(obj, type):
        return {"$type": type(obj).__qualname__, **to_dict()}
    raise TypeError(f"cannot encode a {type(obj).__name__}")


_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), allow_nan=False, default=_tag, ensure_ascii=True
)
_dumps = _ENCODER.encode  # one encoder, built once: the C encoder does the work
_NEEDLES: dict[frozenset[str], tuple[str, ...]] = {}


def _needles(drop: frozenset[str]) -> tuple[str, ...]:
    found = _NEEDLES.get(drop)
    if found is None:
        found = tuple(f'"{name}":' for name in drop)
        if len(_NEEDLES) < 64:
            _NEEDLES[drop] = found
    return found


def _strip(obj: Any, drop: frozenset[str], path: str, seen: set[int]) -> Any:
    """A copy of ``obj`` without ``drop`` keys, in JSON types and tags; errors name the path."""
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise ValueError(f"{path}: {obj!r} is not allowed in tool arguments (NaN or infinity)")
        return obj
    if isinstance(obj, Mapping | list | tuple):
        if id(obj) in seen:
            raise ValueError(f"{path}: circular reference in tool arguments")
        seen.add(id(obj))
        try:
            if isinstance(obj, Mapping):
                out = {}
                for k, v in obj.items():
                    if not isinstance(k, str | int | float | bool) and k is not None:
                        raise TypeError(
                            f"{path}: dict key {k!r} is a {type(k).__name__}; use str keys"
                        )
                    if k in drop:
                        continue
                    key = k if isinstance(k, str) else json.dumps(k)  # as json.dumps does
                    out[key] = _strip(v, drop, f"{path}.{k}", seen)
                return out
            return [_strip(v, drop, f"{path}[{i}]", seen) for i, v in enumerate(obj)]
        finally:
            seen.discard(id(obj))
    try:
        tagged = _tag(obj)
    except (TypeError, ValueError) as exc:
        kind = type(exc)
        raise kind(
            f"{path}: {exc}; tool arguments must be JSON types, bytes, datetime, date, Decimal, "
            "UUID, Enum, set, tuple, dataclasses or pydantic models"
        ) from None
    if isinstance(tagged, dict) and "$set" in tagged:
        return {"$set": [_strip(v, drop, f"{path}{{}}", seen) for v in tagged["$set"]]}
    return _strip(tagged, drop, path, seen)


def canonical_json(args: Any, *, ignore: Iterable[str] | None = None, path: str = "args") -> str:
    """The canonical JSON text of ``args``, without the ``ignore`` fields at any depth.

    >>> canonical_json({"b": 1, "a": [1, 2], "request_id": "r-77"})
    '{"a":[1,2],"b":1}'
    """
    drop = VOLATILE_FIELDS if ignore is None else frozenset(ignore)
    try:
        text = _dumps(args)
    except (TypeError, ValueError, RecursionError):
        return _dumps(_strip(args, drop, path, set()))
    if drop and any(needle in text for needle in _needles(drop)):
        return _dumps(_strip(args, drop, path, set()))
    return text


def intent_key(tool: str, args: Any, scope: str = "", ignore: Iterable[str] | None = None) -> str:
    """A stable SHA-256 hex digest of (tool, scope, canonical arguments).

    Key order never matters, list order does, and the volatile fields a model invents
    on every call (``idempotency_key``, ``request_id``, ``client_request_id``,
    ``nonce``, ``uuid``, ``trace_id``) are left out at any depth: the same refund
    re-issued with a fresh UUID has the same key. Pass ``ignore`` to replace that set
    (``ignore=()`` keeps every field). ``scope`` separates runs, customers or tickets.

    >>> a = intent_key("refund", {"order": "A-1", "amount": 10, "uuid": "1f0c"})
    >>> b = intent_key("refund", {"amount": 10, "order": "A-1", "uuid": "9d2e"})
    >>> a == b, len(a)
    (True, 64)
    """
    if not isinstance(tool, str) or not tool:
        raise ValueError(f"tool must be a non-empty string, got {tool!r}")
    text = canonical_json(args, ignore=ignore)
    h = hashlib.sha256(_PREFIX)
    h.update(tool.encode("utf-8"))
    h.update(b"\x00")
    h.update(scope.encode("utf-8"))
    h.update(b"\x00")
    if len(text) <= _CHUNK:
        h.update(text.encode("ascii"))
    else:  # hash a large text in slices: no second full-size copy
        for i in range(0, len(text), _CHUNK):
            h.update(text[i : i + _CHUNK].encode("ascii"))
    return h.hexdigest()
