"""Which names are secrets: the built-in names, the user's additions, and the test of a
name (camelCase, ``-``, ``.`` and ``_`` alike; a compound by its last part)."""

from __future__ import annotations

import re
import threading
from typing import Any

REDACTED = "[redacted]"


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


#: Names whose values are secrets only when they look like one (free text) or are not a
#: plain word or a small number (structured data): ``session: 3 steps`` is no secret.
WEAK_NAMES: frozenset[str] = frozenset(
    {"session", "auth", "token", "sig", "signature", "card", "pan", "pin", "otp", "credential"}
)


#: Field names whose values are secrets (matched case-insensitively; ``-``, ``_``, ``.``
#: and camelCase alike; as a whole name or as its last part: ``db_password``,
#: ``X-Api-Key``, ``clientSecret``, ``AccountKey``).
SECRET_NAMES: set[str] = {
    *WEAK_NAMES,
    *_words(
        "password passwd pwd passphrase passcode secret client_secret secret_key api_key apikey"
        " x_api_key access_key private_key aws_secret_access_key account_key shared_access_key"
        " shared_access_signature access_token refresh_token id_token auth_token session_token"
        " bearer authorization proxy_authorization cookie set_cookie sessionid credentials"
        " card_number cardnumber cvc cvv cvv2 ssn pass pword passw"
    ),
}


# the last part of a compound name that makes it a secret (``stripe_secret``, ``csrf_token``)
_STRONG_LAST = _words(
    "password passwd pwd pass passphrase passcode secret token cookie apikey credentials"
)


#: a name written as one word or in pieces (``secretkey``, ``pass_phrase``, ``privatekey``,
#: ``signing_key``) is a secret's when, its separators dropped, it ends with one of these
_SQUASHED_ENDINGS = tuple(
    _words(
        "password passwd passphrase passcode secretkey apikey apisecret apitoken privatekey"
        " accesskey signingkey encryptionkey masterkey clientsecret authtoken accesstoken"
        " refreshtoken sessiontoken secrettoken"
    )
)


_STRONG_SUFFIXES = (
    "_api_key",
    "_secret_key",
    "_private_key",
    "_access_key",
    "_account_key",
    "_card_number",
    "_client_secret",
)


_lock = threading.Lock()


_extra_patterns: list[re.Pattern[str]] = []


_state: dict[str, Any] = {"mask_pii": True}


_tiers: dict[str, int] = {}  # normalised-name cache: 0 not a secret, 1 weak, 2 strong


#: the patterns of :func:`_normalise`, compiled at its first name (a name not seen before is
#: normalised on every tool call whose record holds one: no look-up in ``re``'s cache)
_WORDS: tuple[re.Pattern[str], re.Pattern[str]] | None = None


def _normalise(name: str) -> str:
    global _WORDS
    if _WORDS is None:  # two threads at once: each compiles, either pair is kept
        _WORDS = (
            re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])"),
            re.compile(r"[-. ]"),
        )
    case, separators = _WORDS
    return separators.sub("_", case.sub("_", name.strip()).lower()).strip("_")


def _tier(name: str) -> int:
    """0: not a secret's name; 1: a weak name (its value decides); 2: a secret's name."""
    found = _tiers.get(name)
    if found is not None:
        return found
    n = _normalise(name)
    last = n.rsplit("_", 1)[-1]
    if n in WEAK_NAMES and n not in _state.get("strong_added", ()):
        tier = 1
    elif (
        n in SECRET_NAMES
        or last in _STRONG_LAST
        or n.endswith(_STRONG_SUFFIXES)
        or n.replace("_", "").endswith(_SQUASHED_ENDINGS)
    ):
        tier = 2
    elif last in WEAK_NAMES:
        tier = 1
    else:
        tier = 0
    if len(_tiers) < 4096:
        _tiers[name] = tier
    return tier


def _looks_secret(value: str) -> bool:
    """A value in free text that looks like a credential, not a word or a count."""
    v = value.strip("\"'")
    if len(v) < 8:
        return False
    if v.isdigit():
        return len(v) >= 10
    has_digit = any(c.isdigit() for c in v)
    return (has_digit and any(c.isalpha() for c in v)) or len(v) >= 16


def _weak_secret(value: Any) -> bool:
    """A structured value under a weak name that is a secret: not a plain word or a small
    number (``{"auth": "ok"}``, ``{"session": 3}`` stay; ``{"pin": "1234"}`` does not)."""
    if value is None or isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return abs(value) >= 1000
    if isinstance(value, str):
        return bool(value) and not (value.isalpha() and len(value) <= 12)
    return False


def _last_part(name: str) -> str:
    """The word of a name that makes it a secret: ``key`` of ``api_key``, ``card`` of
    ``card_number``."""
    words = [w for w in name.split("_") if w]
    while len(words) > 1 and words[-1] in ("number", "id", "value"):
        words.pop()
    return words[-1] if words else ""


def _fragments() -> re.Pattern[str]:
    """The last parts of the secret names (``key`` of ``api_key``, ``token`` of
    ``accessToken``), lower-case: where a name=value pair can be (see :func:`_pairs`)."""
    parts = {_last_part(n) for n in (*SECRET_NAMES, *WEAK_NAMES, *_STRONG_LAST, *_STRONG_SUFFIXES)}
    parts = {p for p in parts if p and not any(q != p and q in p for q in parts)}
    return re.compile("|".join(re.escape(p) for p in sorted(parts, key=len, reverse=True)))


_BUILTIN_NAMES = frozenset(SECRET_NAMES)
