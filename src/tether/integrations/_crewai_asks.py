"""A person's word in a CrewAI kickoff under tether: ``human_input`` and the tool hooks.

* ``Task(human_input=True)``: CrewAI asks for feedback on the agent's final answer at the
  terminal (``input()``). Under tether the question is an approval: the review of the task's
  answer is a call that needs a person's approval (``human_input``, its arguments the task
  and the answer), so the run pauses ``AWAITING_APPROVAL`` with a checkpoint, on the
  operator page (``guard.approve``/``guard.reject``). Resumed after a yes, the review passes
  once and the crew goes on; after a no, the run ends ``DECLINED`` (the person's words in
  its detail), never as done.
* A ``@before_tool_call`` hook that returns False (or raises CrewAI's ``HookAborted``):
  CrewAI tells the model "Tool execution blocked by hook" and lets it go on; under tether
  the run ends ``DECLINED`` (the call was not made), the customer message the task's output.
  Seen by two hooks scoped to the kickoff, after the user's: one before the call (reached
  only when no earlier hook blocked it), one after (which CrewAI runs for blocked calls too).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tether import ApprovalRejected, Run, Stopped, StopReason

__all__ = ["HUMAN_INPUT", "AskThroughTether", "watching_tool_hooks"]

#: the name of the approval a task's ``human_input`` asks for
HUMAN_INPUT = "human_input"

#: the tool whose call passed every earlier ``before_tool_call`` hook, in this context
_PASSED: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tether_crewai_hook_passed", default=None
)


def _reviewed(**question: Any) -> str:
    return ""  # CrewAI's word for "happy with the result": no further feedback


def _question(answer: Any, context: Any) -> tuple[dict[str, Any], str]:
    task = getattr(context, "task", None)
    what = str(getattr(task, "description", "") or "")[:200]
    output = answer.output if isinstance(answer.output, str) else answer.output.model_dump_json()
    return {"task": what, "answer": output}, what


def _after(run: Run, answer: Any, context: Any) -> Any:
    """The answer CrewAI goes on with: the agent's own once reviewed, else the customer
    message (the run stopped: awaiting the approval, or declined)."""
    context.ask_for_human_input = False
    if run.stopped is None:
        return answer
    from crewai.agents.parser import AgentFinish

    message = run.outcome.customer_message
    return AgentFinish(thought="", output=message, text=message)


def _declined(run: Run, what: str, exc: ApprovalRejected) -> None:
    run.halt(StopReason.DECLINED, f"the answer to {what!r} was not approved ({exc.model_message})")


class AskThroughTether:
    """CrewAI's ``HumanInputProvider`` for a kickoff's time: the review as an approval."""

    def __init__(self, current: Callable[[], Run]) -> None:
        self.current = current

    def setup_messages(self, context: Any) -> bool:
        return False  # CrewAI's own messages

    def post_setup_messages(self, context: Any) -> None:
        return None

    def handle_feedback(self, formatted_answer: Any, context: Any) -> Any:
        run = self.current()
        args, what = _question(formatted_answer, context)
        try:
            run.call_tool(
                HUMAN_INPUT, _reviewed, args, requires_approval=True, volatile=("answer",)
            )
        except ApprovalRejected as exc:
            _declined(run, what, exc)
        except Stopped:
            pass  # awaiting the approval: the checkpoint is the run's
        return _after(run, formatted_answer, context)

    async def handle_feedback_async(self, formatted_answer: Any, context: Any) -> Any:
        run = self.current()
        args, what = _question(formatted_answer, context)
        try:
            await run.acall_tool(
                HUMAN_INPUT, _reviewed, args, requires_approval=True, volatile=("answer",)
            )
        except ApprovalRejected as exc:
            _declined(run, what, exc)
        except Stopped:
            pass
        return _after(run, formatted_answer, context)


@contextmanager
def watching_tool_hooks(current: Callable[[], Run]) -> Iterator[None]:
    """For the kickoff's time: a tool call a ``before_tool_call`` hook blocked ends the run."""
    from crewai.hooks.dispatch import InterceptionPoint, _scoped_hooks_var, scoped_hooks

    def passed(context: Any) -> None:
        _PASSED.set(str(context.tool_name))

    def after(context: Any) -> str | None:
        name, went = str(context.tool_name), _PASSED.get()
        _PASSED.set(None)
        if went == name:
            return None
        run = current()
        run.halt(
            StopReason.DECLINED,
            f"a CrewAI before_tool_call hook blocked {name}: it was not run",
        )
        return f"stopped: {StopReason.DECLINED.value}"

    outer = _scoped_hooks_var.get() or {}
    scope = {point: list(hooks) for point, hooks in outer.items()}
    scope.setdefault(InterceptionPoint.PRE_TOOL_CALL, []).append(passed)
    scope.setdefault(InterceptionPoint.POST_TOOL_CALL, []).append(after)
    with scoped_hooks(scope):
        yield
