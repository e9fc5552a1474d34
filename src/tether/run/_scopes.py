"""Budgets that nest across runs: a tenant's, a user's, a team's, shared by the fleet.

``BudgetScopes`` holds a limit per scope name; ``guard.start(task, scopes=(...))`` puts a
run under some of them. Every model call of the run reserves its priced estimate (the
prompt's estimate and its ``max_tokens``, at the guard's prices) in all of its scopes at
once before the request is sent (:class:`RunScopes`), and its reply's usage replaces the
reservation, once per call id. A scope that has no room stops the run
``BUDGET_REACHED`` (status ``"paused"``), before the request; once its limit is raised,
``guard.resume(checkpoint_id)`` continues the run. The state machine is
:mod:`tether.stores._scopes`.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from tether._frozen import Value, frozen_dataclass
from tether.clock import Clock, system_clock
from tether.run._outcome import Outcome, StopReason, Usage
from tether.run._pricing import UnknownModelError

if TYPE_CHECKING:
    from tether.run._runstate import RunState
    from tether.stores._scopes import ScopeLimits, ScopeOps

__all__ = ["BudgetScopes", "RunScopes", "ScopeView", "scope_names"]

_LIMIT_NAMES = {
    "max_cost": "max_cost_usd",
    "max_tokens": "max_tokens",
    "max_calls": "max_model_calls",
}


@frozen_dataclass
class ScopeView(Value):
    """One scope as the operator reads it: its limits, what it spent (in its window),
    what calls in flight hold, and the runs waiting on it (run id -> checkpoint id)."""

    name: str
    limits: ScopeLimits
    spent: Usage
    held: Usage
    in_flight: int
    waiting: dict[str, str]


def _usage(four: dict[str, float]) -> Usage:
    return Usage(
        model_calls=int(four["model_calls"]),
        input_tokens=int(four["input_tokens"]),
        output_tokens=int(four["output_tokens"]),
        cost_usd=float(four["cost_usd"]),
    )


_OPS: weakref.WeakKeyDictionary[Any, ScopeOps] = weakref.WeakKeyDictionary()


def _ops_of(store: Any) -> ScopeOps:
    from tether.stores._scopes import MemoryScopes  # loaded with the first scopes

    if store is None:
        return MemoryScopes()
    own = getattr(store, "scopes", None)
    if callable(own):
        ops: ScopeOps = own()
        return ops
    from tether.stores._memory import MemoryStore

    if not isinstance(store, MemoryStore):
        # a store that cannot hold scopes would keep them in this process alone: every
        # process of a fleet would spend the whole limit
        raise TypeError(
            "BudgetScopes(store=...) takes None or a MemoryStore (this process), a "
            "tether.stores.RedisStore or tether.Records (a fleet), got "
            f"{type(store).__name__}: it cannot hold budget scopes"
        )
    return _OPS.setdefault(store, MemoryScopes())


def scope_names(scopes: Iterable[str] | None, book: object = True) -> tuple[str, ...]:
    """The scope names a run is started with, checked (a bare string is refused: it would
    be read as its letters); ``book``: the guard's :class:`BudgetScopes` (None: none)."""
    if scopes is None:
        return ()
    if isinstance(scopes, str):
        raise TypeError(f"scopes must be a tuple of scope names, got the string {scopes!r}")
    names = tuple(scopes)
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a scope name must be a non-empty string, got {name!r}")
    if names and book is None:
        raise ValueError(
            "scopes= names budget scopes but this guard has none: pass "
            "scopes=tether.BudgetScopes(...) to Guard"
        )
    return tuple(dict.fromkeys(names))


class BudgetScopes:
    """Limits that span runs, each under a scope name (``"tenant:acme"``, ``"user:u-7"``).

    ``store``: where the scopes live; None keeps them in this process's memory, a
    :class:`tether.stores.RedisStore` shares them with every process that uses it (one
    round trip per model call for all of its scopes), and so does a :class:`tether.Records`
    database on PostgreSQL or SQLite (one transaction per model call). ``clock`` measures the windows.

    >>> scopes = BudgetScopes()
    >>> scopes.limit("tenant:acme", max_cost_usd=50.0)
    >>> scopes.spent("tenant:acme").cost_usd
    0.0
    """

    def __init__(self, store: Any = None, *, clock: Clock | None = None) -> None:
        self.store = store
        self.clock: Clock = clock or system_clock
        self._ops: ScopeOps = _ops_of(store)

    def __repr__(self) -> str:
        return f"BudgetScopes(store={self.store!r})"

    def _now(self) -> float:
        return self.clock.wall()

    def limit(
        self,
        name: str,
        max_cost_usd: float | None = None,
        max_tokens: int | None = None,
        max_model_calls: int | None = None,
        window: float | None = None,
    ) -> None:
        """Set the limits of scope ``name`` (None: no limit of that kind); ``window``: a
        rolling period in seconds, or None (the limit holds until raised). Raising a limit
        gives room at once: the runs waiting on the scope can be resumed."""
        from tether.stores._scopes import ScopeLimits

        (name,) = scope_names((name,))
        self._ops.limit(
            name, ScopeLimits(max_cost_usd, max_tokens, max_model_calls, window), self._now()
        )

    def view(self, name: str) -> ScopeView:
        """Scope ``name``'s limits, spend, calls in flight and waiting runs."""
        v = self._ops.view(name, self._now())
        return ScopeView(
            name,
            v["limits"],
            _usage(v["spent"]),
            _usage(v["held"]),
            int(v["in_flight"]),
            self._ops.waiting(name),
        )

    def spent(self, name: str) -> Usage:
        """What scope ``name`` spent (in its window, when it has one): model calls,
        tokens (``input_tokens`` counts cached prompt tokens too), cost."""
        return self.view(name).spent

    def names(self) -> list[str]:
        """The names of the scopes this store holds."""
        return self._ops.names()

    def waiting(self, name: str) -> dict[str, str]:
        """The runs paused on scope ``name`` (run id -> the checkpoint to resume)."""
        return self._ops.waiting(name)

    # --- what a run does ----------------------------------------------------------------

    def _wait(self, name: str, run_id: str, checkpoint_id: str) -> None:
        self._ops.wait(name, run_id, checkpoint_id)

    def _unwait(self, names: Sequence[str], run_id: str) -> None:
        self._ops.unwait(names, run_id)


