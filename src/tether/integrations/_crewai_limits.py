"""CrewAI's own limits under a tether run: ``max_iter``, ``max_execution_time``, ``max_rpm``.

The lower of the agent's limit and the run's budget ends the run as tether ends it (its stop
reason, the customer message as the task's output); see :mod:`tether.integrations.crewai`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping
from typing import Any

from tether import Run, StopReason
from tether._context import reset_if_here

__all__ = ["asks_for_a_forced_answer", "paced", "timed", "within_limits"]

#: how long CrewAI's RPMController waits when an agent used its max_rpm
_MINUTE = 60.0

#: the agent's task deadline (``max_execution_time``): (on the run's clock, the limit, the role)
_DEADLINE: contextvars.ContextVar[tuple[float, float, str] | None] = contextvars.ContextVar(
    "tether_crewai_deadline", default=None
)


def within_limits(run: Run) -> bool:
    """False when the agent's ``max_execution_time`` has passed (the run then stopped)."""
    if run.stopped is not None:
        return False
    deadline = _DEADLINE.get()
    if deadline is not None and run.clock.now() >= deadline[0]:
        _, limit, role = deadline
        run.halt(StopReason.TIMEOUT, f"agent {role!r} used its max_execution_time ({limit:g} s)")
        return False
    return True


def _forced_answer() -> str:
    from crewai.utilities.i18n import I18N_DEFAULT

    return str(I18N_DEFAULT.errors("force_final_answer"))


def asks_for_a_forced_answer(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """The call is CrewAI's request for a "best final answer" after ``max_iter``."""
    messages = args[0] if args else kwargs.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], Mapping):
        return False
    return messages[-1].get("content") == _forced_answer()


def timed(agent: Any, current: Callable[[], Run]) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The agent's task under its ``max_execution_time`` as a deadline on the run's clock,
    in place of CrewAI's thread (which lets the task run on and raises once it is over)."""
    role = str(getattr(agent, "role", ""))

    def execute(task_prompt: str, task: Any, timeout: float) -> Any:
        token = _DEADLINE.set((current().clock.now() + timeout, timeout, role))
        try:
            return agent._execute_without_timeout(task_prompt, task)
        finally:
            _DEADLINE.reset(token)

    async def aexecute(task_prompt: str, task: Any, timeout: float) -> Any:
        token = _DEADLINE.set((current().clock.now() + timeout, timeout, role))
        try:
            return await agent._aexecute_without_timeout(task_prompt, task)
        finally:
            reset_if_here(_DEADLINE, token)

    return execute, aexecute


def paced(controller: Any, current: Callable[[], Run]) -> Callable[[], None]:
    """CrewAI's ``max_rpm`` wait for the next minute, on the run's clock and within its time."""

    def wait_for_next_minute() -> None:
        run = current()
        now, limit, deadline = run.clock.now(), run.budget.max_seconds, _DEADLINE.get()
        if run.stopped is not None:
            pass
        elif limit is not None and run.elapsed + _MINUTE > limit:
            run.halt(
                StopReason.TIMEOUT,
                f"CrewAI's max_rpm ({controller.max_rpm}) waits for the next minute, past "
                f"the run's max_seconds ({limit:g} s)",
            )
        elif deadline is not None and now + _MINUTE > deadline[0]:
            run.halt(
                StopReason.TIMEOUT,
                f"CrewAI's max_rpm ({controller.max_rpm}) waits for the next minute, past "
                f"agent {deadline[2]!r}'s max_execution_time ({deadline[1]:g} s)",
            )
        else:
            run.clock.sleep(_MINUTE)
        controller._current_rpm = 0

    return wait_for_next_minute
