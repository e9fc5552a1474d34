"""The scripted model behind each provider's real wire format.

``anthropic_transport`` and ``openai_transport`` are ``httpx2.MockTransport`` handlers (the
SDKs' own transport seam): the real ``anthropic`` and ``openai`` clients send their real
requests, and get Messages API or chat-completions replies, ``429`` with ``Retry-After``
or ``529`` exactly as the services send them. ``chat_model()`` is a LangChain chat model
(LangChain's extension point, like its fake chat models) answering from the same
scripted model, raising the Anthropic SDK's own errors when the endpoint refuses.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from tether.bench._tau_model import Answer, Call
from tether.bench._tau_world import MODEL, current

__all__ = ["anthropic_transport", "chat_model", "openai_transport"]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in content
        )
    return str(content)


# --- Anthropic Messages -----------------------------------------------------------------


def _anthropic_results(body: Mapping[str, Any]) -> dict[str, tuple[str, bool]]:
    results: dict[str, tuple[str, bool]] = {}
    for message in reversed(body.get("messages") or ()):
        if message.get("role") != "user" or not isinstance(message.get("content"), list):
            continue
        for block in message["content"]:
            if isinstance(block, Mapping) and block.get("type") == "tool_result":
                results[str(block.get("tool_use_id"))] = (
                    _text(block.get("content", "")),
                    bool(block.get("is_error")),
                )
        if results:
            break
    return results


def _anthropic_reply(turn: Call | Answer, n: int, usage: dict[str, int]) -> dict[str, Any]:
    if isinstance(turn, Call):
        content: list[dict[str, Any]] = [
            {"type": "tool_use", "id": turn.id, "name": turn.name, "input": turn.args}
        ]
        stop = "tool_use"
    else:
        content, stop = [{"type": "text", "text": turn.text}], "end_turn"
    return {
        "id": f"msg_{n:04d}",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": usage["in"], "output_tokens": usage["out"]},
    }


def _anthropic_error(status: int, left: float) -> tuple[dict[str, Any], dict[str, str]]:
    if status == 429:
        return (
            {
                "type": "error",
                "error": {
                    "type": "rate_limit_error",
                    "message": "Number of request tokens has exceeded your per-minute rate limit",
                },
            },
            {"retry-after": str(max(1, math.ceil(left)))},
        )
    return {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, {}


def _usage(before: tuple[int, int]) -> dict[str, int]:
    episode = current()
    return {"in": episode.input_tokens - before[0], "out": episode.output_tokens - before[1]}


def _transport(
    error: Callable[..., tuple[dict[str, Any], dict[str, str]]],
    results: Callable[[Any], Any],
    reply: Callable[[Any, Any, dict[str, int]], Any],
) -> Any:
    """A MockTransport answering from the running episode in one API's format: its
    ``error`` body for a fault the episode injects, else its ``reply`` to the turn."""
    import httpx2

    def handle(request: Any) -> Any:
        episode = current()
        refused = episode.model_fault()
        if refused is not None:
            body, headers = error(*refused)
            return httpx2.Response(refused[0], json=body, headers=headers)
        before = (episode.input_tokens, episode.output_tokens)
        turn = episode.respond(results(json.loads(request.content)))
        return httpx2.Response(200, json=reply(turn, episode.answered, _usage(before)))

    return httpx2.MockTransport(handle)


def anthropic_transport() -> Any:
    """A MockTransport answering as the Messages API, from the running episode."""
    return _transport(_anthropic_error, _anthropic_results, _anthropic_reply)


# --- OpenAI chat completions -------------------------------------------------------------


def _openai_results(body: Mapping[str, Any]) -> dict[str, tuple[str, bool]]:
    results: dict[str, tuple[str, bool]] = {}
    for message in reversed(body.get("messages") or ()):
        if message.get("role") != "tool":
            if results:
                break
            continue
        results[str(message.get("tool_call_id"))] = (_text(message.get("content", "")), False)
    return results


def _openai_reply(turn: Call | Answer, n: int, usage: dict[str, int]) -> dict[str, Any]:
    if isinstance(turn, Call):
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": turn.id,
                    "type": "function",
                    "function": {"name": turn.name, "arguments": json.dumps(turn.args)},
                }
            ],
        }
        finish = "tool_calls"
    else:
        message, finish = {"role": "assistant", "content": turn.text}, "stop"
    return {
        "id": f"chatcmpl-{n:04d}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": MODEL,
        "choices": [{"index": 0, "finish_reason": finish, "message": message}],
        "usage": {
            "prompt_tokens": usage["in"],
            "completion_tokens": usage["out"],
            "total_tokens": usage["in"] + usage["out"],
        },
    }


def _openai_error(status: int, left: float) -> tuple[dict[str, Any], dict[str, str]]:
    if status == 429:
        return (
            {
                "error": {
                    "message": "Rate limit reached for requests",
                    "type": "requests",
                    "code": "rate_limit_exceeded",
                }
            },
            {"retry-after": str(max(1, math.ceil(left)))},
        )
    return {
        "error": {"message": "The server is overloaded", "type": "server_error", "code": None}
    }, {}


def openai_transport() -> Any:
    """A MockTransport answering as chat completions, from the running episode."""
    return _transport(_openai_error, _openai_results, _openai_reply)


# --- LangChain ---------------------------------------------------------------------------


def _sdk_exception(
    sdk: Any,
    url: str,
    error: Callable[..., tuple[dict[str, Any], dict[str, str]]],
    status: int,
    left: float,
) -> Exception:
    """The error an SDK (``anthropic``, ``openai``) raises for this refusal at ``url``."""
    import httpx2

    body, headers = error(status, left)
    request = httpx2.Request("POST", url)
    response = httpx2.Response(status, json=body, headers=headers, request=request)
    kind = sdk.RateLimitError if status == 429 else sdk.InternalServerError
    return kind(str(body["error"]["message"]), response=response, body=body)  # type: ignore[no-any-return]


def _anthropic_exception(status: int, left: float) -> Exception:
    """The error the Anthropic SDK raises for this refusal (what a LangChain model surfaces)."""
    import anthropic

    url = "https://api.anthropic.com/v1/messages"
    return _sdk_exception(anthropic, url, _anthropic_error, status, left)


_CHAT_MODEL: list[Any] = []


def chat_model() -> Any:
    """A LangChain chat model answering from the running episode's scripted model."""
    if _CHAT_MODEL:
        return _CHAT_MODEL[0]
    import anthropic  # noqa: F401  (the errors it raises: imported with the model, not at a fault)
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    class ScriptedChatModel(BaseChatModel):
        """The scripted model as a LangChain chat model (tools are the agent's business)."""

        model_name: str = MODEL

        @property
        def _llm_type(self) -> str:
            return "tau-scripted"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(
            self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any
        ) -> ChatResult:
            episode = current()
            refused = episode.model_fault()
            if refused is not None:
                raise _anthropic_exception(*refused)
            results: dict[str, tuple[str, bool]] = {}
            for m in reversed(messages):
                if getattr(m, "type", "") != "tool":
                    if results:
                        break
                    continue
                results[str(m.tool_call_id)] = (
                    _text(m.content),
                    getattr(m, "status", "") == "error",
                )
            before = (episode.input_tokens, episode.output_tokens)
            turn = episode.respond(results)
            used = _usage(before)
            meta: Any = {
                "input_tokens": used["in"],
                "output_tokens": used["out"],
                "total_tokens": used["in"] + used["out"],
            }
            if isinstance(turn, Call):
                message = AIMessage(
                    content="",
                    usage_metadata=meta,
                    tool_calls=[{"name": turn.name, "args": turn.args, "id": turn.id}],
                )
            else:
                message = AIMessage(content=turn.text, usage_metadata=meta)
            return ChatResult(generations=[ChatGeneration(message=message)])

        async def _agenerate(
            self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any
        ) -> ChatResult:
            return self._generate(messages, stop)

    _CHAT_MODEL.append(ScriptedChatModel())
    return _CHAT_MODEL[0]


