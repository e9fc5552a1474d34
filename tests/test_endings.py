"""Honest endings where a person or the model acts (#40): a hand-over tool, a person's "no"
(``tether.Declined``), a side effect's business error; each through the adapters that name
it (the real SDKs over loopback, the frameworks with their own fake models)."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from agents import Agent, function_tool, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.usage import Usage
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, interrupt
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import tether
from scripted_server import Reply, ScriptedServer, run_claude
from tether import Guard, RetryPolicy, StopReason, Tool, VirtualClock
from tether.integrations import anthropic as t_anthropic
from tether.integrations import openai as t_openai
from tether.integrations import openai_agents as ta_agents
from tether.integrations import pydantic_ai as ta_pydantic
from tether.integrations.langchain import TetherMiddleware

set_tracing_disabled(True)

HANDED = tether.CustomerMessages().handed_over.format(done="")
ASK = "I want to talk to a human"


def guard(tmp_path: Path, **kw: Any) -> tuple[Guard, tether.Records]:
    records = tether.Records.sqlite(str(tmp_path / "records.db"))
    policy = RetryPolicy(max_attempts=3, base=0.01, cap=0.05)
    return Guard(records=records, retry=policy, clock=VirtualClock(), **kw), records


def filed(records: tether.Records) -> tuple[list[str], int, int]:
    """The statuses of the filed runs, the dead letters (each pointing at a filed run) and
    the cases."""
    runs = records.runs.list()
    ids = {r["run_id"] for r in runs}
    letters = records.dead_letters.list()
    assert all(letter.run_id in ids for letter in letters), "a dead letter points at no run"
    return (
        [f"{r['status']}/{r['reason']}" for r in runs],
        len(letters),
        len(records.handoffs.list()),
    )


def transfer_to_human(reason: str) -> str:
    """Transfer the customer to a human agent."""
    return "transferred"


# --- run_agent: anthropic and openai over loopback -----------------------------------------


def claude_message(content: list[dict[str, Any]], stop: str = "end_turn") -> dict[str, Any]:
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
            "content": content, "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5}}  # fmt: skip


def gpt_completion(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion", "created": 0, "model": "gpt-4o-mini",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}  # fmt: skip


def claude_calls(name: str, args: dict[str, Any], answer: str) -> list[Reply]:
    use = {"type": "tool_use", "id": "tu_1", "name": name, "input": args}
    return [Reply(200, claude_message([use], stop="tool_use")),
            Reply(200, claude_message([{"type": "text", "text": answer}]))]  # fmt: skip


def gpt_calls(name: str, args: str, answer: str) -> list[Reply]:
    call = {"id": "call_1", "type": "function", "function": {"name": name, "arguments": args}}
    return [Reply(200, gpt_completion({"content": None, "tool_calls": [call]}, finish="tool_calls")),
            Reply(200, gpt_completion({"content": answer}))]  # fmt: skip


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_run_agent_hands_over_through_claude(tmp_path: Path, shell: str) -> None:
    """transfer_to_human(hands_over=True): the tool runs, its result is in the conversation,
    the model is not asked again; the run ends escalated with a case, and the customer reads
    that a person has it."""
    g, records = guard(tmp_path)
    tools = [Tool("transfer_to_human", transfer_to_human, hands_over=True)]
    with ScriptedServer() as server:
        server.script = claude_calls(
            "transfer_to_human", {"reason": "asked"}, "Passed to a colleague"
        )
        ask = {"model": "claude-haiku-4-5", "messages": [{"role": "user", "content": ASK}],
               "tools": tools, "guard": g}  # fmt: skip
        out = run_claude(shell, server.url, ask)
        assert len(server.requests) == 1  # the model is not asked again
    assert (out.status, out.stopped_because) == ("escalated", StopReason.HANDED_OVER)
    assert out.customer_message == HANDED
    assert out.handoff is not None and out.partial[0]["result"] == "transferred"
    assert out.messages[-1]["content"][0]["content"] == "transferred"  # the conversation is whole
    assert filed(records) == (["escalated/handed_over"], 0, 1)


def test_run_agent_hands_over_through_gpt_and_promises_no_one_without_a_case() -> None:
    """Without anywhere to file a case the run still ends escalated, and the customer is told
    nobody has it."""
    with ScriptedServer() as server, openai.OpenAI(api_key="t", base_url=server.url + "/v1") as raw:
        server.script = gpt_calls("transfer_to_human", '{"reason": "asked"}', "Passed on")
        out = t_openai.run_agent(raw, model="gpt-4o-mini", messages=[{"role": "user", "content": ASK}],
                                 tools=[Tool("transfer_to_human", transfer_to_human, hands_over=True)],
                                 guard=Guard(clock=VirtualClock()))  # fmt: skip
    assert (out.status, out.stopped_because) == ("escalated", StopReason.HANDED_OVER)
    assert out.customer_message == tether.CustomerMessages().handed_over_no_case.format(done="")
    assert "team now has your case" not in out.customer_message


def test_a_tool_without_hands_over_still_succeeds() -> None:
    """The same tool not declared a hand-over: the model's answer ends the run (as before)."""
    with ScriptedServer() as server, anthropic.Anthropic(api_key="t", base_url=server.url) as raw:
        server.script = claude_calls("transfer_to_human", {"reason": "asked"}, "Passed on")
        out = t_anthropic.run_agent(raw, model="claude-haiku-4-5", messages=[{"role": "user", "content": ASK}],
                                    tools=[Tool("transfer_to_human", transfer_to_human)],
                                    guard=Guard(clock=VirtualClock()))  # fmt: skip
    assert out.status == "success"


