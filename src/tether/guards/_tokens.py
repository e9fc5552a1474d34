"""The fleet's token budget: a provider's requests and tokens per minute, shared by every agent.

A provider limits requests, input tokens and output tokens per minute per model family
(Anthropic), or requests and tokens per minute per model (OpenAI), and admits a request
by its *estimated* tokens: the prompt plus ``max_tokens``. :class:`TokenBudget` keeps
those buckets in a store (the fleet's, e.g. Redis), reserves a call's estimate before it
goes out, gives the difference back from the response's usage, and learns the real
limits and levels from the response headers (``anthropic-ratelimit-*``,
``x-ratelimit-*``). A 429's ``Retry-After`` pauses the family for the whole fleet.
The state machine is :mod:`tether.stores._tokens`.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from tether._errors import LimiterTimeout
from tether.classification._classify import _header, _parse_reset, retry_after_from_headers
from tether.clock import Clock, system_clock
from tether.stores._base import bind_name
from tether.stores._memory import default_store
from tether.stores._tokens import Settlement, TokenConfig, token_ops

if TYPE_CHECKING:
    from tether.stores._base import Store
    from tether.stores._tokens import Four

__all__ = [
    "Reservation",
    "TokenBudget",
    "budget_for",
    "estimate_tokens",
    "provider_of",
    "rate_limit_headers",
]

#: header names per bucket (requests, input, output, tokens): limit, remaining, reset
_HEADERS = (
    [
        (
            "anthropic-ratelimit-requests-limit",
            "anthropic-ratelimit-requests-remaining",
            "anthropic-ratelimit-requests-reset",
        ),
        (
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
        ),
    ],
    [
        (
            "anthropic-ratelimit-input-tokens-limit",
            "anthropic-ratelimit-input-tokens-remaining",
            "anthropic-ratelimit-input-tokens-reset",
        )
    ],
    [
        (
            "anthropic-ratelimit-output-tokens-limit",
            "anthropic-ratelimit-output-tokens-remaining",
            "anthropic-ratelimit-output-tokens-reset",
        )
    ],
    [("x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens")],
)


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


@dataclass(frozen=True, slots=True)
class Reservation:
    """A model call's place in its token budget: what it took and how long it waited."""

    name: str
    need: Four
    estimated_input_tokens: int
    max_output_tokens: int
    waited: float


def _limit(field: str, value: float | None) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{field} must be a positive number or None, got {value!r}")
    if math.isinf(value):
        raise ValueError(f"{field} must be finite (None means: not configured), got {value!r}")
    return float(value)


