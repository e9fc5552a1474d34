"""The official Anthropic SDK, guarded.

``guarded(client)`` gives the same surface (``client.messages.create``) with the SDK's own
retries off (``with_options(max_retries=0)``), so tether's policy is the only retry
layer: a policy of 3 attempts against an API that always answers 529 makes exactly 3
requests, not 9. Usage (input, output, cache tokens) is counted into the run.
``run_agent`` is the whole tool-use loop, ending in a :class:`tether.Outcome`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from tether import Run, StopReason, Tool
from tether.integrations._common import Guarded, guarding
from tether.integrations._loop import AgentCall, Provider, ToolUse, Turns, agent_call, agent_shells
from tether.providers import anthropic as profile
from tether.providers._usage import UsageReader

__all__ = ["GuardedAnthropic", "Tool", "arun_agent", "guarded", "run_agent"]


class GuardedAnthropic(Guarded):
    provider = "anthropic"
    chat_endpoint = "messages.create"
    namespaces: ClassVar[dict[str, dict[str, UsageReader]]] = {
        "messages": {"create": profile.usage}
    }


guarded = guarding(
    GuardedAnthropic,
    __name__,
    """``client`` (``anthropic.Anthropic`` or ``AsyncAnthropic``) under tether's policy.

    >>> client = guarded(anthropic.Anthropic())  # doctest: +SKIP
    >>> client.messages.create(model="claude-sonnet-5-5", max_tokens=512, messages=[...])  # doctest: +SKIP

    ``token_budget``: a :class:`tether.TokenBudget` (or several): every attempt waits for
    its place in the budget of its model, and the responses' rate-limit headers calibrate
    it (a run's guard may bring budgets too: ``Guard(token_budget=...)``).

    ``fallbacks``: the models a request goes to, in order, when its own cannot answer
    (its provider's breaker open, a spend limit, a token-budget wait past the run's time):
    ``[tether.Fallback("claude-haiku-4-5")]``; Anthropic models only (a guarded client
    sends Anthropic requests). Without it, the run's guard's (``Guard(fallbacks=...)``).
    """,
)


def _tool_param(tool: Tool) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description, "input_schema": tool.schema}


def _block(block: Any) -> dict[str, Any]:
    dump = getattr(block, "model_dump", None)
    data: dict[str, Any] = dump(exclude_none=True) if callable(dump) else dict(block)
    return data


class _Turns(Turns):
    """Messages API turns: ``end_turn`` answers, ``max_tokens`` is cut, ``refusal`` stops,
    ``pause_turn`` continues, ``tool_use`` blocks are tool calls."""

    def read(self, run: Run, reply: Any) -> list[ToolUse] | None:
        stop = getattr(reply, "stop_reason", None)
        if stop == "max_tokens" and self.cut(run):
            return None
        if stop == "refusal":
            run.stop(StopReason.REFUSED, "the model refused")
        content = [_block(b) for b in reply.content]
        self.history.append({"role": "assistant", "content": content})
        if stop == "pause_turn":
            return None
        uses = [b for b in content if b.get("type") == "tool_use"]
        if not uses:
            run.succeed("".join(b.get("text", "") for b in content if b.get("type") == "text"))
            return []
        return self._uses(uses)

    def pending(self) -> list[ToolUse]:
        last = self.history[-1] if self.history else None
        if not last or last.get("role") != "assistant" or not isinstance(last.get("content"), list):
            return []
        return self._uses(
            [b for b in last["content"] if isinstance(b, dict) and b.get("type") == "tool_use"]
        )

    @staticmethod
    def _uses(blocks: list[dict[str, Any]]) -> list[ToolUse]:
        return [
            ToolUse(
                str(b.get("id")),
                str(b.get("name", "")),
                b["input"] if isinstance(b.get("input"), dict) else None,
                str(b.get("input")),
            )
            for b in blocks
        ]

    def answer(self, results: list[tuple[ToolUse, str, bool]]) -> None:
        blocks = []
        for use, text, error in results:
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": use.id, "content": text}
            if error:
                block["is_error"] = True
            blocks.append(block)
        self.history.append({"role": "user", "content": blocks})


def _setup(call: AgentCall) -> _Turns:
    params: dict[str, Any] = {"model": call.model, **call.create_kwargs}
    if call.tools:
        params["tools"] = [_tool_param(t) for t in call.tools]
    if call.system is not None:
        params["system"] = call.system
    limit = params.pop("max_tokens", call.max_tokens)
    if limit is None:
        raise ValueError("max_tokens must be an int: the Messages API requires it")
    return _Turns(
        call.tools, list(call.messages), params, "max_tokens", limit, call.continue_on_max_tokens
    )


_RUN_AGENT = """The whole tool-use loop under ``guard``, ending in an :class:`tether.Outcome`.

A reply with no tool use (``end_turn``) is the answer. ``max_tokens`` is never an
answer: the request is repeated once with twice the limit (``continue_on_max_tokens``),
then the run stops with ``TRUNCATED``. ``refusal`` stops with ``REFUSED``;
``pause_turn`` continues. Tool calls go through ``run.call_tool``; their errors go
back to the model as ``is_error`` tool results, never as raw exception text.
``outcome.messages`` is the whole conversation, to continue it with the next turn.
``resume=outcome.checkpoint_id`` (with ``messages=outcome.messages``) continues a run
that stopped, e.g. for an approval: the tool calls its last reply asked for and that
have no results yet run first, then the loop goes on. ``key`` names the request the run
serves (``guard.start(task, key=...)``): runs with one key do their effects once.
``fallbacks``: the models to ask when ``model`` cannot answer (default: the guard's;
see :class:`tether.Fallback`); ``outcome.models`` names the models that answered.
"""

_ARUN_AGENT = """The async form of :func:`run_agent`, for ``anthropic.AsyncAnthropic``: async tools
are awaited, sync tools run in a worker thread."""

run_agent, arun_agent = agent_shells(
    Provider(guarded, _setup, "anthropic.AsyncAnthropic"),
    agent_call,
    __name__,
    (_RUN_AGENT, _ARUN_AGENT),
)
