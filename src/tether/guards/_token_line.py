"""A token budget's two conversations: this process's place in the fleet's line, and
what it tells the store.

:class:`Line` decides, sans I/O, when a caller asks the store for its place and how long
it waits between: a plan of tether's one step vocabulary (:mod:`tether._sansio`) that
yields pauses (:class:`~tether._sansio.Sleep`) and round trips (a
:class:`~tether._sansio.Call` of the store's ``exchange`` with a
:class:`~tether.stores._tokens.TokenAsk`), run by :func:`~tether._sansio.drive` in a
thread or :func:`~tether._sansio.adrive` on an event loop, so that ``reserve`` and
``areserve`` are one behaviour. :class:`Outbox` keeps what responses said until the next
round trip carries it.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING

from tether._errors import LimiterTimeout
from tether._sansio import Call, Plan, Sleep
from tether.stores._tokens import Settlement, TokenAsk

if TYPE_CHECKING:
    from tether.clock import Clock
    from tether.stores._tokens import Answer, Four, TokenConfig, TokenOps

__all__ = ["Line", "Outbox", "Plan"]


class Outbox:
    """What this process learned from responses and has not told the store yet: sent with
    its next reservation (no round trip of its own), at once for a pause or the family's
    first answer, or after a second without any."""

    def __init__(self, name: str, cfg: TokenConfig, clock: Clock, ops: TokenOps) -> None:
        self.name, self.cfg, self.clock, self.ops = name, cfg, clock, ops
        self._lock = threading.Lock()
        self._pending = Settlement()
        self._sent_at = -math.inf  # when this process last told the store what it learned
        self.calibrated = False  # a response of the family has arrived

    def take(self) -> Settlement | None:
        """Everything pending, to travel with a reservation (None: nothing)."""
        with self._lock:
            if self._pending.empty():
                return None
            pending, self._pending = self._pending, Settlement()
            self._sent_at = self.clock.wall()
            return pending

    def queue(self, s: Settlement) -> Plan[None]:
        """Keep ``s``; send everything pending now when it must be heard now."""
        with self._lock:
            # a pause, the family's first answer, or a usage above the reservation (the
            # fleet's buckets hold more than the provider's until they hear of it)
            urgent = s.pause_until > 0 or (s.answered and not self.calibrated)
            urgent = urgent or any(x < 0 for x in s.refund)
            self._pending.merge(s)
            self.calibrated = self.calibrated or s.answered
            if not urgent and self.clock.wall() - self._sent_at < 1.0:
                return
        yield from self.flush()

    def flush(self) -> Plan[None]:
        """Send what is pending (if anything)."""
        pending = self.take()
        if pending is not None:
            yield self.exchange(TokenAsk(self.name, self.clock.wall(), self.cfg, pending))

    def exchange(self, ask: TokenAsk) -> Call:
        """The round trip that carries ``ask`` to the store."""
        ops = self.ops
        return Call(ops.exchange, (ask,), ops.aexchange)

    def reset(self) -> None:
        with self._lock:
            self._pending, self.calibrated = Settlement(), False


class Line:
    """This process's callers in the fleet's line for one budget.

    A caller asks with a horizon (how far ahead it may take a place): ``horizon`` seconds,
    up to four times that when urgent, down to a quarter when it yields (its budget scope
    is near its limit), plus twice what it has waited. Two lower bounds
    spare round trips: while the family's first call (the probe) is out, the callers here
    wait for its answer; and the store's answers say how long the line was (it drains at
    one second a second at most), so a horizon surely shorter waits here.
    """

    def __init__(self, outbox: Outbox, horizon: float) -> None:
        self.outbox, self.horizon = outbox, horizon
        self.clock = outbox.clock
        self._lock = threading.Lock()
        self._probe_gate = -math.inf  # until then another caller here waits for the probe
        self._line_until = -math.inf  # when the longest place in line the store gave ends

    def reset(self) -> None:
        """Forget what the store's answers said of the line and the probe."""
        with self._lock:
            self._probe_gate = self._line_until = -math.inf

    def wait(
        self, need: Four, max_wait: float | None, urgency: float, margin: Four | None = None
    ) -> Plan[float]:
        """The plan of one caller: wait for its place and take it; returns the time waited.
        Raises LimiterTimeout (having taken nothing) when the wait would outlast
        ``max_wait``."""
        waited = 0.0
        while True:
            admitted = False
            pause = self._gate(waited, max_wait)
            if not pause:
                horizon = self._horizon(waited, urgency, max_wait)
                pause = self._known_line(horizon, waited, max_wait)
            if not pause:
                answer = yield self._ask(need, horizon, margin)
                admitted = answer[0]
                pause = self._after(answer, waited, max_wait)
            if pause:
                yield Sleep(pause)
                waited += pause
            if admitted:
                return waited

    def _ask(self, need: Four, horizon: float, margin: Four | None) -> Call:
        out = self.outbox
        return out.exchange(
            TokenAsk(out.name, self.clock.wall(), out.cfg, out.take(), need, horizon, margin)
        )

    def _gate(self, waited: float, max_wait: float | None) -> float:
        """The pause while the probe is still out (0: none; no need to ask meanwhile)."""
        gate = self._probe_gate - self.clock.wall()
        if gate <= 0 or self.outbox.calibrated:
            return 0.0
        self._check_wait(waited + gate, max_wait)
        return gate

    def _horizon(self, waited: float, urgency: float, max_wait: float | None) -> float:
        # urgent (up to 1): up to four times the horizon; yielding (down to -1): a quarter
        u = min(1.0, max(-1.0, urgency))
        horizon = self.horizon * (1.0 + (3.0 if u > 0 else 0.75) * u) + 2.0 * waited
        return horizon if max_wait is None else min(horizon, max(0.0, max_wait - waited))

    def _known_line(self, horizon: float, waited: float, max_wait: float | None) -> float:
        """The pause before asking, when the line is surely longer than ``horizon`` (0: ask).

        A wait given now ends when the line does, so ``_line_until - now`` is a lower bound
        of the line; a horizon below it would be refused: the caller waits here until its
        horizon (growing twice as fast) meets the line, without a round trip.
        """
        line = self._line_until - self.clock.wall()
        if line <= horizon:
            return 0.0
        self._check_wait(waited + line, max_wait)
        return max((line - horizon) / 3.0, 0.05)

    def _check_wait(self, total: float, max_wait: float | None) -> None:
        if max_wait is not None and total > max_wait:
            raise LimiterTimeout(self.outbox.name, total)

    def _after(self, answer: Answer, waited: float, max_wait: float | None) -> float:
        """After the store answered: admitted, its wait; else the pause before asking
        again. Raises LimiterTimeout when the wait would outlast ``max_wait``."""
        admitted, wait, retry_in = answer
        if wait > 0:
            with self._lock:
                self._line_until = max(self._line_until, self.clock.wall() + wait)
        if admitted:
            return wait  # within its horizon, itself within max_wait
        if wait < 0:  # the family's first call is out: this process waits for its answer
            with self._lock:
                self._probe_gate = max(self._probe_gate, self.clock.wall() + retry_in)
            wait = retry_in
        self._check_wait(waited + wait, max_wait)
        # the horizon grows twice as fast as the time waited: half the gap between the wait
        # and the horizon closes it while others keep the line as long (a drained line is
        # joined sooner, with the rest of the wait: the same total as a place taken at once)
        return max(retry_in / 2.0, 0.05)
