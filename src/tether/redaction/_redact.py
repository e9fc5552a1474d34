"""Secrets out of everything tether writes or says: one redaction, applied at every boundary.

Structured data is redacted by field name, at any depth (``password``, ``api_key``,
``accessToken``, ``X-Api-Key``... see :data:`SECRET_NAMES`), also in headers given as a list
of ``(name, value)`` pairs and in ``{"name": "api_key", "value": ...}`` records; free text by
pattern: private keys (PEM blocks), credentials in URLs (``user:pass@``, ``TOKEN@``),
``Bearer``/``Basic`` values, ``name=value`` / ``name: value`` / ``"name": "value"`` pairs of
the secret names (also in object reprs, query strings and connection strings: Azure's
``AccountKey=``, ``SharedAccessKey=``, a SAS ``sig=``), "my password is ..." in prose, the
shapes of provider keys and card numbers.

The shapes are those the maintained secret scanners know (gitleaks' rules, detect-secrets'
plugins; the rule ids are noted beside each one), written here: the core imports only the
standard library, and a scanner built for repositories flags every high-entropy word of a
line and takes hundreds of microseconds on it.

Some names are secrets only when their value looks like one (:data:`WEAK_NAMES`:
``session``, ``auth``, ``token``, ``pin``, ``signature``...): ``session: 3 steps`` and
``auth: ok`` stay readable, ``token=tok9f8e7d6c5b4a`` does not. A digit run is a card
number only when it passes the Luhn check, has the length of a card of its issuer's range
(Visa, Mastercard, Amex, Discover, JCB, Diners, UnionPay, Maestro, Mir...) and is not
named an order, invoice, reference, id or timestamp: nanosecond timestamps and order
numbers stay. Redacting twice gives what redacting once gave.

Personal data (e-mail addresses, phone numbers) is masked where ``pii=True`` is asked: in
what the model reads of a failure and on the operator page, unless
``register_secrets(mask_pii=False)``. Add your own names and patterns with
:func:`register_secrets` (``tether serve --secrets module:fn`` loads the same).
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any

from tether.redaction._clean import clean_json, clean_strings
from tether.redaction._secret_names import (
    _BUILTIN_NAMES,
    REDACTED,
    SECRET_NAMES,
    WEAK_NAMES,
    _extra_patterns,
    _lock,
    _normalise,
    _state,
    _tier,
    _tiers,
    _weak_secret,
)
from tether.redaction._secret_text import _P, EMAIL_MASK, PHONE_MASK
from tether.redaction._secret_text import _text as _text

__all__ = [
    "RecordedEntry",
    "EMAIL_MASK",
    "PHONE_MASK",
    "REDACTED",
    "SECRET_NAMES",
    "WEAK_NAMES",
    "add_secret_names",
    "add_secret_patterns",
    "load_secrets",
    "masks_pii",
    "redact",
    "redact_conversation",
    "redact_text",
    "redacted_entries",
    "redacted_json",
    "redacted_paths",
    "register_secrets",
    "safe_url",
]


def register_secrets(
    names: Iterable[str] = (),
    patterns: Iterable[str | re.Pattern[str]] = (),
    *,
    mask_pii: bool | None = None,
) -> None:
    """Your own secrets, redacted everywhere tether writes or says from now on.

    ``names``: field names whose values are secrets (structured data, ``name=value`` text);
    ``patterns``: regular expressions of your own key shapes; ``mask_pii``: whether what the
    model reads of a failure and the operator page mask e-mail addresses and phone numbers
    (True by default). ``tether serve --secrets module:fn`` calls the same.

    >>> register_secrets(names=["license_code"], patterns=[r"\\bACME-[0-9A-F]{12}\\b"])
    >>> redact({"license_code": "X-1", "note": "key ACME-0123456789AB"})
    {'license_code': '[redacted]', 'note': 'key [redacted]'}
    """
    if isinstance(names, str) or isinstance(patterns, str | re.Pattern):
        raise TypeError("names and patterns take lists (names=['license_code'])")
    compiled = []
    for p in patterns:
        try:
            compiled.append(re.compile(p) if isinstance(p, str) else p)
        except re.error as exc:
            raise ValueError(f"patterns: {p!r} is not a regular expression ({exc})") from exc
        if not isinstance(compiled[-1], re.Pattern):
            raise TypeError(f"patterns take strings or compiled patterns, got {p!r}")
    if mask_pii is not None and not isinstance(mask_pii, bool):
        raise TypeError(f"mask_pii must be True, False or None, got {mask_pii!r}")
    with _lock:
        for name in names:
            if not isinstance(name, str) or not name.strip():
                raise ValueError(f"names take non-empty strings, got {name!r}")
            n = _normalise(name)
            SECRET_NAMES.add(n)
            _state.setdefault("strong_added", set()).add(n)
        _extra_patterns.extend(compiled)
        if mask_pii is not None:
            _state["mask_pii"] = mask_pii
        _state.pop("compiled", None)
        _tiers.clear()


_SETTINGS = ("names", "patterns", "mask_pii")


def load_secrets(spec: str) -> None:
    """Register the secrets ``spec`` gives (``tether serve --secrets``): a TOML or JSON
    file with ``names``, ``patterns`` and ``mask_pii``; or ``module:fn``, imported from the
    current directory, where ``fn()`` returns such a mapping (or registers them itself with
    :func:`register_secrets` and returns None).

    Raises ValueError (or ImportError, OSError) saying what is wrong with ``spec``.
    """
    import os

    if spec.endswith((".toml", ".json")) or os.path.isfile(spec):
        with open(spec, "rb") as f:
            raw = f.read()
        if spec.endswith(".json"):
            import json

            settings: Any = json.loads(raw)
        else:
            import tomllib

            settings = tomllib.loads(raw.decode())
    else:
        module, _, name = spec.partition(":")
        if not module or not name:
            raise ValueError("give a TOML or JSON file, or module:function")
        import importlib
        import sys

        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        found = getattr(importlib.import_module(module), name)
        settings = found() if callable(found) else found
        if settings is None:
            return
    if not isinstance(settings, Mapping):
        raise ValueError(f"expected a mapping of {', '.join(_SETTINGS)}, got {settings!r:.80}")
    unknown = sorted(set(settings) - set(_SETTINGS))
    if unknown:
        raise ValueError(f"unknown setting {unknown[0]!r} (known: {', '.join(_SETTINGS)})")
    register_secrets(
        names=settings.get("names", ()),
        patterns=settings.get("patterns", ()),
        mask_pii=settings.get("mask_pii"),
    )


def add_secret_names(*names: str) -> None:
    """Treat these field names as secrets too (structured data and ``name=value`` text)."""
    register_secrets(names=[n for n in names if n])


def add_secret_patterns(*patterns: str | re.Pattern[str]) -> None:
    """Redact text matching these regular expressions too (e.g. your own key shapes)."""
    register_secrets(patterns=patterns)


def masks_pii() -> bool:
    """Whether the model's and the operator page's texts mask e-mail addresses and phone
    numbers (``register_secrets(mask_pii=...)``; True by default)."""
    return bool(_state["mask_pii"])


def _reset() -> None:
    """Forget the user's names, patterns and settings (tether.testing.reset)."""
    with _lock:
        SECRET_NAMES.difference_update(_state.pop("strong_added", set()) - _BUILTIN_NAMES)
        _extra_patterns.clear()
        _state["mask_pii"] = True
        _state.pop("compiled", None)
        _tiers.clear()


