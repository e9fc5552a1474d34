"""The τ² suite's CrewAI policies: a one-agent crew as users write it, alone and under
tether's adapter (``TetherCrew``), its model a CrewAI ``BaseLLM`` answering from the running
episode's scripted model (OpenAI-shaped tool calls, as CrewAI's providers return them) and
raising the OpenAI SDK's errors when the endpoint refuses, as CrewAI's OpenAI provider
(its default) surfaces them.

CrewAI caps packages below the main venv's pins, so these policies run where it is
installed (``.venv-crewai``): ``--tau-policy crewai --tau-policy tether-crewai``.

* ``crewai``: ``Agent`` and ``Task`` with CrewAI's defaults: its LLMs' rate-limit retries
  (3 attempts on a 429, the ``Retry-After`` waited, on the episode's clock here),
  ``max_iter=25`` (then its "best final answer" request), ``max_retry_limit=2`` (a task
  whose model call raised runs again from its start, tools and all).
* ``tether-crewai``: the same crew through ``TetherCrew(guard, side_effects=LOOKUPS)``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from typing import Any

from tether.bench._tau_common import CRASH_TEXT, PROMPT, SYSTEM, Ending
from tether.bench._tau_common import guard_of as _guard
from tether.bench._tau_common import told as _told
from tether.bench._tau_formats import _openai_exception, _text, _usage
from tether.bench._tau_model import Call
from tether.bench._tau_tools import ASYNC, LOOKUPS
from tether.bench._tau_world import MODEL, current

__all__ = ["crewai"]

#: what CrewAI's native tool path answers the model for a tool that raised
_FAILED = "Error executing tool:"


def _results(messages: Any) -> dict[str, tuple[str, bool]]:
    """The tool results of the last turn, by call id: (text, whether the tool failed)."""
    results: dict[str, tuple[str, bool]] = {}
    listed: list[Any] = messages if isinstance(messages, list) else []
    for message in reversed(listed):
        if not isinstance(message, Mapping) or message.get("role") != "tool":
            if results:
                break
            continue
        text = _text(message.get("content"))
        results[str(message.get("tool_call_id"))] = (text, text.startswith(_FAILED))
    return results


_CREW: dict[str, Any] = {}


def _model() -> Any:
    from crewai.llms.base_llm import BaseLLM
    from openai.types.chat.chat_completion_message_tool_call import (
        ChatCompletionMessageToolCall,
        Function,
    )

    ids = itertools.count()

    class ScriptedModel(BaseLLM):  # type: ignore[misc]
        """The episode's scripted model behind CrewAI's model interface."""

        def _reply(self, messages: Any) -> Any:
            episode = current()
            refused = episode.model_fault()
            if refused is not None:
                raise _openai_exception(*refused)
            before = (episode.input_tokens, episode.output_tokens)
            turn = episode.respond(_results(messages))
            used = _usage(before)
            self._track_token_usage_internal(
                {"prompt_tokens": used["in"], "completion_tokens": used["out"]}
            )
            if isinstance(turn, Call):
                call = Function(name=turn.name, arguments=json.dumps(dict(turn.args)))
                return [ChatCompletionMessageToolCall(id=turn.id or f"c{next(ids)}",
                                                      type="function", function=call)]  # fmt: skip
            return turn.text

        def call(self, messages: Any, *a: Any, **k: Any) -> Any:
            return self._reply(messages)

        async def acall(self, messages: Any, *a: Any, **k: Any) -> Any:
            return self._reply(messages)

        def supports_function_calling(self) -> bool:
            return True

    return ScriptedModel(model=MODEL)


def _crew() -> Any:
    from crewai import Agent, Crew, Task
    from crewai.tools import tool

    if "tools" not in _CREW:
        _CREW["tools"] = [tool(name)(fn) for name, fn in ASYNC.items()]
    agent = Agent(role="retail customer service agent", goal=SYSTEM,
                  backstory="You help the retail store's customers with their orders.",
                  llm=_model(), tools=list(_CREW["tools"]), verbose=False)  # fmt: skip
    task = Task(description=PROMPT, expected_output="the reply to the customer", agent=agent)
    return Crew(agents=[agent], tasks=[task], verbose=False)


def _waits_on(episode: Any) -> None:
    """CrewAI's own rate-limit retries (every ``BaseLLM``'s ``call``/``acall``: 3 attempts,
    the ``Retry-After`` or 1 s doubling) wait on the episode's clock, not in real time."""
    from crewai.llms import retry

    retry.run_with_rate_limit_retry.__kwdefaults__["sleep"] = episode.clock.sleep
    retry.arun_with_rate_limit_retry.__kwdefaults__["sleep"] = episode.clock.asleep


async def crewai(episode: Any, tethered: bool) -> Ending:
    _waits_on(episode)
    crew = _crew()
    if not tethered:
        try:
            output = await crew.akickoff()
        except Exception:
            return Ending(CRASH_TEXT, "crash")
        return Ending(str(output.raw), "answer")
    from tether.integrations.crewai import TetherCrew

    crewed = TetherCrew(_guard(episode), side_effects=LOOKUPS)
    try:
        outcome = await crewed.akickoff(crew)
    except Exception:
        return Ending(CRASH_TEXT, "crash")
    return _told(outcome)
