"""The OpenAI Agents SDK under tether: the SDK's scripted test model, and the real
OpenAI client against a scripted server on loopback."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import openai
import pytest
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.usage import Usage

import tether
from scripted_server import Reply, ScriptedServer
from tether import Budget, Guard, LoopPolicy, Price, PriceTable, RetryPolicy, StopReason
from tether.integrations import openai_agents as ta_agents

USAGE = Usage(requests=1, input_tokens=1000, output_tokens=100, total_tokens=1100)


set_tracing_disabled(True)  # offline: no trace export


def alone(agent: Agent[Any], input: str) -> Any:
    """The SDK on its own (``asyncio.run``: ``Runner.run_sync`` leaves its event loop open)."""
    return asyncio.run(Runner.run(agent, input))


def calls(name: str, args: Any, n: int) -> list[Any]:
    """``n`` model turns asking for the same tool (``args`` may be a function of i)."""
    return [[function_call(name, args(i) if callable(args) else args, call_id=f"call_{i}")]
            for i in range(n)]  # fmt: skip


def model(steps: list[Any]) -> ScriptedModel:
    return ScriptedModel(steps, default_usage=USAGE)


def search_tool() -> tuple[Any, list[str]]:
    searched: list[str] = []

    @function_tool
    def search(q: str) -> str:
        """Search invoices."""
        searched.append(q)
        return "no result"

    return search, searched


def refund_tool() -> tuple[Any, dict[str, dict[str, Any]]]:
    """A refund that commits at the provider, then times out on the way back."""
    provider: dict[str, dict[str, Any]] = {}

    @function_tool
    def issue_refund(order: str, uuid: str) -> str:
        """Refund an order."""
        provider[order + uuid] = {"id": f"re_{len(provider) + 1}", "order": order}
        raise TimeoutError("read timed out")

    return issue_refund, provider


def fresh_uuids(i: int) -> dict[str, str]:
    return {"order": "A-1", "uuid": uuid.uuid4().hex}


# --- the two cases, alone and with tether ---------------------------------------------------


def test_alone_the_stuck_search_runs_until_max_turns() -> None:
    search, searched = search_tool()
    agent = Agent(
        name="clerk", model=model(calls("search", {"q": "invoice 99"}, 12)), tools=[search]
    )
    with pytest.raises(MaxTurnsExceeded):
        alone(agent, "find invoice 99")
    assert len(searched) == 10


def test_a_stuck_agent_runs_its_search_twice() -> None:
    search, searched = search_tool()
    agent = Agent(
        name="clerk", model=model(calls("search", {"q": "invoice 99"}, 12)), tools=[search]
    )
    outcome = ta_agents.run_sync(agent, "find invoice 99", guard=Guard(budget=Budget(max_steps=30)))
    assert searched == ["invoice 99", "invoice 99"]
    assert outcome.stopped_because is StopReason.REPEATED_ACTION
    assert outcome.usage.model_calls == 3  # the 4th request is never sent
    # the partial conversation in the SDK's input format: the user, 3 calls, 3 outputs
    assert outcome.messages[0] == {"content": "find invoice 99", "role": "user"}
    kinds = [m.get("type") for m in outcome.messages[1:]]
    assert kinds == ["function_call", "function_call_output"] * 3
    assert agent.tools[0] is search  # the caller's agent is untouched


def test_alone_the_refund_with_fresh_uuids_is_paid_every_time() -> None:
    refund, provider = refund_tool()
    steps = [*calls("issue_refund", fresh_uuids, 2), [assistant_message("Refunded.")]]
    alone(Agent(name="cashier", model=model(steps), tools=[refund]), "refund order A-1")
    assert len(provider) == 2  # the SDK turned each timeout into text; the model asked again


def test_a_refund_re_requested_with_a_fresh_uuid_runs_once() -> None:
    refund, provider = refund_tool()
    steps = [*calls("issue_refund", fresh_uuids, 2), [assistant_message("Refunded.")]]
    agent = Agent(name="cashier", model=model(steps), tools=[refund])
    guard = Guard(retry=RetryPolicy(base=0.01, cap=0.02), loops=LoopPolicy(max_no_progress=None))
    outcome = ta_agents.run_sync(agent, "refund order A-1", guard=guard,
                                 side_effects={"issue_refund": None})  # fmt: skip
    assert len(provider) == 1
    # the unknown outcome stops the run: nobody tells the customer to try again
    assert outcome.stopped_because is StopReason.UNKNOWN_OUTCOME
    assert "try again" not in outcome.customer_message


def test_a_refund_settled_by_its_lookup_is_replayed() -> None:
    """With a lookup the timed-out refund is found at the provider; the re-request gets the
    same answer, and the agent finishes."""
    refund, provider = refund_tool()
    steps = [*calls("issue_refund", fresh_uuids, 2), [assistant_message("Refunded.")]]
    agent = Agent(name="cashier", model=model(steps), tools=[refund])
    guard = Guard(retry=RetryPolicy(base=0.01, cap=0.02), loops=LoopPolicy(max_no_progress=None))

    def lookup(key: str) -> Any:
        return next(iter(provider.values()), None)

    outcome = ta_agents.run_sync(agent, "refund order A-1", guard=guard,
                                 side_effects={"issue_refund": lookup})  # fmt: skip
    assert len(provider) == 1
    assert outcome.status == "success" and outcome.result == "Refunded."
    replies = [m["output"] for m in outcome.messages if m.get("type") == "function_call_output"]
    assert len(replies) == 2 and all("re_1" in r for r in replies)


# --- budgets, polling, success --------------------------------------------------------------


class PricedModel(ScriptedModel):
    """The scripted model under a name the guard has a price for."""

    model = "scripted-model"


def test_a_cost_budget_stops_before_the_call_that_would_pass_it() -> None:
    """$0.01 a call, a $0.025 budget: two calls, never a third."""
    seen: list[int] = []

    @function_tool
    def page(n: int) -> str:
        """Read a page."""
        seen.append(n)
        return f"page {n}"

    guard = Guard(budget=Budget(max_cost_usd=0.025), loops=LoopPolicy(max_repeats=None),
                  prices=PriceTable({"scripted-model": Price(input=10.0, output=0.0)}))  # fmt: skip
    scripted = PricedModel(calls("page", lambda i: {"n": i}, 5), default_usage=USAGE)
    outcome = ta_agents.run_sync(
        Agent(name="reader", model=scripted, tools=[page]), "read", guard=guard
    )
    assert outcome.stopped_because is StopReason.MAX_COST
    assert outcome.usage.model_calls == 2 and outcome.usage.cost_usd == pytest.approx(0.02)
    assert scripted.remaining_steps == 3


def test_a_cost_budget_refuses_a_model_it_cannot_price() -> None:
    scripted = model([[assistant_message("hi")]])
    with pytest.raises(tether.UnknownModelError):
        ta_agents.run_sync(Agent(name="a", model=scripted), "hi",
                           guard=Guard(budget=Budget(max_cost_usd=1.0)))  # fmt: skip
    assert scripted.remaining_steps == 1  # no request was sent


def test_an_unpriced_model_is_counted_as_unpriced_not_free() -> None:
    outcome = ta_agents.run_sync(Agent(name="a", model=model([[assistant_message("hi")]])), "hi",
                                 guard=Guard())  # fmt: skip
    assert outcome.result == "hi" and outcome.usage.unpriced_calls == 1


def test_a_polling_tool_is_not_stopped() -> None:
    polled: list[str] = []

    @function_tool
    def job_status(job: str) -> str:
        """Poll a job."""
        polled.append(job)
        return "done" if len(polled) == 6 else "running"

    steps = [*calls("job_status", {"job": "j-1"}, 6), [assistant_message("The job is done.")]]
    outcome = ta_agents.run_sync(Agent(name="ops", model=model(steps), tools=[job_status]), "wait",
                                 guard=Guard())  # fmt: skip
    assert len(polled) == 6
    assert outcome.status == "success" and outcome.result == "The job is done."


def test_a_normal_run_succeeds_with_the_frameworks_output() -> None:
    search, _ = search_tool()
    steps = [*calls("search", {"q": "invoice 99"}, 1), [assistant_message("Invoice 99 is paid.")]]
    agent = Agent(name="clerk", model=model(steps), tools=[search])
    expected = alone(Agent(name="clerk", model=model(steps), tools=[search]), "find invoice 99")
    outcome = ta_agents.run_sync(agent, "find invoice 99", guard=Guard())
    assert outcome.status == "success" and outcome.result == expected.final_output
    assert outcome.messages == expected.to_input_list()  # a list, as the SDK gives it (#28)
    assert outcome.usage.model_calls == 2 and outcome.usage.tool_calls == 1


def test_max_turns_is_a_stop_reason() -> None:
    search, _ = search_tool()
    steps = calls("search", lambda i: {"q": f"invoice {i}"}, 5)
    outcome = ta_agents.run_sync(Agent(name="clerk", model=model(steps), tools=[search]), "find",
                                 guard=Guard(), max_turns=3)  # fmt: skip
    assert outcome.stopped_because is StopReason.MAX_STEPS and outcome.status == "partial"
    assert "max_turns (3)" in outcome.detail


def test_the_guards_step_budget_sets_max_turns() -> None:
    search, _ = search_tool()
    steps = calls("search", lambda i: {"q": f"invoice {i}"}, 30)
    outcome = ta_agents.run_sync(Agent(name="clerk", model=model(steps), tools=[search]), "find",
                                 guard=Guard(budget=Budget(max_steps=15),
                                             loops=LoopPolicy(max_no_progress=None)))  # fmt: skip
    assert outcome.stopped_because is StopReason.MAX_STEPS
    assert outcome.usage.model_calls == 15  # past the SDK's default of 10


def test_async_tools_and_the_async_entry_point() -> None:
    searched: list[str] = []

    @function_tool
    async def search(q: str) -> str:
        """Search invoices."""
        searched.append(q)
        return "no result"

    agent = Agent(
        name="clerk", model=model(calls("search", {"q": "invoice 99"}, 12)), tools=[search]
    )
    outcome = asyncio.run(ta_agents.run(agent, "find invoice 99", guard=Guard()))
    assert searched == ["invoice 99", "invoice 99"]
    assert outcome.stopped_because is StopReason.REPEATED_ACTION


def test_run_sync_inside_an_event_loop_says_so() -> None:
    async def main() -> None:
        ta_agents.run_sync(Agent(name="a", model=model([])), "hi", guard=Guard())

    with pytest.raises(RuntimeError, match="await run"):
        asyncio.run(main())


def test_a_hanging_tool_is_abandoned_at_its_timeout() -> None:
    started: list[int] = []

    @function_tool(timeout=0.2)
    async def slow(q: str) -> str:
        """Hangs."""
        started.append(1)
        await asyncio.sleep(30)
        return "late"

    steps = [*calls("slow", {"q": "x"}, 1), [assistant_message("Gave up on it.")]]
    outcome = ta_agents.run_sync(Agent(name="a", model=model(steps), tools=[slow]), "go",
                                 guard=Guard(retry=RetryPolicy(max_attempts=2, base=0.01)))  # fmt: skip
    assert outcome.result == "Gave up on it." and len(started) == 2  # retried once, then told
    assert outcome.usage.seconds < 5


def test_guard_tools_and_hooks_for_callers_of_runner() -> None:
    """The direct path: guard_tools + TetherHooks around the caller's own Runner.run."""
    search, searched = search_tool()
    agent = Agent(
        name="clerk", model=model(calls("search", {"q": "invoice 99"}, 12)), tools=[search]
    )
    guard = Guard()

    async def main() -> tether.Outcome:
        with guard.start(task="find invoice 99") as run:
            tools = ta_agents.guard_tools(agent.tools, run)
            try:
                await Runner.run(agent.clone(tools=tools), "find invoice 99",
                                 hooks=ta_agents.TetherHooks(run))  # fmt: skip
            except ta_agents.GuardStopped as exc:
                assert exc.run_data is not None and len(exc.run_data.new_items) == 6
        return run.outcome

    outcome = asyncio.run(main())
    assert searched == ["invoice 99", "invoice 99"]
    assert outcome.stopped_because is StopReason.REPEATED_ACTION