def redact_text(text: str, *, pii: bool = False) -> str:
    """``text`` with every secret the patterns know replaced by ``[redacted]``; with
    ``pii=True`` e-mail addresses and phone numbers masked too."""
    return _text(text, pii, "") if len(text) >= 5 else text


def redact(value: Any, *, extra: re.Pattern[str] | None = None, pii: bool = False) -> Any:
    """A copy of ``value`` with its secrets replaced: fields by name at any depth, text
    by pattern; other objects by their redacted ``repr``. ``pii=True`` masks e-mail
    addresses and phone numbers too.

    >>> redact({"order": "A-1", "api_key": "sk-live-123", "note": "token=abc123def456"})
    {'order': 'A-1', 'api_key': '[redacted]', 'note': 'token=[redacted]'}
    """
    return _redact(value, extra, pii, 0, "")


def _redact(value: Any, extra: re.Pattern[str] | None, pii: bool, depth: int, key: str) -> Any:
    if extra is None:
        return _plain(value, pii, depth, key)
    return _any(value, extra, pii, depth, key)


def _plain(value: Any, pii: bool, depth: int, key: str) -> Any:
    """:func:`_any` without ``extra``, the plain JSON types taken without a call each (the
    leaves are most of a value): the same result, in a third of the time."""
    kind = type(value)
    if kind is str:
        return _text(value, pii, key) if len(value) >= 5 else value
    if value is None or kind is int or kind is float or kind is bool:
        return value
    if depth > 64 or (kind is not dict and kind is not list and kind is not tuple):
        return _any(value, None, pii, depth, key)  # subclasses, other mappings, objects
    if kind is dict:
        out: dict[Any, Any] = {}
        tiers = _tiers
        for k, v in value.items():
            name = k if type(k) is str else str(k)
            tier = tiers.get(name)
            if tier is None:
                tier = _tier(name)
            if tier and (
                (tier == 2 and v not in (None, "") and type(v) is not bool)
                or (tier == 1 and _weak_secret(v))
            ):
                out[k] = REDACTED
                continue
            vk = type(v)
            if vk is str:
                out[k] = _text(v, pii, name) if len(v) >= 5 else v
            elif v is None or vk is int or vk is float or vk is bool:
                out[k] = v
            else:
                out[k] = _plain(v, pii, depth + 1, name)
        return _named_value(value, out) if "value" in out else out
    items: list[Any] = []
    for v in value:
        vk = type(v)
        if vk is str:
            items.append(_text(v, pii, key) if len(v) >= 5 else v)
        elif v is None or vk is int or vk is float or vk is bool:
            items.append(v)
        else:
            items.append(_secret_pair(v) or _plain(v, pii, depth + 1, key))
    return items


