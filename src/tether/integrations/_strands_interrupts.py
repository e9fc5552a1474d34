"""A tether approval as a Strands interrupt.

A call that waits for a person's approval (``requires_approval=``) pauses the tether run
(``AWAITING_APPROVAL``: an approval record and a checkpoint, on the operator page) and
raises a Strands interrupt (``event.interrupt("tether_approval", reason=...)``) from the
``BeforeToolCallEvent``: the agent stops with ``stop_reason == "interrupt"`` and the
interrupt in ``result.interrupts``, as for Strands' own interrupts. The checkpoint is kept
in ``agent.state`` (which Strands' session managers persist). The user's answer (an
``interruptResponse``: ``True``, ``"approve"`` or ``{"approved": true}`` approves, anything
else rejects) decides the approval, and the invocation that carries it resumes the paused
run: the call runs once, as approved, or never. A decision already made elsewhere (the
operator page, ``guard.approve``) stands.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tether import Guard, Run
from tether.records._approvals import ApprovalError

#: the interrupt's name, and where the checkpoint of the paused run is kept in agent.state
NAME = AWAITING_KEY = "tether_approval"


def _never(**_: Any) -> Any:
    raise RuntimeError("a call waiting for approval ran before it was approved")


def approves(response: Any) -> bool:
    """Whether a person's interrupt response approves the call."""
    if isinstance(response, Mapping):
        return response.get("approved") is True
    if isinstance(response, str):
        return response.strip().lower() in ("approve", "approved", "yes")
    return response is True


def _response(agent: Any) -> Any:
    """The response to this hook's interrupt in the agent's interrupt state, or None."""
    state = getattr(agent, "_interrupt_state", None)
    for interrupt in getattr(state, "interrupts", {}).values():
        if interrupt.name == NAME and interrupt.response is not None:
            return interrupt.response
    return None


def resumed(guard: Guard, agent: Any) -> Run | None:
    """The paused run, resumed, when this invocation answers its interrupt (the approval
    decided by the answer unless decided already), else None."""
    checkpoint_id = agent.state.get(AWAITING_KEY)
    response = _response(agent)
    if not isinstance(checkpoint_id, str) or response is None:
        return None
    agent.state.delete(AWAITING_KEY)
    try:
        if approves(response):
            guard.approve(checkpoint_id, by="strands", note="approved in a Strands interrupt")
        else:
            guard.reject(checkpoint_id, by="strands", reason="declined in a Strands interrupt")
    except ApprovalError:  # decided already (the operator page): that decision stands
        pass
    return guard.resume(checkpoint_id)


async def ask(event: Any, run: Run, name: str, options: dict[str, Any]) -> None:
    """Before a call that may need approval: when the run asks for one (it pauses, nothing
    runs), raise the Strands interrupt; else let the call go on."""
    from tether import Stopped, StopReason
    from tether.policies import needs_approval

    rule = options.get("requires_approval", False)
    if rule is False or _response(event.agent) is not None:
        return
    args = dict(event.tool_use.get("input") or {})
    if not needs_approval(rule, args):
        return
    try:  # the run asks for the approval (a record, a checkpoint) and runs nothing
        await run.acall_tool(name, _never, args, **options)
    except Stopped:
        pass
    if run.stopped is not StopReason.AWAITING_APPROVAL:  # stopped otherwise: cancelled after
        return
    outcome = run.outcome
    event.agent.state.set(AWAITING_KEY, outcome.checkpoint_id)
    pending = outcome.pending_approval or {}
    event.interrupt(NAME, reason={"tool": name, "approval_id": pending.get("id"),
                                  "checkpoint_id": outcome.checkpoint_id})  # fmt: skip
