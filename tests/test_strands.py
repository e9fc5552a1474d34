"""Strands agents under tether's hooks, driven by a scripted model (Strands' own ``Model``
interface, as its tests' ``MockedModelProvider`` scripts theirs)."""

from __future__ import annotations

import asyncio
import glob
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any

import pytest
from strands import Agent, tool
from strands.models import Model

from tether import Budget, Guard, Price, PriceTable, RetryPolicy, StopReason
from tether.integrations.strands import STATE_KEY, TetherHooks

MODEL = "us.anthropic.claude-sonnet-4-6"
PRICES = PriceTable({MODEL: Price(input=3.0, output=15.0, cache_read=0.30)})
USAGE = {"inputTokens": 1000, "outputTokens": 100, "totalTokens": 1100, "cacheReadInputTokens": 400}


def use(name: str, args: dict[str, Any], i: int = 0) -> dict[str, Any]:
    return {"toolUse": {"name": name, "toolUseId": f"t{i}-{name}", "input": args}}


def text(said: str) -> dict[str, Any]:
    return {"text": said}


class Scripted(Model):  # type: ignore[misc]
    """A model that streams ``script(i)`` (content blocks) as its i-th reply, with usage."""

    def __init__(self, script: Callable[[int], list[dict[str, Any]]]) -> None:
        self.script = script
        self.calls = 0
        self.config = {"model_id": MODEL}

    def update_config(self, **config: Any) -> None:
        self.config.update(config)

    def get_config(self) -> Any:
        return self.config

    async def structured_output(self, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
        raise NotImplementedError
        yield  # pragma: no cover

    async def stream(self, messages: Any, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
        blocks = self.script(self.calls)
        self.calls += 1
        yield {"messageStart": {"role": "assistant"}}
        stop = "end_turn"
        for block in blocks:
            if "text" in block:
                yield {"contentBlockStart": {"start": {}}}
                yield {"contentBlockDelta": {"delta": {"text": block["text"]}}}
            else:
                stop = "tool_use"
                call = block["toolUse"]
                start = {"toolUse": {"name": call["name"], "toolUseId": call["toolUseId"]}}
                yield {"contentBlockStart": {"start": start}}
                yield {
                    "contentBlockDelta": {
                        "delta": {"toolUse": {"input": json.dumps(call["input"])}}
                    }
                }
            yield {"contentBlockStop": {}}
        yield {"messageStop": {"stopReason": stop}}
        yield {"metadata": {"usage": dict(USAGE), "metrics": {"latencyMs": 1}}}


def guard(**budget: Any) -> Guard:
    return Guard(
        budget=Budget(max_steps=40, **budget), prices=PRICES, retry=RetryPolicy(base=0.001)
    )


def answer_text(result: Any) -> str:
    return "".join(b.get("text", "") for b in result.message["content"])


SHELLS: dict[str, Callable[[Agent, str], Any]] = {
    "sync": lambda agent, said: agent(said),
    "async": lambda agent, said: asyncio.run(agent.invoke_async(said)),
}


def search_agent(hooks: list[Any]) -> tuple[Agent, Scripted, list[str]]:
    searched: list[str] = []

    @tool
    def search(query: str) -> str:
        """Search invoices."""
        searched.append(query)
        return "no result"

    model = Scripted(lambda i: [use("search", {"query": "invoice 99"}, i)])
    agent = Agent(model=model, tools=[search], hooks=hooks, callback_handler=None)
    return agent, model, searched


@pytest.mark.parametrize("shell", SHELLS)
def test_a_repeated_call_is_stopped_with_the_customer_message(shell: str) -> None:
    hooks = TetherHooks(guard())
    agent, model, searched = search_agent([hooks])
    result = SHELLS[shell](agent, "find invoice 99")
    outcome = hooks.last_outcome
    assert outcome is not None and outcome.stopped_because is StopReason.REPEATED_ACTION
    assert len(searched) <= 3
    assert model.calls == outcome.usage.model_calls  # the stop paid for no further call
    assert answer_text(result) == outcome.customer_message


def test_alone_the_same_call_repeats_until_the_script_ends() -> None:
    agent, model, searched = search_agent([])
    model.script = lambda i: [use("search", {"query": "invoice 99"}, i)] if i < 40 else [text("?")]
    agent("find invoice 99")
    assert len(searched) == 40  # no limit of its own


def refund_agent(payments: dict[str, Any], hooks: list[Any], times_out: bool = True) -> Agent:
    @tool
    def issue_refund(order: str, amount: float, request_id: str) -> dict[str, Any]:
        """Refund an order."""
        payments[request_id] = {"order": order, "amount": amount}
        if times_out:
            raise TimeoutError("read timed out")  # the refund commits; the reply is lost
        return {"refund": request_id}

    def script(i: int) -> list[dict[str, Any]]:
        if i < 2:
            args = {"order": "A-1", "amount": 49.9, "request_id": uuid.uuid4().hex}
            return [use("issue_refund", args, i)]
        return [text("Your refund is on its way.")]

    return Agent(model=Scripted(script), tools=[issue_refund], hooks=hooks, callback_handler=None)


@pytest.mark.parametrize("shell", SHELLS)
def test_a_timed_out_write_reissued_pays_once(shell: str) -> None:
    payments: dict[str, Any] = {}
    hooks = TetherHooks(
        guard(), side_effects={"issue_refund": lambda key: next(iter(payments.values()), None)}
    )
    result = SHELLS[shell](refund_agent(payments, [hooks]), "refund order A-1")
    assert len(payments) == 1
    outcome = hooks.last_outcome
    assert outcome is not None and outcome.stopped_because is StopReason.GOAL_REACHED
    assert answer_text(result) == "Your refund is on its way." == outcome.result


def test_alone_a_reissued_write_pays_twice() -> None:
    payments: dict[str, Any] = {}
    refund_agent(payments, [])("refund order A-1")
    assert len(payments) == 2


@pytest.mark.parametrize("shell", SHELLS)
def test_a_budget_stop_ends_with_the_customer_message(shell: str) -> None:
    looked: list[str] = []

    @tool
    def lookup_order(order: str) -> str:
        """Find an order."""
        looked.append(order)
        return "found"

    model = Scripted(lambda i: [use("lookup_order", {"order": f"A-{i}"}, i)])
    hooks = TetherHooks(guard(max_model_calls=3))
    agent = Agent(model=model, tools=[lookup_order], hooks=[hooks], callback_handler=None)
    result = SHELLS[shell](agent, "find my orders")
    outcome = hooks.last_outcome
    assert outcome is not None and outcome.stopped_because is StopReason.MAX_MODEL_CALLS
    assert model.calls == 3 and len(looked) == 3
    assert answer_text(result) == outcome.customer_message
    assert outcome.usage.model_calls == 3
    assert outcome.usage.input_tokens == 3 * 1000 and outcome.usage.cache_read_tokens == 3 * 400
    expected = 3 * (1000 * 3.0 + 100 * 15.0 + 400 * 0.30) / 1e6
    assert outcome.usage.cost_usd == pytest.approx(expected)


def test_parallel_tool_calls_are_each_counted() -> None:
    looked: list[str] = []

    @tool
    def lookup_order(order: str) -> str:
        """Find an order."""
        looked.append(order)
        return "found"

    def script(i: int) -> list[dict[str, Any]]:
        if i == 0:
            return [use("lookup_order", {"order": f"A-{n}"}, n) for n in range(3)]
        return [text("All found.")]

    model = Scripted(script)
    hooks = TetherHooks(guard(max_tool_calls=2))
    agent = Agent(model=model, tools=[lookup_order], hooks=[hooks], callback_handler=None)
    result = agent("find my orders")
    outcome = hooks.last_outcome
    assert outcome is not None and outcome.stopped_because is StopReason.MAX_TOOL_CALLS
    assert len(looked) == 2 and model.calls == 1  # the loop ends after that round of tools
    assert outcome.usage.tool_calls == 2
    assert answer_text(result) != "All found."


def test_a_sub_agent_as_a_tool_counts_in_its_own_run() -> None:
    """A Strands agent used as a tool is an agent of its own: its hooks, its run."""
    child_hooks = TetherHooks(guard())
    child = Agent(model=Scripted(lambda i: [text("invoice 99 is paid")]), hooks=[child_hooks],
                  callback_handler=None)  # fmt: skip

    @tool
    def billing(request: str) -> str:
        """Answer billing questions."""
        return answer_text(child(request))

    def script(i: int) -> list[dict[str, Any]]:
        return [use("billing", {"request": "invoice 99"})] if i == 0 else [text("It is paid.")]

    hooks = TetherHooks(guard())
    parent = Agent(model=Scripted(script), tools=[billing], hooks=[hooks], callback_handler=None)
    assert answer_text(parent("is invoice 99 paid?")) == "It is paid."
    assert hooks.last_outcome is not None and child_hooks.last_outcome is not None
    assert hooks.last_outcome.usage.model_calls == 2 and hooks.last_outcome.usage.tool_calls == 1
    assert child_hooks.last_outcome.usage.model_calls == 1


def test_the_hooks_refuse_what_they_cannot_use() -> None:
    with pytest.raises(TypeError):
        TetherHooks("not a guard")  # type: ignore[arg-type]


@pytest.mark.parametrize("shell", SHELLS)
def test_a_spent_budget_scope_pauses_the_invocation(shell: str) -> None:
    """TetherHooks(guard, scopes=...): the tenant's scope allows 3 model calls; the 4th is
    never sent, the run is paused BUDGET_REACHED and the agent ends with the message."""
    from tether import BudgetScopes, Checkpoints, LoopPolicy

    looked: list[str] = []

    @tool
    def lookup_order(order: str) -> str:
        """Find an order."""
        looked.append(order)
        return "found"

    scopes = BudgetScopes()
    scopes.limit("tenant:acme", max_model_calls=3)
    tethered = Guard(
        scopes=scopes, prices=PRICES, loops=LoopPolicy(max_repeats=None),
        checkpoints=Checkpoints.memory(),
    )  # fmt: skip
    hooks = TetherHooks(tethered, scopes=("tenant:acme",))
    model = Scripted(lambda i: [use("lookup_order", {"order": f"A-{i}"}, i)])
    agent = Agent(model=model, tools=[lookup_order], hooks=[hooks], callback_handler=None)
    result = SHELLS[shell](agent, "find the orders")
    outcome = hooks.last_outcome
    assert outcome is not None
    assert (outcome.status, outcome.stopped_because) == ("paused", StopReason.BUDGET_REACHED)
    assert model.calls == 3 and scopes.spent("tenant:acme").model_calls == 3
    assert answer_text(result) == outcome.customer_message


class Overloaded(Exception):
    status_code = 529


@pytest.mark.parametrize("shell", SHELLS)
def test_a_transient_model_error_is_retried_by_the_run(shell: str) -> None:
    """A 529 (which Strands' own ModelRetryStrategy does not retry) is retried by the run's
    policy, one layer, within the run's time: the answer, 2 requests for 1 counted call."""

    class Flaky(Scripted):
        async def stream(self, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
            if self.calls == 0:
                self.calls += 1
                raise Overloaded("529 overloaded_error")
            async for chunk in super().stream(*args, **kwargs):
                yield chunk

    hooks = TetherHooks(guard())
    model = Flaky(lambda i: [text("Invoice 99 is paid.")])
    agent = Agent(model=model, hooks=[hooks], callback_handler=None)
    result = SHELLS[shell](agent, "find invoice 99")
    outcome = hooks.last_outcome
    assert outcome is not None
    assert (outcome.status, outcome.result) == ("success", "Invoice 99 is paid.")
    assert model.calls == 2 and outcome.usage.model_calls == 1 and outcome.usage.retries == 1
    assert outcome.usage.steps == 1
    assert answer_text(result) == "Invoice 99 is paid."


def interrupted_refund(answer: Any, shell: str) -> tuple[TetherHooks, list[str], Any, Any]:
    """A refund that needs a person's approval, asked as a Strands interrupt; then the
    person's ``answer`` (None: decided on tether's side, by ``guard.approve``)."""
    from tether import Checkpoints

    paid: list[str] = []

    @tool
    def issue_refund(order: str) -> str:
        """Refund an order."""
        paid.append(order)
        return "refunded"

    model = Scripted(lambda i: [use("issue_refund", {"order": "A-1"}, i)] if i == 0
                     else [text("Refunded A-1.")])  # fmt: skip
    tethered = Guard(prices=PRICES, checkpoints=Checkpoints.memory())
    hooks = TetherHooks(
        tethered, side_effects=["issue_refund"], requires_approval={"issue_refund": True}
    )
    agent = Agent(model=model, tools=[issue_refund], hooks=[hooks], callback_handler=None)
    first = SHELLS[shell](agent, "refund A-1")
    paused = hooks.last_outcome
    assert first.stop_reason == "interrupt" and paid == [] and model.calls == 1
    assert paused is not None and paused.stopped_because is StopReason.AWAITING_APPROVAL
    (interrupt,) = first.interrupts
    assert interrupt.name == "tether_approval"
    assert interrupt.reason["checkpoint_id"] == paused.checkpoint_id
    if answer is None:  # the operator page (or guard.approve) decided; the app resumes
        tethered.approve(paused.checkpoint_id, by="alice")
        answer = "approve"
    reply = [{"interruptResponse": {"interruptId": interrupt.id, "response": answer}}]
    result = SHELLS[shell](agent, reply)  # type: ignore[arg-type]
    return hooks, paid, tethered, result


@pytest.mark.parametrize("answer", [{"approved": True}, None])
@pytest.mark.parametrize("shell", SHELLS)
def test_a_tether_approval_is_a_strands_interrupt(shell: str, answer: Any) -> None:
    """requires_approval pauses the run (a checkpoint, a pending approval) and interrupts the
    agent; the interrupt's response (or guard.approve) resumes the paused run: the refund runs
    once, the approval is used, the model answers."""
    hooks, paid, tethered, result = interrupted_refund(answer, shell)
    outcome = hooks.last_outcome
    assert outcome is not None
    assert (outcome.status, outcome.result) == ("success", "Refunded A-1.")
    assert paid == ["A-1"]
    (record,) = tethered.approvals()
    assert (record.status, record.decided_by) == ("used", "strands" if answer else "alice")
    assert answer_text(result) == "Refunded A-1."


@pytest.mark.parametrize("shell", SHELLS)
def test_an_interrupt_declined_rejects_the_approval(shell: str) -> None:
    """The person declines: the approval is rejected, the refund never runs, the run ends
    DECLINED."""
    hooks, paid, tethered, _ = interrupted_refund({"approved": False}, shell)
    assert paid == []
    (record,) = tethered.approvals()
    assert record.status == "rejected"
    assert hooks.last_outcome is not None
    assert hooks.last_outcome.stopped_because is StopReason.DECLINED


@pytest.mark.parametrize("shell", SHELLS)
def test_a_reply_cut_at_max_tokens_is_never_a_success(shell: str) -> None:
    """Strands raises MaxTokensReachedException for a reply cut at its max_tokens; the run
    ends TRUNCATED (it was filed "success", GOAL_REACHED, with no result)."""
    from strands.types.exceptions import MaxTokensReachedException

    class Cut(Scripted):
        async def stream(self, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
            async for chunk in super().stream(*args, **kwargs):
                yield (
                    {"messageStop": {"stopReason": "max_tokens"}}
                    if "messageStop" in chunk
                    else chunk
                )

    hooks = TetherHooks(guard())
    agent = Agent(model=Cut(lambda i: [text("Your refund of 4")]), hooks=[hooks],
                  callback_handler=None)  # fmt: skip
    with pytest.raises(MaxTokensReachedException):  # Strands' own ending stays
        SHELLS[shell](agent, "refund A-1")
    outcome = hooks.last_outcome
    assert outcome is not None
    assert (outcome.status, outcome.stopped_because) == ("failed", StopReason.TRUNCATED)
    assert outcome.usage.model_calls == 1


SESSION = "s-1"
SIGNING_KEY = "a signing key for the run documents of this test"


def paid_in(where: str) -> list[str]:
    path = os.path.join(where, "paid")
    if not os.path.exists(path):
        return []
    with open(path) as paid:
        return paid.read().split()


def session_agent(
    where: str, script: Callable[[int], list[dict[str, Any]]], max_steps: int = 4
) -> tuple[Agent, TetherHooks, Scripted]:
    """A refund agent of one process: its session in a FileSessionManager under ``where``,
    its tether records (the ledger) in a database there, its run documents signed."""
    from strands.session import FileSessionManager

    from tether import Records

    @tool
    def issue_refund(order: str) -> str:
        """Refund an order."""
        with open(os.path.join(where, "paid"), "a") as paid:
            paid.write(order + "\n")
        return "refunded"

    tethered = Guard(
        budget=Budget(max_steps=max_steps),
        prices=PRICES,
        records=Records.sqlite(os.path.join(where, "records.db")),
        signing_key=SIGNING_KEY,
    )
    hooks = TetherHooks(tethered, side_effects=["issue_refund"])
    model = Scripted(script)
    sessions = FileSessionManager(session_id=SESSION, storage_dir=where)
    agent = Agent(model=model, tools=[issue_refund], hooks=[hooks], callback_handler=None,
                  session_manager=sessions)  # fmt: skip
    return agent, hooks, model


def a_process_that_dies(where: str, shell: str, max_steps: int) -> None:
    """Run in a child process: the agent refunds A-1, then the process dies in its next
    model call (no hook, no ``finally`` runs)."""

    def script(i: int) -> list[dict[str, Any]]:
        if i == 0:
            return [use("issue_refund", {"order": "A-1"}, i)]
        os._exit(3)

    agent, _, _ = session_agent(where, script, max_steps)
    SHELLS[shell](agent, "refund A-1")


def crashed(where: str, shell: str, max_steps: int = 4) -> None:
    code = (
        f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import test_strands; "
        f"test_strands.a_process_that_dies({where!r}, {shell!r}, {max_steps})"
    )
    died = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert died.returncode == 3, died.stderr
    assert paid_in(where) == ["A-1"]


def reissued(i: int) -> list[dict[str, Any]]:
    """The restored agent's model: the refund asked again (as after a crash), then done."""
    return [use("issue_refund", {"order": "A-1"}, 9)] if i == 0 else [text("Refunded A-1.")]


@pytest.mark.parametrize("shell", SHELLS)
def test_an_agent_restored_from_the_session_continues_the_run(shell: str, tmp_path: Any) -> None:
    """The session manager holds the run document: an agent built from the same session
    after its process died continues the same tether run (its request, its spent steps,
    the ledger's effects): the refund asked again is not made again."""
    where = str(tmp_path)
    crashed(where, shell)
    agent, hooks, _ = session_agent(where, reissued)
    kept = agent.state.get(STATE_KEY)  # the session brought the run back
    result = SHELLS[shell](agent, "go on")
    assert paid_in(where) == ["A-1"]  # once, across the crash
    assert kept is not None
    outcome = hooks.last_outcome
    assert outcome is not None and outcome.status == "success"
    assert outcome.run_id == kept["run_id"]
    assert outcome.usage.model_calls == 3  # the dead process's step, then two
    assert answer_text(result) == "Refunded A-1."
    assert agent.state.get(STATE_KEY) is None  # ended: the session keeps no run
    again, _, _ = session_agent(where, reissued)
    assert again.state.get(STATE_KEY) is None


@pytest.mark.parametrize("shell", SHELLS)
def test_the_step_budget_goes_on_in_the_restored_agent(shell: str, tmp_path: Any) -> None:
    """max_steps=2: the dead process spent one step; the restored agent has one left."""
    where = str(tmp_path)
    crashed(where, shell, max_steps=2)
    agent, hooks, model = session_agent(where, reissued, max_steps=2)
    SHELLS[shell](agent, "go on")
    outcome = hooks.last_outcome
    assert outcome is not None and outcome.stopped_because is StopReason.MAX_STEPS
    assert model.calls == 1 and paid_in(where) == ["A-1"]


@pytest.mark.parametrize("altered", ["a field", "not a document"])
@pytest.mark.parametrize("shell", SHELLS)
def test_an_altered_run_document_in_the_session_fails_closed(
    shell: str, altered: str, tmp_path: Any
) -> None:
    """A run document altered in the session (or not one at all) is refused with
    RunDocumentError before the restored agent calls its model or a tool."""
    from tether import RunDocumentError

    where = str(tmp_path)
    crashed(where, shell)
    (path,) = glob.glob(os.path.join(where, f"session_{SESSION}", "agents", "*", "agent.json"))
    with open(path) as f:
        saved = json.load(f)
    doc = saved["state"][STATE_KEY]
    if altered == "a field":
        doc["task"] = "refund A-1 and A-2"
    else:
        saved["state"][STATE_KEY] = "a run"
    with open(path, "w") as f:
        json.dump(saved, f)
    agent, _, model = session_agent(where, reissued)
    with pytest.raises(RunDocumentError):
        SHELLS[shell](agent, "go on")
    assert model.calls == 0 and paid_in(where) == ["A-1"]
