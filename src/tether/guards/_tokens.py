"""The fleet's token budget: a provider's requests and tokens per minute, shared by every agent.

A provider limits requests, input tokens and output tokens per minute per model family
(Anthropic), or requests and tokens per minute per model (OpenAI), and admits a request
by its *estimated* tokens: the prompt plus ``max_tokens``. :class:`TokenBudget` keeps
those buckets in a store (the fleet's, e.g. Redis), reserves a call's estimate before it
goes out, gives the difference back from the response's usage, and learns the real
limits and levels from the response headers (``anthropic-ratelimit-*``,
``x-ratelimit-*``). A 429's ``Retry-After`` pauses the family for the whole fleet.

Its parts: the state machine in the store (:mod:`tether.stores._tokens`), what responses
teach (:mod:`tether.guards._token_calibration`), this process's place in the line and
what it tells the store (:mod:`tether.guards._token_line`).
"""

from __future__ import annotations

import math
import os
import threading
from typing import TYPE_CHECKING, Any, cast

from tether._sansio import adrive, drive
from tether.clock import Clock, system_clock
from tether.guards._token_calibration import (
    Estimator,
    Reservation,
    estimate_tokens,
    headers_of,
    rate_limit_headers,
    settlement_of,
)
from tether.guards._token_line import Line, Outbox, Plan
from tether.providers import provider_of
from tether.stores._base import bind_name
from tether.stores._memory import default_store
from tether.stores._tokens import TokenConfig, token_ops

if TYPE_CHECKING:
    from tether.stores._base import Store

__all__ = [
    "Reservation",
    "TokenBudget",
    "budget_for",
    "estimate_tokens",
    "headers_of",
    "provider_of",
    "rate_limit_headers",
    "adrive_for",
    "drive_for",
    "reserve_plan",
]


def _limit(field: str, value: float | None) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{field} must be a positive number or None, got {value!r}")
    if math.isinf(value):
        raise ValueError(f"{field} must be finite (None means: not configured), got {value!r}")
    return float(value)


