"""The guarded SDK clients in the token budgets: every attempt reserved, settled by its usage
and its rate-limit headers.

A guarded client (``guarded(client, token_budget=...)``, or a run whose guard has
``token_budget=``) estimates a request's prompt (its messages, system prompt and tools,
about four characters a token), takes ``max_tokens`` as the output's reservation, and
reserves before every attempt. The response is read raw (``with_raw_response``) so that
its ``anthropic-ratelimit-*`` / ``x-ratelimit-*`` headers calibrate the budget; a 429's
Retry-After pauses the family for the fleet. The first attempt is reserved before the
retry loop: when its wait would outlast the run's time budget the run stops ``TIMEOUT``
and no request is sent.
"""

from __future__ import annotations

import inspect
import math
from typing import TYPE_CHECKING, Any

from tether import StopReason
from tether._errors import LimiterTimeout
from tether.guards._tokens import (
    Reservation,
    TokenBudget,
    budget_for,
    estimate_tokens,
    headers_of,
)
from tether.providers import limits_count_cache_reads

if TYPE_CHECKING:
    from collections.abc import Callable

    from tether import Run
    from tether.providers._usage import UsageReader

__all__ = ["TokenGate", "gate_for", "usage_of"]

#: the output reserved for a request that names no ``max_tokens`` (OpenAI's is optional)
DEFAULT_MAX_OUTPUT = 4096


def usage_of(response: Any, read: UsageReader, provider: str) -> tuple[int | None, int | None]:
    """The tokens a response counts against its provider's limits: (input, output), read by
    the endpoint's own converter (the one the run's usage and price read), counted as the
    provider's profile says (Anthropic's cache reads are not input; OpenAI's are)."""
    usage = read(response)
    if usage is None:
        return None, None
    return usage.limited(limits_count_cache_reads(provider))


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


class TokenGate:
    """One request's way through its token budget: a reservation per attempt."""

    def __init__(
        self,
        budget: TokenBudget,
        run: Run | None,
        kwargs: dict[str, Any],
        raw: Callable[..., Any] | None,
        read: UsageReader,
        provider: str,
        halts: bool = True,
    ) -> None:
        self.budget = budget
        self.run = run
        #: the endpoint's usage converter, and its provider (what its limits count)
        self.read, self.provider = read, provider
        #: a wait past the run's time stops the run (False: a fallback model comes next,
        #: and the LimiterTimeout itself is raised)
        self.halts = halts
        self.estimate = estimate_tokens(
            kwargs.get("system"), kwargs.get("messages"), kwargs.get("tools")
        )
        limit = kwargs.get("max_tokens") or kwargs.get("max_completion_tokens")
        self.max_out = int(limit) if isinstance(limit, int) and limit > 0 else DEFAULT_MAX_OUTPUT
        self.raw = None if kwargs.get("stream") else raw
        self.held: Reservation | None = None

    def _ask(self) -> dict[str, Any]:
        run = self.run
        if run is None:
            return {"estimated_input_tokens": self.estimate, "max_output_tokens": self.max_out}
        return {
            "estimated_input_tokens": self.estimate,
            "max_output_tokens": self.max_out,
            "max_wait": run.time_left(),
            "urgency": run.urgency,
        }

    def _timeout(self, exc: LimiterTimeout) -> BaseException:
        if self.run is None or not self.halts:
            return exc
        return self.run.halt(
            StopReason.TIMEOUT,
            f"the token budget {self.budget.name!r} would admit the model call only in "
            f"{exc.wait:.1f} s, past the run's time budget; no request was sent",
        )

    def begin(self) -> None:
        """Reserve the first attempt, before the retry loop (TIMEOUT before the request)."""
        try:
            self.held = self.budget.reserve(**self._ask())
        except LimiterTimeout as exc:
            raise self._timeout(exc) from None

    async def abegin(self) -> None:
        try:
            self.held = await self.budget.areserve(**self._ask())
        except LimiterTimeout as exc:
            raise self._timeout(exc) from None

    def _refused(self, exc: BaseException) -> None:
        """A 429: the provider counts this prompt as more than the budget reserved for it
        (or others took the tokens): its next attempt reserves half as much again."""
        if _status(exc) == 429:
            self.estimate = math.ceil(self.estimate * 1.5)

    def _settle_args(self, response: Any, headers: Any) -> dict[str, Any]:
        if self.raw is None and response is not None and hasattr(response, "__iter__"):
            # a stream: its usage comes at its end; the reservation stands (nothing back)
            return {"input_tokens": self.estimate, "output_tokens": self.max_out, "status": 200}
        used_in, used_out = usage_of(response, self.read, self.provider)
        return {
            "input_tokens": used_in,
            "output_tokens": used_out,
            "headers": headers,
            "status": 200,
        }

    def call(self, target: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        """One attempt: reserved (the first one already is), sent raw, settled, parsed."""
        r, self.held = self.held or self.budget.reserve(**self._ask()), None
        headers = None
        try:
            if self.raw is not None:
                raw = self.raw(**kwargs)
                headers, response = raw.headers, raw.parse()
            else:
                response = target(**kwargs)
        except BaseException as exc:
            self.budget.settle(r, headers=headers_of(exc), status=_status(exc))
            self._refused(exc)
            raise
        self.budget.settle(r, **self._settle_args(response, headers))
        return response

    async def acall(self, target: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        """The async form of :meth:`call`."""
        r, self.held = self.held or await self.budget.areserve(**self._ask()), None
        headers = None
        try:
            if self.raw is not None:
                raw = await self.raw(**kwargs)
                headers, response = raw.headers, raw.parse()
                if inspect.isawaitable(response):  # the SDKs' async raw responses
                    response = await response
            else:
                response = await target(**kwargs)
        except BaseException as exc:
            await self.budget.asettle(r, headers=headers_of(exc), status=_status(exc))
            self._refused(exc)
            raise
        await self.budget.asettle(r, **self._settle_args(response, headers))
        return response


def _raw_twin(target: Any) -> Callable[..., Any] | None:
    """``resource.with_raw_response.<method>`` of an SDK method, when it has one."""
    owner = getattr(target, "__self__", None)
    twin = getattr(getattr(owner, "with_raw_response", None), getattr(target, "__name__", ""), None)
    return twin if callable(twin) else None


def gate_for(
    budgets: tuple[TokenBudget, ...],
    run: Run | None,
    provider: str,
    target: Any,
    kwargs: dict[str, Any],
    read: UsageReader,
    *,
    halts: bool = True,
) -> TokenGate | None:
    """The gate of a request: None when no budget (the client's, then the run's guard's)
    covers its model. ``read``: the endpoint's usage converter; ``halts``: see
    :attr:`TokenGate.halts`."""
    if run is not None:
        budgets = budgets + tuple(getattr(run.guard, "token_budgets", ()))
    budget = budget_for(budgets, str(kwargs.get("model") or ""), provider)
    if budget is None:
        return None
    return TokenGate(budget, run, kwargs, _raw_twin(target), read, provider, halts)
