"""One agent-loop request in the other provider's format, and its reply back.

``run_agent`` builds its requests itself (messages of text, tool calls and tool results,
tool schemas, a token limit), so a fallback of the other provider can be asked the same
thing: the request is written in that provider's format, the reply is read back in the
loop's own (the conversation stays in the loop's provider's format, ``outcome.messages``).
What has no faithful counterpart (an image, a thinking block, a provider option such as
``tool_choice``) is refused before any request, naming it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Translation", "Untranslatable", "translation"]

#: request options both providers take, by the loop's name: the other provider's name
_OPTIONS = {
    ("anthropic", "openai"): {
        "temperature": "temperature",
        "top_p": "top_p",
        "stop_sequences": "stop",
        "metadata": None,
    },
    ("openai", "anthropic"): {"stop": "stop_sequences", "metadata": None, "user": None},
}
_TO_OPENAI_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
_TO_ANTHROPIC_STOP = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


class Untranslatable(ValueError):
    """A request with something the other provider has no faithful counterpart for."""


def _options(kwargs: Mapping[str, Any], way: tuple[str, str], skip: set[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    names = _OPTIONS[way]
    for name, value in kwargs.items():
        if name in skip:
            continue
        if name not in names:
            raise Untranslatable(f"the {way[0]} option {name}= has no {way[1]} counterpart")
        target = names[name]  # None: no counterpart needed (metadata)
        if target is not None:
            out[target] = [value] if name == "stop" and isinstance(value, str) else value
    return out


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, or text blocks/parts only."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    parts = []
    for block in content:
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind != "text":
            raise Untranslatable(f"{where} holds a {kind or type(block).__name__!r} block")
        parts.append(str(block.get("text", "")))
    return "".join(parts)


def _arguments(raw: Any) -> dict[str, Any]:
    try:
        args = json.loads(raw or "{}")
    except ValueError:
        return {}
    return args if isinstance(args, dict) else {}


# --- an Anthropic loop asking an OpenAI model ------------------------------------------------


def anthropic_to_openai(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A Messages API request as a chat-completions request."""
    way = ("anthropic", "openai")
    known = {"model", "messages", "system", "tools", "max_tokens", "extra_headers", "timeout"}
    out = {"model": kwargs["model"], **_options(kwargs, way, known)}
    messages: list[dict[str, Any]] = []
    if kwargs.get("system") is not None:
        messages.append({"role": "system", "content": _text(kwargs["system"], "the system prompt")})
    for i, m in enumerate(kwargs["messages"]):
        messages.extend(_openai_messages(m, f"messages[{i}]"))
    out["messages"] = messages
    if kwargs.get("tools"):
        out["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t["name"],
                    "description": t.get("description", ""),
                    "parameters": t["input_schema"],
                },
            }
            for t in kwargs["tools"]
        ]
    if kwargs.get("max_tokens") is not None:
        out["max_completion_tokens"] = kwargs["max_tokens"]
    for name in ("extra_headers", "timeout"):
        if name in kwargs:
            out[name] = kwargs[name]
    return out


def _openai_messages(m: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    role, content = m.get("role"), m.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    blocks = list(content or ())
    kinds = {b.get("type") for b in blocks}
    if not kinds <= {"text", "tool_use", "tool_result"}:
        raise Untranslatable(f"{where} holds {sorted(str(k) for k in kinds)!r} blocks")
    texts = _text([b for b in blocks if b.get("type") == "text"], where)
    if role == "assistant":
        entry: dict[str, Any] = {"role": "assistant", "content": texts or None}
        calls = [
            {
                "id": b["id"],
                "type": "function",
                "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {})},
            }
            for b in blocks
            if b.get("type") == "tool_use"
        ]
        if calls:
            entry["tool_calls"] = calls
        return [entry]
    out: list[dict[str, Any]] = []
    for b in blocks:
        if b.get("type") == "tool_result":
            text = _text(b.get("content"), f"{where}'s tool result")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": b["tool_use_id"],
                    "content": f"error: {text}" if b.get("is_error") else text,
                }
            )
    if texts:
        out.append({"role": "user", "content": texts})
    return out


def openai_reply_as_anthropic(completion: Any) -> Any:
    """A chat completion read as a Messages API reply (what the Anthropic loop reads)."""
    choice = completion.choices[0]
    message = choice.message
    content: list[dict[str, Any]] = []
    if message.content:
        content.append({"type": "text", "text": message.content})
    for call in message.tool_calls or ():
        raw = call.function.arguments
        args: Any = _arguments(raw) if _is_object(raw) else raw  # kept: the loop refuses it
        content.append(
            {"type": "tool_use", "id": call.id, "name": call.function.name, "input": args}
        )
    stop = _TO_ANTHROPIC_STOP.get(str(choice.finish_reason), "end_turn")
    return TranslatedReply(model=str(completion.model), stop_reason=stop, content=content)