def test_handoff_agents_are_guarded_too() -> None:
    search, searched = search_tool()
    specialist = Agent(name="billing", model=model(calls("search", {"q": "invoice 99"}, 12)),
                       tools=[search])  # fmt: skip
    triage = Agent(name="triage", model=model([[function_call("transfer_to_billing", {},
                                                              call_id="h1")]]), handoffs=[specialist])  # fmt: skip
    outcome = ta_agents.run_sync(triage, "find invoice 99", guard=Guard())
    assert searched == ["invoice 99", "invoice 99"]
    assert outcome.stopped_because is StopReason.REPEATED_ACTION


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match=r"tether\.Guard"):
        ta_agents.run_sync(Agent(name="a"), "hi", guard=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"agents\.Agent"):
        ta_agents.run_sync("agent", "hi", guard=Guard())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tether Run"):
        ta_agents.TetherHooks(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="owns the run hooks"):
        ta_agents.run_sync(Agent(name="a"), "hi", guard=Guard(), hooks=object())


# --- model calls: retried at one layer, by tether's rules --------------------------------------


def test_a_transient_model_failure_is_retried_once_by_tethers_policy() -> None:
    steps = [ModelStep.raise_error(ConnectionResetError("reset")), [assistant_message("ok")]]
    scripted = model(steps)
    outcome = ta_agents.run_sync(Agent(name="a", model=scripted), "hi",
                                 guard=Guard(retry=RetryPolicy(base=0.01, cap=0.02)))  # fmt: skip
    assert outcome.result == "ok" and outcome.usage.retries == 1
    assert len(scripted.calls) == 2