def _scrub(value: Any, depth: int, key: str, memo: dict[tuple[str, bool, str], str]) -> Any:
    """:func:`_plain` (no ``pii``) of a value ``json.loads`` just made, redacted in place:
    the parsed value is private, so its containers are kept instead of copied, and each
    text is looked up in the memo before it is scanned."""
    kind = type(value)
    if kind is str:
        if len(value) < 5:
            return value
        found = memo.get((value, False, key))
        return found if found is not None else _text(value, False, key)
    if kind is dict:
        if depth > 64:
            return REDACTED
        # {"name": "api_key", "value": ...}: the name as given, before it is redacted
        named = (
            value.get("name", value.get("key", value.get("header"))) if "value" in value else None
        )
        tiers = _tiers
        for k, v in value.items():
            tier = tiers.get(k)
            if tier is None:
                tier = _tier(k)
            if tier and (
                (tier == 2 and v not in (None, "") and type(v) is not bool)
                or (tier == 1 and _weak_secret(v))
            ):
                value[k] = REDACTED
                continue
            vk = type(v)
            if vk is str:
                if len(v) >= 5:
                    found = memo.get((v, False, k))
                    value[k] = found if found is not None else _text(v, False, k)
            elif vk is dict or vk is list:
                value[k] = _scrub(v, depth + 1, k, memo)
        if isinstance(named, str) and _tier(named) and value["value"] not in (None, ""):
            value["value"] = REDACTED
        return value
    if kind is list:
        if depth > 64:
            return REDACTED
        for i, v in enumerate(value):
            vk = type(v)
            if vk is str:
                if len(v) >= 5:
                    found = memo.get((v, False, key))
                    value[i] = found if found is not None else _text(v, False, key)
            elif vk is dict or vk is list:
                value[i] = _secret_pair(v) or _scrub(v, depth + 1, key, memo)
        return value
    return value  # numbers, booleans, None: JSON has nothing else


def _memo() -> dict[tuple[str, bool, str], str]:
    from tether.redaction._secret_text import _compiled

    memo: dict[tuple[str, bool, str], str] = _compiled()["memo"]
    return memo


def _any(value: Any, extra: re.Pattern[str] | None, pii: bool, depth: int, key: str) -> Any:
    kind = type(value)
    if kind is str or isinstance(value, str):
        text = _text(value, pii, key) if len(value) >= 5 else value
        return extra.sub(REDACTED, text) if extra is not None else text
    if value is None or kind is int or kind is float or kind is bool:
        return value
    if isinstance(value, bool | int | float):
        return value
    if depth > 64:
        return REDACTED
    if kind is dict or isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            name = str(k)
            tier = 2 if extra is not None and extra.search(name) else _tier(name)
            if (tier == 2 and v not in (None, "") and type(v) is not bool) or (
                tier == 1 and _weak_secret(v)
            ):
                out[k] = REDACTED
            else:
                out[k] = _redact(v, extra, pii, depth + 1, name)
        return _named_value(value, out)
    if isinstance(value, list | tuple):
        return [_secret_pair(v) or _redact(v, extra, pii, depth + 1, key) for v in value]
    return _redact(repr(value), extra, pii, depth + 1, key)


