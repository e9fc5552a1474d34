"""Google ADK: ``Runner(app=App(plugins=[TetherPlugin(guard)]))`` on a real ``LlmAgent``
whose model is a ``BaseLlm`` fed by the script (ADK's own model interface, as ADK's tests
script theirs). Imported lazily: ADK lives in ``.venv-frameworks``."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator
from typing import Any

from conformance.suite import INPUT_TOKENS, OUTPUT_TOKENS, Adapter, Mode, World, ask
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
    #: each paused run's runner and session, for its resume (ADK continues that session)
    paused: dict[str, tuple[Any, Any, str, Any]] = {}

    def agent(self, world: World, asynchronous: bool) -> Any:
        from google.adk.agents import LlmAgent

        return LlmAgent(name="support", model=_model(world), tools=world.tools(asynchronous))

    def _go(
        self, agent: Any, guard: Guard, mode: Mode, reuse: Any = None, answer: Any = None,
        **rules: Any,
    ) -> Any:  # fmt: skip
        from google.adk.agents.run_config import RunConfig, StreamingMode
        from google.adk.apps import App
        from google.adk.runners import Runner
        from google.adk.sessions import InMemorySessionService
        from google.genai import types

        from tether.integrations.adk import TetherPlugin

        plugin = TetherPlugin(guard, **rules)
        app = App(name="shop", root_agent=agent, plugins=[plugin])
        service = InMemorySessionService() if reuse is None else reuse[0]
        runner = Runner(app=app, session_service=service)
        if reuse is None:
            made = asyncio.run(service.create_session(app_name="shop", user_id="u"))
            session_id = made.id
            message = types.Content(role="user", parts=[types.Part(text="refund A-1")])
        else:
            session_id = reuse[1]
            message = types.Content(role="user", parts=[types.Part(function_response=answer)])
        events: list[Any] = []
        if mode == "sync":
            events = list(runner.run(user_id="u", session_id=session_id, new_message=message))
        else:
            config = RunConfig(streaming_mode=StreamingMode.SSE if mode == "stream" else None)

            async def read() -> None:
                async for event in runner.run_async(user_id="u", session_id=session_id,
                                                    new_message=message, run_config=config):  # fmt: skip
                    events.append(event)

            asyncio.run(read())
        outcome = plugin.last_outcome
        if outcome is not None and outcome.checkpoint_id:
            self.paused[outcome.checkpoint_id] = (service, session_id, agent, events)
        return outcome

    def run(self, world: World, guard: Guard, mode: Mode, **rules: Any) -> Any:
        return self._go(self.agent(world, mode != "sync"), guard, mode, **rules)

    def resume(self, world: World, guard: Guard, paused: Any, mode: Mode, **rules: Any) -> Any:
        """The ADK user confirms the call ADK asked about (``adk_request_confirmation``),
        in the same session; the approval, already decided by ``guard``, stands."""
        from google.genai import types

        service, session_id, agent, events = self.paused.pop(paused.checkpoint_id)
        (ask,) = [p.function_call for e in events for p in (e.content.parts if e.content else ())
                  if p.function_call and p.function_call.name == "adk_request_confirmation"]  # fmt: skip
        answer = types.FunctionResponse(id=ask.id, name=ask.name, response={"confirmed": True})
        return self._go(agent, guard, mode, reuse=(service, session_id), answer=answer, **rules)

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
