"""Secrets out of everything tether writes or says: one redaction, applied at every boundary.

Structured data is redacted by field name, at any depth (``password``, ``api_key``,
``authorization``, ``card_number``... see :data:`SECRET_NAMES`); free text by pattern:
credentials in URLs, ``Bearer``/``Basic`` values, ``name=value`` and ``"name": "value"``
pairs for the secret names (also inside object reprs and query strings), the shapes of
provider keys (Anthropic, OpenAI, Stripe, GitHub, Slack, AWS, Google, JWTs) and card
numbers that pass the Luhn check. Add your own with :func:`add_secret_names` and
:func:`add_secret_patterns`.

The patterns are written here rather than taken from a secret scanner: the core imports
only the standard library, and scanners built for repositories (detect-secrets and the
like) flag every high-entropy word of a single line, miss card numbers and take hundreds
of microseconds a line.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any

__all__ = [
    "REDACTED",
    "SECRET_NAMES",
    "add_secret_names",
    "add_secret_patterns",
    "redact",
    "redact_text",
    "redacted_paths",
    "safe_url",
]

REDACTED = "[redacted]"

#: Field names whose values are secrets (matched case-insensitively, ``-`` and ``_``
#: alike, as a whole name or as its last part: ``db_password``, ``X-Api-Key``).
SECRET_NAMES: set[str] = {
    "password", "passwd", "pwd", "passphrase", "secret", "client_secret", "secret_key",
    "token", "access_token", "refresh_token", "id_token", "auth_token", "session_token",
    "api_key", "apikey", "x_api_key", "access_key", "private_key", "aws_secret_access_key",
    "authorization", "proxy_authorization", "auth", "cookie", "set_cookie", "session",
    "sessionid", "credentials", "credential", "signature", "card", "card_number",
    "cardnumber", "pan", "cvc", "cvv", "cvv2", "ssn", "pin", "otp",
}  # fmt: skip

_lock = threading.Lock()
_extra_patterns: list[re.Pattern[str]] = []
_state: dict[str, Any] = {}

_KEY_SHAPES = [
    r"sk-ant-[A-Za-z0-9_-]{16,}",  # Anthropic
    r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}",  # OpenAI
    r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{10,}",  # Stripe secret / restricted keys
    r"\bwhsec_[A-Za-z0-9]{16,}",  # Stripe webhook secrets
    r"\bgh[pousr]_[A-Za-z0-9]{20,}",  # GitHub tokens
    r"\bgithub_pat_[A-Za-z0-9_]{20,}",
    r"\bxox[abposr]-[A-Za-z0-9-]{10,}",  # Slack
    r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b",  # AWS access key ids
    r"\bAIza[0-9A-Za-z_-]{35}",  # Google API keys
    r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}",  # JWTs
]
# user:password@host:port of a URL: the host of a credentialed URL (a DSN) goes too
_URL_CREDENTIALS = re.compile(r"(?<=://)[^/\s@:]*:[^/\s@]*@[^/\s?#]*")
_URL_USER = re.compile(r"(?<=://)[^/@\s]*@")
_AUTH_SCHEME = re.compile(r"(?i)\b(bearer|basic|digest|token)(\s+)[A-Za-z0-9._~+/=-]{6,}")
# a whole token: an id whose hex holds a Luhn-valid digit run (ho_00dc99356118...) is no card
_CARD = re.compile(r"(?<![\w-])\d(?:[ -]?\d){12,18}(?![\w-])")


def _normalise(name: str) -> str:
    return name.strip().lower().replace("-", "_").replace(" ", "_")


def _is_secret_name(name: str) -> bool:
    n = _normalise(name)
    if n in SECRET_NAMES:
        return True
    last = n.rsplit("_", 1)[-1]
    return last in {
        "password",
        "passwd",
        "secret",
        "token",
        "cookie",
        "apikey",
        "credentials",
    } or n.endswith(("_api_key", "_secret_key", "_private_key", "_access_key", "_card_number"))


def _compiled() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(pairs, shapes), rebuilt when names or patterns change."""
    found = _state.get("compiled")
    if found is None:
        names = sorted(
            {re.escape(n).replace("_", "[_-]?") for n in SECRET_NAMES}, key=len, reverse=True
        )
        alternatives = "|".join(names)
        # name=value, name: value, "name": "value", name='value' (reprs), ?name=value
        pairs = re.compile(
            rf"(?i)(?<![A-Za-z0-9])((?:[A-Za-z0-9]+[_-])*(?:{alternatives}))([\"']?\s*[=:]\s*)"
            r"(\"[^\"]*\"|'[^']*'|[^\s\"'&,;)}\]]+)"
        )
        shapes = re.compile("|".join([*_KEY_SHAPES, *(p.pattern for p in _extra_patterns)]))
        found = (pairs, shapes)
        _state["compiled"] = found
    return found


def add_secret_names(*names: str) -> None:
    """Treat these field names as secrets too (structured data and ``name=value`` text)."""
    with _lock:
        SECRET_NAMES.update(_normalise(n) for n in names if n)
        _state.pop("compiled", None)


def add_secret_patterns(*patterns: str | re.Pattern[str]) -> None:
    """Redact text matching these regular expressions too (e.g. your own key shapes)."""
    with _lock:
        for p in patterns:
            _extra_patterns.append(re.compile(p) if isinstance(p, str) else p)
        _state.pop("compiled", None)


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card(match: re.Match[str]) -> str:
    digits = re.sub(r"[ -]", "", match.group(0))
    return REDACTED if 13 <= len(digits) <= 19 and _luhn(digits) else match.group(0)


def _pair(match: re.Match[str]) -> str:
    value = match.group(3)
    if value in (REDACTED, f'"{REDACTED}"', f"'{REDACTED}'"):
        return match.group(0)
    quote = value[0] if value[:1] in ("'", '"') else ""
    return f"{match.group(1)}{match.group(2)}{quote}{REDACTED}{quote}"


def redact_text(text: str) -> str:
    """``text`` with every secret the patterns know replaced by ``[redacted]``."""
    if not text:
        return text
    pairs, shapes = _compiled()
    text = _URL_CREDENTIALS.sub(REDACTED, text)
    text = _AUTH_SCHEME.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    text = pairs.sub(_pair, text)
    text = shapes.sub(REDACTED, text)
    if any(ch.isdigit() for ch in text):
        text = _CARD.sub(_card, text)
    return text


def redact(value: Any, *, extra: re.Pattern[str] | None = None) -> Any:
    """A copy of ``value`` with its secrets replaced: fields by name at any depth, text
    by pattern; other objects by their redacted ``repr``.

    >>> redact({"order": "A-1", "api_key": "sk-live-123", "note": "token=abc123"})
    {'order': 'A-1', 'api_key': '[redacted]', 'note': 'token=[redacted]'}
    """
    return _redact(value, extra, 0)


def _redact(value: Any, extra: re.Pattern[str] | None, depth: int) -> Any:
    if depth > 64:
        return REDACTED
    if isinstance(value, str):
        text = redact_text(value)
        return extra.sub(REDACTED, text) if extra is not None else text
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            name = str(k)
            secret = _is_secret_name(name) or (extra is not None and extra.search(name))
            out[k] = REDACTED if secret and v not in (None, "") else _redact(v, extra, depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [_redact(v, extra, depth + 1) for v in value]
    return _redact(repr(value), extra, depth + 1)


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
    return _URL_USER.sub("***@", url)
