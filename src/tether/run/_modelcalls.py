"""The model calls of a run: the check before a paid request, its usage and cost after,
its retries within the run's time, and the stop a failed one causes."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from tether import telemetry
from tether._errors import CircuitOpenError
from tether.run._options import ModelTurn
from tether.run._outcome import Stopped, StopReason
from tether.run._pricing import UnknownModelError
from tether.run._runstate import RunState
from tether.run._scopes import RunScopes

if TYPE_CHECKING:
    from tether.retries._policy import RetryPolicy

T = TypeVar("T")

__all__ = ["ModelCalls"]

_log = logging.getLogger("tether")


class ModelCalls:
    """A run's model calls (a part of :class:`tether.Run`, given the run's state)."""

    def __init__(self, state: RunState) -> None:
        self.s = state
        #: the run's reservations in its budget scopes (``guard.start(scopes=...)``)
        self.scopes = RunScopes(state)

    def begin(self, turn: ModelTurn) -> float | None:
        """See :meth:`tether.Run.begin_model_call`."""
        request = self.turn(**turn)
        self.scopes.reserve(*request)
        try:
            self.s._tokens.reserve(*request)
        except BaseException:
            self.scopes.release_last()
            raise
        return self.s.time_left()

    async def abegin(self, turn: ModelTurn) -> float | None:
        """See :meth:`tether.Run.abegin_model_call`."""
        request = self.turn(**turn)
        await self.scopes.areserve(*request)
        try:
            await self.s._tokens.areserve(*request)
        except BaseException:
            self.scopes.release_last()
            raise
        return self.s.time_left()

    def turn(
        self,
        *,
        model: str = "",
        provider: str | None = None,
        estimated_input_tokens: int | None = None,
        max_output_tokens: int | None = None,
    ) -> tuple[str, str | None, int | None, int | None]:
        """What both shells check before a paid request (the run has not stopped, its
        model can be counted); the request as the token budget takes it."""
        if self.s._stop is not None:
            raise self.s._halt(*self.s._stop)
        if model:
            self.check_model(model, provider)
            if max_output_tokens and self.s.budget.max_cost_usd is not None:
                self.check_cost(model, provider, estimated_input_tokens or 0, max_output_tokens)
        return model, provider, estimated_input_tokens, max_output_tokens

    def check_cost(
        self, model: str, provider: str | None, input_tokens: int, max_output_tokens: int
    ) -> None:
        """Stop the run ``MAX_COST`` before a request whose price could pass the cost budget:
        its prompt estimate and its ``max_tokens``, at the model's price, against what the
        budget has left. Read from the request itself, so it holds on a run's first call and
        on a resumed run's (which has no earlier calls to extrapolate from)."""
        limit = self.s.budget.max_cost_usd
        if limit is None:
            return
        worst = self.s.guard.prices.cost(model, input_tokens, max_output_tokens, provider=provider)
        left = limit - self.s.cost_usd
        if worst is not None and worst > left:
            raise self.s._halt(
                StopReason.MAX_COST,
                f"${self.s.cost_usd:.4f} spent; the next request to {model} could cost up to "
                f"${worst:.4f} ({input_tokens} prompt tokens estimated, max_tokens="
                f"{max_output_tokens}), more than the ${left:.4f} left of ${limit:.4f}",
            )

    def check_model(self, model: str, provider: str | None = None) -> None:
        """Refuse, before the request, a model whose cost a cost budget could not count."""
        if self.s.budget.max_cost_usd is None or not model or model in self.s._checked_models:
            return
        prices = self.s.guard.prices
        if not prices.knows(model, provider):
            if prices.unknown != "zero":
                raise UnknownModelError(
                    f"{prices.missing(model)}. The run has a cost budget "
                    f"(max_cost_usd={self.s.budget.max_cost_usd:g}) that could not hold, so no "
                    "request was sent"
                )
            _log.warning(
                "tether: model %r has no price and counts as free (unknown='zero'): "
                "the cost budget cannot hold for it",
                model,
            )
        self.s._checked_models.add(model)

    def model_call_gave_way(self, exc: BaseException) -> None:
        """A model call that gave way to a fallback model after ``exc``: its token
        reservation goes back, as a failed call's does, and the run goes on (the fallback
        reserves its own)."""
        self.s._tokens.release(exc)
        self.scopes.release()

    def model_call_failed(self, exc: BaseException) -> Stopped:
        """Stop the run for a model call that failed after its retries, with the reason its
        failure says (``TIMEOUT`` for the time budget, ``CIRCUIT_OPEN`` for a provider that
        is down, ``ERROR`` or ``PERMANENT_ERROR`` by classification); returns the Stopped
        to raise (an agent loop raises it, a framework's hook may just end the agent).

        A :class:`Warning` raised as an exception (this process's warnings filter turns it
        into an error, as ``-W error`` or pytest's ``filterwarnings = error`` do) is not a
        verdict on the request: the run ends ``ERROR`` and the warning itself is raised,
        unchanged, for the caller to see (a model name its provider deprecates, say)."""
        from tether._errors import DeadlineExceeded
        from tether.classification._classify import classify

        self.s.note_error(exc)
        self.s._tokens.release(exc)
        self.scopes.release()
        if isinstance(exc, Warning):
            self.s._halt(StopReason.ERROR, f"{type(exc).__name__} raised as an error: {exc}")
            raise exc
        if isinstance(exc, DeadlineExceeded) and self.s.budget.max_seconds is not None:
            return self.s._halt(StopReason.TIMEOUT, "the time budget ran out waiting for the model")
        if isinstance(exc, CircuitOpenError):
            return self.s._halt(StopReason.CIRCUIT_OPEN, f"the model provider is down ({exc})")
        verdict = classify(exc)
        reason = StopReason.ERROR if verdict.retryable else StopReason.PERMANENT_ERROR
        return self.s._halt(reason, f"model call failed: {verdict.reason}")

    def retry_model_call(self, policy: RetryPolicy, fn: Callable[[], T]) -> T:
        """``fn()`` under ``policy``, never past the run's time left; its retries are
        counted into the run's usage. A failure after the retries is raised (see
        :meth:`model_call_failed`)."""
        try:
            return policy.call_within(self.s.time_left(), fn)
        finally:
            self.s.retries += policy.statistics.retries

    async def aretry_model_call(self, policy: RetryPolicy, fn: Callable[[], Awaitable[T]]) -> T:
        """The async form of :meth:`retry_model_call`."""
        try:
            return await policy.acall_within(self.s.time_left(), fn)
        finally:
            self.s.retries += policy.statistics.retries

    def record_model_call(
        self,
        *,
        input_tokens: int = 0,
        output_tokens: int = 0,
        model: str = "",
        cache_write_tokens: int = 0,
        cache_read_tokens: int = 0,
        cost_usd: float | None = None,
        provider: str | None = None,
        unmeasured: bool = False,
    ) -> float | None:
        """See :meth:`tether.Run.record_model_call`."""
        counts = {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cache_write_tokens": cache_write_tokens,
            "cache_read_tokens": cache_read_tokens,
        }
        for name, value in counts.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        self.s._tokens.settle(model, input_tokens + cache_write_tokens, output_tokens)
        if unmeasured:
            cost_usd = None
        elif cost_usd is None:
            if model:
                cost_usd = self.s.guard.prices.cost(
                    model,
                    input_tokens,
                    output_tokens,
                    cache_write_tokens,
                    cache_read_tokens,
                    provider=provider,
                )
            elif self.s.budget.max_cost_usd is not None and (input_tokens or output_tokens):
                raise ValueError(
                    "a cost budget is set: pass model= (priced from the table) or cost_usd="
                )
            else:
                cost_usd = 0.0
        self.s.model_calls += 1
        if model and model not in self.s.models:
            self.s.models.append(model)
        self.s.input_tokens += input_tokens
        self.s.output_tokens += output_tokens
        self.s.cache_write_tokens += cache_write_tokens
        self.s.cache_read_tokens += cache_read_tokens
        if cost_usd is None:
            self.s.unpriced_calls += 1
        else:
            self.s.cost_usd += cost_usd
            self.s._last_costs = [*self.s._last_costs[-1:], cost_usd]
        self.s._last_tokens = input_tokens + output_tokens + cache_write_tokens + cache_read_tokens
        self.scopes.settle(
            cost_usd, input_tokens + cache_write_tokens + cache_read_tokens, output_tokens
        )
        telemetry.add_event(
            "gen_ai.client.inference",
            **{
                "gen_ai.request.model": model or None,
                "gen_ai.usage.input_tokens": input_tokens,
                "gen_ai.usage.output_tokens": output_tokens,
                "tether.cost_usd": cost_usd,
                "tether.scopes": list(self.s.scopes) or None,  # the budget scopes it spent in
            },
        )
        self.s.transcript.append(
            {
                "step": self.s.steps,
                "model": model,
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "cost_usd": cost_usd,
            }
        )
        if cost_usd is None and self.s.budget.max_cost_usd is not None:
            why = (
                "the provider reported no token counts for this call"
                if unmeasured
                else (self.s.guard.prices.missing(model))
            )
            raise UnknownModelError(f"{why}; the cost budget cannot count this call")
        return cost_usd