def test_hands_over_is_checked() -> None:
    with pytest.raises(TypeError, match="hands_over"):
        Tool("t", transfer_to_human, hands_over="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="hand_over must be a list"):
        TetherMiddleware(Guard(), hand_over="transfer_to_human")


# --- LangChain create_agent + TetherMiddleware -------------------------------------------


class FakeToolModel(GenericFakeChatModel):
    model_name: str = "fake-model"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def lc_model(name: str, args: dict[str, Any], answer: str) -> FakeToolModel:
    return FakeToolModel(messages=iter([
        AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": "c1"}]),
        AIMessage(content=answer)]))  # fmt: skip


@pytest.mark.parametrize("shell", ["invoke", "ainvoke"])
def test_the_middleware_hands_over(tmp_path: Path, shell: str) -> None:
    g, records = guard(tmp_path)
    handed = tool("transfer_to_human")(transfer_to_human)
    agent = create_agent(lc_model("transfer_to_human", {"reason": "asked"}, "Passed on"), tools=[handed],
                         middleware=[TetherMiddleware(g, hand_over=["transfer_to_human"])])  # fmt: skip
    user = {"messages": [("user", ASK)]}
    state = agent.invoke(user) if shell == "invoke" else asyncio.run(agent.ainvoke(user))
    out = state["tether_outcome"]
    assert (out.status, out.stopped_because) == ("escalated", StopReason.HANDED_OVER)
    assert state["messages"][-1].content == HANDED
    assert [m.content for m in state["messages"] if m.type == "tool"] == ["transferred"]
    assert filed(records) == (["escalated/handed_over"], 0, 1)


# --- the Agents SDK and PydanticAI -------------------------------------------------------


def sdk_agent(name: str, fn: Any, args: dict[str, Any], answer: str) -> Agent[Any]:
    usage = Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15)
    model = ScriptedModel([[function_call(name, args, call_id="c1")], [assistant_message(answer)]],
                          default_usage=usage)  # fmt: skip
    return Agent(name="support", model=model, tools=[function_tool(fn, name_override=name)])


def test_the_agents_sdk_hands_over(tmp_path: Path) -> None:
    g, records = guard(tmp_path)
    agent = sdk_agent("transfer_to_human", transfer_to_human, {"reason": "asked"}, "Passed on")
    out = ta_agents.run_sync(agent, ASK, guard=g, hand_over=["transfer_to_human"])
    assert (out.status, out.stopped_because) == ("escalated", StopReason.HANDED_OVER)
    assert out.customer_message == HANDED
    assert filed(records) == (["escalated/handed_over"], 0, 1)


def pydantic_agent(
    name: str, fn: Any, args: dict[str, Any], answer: str
) -> PydanticAgent[None, Any]:
    counter = itertools.count()

    def respond(messages: list[Any], info: AgentInfo) -> ModelResponse:
        if next(counter) == 0:
            return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id="c1")])
        return ModelResponse(parts=[TextPart(answer)])

    agent: PydanticAgent[None, Any] = PydanticAgent(FunctionModel(respond, model_name="scripted"))
    agent.tool_plain(name=name)(fn)
    return agent


def test_pydantic_ai_hands_over(tmp_path: Path) -> None:
    g, records = guard(tmp_path)
    agent = pydantic_agent("transfer_to_human", transfer_to_human, {"reason": "asked"}, "Passed on")
    out = ta_pydantic.run_sync(agent, ASK, guard=g, hand_over=["transfer_to_human"])
    assert (out.status, out.stopped_because) == ("escalated", StopReason.HANDED_OVER)
    assert out.customer_message == HANDED
    assert filed(records) == (["escalated/handed_over"], 0, 1)