def test_a_permanent_model_failure_ends_the_run_with_a_reason() -> None:
    steps = [ModelStep.raise_error(PermissionError("no access")), [assistant_message("never")]]
    scripted = model(steps)
    outcome = ta_agents.run_sync(Agent(name="a", model=scripted), "hi", guard=Guard())
    assert outcome.stopped_because is StopReason.PERMANENT_ERROR
    assert outcome.error is not None and "PermissionError" in outcome.error
    assert scripted.remaining_steps == 1  # not retried


def gpt(message: dict[str, Any], usage: tuple[int, int] = (1000, 200)) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "gpt-6.1-terra",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}}  # fmt: skip


@pytest.mark.parametrize("shell", ["run_sync", "run"])
def test_a_programming_error_in_the_model_is_raised_after_the_run_is_filed(
    shell: str, tmp_path: Any
) -> None:
    """#40 case 7: a model call that fails with a programming error (an AttributeError) is
    tried once and raised as it is, the run filed first (permanent_error); never the
    customer's "try again later"."""
    steps = [ModelStep.raise_error(AttributeError("'NoneType' object has no attribute 'id'"))]
    scripted = model([*steps, [assistant_message("never")]])
    records = tether.Records.sqlite(str(tmp_path / "records.db"))
    guard = Guard(records=records, retry=RetryPolicy(base=0.01, cap=0.02))
    agent = Agent(name="a", model=scripted)
    with pytest.raises(AttributeError, match="no attribute 'id'"):
        if shell == "run":
            asyncio.run(ta_agents.run(agent, "hi", guard=guard))
        else:
            ta_agents.run_sync(agent, "hi", guard=guard)
    assert scripted.remaining_steps == 1  # not retried
    assert [r["reason"] for r in records.runs.list()] == ["permanent_error"]