class RunScopes:
    """A run's reservations in its scopes (a part of the run's model calls)."""

    def __init__(self, state: RunState) -> None:
        self.s = state
        #: the calls reserved and not settled yet: (call id, reserved cost)
        self.held: deque[tuple[str, float]] = deque()
        #: the scope that refused the run's last call (it waits on it)
        self.refused: str | None = None

    @property
    def book(self) -> BudgetScopes | None:
        scopes: BudgetScopes | None = getattr(self.s.guard, "scopes", None)
        return scopes if self.s.scopes else None

    def _call_id(self) -> str:
        """The call's id: the run and the call's place in it (a replay of the run, from
        its checkpoint or an engine's history, gives the same call the same id)."""
        return f"{self.s.run_id}#{self.s.model_calls + len(self.held) + 1}"

    @staticmethod
    def _need(
        estimated: int | None, max_out: int | None, price: float | None
    ) -> tuple[float | None, float, float, float]:
        return price, float(estimated or 0), float(max_out or 0), 1.0

    def _answer(
        self, answer: tuple[str, str, str, float, float], call_id: str, need: Any, model: str
    ) -> None:
        code, name, limit, used, cap = answer
        if code in ("ok", "again"):
            self.held.append((call_id, need[0] or 0.0))
            if code == "ok":  # how near its nearest scope is to its limit, this call taken
                self.s.scope_share = used / cap if cap > 0 else 0.0
            return
        if code == "unpriced":
            why = self.s.guard.prices.missing(model) if model else "the request names no model"
            raise UnknownModelError(
                f"{why}. Scope {name!r} has a cost limit (max_cost_usd={cap:g}) that could not "
                "hold, so no request was sent"
            )
        self.refused = name
        what = _LIMIT_NAMES.get(limit, limit)
        if limit == "max_cost":
            amounts = (
                f"${used:.4f} spent or held of its {what} ${cap:.4f}; the next request "
                f"could cost up to ${need[0] or 0.0:.4f}"
            )
        else:
            amounts = (
                f"{used:g} spent or held of its {what} {cap:g}; the next request takes "
                f"{_need_of(limit, need)}"
            )
        raise self.s._halt(
            StopReason.BUDGET_REACHED,
            f"scope {name!r} has no room for the next model call: {amounts}; "
            "no request was sent (raise the limit, then resume the run)",
        )

    def reserve(
        self,
        model: str,
        provider: str | None,
        estimated: int | None,
        max_out: int | None,
        price: float | None,
    ) -> None:
        """Reserve the call's priced estimate (``price``: its worst case, priced once by the
        model turn) in every scope of the run, or stop the run."""
        book = self.book
        if book is None:
            return
        call_id, need = self._call_id(), self._need(estimated, max_out, price)
        answer = book._ops.reserve(self.s.scopes, call_id, need, book._now())
        self._answer(answer, call_id, need, model)

    async def areserve(
        self,
        model: str,
        provider: str | None,
        estimated: int | None,
        max_out: int | None,
        price: float | None,
    ) -> None:
        """The async form of :meth:`reserve`."""
        book = self.book
        if book is None:
            return
        call_id, need = self._call_id(), self._need(estimated, max_out, price)
        answer = await book._ops.areserve(self.s.scopes, call_id, need, book._now())
        self._answer(answer, call_id, need, model)

    def settle(self, cost: float | None, input_tokens: int, output_tokens: int) -> None:
        """Count a reply's usage in the run's scopes once (its reservation's, oldest first;
        a reply without one is counted under the id its place gives)."""
        book = self.book
        if book is None:
            return
        if self.held:
            call_id, reserved = self.held.popleft()
        else:
            call_id, reserved = self._call_id(), 0.0
        used = (reserved if cost is None else cost, float(input_tokens), float(output_tokens), 1.0)
        book._ops.settle(self.s.scopes, call_id, used, book._now())

    def release_last(self) -> None:
        """The newest reservation goes back (its request was not sent)."""
        book = self.book
        if self.held and book is not None:
            call_id, _ = self.held.pop()
            book._ops.release(self.s.scopes, call_id)

    def release(self) -> None:
        """The calls that got no reply: their reservations go back."""
        book = self.book
        while self.held and book is not None:
            call_id, _ = self.held.popleft()
            book._ops.release(self.s.scopes, call_id)

    def ended(self, outcome: Outcome) -> Outcome:
        """A run paused on a scope waits on it (listed until resumed)."""
        book, checkpoint_id = self.book, outcome.checkpoint_id
        if (
            book is not None
            and outcome.stopped_because is StopReason.BUDGET_REACHED
            and self.refused is not None
            and checkpoint_id is not None
        ):
            book._wait(self.refused, self.s.run_id, checkpoint_id)
        return outcome

    def resumed(self) -> None:
        """A resumed run no longer waits on its scopes."""
        book = self.book
        if book is not None:
            book._unwait(self.s.scopes, self.s.run_id)


def _need_of(limit: str, need: Sequence[float | None]) -> str:
    if limit == "max_tokens":
        return f"{(need[1] or 0) + (need[2] or 0):g} tokens"
    return "1 call"
