"""The official OpenAI SDK, guarded: chat completions and the Responses API.

The same promises as :mod:`tether.integrations.anthropic`: the SDK's retries off,
tether's policy the only retry layer, usage counted into the run, and ``run_agent``,
the chat-completions tool loop ending in a :class:`tether.Outcome`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from tether._outcome import Outcome, StopReason, ToolError
from tether._retry import RetryPolicy
from tether._run import Guard, Run
from tether.integrations._common import (
    Guarded,
    Tool,
    call_model,
    malformed_arguments,
    require_sync_tools,
    result_text,
    unknown_tool,
)

__all__ = ["GuardedOpenAI", "Tool", "guarded", "run_agent"]


def _count_chat(run: Run, completion: Any) -> None:
    usage = getattr(completion, "usage", None)
    if usage is None:
        return
    details = getattr(usage, "prompt_tokens_details", None)
    cached = (getattr(details, "cached_tokens", 0) or 0) if details is not None else 0
    prompt = getattr(usage, "prompt_tokens", 0) or 0
    run.record_model_call(
        input_tokens=max(0, prompt - cached),
        output_tokens=getattr(usage, "completion_tokens", 0) or 0,
        cache_read_tokens=cached,
        model=getattr(completion, "model", "") or "",
    )


def _count_responses(run: Run, response: Any) -> None:
    usage = getattr(response, "usage", None)
    if usage is None:
        return
    details = getattr(usage, "input_tokens_details", None)
    cached = (getattr(details, "cached_tokens", 0) or 0) if details is not None else 0
    run.record_model_call(
        input_tokens=max(0, (getattr(usage, "input_tokens", 0) or 0) - cached),
        output_tokens=getattr(usage, "output_tokens", 0) or 0,
        cache_read_tokens=cached,
        model=getattr(response, "model", "") or "",
    )


class GuardedOpenAI(Guarded):
    provider = "openai"
    namespaces: ClassVar[dict[str, dict[str, Callable[[Run, Any], None]]]] = {
        "chat.completions": {"create": _count_chat},
        "responses": {"create": _count_responses},
    }


def guarded(
    client: Any, policy: RetryPolicy | None = None, run: Run | None = None
) -> GuardedOpenAI:
    """``client`` (``openai.OpenAI`` or ``AsyncOpenAI``) under tether's policy."""
    return GuardedOpenAI(client, policy=policy, run=run)


def _tool_param(tool: Tool) -> dict[str, Any]:
    return {"type": "function",
            "function": {"name": tool.name, "description": tool.description, "parameters": tool.schema}}  # fmt: skip


def run_agent(
    client: Any,
    *,
    model: str,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[Tool] = (),
    guard: Guard | None = None,
    max_tokens: int = 1024,
    system: str | None = None,
    task: str = "",
    continue_on_max_tokens: bool = True,
    **create_kwargs: Any,
) -> Outcome:
    """The chat-completions tool loop under ``guard``, ending in an :class:`tether.Outcome`.

    ``finish_reason == "stop"`` is the answer; ``"length"`` is never one (repeated once
    with twice the limit, then ``TRUNCATED``); ``"content_filter"`` stops with
    ``REFUSED``. Malformed tool arguments become a tool error the model can correct,
    counted toward identical failures.
    """
    require_sync_tools(tools)
    guard = guard or Guard()
    by_name = {t.name: t for t in tools}
    history = [dict(m) for m in messages]
    if system is not None:
        history.insert(0, {"role": "system", "content": system})
    params: dict[str, Any] = {"model": model, **create_kwargs}
    if tools:
        params["tools"] = [_tool_param(t) for t in tools]
    task = task or next((str(m["content"])[:200] for m in history if m.get("role") == "user"), "")
    with guard.start(task=task) as run:
        gc = (client if isinstance(client, Guarded) else guarded(client)).bind(run)
        limit = max_tokens
        extended = False
        while run.proceed():
            completion = call_model(
                run, gc.chat.completions.create, messages=history, max_tokens=limit, **params
            )
            choice = completion.choices[0]
            finish = choice.finish_reason
            if finish == "length":
                if continue_on_max_tokens and not extended:
                    extended, limit = True, limit * 2
                    continue
                run.stop(StopReason.TRUNCATED, f"the reply was cut at max_tokens ({limit})")
            if finish == "content_filter":
                run.stop(StopReason.REFUSED, "the reply was withheld by the content filter")
            message = choice.message
            calls = list(message.tool_calls or [])
            entry: dict[str, Any] = {"role": "assistant", "content": message.content}
            if calls:
                entry["tool_calls"] = [c.model_dump(exclude_none=True) for c in calls]
            history.append(entry)
            if not calls:
                run.succeed(message.content or "")
                break
            for call in calls:
                history.append(
                    {
                        "role": "tool",
                        "tool_call_id": call.id,
                        "content": _run_tool(run, by_name, call),
                    }
                )
    return run.outcome


def _run_tool(run: Run, tools: dict[str, Tool], call: Any) -> str:
    name = call.function.name
    tool = tools.get(name)
    try:
        if tool is None:
            run.call_tool(name, unknown_tool, {"name": name})
        try:
            args = json.loads(call.function.arguments or "{}")
        except ValueError:
            args = None
        if not isinstance(args, dict):
            run.call_tool(name, malformed_arguments, {"raw": str(call.function.arguments)[:500]})
        assert tool is not None
        assert isinstance(args, dict)
        out = run.call_tool(name, tool.fn, args, timeout=tool.timeout, idempotent=tool.idempotent,
                            lookup=tool.lookup)  # fmt: skip
        return result_text(out)
    except ToolError as exc:
        return f"error: {exc.model_message}"
