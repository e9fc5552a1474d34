"""The model calls of a run: the check before a paid request, its usage and cost after,
its retries within the run's time, and the stop a failed one causes."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from tether import telemetry
from tether._errors import CircuitOpenError
from tether.run._options import ModelRequest
from tether.run._outcome import Stopped, StopReason
from tether.run._pricing import UnknownModelError
from tether.run._runstate import (
    RunState,
    count_model_call,
    model_checked,
)
from tether.run._scopes import RunScopes
from tether.run._turn import ModelTurn

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

    def begin(self, turn: ModelRequest) -> float | None:
        """See :meth:`tether.Run.begin_model_call`."""
        self.reserve(*self.turn(**turn))
        return self.s.time_left()

    async def abegin(self, turn: ModelRequest) -> float | None:
        """See :meth:`tether.Run.abegin_model_call`."""
        await self.areserve(*self.turn(**turn))
        return self.s.time_left()

    def model_turn(
        self,
        model: str = "",
        *,
        estimate: int | None = None,
        max_output: int | None = None,
        provider: str | None = None,
    ) -> ModelTurn:
        """One paid model request, from its checks to its usage:
        ``with run.model_turn(model=..., estimate=..., max_output=...) as turn:``, then
        ``reply = turn.call(send, policy=...)`` and ``turn.record(usage)``.

        Entering checks the run (a stopped run raises :class:`tether.Stopped`, an unpriced
        model under a cost budget :class:`tether.UnknownModelError`), prices the request's
        worst case once (``estimate`` prompt tokens, ``max_output`` tokens) against the cost
        budget and the budget scopes, and takes the token budget's reservation (whose wait
        may stop the run ``TIMEOUT``). :meth:`ModelTurn.call <tether.run._turn.ModelTurn.call>`
        waits out an open breaker and retries within the run's time; ``turn.record`` counts
        the usage and settles the reservations. A failure leaving the block stops the run
        with its reason (raised as :class:`tether.Stopped` from it); a block left with no
        usage counts an unmeasured call. See docs/run.md.
        """
        return ModelTurn(self, model, provider, estimate, max_output)

    def amodel_turn(
        self,
        model: str = "",
        *,
        estimate: int | None = None,
        max_output: int | None = None,
        provider: str | None = None,
    ) -> ModelTurn:
        """The async form of :meth:`model_turn`: ``async with run.amodel_turn(...) as turn``,
        ``await turn.acall(send, policy=...)`` (the token budget's wait, the breaker's and
        the retries' sleep on the event loop)."""
        return ModelTurn(self, model, provider, estimate, max_output)

    def reserve(self, *request: Any) -> None:
        """Reserve a checked request (:meth:`turn`) in the run's scopes, then in the token
        budget; a refusal of the second gives the first back."""
        model, provider, estimated, max_out, price = request
        self.scopes.reserve(model, provider, estimated, max_out, price)
        try:
            self.s._tokens.reserve(model, provider, estimated, max_out)
        except BaseException:
            self.scopes.release_last()
            raise

    async def areserve(self, *request: Any) -> None:
        """The async form of :meth:`reserve` (a token budget's wait sleeps on the loop)."""
        model, provider, estimated, max_out, price = request
        await self.scopes.areserve(model, provider, estimated, max_out, price)
        try:
            await self.s._tokens.areserve(model, provider, estimated, max_out)
        except BaseException:
            self.scopes.release_last()
            raise

    def turn(
        self,
        *,
        model: str = "",
        provider: str | None = None,
        estimated_input_tokens: int | None = None,
        max_output_tokens: int | None = None,
    ) -> tuple[str, str | None, int | None, int | None, float | None]:
        """What every shell checks before a paid request (the run has not stopped, its
        model can be counted, its worst case fits the cost budget); the request as the
        budgets take it, with its worst-case price: priced once, for the cost budget and
        the budget scopes alike (None: not priced, or no budget reads it)."""
        s = self.s
        if s._stop is not None:
            raise s._halt(*s._stop)
        price = None
        if model:
            self.check_model(model, provider)
            if s.budget.max_cost_usd is not None or self.scopes.book is not None:
                price = s.guard.prices.cost(
                    model, estimated_input_tokens or 0, max_output_tokens or 0, provider=provider
                )
            if max_output_tokens and s.budget.max_cost_usd is not None:
                self.check_cost(model, estimated_input_tokens or 0, max_output_tokens, price)
        return model, provider, estimated_input_tokens, max_output_tokens, price

    def check_cost(
        self, model: str, input_tokens: int, max_output_tokens: int, worst: float | None
    ) -> None:
        """Stop the run ``MAX_COST`` before a request whose price could pass the cost budget:
        ``worst``, its prompt estimate and its ``max_tokens`` at the model's price, against
        what the budget has left. Read from the request itself, so it holds on a run's first
        call and on a resumed run's (which has no earlier calls to extrapolate from)."""
        limit = self.s.budget.max_cost_usd
        if limit is None:
            return
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
        model_checked(self.s, model)

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
            return self.s.outage(exc.name, f"the model provider is down ({exc})")
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
        count_model_call(
            self.s,
            model,
            input_tokens,
            output_tokens,
            cache_write_tokens,
            cache_read_tokens,
            cost_usd,
        )
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
