"""CrewAI crews under tether, on the real ``Crew``/``Agent``/``Task`` with CrewAI's own
OpenAI-compatible ``LLM`` against a scripted loopback server (the model's replies)."""

from __future__ import annotations

import asyncio
import json
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

with warnings.catch_warnings():  # crewai's lazy imports warn on import (ImportWarning)
    warnings.simplefilter("ignore", ImportWarning)
    from crewai import LLM, Agent, Crew, Task
    from crewai.tools import tool
from scripted_server import Reply, ScriptedServer
from tether import Budget, Guard, Price, PriceTable, RetryPolicy, StopReason
from tether.integrations.crewai import TetherCrew, akickoff, kickoff

#: CrewAI's own Agent reads the fields it deprecates (function_calling_llm and others, through
#: pydantic) on every Agent built: not this code's warnings
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

MODEL = "gpt-6.1-terra"
PRICES = PriceTable({MODEL: Price(input=2.0, output=8.0, cache_read=0.2)})


def completion(text: str | None = None, calls: list[tuple[str, dict[str, Any]]] = ()) -> Reply:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": n, "arguments": json.dumps(a)},
            }
            for i, (n, a) in enumerate(calls)
        ]
    return Reply(
        body={
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": MODEL,
            "choices": [
                {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
            ],
            "usage": {
                "prompt_tokens": 1000,
                "completion_tokens": 100,
                "total_tokens": 1100,
                "prompt_tokens_details": {"cached_tokens": 400},
            },
        }
    )


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as s:
        yield s


def script(server: ScriptedServer, replies: Callable[[int], Reply] | list[Reply]) -> None:
    count = {"i": 0}

    def handler(seen: Any) -> Reply:
        i = count["i"]
        count["i"] += 1
        if callable(replies):
            return replies(i)
        return replies[i] if i < len(replies) else completion("done")

    server.handler = handler


def model_calls(server: ScriptedServer) -> int:
    return sum(1 for r in server.requests if r.path.endswith("/chat/completions"))


def crew_with(server: ScriptedServer, *tools: Any, **agent: Any) -> Crew:
    llm = LLM(model=f"openai/{MODEL}", base_url=server.url + "/v1", api_key="k", max_retries=0)
    clerk = Agent(
        role="clerk", goal="settle the invoice", backstory="a careful clerk", llm=llm,
        tools=list(tools), verbose=False, **agent,
    )  # fmt: skip
    task = Task(description="settle invoice 99", expected_output="a receipt", agent=clerk)
    return Crew(agents=[clerk], tasks=[task], verbose=False)


def guard(**budget: Any) -> Guard:
    return Guard(
        budget=Budget(max_steps=30, **budget), prices=PRICES, retry=RetryPolicy(base=0.001)
    )


def payments() -> tuple[list[dict[str, Any]], Any]:
    paid: list[dict[str, Any]] = []

    @tool("pay")
    def pay(invoice: str, amount: int) -> str:
        """Pay an invoice."""
        paid.append({"invoice": invoice, "amount": amount})
        return f"paid {amount} on {invoice}"

    return paid, pay


SHELLS: dict[str, Callable[..., Any]] = {
    "sync": kickoff,
    "async": lambda *a, **k: asyncio.run(akickoff(*a, **k)),
}
PAY = ("pay", {"invoice": "99", "amount": 10})


def through(crewed: TetherCrew, crew: Crew, shell: str, **kw: Any) -> Any:
    """``crewed.kickoff(crew)`` or ``crewed.akickoff(crew)``."""
    if shell == "sync":
        return crewed.kickoff(crew, **kw)
    return asyncio.run(crewed.akickoff(crew, **kw))


@pytest.mark.parametrize("shell", SHELLS)
def test_a_repeated_payment_runs_once_and_the_crew_ends_honestly(
    server: ScriptedServer, shell: str
) -> None:
    """The model pays the same invoice again and again: alone 3 payments, under tether 1."""
    paid, pay = payments()
    script(server, [completion(calls=[PAY])] * 3)
    crew = crew_with(server, pay)
    alone = crew.kickoff()
    assert len(paid) == 3
    assert alone.raw == "done"

    paid.clear()
    server.requests.clear()
    script(server, lambda i: completion(calls=[PAY]))
    outcome = SHELLS[shell](crew_with(server, pay), guard=guard(), side_effects=["pay"])
    assert len(paid) == 1
    assert StopReason.REPEATED_ACTION is outcome.stopped_because
    assert model_calls(server) == 3  # the 4th model call is answered with the customer message
    assert outcome.usage.model_calls == 3


def test_the_stopped_crew_s_task_output_is_the_customer_message(server: ScriptedServer) -> None:
    """A stop ends the agent in CrewAI's terms: its task's output is the customer message."""
    _, pay = payments()
    script(server, lambda i: completion(calls=[PAY]))
    crewed = TetherCrew(guard(), side_effects=["pay"])
    outcome = crewed.kickoff(crew_with(server, pay))
    assert outcome.customer_message == crewed.last_output.raw
    assert outcome.customer_message == crewed.last_output.tasks_output[-1].raw


@pytest.mark.parametrize("shell", SHELLS)
def test_a_payment_re_issued_after_a_timeout_executes_once(
    server: ScriptedServer, shell: str
) -> None:
    """The payment commits and its reply is lost; the agent pays again (CrewAI retries the
    tool and the model re-issues it): alone 2+ payments, under tether 1."""
    paid: list[int] = []

    @tool("pay")
    def pay(invoice: str, amount: int) -> str:
        """Pay an invoice."""
        paid.append(amount)
        if len(paid) == 1:
            raise TimeoutError("read timed out")  # committed at the provider, reply lost
        return f"paid {amount}"

    script(server, [completion(calls=[PAY]), completion(calls=[PAY]), completion("paid")])
    crew_with(server, pay).kickoff()
    alone = len(paid)
    assert alone >= 2

    paid.clear()
    script(server, [completion(calls=[PAY]), completion(calls=[PAY]), completion("paid")])

    def lookup(key: str) -> Any:  # the payment provider's own records
        return {"paid": paid[0]} if paid else None

    outcome = SHELLS[shell](crew_with(server, pay), guard=guard(), side_effects={"pay": lookup})
    assert paid == [10]
    assert StopReason.GOAL_REACHED is outcome.stopped_because


@pytest.mark.parametrize("shell", SHELLS)
def test_a_crew_kicked_off_again_for_the_same_request_pays_once(
    server: ScriptedServer, shell: str
) -> None:
    """The same crew run twice (crewAI #1978): the second kickoff replays the payment."""
    paid, pay = payments()
    script(server, lambda i: completion(calls=[PAY]) if i % 2 == 0 else completion("paid"))
    crew = crew_with(server, pay)
    g = guard()
    first = SHELLS[shell](crew, guard=g, side_effects=["pay"])
    second = SHELLS[shell](crew, guard=g, side_effects=["pay"])
    assert len(paid) == 1
    assert StopReason.GOAL_REACHED is first.stopped_because is second.stopped_because


@pytest.mark.parametrize("shell", SHELLS)
def test_the_cost_budget_counts_crewai_s_usage(server: ScriptedServer, shell: str) -> None:
    """Each call's usage, as CrewAI's LLM reports it, is priced; the budget stops the crew."""
    _, pay = payments()
    script(server, lambda i: completion(calls=[("pay", {"invoice": str(i), "amount": i})]))
    outcome = SHELLS[shell](crew_with(server, pay), guard=guard(max_cost_usd=0.006))
    # 600 uncached + 400 cached input, 100 output: $0.0012 + $0.00008 + $0.0008 a call
    assert pytest.approx(outcome.usage.cost_usd / outcome.usage.model_calls) == 0.00208
    assert outcome.usage.model_calls == model_calls(server) >= 2
    assert outcome.usage.cost_usd <= 0.006
    assert StopReason.MAX_COST is outcome.stopped_because


def test_parallel_tool_calls_in_one_reply_pay_once(server: ScriptedServer) -> None:
    """One reply asking for the same payment three times: one payment."""
    paid, pay = payments()
    script(server, [completion(calls=[PAY, PAY, PAY]), completion("paid")])
    kickoff(crew_with(server, pay), guard=guard(), side_effects=["pay"])
    assert len(paid) == 1


def test_a_payment_needing_approval_waits_for_a_person(server: ScriptedServer) -> None:
    """``requires_approval``: nothing is paid; the crew ends awaiting approval."""
    from tether import Records

    paid, pay = payments()
    script(server, lambda i: completion(calls=[PAY]))
    g = Guard(budget=Budget(max_steps=30), prices=PRICES, records=Records.memory())
    outcome = kickoff(
        crew_with(server, pay), guard=g, side_effects=["pay"], requires_approval={"pay": True}
    )
    assert paid == []
    assert StopReason.AWAITING_APPROVAL is outcome.stopped_because


def test_no_run_no_call() -> None:
    """A guarded tool called outside a kickoff refuses to run unguarded."""
    from tether import RunDocumentError
    from tether.integrations.crewai import _tool_runner

    with pytest.raises(RunDocumentError):
        _tool_runner("pay", lambda **_: None, {})(invoice="1")


def test_the_crew_s_objects_are_given_back_unguarded(server: ScriptedServer) -> None:
    """After the kickoff the agent's LLM and tools are CrewAI's own again."""
    _paid, pay = payments()
    func = pay.func
    script(server, [completion("nothing to do")])
    crew = crew_with(server, pay)
    kickoff(crew, guard=guard(), side_effects=["pay"])
    assert func is pay.func
    assert "call" not in crew.agents[0].llm.__dict__


@pytest.mark.parametrize("shell", SHELLS)
def test_a_base_tool_subclass_pays_once(server: ScriptedServer, shell: str) -> None:
    """A ``BaseTool`` subclass (its own ``_run``), called again and again: alone 3 payments,
    under tether 1; its ``_run`` is its class's again after the kickoff."""
    from crewai.tools import BaseTool

    paid: list[int] = []

    class Pay(BaseTool):  # type: ignore[misc]
        name: str = "pay"
        description: str = "Pay an invoice."

        def _run(self, invoice: str, amount: int) -> str:
            paid.append(amount)
            return f"paid {amount}"

    script(server, [completion(calls=[PAY])] * 3)
    crew_with(server, Pay()).kickoff()
    assert len(paid) == 3

    paid.clear()
    script(server, lambda i: completion(calls=[PAY]))
    tool = Pay()
    outcome = SHELLS[shell](crew_with(server, tool), guard=guard(), side_effects=["pay"])
    assert paid == [10]
    assert outcome.stopped_because is StopReason.REPEATED_ACTION
    assert "_run" not in tool.__dict__


@pytest.mark.parametrize("shell", SHELLS)
def test_a_transient_model_error_is_retried_at_one_layer(
    server: ScriptedServer, shell: str
) -> None:
    """A 503 once, then the answer: tether's policy asks again (the LLM's own retries off),
    the run succeeds with 1 retry and 1 model call counted."""
    replies = [Reply(503, {"error": {"message": "overloaded", "type": "server_error"}})]
    replies.append(completion("paid"))
    script(server, replies)
    _, pay = payments()
    outcome = SHELLS[shell](crew_with(server, pay), guard=guard(), side_effects=["pay"])
    assert outcome.stopped_because is StopReason.GOAL_REACHED
    assert model_calls(server) == 2
    assert (outcome.usage.retries, outcome.usage.model_calls) == (1, 1)


# --- CrewAI's own limits and tether's budgets: the lower one ends the run, as tether ends it


def _forced(seen: Any) -> bool:
    """The request is CrewAI's "best final answer" after max_iter."""
    return "absolute BEST Final answer" in json.dumps(seen.body)


def lookups(server: ScriptedServer) -> None:
    """A model that looks up one invoice after another, never answering; asked for its best
    final answer, it makes one up."""
    count = {"i": 0}

    def handler(seen: Any) -> Reply:
        count["i"] += 1
        if _forced(seen):
            return completion("Invoice 99 is settled.")  # not true: nothing was paid
        return completion(calls=[("lookup", {"invoice": str(count["i"])})])

    server.handler = handler


@tool("lookup")
def lookup(invoice: str) -> str:
    """Look an invoice up."""
    return f"invoice {invoice}: open"


@pytest.mark.parametrize("shell", SHELLS)
def test_max_iter_ends_the_run_as_tether_does(server: ScriptedServer, shell: str) -> None:
    """``max_iter=2``: alone, CrewAI asks for a "best final answer" and the crew ends "done"
    with a made-up one; under tether the run ends MAX_STEPS, that request unsent, the task's
    output the customer message."""
    lookups(server)
    alone = crew_with(server, lookup, max_iter=2).kickoff()
    assert alone.raw == "Invoice 99 is settled."
    assert model_calls(server) == 3 and _forced(server.requests[-1])

    server.requests.clear()
    crewed = TetherCrew(guard())
    outcome = through(crewed, crew_with(server, lookup, max_iter=2), shell)
    assert outcome.stopped_because is StopReason.MAX_STEPS
    assert "max_iter" in outcome.detail
    assert model_calls(server) == outcome.usage.model_calls == 2
    assert not any(_forced(r) for r in server.requests)
    assert crewed.last_output.raw == outcome.customer_message


def test_a_step_budget_below_max_iter_stops_first(server: ScriptedServer) -> None:
    """The guard's ``max_steps`` below the agent's ``max_iter``: tether's budget ends it."""
    lookups(server)
    outcome = kickoff(
        crew_with(server, lookup, max_iter=10),
        guard=Guard(budget=Budget(max_model_calls=3), prices=PRICES),
    )
    assert outcome.stopped_because is StopReason.MAX_MODEL_CALLS
    assert model_calls(server) == 3


def slow_payments(wait: float) -> tuple[list[str], Any, Any]:
    paid: list[str] = []

    @tool("slow_lookup")
    def slow_lookup(invoice: str) -> str:
        """Look an invoice up (slowly)."""
        import time

        time.sleep(wait)
        return f"invoice {invoice}: open"

    @tool("pay")
    def pay(invoice: str, amount: int) -> str:
        """Pay an invoice."""
        paid.append(invoice)
        return f"paid {amount} on {invoice}"

    return paid, slow_lookup, pay


def slow_script(server: ScriptedServer) -> None:
    script(server, [
        completion(calls=[("slow_lookup", {"invoice": "98"})]),
        completion(calls=[("slow_lookup", {"invoice": "99"})]),
        completion(calls=[PAY]),
        completion("paid"),
    ])  # fmt: skip


@pytest.mark.parametrize("shell", SHELLS)
def test_max_execution_time_ends_the_run_before_the_payment(
    server: ScriptedServer, shell: str
) -> None:
    """``max_execution_time=1``, two lookups of 0.6 s, then a payment: alone, CrewAI's thread
    goes on past its time, pays, and ``kickoff`` raises TimeoutError; under tether the run
    ends TIMEOUT at the first step past the deadline: nothing paid, the customer message."""
    paid, slow_lookup, pay = slow_payments(0.6)
    slow_script(server)
    with pytest.raises(TimeoutError):
        crew_with(server, slow_lookup, pay, max_execution_time=1).kickoff()
    assert paid == ["99"]

    paid.clear()
    slow_script(server)
    crewed = TetherCrew(guard(), side_effects=["pay"])
    crew = crew_with(server, slow_lookup, pay, max_execution_time=1)
    outcome = through(crewed, crew, shell)
    assert paid == []
    assert outcome.stopped_because is StopReason.TIMEOUT
    assert "max_execution_time (1 s)" in outcome.detail
    assert crewed.last_output.raw == outcome.customer_message
    assert "_execute_with_timeout" not in crew.agents[0].__dict__


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """CrewAI's RPMController's real sleeps, recorded instead of slept."""
    from crewai.utilities import rpm_controller

    seen: list[float] = []
    monkeypatch.setattr(rpm_controller.time, "sleep", seen.append)
    return seen


@pytest.mark.parametrize("shell", SHELLS)
def test_max_rpm_waits_on_the_run_s_clock(
    server: ScriptedServer, shell: str, slept: list[float]
) -> None:
    """``max_rpm=2``, three model calls: alone CrewAI sleeps a real minute; under tether the
    minute passes on the run's clock (a virtual one here), counted in its time."""
    from tether import VirtualClock

    _, pay = payments()
    script(server, [completion(calls=[("lookup", {"invoice": "1"})]),
                    completion(calls=[("lookup", {"invoice": "2"})]), completion("paid")])  # fmt: skip
    crew_with(server, lookup, pay, max_rpm=2).kickoff()
    assert slept == [60]

    slept.clear()
    script(server, [completion(calls=[("lookup", {"invoice": "1"})]),
                    completion(calls=[("lookup", {"invoice": "2"})]), completion("paid")])  # fmt: skip
    clock = VirtualClock()
    g = Guard(budget=Budget(max_steps=30), prices=PRICES, clock=clock)
    outcome = SHELLS[shell](crew_with(server, lookup, pay, max_rpm=2), guard=g)
    assert slept == []
    assert outcome.stopped_because is StopReason.GOAL_REACHED
    assert outcome.usage.model_calls == 3
    assert clock.now() >= 60


@pytest.mark.parametrize("shell", SHELLS)
def test_max_rpm_past_the_run_s_time_ends_it(
    server: ScriptedServer, shell: str, slept: list[float]
) -> None:
    """``max_rpm=2`` under a 30 s run: the wait for the next minute would pass the run's
    time, so the run ends TIMEOUT after 2 model calls instead of sleeping past it."""
    from tether import VirtualClock

    _, pay = payments()
    script(server, [completion(calls=[("lookup", {"invoice": "1"})]),
                    completion(calls=[("lookup", {"invoice": "2"})]), completion("paid")])  # fmt: skip
    g = Guard(budget=Budget(max_seconds=30), prices=PRICES, clock=VirtualClock())
    outcome = SHELLS[shell](crew_with(server, lookup, pay, max_rpm=2), guard=g)
    assert slept == []
    assert outcome.stopped_because is StopReason.TIMEOUT
    assert "max_rpm (2)" in outcome.detail
    assert model_calls(server) == 2


# --- human_input and the tool hooks: a person's word, as tether asks for it and ends on it


def reviewed_crew(server: ScriptedServer, pay: Any) -> Crew:
    crew = crew_with(server, pay)
    crew.tasks[0].human_input = True
    return crew


def pay_then_answer(server: ScriptedServer) -> None:
    script(server, lambda i: completion(calls=[PAY]) if i % 2 == 0 else completion("Paid 99."))


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """CrewAI's terminal question (``input()``): each time it is asked, recorded; answered
    with Enter ("happy with the result")."""
    import builtins

    asked: list[str] = []
    monkeypatch.setattr(builtins, "input", lambda *a: asked.append("asked") or "")
    return asked


def approvals_guard() -> Guard:
    from tether import Records

    return Guard(budget=Budget(max_steps=30), prices=PRICES, records=Records.memory())


@pytest.mark.parametrize("shell", SHELLS)
def test_human_input_is_a_tether_approval(
    server: ScriptedServer, shell: str, terminal: list[str]
) -> None:
    """``Task(human_input=True)``: alone, CrewAI asks at the terminal; under tether the review
    pauses the run (an approval, a checkpoint), nobody is asked at the terminal; approved,
    the resumed kickoff goes on once: 1 payment, success."""
    paid, pay = payments()
    pay_then_answer(server)
    reviewed_crew(server, pay).kickoff()
    assert terminal == ["asked"]

    terminal.clear()
    paid.clear()
    g = approvals_guard()
    crewed = TetherCrew(g, side_effects=["pay"])
    first = through(crewed, reviewed_crew(server, pay), shell)
    assert (first.status, first.stopped_because) == (
        "awaiting_approval",
        StopReason.AWAITING_APPROVAL,
    )
    assert first.pending_approval is not None and first.pending_approval["tool"] == "human_input"
    assert crewed.last_output.raw == first.customer_message
    assert (paid, terminal) == ([{"invoice": "99", "amount": 10}], [])

    g.approve(first.checkpoint_id, by="alice")
    second = through(crewed, reviewed_crew(server, pay), shell, resume=first.checkpoint_id)
    assert (second.status, second.stopped_because) == ("success", StopReason.GOAL_REACHED)
    assert crewed.last_output.raw == "Paid 99."
    assert len(paid) == 1 and terminal == []


@pytest.mark.parametrize("shell", SHELLS)
def test_human_input_said_no_is_declined(
    server: ScriptedServer, shell: str, terminal: list[str]
) -> None:
    """The reviewer says no: the resumed run ends DECLINED, never done; the task's output is
    the customer message, not the rejected answer."""
    _, pay = payments()
    pay_then_answer(server)
    g = approvals_guard()
    crewed = TetherCrew(g, side_effects=["pay"])
    first = through(crewed, reviewed_crew(server, pay), shell)
    g.reject(first.checkpoint_id, by="bob", note="wrong invoice")
    second = through(crewed, reviewed_crew(server, pay), shell, resume=first.checkpoint_id)
    assert second.stopped_because is StopReason.DECLINED
    assert second.status != "success" and "wrong invoice" in second.detail
    assert crewed.last_output.raw == second.customer_message != "Paid 99."
    assert terminal == []


def test_human_input_needs_a_place_to_wait(server: ScriptedServer) -> None:
    """A reviewed task and a guard with no checkpoints: refused before any request."""
    _, pay = payments()
    with pytest.raises(ValueError, match="human_input may require approval"):
        kickoff(reviewed_crew(server, pay), guard=guard())
    assert model_calls(server) == 0


@pytest.fixture
def no_payments_hook() -> Iterator[None]:
    """A ``@before_tool_call`` hook that blocks every payment (CrewAI's abort: False)."""
    from crewai.hooks import register_before_tool_call_hook, unregister_before_tool_call_hook

    def no_payments(context: Any) -> bool | None:
        return False if context.tool_name == "pay" else None

    register_before_tool_call_hook(no_payments)
    yield
    unregister_before_tool_call_hook(no_payments)


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.usefixtures("no_payments_hook")
def test_a_blocking_tool_hook_ends_the_run_declined(server: ScriptedServer, shell: str) -> None:
    """A hook blocks the payment: alone, the model is told and the crew ends "done" with
    "Paid 99." (nothing was paid); under tether the run ends DECLINED after that call, the
    task's output the customer message."""
    paid, pay = payments()
    pay_then_answer(server)
    alone = crew_with(server, pay).kickoff()
    assert (paid, alone.raw) == ([], "Paid 99.")

    server.requests.clear()
    crewed = TetherCrew(guard(), side_effects=["pay"])
    outcome = through(crewed, crew_with(server, pay), shell)
    assert paid == []
    assert outcome.stopped_because is StopReason.DECLINED
    assert "before_tool_call hook blocked pay" in outcome.detail
    assert crewed.last_output.raw == outcome.customer_message
    assert model_calls(server) == 1


def test_a_hook_that_lets_the_call_through_changes_nothing(server: ScriptedServer) -> None:
    """A hook that returns None for the call: the payment runs, the crew succeeds."""
    from crewai.hooks import register_before_tool_call_hook, unregister_before_tool_call_hook

    def watch(context: Any) -> None:
        return None

    paid, pay = payments()
    pay_then_answer(server)
    register_before_tool_call_hook(watch)
    try:
        outcome = kickoff(crew_with(server, pay), guard=guard(), side_effects=["pay"])
    finally:
        unregister_before_tool_call_hook(watch)
    assert outcome.stopped_because is StopReason.GOAL_REACHED and len(paid) == 1


# --- a Flow's @persist holds the run; its state id is the request


def settle_flow(server: ScriptedServer, pay: Any, crewed: TetherCrew, db: str, shell: str) -> Any:
    """A Flow persisted in SQLite: a step running the guarded crew, then a step that dies
    while ``crash`` says so (the process ending after the payment)."""
    from crewai.flow.flow import Flow, FlowState, listen, start
    from crewai.flow.persistence import SQLiteFlowPersistence, persist

    class Settlement(FlowState):  # type: ignore[misc]
        tether_run: dict[str, Any] | None = None

    if shell == "sync":

        @persist(SQLiteFlowPersistence(db))
        class Settle(Flow[Settlement]):  # type: ignore[misc]
            crash = True

            @start()
            def settle(self) -> str:
                return str(crewed.kickoff(crew_with(server, pay), flow=self).status)

            @listen(settle)
            def confirm(self, status: str) -> str:
                if self.crash:
                    raise RuntimeError("the process died")
                return status

        return Settle

    @persist(SQLiteFlowPersistence(db))
    class ASettle(Flow[Settlement]):  # type: ignore[misc]
        crash = True

        @start()
        async def settle(self) -> str:
            return str((await crewed.akickoff(crew_with(server, pay), flow=self)).status)

        @listen(settle)
        async def confirm(self, status: str) -> str:
            if self.crash:
                raise RuntimeError("the process died")
            return status

    return ASettle


def flow_kickoff(flow: Any, shell: str, **inputs: Any) -> Any:
    if shell == "sync":
        return flow.kickoff(inputs=inputs or None)
    return asyncio.run(flow.kickoff_async(inputs=inputs or None))


@pytest.mark.parametrize("shell", SHELLS)
def test_a_restored_flow_continues_its_run(
    server: ScriptedServer, shell: str, tmp_path: Any
) -> None:
    """The Flow pays in its first step and dies in its second; a new Flow instance restored
    from persistence (the same state id) runs the step again: the payment asked again is
    replayed (1 execution), and the model-call budget goes on from where it was (3: the
    restored run's 2nd call is not sent)."""
    paid, pay = payments()
    pay_then_answer(server)
    g = Guard(budget=Budget(max_model_calls=3), prices=PRICES, signing_key=b"k" * 32)
    crewed = TetherCrew(g, side_effects=["pay"])
    Settle = settle_flow(server, pay, crewed, str(tmp_path / "flows.db"), shell)
    first = Settle()
    with pytest.raises(RuntimeError, match="the process died"):
        flow_kickoff(first, shell)
    assert len(paid) == 1 and model_calls(server) == 2
    assert first.state.tether_run["key"] == f"crewai-flow:{first.state.id}"

    again = Settle()
    again.crash = False
    flow_kickoff(again, shell, id=first.state.id)
    outcome = crewed.last_outcome
    assert len(paid) == 1
    assert outcome.stopped_because is StopReason.MAX_MODEL_CALLS
    assert model_calls(server) == outcome.usage.model_calls == 3


@pytest.mark.parametrize("shell", SHELLS)
def test_an_altered_flow_run_is_refused(server: ScriptedServer, shell: str, tmp_path: Any) -> None:
    """The run document in the persisted Flow state edited (its model calls set back to 0,
    under a guard that signs): refused with RunDocumentError before any model call."""
    from crewai.flow.persistence import SQLiteFlowPersistence

    from tether import RunDocumentError

    paid, pay = payments()
    pay_then_answer(server)
    g = Guard(budget=Budget(max_model_calls=3), prices=PRICES, signing_key=b"k" * 32)
    crewed = TetherCrew(g, side_effects=["pay"])
    db = str(tmp_path / "flows.db")
    Settle = settle_flow(server, pay, crewed, db, shell)
    first = Settle()
    with pytest.raises(RuntimeError, match="the process died"):
        flow_kickoff(first, shell)

    store = SQLiteFlowPersistence(db)
    state = store.load_state(first.state.id)
    assert state is not None and state["tether_run"]["model_calls"] == 2
    state["tether_run"]["model_calls"] = 0
    store.save_state(first.state.id, "settle", state)
    server.requests.clear()
    again = Settle()
    again.crash = False
    with pytest.raises(RunDocumentError):
        flow_kickoff(again, shell, id=first.state.id)
    assert model_calls(server) == 0 and len(paid) == 1


def test_a_flow_state_without_a_place_for_the_run_is_refused(server: ScriptedServer) -> None:
    """A structured Flow state with no ``tether_run`` field: refused, naming the fix."""
    from crewai.flow.flow import Flow, FlowState, start

    _, pay = payments()

    class Bare(Flow[FlowState]):  # type: ignore[misc]
        @start()
        def settle(self) -> None:
            kickoff(crew_with(server, pay), guard=guard(), flow=self)

    with pytest.raises(ValueError, match="tether_run: dict"):
        Bare().kickoff()
    assert model_calls(server) == 0


# --- a streaming crew (Crew(stream=True)): TetherCrew.stream / astream


def streaming_crew(pay: Any, replies: list[Any]) -> Crew:
    from crewai.llms.base_llm import BaseLLM
    from openai.types.chat.chat_completion_message_tool_call import (
        ChatCompletionMessageToolCall,
        Function,
    )

    class Scripted(BaseLLM):  # type: ignore[misc]
        def _reply(self) -> Any:
            self._track_token_usage_internal({"prompt_tokens": 100, "completion_tokens": 10})
            reply = replies.pop(0) if replies else "done"
            if isinstance(reply, str):
                return reply
            name, args = reply
            return [ChatCompletionMessageToolCall(id=f"c{len(replies)}", type="function",
                    function=Function(name=name, arguments=json.dumps(args)))]  # fmt: skip

        def call(self, *a: Any, **k: Any) -> Any:
            return self._reply()

        async def acall(self, *a: Any, **k: Any) -> Any:
            return self._reply()

        def supports_function_calling(self) -> bool:
            return True

    clerk = Agent(role="clerk", goal="settle the invoice", backstory="careful",
                  llm=Scripted(model="scripted"), tools=[pay], verbose=False)  # fmt: skip
    task = Task(description="settle invoice 99", expected_output="a receipt", agent=clerk)
    return Crew(agents=[clerk], tasks=[task], verbose=False, stream=True)


def read_stream(crewed: TetherCrew, crew: Crew, shell: str) -> list[Any]:
    if shell == "sync":
        return list(crewed.stream(crew))

    async def read() -> list[Any]:
        return [chunk async for chunk in crewed.astream(crew)]

    return asyncio.run(read())


@pytest.mark.parametrize("shell", SHELLS)
def test_a_streaming_crew_is_one_run(shell: str) -> None:
    """``Crew(stream=True)`` read to its end through ``stream``/``astream``: the payment asked
    three times runs once, the run stops ``repeated_action``, and the crew's output is the
    customer message."""
    paid, pay = payments()
    crewed = TetherCrew(guard(), side_effects=["pay"])
    read_stream(crewed, streaming_crew(pay, [PAY] * 5), shell)
    outcome = crewed.last_outcome
    assert outcome is not None and len(paid) == 1
    assert outcome.stopped_because is StopReason.REPEATED_ACTION
    assert outcome.usage.model_calls == 3
    assert crewed.last_output.raw == outcome.customer_message


def test_stream_needs_a_streaming_crew(server: ScriptedServer) -> None:
    """``stream()`` on a crew built without ``stream=True``: refused before any request."""
    _, pay = payments()
    with pytest.raises(ValueError, match="stream=True"):
        list(TetherCrew(guard()).stream(crew_with(server, pay)))
    assert model_calls(server) == 0


@pytest.mark.parametrize("shell", SHELLS)
def test_kickoff_refuses_a_streaming_crew(shell: str) -> None:
    """``kickoff`` on a ``Crew(stream=True)`` would end the run before the crew runs (CrewAI
    returns its stream at once): refused, nothing paid."""
    paid, pay = payments()
    with pytest.raises(ValueError, match="stream"):
        SHELLS[shell](streaming_crew(pay, [PAY]), guard=guard(), side_effects=["pay"])
    assert paid == []


@pytest.mark.parametrize("shell", SHELLS)
def test_a_rate_limited_model_is_retried_at_one_layer(
    server: ScriptedServer, shell: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """429s until the end: CrewAI wraps every LLM's call in its own rate-limit retries (3
    attempts, sleeping the Retry-After); under a 2-attempt policy tether is the one layer: 2
    requests, not 2 x 3."""
    import time as real_time

    slept: list[float] = []
    monkeypatch.setattr(real_time, "sleep", slept.append)  # CrewAI's own waits, not slept
    limited = Reply(429, {"error": {"message": "slow down", "type": "rate_limit_error"}},
                    headers={"retry-after": "1"})  # fmt: skip
    script(server, lambda i: limited)
    _, pay = payments()
    g = Guard(budget=Budget(max_steps=30), prices=PRICES,
              retry=RetryPolicy(base=0.001, max_attempts=2))  # fmt: skip
    outcome = SHELLS[shell](crew_with(server, pay), guard=g)
    assert model_calls(server) == 2
    assert outcome.usage.retries == 1 and outcome.status != "success"