_THINKING = frozenset({"thinking", "redacted_thinking", "reasoning"})


_THOUGHT_TEXT = frozenset({"thinking", "content", "text", "summary"})


def redacted_json(value: Any, text: str | None = None) -> Any:
    """The JSON form of ``value`` with its secrets redacted: what every audience of a run
    (its outcome, checkpoint, handoff and record) reads of a recorded value, made once
    when the value is recorded. ``text`` is the value's canonical JSON when the caller
    has encoded it already (the intent key did): it is parsed, not encoded again. A value
    JSON cannot hold is taken as its ``repr``, like :func:`redact` does.

    >>> redacted_json({"card": "4242 4242 4242 4242", "n": 1}, '{"card":"4242 4242 4242 4242","n":1}')
    {'card': '[redacted]', 'n': 1}
    """
    import json

    if text is None:
        try:
            text = json.dumps(value, ensure_ascii=False, default=repr)
        except (TypeError, ValueError):  # a circular value, a key JSON cannot hold
            return _redact(repr(value), None, False, 0, "")
    parsed = json.loads(text)
    return parsed if clean_json(text) else _scrub(parsed, 0, "", _memo())


class RecordedEntry(Mapping[str, Any]):
    """An entry a run records (a completed tool call: ``step``, ``tool``, ``args``,
    ``result``) with the canonical JSON its fields were encoded to already (the intent
    key encoded the arguments, the progress check the result), and, where the encoding
    collected them, the keys and string values a text holds (``strings``: judged as
    they are, the text is not split to find them).

    :meth:`redacted` turns it into its redacted JSON view (what the outcome, a
    checkpoint, a handoff and the run record hold), once: no raw argument or result is
    kept alive after it. A call whose texts are known to redact to themselves (most:
    see :mod:`tether.redaction._clean`) keeps them as they are, and its view is parsed
    from them when it is first read (a field, ``dict(entry)``, a comparison): a run
    that keeps its last 1,000 calls parses none of the calls it lets go, nor any its
    audiences never read. Any other call is scrubbed at once. Until :meth:`redacted`
    it reads as the raw call.

    A read-only mapping, not a dict: every read goes through the methods below, so
    nothing can see a text where its view belongs.
    """

    __slots__ = ("_entry", "_kept", "_names", "_strings", "_texts")

    def __init__(
        self,
        entry: Mapping[str, Any],
        texts: Mapping[str, str | None],
        strings: Mapping[str, Collection[str] | None] | None = None,
    ) -> None:
        #: the raw call, then its view (None while the view is kept as texts)
        self._entry: dict[str, Any] | None = dict(entry)
        #: the fields with the texts of the view (None once it is made), and the names of
        #: the text fields (one shared tuple: a run keeps a thousand entries)
        self._kept: dict[str, Any] | None = None
        self._names: tuple[str, ...] = ()
        self._texts: Mapping[str, str | None] | None = texts  # None once redacted
        self._strings = strings

    def redacted(self, jsonable: Any) -> RecordedEntry:
        """This entry as its redacted JSON view (decided on the first call); ``jsonable``
        gives the JSON form of a field it has no text for."""
        texts, entry = self._texts, self._entry
        if texts is None or entry is None:
            return self
        held = self._strings or {}
        form: dict[str, Any] = {}
        parsed: list[str] = []
        judged = list(entry)  # the strings judged together below (one set look-up)
        clean = True  # most calls hold no secret: no walk then
        for name, value in entry.items():
            text = texts.get(name)
            if text is not None:
                form[name] = text  # parsed when read (or below, to be scrubbed)
                parsed.append(name)
                strings = held.get(name)
                if strings is not None:
                    judged += strings
                else:
                    clean = clean and clean_json(text)
            elif value is None or type(value) in (int, bool):  # its own JSON form
                form[name] = value
            elif type(value) is str:
                form[name] = value
                judged.append(value)
            else:
                form[name] = jsonable(value)
                clean = False
        clean = clean and clean_strings(judged)
        self._texts = self._strings = None
        if clean:  # the texts redact to themselves: kept, and parsed when read
            self._names = _NAMES.setdefault(tuple(parsed), tuple(parsed))
            self._kept, self._entry = form, None
        else:
            self._entry = _parsed(form, parsed)
            _scrub(self._entry, 0, "", _memo())
        return self

    def _view(self) -> dict[str, Any]:
        """The entry's fields, its kept texts parsed (once: threads reading at once get the
        same view)."""
        entry = self._entry
        if entry is not None:
            return entry
        with _PARSING:
            entry = self._entry
            if entry is None:
                entry = _parsed(self._kept or {}, self._names)
                self._entry, self._kept = entry, None
        return entry

    def _fields(self) -> dict[str, Any]:
        """The fields as they are held (their names are the view's, in its order)."""
        kept = self._kept
        return kept if kept is not None else self._view()

    def __getitem__(self, name: str) -> Any:
        kept = self._kept
        if kept is not None and name not in self._names:
            return kept[name]  # a field kept as it is (step, tool): nothing to parse
        return self._view()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields())

    def __len__(self) -> int:
        return len(self._fields())

    def __contains__(self, name: object) -> bool:
        return name in self._fields()

    def __repr__(self) -> str:
        return repr(self._view())


