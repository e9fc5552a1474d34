"""Google ADK: ``Runner(app=App(plugins=[TetherPlugin(guard)]))`` on a real ``LlmAgent``
whose model is a ``BaseLlm`` fed by the script (ADK's own model interface, as ADK's tests
script theirs). Imported lazily: ADK lives in ``.venv-frameworks``."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator
from typing import Any

from conformance.suite import INPUT_TOKENS, OUTPUT_TOKENS, Adapter, Cell, Mode, World, ask
from tether import Guard

_ids = itertools.count()


def _model(world: World) -> Any:
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_response import LlmResponse
    from google.genai import types

    def reply(partial: bool = False) -> LlmResponse:
        turn = world.next_turn()
        if isinstance(turn, str):
            parts = [types.Part(text=turn)]
        else:
            parts = [types.Part(function_call=types.FunctionCall(
                name=c.name, args=dict(c.args), id=f"c{next(_ids)}")) for c in turn]  # fmt: skip
        usage = types.GenerateContentResponseUsageMetadata(
            prompt_token_count=INPUT_TOKENS, candidates_token_count=OUTPUT_TOKENS
        )
        return LlmResponse(content=types.Content(role="model", parts=parts), usage_metadata=usage)

    class WorldModel(BaseLlm):  # type: ignore[misc]
        model: str = "scripted"

        async def generate_content_async(
            self, llm_request: Any, stream: bool = False
        ) -> AsyncGenerator[LlmResponse, None]:
            whole = reply()
            if stream:  # a partial chunk first, then the whole reply (as Gemini streams)
                yield LlmResponse(content=whole.content, partial=True)
            yield whole

    return WorldModel()


class ADK(Adapter):
    id = "adk"
    name = "Google ADK: `TetherPlugin` (`Runner(plugins=[...])`)"
    venv = "frameworks"
    not_applicable = {
        Cell.PAUSE_RESUME: (
            "not built yet (#42): an ADK invocation paused for a tether approval cannot be "
            "resumed from its checkpoint; ADK's own require_confirmation flow pauses instead"
        ),
    }

    def agent(self, world: World, asynchronous: bool) -> Any:
        from google.adk.agents import LlmAgent

        return LlmAgent(name="support", model=_model(world), tools=world.tools(asynchronous))

    def _go(self, agent: Any, guard: Guard, mode: Mode, **rules: Any) -> Any:
        from google.adk.agents.run_config import RunConfig, StreamingMode
        from google.adk.apps import App
        from google.adk.runners import InMemoryRunner
        from google.genai import types

        from tether.integrations.adk import TetherPlugin

        plugin = TetherPlugin(guard, **rules)
        runner = InMemoryRunner(app=App(name="shop", root_agent=agent, plugins=[plugin]))
        message = types.Content(role="user", parts=[types.Part(text="refund A-1")])
        session = asyncio.run(runner.session_service.create_session(app_name="shop", user_id="u"))
        if mode == "sync":
            for _ in runner.run(user_id="u", session_id=session.id, new_message=message):
                pass
            return plugin.last_outcome
        config = RunConfig(streaming_mode=StreamingMode.SSE if mode == "stream" else None)

        async def read() -> None:
            async for _ in runner.run_async(user_id="u", session_id=session.id,
                                            new_message=message, run_config=config):  # fmt: skip
                pass

        asyncio.run(read())
        return plugin.last_outcome

    def run(self, world: World, guard: Guard, mode: Mode, **rules: Any) -> Any:
        return self._go(self.agent(world, mode != "sync"), guard, mode, **rules)

    def nested(self, world: World, guard: Guard, mode: Mode) -> Any:
        """A sub-agent as a tool (``AgentTool``): ADK runs it with the parent's plugins, its
        model turns counted in the parent's run."""
        from google.adk.agents import LlmAgent
        from google.adk.tools.agent_tool import AgentTool

        inner = LlmAgent(name="refunds", model=_model(world), description="Handles refunds.",
                         tools=world.tools(True))  # fmt: skip
        outer = LlmAgent(name="support", model=_model(world), tools=[AgentTool(agent=inner)])
        world.turns = [ask(("refunds", {"request": "refund A-1"})),
                       *[ask(("search", {"q": f"A-{i}"})) for i in range(10)]]  # fmt: skip
        return self._go(outer, guard, mode)
