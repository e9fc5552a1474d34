"""The official OpenAI SDK, guarded: chat completions and the Responses API.

The same promises as :mod:`tether.integrations.anthropic`: the SDK's retries off,
tether's policy the only retry layer, usage counted into the run, and ``run_agent``,
the chat-completions tool loop ending in a :class:`tether.Outcome`.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from tether import Run, StopReason, Tool
from tether.integrations._common import Guarded, guarding
from tether.integrations._loop import AgentCall, Provider, ToolUse, Turns, agent_call, agent_shells
from tether.providers import openai_chat, openai_responses
from tether.providers._usage import UsageReader

__all__ = ["GuardedOpenAI", "Tool", "arun_agent", "guarded", "run_agent"]


class GuardedOpenAI(Guarded):
    provider = "openai"
    chat_endpoint = "chat.completions.create"
    namespaces: ClassVar[dict[str, dict[str, UsageReader]]] = {
        "chat.completions": {"create": openai_chat.usage},
        "responses": {"create": openai_responses.usage},
    }


guarded = guarding(
    GuardedOpenAI,
    __name__,
    """``client`` (``openai.OpenAI`` or ``AsyncOpenAI``) under tether's policy; with
    ``token_budget``, every attempt waits for its place in the budget of its model (see
    :func:`tether.integrations.anthropic.guarded`); ``fallbacks``: OpenAI models to ask
    when the request's own cannot answer (``[tether.Fallback("gpt-6.1-terra")]``).""",
)


def _tool_param(tool: Tool) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.schema},
    }


class _Turns(Turns):
    """Chat-completions turns: ``stop`` answers, ``length`` is cut, ``content_filter``
    stops, ``tool_calls`` are tool calls."""

    def read(self, run: Run, reply: Any) -> list[ToolUse] | None:
        choice = reply.choices[0]
        finish = choice.finish_reason
        if finish == "length" and self.cut(run):
            return None
        if finish == "content_filter":
            run.stop(StopReason.REFUSED, "the reply was withheld by the content filter")
        message = choice.message
        calls = list(message.tool_calls or [])
        entry: dict[str, Any] = {"role": "assistant", "content": message.content}
        if calls:
            entry["tool_calls"] = [c.model_dump(exclude_none=True) for c in calls]
        self.history.append(entry)
        if not calls:
            run.succeed(message.content or "")
            return []
        return [
            ToolUse(
                c.id, c.function.name, _arguments(c.function.arguments), str(c.function.arguments)
            )
            for c in calls
        ]

    def pending(self) -> list[ToolUse]:
        answered: set[str] = set()
        for message in reversed(self.history):
            if message.get("role") == "tool":
                answered.add(str(message.get("tool_call_id")))
                continue
            if message.get("role") != "assistant":
                return []
            calls = [c for c in message.get("tool_calls") or () if str(c.get("id")) not in answered]
            return [
                ToolUse(
                    str(c.get("id")),
                    str(c.get("function", {}).get("name", "")),
                    _arguments(c.get("function", {}).get("arguments")),
                    str(c.get("function", {}).get("arguments")),
                )
                for c in calls
            ]
        return []

    def answer(self, results: list[tuple[ToolUse, str, bool]]) -> None:
        for use, text, error in results:
            self.history.append(
                {
                    "role": "tool",
                    "tool_call_id": use.id,
                    "content": f"error: {text}" if error else text,
                }
            )


def _arguments(raw: str | None) -> dict[str, Any] | None:
    try:
        args = json.loads(raw or "{}")
    except ValueError:
        return None
    return args if isinstance(args, dict) else None


_LIMITS = ("max_completion_tokens", "max_tokens")


def _setup(call: AgentCall) -> _Turns:
    history = list(call.messages)
    if call.system is not None:
        history.insert(0, {"role": "system", "content": call.system})
    params: dict[str, Any] = {"model": call.model, **call.create_kwargs}
    if call.tools:
        params["tools"] = [_tool_param(t) for t in call.tools]
    # one limit, sent as max_completion_tokens (max_tokens is deprecated, and refused by
    # reasoning models); the caller's own value wins, None sends none
    given = [params.pop(name) for name in _LIMITS if name in params]
    limit = given[0] if given else call.max_tokens
    return _Turns(
        call.tools, history, params, "max_completion_tokens", limit, call.continue_on_max_tokens
    )


_RUN_AGENT = """The chat-completions tool loop under ``guard``, ending in an :class:`tether.Outcome`.

``finish_reason == "stop"`` is the answer; ``"length"`` is never one (repeated once
with twice the limit, then ``TRUNCATED``); ``"content_filter"`` stops with
``REFUSED``. Malformed tool arguments become a tool error the model can correct,
counted toward identical failures. The limit is sent as ``max_completion_tokens``
(``max_tokens=None`` sends none). ``outcome.messages`` is the whole conversation.
``fallbacks``: the models to ask when ``model`` cannot answer (default: the guard's;
see :class:`tether.Fallback`); ``outcome.models`` names the models that answered.
The other options are those of :func:`tether.integrations.anthropic.run_agent`.
"""

_ARUN_AGENT = """The async form of :func:`run_agent`, for ``openai.AsyncOpenAI``: async tools are
awaited, sync tools run in a worker thread."""

run_agent, arun_agent = agent_shells(
    Provider(guarded, _setup, "openai.AsyncOpenAI"),
    agent_call,
    __name__,
    (_RUN_AGENT, _ARUN_AGENT),
)
