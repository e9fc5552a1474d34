"""Canonical encoding of tool arguments, and the intent key built on it.

One encoding, collision-free by construction: JSON with sorted keys, no whitespace and
ASCII only, produced by the standard library's C encoder, where

* types JSON lacks are tagged: ``{"$dt": ...}``, ``{"$bytes": ...}``, ``{"$set": [...]}``;
* a user's own key that starts with ``$`` gets one more ``$`` (``"$bytes"`` is written
  ``"$$bytes"``), so no user value can look like a tag;
* a mapping with any key that is not a string is written as ``{"$map": [[k, v], ...]}``
  sorted by the encoded pair, so ``{1: "a"}`` and ``{"1": "a"}`` differ and int keys
  sort the same way whatever else the mapping holds;
* the request identifiers a model invents on every call are left out, at the top level of
  the arguments only (:data:`VOLATILE_FIELDS`), and at the paths a tool declares
  (``"meta.nonce"``, ``"items.*.request_id"``): a field of that name deeper down is data
  (``to.uuid`` names a payee) and stays part of the intent.

Plain inputs (JSON types, string keys: checked by a quick walk over the containers) are
encoded in one C-speed pass; when anything the rules above must handle shows (a type
JSON lacks, a key that is not a string, nesting past :data:`MAX_DEPTH`, and in the text a
``$`` key or a lone surrogate), the input goes through a walk that applies them and names
the exact path of anything it cannot encode. Both paths give the same text for the same
input.
"""

from __future__ import annotations

import enum
import functools
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tether import _digest
from tether.effects._tagged import NO_FIELDS, Tag, escape_key, fields_of, tag

__all__ = ["MAX_DEPTH", "VOLATILE_FIELDS", "canonical_json", "intent_key"]

#: Request identifiers a model (or an SDK) invents anew on every call: left out of an
#: intent at the top level of the arguments (deeper down, only at paths a tool declares).
VOLATILE_FIELDS: frozenset[str] = frozenset(
    {"idempotency_key", "request_id", "client_request_id", "nonce", "uuid", "trace_id"}
)
#: How deeply arguments may nest.
MAX_DEPTH = 64
#: How deeply arguments whose strings are handed to the record's redaction may nest.
SHALLOW = 32
_PREFIX = b"tether-intent-v2\x00"
_CHUNK = 1 << 16
_SCALARS = frozenset({str, int, float, bool, type(None)})
_LONE_SURROGATE = re.compile(
    r"\\ud[89ab][0-9a-f]{2}(?!\\ud[c-f][0-9a-f]{2})|(?<!\\ud[89ab][0-9a-f]{2})\\ud[c-f][0-9a-f]{2}"
)
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=True
)


