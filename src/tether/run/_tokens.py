"""A run's model calls in the guard's token budgets: reserved at the turn's start, settled
by its usage.

:meth:`Run.begin_model_call` (``abegin_model_call``) with ``estimated_input_tokens`` takes
the call's place in the budget that covers its model, waiting on the run's clock (the
wait counts against the run's time budget); a wait longer than the run's time left stops
the run ``TIMEOUT`` before the request. :meth:`Run.record_model_call` gives back what the
call did not use. The guarded SDK clients reserve per attempt themselves (they also read
the headers): they call ``begin_model_call`` without an estimate.
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

from tether._errors import LimiterTimeout
from tether.run._outcome import StopReason

if TYPE_CHECKING:
    from tether.guards._token_line import Plan
    from tether.guards._tokens import Reservation, TokenBudget

__all__ = ["NEAR_LIMIT", "RunTokens", "urgency"]

#: a budget scope past this share of its limit lowers its runs' priority in a token budget
NEAR_LIMIT = 0.8


def urgency(run: Any) -> float:
    """How close ``run`` is to its end, in [0, 1]: the largest share of any of its budgets
    (time, steps, model calls, tokens, cost) already spent. The token budget admits an
    urgent run first.

    A run whose budget scope (a tenant's, a user's) is past ``NEAR_LIMIT`` of its limit
    yields instead: its urgency is below 0, down to -1 at the limit, so the fleet's token
    budget admits the runs of other scopes before it (it still gets its turn: a caller's
    horizon grows with its wait)."""
    near = float(getattr(run, "scope_share", 0.0))
    if near > NEAR_LIMIT:
        return -min(1.0, (near - NEAR_LIMIT) / (1.0 - NEAR_LIMIT))
    b = run.budget
    shares = [0.0]
    if b.max_seconds:
        shares.append(run.elapsed / b.max_seconds)
    for used, limit in (
        (run.steps, b.max_steps),
        (run.model_calls, b.max_model_calls),
        (run.input_tokens + run.output_tokens, b.max_tokens),
        (run.cost_usd, b.max_cost_usd),
    ):
        if limit:
            shares.append(used / limit)
    return min(1.0, max(shares))


class RunTokens:
    """The reservations of a run's model calls still waiting for their usage."""

    def __init__(self, run: Any) -> None:  # a RunState (which holds this object)
        # weakly: the state holds this object, a strong reference back would be a cycle
        self._run = weakref.ref(run)
        self.held: deque[tuple[TokenBudget, Reservation, str]] = deque()

    @property
    def run(self) -> Any:
        """The run's state (alive while its run is, which holds this object through it)."""
        state = self._run()
        if state is None:
            raise ReferenceError("the run that holds these reservations was let go")
        return state

    def _budget(self, model: str, provider: str | None) -> TokenBudget | None:
        budgets = getattr(self.run.guard, "token_budgets", ())
        if not budgets:
            return None  # a guard without token budgets loads none of their modules
        from tether.guards._tokens import budget_for

        return budget_for(budgets, model, provider)

    def _stopped(self, budget: TokenBudget, exc: LimiterTimeout) -> BaseException:
        stopped: BaseException = self.run.halt(
            StopReason.TIMEOUT,
            f"the token budget {budget.name!r} would admit the next model call only in "
            f"{exc.wait:.1f} s, past the run's time budget; no request was sent",
        )
        return stopped

    def _plan(
        self, budget: TokenBudget, model: str, estimated: int, max_out: int | None
    ) -> Plan[None]:
        """Take the call's place (waiting for it); stop the run TIMEOUT when it would come
        after the run's time budget."""
        from tether.guards._tokens import reserve_plan

        try:
            plan = reserve_plan(
                budget, estimated, max_out or 0, self.run.time_left(), urgency(self.run)
            )
            r = yield from plan
        except LimiterTimeout as exc:
            raise self._stopped(budget, exc) from None
        self.held.append((budget, r, model))

    def reserve(
        self, model: str, provider: str | None, estimated: int | None, max_out: int | None
    ) -> None:
        """Wait for the call's place in the budget that covers ``model`` (if any)."""
        budget = self._budget(model, provider)
        if budget is not None and estimated is not None:
            from tether.guards._tokens import drive_for

            drive_for(budget, self._plan(budget, model, estimated, max_out))

    async def areserve(
        self, model: str, provider: str | None, estimated: int | None, max_out: int | None
    ) -> None:
        """The async form of :meth:`reserve`."""
        budget = self._budget(model, provider)
        if budget is not None and estimated is not None:
            from tether.guards._tokens import adrive_for

            await adrive_for(budget, self._plan(budget, model, estimated, max_out))

    def settle(self, model: str, input_tokens: int | None, output_tokens: int | None) -> None:
        """Give back what the oldest held reservation (of this model, if named) did not use."""
        if not self.held:
            return
        found = next((h for h in self.held if not model or h[2] == model), self.held[0])
        self.held.remove(found)
        budget, r, _ = found
        budget.settle(r, input_tokens=input_tokens, output_tokens=output_tokens, status=200)

    def release(self, exc: BaseException | None = None) -> None:
        """The calls that got no answer (failed with ``exc``): everything back; a 429's
        Retry-After pauses the family."""
        if not self.held:
            return
        from tether.guards._tokens import headers_of

        status = getattr(exc, "status_code", None) if exc is not None else None
        while self.held:
            budget, r, _ = self.held.popleft()
            budget.settle(
                r,
                headers=headers_of(exc) if exc is not None else None,
                status=status if isinstance(status, int) else None,
            )
