"""What a token budget learns from responses: the headers' limits and levels, a 429's
pause, and the bias of its own token estimate.

Pure parts of :class:`tether.TokenBudget`: :func:`rate_limit_headers` reads both
providers' header shapes, :class:`Estimator` learns how far ``estimate_tokens`` is off for
a family, and :func:`settlement_of` turns one response into the
:class:`~tether.stores._tokens.Settlement` the store applies.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tether.classification._headers import _header, _parse_reset, retry_after_from_headers
from tether.providers import anthropic, openai_chat
from tether.stores._tokens import Settlement

if TYPE_CHECKING:
    from tether.stores._tokens import Four

__all__ = [
    "Estimator",
    "Reservation",
    "estimate_tokens",
    "headers_of",
    "rate_limit_headers",
    "settlement_of",
]

#: header names per bucket (requests, input, output, tokens): limit, remaining, reset, from
#: the provider profiles (Anthropic's "tokens" bucket is the stricter of its input and output)
_A, _O = anthropic.RATE_HEADERS, openai_chat.RATE_HEADERS
_HEADERS = (
    [_A["requests"], _O["requests"]],
    [_A["input-tokens"]],
    [_A["output-tokens"]],
    [_O["tokens"]],
)


@dataclass(frozen=True, slots=True)
class Reservation:
    """A model call's place in its token budget: what it took and how long it waited."""

    name: str
    need: Four
    estimated_input_tokens: int
    max_output_tokens: int
    waited: float
    #: who made it and its number (its budget settles each id once; "": never made)
    id: str = ""
    #: what of ``need`` is the estimate's padding, above the usage the estimator expects
    #: (the fleet's buckets count it as in flight until the call is settled)
    margin: Four = (0.0, 0.0, 0.0, 0.0)


def _number(raw: str | None) -> float | None:
    if raw is None or len(raw) > 32:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if 0 <= value < math.inf else None


def rate_limit_headers(
    headers: Any, now_wall: float
) -> tuple[list[float], list[float], list[float | None]]:
    """A response's rate-limit headers as (limits, remaining, resets in seconds) per bucket
    (requests, input, output, tokens); 0, -1 and None where a header is absent or garbage.

    Anthropic's ``anthropic-ratelimit-{requests,input-tokens,output-tokens}-*`` (reset as
    RFC 3339) and OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` (reset
    as a duration, ``6m0s``, ``20ms``). Anthropic's ``anthropic-ratelimit-tokens-*`` is the
    most restrictive of its input and output limits: the two buckets say more.
    """
    limits, remaining = [0.0] * 4, [-1.0] * 4
    resets: list[float | None] = [None] * 4
    if headers is None:
        return limits, remaining, resets
    for i, names in enumerate(_HEADERS):
        for limit_name, remaining_name, reset_name in names:
            limit = _number(_header(headers, limit_name))
            left = _number(_header(headers, remaining_name))
            if limit is None and left is None:
                continue
            if limit:
                limits[i] = limit
            if left is not None:
                remaining[i] = left
            raw = _header(headers, reset_name)
            resets[i] = _parse_reset(raw, now_wall) if raw else None
            break
    return limits, remaining, resets


def headers_of(obj: Any) -> Mapping[str, str] | None:
    """The HTTP headers of an SDK response or error, when it carries them."""
    response = getattr(obj, "response", None)
    headers = getattr(response, "headers", None) or getattr(obj, "headers", None)
    return headers if headers is not None else None


def estimate_tokens(*parts: Any) -> int:
    """A prompt's tokens, estimated without a tokenizer: about four characters a token of
    its JSON text (messages, system prompt, tools). The budget corrects it from usage."""
    chars = 0
    for part in parts:
        if part is None:
            continue
        if isinstance(part, str):
            chars += len(part)
        else:
            chars += len(json.dumps(part, default=str, ensure_ascii=False))
    return max(1, math.ceil(chars / 4))