def encoder_once(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """``encoder.encode``, its C encoder built once: ``JSONEncoder.encode`` builds one on
    every call, a third of the cost of encoding a small value. The one built here takes
    ``encoder``'s settings and keeps no circular-reference bookkeeping: callers give it
    only trees that cannot hold a cycle (a walk's fresh output, or a value a depth-bound
    check passed). Without the C accelerator, ``encoder.encode`` itself."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None or encoder.indent is not None:  # pragma: no cover - CPython has it
        return encoder.encode
    chunks = make(
        None,  # markers: no circular check
        encoder.default,
        json.encoder.encode_basestring_ascii
        if encoder.ensure_ascii
        else json.encoder.encode_basestring,
        None,  # indent
        encoder.key_separator,
        encoder.item_separator,
        encoder.sort_keys,
        encoder.skipkeys,
        encoder.allow_nan,
    )
    join = "".join

    def encode(value: Any) -> str:
        return join(chunks(value, 0))

    return encode


#: one encoder, built once, no circular check: :func:`_plain` stops a cycle by its depth,
#: the walk refuses one, and its output is a fresh tree
_dumps = encoder_once(_ENCODER)
_TYPES_HINT = (
    "tool arguments must be JSON types, bytes, datetime, date, time, Decimal, UUID, Enum, "
    "set, tuple, dataclasses or pydantic models"
)


_NESTED = frozenset({dict, list, tuple})


def _plain(obj: Any, depth: int, strings: list[str]) -> int | None:
    """The depth of the deepest container in ``obj`` (``depth - 1``: none) when it holds
    only JSON types, string keys and no nesting past MAX_DEPTH: then the C encoder's
    text is canonical, but for ``$`` keys and lone surrogates, that
    :func:`canonical_json` looks for in the text. None when it does not.

    Its keys and string values are added to ``strings`` on the way (what the redaction
    of a recorded call judges, instead of splitting the text to find them again)."""
    kind = type(obj)
    if kind is dict:
        if depth > MAX_DEPTH:
            return None
        for k in obj:
            if type(k) is not str:
                return None
        strings += obj
        values: Iterable[Any] = obj.values()
    elif kind is list or kind is tuple:
        if depth > MAX_DEPTH:
            return None
        values = obj
    elif kind is str:
        strings.append(obj)
        return depth - 1
    else:
        return depth - 1 if kind in _SCALARS else None
    deepest = depth
    for v in values:
        kind = type(v)
        if kind is str:
            strings.append(v)
        elif kind is int or kind is float or kind is bool or v is None:
            continue
        elif kind in _NESTED:
            below = _plain(v, depth + 1, strings)
            if below is None:
                return None
            deepest = below if below > deepest else deepest
        else:
            return None
    return deepest


def _text(value: str, path: str) -> str:
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(
                f"{path}: the text holds a lone surrogate ({value!r}); send valid Unicode"
            ) from None
    return value


def _key(k: str, path: str) -> str:
    escaped = escape_key(k)
    return escaped if escaped is not k else _text(k, path)


class _Walk:
    """The canonical form of a value, in JSON types; errors name the path."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    def __call__(self, obj: Any, path: str, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise ValueError(f"{path}: nested deeper than {MAX_DEPTH} levels")
        if obj is None or isinstance(obj, bool):
            return obj
        if isinstance(obj, int):
            try:
                str(obj)
            except ValueError:
                raise ValueError(
                    f"{path}: an integer too long to print ({obj.bit_length()} bits); pass it as a string"
                ) from None
            return int(obj)
        if isinstance(obj, str):
            return _text(str(obj), path)
        if isinstance(obj, float):
            if not math.isfinite(obj):
                raise ValueError(
                    f"{path}: {obj!r} is not allowed in tool arguments (NaN or infinity)"
                )
            return float(obj)
        if isinstance(obj, Mapping | list | tuple):
            if id(obj) in self.seen:
                raise ValueError(f"{path}: circular reference in tool arguments")
            self.seen.add(id(obj))
            try:
                if isinstance(obj, Mapping):
                    return self._mapping(obj, path, depth)
                return [self(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(obj)]
            finally:
                self.seen.discard(id(obj))
        return self._tagged(obj, path, depth)

    def _mapping(self, obj: Mapping[Any, Any], path: str, depth: int) -> Any:
        if all(isinstance(k, str) for k in obj):
            return {
                _key(k, f"{path}.{k}"): self(v, f"{path}.{k}", depth + 1) for k, v in obj.items()
            }
        pairs = []
        for k, v in obj.items():
            if k is not None and not isinstance(k, str | int | float | bool):
                raise TypeError(f"{path}: dict key {k!r} is a {type(k).__name__}; use str keys")
            sub = f"{path}[{k!r}]"
            pairs.append([self(k, sub, depth + 1), self(v, sub, depth + 1)])
        pairs.sort(key=_dumps)
        return {Tag.MAP: pairs}

    def _tagged(self, obj: Any, path: str, depth: int) -> Any:
        if isinstance(obj, enum.Enum):
            return self(obj.value, path, depth)
        try:
            tagged = tag(obj, canonical=True)
        except ValueError as exc:  # a NaN or infinite Decimal
            raise ValueError(f"{path}: {exc}") from None
        if tagged is not None:
            return tagged
        if isinstance(obj, set | frozenset):
            items = [self(v, f"{path}{{}}", depth + 1) for v in obj]
            return {Tag.SET: sorted(items, key=_dumps)}
        fields = fields_of(obj)
        if fields is not NO_FIELDS:
            return {Tag.OBJ: [type(obj).__qualname__, self(fields, path, depth + 1)]}
        raise TypeError(f"{path}: cannot encode a {type(obj).__name__}; {_TYPES_HINT}")


Paths = Iterable[str | tuple[str, ...]]


@functools.lru_cache(maxsize=256)
def _rules(
    ignore: tuple[str | tuple[str, ...], ...],
) -> tuple[frozenset[str], tuple[tuple[str, ...], ...]]:
    """``ignore`` as (the top-level names, the deeper paths); checked once per set."""
    top: set[str] = set()
    deep: list[tuple[str, ...]] = []
    for entry in ignore:
        parts = tuple(entry.split(".")) if isinstance(entry, str) else tuple(entry)
        if not parts or not all(isinstance(p, str) and p for p in parts):
            raise ValueError(
                f"a volatile path is a field name or dotted path such as 'meta.nonce' or "
                f"'items.*.request_id', got {entry!r}"
            )
        if len(parts) == 1 and parts[0] != "*":
            top.add(parts[0])
        else:
            deep.append(parts)
    return frozenset(top), tuple(deep)


_DEFAULT_RULES = (VOLATILE_FIELDS, ())


def rules(ignore: Paths | None) -> tuple[frozenset[str], tuple[tuple[str, ...], ...]]:
    """The fields left out of an intent: the default top-level request ids for None."""
    if ignore is None:
        return _DEFAULT_RULES
    if isinstance(ignore, str):
        raise TypeError(f"ignore takes a list of field names or paths, got the string {ignore!r}")
    return _rules(tuple(ignore))


def _without(obj: Any, parts: tuple[str, ...]) -> Any:
    """``obj`` without the value at ``parts`` ("*": every key or item); containers on the
    way are copied, everything else is shared; unchanged (the same object) if nothing is
    there."""
    head, rest = parts[0], parts[1:]
    if isinstance(obj, Mapping):
        names = list(obj) if head == "*" else [head] if head in obj else []
        if not names:
            return obj
        out = dict(obj)
        for name in names:
            if not rest:
                del out[name]
            else:
                out[name] = _without(obj[name], rest)
        return out
    if head == "*" and isinstance(obj, list | tuple):
        if not rest:
            return []
        items = [_without(v, rest) for v in obj]
        return items if any(a is not b for a, b in zip(items, obj, strict=True)) else obj
    return obj


def canonical_json(args: Any, *, ignore: Paths | None = None, path: str = "args") -> str:
    """The canonical JSON text of ``args``, without the ``ignore`` fields.

    ``ignore`` names fields of the top level of ``args`` (``"request_id"``) or dotted
    paths into it (``"meta.nonce"``, ``"items.*.uuid"``; a tuple of keys for a key that
    holds a dot); None means :data:`VOLATILE_FIELDS` at the top level, ``()`` keeps
    everything.

    >>> canonical_json({"b": 1, "a": [1, 2], "request_id": "r-77"})
    '{"a":[1,2],"b":1}'
    >>> canonical_json({"to": {"uuid": "acct-1"}, "request_id": "r-77"})
    '{"to":{"uuid":"acct-1"}}'
    """
    return _encoded(args, ignore, path)[0]


def canonical_and_strings(value: Any) -> tuple[str, list[str] | None]:
    """``canonical_json(value, ignore=())`` and the keys and string values its text holds
    (None when they were not collected: see :func:`_encoded`), for the record of a result."""
    return _encoded(value, ())


def _encoded(args: Any, ignore: Paths | None, path: str = "args") -> tuple[str, list[str] | None]:
    """:func:`canonical_json`, and the keys and string values the text holds when it is the
    C encoder's text of the arguments and nests at most :data:`SHALLOW` deep (None when
    the walk made it, whose strings may be escaped or tagged forms of the arguments'
    own, or when it nests deeper: a redaction cuts a value nested past 64 levels of the
    record it is in, and judges such a text by walking it)."""
    top, deep = rules(ignore)
    if top and type(args) is dict and not top.isdisjoint(args):  # isdisjoint: a C loop
        args = {k: v for k, v in args.items() if k not in top}
    elif top and type(args) is not dict and isinstance(args, Mapping):
        args = {k: v for k, v in args.items() if not (isinstance(k, str) and k in top)}
    for parts in deep:
        args = _without(args, parts)
    strings: list[str] = []
    deepest = _plain(args, 0, strings)
    if deepest is not None:
        try:
            text = _dumps(args)
        except (ValueError, RecursionError):
            pass  # NaN, an integer too long to print: the walk names the path
        else:
            # what the walk must handle shows in the text: a "$" key (or a text starting
            # with "$": the walk then changes nothing), a lone surrogate. One-character
            # searches first: they run at memchr speed and almost never hit
            if not (
                ("$" in text and '"$' in text)
                or ("\\" in text and "\\ud" in text and _LONE_SURROGATE.search(text) is not None)
            ):
                return text, (strings if deepest <= SHALLOW else None)
    return _dumps(_Walk()(args, path)), None


def intent_key(tool: str, args: Any, scope: str = "", ignore: Paths | None = None) -> str:
    """A stable SHA-256 hex digest of (tool, scope, canonical arguments).

    Key order never matters, list order does, and the request ids a model invents on
    every call (``idempotency_key``, ``request_id``, ``client_request_id``, ``nonce``,
    ``uuid``, ``trace_id``) are left out at the top level of ``args``: the same refund
    re-issued with a fresh UUID has the same key, while ``{"to": {"uuid": "acct-2"}}``
    names another payee than ``acct-1``. Pass ``ignore`` to replace that set (field
    names and dotted paths such as ``"meta.nonce"``; ``ignore=()`` keeps every field).
    ``scope`` separates runs, customers or tickets.

    >>> a = intent_key("refund", {"order": "A-1", "amount": 10, "uuid": "1f0c"})
    >>> b = intent_key("refund", {"amount": 10, "order": "A-1", "uuid": "9d2e"})
    >>> a == b, len(a)
    (True, 64)
    """
    _check(tool, scope)
    return digest(tool, canonical_json(args, ignore=ignore), scope)


def intent_keys(tool: str, args: Any, scope: str, ignore: Paths | None = None) -> tuple[str, str]:
    """``(intent_key(tool, args), intent_key(tool, args, scope))`` from one encoding of
    the arguments (a run needs the first for its loop checks and approvals, the second
    for its ledger)."""
    _check(tool, scope)
    text = canonical_json(args, ignore=ignore)
    action = digest(tool, text)
    return action, (digest(tool, text, scope) if scope else action)


def intent_keys_and_text(
    tool: str, args: Any, scope: str, ignore: Paths | None = None
) -> tuple[str, str, str | None, list[str] | None]:
    """:func:`intent_keys`, the canonical text they were made from, when that text holds
    every argument (nothing was ignored: the run records the call from it), else None,
    and the keys and string values of that text when they are the arguments' own (what
    the record's redaction judges without splitting the text), else None."""
    _check(tool, scope)
    action, encoded, text, strings = intent_and_text(tool, args, ignore)
    key = digest(tool, encoded, scope) if scope else action
    return action, key, text, strings


def intent_and_text(
    tool: str, args: Any, ignore: Paths | None = None
) -> tuple[str, str, str | None, list[str] | None]:
    """:func:`intent_keys_and_text` without the scoped key: the intent, the canonical text
    it was made from (``digest(tool, encoded, scope)`` is the scoped key, made when it is
    needed: a read's call that succeeds never needs it), that text when it holds every
    argument, and its keys and string values when they are the arguments' own."""
    if not isinstance(tool, str) or not tool:
        raise ValueError(f"tool must be a non-empty string, got {tool!r}")
    top, deep = rules(ignore)
    whole = not deep and (
        not top
        # a dict first: isinstance of an ABC runs Python code (abc's __instancecheck__)
        or (type(args) is not dict and not isinstance(args, Mapping))
        or top.isdisjoint(args)
    )
    text, strings = _encoded(args, ignore)
    return digest(tool, text), text, (text if whole else None), (strings if whole else None)


def _check(tool: str, scope: str) -> None:
    if not isinstance(tool, str) or not tool:
        raise ValueError(f"tool must be a non-empty string, got {tool!r}")
    if not isinstance(scope, str):
        raise TypeError(f'scope must be a str (use "" for none), got {scope!r}')


def digest(tool: str, text: str, scope: str = "") -> str:
    """The SHA-256 hex digest of (tool, scope, the canonical text of the arguments)."""
    head = b"%s%s\x00%s\x00" % (_PREFIX, tool.encode("utf-8"), scope.encode("utf-8"))
    if len(text) <= _CHUNK:
        return _digest.sha256(head + text.encode("ascii")).hexdigest()
    _digest.spend(len(text))  # hash a large text in slices: no second full-size copy
    h = _digest.sha256(head)
    for i in range(0, len(text), _CHUNK):
        h.update(text[i : i + _CHUNK].encode("ascii"))
    return h.hexdigest()


def jsonable(value: Any) -> Any:
    """``value`` as JSON types (its canonical form; ``repr`` for what has none), for the
    records that leave tether: checkpoints, run records, approvals, the journal."""
    try:
        return json.loads(canonical_json(value, ignore=()))
    except (TypeError, ValueError):
        return json.loads(json.dumps(value, default=repr))
