"""A tether approval in ADK's own confirmation flow (``ToolConfirmation``).

A call that waits for a person's approval (``requires_approval=``, or a tool declared
with ADK's own ``require_confirmation``) pauses the tether run
(``AWAITING_APPROVAL``: an approval record and a checkpoint, on the operator page) and asks
for ADK's confirmation of the same call (``tool_context.request_confirmation``), so that
an ADK app shows its confirmation request as it does for its own tools; the checkpoint is
kept in ``session.state``. The ADK user's answer (a ``FunctionResponse`` to
``adk_request_confirmation``) decides the approval (``guard.approve``/``guard.reject``) and
the next invocation resumes the paused run, where ADK runs the confirmed call again: the
run's pipeline runs it once, as approved. A decision already made elsewhere (the page,
``guard.approve``) stands; a call either side refused never runs.
"""

from __future__ import annotations

from typing import Any

from tether import Guard, Run
from tether.records._approvals import ApprovalError

#: where the checkpoint of a run waiting for ADK's confirmation is kept in ``session.state``
AWAITING_KEY = "tether_awaiting_confirmation"
#: ADK's name of the function call that asks the user to confirm
CONFIRMATION_CALL = "adk_request_confirmation"
#: ADK's own words for a call waiting for confirmation, and for a refused one
ASKED = "This tool call requires confirmation, please approve or reject."
REFUSED = "This tool call is rejected."


def ask(run: Run, name: str, tool_context: Any, asked: Any = None) -> dict[str, Any]:
    """The run stopped for an approval of the call of ``name``: ask ADK's user to confirm
    it (the checkpoint kept in the session); the answer the call gets meanwhile. ``asked``:
    what the tool returned when it asked itself (its own question stands)."""
    outcome = run.outcome
    pending = outcome.pending_approval or {}
    if asked is None:
        tool_context.request_confirmation(
            hint=f"Please approve or reject the call of {name}() (tether approval "
            f"{pending.get('id', '')}).",
            payload={"tether_checkpoint": outcome.checkpoint_id},
        )
    tool_context.actions.skip_summarization = True  # a pause, not a result to summarize
    tool_context.state[AWAITING_KEY] = outcome.checkpoint_id
    if asked is not None:
        return asked if isinstance(asked, dict) else {"result": asked}
    return {"error": ASKED}


def asked_itself(tool_context: Any) -> bool:
    """The tool asked ADK's user to confirm this call itself (``request_confirmation``)."""
    if getattr(tool_context, "tool_confirmation", None) is not None:
        return False  # answered already: the tool ran on the answer
    asked = getattr(tool_context.actions, "requested_tool_confirmations", None) or {}
    return tool_context.function_call_id in asked


def _answer(user_content: Any) -> bool | None:
    """The user's confirmation in this invocation's message (True/False), or None."""
    for part in getattr(user_content, "parts", None) or ():
        response = getattr(part, "function_response", None)
        if response is not None and response.name == CONFIRMATION_CALL:
            body = response.response or {}
            return bool(body.get("confirmed"))
    return None


def _last_user_message(ctx: Any) -> Any:
    """The newest message of the user in the session (ADK continues the paused invocation
    with its first message as ``user_content``; the answer is the newest event)."""
    for event in reversed(getattr(ctx.session, "events", None) or ()):
        if event.author == "user":
            return event.content
    return None


def answered(guard: Guard, ctx: Any) -> str | None:
    """The checkpoint to resume when this invocation answers the confirmation a paused run
    asked for (its decision made: approved or rejected, by the ADK user), else None."""
    checkpoint_id = ctx.session.state.get(AWAITING_KEY)
    if not isinstance(checkpoint_id, str):
        return None
    confirmed = _answer(_last_user_message(ctx))
    if confirmed is None:
        return None
    by = f"adk:{ctx.session.user_id}"
    try:
        if confirmed:
            guard.approve(checkpoint_id, by=by, note="confirmed in ADK")
        else:
            guard.reject(checkpoint_id, by=by, reason="declined in ADK's confirmation")
    except ApprovalError:  # decided already (the operator page): that decision stands
        pass
    return checkpoint_id


def refused(tool_context: Any) -> bool:
    """The ADK user declined this call's confirmation: it never runs."""
    confirmation = getattr(tool_context, "tool_confirmation", None)
    return confirmation is not None and not confirmation.confirmed