# --- Declined: a person's "no" -----------------------------------------------------------


def booking_agent(g: Guard, bookings: list[str]) -> Any:
    """docs/langchain.md's book_hotel: interrupt() in a side-effect tool, a "no" Declined."""

    @tool
    def book_hotel(hotel: str) -> str:
        """Book a hotel, once the customer confirms."""
        if interrupt({"question": f"Book {hotel}?"}) != "yes":
            raise tether.Declined("the customer did not confirm the booking")
        bookings.append(hotel)
        return f"booked {hotel}"

    model = FakeToolModel(messages=iter([
        AIMessage(content="", tool_calls=[{"name": "book_hotel", "args": {"hotel": "Hilton Basel"}, "id": "c1"}]),
        AIMessage(content="Booked: Hilton Basel.")]))  # fmt: skip
    return create_agent(model, tools=[book_hotel], checkpointer=InMemorySaver(),
                        middleware=[TetherMiddleware(g, side_effects=["book_hotel"])])  # fmt: skip


def test_a_persons_no_is_never_done(tmp_path: Path) -> None:
    """Command(resume="no"): nothing booked, DECLINED, "failed", never "done"; the model's
    later "Booked" is never asked for; nothing filed as a case."""
    g, records = guard(tmp_path)
    bookings: list[str] = []
    agent = booking_agent(g, bookings)
    config = {"configurable": {"thread_id": "customer-7"}}
    agent.invoke({"messages": [("user", "book the Hilton")]}, config)
    done = agent.invoke(Command(resume="no"), config)
    out = done["tether_outcome"]
    assert bookings == []
    assert (out.status, out.stopped_because) == ("failed", StopReason.DECLINED)
    assert out.customer_message == tether.CustomerMessages().declined.format(done="")
    assert "Done" not in out.customer_message and out.partial == ()
    assert done["messages"][-1].content == out.customer_message
    assert filed(records) == (["failed/declined"], 0, 0)
    # the ledger holds no result for the "no": the same intent, approved later, runs
    key = g.ledger.records()
    assert all(r.state.value != "done" for r in key)


def test_a_persons_yes_keeps_the_tools_own_result(tmp_path: Path) -> None:
    """outcome.partial holds the tool's own result, never tether's encoding of a ToolMessage."""
    g, _ = guard(tmp_path)
    bookings: list[str] = []
    agent = booking_agent(g, bookings)
    config = {"configurable": {"thread_id": "customer-8"}}
    agent.invoke({"messages": [("user", "book the Hilton")]}, config)
    out = agent.invoke(Command(resume="yes"), config)["tether_outcome"]
    assert bookings == ["Hilton Basel"] and out.status == "success"
    assert [p["result"] for p in out.partial] == ["booked Hilton Basel"]


def test_declined_raised_or_returned_releases_the_ledger() -> None:
    """Raised or returned, sync or async: DECLINED; the ledger keeps no result, so the same
    call in a later run of the request (approved this time) runs."""
    g = Guard(clock=VirtualClock())
    done: list[str] = []

    def book(hotel: str, ok: bool) -> Any:
        if not ok:
            return tether.Declined("no")
        done.append(hotel)
        return {"id": "bk_1"}

    with g.start("book", key="ticket-1") as run:
        with pytest.raises(tether.ToolError, match="declined: no"):  # what the model reads
            run.call_tool("book", book, {"hotel": "H", "ok": False}, idempotent=False)
        assert not run.proceed()
    assert run.outcome.stopped_because is StopReason.DECLINED and run.outcome.status == "failed"

    async def abook(hotel: str) -> Any:
        raise tether.Declined("no")

    async def main() -> tether.Outcome:
        async with g.start("book", key="ticket-2") as run:
            with pytest.raises(tether.ToolError):
                await run.acall_tool("book", abook, {"hotel": "H"}, idempotent=False)
        return run.outcome

    assert asyncio.run(main()).stopped_because is StopReason.DECLINED

    def approved(hotel: str, ok: bool) -> Any:  # the same intent, approved this time
        done.append(hotel)
        return {"id": "bk_1"}

    with g.start("book", key="ticket-1") as run:
        run.call_tool("book", approved, {"hotel": "H", "ok": False}, idempotent=False)
        run.succeed()
    assert done == ["H"] and run.outcome.status == "success"


