"""PydanticAI under tether: FunctionModel/TestModel, and the real OpenAI client against a
scripted server on loopback."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Callable
from typing import Any

import openai
import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, UsageLimits
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import RequestUsage

import tether
from scripted_server import Reply, ScriptedServer
from tether import Budget, Guard, LoopPolicy, Price, PriceTable, RetryPolicy, StopReason
from tether.integrations import pydantic_ai as ta_pydantic

USAGE = RequestUsage(input_tokens=1000, output_tokens=100)


def calls(name: str, args: Any, then: str | None = None, after: int = 0) -> FunctionModel:
    """A model that asks for ``name`` (``args`` may be a function of i), answering ``then``
    after ``after`` calls when given."""
    counter = itertools.count()

    def respond(messages: list[Any], info: AgentInfo) -> ModelResponse:
        i = next(counter)
        if then is not None and i >= after:
            return ModelResponse(parts=[TextPart(then)], usage=USAGE)
        part = ToolCallPart(name, args(i) if callable(args) else args, tool_call_id=f"call_{i}")
        return ModelResponse(parts=[part], usage=USAGE)

    return FunctionModel(respond, model_name="scripted-model")


def with_tool(model: Any, fn: Callable[..., Any], **agent: Any) -> Agent[None, Any]:
    built: Agent[None, Any] = Agent(model, **agent)
    built.tool_plain(fn)
    return built


def search_agent() -> tuple[Agent[None, Any], list[str]]:
    searched: list[str] = []

    def search(q: str) -> str:
        """Search invoices."""
        searched.append(q)
        return "no result"

    return with_tool(calls("search", {"q": "invoice 99"}), search), searched


def refund_agent() -> tuple[Agent[None, Any], dict[str, Any]]:
    """A refund that commits at the provider and then times out; the model asks again with
    a fresh uuid, then answers."""
    provider: dict[str, Any] = {}

    def issue_refund(order: str, uuid: str) -> str:
        """Refund an order."""
        provider[order + uuid] = {"id": f"re_{len(provider) + 1}", "order": order}
        raise TimeoutError("read timed out")

    model = calls("issue_refund", lambda i: {"order": "A-1", "uuid": uuid.uuid4().hex},
                  then="Refunded.", after=2)  # fmt: skip
    return with_tool(model, issue_refund), provider


def alone(agent: Agent[None, Any], prompt: str) -> Any:
    """PydanticAI on its own (``asyncio.run``: ``run_sync`` leaves its event loop open)."""
    return asyncio.run(agent.run(prompt))


FAST = {"retry": RetryPolicy(base=0.01, cap=0.02), "loops": LoopPolicy(max_no_progress=None)}


# --- the two cases, alone and with tether ---------------------------------------------------


def test_alone_the_stuck_search_runs_until_the_request_limit() -> None:
    agent, searched = search_agent()
    with pytest.raises(Exception, match="request_limit of 50"):
        alone(agent, "find invoice 99")
    assert len(searched) == 50


def test_a_stuck_agent_runs_its_search_twice() -> None:
    agent, searched = search_agent()
    outcome = ta_pydantic.run_sync(
        agent, "find invoice 99", guard=Guard(budget=Budget(max_steps=30))
    )
    assert searched == ["invoice 99", "invoice 99"]
    assert outcome.stopped_because is StopReason.REPEATED_ACTION
    assert outcome.usage.model_calls == 3  # the 4th request is never sent
    kinds = [type(m).__name__ for m in outcome.messages]
    assert kinds == ["ModelRequest", "ModelResponse"] * 3 + ["ModelRequest"]


def test_alone_a_timed_out_refund_crashes_the_run_and_a_rerun_pays_again() -> None:
    agent, provider = refund_agent()
    for _ in range(2):  # the caller's natural reaction to a crash: run it again
        with pytest.raises(TimeoutError):
            alone(agent, "refund order A-1")
    assert len(provider) == 2


def test_a_refund_re_requested_with_a_fresh_uuid_runs_once() -> None:
    agent, provider = refund_agent()
    outcome = ta_pydantic.run_sync(agent, "refund order A-1", guard=Guard(**FAST),
                                   side_effects={"issue_refund": None})  # fmt: skip
    assert len(provider) == 1
    assert outcome.stopped_because is StopReason.UNKNOWN_OUTCOME
    assert "try again" not in outcome.customer_message


def test_a_refund_settled_by_its_lookup_is_replayed() -> None:
    agent, provider = refund_agent()

    def lookup(key: str) -> Any:
        return next(iter(provider.values()), None)

    outcome = ta_pydantic.run_sync(agent, "refund order A-1", guard=Guard(**FAST),
                                   side_effects={"issue_refund": lookup})  # fmt: skip
    assert len(provider) == 1
    assert outcome.status == "success" and outcome.result == "Refunded."
    returns = [p.content for m in outcome.messages for p in m.parts
               if type(p).__name__ == "ToolReturnPart"]  # fmt: skip
    assert len(returns) == 2 and all(r["id"] == "re_1" for r in returns)


def test_the_same_guard_twice_never_pays_twice() -> None:
    """A caller that runs the same request again after the unknown outcome (key=): the
    ledger remembers."""
    agent, provider = refund_agent()
    guard = Guard(**FAST)
    for _ in range(2):
        ta_pydantic.run_sync(agent, "refund order A-1", guard=guard, key="ticket-1",
                             side_effects={"issue_refund": None})  # fmt: skip
    assert len(provider) == 1


# --- budgets, limits, polling, success -------------------------------------------------------


def test_a_cost_budget_stops_before_the_request_that_would_pass_it() -> None:
    seen: list[int] = []

    def page(n: int) -> str:
        """Read a page."""
        seen.append(n)
        return f"page {n}"

    guard = Guard(budget=Budget(max_cost_usd=0.025), loops=LoopPolicy(max_repeats=None),
                  prices=PriceTable({"scripted-model": Price(input=10.0, output=0.0)}))  # fmt: skip
    outcome = ta_pydantic.run_sync(with_tool(calls("page", lambda i: {"n": i}), page), "read",
                                   guard=guard)  # fmt: skip
    assert outcome.stopped_because is StopReason.MAX_COST
    assert outcome.usage.model_calls == 2 and outcome.usage.cost_usd == pytest.approx(0.02)


def test_a_cost_budget_refuses_a_model_it_cannot_price() -> None:
    sent: list[int] = []

    def respond(messages: list[Any], info: AgentInfo) -> ModelResponse:
        sent.append(1)
        return ModelResponse(parts=[TextPart("hi")], usage=USAGE)

    agent = Agent(FunctionModel(respond, model_name="mystery-model"))
    with pytest.raises(tether.UnknownModelError):
        ta_pydantic.run_sync(agent, "hi", guard=Guard(budget=Budget(max_cost_usd=1.0)))
    assert sent == []


def test_an_unpriced_response_is_unpriced_not_free() -> None:
    outcome = ta_pydantic.run_sync(Agent(calls("x", {}, then="hi")), "hi", guard=Guard())
    assert outcome.result == "hi" and outcome.usage.unpriced_calls == 1


def test_usage_limits_become_stop_reasons() -> None:
    agent, _ = search_agent()
    outcome = ta_pydantic.run_sync(agent, "find", guard=Guard(loops=LoopPolicy(max_repeats=None,
                                   max_no_progress=None)), usage_limits=UsageLimits(request_limit=3))  # fmt: skip
    assert outcome.stopped_because is StopReason.MAX_MODEL_CALLS
    assert "request_limit of 3" in outcome.detail


def test_a_polling_tool_is_not_stopped() -> None:
    polled: list[str] = []

    def job_status(job: str) -> str:
        """Poll a job."""
        polled.append(job)
        return "done" if len(polled) == 6 else "running"

    model = calls("job_status", {"job": "j-1"}, then="The job is done.", after=6)
    outcome = ta_pydantic.run_sync(with_tool(model, job_status), "wait", guard=Guard())
    assert len(polled) == 6
    assert outcome.status == "success" and outcome.result == "The job is done."


def test_a_normal_run_succeeds_with_the_frameworks_output() -> None:
    agent = Agent(TestModel(custom_output_text="Invoice 99 is paid."))

    @agent.tool_plain
    def search(q: str) -> str:
        """Search invoices."""
        return "paid"

    expected = alone(agent, "find invoice 99")
    outcome = ta_pydantic.run_sync(agent, "find invoice 99", guard=Guard())
    assert outcome.status == "success" and outcome.result == expected.output
    assert [type(m).__name__ for m in outcome.messages] == [
        type(m).__name__ for m in expected.all_messages()
    ]
    assert outcome.usage.model_calls == 2 and outcome.usage.tool_calls == 1


class Invoice(BaseModel):
    number: int
    paid: bool


def test_a_typed_caller_never_gets_a_value_of_another_type() -> None:
    """Direct use: a stop raises RunStopped with the outcome; no str posing as an Invoice."""
    agent, searched = search_agent()
    typed: Agent[None, Invoice] = Agent(agent.model, output_type=Invoice, tools=[],
                                        capabilities=[ta_pydantic.TetherCapability(Guard())])  # fmt: skip

    @typed.tool_plain
    def search(q: str) -> str:
        """Search invoices."""
        searched.append(q)
        return "no result"

    with pytest.raises(ta_pydantic.RunStopped) as caught:
        alone(typed, "find invoice 99")
    assert caught.value.outcome.stopped_because is StopReason.REPEATED_ACTION
    assert caught.value.outcome.result is None and len(searched) == 2


def test_the_capability_keeps_each_runs_outcome() -> None:
    capability = ta_pydantic.TetherCapability(Guard())
    agent = Agent(TestModel(custom_output_text="ok"), capabilities=[capability])

    async def main() -> list[Any]:
        return list(await asyncio.gather(*(agent.run(f"task {i}") for i in range(3))))

    results = asyncio.run(main())
    outcomes = [capability.outcome(str(r.run_id)) for r in results]
    assert all(o is not None and o.status == "success" and o.result == "ok" for o in outcomes)
    assert len({o.run_id for o in outcomes if o is not None}) == 3


def test_control_flow_from_a_tool_reaches_pydantic_ai() -> None:
    """ModelRetry raised by a tool still asks the model to try again."""
    from pydantic_ai import ModelRetry

    tries: list[str] = []

    def lookup_order(order: str) -> str:
        """Look an order up."""
        tries.append(order)
        if order != "A-1":
            raise ModelRetry("order ids look like A-1")
        return "found"

    def model() -> FunctionModel:
        return calls("lookup_order", lambda i: {"order": "a1" if i == 0 else "A-1"}, then="Found it.",
                     after=2)  # fmt: skip

    outcome = ta_pydantic.run_sync(with_tool(model(), lookup_order), "find", guard=Guard())
    assert tries == ["a1", "A-1"] and outcome.result == "Found it."
    expected = alone(with_tool(model(), lookup_order), "find")

    def parts(messages: Any) -> list[tuple[str, Any]]:
        return [(type(p).__name__, getattr(p, "content", None)) for m in messages for p in m.parts]

    # PydanticAI's own handling of the retry, word for word (not tether's generic text)
    assert parts(outcome.messages) == parts(expected.all_messages())
    assert ("ToolReturnPart", "order ids look like A-1") in parts(outcome.messages)


def test_async_tools_and_the_async_entry_point() -> None:
    searched: list[str] = []
    agent = Agent(calls("search", {"q": "invoice 99"}))

    @agent.tool_plain
    async def search(q: str) -> str:
        """Search invoices."""
        searched.append(q)
        return "no result"

    outcome = asyncio.run(ta_pydantic.run(agent, "find invoice 99", guard=Guard()))
    assert searched == ["invoice 99", "invoice 99"]
    assert outcome.stopped_because is StopReason.REPEATED_ACTION


def test_a_hanging_tool_is_abandoned_at_its_timeout() -> None:
    started: list[int] = []

    async def slow(q: str) -> str:
        """Hangs."""
        started.append(1)
        await asyncio.sleep(30)
        return "late"

    model = calls("slow", {"q": "x"}, then="Gave up on it.", after=1)
    outcome = ta_pydantic.run_sync(with_tool(model, slow), "go", timeouts={"slow": 0.2},
                                   guard=Guard(retry=RetryPolicy(max_attempts=2, base=0.01)))  # fmt: skip
    assert outcome.result == "Gave up on it." and len(started) == 2
    assert outcome.usage.seconds < 5


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match=r"tether\.Guard"):
        ta_pydantic.TetherCapability(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"pydantic_ai\.Agent"):
        ta_pydantic.run_sync("agent", "hi", guard=Guard())  # type: ignore[arg-type]

    async def main() -> None:
        ta_pydantic.run_sync(Agent(TestModel()), "hi", guard=Guard())

    with pytest.raises(RuntimeError, match="await run"):
        asyncio.run(main())


# --- model requests: retried at one layer, by tether's rules ------------------------------------


def flaky(error: Exception, answer: str = "ok") -> tuple[FunctionModel, list[int]]:
    sent: list[int] = []

    def respond(messages: list[Any], info: AgentInfo) -> ModelResponse:
        sent.append(1)
        if len(sent) == 1:
            raise error
        return ModelResponse(parts=[TextPart(answer)], usage=USAGE)

    return FunctionModel(respond, model_name="scripted-model"), sent


def test_a_transient_model_failure_is_retried_once_by_tethers_policy() -> None:
    model, sent = flaky(ModelHTTPError(503, "scripted-model", {"error": "overloaded"}))
    outcome = ta_pydantic.run_sync(Agent(model), "hi", guard=Guard(**FAST))
    assert outcome.result == "ok" and outcome.usage.retries == 1 and len(sent) == 2


def test_a_permanent_model_failure_ends_the_run_with_a_reason() -> None:
    model, sent = flaky(ModelHTTPError(401, "scripted-model", {"error": "bad key"}))
    outcome = ta_pydantic.run_sync(Agent(model), "hi", guard=Guard(**FAST))
    assert outcome.stopped_because is StopReason.PERMANENT_ERROR and len(sent) == 1
    assert outcome.error is not None and "401" in outcome.error


@pytest.mark.parametrize("shell", ["run_sync", "run"])
def test_a_programming_error_in_the_model_is_raised_after_the_run_is_filed(
    shell: str, tmp_path: Any
) -> None:
    """#40 case 7: a model request that fails with a programming error (a NameError) is
    tried once and raised as it is, the run filed first (permanent_error); never the
    customer's "try again later"."""
    model, sent = flaky(NameError("name 'prompt' is not defined"))
    records = tether.Records.sqlite(str(tmp_path / "records.db"))
    guard = Guard(records=records, **FAST)
    with pytest.raises(NameError, match="prompt"):
        if shell == "run":
            asyncio.run(ta_pydantic.run(Agent(model), "hi", guard=guard))
        else:
            ta_pydantic.run_sync(Agent(model), "hi", guard=guard)
    assert len(sent) == 1
    assert [r["reason"] for r in records.runs.list()] == ["permanent_error"]


