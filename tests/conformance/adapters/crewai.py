"""CrewAI: ``tether.integrations.crewai.kickoff(crew, guard=...)`` on a real ``Crew`` whose
agent's model is a CrewAI ``BaseLLM`` answering from the script (OpenAI-shaped tool calls,
as CrewAI's OpenAI provider returns them). Imported lazily: CrewAI lives in ``.venv-crewai``."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any, ClassVar

from conformance.suite import INPUT_TOKENS, OUTPUT_TOKENS, Adapter, Cell, Mode, World, ask
from tether import Guard

_ids = itertools.count()


def _model(world: World) -> Any:
    from crewai.llms.base_llm import BaseLLM
    from openai.types.chat.chat_completion_message_tool_call import (
        ChatCompletionMessageToolCall,
        Function,
    )

    class WorldModel(BaseLLM):  # type: ignore[misc]
        def _reply(self) -> Any:
            turn = world.next_turn()
            self._track_token_usage_internal(
                {"prompt_tokens": INPUT_TOKENS, "completion_tokens": OUTPUT_TOKENS}
            )
            if isinstance(turn, str):
                return turn
            return [
                ChatCompletionMessageToolCall(
                    id=f"call_{next(_ids)}",
                    type="function",
                    function=Function(name=c.name, arguments=json.dumps(dict(c.args))),
                )
                for c in turn
            ]

        def call(self, *a: Any, **k: Any) -> Any:
            return self._reply()

        async def acall(self, *a: Any, **k: Any) -> Any:
            return self._reply()

        def supports_function_calling(self) -> bool:
            return True

    return WorldModel(model="scripted")


class CrewAI(Adapter):
    id = "crewai"
    name = "CrewAI: `kickoff(crew, guard=...)` (`TetherCrew`)"
    venv = "crewai"
    not_applicable: ClassVar[dict[Cell, str]] = {}
    #: the crew is kicked off again from its start: the model asks for the approved call again
    reasks_after_resume = True

    def crew(self, world: World, asynchronous: bool, stream: bool = False) -> Any:
        from crewai import Agent, Crew, Task
        from crewai.tools import tool

        tools = [tool(fn.__name__)(fn) for fn in world.tools(asynchronous)]
        agent = Agent(role="clerk", goal="help the customer", backstory="careful",
                      llm=_model(world), tools=tools, verbose=False)  # fmt: skip
        task = Task(description="refund A-1", expected_output="an answer", agent=agent)
        return Crew(agents=[agent], tasks=[task], verbose=False, stream=stream)

    def run(self, world: World, guard: Guard, mode: Mode, **rules: Any) -> Any:
        crew = self.crew(world, mode == "async", stream=mode == "stream")
        return self._go(crew, guard, mode, **rules)

    def _go(self, crew: Any, guard: Guard, mode: Mode, **rules: Any) -> Any:
        from tether.integrations.crewai import TetherCrew, akickoff, kickoff

        if mode == "stream":  # Crew(stream=True), its chunks read to the end
            resume = rules.pop("resume", None)
            crewed = TetherCrew(guard, **rules)
            for _chunk in crewed.stream(crew, resume=resume):
                pass
            return crewed.last_outcome
        if mode == "sync":
            return kickoff(crew, guard=guard, **rules)
        return asyncio.run(akickoff(crew, guard=guard, **rules))

    def resume(self, world: World, guard: Guard, paused: Any, mode: Mode, **rules: Any) -> Any:
        """The crew kicked off again with ``resume=`` the paused run's checkpoint."""
        crew = self.crew(world, mode == "async", stream=mode == "stream")
        return self._go(crew, guard, mode, resume=paused.checkpoint_id, **rules)

    def nested(self, world: World, guard: Guard, mode: Mode) -> Any:
        """CrewAI's delegation: the clerk hands the refund to a coworker (``Delegate work to
        coworker``), whose model turns and tool calls count in the kickoff's one run."""
        from crewai import Agent, Crew, Task
        from crewai.tools import tool

        tools = [tool(fn.__name__)(fn) for fn in world.tools(mode == "async")]
        inner = Agent(role="refunds", goal="refund orders", backstory="careful",
                      llm=_model(world), tools=tools, verbose=False)  # fmt: skip
        outer = Agent(role="clerk", goal="help the customer", backstory="careful",
                      llm=_model(world), allow_delegation=True, verbose=False)  # fmt: skip
        task = Task(description="refund A-1", expected_output="an answer", agent=outer)
        delegate = ("delegate_work_to_coworker",
                    {"task": "refund A-1", "context": "the customer asked", "coworker": "refunds"})  # fmt: skip
        world.turns = [ask(delegate), *[ask(("search", {"q": f"A-{i}"})) for i in range(10)]]
        crew = Crew(agents=[outer, inner], tasks=[task], verbose=False, stream=mode == "stream")
        return self._go(crew, guard, mode)