def test_declined_after_other_work_is_partial() -> None:
    """A "no" after a completed effect: "partial", saying what was done."""
    g = Guard(clock=VirtualClock())
    with g.start("trip") as run:
        run.call_tool(
            "book_flight", lambda: {"id": "fl_9"}, idempotent=False, label="flight booking"
        )
        with pytest.raises(tether.ToolError):
            run.call_tool("book_hotel", lambda: tether.Declined("no"), idempotent=False)
    out = run.outcome
    assert (out.status, out.stopped_because) == ("partial", StopReason.DECLINED)
    assert "flight booking completed (reference fl_9)" in out.customer_message


# --- one ending per error in every adapter -----------------------------------------------

ENDED = (["escalated/permanent_error"], 1, 1)


def refund(order: str) -> str:
    """Refund an order."""
    raise ValueError("card expired")


def test_a_refunds_error_ends_run_agent(tmp_path: Path) -> None:
    g, records = guard(tmp_path)
    with ScriptedServer() as server, anthropic.Anthropic(api_key="t", base_url=server.url) as raw:
        server.script = claude_calls("refund", {"order": "A-1"}, "Sorry, the card expired")
        out = t_anthropic.run_agent(raw, model="claude-haiku-4-5", messages=[{"role": "user", "content": "refund A-1"}],
                                    tools=[Tool("refund", refund, idempotent=False)], guard=g)  # fmt: skip
    assert (out.status, out.stopped_because) == ("escalated", StopReason.PERMANENT_ERROR)
    assert filed(records) == ENDED


def test_a_refunds_error_ends_the_agents_sdk(tmp_path: Path) -> None:
    g, records = guard(tmp_path)
    agent = sdk_agent("refund", refund, {"order": "A-1"}, "Sorry, the card expired")
    out = ta_agents.run_sync(agent, "refund A-1", guard=g, side_effects=["refund"])
    assert (out.status, out.stopped_because) == ("escalated", StopReason.PERMANENT_ERROR)
    assert filed(records) == ENDED


def test_a_refunds_error_ends_pydantic_ai(tmp_path: Path) -> None:
    """PydanticAI raises the tool's exception (as it does alone), the run filed the same way."""
    g, records = guard(tmp_path)
    agent = pydantic_agent("refund", refund, {"order": "A-1"}, "Sorry, the card expired")
    with pytest.raises(ValueError, match="card expired"):
        ta_pydantic.run_sync(agent, "refund A-1", guard=g, side_effects=["refund"])
    assert filed(records) == ENDED


@pytest.mark.parametrize("shell", ["invoke", "ainvoke"])
def test_a_refunds_error_ends_the_middleware(tmp_path: Path, shell: str) -> None:
    """LangChain raises the tool's exception out of invoke (handle_tool_errors' default): the
    run is filed first, and its dead letter points at it."""
    g, records = guard(tmp_path)
    agent = create_agent(lc_model("refund", {"order": "A-1"}, "Sorry"), tools=[tool("refund")(refund)],
                         middleware=[TetherMiddleware(g, side_effects=["refund"])])  # fmt: skip
    user = {"messages": [("user", "refund A-1")]}
    with pytest.raises(ValueError, match="card expired"):
        agent.invoke(user) if shell == "invoke" else asyncio.run(agent.ainvoke(user))
    assert filed(records) == ENDED


def test_a_refunds_handled_error_ends_the_middleware_the_same_way(tmp_path: Path) -> None:
    """The tool's own error handling (handle_tool_error) answers with an error message: the
    same ending, never the error message recorded as the refund's result."""
    from langchain_core.tools import StructuredTool, ToolException

    def failing(order: str) -> str:
        raise ToolException("card expired")

    handled = StructuredTool.from_function(failing, name="refund", description="Refund an order.",
                                           handle_tool_error=True)  # fmt: skip
    g, records = guard(tmp_path)
    agent = create_agent(lc_model("refund", {"order": "A-1"}, "Sorry"), tools=[handled],
                         middleware=[TetherMiddleware(g, side_effects=["refund"])])  # fmt: skip
    state = agent.invoke({"messages": [("user", "refund A-1")]})
    out = state["tether_outcome"]
    assert (out.status, out.stopped_because) == ("escalated", StopReason.PERMANENT_ERROR)
    assert "Done" not in out.customer_message
    assert filed(records) == ENDED


# --- meaning as data: "part of this" only when a part was done; a named reference --------