def _check(estimated_input_tokens: int, max_output_tokens: int) -> None:
    for field, value in (
        ("estimated_input_tokens", estimated_input_tokens),
        ("max_output_tokens", max_output_tokens),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{field} must be an int >= 0, got {value!r}")


class TokenBudget:
    """Requests, input tokens and output tokens per minute for one provider and model family,
    shared by every agent that uses the same ``store``.

    >>> budget = tether.TokenBudget(provider="anthropic", family="claude-sonnet-5",
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
      little time or budget left), down to a quarter for one that yields (a run whose
      budget scope is near its limit), plus the time it has already waited. So the longest
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
        retry_after_cap: float = 60.0,
    ) -> None:
        if not provider or not isinstance(provider, str):
            raise ValueError(f"provider must be a non-empty string, got {provider!r}")
        if not isinstance(family, str):
            raise ValueError(f"family must be a string (a model name prefix), got {family!r}")
        if not isinstance(horizon, int | float) or not horizon > 0:
            raise ValueError(f"horizon must be > 0 seconds, got {horizon!r}")
        if not isinstance(probe_timeout, int | float) or not probe_timeout > 0:
            raise ValueError(f"probe_timeout must be > 0 seconds, got {probe_timeout!r}")
        if not isinstance(retry_after_cap, int | float) or not 0 < retry_after_cap < math.inf:
            raise ValueError(f"retry_after_cap must be > 0 seconds, got {retry_after_cap!r}")
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
        self.retry_after_cap = float(retry_after_cap)
        self.store: Store = store if store is not None else default_store
        self.clock: Clock = clock or system_clock
        self._ops = token_ops(self.store)
        self._outbox = Outbox(self.name, self.config, self.clock, self._ops)
        self._line = Line(self._outbox, self.horizon)
        self._estimator = Estimator()
        self._lock = threading.Lock()
        self._tickets = Tickets()
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

    def reserve(
        self,
        *,
        estimated_input_tokens: int,
        max_output_tokens: int,
        max_wait: float | None = None,
        urgency: float = 0.0,
    ) -> Reservation:
        """Wait (on the clock) for this call's place in the budget and take it.

        ``urgency`` in [-1, 1]: how close the caller's run is to its end (1: about to run
        out of time or budget; admitted first), or, below 0, how much it yields to others
        (-1: its tenant's budget scope is at its limit; admitted after them);
        ``max_wait``: the longest the caller may wait. Raises
        :class:`tether.LimiterTimeout`, having sent nothing and kept nothing, when the
        wait would be longer.
        """
        plan = reserve_plan(self, estimated_input_tokens, max_output_tokens, max_wait, urgency)
        return drive(plan, self.clock)

    async def areserve(
        self,
        *,
        estimated_input_tokens: int,
        max_output_tokens: int,
        max_wait: float | None = None,
        urgency: float = 0.0,
    ) -> Reservation:
        """The async form of :meth:`reserve`."""
        plan = reserve_plan(self, estimated_input_tokens, max_output_tokens, max_wait, urgency)
        return await adrive(plan, self.clock)

    def _settle_plan(
        self, r: Reservation, usage: tuple[int | None, int | None], headers: Any, status: Any
    ) -> Plan[None]:
        if not self._tickets.settle(r):
            return _nothing()  # settled before: once is what counts
        s = settlement_of(r, *usage, headers, status, self.clock.wall(), self.retry_after_cap)
        if usage[0] is not None:
            self._estimator.learn(r.estimated_input_tokens, r.need[1] - s.refund[1])
        if status == 429:
            with self._lock:
                self.throttled += 1
        return self._outbox.queue(s)

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
        answer, everything goes back), counted at most as what the call can have used
        (``max_tokens`` out, four times the prompt's estimate and 1,024 in); ``headers``: the
        response's (or the 429's) headers; ``status``: its HTTP status (429 pauses the
        family for the fleet, at most ``retry_after_cap`` seconds).

        A reservation is settled once: settling it again does nothing. One this budget did
        not make (by hand, or another budget object's) raises ValueError.
        """
        plan = self._settle_plan(reservation, (input_tokens, output_tokens), headers, status)
        drive(plan, self.clock)

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
        plan = self._settle_plan(reservation, (input_tokens, output_tokens), headers, status)
        await adrive(plan, self.clock)

    def flush(self) -> None:
        """Send what this process learned and has not sent yet (e.g. before it exits)."""
        drive(self._outbox.flush(), self.clock)

    def view(self) -> dict[str, Any]:
        """The shared state: the limits in force, the buckets' levels, a pause."""
        return self._ops.view(self.name, self.clock.wall(), self.config)

    def reset(self) -> None:
        """Forget this budget's shared state (its limits are the configured ones again)."""
        self._ops.reset(self.name)
        self._outbox.reset()
        self._line.reset()
        self._tickets.reset()
        self._estimator.reset()


def reserve_plan(
    budget: TokenBudget,
    estimated_input_tokens: int,
    max_output_tokens: int,
    max_wait: float | None = None,
    urgency: float = 0.0,
) -> Plan[Reservation]:
    """The plan of :meth:`TokenBudget.reserve` (drive it with :func:`drive_for`): for a
    caller that waits for its place among other steps of its own (a run's)."""
    _check(estimated_input_tokens, max_output_tokens)
    need = budget._estimator.need(estimated_input_tokens, max_output_tokens)
    margin = budget._estimator.margin(estimated_input_tokens, need)
    waited = yield from budget._line.wait(need, max_wait, urgency, margin)
    with budget._lock:
        budget.reserved += 1
        budget.waited += waited
        budget.longest_wait = max(budget.longest_wait, waited)
    ticket = budget._tickets.issue()
    return Reservation(
        budget.name, need, estimated_input_tokens, max_output_tokens, waited, ticket, margin
    )


def _nothing() -> Plan[None]:
    return
    yield  # a plan with no step


class Tickets:
    """The ids of a budget's reservations, each settled once.

    An id is the budget's random mark and a number. A settlement of an id issued and not
    settled yet counts; of one settled before, nothing (idempotent); of one never issued
    here, a ValueError. At most ``MAX_OPEN`` are held open: the oldest beyond (a call whose
    caller never settled it) count as settled, so its tokens stay spent (the safe side).
    """

    MAX_OPEN = 100_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mark = os.urandom(8).hex()
        self._issued = 0
        self._open: dict[int, None] = {}

    def issue(self) -> str:
        with self._lock:
            self._issued += 1
            self._open[self._issued] = None
            if len(self._open) > self.MAX_OPEN:
                del self._open[next(iter(self._open))]
            return f"{self._mark}:{self._issued}"

    def settle(self, r: Reservation) -> bool:
        """True: settle ``r`` now; False: it was settled before. Raises ValueError for a
        reservation this budget never made."""
        mark, _, number = r.id.partition(":")
        with self._lock:
            if mark == self._mark and number.isdigit() and 0 < int(number) <= self._issued:
                return self._open.pop(int(number), False) is None
        raise ValueError(
            f"token budget {r.name!r}: a settlement for a reservation it never made "
            f"(id {r.id!r}); settle the Reservation its reserve() returned, on that budget"
        )

    def reset(self) -> None:
        with self._lock:
            self._open.clear()


def drive_for(budget: TokenBudget, plan: Plan[Any]) -> Any:
    """Run ``plan`` (steps of ``budget``) in this thread."""
    return drive(plan, budget.clock)


async def adrive_for(budget: TokenBudget, plan: Plan[Any]) -> Any:
    """Run ``plan`` (steps of ``budget``) on the event loop."""
    return await adrive(plan, budget.clock)


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