# --- the OpenAI Agents SDK and PydanticAI: their own test-model seams ----------------------


def _openai_exception(status: int, left: float) -> Exception:
    """The error the OpenAI SDK raises for this refusal (what the Agents SDK's models surface)."""
    import openai

    url = "https://api.openai.com/v1/chat/completions"
    return _sdk_exception(openai, url, _openai_error, status, left)


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


_AGENTS_MODEL: list[Any] = []


def agents_model() -> Any:
    """An Agents SDK ``Model`` (the SDK's seam for test models, like ``agents.testing``'s
    ``ScriptedModel``) answering from the running episode's scripted model."""
    if _AGENTS_MODEL:
        return _AGENTS_MODEL[0]
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    class ScriptedAgentsModel(Model):
        model = MODEL

        async def get_response(
            self,
            system_instructions: Any,
            input: Any,
            model_settings: Any,
            tools: Any,
            output_schema: Any,
            handoffs: Any,
            tracing: Any,
            **kwargs: Any,
        ) -> Any:
            episode = current()
            refused = episode.model_fault()
            if refused is not None:
                raise _openai_exception(*refused)
            results: dict[str, tuple[str, bool]] = {}
            for item in reversed(input if isinstance(input, list) else []):
                if _field(item, "type") != "function_call_output":
                    if results:
                        break
                    continue
                results[str(_field(item, "call_id"))] = (_text(_field(item, "output")), False)
            before = (episode.input_tokens, episode.output_tokens)
            turn = episode.respond(results)
            used = _usage(before)
            output: list[Any]
            if isinstance(turn, Call):
                output = [
                    ResponseFunctionToolCall(
                        type="function_call",
                        name=turn.name,
                        call_id=turn.id,
                        arguments=json.dumps(turn.args),
                        id=f"fc_{turn.id}",
                        status="completed",
                    )
                ]
            else:
                text = ResponseOutputText(type="output_text", text=turn.text, annotations=[])
                output = [
                    ResponseOutputMessage(
                        type="message",
                        id=f"msg_{episode.answered}",
                        role="assistant",
                        status="completed",
                        content=[text],
                    )
                ]
            usage = Usage(
                requests=1,
                input_tokens=used["in"],
                output_tokens=used["out"],
                total_tokens=used["in"] + used["out"],
            )
            return ModelResponse(output=output, usage=usage, response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the τ² suite does not stream")

    _AGENTS_MODEL.append(ScriptedAgentsModel())
    return _AGENTS_MODEL[0]


async def _pydantic_turn(messages: list[Any], info: Any) -> Any:
    from pydantic_ai.exceptions import ModelHTTPError
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.usage import RequestUsage

    episode = current()
    refused = episode.model_fault()
    if refused is not None:
        body, headers = _openai_error(*refused)
        raise ModelHTTPError(refused[0], MODEL, body, headers=headers)
    results: dict[str, tuple[str, bool]] = {}
    last = messages[-1] if messages else None
    for part in getattr(last, "parts", ()):
        kind = getattr(part, "part_kind", "")
        if kind == "tool-return":
            results[str(part.tool_call_id)] = (_text(part.content), False)
        elif kind == "retry-prompt" and getattr(part, "tool_call_id", None):
            results[str(part.tool_call_id)] = (str(part.model_response()), True)
    before = (episode.input_tokens, episode.output_tokens)
    turn = episode.respond(results)
    used = _usage(before)
    usage = RequestUsage(input_tokens=used["in"], output_tokens=used["out"])
    if isinstance(turn, Call):
        return ModelResponse(
            parts=[ToolCallPart(turn.name, turn.args, tool_call_id=turn.id)],
            usage=usage,
            model_name=MODEL,
        )
    return ModelResponse(parts=[TextPart(turn.text)], usage=usage, model_name=MODEL)


def pydantic_model() -> Any:
    """PydanticAI's ``FunctionModel`` answering from the running episode's scripted model."""
    from pydantic_ai.models.function import FunctionModel

    return FunctionModel(_pydantic_turn, model_name=MODEL)