def test_a_stuck_lookup_with_nothing_done_is_not_part_of_this() -> None:
    """REPEATED_ACTION after lookups only: the status stays "partial" (a call completed), the
    customer is not told a part was done, nor to try again: a call left ``idempotent=True``
    ran, and tether cannot tell a lookup from an unmarked side effect."""
    with Guard(clock=VirtualClock()).start("find invoice 99") as run:
        while run.proceed():
            run.call_tool("search", lambda q: "no result", {"q": "invoice 99"})
    out = run.outcome
    assert (out.status, out.stopped_because) == ("partial", StopReason.REPEATED_ACTION)
    assert "part of this" not in out.customer_message
    assert out.customer_message == tether.CustomerMessages().acted.format(done="")


def test_a_done_steps_reference_from_the_field_its_tool_names() -> None:
    with ScriptedServer() as server, anthropic.Anthropic(api_key="t", base_url=server.url) as raw:
        server.script = claude_calls("refund", {"order": "A-1"}, "Refunded.")
        tools = [Tool("refund", lambda order: {"refund_id": "re_9", "id": "evt_1"}, idempotent=False,
                      label="refund", reference="refund_id")]  # fmt: skip
        out = t_anthropic.run_agent(raw, model="claude-haiku-4-5", messages=[{"role": "user", "content": "x"}],
                                    tools=tools, guard=Guard(clock=VirtualClock()))  # fmt: skip
    assert (
        out.customer_message == "Your request is complete. Done: refund completed (reference re_9)."
    )
    with Guard(clock=VirtualClock()).start("refund") as run:
        run.call_tool("refund", lambda: {"r": {"n": 7}}, idempotent=False, label="refund",
                      reference=lambda result: f"R-{result['r']['n']}")  # fmt: skip
        run.succeed()
    assert run.outcome.customer_message.endswith("refund completed (reference R-7).")
    with pytest.raises(TypeError, match="reference"):
        Tool("refund", refund, reference=3)  # type: ignore[arg-type]


# --- a decision stands --------------------------------------------------------------------


def test_a_rejected_call_asked_again_is_no_new_case(tmp_path: Path) -> None:
    """Rejected on the page, the model asks again: the same answer (the person's words, never
    their name), no new approval, no case; the run ends DECLINED."""
    g, records = guard(tmp_path)
    paid: list[int] = []
    tools = [Tool("refund", lambda order, amount: paid.append(amount) or {"id": "re_1"},
                  idempotent=False, requires_approval=True)]  # fmt: skip

    def asks(i: int) -> Reply:
        use = {
            "type": "tool_use",
            "id": f"tu_{i}",
            "name": "refund",
            "input": {"order": "A-1", "amount": 9000},
        }
        return Reply(200, claude_message([use], stop="tool_use"))

    ask = {"model": "claude-haiku-4-5", "tools": tools, "guard": g}
    with ScriptedServer() as server, anthropic.Anthropic(api_key="t", base_url=server.url) as raw:
        server.script = [asks(1)]
        first = t_anthropic.run_agent(
            raw, messages=[{"role": "user", "content": "refund 9000"}], **ask
        )
        assert first.status == "awaiting_approval"
        g.reject(first.checkpoint_id, by="carol", note="order is older than 90 days")
        server.script = [
            asks(2),
            asks(3),
            Reply(200, claude_message([{"type": "text", "text": "No."}])),
        ]
        out = t_anthropic.run_agent(raw, messages=first.messages, resume=first.checkpoint_id, **ask)
    read = [b["content"] for m in out.messages if m["role"] == "user" and isinstance(m["content"], list)
            for b in m["content"] if b.get("type") == "tool_result"]  # fmt: skip
    assert read == ["rejected: order is older than 90 days"] * 2 and "carol" not in str(
        out.messages
    )
    assert (out.status, out.stopped_because) == ("failed", StopReason.DECLINED)
    assert paid == [] and [a.status for a in g.approvals()] == ["rejected"]
    assert records.handoffs.list() == []


def test_one_keyword_for_the_persons_words(tmp_path: Path) -> None:
    """note= on approve and reject; reason= stays as its alias on both."""
    g, _ = guard(tmp_path)

    def waiting() -> str:
        with g.start("refund") as run:
            run.call_tool("refund", lambda: None, requires_approval=True)
        assert run.outcome.checkpoint_id is not None
        return run.outcome.checkpoint_id

    assert g.reject(waiting(), by="bob", note="too old").note == "too old"
    assert g.reject(waiting(), by="bob", reason="too old").note == "too old"
    assert g.approve(waiting(), by="ann", reason="checked").note == "checked"
    assert g.approve(waiting(), by="ann", note="checked").note == "checked"
    with pytest.raises(TypeError, match="note="):
        g.approve(waiting(), by="ann", note="a", reason="b")