class Estimator:
    """How far a family's prompt estimates are off: the ratio usage / estimate, learned
    from the responses (an exponential average), its mean absolute deviation, and the
    largest ratio seen lately (``peak``: it relaxes towards the average by 2% of the gap a
    response, so one under-estimate keeps the reservations as large for dozens of calls)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ratio = 1.0
        self.spread = 0.0
        self.peak = 1.0

    def need(self, estimated_input_tokens: int, max_output_tokens: int) -> Four:
        """What a call reserves: one request, the estimate times the larger of its bias
        with three times its spread and the peak (an estimate that falls short near an
        empty bucket is a 429; one that is too large only holds tokens until the usage
        gives them back), ``max_tokens``."""
        with self._lock:
            factor = min(4.0, max(self.ratio + 3.0 * self.spread, self.peak, 0.5))
        est = math.ceil(estimated_input_tokens * factor)
        return 1.0, float(est), float(max_output_tokens), float(est + max_output_tokens)

    def margin(self, estimated_input_tokens: int, need: Four) -> Four:
        """What of ``need`` is padding above the usage expected (the estimate times the
        average ratio): the input and the combined bucket's; output and requests have none
        (the provider counts ``max_tokens`` as the budget does)."""
        with self._lock:
            expected = estimated_input_tokens * self.ratio
        pad = max(0.0, need[1] - expected)
        return 0.0, pad, 0.0, pad

    def learn(self, estimated: int, used: float) -> None:
        if estimated > 0 and used > 0:
            with self._lock:
                seen = used / estimated
                self.spread = 0.9 * self.spread + 0.1 * abs(seen - self.ratio)
                self.ratio = 0.9 * self.ratio + 0.1 * seen
                self.peak = max(seen, self.ratio + 0.98 * (self.peak - self.ratio))

    def reset(self) -> None:
        with self._lock:
            self.ratio, self.spread, self.peak = 1.0, 0.0, 1.0


#: a prompt's tokens are at most this many times its estimate (about four characters a
#: token: a token per character at the most) ...
MAX_INPUT_FACTOR = 4
#: ... plus this many for what the estimate may not see (the messages' framing, a system
#: prompt or tools an adapter is not shown)
INPUT_SLACK = 1024


def max_usage(r: Reservation) -> tuple[float, float]:
    """The most a call can have used: ``MAX_INPUT_FACTOR`` times its prompt's estimate
    plus ``INPUT_SLACK`` (or what it reserved, when more) and its ``max_tokens`` (the
    provider stops there)."""
    most_in = MAX_INPUT_FACTOR * r.estimated_input_tokens + INPUT_SLACK
    return max(float(most_in), r.need[1]), float(r.max_output_tokens)


def _used(value: int | None, most: float) -> float:
    """A usage the response reports, as what can be true: within [0, most]."""
    used = float(value or 0)
    return most if not used <= most else max(0.0, used)  # NaN: the most


def _refund(
    r: Reservation, input_tokens: int | None, output_tokens: int | None, sent: bool
) -> list[float]:
    if input_tokens is None and output_tokens is None:
        # no usage: nothing was generated; a refused (429) call took no tokens at all
        return [0.0 if sent else 1.0, r.need[1], r.need[2], r.need[3]]
    most_in, most_out = max_usage(r)
    used_in, used_out = _used(input_tokens, most_in), _used(output_tokens, most_out)
    return [0.0, r.need[1] - used_in, r.need[2] - used_out, r.need[3] - used_in - used_out]


def settlement_of(
    r: Reservation,
    input_tokens: int | None,
    output_tokens: int | None,
    headers: Any,
    status: int | None,
    now: float,
    max_pause: float = 60.0,
) -> Settlement:
    """What a response (or a 429, or no answer) says to the store: the refund from its
    usage (at most what the call can have used, :func:`max_usage`), the headers' limits and
    levels, a 429's pause (its Retry-After, else the reset of an exhausted bucket; at most
    ``max_pause`` seconds)."""
    s = Settlement(seen_at=now)
    s.margin = list(r.margin)  # settled: no longer in flight
    s.refund = _refund(r, input_tokens, output_tokens, status is None or status != 429)
    limits, remaining, resets = rate_limit_headers(headers, now)
    s.limit, s.remaining = limits, remaining
    s.answered = status is not None or input_tokens is not None
    if status == 429:
        wait = retry_after_from_headers(headers, now_wall=now, include_reset=False)
        if wait is None:
            exhausted = [x for i, x in enumerate(resets) if x is not None and remaining[i] == 0]
            wait = max(exhausted or [1.0])
        s.pause_until = now + min(wait, max_pause)
    return s