_PARSING = threading.Lock()  # held only while a kept entry's texts are parsed

#: the tuples of text field names entries share (("args", "result"), ("args",)...)
_NAMES: dict[tuple[str, ...], tuple[str, ...]] = {}


def _parsed(fields: dict[str, Any], texts: Collection[str]) -> dict[str, Any]:
    """``fields`` with its ``texts`` fields parsed from their JSON."""
    import json

    return {name: json.loads(v) if name in texts else v for name, v in fields.items()}


class PlainEntry(dict[str, Any]):
    """An entry read back from a run's snapshot: JSON already, in the form (escaped and
    redacted) it was written in, so it is kept as it is. Encoding it again would escape
    its ``$`` names once more at every snapshot and cost a walk of every entry per
    snapshot (a framework takes one at each of its hooks)."""

    __slots__ = ()


def redacted_entries(entries: Iterable[Any], jsonable: Any) -> list[dict[str, Any]]:
    """Entries as their audiences read them, as plain dicts: each :class:`RecordedEntry`
    by its view (made once), any other (restored from a checkpoint, redacted when it was
    written) redacted as ``redact(jsonable(entry))`` always did."""
    out: list[dict[str, Any]] = []
    for entry in entries:
        if isinstance(entry, RecordedEntry):
            out.append(dict(entry.redacted(jsonable)._view()))
        elif isinstance(entry, PlainEntry):  # JSON already: redacted again, not re-encoded
            out.append(_redact(dict(entry), None, False, 0, ""))
        else:
            out.append(_redact(jsonable(entry), None, False, 0, ""))
    return out


def redact_conversation(messages: Iterable[Any], *, keep_last: bool = False) -> tuple[Any, ...]:
    """A conversation in its provider's own format with its secrets redacted: dicts stay
    dicts, a framework's message objects (dataclasses, pydantic models) are copied with the
    redacted fields. A thinking block keeps its signature (the provider checks it);
    ``keep_last`` keeps the last turn as the model wrote it (the tool calls a resumed run
    makes must keep their arguments)."""
    items = list(messages)
    last = len(items) - 1 if keep_last else len(items)
    if keep_last:  # a flat list of items (the Agents SDK): every trailing function call
        while (
            last > 0
            and isinstance(items[last - 1], Mapping)
            and items[last - 1].get("type") == "function_call"
        ):
            last -= 1
    return tuple(_copy(m, 0) if i < last else m for i, m in enumerate(items))


