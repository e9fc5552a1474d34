"""What a response's headers say about waiting: ``Retry-After`` and the providers'
rate-limit reset headers, read without I/O.

A 429 from a provider with several limits (requests, input tokens, output tokens, tokens
per minute) comes with a reset header for each bucket, and they differ by minutes: the
wait is the reset of the bucket that refused, not the longest. :func:`retry_after_from_headers`
takes the bucket the error names (its message or type: "tokens per min (TPM)", "input
tokens per minute", ``type: "requests"``); when the error says nothing, the bucket whose
``remaining`` is 0 (or, failing that, the lowest share of its limit); when the headers say
nothing of levels either, the longest reset (the safe side).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from tether.providers import anthropic, openai_chat

__all__ = [
    "RESET_HEADERS",
    "RETRY_AFTER_CEILING",
    "limit_named",
    "retry_after_from_headers",
    "sane_wait",
]

#: The longest wait a verdict ever asks for (one day); longer or odd values are cut to it.
RETRY_AFTER_CEILING = 86_400.0


def sane_wait(value: Any) -> float | None:
    """None, or a finite number of seconds in [0, RETRY_AFTER_CEILING]."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except (OverflowError, ValueError):
        return RETRY_AFTER_CEILING if isinstance(value, int) and value > 0 else None
    if seconds != seconds or seconds < 0:
        return None
    return min(seconds, RETRY_AFTER_CEILING) + 0.0  # + 0.0 turns -0.0 into 0.0


def _header(headers: Any, name: str) -> str | None:
    if headers is None:
        return None
    try:
        value = headers.get(name)
        if value is None and isinstance(headers, Mapping):
            lower = name.lower()
            for k, v in headers.items():
                if isinstance(k, str) and k.lower() == lower:
                    value = v
                    break
        if value is None:
            return None
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        return str(value).strip()
    except Exception:
        return None


# the patterns of this module are compiled when first used (re's cache keeps them), not
# at ``import tether``
_DURATION = (
    r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?"
    r"(?:(\d+(?:\.\d+)?)ms)?$"
)


def _parse_number(value: str) -> float | None:
    """A finite, non-negative number, or None."""
    if len(value) > 64:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds + 0.0 if 0 <= seconds < float("inf") else None


def _parse_seconds(value: str) -> float | None:
    return sane_wait(_parse_number(value))


def _parse_reset(value: str, now_wall: float) -> float | None:
    """A provider reset header: seconds, an epoch, a Go duration or an RFC 3339 time."""
    seconds = _parse_number(value)
    if seconds is not None:
        if seconds > 1_000_000_000:  # an epoch timestamp (GitHub's x-ratelimit-reset)
            delta = seconds - now_wall
            return sane_wait(delta) if delta >= 0 else None
        return sane_wait(seconds)
    if len(value) > 64:
        return None
    match = re.match(_DURATION, value)
    if match and any(match.groups()):
        h, m, s, ms = (float(g) if g else 0.0 for g in match.groups())
        return sane_wait(h * 3600 + m * 60 + s + ms / 1000)
    try:
        from datetime import datetime

        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
        if when.tzinfo is None:
            return None
        delta = when.timestamp() - now_wall
        return sane_wait(delta) if delta >= 0 else None
    except (ValueError, OverflowError, OSError):
        return None


_A, _O = anthropic.RATE_HEADERS, openai_chat.RATE_HEADERS


def _rrl(names: tuple[str, str, str]) -> tuple[str, str, str]:
    """A provider profile's (limit, remaining, reset) as (reset, remaining, limit)."""
    return names[2], names[1], names[0]


#: the rate-limit buckets a provider's headers describe: per bucket, its headers as
#: (reset, remaining, limit), one triple per provider shape
BUCKET_HEADERS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "requests": (_rrl(_A["requests"]), _rrl(_O["requests"])),
    "tokens": (_rrl(_A["tokens"]), _rrl(_O["tokens"])),
    "input": (_rrl(_A["input-tokens"]),),
    "output": (_rrl(_A["output-tokens"]),),
    "any": (  # one limit per key: IETF RateLimit, GitHub, Twitter
        ("ratelimit-reset", "ratelimit-remaining", "ratelimit-limit"),
        ("x-ratelimit-reset", "x-ratelimit-remaining", "x-ratelimit-limit"),
        ("x-rate-limit-reset", "x-rate-limit-remaining", "x-rate-limit-limit"),
    ),
}
RESET_HEADERS = tuple(names[0] for shapes in BUCKET_HEADERS.values() for names in shapes)
#: the buckets a named limit may be (Anthropic's "tokens" is the stricter of input and output)
_NAMED = {
    "requests": ("requests",),
    "tokens": ("tokens", "input", "output"),
    "input": ("input", "tokens"),
    "output": ("output", "tokens"),
}
# how an error names the limit it hit: "on tokens per min (TPM)", "50,000 input tokens per
# minute", "requests per day (RPD)"; the phrase with "per" first, then the error's type
_PER = (
    r"(?i)\b(?:(input|output)[ _-]tokens?|(tokens?)|(requests?))\s+per\s+(?:min|minute|day|hour)\b"
    r"|\b(?:(TPM|TPD)|(RPM|RPD))\b"
)
_WORDS = r"(?i)\b(?:(input|output)[ _-]tokens?|(tokens?)|(requests?))\b"