def _is_object(raw: Any) -> bool:
    try:
        return isinstance(json.loads(raw or "{}"), dict)
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class TranslatedReply:
    """A reply of the other provider as the Anthropic loop reads it."""

    model: str
    stop_reason: str
    content: list[dict[str, Any]] = field(default_factory=list)


# --- an OpenAI loop asking an Anthropic model ------------------------------------------------


def openai_to_anthropic(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A chat-completions request as a Messages API request."""
    way = ("openai", "anthropic")
    known = {"model", "messages", "tools", "max_completion_tokens", "max_tokens"}
    out = {"model": kwargs["model"], **_options(kwargs, way, known | {"extra_headers", "timeout"})}
    limit = kwargs.get("max_completion_tokens", kwargs.get("max_tokens"))
    if limit is None:
        raise Untranslatable("an anthropic model needs max_tokens (run_agent(max_tokens=...))")
    out["max_tokens"] = limit
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    for i, m in enumerate(kwargs["messages"]):
        role, where = m.get("role"), f"messages[{i}]"
        if role in ("system", "developer"):
            system.append(_text(m.get("content"), where))
            continue
        entry = _anthropic_message(m, where)
        if messages and messages[-1]["role"] == entry["role"]:
            messages[-1]["content"].extend(entry["content"])  # one turn a role, alternating
        else:
            messages.append(entry)
    out["messages"] = messages
    if system:
        out["system"] = "\n\n".join(system)
    if kwargs.get("tools"):
        out["tools"] = [_anthropic_tool(t) for t in kwargs["tools"]]
    for name in ("extra_headers", "timeout"):
        if name in kwargs:
            out[name] = kwargs[name]
    return out


def _anthropic_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise Untranslatable(f"a {tool.get('type')!r} tool has no anthropic counterpart")
    fn = tool["function"]
    return {
        "name": fn["name"],
        "description": fn.get("description", ""),
        "input_schema": fn.get("parameters") or {"type": "object"},
    }


def _anthropic_message(m: Mapping[str, Any], where: str) -> dict[str, Any]:
    role = m.get("role")
    if role == "tool":
        result = {
            "type": "tool_result",
            "tool_use_id": str(m.get("tool_call_id")),
            "content": _text(m.get("content"), where),
        }
        return {"role": "user", "content": [result]}
    text = _text(m.get("content"), where)
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    if role == "assistant":
        for call in m.get("tool_calls") or ():
            fn = call.get("function", {})
            blocks.append(
                {
                    "type": "tool_use",
                    "id": str(call.get("id")),
                    "name": fn.get("name"),
                    "input": _arguments(fn.get("arguments")),
                }
            )
        return {"role": "assistant", "content": blocks}
    if role != "user":
        raise Untranslatable(f"{where} has the role {role!r}")
    return {"role": "user", "content": blocks}


def anthropic_reply_as_openai(message: Any) -> Any:
    """A Messages API reply read as a chat completion (what the OpenAI loop reads)."""
    from openai.types.chat import ChatCompletion

    texts, calls = [], []
    for block in message.content:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": json.dumps(block.input)},
                }
            )
    usage = message.usage
    return ChatCompletion.model_validate(
        {
            "id": message.id,
            "object": "chat.completion",
            "created": 0,
            "model": message.model,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": _TO_OPENAI_FINISH.get(str(message.stop_reason), "stop"),
                    "message": {
                        "role": "assistant",
                        "content": "".join(texts) or None,
                        "tool_calls": calls or None,
                    },
                }
            ],
            "usage": {
                "prompt_tokens": usage.input_tokens,
                "completion_tokens": usage.output_tokens,
                "total_tokens": usage.input_tokens + usage.output_tokens,
            },
        }
    )


@dataclass(frozen=True, slots=True)
class Translation:
    """How a loop of one provider asks a model of another: its request, then the reply."""

    request: Callable[[Mapping[str, Any]], dict[str, Any]]
    reply: Callable[[Any], Any]


_WAYS = {
    ("anthropic", "openai"): Translation(anthropic_to_openai, openai_reply_as_anthropic),
    ("openai", "anthropic"): Translation(openai_to_anthropic, anthropic_reply_as_openai),
}


def translation(loop: str, model: str) -> Translation:
    """The way a ``loop``-provider request reaches a ``model``-provider model."""
    return _WAYS[(loop, model)]
