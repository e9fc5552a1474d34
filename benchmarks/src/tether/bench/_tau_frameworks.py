"""The τ² suite's Google ADK and Strands policies: each framework alone, with its defaults,
and under tether's adapter (``TetherPlugin``, ``TetherHooks``), driven by the framework's own
model interface answering from the running episode's scripted model.

Both frameworks cap packages below the main venv's pins, so these policies run where they
are installed (``.venv-frameworks``): ``--tau-policy adk --tau-policy tether-adk ...``.

* ``adk``: an ``LlmAgent`` in an ``InMemoryRunner`` with ADK's defaults (``RunConfig``'s
  ``max_llm_calls`` set to the suite's turn cap); its model a ``BaseLlm`` that raises the
  Anthropic SDK's errors when the endpoint refuses, as ADK's ``Claude`` model surfaces them.
* ``strands``: an ``Agent`` with Strands' defaults (its ``ModelRetryStrategy``: 6 attempts
  on throttling, 4 s doubling); its model a Strands ``Model`` raising what Strands'
  Anthropic provider raises (``ModelThrottledException`` for a 429, the SDK's error for a
  529). Strands has no turn cap of its own: the suite's model refuses a turn past
  :data:`MAX_TURNS` answered ones (an error, as a hook limiting the turns would raise).
* ``tether-adk``, ``tether-strands``: the same agents with tether's adapter, the writes
  declared with their lookups.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from tether.bench._tau_common import CRASH_TEXT, MAX_TURNS, PROMPT, SYSTEM, Ending
from tether.bench._tau_common import guard_of as _guard
from tether.bench._tau_common import told as _told
from tether.bench._tau_formats import _anthropic_exception, _text, _usage
from tether.bench._tau_model import Call
from tether.bench._tau_tools import ASYNC, LOOKUPS
from tether.bench._tau_world import MODEL, current

__all__ = ["adk", "strands"]


# --- Google ADK ------------------------------------------------------------------------------


def _adk_results(llm_request: Any) -> dict[str, tuple[str, bool]]:
    results: dict[str, tuple[str, bool]] = {}
    for content in reversed(llm_request.contents or ()):
        for part in content.parts or ():
            response = part.function_response
            if response is None:
                continue
            body = response.response or {}
            flagged = "error" in body and "result" not in body
            value = body.get("error" if flagged else "result", body)
            results[str(response.id)] = (_text(value) if not isinstance(value, dict)
                                         else json.dumps(value), flagged)  # fmt: skip
        if results:
            break
    return results


_ADK: dict[str, Any] = {}


def _adk_model() -> Any:
    if "model" in _ADK:
        return _ADK["model"]
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_response import LlmResponse
    from google.genai import types

    class ScriptedGemini(BaseLlm):  # type: ignore[misc]
        """The episode's scripted model behind ADK's model interface."""

        model: str = MODEL

        async def generate_content_async(
            self, llm_request: Any, stream: bool = False
        ) -> AsyncGenerator[Any, None]:
            episode = current()
            refused = episode.model_fault()
            if refused is not None:
                raise _anthropic_exception(*refused)
            before = (episode.input_tokens, episode.output_tokens)
            turn = episode.respond(_adk_results(llm_request))
            used = _usage(before)
            if isinstance(turn, Call):
                call = types.FunctionCall(name=turn.name, args=dict(turn.args), id=turn.id)
                part = types.Part(function_call=call)
            else:
                part = types.Part(text=turn.text)
            usage = types.GenerateContentResponseUsageMetadata(
                prompt_token_count=used["in"], candidates_token_count=used["out"]
            )
            yield LlmResponse(content=types.Content(role="model", parts=[part]),
                              usage_metadata=usage, model_version=MODEL)  # fmt: skip

    _ADK["model"] = ScriptedGemini()
    return _ADK["model"]


async def adk(episode: Any, tethered: bool) -> Ending:
    from google.adk.agents import LlmAgent
    from google.adk.agents.run_config import RunConfig
    from google.adk.apps import App
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    plugins: list[Any] = []
    if tethered:
        from tether.integrations.adk import TetherPlugin

        plugins.append(TetherPlugin(_guard(episode), side_effects=LOOKUPS))
    agent = LlmAgent(name="retail", model=_adk_model(), instruction=SYSTEM,
                     tools=list(ASYNC.values()))  # fmt: skip
    runner = InMemoryRunner(app=App(name="retail", root_agent=agent, plugins=plugins))
    session = await runner.session_service.create_session(app_name="retail", user_id="u")
    message = types.Content(role="user", parts=[types.Part(text=PROMPT)])
    said = ""
    try:
        async for event in runner.run_async(user_id="u", session_id=session.id,
                                            new_message=message,
                                            run_config=RunConfig(max_llm_calls=MAX_TURNS)):  # fmt: skip
            parts = event.content.parts if event.content else None
            texts = [p.text for p in parts or () if p.text]
            if texts:
                said = "".join(texts)
    except Exception:
        if not tethered or plugins[0].last_outcome is None:
            return Ending(CRASH_TEXT, "crash")
    if tethered:
        outcome = plugins[0].last_outcome
        return Ending(CRASH_TEXT, "crash") if outcome is None else _told(outcome)
    return Ending(said, "answer")


# --- Strands Agents ----------------------------------------------------------------------------


def _strands_results(messages: Any) -> dict[str, tuple[str, bool]]:
    results: dict[str, tuple[str, bool]] = {}
    for message in reversed(messages or ()):
        for block in message.get("content") or ():
            result = block.get("toolResult") if isinstance(block, Mapping) else None
            if result is None:
                continue
            text = "".join(str(c.get("text", "")) if "text" in c else json.dumps(c.get("json"))
                           for c in result.get("content") or ())  # fmt: skip
            results[str(result.get("toolUseId"))] = (text, result.get("status") == "error")
        if results:
            break
    return results


def _strands_model() -> Any:
    from strands.models import Model
    from strands.types.exceptions import ModelThrottledException

    class ScriptedClaude(Model):  # type: ignore[misc]
        """The episode's scripted model behind Strands' model interface."""

        def __init__(self) -> None:
            self.config = {"model_id": MODEL}
            self.turns = 0  # answered requests: the turns the suite's cap counts

        def update_config(self, **config: Any) -> None:
            self.config.update(config)

        def get_config(self) -> Any:
            return self.config

        async def structured_output(self, *a: Any, **k: Any) -> AsyncGenerator[Any, None]:
            raise NotImplementedError("the τ² suite asks for no structured output")
            yield  # pragma: no cover

        async def stream(self, messages: Any, *a: Any, **k: Any) -> AsyncGenerator[Any, None]:
            if self.turns >= MAX_TURNS:  # the suite's turn cap (Strands has none)
                raise RuntimeError(f"more than {MAX_TURNS} model turns")
            episode = current()
            refused = episode.model_fault()
            if refused is not None:
                error = _anthropic_exception(*refused)
                if refused[0] == 429:  # what Strands' Anthropic provider raises for it
                    raise ModelThrottledException(str(error)) from error
                raise error
            self.turns += 1
            before = (episode.input_tokens, episode.output_tokens)
            turn = episode.respond(_strands_results(messages))
            used = _usage(before)
            yield {"messageStart": {"role": "assistant"}}
            if isinstance(turn, Call):
                start = {"toolUse": {"name": turn.name, "toolUseId": turn.id}}
                yield {"contentBlockStart": {"start": start}}
                yield {
                    "contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(turn.args)}}}
                }
            else:
                yield {"contentBlockStart": {"start": {}}}
                yield {"contentBlockDelta": {"delta": {"text": turn.text}}}
            yield {"contentBlockStop": {}}
            yield {
                "messageStop": {"stopReason": "tool_use" if isinstance(turn, Call) else "end_turn"}
            }
            usage = {"inputTokens": used["in"], "outputTokens": used["out"],
                     "totalTokens": used["in"] + used["out"]}  # fmt: skip
            yield {"metadata": {"usage": usage, "metrics": {"latencyMs": 1}}}

    return ScriptedClaude()


_STRANDS_TOOLS: list[Any] = []


async def strands(episode: Any, tethered: bool) -> Ending:
    from strands import Agent, tool

    if not _STRANDS_TOOLS:
        _STRANDS_TOOLS.extend(tool(fn) for fn in ASYNC.values())
    hooks: list[Any] = []
    if tethered:
        from tether.integrations.strands import TetherHooks

        hooks.append(TetherHooks(_guard(episode), side_effects=LOOKUPS))
    agent = Agent(model=_strands_model(), system_prompt=SYSTEM, tools=list(_STRANDS_TOOLS),
                  hooks=hooks, callback_handler=None)  # fmt: skip
    try:
        result = await agent.invoke_async(PROMPT)
    except Exception:
        if not tethered or hooks[0].last_outcome is None:
            return Ending(CRASH_TEXT, "crash")
        return _told(hooks[0].last_outcome)
    if tethered:
        outcome = hooks[0].last_outcome
        return Ending(CRASH_TEXT, "crash") if outcome is None else _told(outcome)
    return Ending("".join(b.get("text", "") for b in result.message["content"]), "answer")