def limit_named(codes: Sequence[str], message: str) -> str | None:
    """The limit an error says it hit ("requests", "tokens", "input", "output"), or None.

    A phrase with "per" ("tokens per min (TPM)", "input tokens per minute") wins; then the
    error's type (OpenAI's ``"tokens"`` / ``"requests"``); then the one bucket word the
    message uses, when it uses one kind only.
    """
    found = re.search(_PER, message[:2000])
    if found:
        io, tokens, _requests, tpm, _rpm = found.groups()
        if io:
            return io.lower()
        return "tokens" if tokens or tpm else "requests"
    for code in codes:
        lowered = code.lower()
        if lowered in ("tokens", "requests", "input_tokens", "output_tokens"):
            return lowered.removesuffix("_tokens")
    kinds: set[str] = set()
    for io, tokens, _requests in re.findall(_WORDS, message[:2000]):
        kinds.add(io.lower() if io else "tokens" if tokens else "requests")
    return kinds.pop() if len(kinds) == 1 else None


def _levels(headers: Any, now_wall: float) -> list[tuple[str, float, float | None]]:
    """Each bucket the headers describe with a reset: (bucket, reset wait, share left)."""
    found = []
    for bucket, shapes in BUCKET_HEADERS.items():
        for reset_name, remaining_name, limit_name in shapes:
            raw = _header(headers, reset_name)
            wait = _parse_reset(raw, now_wall) if raw else None
            if wait is None:
                continue
            left = _parse_number(_header(headers, remaining_name) or "")
            limit = _parse_number(_header(headers, limit_name) or "")
            share = None
            if left is not None:
                share = 0.0 if left == 0 else left / limit if limit else None
            found.append((bucket, wait, share))
            break
    return found


def _reset_wait(headers: Any, now_wall: float, named: str | None) -> float | None:
    """The reset of the bucket that refused (see the module)."""
    levels = _levels(headers, now_wall)
    if named is not None:
        mine = [x for x in levels if x[0] in _NAMED.get(named, ())]
        levels = mine or levels
    if not levels:
        return None
    empty = [wait for _, wait, share in levels if share == 0.0]
    if empty:
        return max(empty)
    shares = [(share, wait) for _, wait, share in levels if share is not None]
    if shares and len(shares) == len(levels):
        return min(shares)[1]
    return max(wait for _, wait, _ in levels)


def retry_after_from_headers(
    headers: Any,
    *,
    now_wall: float | None = None,
    include_reset: bool = True,
    limit: str | None = None,
) -> float | None:
    """Seconds to wait that a response's headers ask for, or None.

    ``retry-after-ms`` first, then ``Retry-After`` (seconds, fractional seconds or an
    HTTP-date), then (``include_reset``) the reset of the rate-limit bucket that refused:
    ``limit`` (what the error named, see :func:`limit_named`), else the bucket with nothing
    left, else the longest reset. Garbage and dates in the past give None.
    """
    if headers is None:
        return None
    if now_wall is None:
        from tether.clock import system_clock

        now_wall = system_clock.wall()
    ms = _header(headers, "retry-after-ms")
    if ms is not None:
        value = _parse_seconds(ms)
        if value is not None:
            return value / 1000.0
    ra = _header(headers, "retry-after")
    if ra is not None:
        value = _parse_seconds(ra)
        if value is not None:
            return value
        import email.utils  # imported when first used: `import tether` loads no e-mail parser

        try:
            when = email.utils.parsedate_to_datetime(ra) if len(ra) <= 64 else None
            if when is not None and when.tzinfo is not None:
                delta = when.timestamp() - now_wall
                return sane_wait(delta) if delta >= 0 else None
        except (TypeError, ValueError, IndexError, OverflowError, OSError):
            pass
        return None
    if not include_reset:
        return None
    return _reset_wait(headers, now_wall, limit)
