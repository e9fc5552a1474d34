"""Tools that stopped answering in a run: not started again, reported, handed over."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from tether import telemetry
from tether._errors import CircuitOpenError
from tether.run._health import UNRESPONSIVE_AFTER, ToolHealth, ToolUnresponsive
from tether.run._outcome import StopReason, ToolError
from tether.run._runstate import (
    RunState,
    escalate,
    tool_health,
)
from tether.run._toolkit import (
    NOT_ANSWERING,
    _Call,
)

__all__ = ["HungTools"]

_log = logging.getLogger("tether")


class HungTools:
    """Watches a run's timed reads (a part of :class:`tether.Run`'s tool pipeline)."""

    def __init__(self, state: RunState) -> None:
        self.s = state

    def _watch(self, call: _Call, idempotent: bool) -> ToolHealth | None:
        """The health record of a timed call of a read (an effect's timeout is the
        ledger's: it ends the run UNKNOWN_OUTCOME); None when nothing is watched."""
        if not idempotent or call.policy.attempt_timeout is None:
            return None
        if self.s.guard.on_hung_tool == "wait":
            return None
        return tool_health(self.s, call.name)

    def _unresponsive(self, name: str) -> ToolUnresponsive | None:
        """The tool stopped answering in this run: it holds ``UNRESPONSIVE_AFTER`` hung
        worker threads, or timed out that many times and its breaker is not closed."""
        health = self.s._health.get(name)
        if health is None:
            return None
        hanging = health.hanging()
        if hanging >= UNRESPONSIVE_AFTER or (
            health.timed_out >= UNRESPONSIVE_AFTER and self.s.guard.breaker(name).state != "closed"
        ):
            return ToolUnresponsive(name, health.timed_out, hanging)
        return None

    def _refuse_unresponsive(self, call: _Call, before: bool = False) -> None:
        """Start no attempt of a tool that stopped answering (raises ToolUnresponsive)."""
        found = self._unresponsive(call.name)
        if found is not None:
            if before:  # refused before its retry policy ran: none of its retries to count
                found.before = True
            raise found

    def _within(self, call: _Call, attempt: Callable[[], Any]) -> Any:
        """The call's retry policy over ``attempt``, within the run's time left; an open
        breaker of a tool that stopped answering is not waited for."""
        try:
            return call.policy.call_within(self.s.time_left(), attempt)
        except CircuitOpenError:
            self._refuse_unresponsive(call)
            raise

    async def _awithin(self, call: _Call, attempt: Callable[[], Awaitable[Any]]) -> Any:
        """The async form of :meth:`_within`."""
        try:
            return await call.policy.acall_within(self.s.time_left(), attempt)
        except CircuitOpenError:
            self._refuse_unresponsive(call)
            raise

    def _not_answering(self, call: _Call, exc: ToolUnresponsive) -> BaseException:
        """A tool that stopped answering: the run hands over (``Guard(on_hung_tool=
        "hand_over")``, the default), or the model is told it is unavailable."""
        attributes = {"gen_ai.tool.name": call.name, "tether.timed_out": exc.timed_out}
        telemetry.add_event(
            "tether.tool_unresponsive", **attributes, **{"tether.hung_threads": exc.hanging}
        )
        _log.warning("tether: run %s: %s", self.s.run_id, exc)
        if self.s.guard.on_hung_tool == "tell_model":
            return ToolError(call.name, NOT_ANSWERING, cause_kind="unavailable")
        issue = f"{exc}; it was not started again"
        escalate(self.s, *(() if issue in self.s._issues else (issue,)))
        if exc.hanging >= UNRESPONSIVE_AFTER:  # it holds worker threads
            return self.s._halt(StopReason.HUNG_TOOLS, str(exc))
        breaker = self.s.guard.breaker(call.name).name
        return self.s.outage(breaker, f"{exc}, and its circuit is open")
