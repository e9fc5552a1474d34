"""The official Anthropic SDK, guarded.

``guarded(client)`` gives the same surface (``client.messages.create``) with the SDK's own
retries off (``with_options(max_retries=0)``), so tether's policy is the only retry
layer: a policy of 3 attempts against an API that always answers 529 makes exactly 3
requests, not 9. Usage (input, output, cache tokens) is counted into the run.
``run_agent`` is the whole tool-use loop, ending in a :class:`tether.Outcome`.
"""

from __future__ import annotations

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

__all__ = ["GuardedAnthropic", "Tool", "guarded", "run_agent"]


def _count(run: Run, message: Any) -> None:
    usage = getattr(message, "usage", None)
    if usage is None:
        return
    run.record_model_call(
        input_tokens=getattr(usage, "input_tokens", 0) or 0,
        output_tokens=getattr(usage, "output_tokens", 0) or 0,
        cache_write_tokens=getattr(usage, "cache_creation_input_tokens", 0) or 0,
        cache_read_tokens=getattr(usage, "cache_read_input_tokens", 0) or 0,
        model=getattr(message, "model", "") or "",
    )


class GuardedAnthropic(Guarded):
    provider = "anthropic"
    namespaces: ClassVar[dict[str, dict[str, Callable[[Run, Any], None]]]] = {
        "messages": {"create": _count}
    }


def guarded(
    client: Any, policy: RetryPolicy | None = None, run: Run | None = None
) -> GuardedAnthropic:
    """``client`` (``anthropic.Anthropic`` or ``AsyncAnthropic``) under tether's policy.

    >>> client = guarded(anthropic.Anthropic())  # doctest: +SKIP
    >>> client.messages.create(model="claude-sonnet-4-5", max_tokens=512, messages=[...])  # doctest: +SKIP
    """
    return GuardedAnthropic(client, policy=policy, run=run)


def _tool_param(tool: Tool) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description, "input_schema": tool.schema}


def _block(block: Any) -> dict[str, Any]:
    dump = getattr(block, "model_dump", None)
    data: dict[str, Any] = dump(exclude_none=True) if callable(dump) else dict(block)
    return data


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
    """The whole tool-use loop under ``guard``, ending in an :class:`tether.Outcome`.

    A reply with no tool use (``end_turn``) is the answer. ``max_tokens`` is never an
    answer: the request is repeated once with twice the limit (``continue_on_max_tokens``),
    then the run stops with ``TRUNCATED``. ``refusal`` stops with ``REFUSED``;
    ``pause_turn`` continues. Tool calls go through ``run.call_tool``; their errors go
    back to the model as ``is_error`` tool results, never as raw exception text.
    """
    require_sync_tools(tools)
    guard = guard or Guard()
    by_name = {t.name: t for t in tools}
    history = [dict(m) for m in messages]
    params: dict[str, Any] = {"model": model, **create_kwargs}
    if tools:
        params["tools"] = [_tool_param(t) for t in tools]
    if system is not None:
        params["system"] = system
    with guard.start(task=task or _task_of(history)) as run:
        gc = (client if isinstance(client, Guarded) else guarded(client)).bind(run)
        limit = max_tokens
        extended = False
        while run.proceed():
            reply = call_model(
                run, gc.messages.create, messages=history, max_tokens=limit, **params
            )
            stop = getattr(reply, "stop_reason", None)
            if stop == "max_tokens":
                if continue_on_max_tokens and not extended:
                    extended, limit = True, limit * 2
                    continue
                run.stop(StopReason.TRUNCATED, f"the reply was cut at max_tokens ({limit})")
            if stop == "refusal":
                run.stop(StopReason.REFUSED, "the model refused")
            content = [_block(b) for b in reply.content]
            history.append({"role": "assistant", "content": content})
            if stop == "pause_turn":
                continue
            uses = [b for b in content if b.get("type") == "tool_use"]
            if not uses:
                run.succeed("".join(b.get("text", "") for b in content if b.get("type") == "text"))
                break
            results = [_run_tool(run, by_name, use) for use in uses]
            history.append({"role": "user", "content": results})
    return run.outcome


def _run_tool(run: Run, tools: dict[str, Tool], use: dict[str, Any]) -> dict[str, Any]:
    tool = tools.get(use.get("name", ""))
    args = use.get("input")
    base = {"type": "tool_result", "tool_use_id": use.get("id")}
    try:
        if tool is None:
            run.call_tool(str(use.get("name")), unknown_tool, {"name": str(use.get("name"))})
            raise AssertionError("unreachable")  # pragma: no cover
        if not isinstance(args, dict):
            run.call_tool(tool.name, malformed_arguments, {"raw": str(args)[:500]})
            raise AssertionError("unreachable")  # pragma: no cover
        out = run.call_tool(tool.name, tool.fn, args, timeout=tool.timeout, idempotent=tool.idempotent,
                            lookup=tool.lookup)  # fmt: skip
        return {**base, "content": result_text(out)}
    except ToolError as exc:
        return {**base, "content": exc.model_message, "is_error": True}


def _task_of(history: list[dict[str, Any]]) -> str:
    for m in history:
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            return str(m["content"])[:200]
    return ""