def test_the_real_openai_client_429_then_answers(server: ScriptedServer) -> None:
    server.script = [
        Reply(429, {"error": {"message": "slow down", "type": "rate_limit"}},
              headers={"retry-after": "0.05"}),
        Reply(200, {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "gpt-6.1-terra",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Invoice 99 is paid."},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200}}),
    ]  # fmt: skip

    async def main() -> tether.Outcome:
        client = openai.AsyncOpenAI(api_key="test", base_url=server.url + "/v1", max_retries=0)
        try:
            model = OpenAIChatModel("gpt-6.1-terra", provider=OpenAIProvider(openai_client=client))
            return await ta_pydantic.run(Agent(model), "find invoice 99",
                                         guard=Guard(budget=Budget(max_cost_usd=1.0)))  # fmt: skip
        finally:
            await client.close()

    outcome = asyncio.run(main())
    assert outcome.result == "Invoice 99 is paid." and outcome.usage.retries == 1
    assert len(server.requests) == 2
    assert outcome.usage.cost_usd == pytest.approx((1000 * 1.0 + 200 * 5.0) / 1e6)


def test_a_streamed_run_is_stopped_the_same_way() -> None:
    """agent.run_stream under the capability: RunStopped with the outcome."""
    from pydantic_ai.models.function import DeltaToolCall

    searched: list[str] = []

    def respond(messages: list[Any], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[ToolCallPart("search", {"q": "invoice 99"})], usage=USAGE)

    async def stream(messages: list[Any], info: AgentInfo) -> Any:
        yield {0: DeltaToolCall(name="search", json_args='{"q": "invoice 99"}')}

    agent = Agent(FunctionModel(respond, stream_function=stream, model_name="scripted-model"),
                  capabilities=[ta_pydantic.TetherCapability(Guard())])  # fmt: skip

    @agent.tool_plain
    def search(q: str) -> str:
        """Search invoices."""
        searched.append(q)
        return "no result"

    async def main() -> tether.Outcome:
        with pytest.raises(ta_pydantic.RunStopped) as stop:
            async with agent.run_stream("find invoice 99") as result:
                async for _ in result.stream_output():
                    pass
        return stop.value.outcome

    outcome = asyncio.run(main())
    assert searched == ["invoice 99", "invoice 99"]
    assert outcome.stopped_because is StopReason.REPEATED_ACTION


def test_a_response_without_token_counts_is_unpriced_never_free() -> None:
    """A provider that reports no usage (PydanticAI marks it unmeasured): the call's cost is
    unknown, also for a model with a price, and a cost budget cannot pass over it."""
    from tether import UnknownModelError

    def respond(messages: list[Any], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart("hi")], usage=RequestUsage(unmeasured_requests=1))

    priced = PriceTable({"scripted-model": Price(input=10.0, output=10.0)})
    agent = Agent(FunctionModel(respond, model_name="scripted-model"))
    outcome = ta_pydantic.run_sync(agent, "hi", guard=Guard(prices=priced))
    assert outcome.result == "hi" and outcome.usage.unpriced_calls == 1
    with pytest.raises(UnknownModelError, match="no token counts"):
        ta_pydantic.run_sync(
            agent, "hi", guard=Guard(prices=priced, budget=Budget(max_cost_usd=1.0))
        )


def test_the_customer_reads_the_label_a_tool_is_given_never_its_name() -> None:
    """``labels=`` names a tool's effect for the customer; the tool's own name stays inside."""
    agent, provider = refund_agent()

    def lookup(key: str) -> Any:
        return next(iter(provider.values()), None)

    outcome = ta_pydantic.run_sync(
        agent,
        "refund order A-1",
        guard=Guard(**FAST),
        side_effects={"issue_refund": lookup},
        labels={"issue_refund": "refund"},
    )
    assert outcome.status == "success"
    assert "Done: refund completed (reference re_1)." in outcome.customer_message
    assert "issue_refund" not in outcome.customer_message
