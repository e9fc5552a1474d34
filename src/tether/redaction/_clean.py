"""Texts that redact to themselves: a recorded call's view made without walking it.

Most of what an agent's tools take and give holds no secret. Whether a JSON text does is
decided on the text, in C-speed passes: each distinct string in it (keys and values
alike) is judged once, remembered as clean, and a text whose strings are all remembered
needs no walk at all. A string is clean when it names no secret field (so no value
beside it is redacted), is not ``"value"`` (of a ``{"name": ..., "value": ...}``
record), and redacts to itself as free text with no card-number candidate in it (a
field's name only ever spares a card number, so such a text redacts to itself under any
name). What is not so goes through the walk, as before.
"""

from __future__ import annotations

from collections.abc import Collection

from tether.redaction._secret_names import _tier
from tether.redaction._secret_text import _P, _compiled, _text

__all__ = ["clean_json", "clean_strings"]

#: strings up to this long are remembered as clean (at most _CLEAN_SIZE of them)
_CLEAN_TEXT = 512
_CLEAN_SIZE = 8192
#: containers a text may open and still be judged on its text: the walk stops at depth 64
_NESTING = 60


def clean_json(text: str) -> bool:
    """Whether the JSON value ``text`` holds redacts to itself (False: not known to)."""
    if "\\" in text or text.count("{") + text.count("[") > _NESTING:
        return False  # an escape: the strings are not the text's own letters
    return clean_strings(text.split('"')[1::2])  # no escapes: every other piece is a string


def clean_strings(strings: Collection[str]) -> bool:
    """Whether each of ``strings``, as a field's name or as its value, redacts to itself."""
    compiled = _compiled()  # made anew when the names or patterns change: so is this set
    known: set[str] | None = compiled.get("clean")
    if known is None:
        known = compiled["clean"] = set()
    if known.issuperset(strings):
        return True
    fresh = set(strings) - known
    if not all(_clean(s) for s in fresh):
        return False
    if len(known) + len(fresh) > _CLEAN_SIZE:
        known.clear()
    known.update(s for s in fresh if len(s) <= _CLEAN_TEXT)
    return True


def _clean(s: str) -> bool:
    if _tier(s) or s == "value":
        return False
    return len(s) < 5 or (_P.CARD.search(s) is None and _text(s, False, "") == s)