def test_the_real_openai_client_429_then_answers(server: ScriptedServer) -> None:
    """A 429 with Retry-After is retried once by tether's policy (the client's own retries
    off), and the answer is priced as gpt-6.1-terra."""
    server.script = [
        Reply(429, {"error": {"message": "slow down", "type": "rate_limit"}},
              headers={"retry-after": "0.05"}),
        Reply(200, gpt({"content": "Invoice 99 is paid."})),
    ]  # fmt: skip

    async def main() -> tether.Outcome:
        client = openai.AsyncOpenAI(api_key="test", base_url=server.url + "/v1", max_retries=0)
        try:
            agent = Agent(name="clerk", model=OpenAIChatCompletionsModel("gpt-6.1-terra", client))
            return await ta_agents.run(agent, "find invoice 99",
                                       guard=Guard(budget=Budget(max_cost_usd=1.0)))  # fmt: skip
        finally:
            await client.close()

    outcome = asyncio.run(main())
    assert outcome.result == "Invoice 99 is paid." and outcome.usage.retries == 1
    assert len(server.requests) == 2
    assert outcome.usage.cost_usd == pytest.approx((1000 * 1.0 + 200 * 5.0) / 1e6)


def test_a_streamed_run_is_guarded_the_same_way() -> None:
    """Runner.run_streamed with guard_tools + TetherHooks: the stop arrives while the
    caller reads the events, with the SDK's items attached."""
    search, searched = search_tool()
    agent = Agent(
        name="clerk", model=model(calls("search", {"q": "invoice 99"}, 12)), tools=[search]
    )
    guard = Guard()

    async def main() -> tether.Outcome:
        with guard.start(task="find invoice 99") as run:
            streamed = Runner.run_streamed(agent.clone(tools=ta_agents.guard_tools(agent.tools, run)),
                                           "find invoice 99", hooks=ta_agents.TetherHooks(run))  # fmt: skip
            with pytest.raises(ta_agents.GuardStopped) as stop:
                async for _ in streamed.stream_events():
                    pass
            assert stop.value.run_data is not None and len(stop.value.run_data.new_items) == 6
        return run.outcome

    outcome = asyncio.run(main())
    assert searched == ["invoice 99", "invoice 99"] and outcome.usage.model_calls == 3
    assert outcome.stopped_because is StopReason.REPEATED_ACTION


def test_the_model_name_comes_from_a_string_a_model_object_or_the_sdk_default() -> None:
    from agents.models import get_default_model

    from tether.integrations.openai_agents import _model_name

    assert _model_name(Agent(name="a", model="gpt-6.1-terra")) == "gpt-6.1-terra"
    assert _model_name(Agent(name="a", model=model([]))) == "ScriptedModel"  # unpriced, never free
    assert _model_name(Agent(name="a")) == get_default_model()