def _copy(value: Any, depth: int, thought: bool = False) -> Any:
    """``value`` redacted, each part in its own type (see :func:`redact_conversation`)."""
    if isinstance(value, str):
        return _text(value, False, "") if len(value) >= 5 else value
    if value is None or isinstance(value, bool | int | float) or depth > 32:
        return value
    if isinstance(value, Mapping):
        kind = value.get("type")
        if kind in _THINKING:
            return {k: _copy(v, depth + 1) if k in _THOUGHT_TEXT else v for k, v in value.items()}
        return _named_value(value, {k: _field(str(k), v, depth) for k, v in value.items()})
    if isinstance(value, list | tuple):
        items = [_secret_pair(v) or _copy(v, depth + 1) for v in value]
        return items if isinstance(value, list) else tuple(items)
    thinking = getattr(value, "part_kind", None) == "thinking"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = [f.name for f in dataclasses.fields(value) if f.init]
        changes = _changes(value, names, depth, thinking)
        return dataclasses.replace(value, **changes) if changes else value
    fields = getattr(type(value), "model_fields", None)
    if isinstance(fields, Mapping) and callable(getattr(value, "model_copy", None)):  # pydantic
        changes = _changes(value, list(fields), depth, thinking)
        return value.model_copy(update=changes) if changes else value
    return value


def _field(name: str, value: Any, depth: int) -> Any:
    tier = _tier(name)
    if (tier == 2 and value not in (None, "") and type(value) is not bool) or (
        tier == 1 and _weak_secret(value)
    ):
        return REDACTED
    return _copy(value, depth + 1)


def _changes(value: Any, names: list[str], depth: int, thinking: bool) -> dict[str, Any]:
    changes = {}
    for name in names:
        if thinking and name not in _THOUGHT_TEXT:
            continue  # a thinking part's signature and id stay as the provider gave them
        old = getattr(value, name, None)
        new = _field(name, old, depth)
        if new is not old and new != old:
            changes[name] = new
    return changes


def _named_value(value: Mapping[Any, Any], out: dict[Any, Any]) -> dict[Any, Any]:
    """``{"name": "api_key", "value": "..."}``: the value of a field named a secret."""
    named = value.get("name", value.get("key", value.get("header")))
    if (
        "value" in out
        and isinstance(named, str)
        and _tier(named)
        and out["value"] not in (None, "")
    ):
        out["value"] = REDACTED
    return out


def _secret_pair(item: Any) -> list[Any] | None:
    """``("X-Api-Key", "...")`` of headers given as pairs, redacted; None for other items."""
    if (
        isinstance(item, list | tuple)
        and len(item) == 2
        and isinstance(item[0], str)
        and item[1] not in (None, "")
        and (_tier(item[0]) == 2 or (_tier(item[0]) == 1 and _weak_secret(item[1])))
    ):
        return [item[0], REDACTED]
    return None


_CONTAINER_TAGS = frozenset({"$tuple", "$set", "$frozenset", "$map"})


def redact_tagged(value: Any, tags: Mapping[str, Any]) -> Any:
    """A value in a tagged JSON form (the ledger's codec: ``{"$dt": "..."}``), redacted;
    a tag's own payload is left as it is (so that it decodes), a container tag's items
    are redacted."""
    if isinstance(value, str):
        return _text(value, False, "") if len(value) >= 5 else value
    if isinstance(value, list):
        return [_secret_pair(v) or redact_tagged(v, tags) for v in value]
    if not isinstance(value, Mapping):
        return value
    if len(value) == 1:
        ((tag, payload),) = value.items()
        if tag in tags:
            return {tag: redact_tagged(payload, tags)} if tag in _CONTAINER_TAGS else value
    out = {}
    for k, v in value.items():
        tier = _tier(k.lstrip("$"))
        secret = (tier == 2 and v not in (None, "") and type(v) is not bool) or (
            tier == 1 and _weak_secret(v)
        )
        out[k] = REDACTED if secret else redact_tagged(v, tags)
    return _named_value(value, out)


def redacted_paths(value: Any, path: str = "args") -> list[str]:
    """The paths of ``value`` that :func:`redact` replaced (to tell a replay handler)."""
    found: list[str] = []
    if isinstance(value, Mapping):
        for k, v in value.items():
            sub = f"{path}.{k}"
            if v == REDACTED:
                found.append(sub)
            else:
                found.extend(redacted_paths(v, sub))
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            found.extend(redacted_paths(v, f"{path}[{i}]"))
    elif isinstance(value, str) and REDACTED in value:
        found.append(path)
    return found


def safe_url(url: str) -> str:
    """A URL (or a text holding URLs) without user and password, for logs, errors, reprs.

    >>> safe_url("redis://:hunter2@cache:6379/0")
    'redis://***@cache:6379/0'
    """
    return _P.URL_USER.sub("***@", url)
