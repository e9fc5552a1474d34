"""A model provider's rate limits, simulated: RPM / ITPM / OTPM (Anthropic) or RPM / TPM
(OpenAI) as token buckets, with the real header shapes on every answer.

The buckets follow the providers' documented rules: each holds up to its per-minute limit
and refills continuously at limit / 60 per second; a request is admitted by its input
tokens and its ``max_tokens`` (OpenAI: their sum, one bucket), the output tokens it did
not generate go back when it ends, and a request that does not fit is refused with a
429, ``retry-after`` and the headers. The provider-limits scenario (``tether bench``)
and the loopback tests drive real clients against it.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

__all__ = ["Limits", "SimulatedProvider", "go_duration", "share_of_limit"]


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-minute limits; 0: none."""

    requests: float = 0.0
    input: float = 0.0
    output: float = 0.0
    tokens: float = 0.0

    def scaled(self, factor: float) -> Limits:
        return Limits(*(x * factor for x in (self.requests, self.input, self.output, self.tokens)))

    def as_budget(self) -> dict[str, Any]:
        """As :class:`tether.TokenBudget`'s keyword arguments."""
        return {
            "requests_per_minute": self.requests or None,
            "input_tokens_per_minute": self.input or None,
            "output_tokens_per_minute": self.output or None,
            "tokens_per_minute": self.tokens or None,
        }


def go_duration(seconds: float) -> str:
    """A duration as OpenAI writes its resets: ``20ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1.0:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60.0)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


def _rfc3339(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Bucket:
    cap: float
    level: float
    at: float

    def refill(self, now: float) -> None:
        self.level = min(self.cap, self.level + self.cap * max(0.0, now - self.at) / 60.0)
        self.at = max(self.at, now)

    def wait_for(self, need: float) -> float:
        return max(0.0, (min(need, self.cap) - self.level) * 60.0 / self.cap)

    def full_in(self) -> float:
        return max(0.0, (self.cap - self.level) * 60.0 / self.cap)


@dataclass
class Stats:
    requests: int = 0
    throttled: int = 0
    served_input: float = 0.0
    served_output: float = 0.0
    first_at: float | None = None
    last_at: float = 0.0
    by_minute: dict[int, float] = field(default_factory=dict)
    #: (time, input tokens, max_tokens) of every request admitted, in order
    admitted: list[tuple[float, int, int]] = field(default_factory=list)
    #: (time, input tokens, output tokens) of every request served, in order
    served: list[tuple[float, int, int]] = field(default_factory=list)


class SimulatedProvider:
    """One API key's limits at a provider (``"anthropic"`` or ``"openai"``), thread-safe."""

    def __init__(self, style: str, limits: Limits, now: float) -> None:
        if style not in ("anthropic", "openai"):
            raise ValueError(f"style must be 'anthropic' or 'openai', got {style!r}")
        self.style = style
        self.limits = limits
        self._lock = threading.Lock()
        self.buckets = {
            name: _Bucket(cap, cap, now)
            for name, cap in (
                ("requests", limits.requests),
                ("input", limits.input),
                ("output", limits.output),
                ("tokens", limits.tokens),
            )
            if cap > 0
        }
        self.stats = Stats()

    def _needs(self, input_tokens: int, max_tokens: int) -> dict[str, float]:
        return {
            "requests": 1.0,
            "input": float(input_tokens),
            "output": float(max_tokens),
            "tokens": float(input_tokens + max_tokens),
        }

    def admit(self, now: float, input_tokens: int, max_tokens: int) -> tuple[bool, dict[str, str]]:
        """Admit a request (taking its tokens) or refuse it; the headers of the answer."""
        with self._lock:
            needs = self._needs(input_tokens, max_tokens)
            for b in self.buckets.values():
                b.refill(now)
            self.stats.requests += 1
            wait = max(b.wait_for(needs[n]) for n, b in self.buckets.items())
            if wait > 0:
                self.stats.throttled += 1
                headers = self._headers(now)
                headers["retry-after"] = str(max(1, math.ceil(wait)))
                return False, headers
            for n, b in self.buckets.items():
                b.level -= min(needs[n], b.cap)
            self.stats.admitted.append((now, input_tokens, max_tokens))
            if self.stats.first_at is None:
                self.stats.first_at = now
            return True, self._headers(now)

    def finish(self, now: float, input_tokens: int, output_tokens: int, max_tokens: int) -> None:
        """The request ended: the output it did not generate goes back; count what it served."""
        with self._lock:
            unused = max(0, max_tokens - output_tokens)
            for name in ("output", "tokens"):
                b = self.buckets.get(name)
                if b is not None:
                    b.refill(now)
                    b.level = min(b.cap, b.level + unused)
            self.stats.served_input += input_tokens
            self.stats.served_output += output_tokens
            self.stats.last_at = max(self.stats.last_at, now)
            self.stats.served.append((now, input_tokens, output_tokens))
            minute = int(now // 60)
            self.stats.by_minute[minute] = (
                self.stats.by_minute.get(minute, 0.0) + input_tokens + output_tokens
            )

    def _headers(self, now: float) -> dict[str, str]:
        h: dict[str, str] = {}
        for name, b in self.buckets.items():
            left = str(max(0, math.floor(b.level)))
            if self.style == "anthropic":
                kind = {
                    "requests": "requests",
                    "input": "input-tokens",
                    "output": "output-tokens",
                    "tokens": "tokens",
                }[name]
                h[f"anthropic-ratelimit-{kind}-limit"] = str(int(b.cap))
                h[f"anthropic-ratelimit-{kind}-remaining"] = left
                h[f"anthropic-ratelimit-{kind}-reset"] = _rfc3339(now + b.full_in())
            else:
                kind = "requests" if name == "requests" else "tokens"
                h[f"x-ratelimit-limit-{kind}"] = str(int(b.cap))
                h[f"x-ratelimit-remaining-{kind}"] = left
                h[f"x-ratelimit-reset-{kind}"] = go_duration(b.full_in())
        return h


def share_of_limit(
    stats: Stats, limit: float, start: float, end: float, which: int, held: float = 0.0
) -> float:
    """Tokens between ``start`` and ``end`` as a share of what ``limit`` per minute allows in
    that time: input tokens as admitted (``which=1``: the provider counts them then), output
    tokens as generated (``which=2``: counted when the request ends). ``held``: what the
    bucket held at ``start``, which the provider could admit on top of the refill."""
    if end <= start or limit <= 0:
        return 0.0
    events = stats.admitted if which == 1 else stats.served
    served = sum(e[which] for e in events if start <= e[0] < end)
    return served / (limit * (end - start) / 60.0 + held)
