"""The request of a conversation (#38, case 7): an adapter's run serves the framework's
conversation by default, so an effect re-asked in a later turn of the same conversation
("try again") happens at most once without ``key=``; a run outside a conversation stays
its own request. The Agents SDK with a session, PydanticAI with its message history, on
the frameworks' own scripted models."""

from __future__ import annotations

import uuid
from typing import Any

from agents import Agent, SQLiteSession, function_tool, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.usage import Usage
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from tether import Guard, LoopPolicy, RetryPolicy, StopReason
from tether.integrations import openai_agents as ta_agents
from tether.integrations import pydantic_ai as ta_pydantic

set_tracing_disabled(True)

FAST = {"retry": RetryPolicy(base=0.01, cap=0.02), "loops": LoopPolicy(max_no_progress=None)}


def _refund_call(i: int) -> Any:
    return [function_call("issue_refund", {"order": "A-1", "uuid": uuid.uuid4().hex},
                          call_id=f"call_{i}")]  # fmt: skip


def _cashier() -> tuple[Agent[Any], dict[str, Any]]:
    """A refund that commits at the provider, then times out on the way back; the model
    asks for it in each turn (a fresh uuid each time), then answers."""
    provider: dict[str, Any] = {}

    @function_tool
    def issue_refund(order: str, uuid: str) -> str:
        """Refund an order."""
        provider[order + uuid] = {"id": f"re_{len(provider) + 1}", "order": order}
        raise TimeoutError("read timed out")

    steps = [_refund_call(0), _refund_call(1), [assistant_message("Refunded.")]]
    usage = Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15)
    model = ScriptedModel(steps, default_usage=usage)
    return Agent(name="cashier", model=model, tools=[issue_refund]), provider


def test_agents_sdk_the_next_turn_of_a_session_pays_nothing_twice() -> None:
    """Turn 1: the refund commits and times out (unknown outcome, the run stops). Turn 2,
    the same session: "try again". Before: 2 refunds; the session is the request: 1."""
    agent, provider = _cashier()
    guard = Guard(**FAST)
    session = SQLiteSession("conversation-1")
    first = ta_agents.run_sync(agent, "refund order A-1", guard=guard, session=session,
                               side_effects={"issue_refund": None})  # fmt: skip
    assert first.stopped_because is StopReason.UNKNOWN_OUTCOME
    second = ta_agents.run_sync(agent, "try again", guard=guard, session=session,
                                side_effects={"issue_refund": None})  # fmt: skip
    assert len(provider) == 1
    assert second.stopped_because is StopReason.UNKNOWN_OUTCOME  # still unknown: not re-paid


def test_agents_sdk_runs_outside_a_session_are_their_own_requests() -> None:
    agent, provider = _cashier()
    guard = Guard(**FAST)
    for text in ("refund order A-1", "refund order A-1 please"):
        ta_agents.run_sync(agent, text, guard=guard, side_effects={"issue_refund": None})
    assert len(provider) == 2  # two conversations asked: each is done


def test_agents_sdk_a_key_still_names_the_request() -> None:
    agent, provider = _cashier()
    guard = Guard(**FAST)
    for name in ("conversation-a", "conversation-b"):  # two sessions, one ticket
        ta_agents.run_sync(agent, "refund order A-1", guard=guard, key="ticket-1",
                           session=SQLiteSession(name),
                           side_effects={"issue_refund": None})  # fmt: skip
    assert len(provider) == 1


def _pydantic_cashier() -> tuple[PydanticAgent[None, Any], dict[str, Any]]:
    provider: dict[str, Any] = {}
    turns = iter(range(100))

    def respond(messages: list[Any], info: AgentInfo) -> ModelResponse:
        usage = RequestUsage(input_tokens=10, output_tokens=5)
        if next(turns) >= 2:
            return ModelResponse(parts=[TextPart("Refunded.")], usage=usage)
        args = {"order": "A-1", "uuid": uuid.uuid4().hex}
        return ModelResponse(parts=[ToolCallPart("issue_refund", args)], usage=usage)

    agent: PydanticAgent[None, Any] = PydanticAgent(FunctionModel(respond))

    @agent.tool_plain
    def issue_refund(order: str, uuid: str) -> str:
        """Refund an order."""
        provider[order + uuid] = {"id": f"re_{len(provider) + 1}", "order": order}
        raise TimeoutError("read timed out")

    return agent, provider


def test_pydantic_ai_the_next_turn_of_a_conversation_pays_nothing_twice() -> None:
    """Turn 2 continues turn 1's messages (PydanticAI's conversation): 1 refund, not 2."""
    agent, provider = _pydantic_cashier()
    guard = Guard(**FAST)
    first = ta_pydantic.run_sync(agent, "refund order A-1", guard=guard,
                                 side_effects={"issue_refund": None})  # fmt: skip
    assert first.stopped_because is StopReason.UNKNOWN_OUTCOME
    ta_pydantic.run_sync(agent, "try again", guard=guard, message_history=first.messages,
                         side_effects={"issue_refund": None})  # fmt: skip
    assert len(provider) == 1


def test_pydantic_ai_runs_without_history_are_their_own_requests() -> None:
    agent, provider = _pydantic_cashier()
    guard = Guard(**FAST)
    for text in ("refund order A-1", "refund order A-1 please"):
        ta_pydantic.run_sync(agent, text, guard=guard, side_effects={"issue_refund": None})
    assert len(provider) == 2