class TokenBudget:
    """Requests, input tokens and output tokens per minute for one provider and model family,
    shared by every agent that uses the same ``store``.

    >>> budget = tether.TokenBudget(provider="anthropic", family="claude-sonnet-4",
    ...     requests_per_minute=50, input_tokens_per_minute=30_000,
    ...     output_tokens_per_minute=8_000)  # doctest: +SKIP
    >>> guard = tether.Guard(token_budget=budget)  # doctest: +SKIP

    * **Reserve** before each call: one request, the prompt's estimated tokens and the
      request's ``max_tokens`` (the provider's own admission rule), from separate input,
      output and (OpenAI) combined buckets. The call waits for its turn on the clock.
    * **Refund** from the response's usage: the estimate's error and the output tokens
      not generated go back.
    * **Calibrate** from the headers: the limits the provider states replace the
      configured ones (the configured ones hold until a first response says otherwise,
      or for a provider that sends no headers), and a ``remaining`` below the budget's
      own level lowers it. Until the first response of a family arrives, one call goes
      out alone and the others wait for its headers.
    * A 429's ``Retry-After`` pauses the family for the whole fleet.
    * **Priority**: a caller asks with a horizon (how far ahead it may take a place in
      line): ``horizon`` seconds, up to four times that for an urgent caller (a run with
      little time or budget left), plus the time it has already waited. So the longest
      waiters and the most urgent runs are admitted first, and no caller waits unboundedly.

    ``family`` matches the models whose name starts with it (``""``: every model of the
    provider). A budget made with a name the store holds with other limits is refused
    (ValueError naming both).
    """

    def __init__(
        self,
        provider: str,
        family: str = "",
        *,
        requests_per_minute: float | None = None,
        input_tokens_per_minute: float | None = None,
        output_tokens_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        store: Store | None = None,
        clock: Clock | None = None,
        horizon: float = 2.0,
        probe_timeout: float = 30.0,
    ) -> None:
        if not provider or not isinstance(provider, str):
            raise ValueError(f"provider must be a non-empty string, got {provider!r}")
        if not isinstance(family, str):
            raise ValueError(f"family must be a string (a model name prefix), got {family!r}")
        if not isinstance(horizon, int | float) or not horizon > 0:
            raise ValueError(f"horizon must be > 0 seconds, got {horizon!r}")
        if not isinstance(probe_timeout, int | float) or not probe_timeout > 0:
            raise ValueError(f"probe_timeout must be > 0 seconds, got {probe_timeout!r}")
        self.provider, self.family = provider, family
        self.name = f"{provider}:{family}" if family else provider
        self.config = TokenConfig(
            limits=(
                _limit("requests_per_minute", requests_per_minute),
                _limit("input_tokens_per_minute", input_tokens_per_minute),
                _limit("output_tokens_per_minute", output_tokens_per_minute),
                _limit("tokens_per_minute", tokens_per_minute),
            ),
            probe_timeout=float(probe_timeout),
        )
        self.horizon = float(horizon)
        self.store: Store = store if store is not None else default_store
        self.clock: Clock = clock or system_clock
        self._ops = token_ops(self.store)
        self._lock = threading.Lock()
        self._pending = Settlement()
        self._sent_at = -math.inf  # when this process last told the store what it learned
        self._calibrated = False
        self._ratio = 1.0  # usage / estimate, learned: the estimator's bias for this family
        self._spread = 0.0  # the mean absolute deviation of that ratio
        self._probe_gate = -math.inf  # until then another caller here waits for the probe
        self._line_until = -math.inf  # when the longest place in line the store gave ends
        #: calls reserved, seconds waited in all, the longest wait, 429s settled
        self.reserved = 0
        self.waited = 0.0
        self.longest_wait = 0.0
        self.throttled = 0
        bind_name(
            self.store, "token budget", self.name, cast(Any, self.config)
        )  # a frozen dataclass too

    def __repr__(self) -> str:
        return f"TokenBudget({self.name!r})"

    def covers(self, provider: str, model: str) -> bool:
        """True when this budget counts calls of ``model`` at ``provider``."""
        return provider == self.provider and (model or "").startswith(self.family)

    # --- reserving ----------------------------------------------------------------------

    def _need(self, estimated_input_tokens: int, max_output_tokens: int) -> Four:
        # the estimator's bias and three times its spread: an estimate that falls short
        # near an empty bucket is a 429; one that is too large only holds tokens until
        # the usage gives them back
        factor = min(4.0, max(self._ratio + 3.0 * self._spread, 0.5))
        est = math.ceil(estimated_input_tokens * factor)
        return 1.0, float(est), float(max_output_tokens), float(est + max_output_tokens)

    def _horizon(self, waited: float, urgency: float, max_wait: float | None) -> float:
        horizon = self.horizon * (1.0 + 3.0 * min(1.0, max(0.0, urgency))) + 2.0 * waited
        return horizon if max_wait is None else min(horizon, max(0.0, max_wait - waited))

    def _take_pending(self) -> Settlement | None:
        with self._lock:
            if self._pending.empty():
                return None
            pending, self._pending = self._pending, Settlement()
            self._sent_at = self.clock.wall()
            return pending

    def _check(self, estimated_input_tokens: int, max_output_tokens: int) -> None:
        for field, value in (
            ("estimated_input_tokens", estimated_input_tokens),
            ("max_output_tokens", max_output_tokens),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{field} must be an int >= 0, got {value!r}")

    def _known_line(self, horizon: float, waited: float, max_wait: float | None) -> float:
        """The pause before asking, when the line is surely longer than ``horizon`` (0: ask).

        The store's answers say how long the line was (a wait given now ends when the debt
        is paid); it drains at one second a second at most, so ``_line_until - now`` is a
        lower bound of the line. A horizon below it would be refused: the caller waits
        here until its horizon (growing twice as fast) meets the line, without a round trip.
        """
        line = self._line_until - self.clock.wall()
        if line <= horizon:
            return 0.0
        self._check_wait(waited + line, max_wait)
        return max((line - horizon) / 3.0, 0.05)

    def _check_wait(self, total: float, max_wait: float | None) -> None:
        if max_wait is not None and total > max_wait:
            raise LimiterTimeout(self.name, total)

    def _next(
        self, answer: tuple[bool, float, float], waited: float, max_wait: float | None
    ) -> float | None:
        """After the store answered: None when admitted, else the pause before asking again.
        Raises LimiterTimeout when the wait would outlast ``max_wait``."""
        admitted, wait, retry_in = answer
        if wait > 0:
            with self._lock:
                self._line_until = max(self._line_until, self.clock.wall() + wait)
        if admitted:
            return None  # its wait is within its horizon, itself within max_wait
        if wait < 0:  # the family's first call is out: this process waits for its answer
            with self._lock:
                self._probe_gate = max(self._probe_gate, self.clock.wall() + retry_in)
            wait = retry_in
        self._check_wait(waited + wait, max_wait)
        # the horizon grows twice as fast as the time waited: half the gap between the wait
        # and the horizon closes it while others keep the line as long (a drained line is
        # joined sooner, with the rest of the wait: the same total as a place taken at once)
        return max(retry_in / 2.0, 0.05)

    def _admitted(self, est: int, max_out: int, need: Four, waited: float) -> Reservation:
        with self._lock:
            self.reserved += 1
            self.waited += waited
            self.longest_wait = max(self.longest_wait, waited)
        return Reservation(self.name, need, est, max_out, waited)

    def reserve(
        self,
        *,
        estimated_input_tokens: int,
        max_output_tokens: int,
        max_wait: float | None = None,
        urgency: float = 0.0,
    ) -> Reservation:
        """Wait (on the clock) for this call's place in the budget and take it.

        ``urgency`` in [0, 1]: how close the caller's run is to its end (1: about to run
        out of time or budget); ``max_wait``: the longest the caller may wait. Raises
        :class:`tether.LimiterTimeout`, having sent nothing and kept nothing, when the
        wait would be longer.
        """
        self._check(estimated_input_tokens, max_output_tokens)
        need = self._need(estimated_input_tokens, max_output_tokens)
        waited = 0.0
        while True:
            gate = self._probe_gate - self.clock.wall()
            if gate > 0 and not self._calibrated:  # no need to ask: the probe is still out
                self._check_wait(waited + gate, max_wait)
                self.clock.sleep(gate)
                waited += gate
                continue
            horizon = self._horizon(waited, urgency, max_wait)
            known = self._known_line(horizon, waited, max_wait)
            if known:  # the line is surely longer than this caller's horizon: no need to ask
                self.clock.sleep(known)
                waited += known
                continue
            answer = self._ops.reserve(
                self.name, self.clock.wall(), self.config, need, horizon, self._take_pending()
            )
            pause = self._next(answer, waited, max_wait)
            wait = answer[1] if pause is None else pause
            if wait:
                self.clock.sleep(wait)
                waited += wait
            if answer[0]:
                return self._admitted(estimated_input_tokens, max_output_tokens, need, waited)

    async def areserve(
        self,
        *,
        estimated_input_tokens: int,
        max_output_tokens: int,
        max_wait: float | None = None,
        urgency: float = 0.0,
    ) -> Reservation:
        """The async form of :meth:`reserve`."""
        self._check(estimated_input_tokens, max_output_tokens)
        need = self._need(estimated_input_tokens, max_output_tokens)
        waited = 0.0
        while True:
            gate = self._probe_gate - self.clock.wall()
            if gate > 0 and not self._calibrated:  # no need to ask: the probe is still out
                self._check_wait(waited + gate, max_wait)
                await self.clock.asleep(gate)
                waited += gate
                continue
            horizon = self._horizon(waited, urgency, max_wait)
            known = self._known_line(horizon, waited, max_wait)
            if known:  # the line is surely longer than this caller's horizon: no need to ask
                await self.clock.asleep(known)
                waited += known
                continue
            answer = await self._ops.areserve(
                self.name, self.clock.wall(), self.config, need, horizon, self._take_pending()
            )
            pause = self._next(answer, waited, max_wait)
            wait = answer[1] if pause is None else pause
            if wait:
                await self.clock.asleep(wait)
                waited += wait
            if answer[0]:
                return self._admitted(estimated_input_tokens, max_output_tokens, need, waited)

    # --- settling -----------------------------------------------------------------------

    def _settlement(
        self,
        r: Reservation,
        input_tokens: int | None,
        output_tokens: int | None,
        headers: Any,
        status: int | None,
    ) -> tuple[Settlement, bool]:
        """What a response says, and whether the store must hear it now (a pause, the
        family's first response)."""
        now = self.clock.wall()
        s = Settlement(seen_at=now)
        sent = status is None or status != 429
        if input_tokens is None and output_tokens is None:
            # no usage: nothing was generated; a refused (429) call took no tokens at all
            s.refund = [0.0 if sent else 1.0, r.need[1], r.need[2], r.need[3]]
        else:
            used_in = float(input_tokens or 0)
            used_out = float(output_tokens or 0)
            s.refund = [
                0.0,
                r.need[1] - used_in,
                r.need[2] - used_out,
                r.need[3] - used_in - used_out,
            ]
            if r.estimated_input_tokens > 0 and used_in > 0:
                with self._lock:
                    seen = used_in / r.estimated_input_tokens
                    self._spread = 0.9 * self._spread + 0.1 * abs(seen - self._ratio)
                    self._ratio = 0.9 * self._ratio + 0.1 * seen
        limits, remaining, resets = rate_limit_headers(headers, now)
        s.limit, s.remaining = limits, remaining
        s.answered = status is not None or input_tokens is not None
        urgent = not self._calibrated and s.answered
        if status == 429:
            wait = retry_after_from_headers(headers, now_wall=now, include_reset=False)
            if wait is None:  # no Retry-After: the reset of an exhausted bucket
                wait = max(
                    [x for i, x in enumerate(resets) if x is not None and remaining[i] == 0]
                    or [1.0]
                )
            s.pause_until = now + wait
            urgent = True
            with self._lock:
                self.throttled += 1
        return s, urgent

    def settle(
        self,
        reservation: Reservation,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        headers: Any = None,
        status: int | None = None,
    ) -> None:
        """Give back what the call did not use and learn from its headers.

        ``input_tokens`` / ``output_tokens``: the response's usage (None: the call got no
        answer, everything goes back); ``headers``: the response's (or the 429's) headers;
        ``status``: its HTTP status (429 pauses the family for the fleet).
        """
        s, urgent = self._settlement(reservation, input_tokens, output_tokens, headers, status)
        pending = self._queue(s, urgent)
        if pending is not None:
            self._ops.settle(self.name, self.clock.wall(), self.config, pending)

    async def asettle(
        self,
        reservation: Reservation,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        headers: Any = None,
        status: int | None = None,
    ) -> None:
        """The async form of :meth:`settle`."""
        s, urgent = self._settlement(reservation, input_tokens, output_tokens, headers, status)
        pending = self._queue(s, urgent)
        if pending is not None:
            await self._ops.asettle(self.name, self.clock.wall(), self.config, pending)

    def _queue(self, s: Settlement, urgent: bool) -> Settlement | None:
        """Keep ``s`` for this process's next reservation (no round trip of its own), or
        return everything pending to send now: a pause, the family's first answer, or
        nothing sent for a second."""
        with self._lock:
            self._pending.merge(s)
            if s.answered:
                self._calibrated = True
            if not urgent and self.clock.wall() - self._sent_at < 1.0:
                return None
            pending, self._pending = self._pending, Settlement()
            self._sent_at = self.clock.wall()
            return pending

    def flush(self) -> None:
        """Send what this process learned and has not sent yet (e.g. before it exits)."""
        pending = self._take_pending()
        if pending is not None:
            self._ops.settle(self.name, self.clock.wall(), self.config, pending)

    def view(self) -> dict[str, Any]:
        """The shared state: the limits in force, the buckets' levels, a pause."""
        return self._ops.view(self.name, self.clock.wall(), self.config)

    def reset(self) -> None:
        """Forget this budget's shared state (its limits are the configured ones again)."""
        self._ops.reset(self.name)
        with self._lock:
            self._pending, self._calibrated, self._ratio = Settlement(), False, 1.0
            self._spread = 0.0


def budgets_for(budgets: Any) -> tuple[TokenBudget, ...]:
    """``token_budget=``: one budget, several, or None; as a tuple, checked."""
    if budgets is None:
        return ()
    found = (budgets,) if isinstance(budgets, TokenBudget) else tuple(budgets)
    for b in found:
        if not isinstance(b, TokenBudget):
            raise TypeError(
                f"token_budget must be a tether.TokenBudget or a list of them, got {b!r}"
            )
    return found


def pick(budgets: tuple[TokenBudget, ...], provider: str, model: str) -> TokenBudget | None:
    """The budget that counts ``model`` at ``provider``: the longest family that matches."""
    found = [b for b in budgets if b.covers(provider, model)]
    return max(found, key=lambda b: len(b.family)) if found else None


def headers_of(obj: Any) -> Mapping[str, str] | None:
    """The HTTP headers of an SDK response or error, when it carries them."""
    response = getattr(obj, "response", None)
    headers = getattr(response, "headers", None) or getattr(obj, "headers", None)
    return headers if headers is not None else None


def provider_of(model: str) -> str | None:
    """The provider a model name says, when it says one."""
    if model.startswith("claude"):
        return "anthropic"
    if model.startswith(("gpt-", "o1", "o3", "o4", "chatgpt")):
        return "openai"
    return None


def budget_for(
    budgets: tuple[TokenBudget, ...], model: str, provider: str | None
) -> TokenBudget | None:
    """The budget of ``budgets`` that counts ``model`` (at ``provider``, or the provider its
    name says, or any provider when it says none)."""
    if not budgets:
        return None
    provider = provider or provider_of(model)
    if provider is not None:
        return pick(budgets, provider, model)
    found = [b for b in budgets if (model or "").startswith(b.family)]
    return max(found, key=lambda b: len(b.family)) if found else None
