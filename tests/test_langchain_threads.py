"""create_agent under TetherMiddleware across LangGraph's pauses: interrupt() in a tool,
HumanInTheLoopMiddleware, interrupt_before, resumed and multi-turn threads; what goes into
the checkpoint; read-only tools; the request key."""

from __future__ import annotations

import asyncio
import gc
import itertools
import subprocess
import sys
import textwrap
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, interrupt

from tether import Guard, Run, StopReason
from tether.integrations.langchain import TetherMiddleware


class Model(GenericFakeChatModel):
    """LangChain's fake chat model, bindable to tools."""

    model_name: str = "fake-model"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def ask(name: str, args: dict[str, Any], i: int) -> AIMessage:
    return AIMessage(
        "",
        tool_calls=[{"name": name, "args": args, "id": f"{name}_{i}"}],
        usage_metadata={"input_tokens": 100, "output_tokens": 10, "total_tokens": 110},
    )


def answer(text: str) -> AIMessage:
    return AIMessage(
        text, usage_metadata={"input_tokens": 100, "output_tokens": 10, "total_tokens": 110}
    )


def forever(name: str, args: dict[str, Any]) -> Iterator[AIMessage]:
    return (ask(name, args, i) for i in itertools.count())


SHELLS = ["invoke", "ainvoke", "stream", "astream"]


def call(app: Any, value: Any, config: Any, shell: str) -> dict[str, Any]:
    """One invocation through one of LangGraph's four shells; the final state (with
    ``__interrupt__`` when it paused)."""
    if shell == "invoke":
        return dict(app.invoke(value, config))
    if shell == "ainvoke":
        return dict(asyncio.run(app.ainvoke(value, config)))
    chunks: list[Any] = []
    if shell == "stream":
        chunks = list(app.stream(value, config, stream_mode="values"))
    else:

        async def collect() -> list[Any]:
            return [c async for c in app.astream(value, config, stream_mode="values")]

        chunks = asyncio.run(collect())
    state = dict(chunks[-1]) if chunks else {}
    snapshot = app.get_state(config)
    if snapshot.interrupts:
        state["__interrupt__"] = list(snapshot.interrupts)
    return state


def thread(name: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": name}}


@tool
def search(q: str) -> str:
    """Search invoices."""
    SEARCHED.append(q)
    return "no result"


SEARCHED: list[str] = []
BOOKED: list[str] = []


@pytest.fixture(autouse=True)
def _fresh() -> None:
    SEARCHED.clear()
    BOOKED.clear()


@tool
def book(hotel: str) -> str:
    """Book a hotel, once a person says yes."""
    said = interrupt({"question": f"book {hotel}?"})
    if said != "yes":
        return "not booked"
    BOOKED.append(hotel)
    return f"booked {hotel}"


@pytest.mark.parametrize("shell", SHELLS)
def test_interrupt_in_a_tool_pauses_the_agent_and_resume_continues_the_run(shell: str) -> None:
    """interrupt() pauses (no 'rejected', no outcome yet); Command(resume=) books once and
    the run that paused ends in success with the calls of both halves counted."""
    model = Model(messages=iter([ask("book", {"hotel": "Hilton"}, 0), answer("Booked.")]))
    agent = create_agent(
        model, tools=[book], middleware=[TetherMiddleware(Guard())], checkpointer=InMemorySaver()
    )
    config = thread(f"t-{shell}")
    first = call(agent, {"messages": [("user", "book the Hilton")]}, config, shell)
    assert first["__interrupt__"][0].value == {"question": "book Hilton?"}
    assert BOOKED == [] and "tether_outcome" not in first
    assert not [m for m in first["messages"] if m.type == "tool"]
    done = call(agent, Command(resume="yes"), config, shell)
    outcome = done["tether_outcome"]
    assert BOOKED == ["Hilton"] and outcome.status == "success" and outcome.result == "Booked."
    assert (outcome.usage.model_calls, outcome.usage.tool_calls) == (2, 1)


@tool
def approve(what: str) -> str:
    """Ask a person to approve."""
    return str(interrupt(what))


@pytest.mark.parametrize("shell", SHELLS)
def test_a_resumed_thread_keeps_its_run(shell: str) -> None:
    """One search, an approval pause, then the model searches the same thing forever: the
    loop detector remembers the search from before the pause (2 searches, not unbounded)."""
    script = itertools.chain(
        [ask("search", {"q": "99"}, 0), ask("approve", {"what": "go on"}, 1)],
        forever("search", {"q": "99"}),
    )
    agent = create_agent(
        Model(messages=script),
        tools=[search, approve],
        middleware=[TetherMiddleware(Guard())],
        checkpointer=InMemorySaver(),
    )
    config = thread(f"r-{shell}")
    assert call(agent, {"messages": [("user", "find invoice 99")]}, config, shell)["__interrupt__"]
    done = call(agent, Command(resume="yes"), config, shell)
    assert SEARCHED == ["99", "99"]
    assert done["tether_outcome"].stopped_because is StopReason.REPEATED_ACTION
    assert done["messages"][-1].content == done["tether_outcome"].customer_message


def test_paused_threads_leave_nothing_in_memory() -> None:
    """20 threads paused at interrupt(): no tether run is kept alive for them."""
    gc.collect()
    earlier = weakref.WeakSet(o for o in gc.get_objects() if isinstance(o, Run))  # other tests'
    middleware = TetherMiddleware(Guard())
    saver = InMemorySaver()
    for i in range(20):
        model = Model(messages=iter([ask("book", {"hotel": f"H{i}"}, 0)]))
        agent = create_agent(model, tools=[book], middleware=[middleware], checkpointer=saver)
        assert agent.invoke({"messages": [("user", "book")]}, thread(f"p-{i}"))["__interrupt__"]
    del agent, model
    gc.collect()
    assert [o for o in gc.get_objects() if isinstance(o, Run) and o not in earlier] == []


@pytest.mark.parametrize("shell", ["invoke", "ainvoke"])
def test_human_in_the_loop_middleware_pause_keeps_the_run(shell: str) -> None:
    """HumanInTheLoopMiddleware pauses before the tool; approved, the tool runs once and the
    run counts both model calls and ends in success."""
    from langchain.agents.middleware import HumanInTheLoopMiddleware

    @tool
    def refund(order: str) -> str:
        """Refund an order."""
        BOOKED.append(order)
        return "re_1"

    model = Model(messages=iter([ask("refund", {"order": "A-1"}, 0), answer("Refunded.")]))
    agent = create_agent(
        model,
        tools=[refund],
        checkpointer=InMemorySaver(),
        middleware=[
            TetherMiddleware(Guard(), side_effects=["refund"]),
            HumanInTheLoopMiddleware(interrupt_on={"refund": True}),
        ],
    )
    config = thread(f"hitl-{shell}")
    assert call(agent, {"messages": [("user", "refund A-1")]}, config, shell)["__interrupt__"]
    assert BOOKED == []
    done = call(agent, Command(resume={"decisions": [{"type": "approve"}]}), config, shell)
    outcome = done["tether_outcome"]
    assert BOOKED == ["A-1"] and outcome.status == "success"
    assert (outcome.usage.model_calls, outcome.usage.tool_calls) == (2, 1)


@pytest.mark.parametrize("shell", ["invoke", "astream"])
def test_interrupt_before_tools_stays_guarded(shell: str) -> None:
    """interrupt_before=["tools"] (the tutorial's approval): each continuation with None is the
    same run; the stuck search stops at 2."""
    agent = create_agent(
        Model(messages=forever("search", {"q": "99"})),
        tools=[search],
        middleware=[TetherMiddleware(Guard())],
        checkpointer=InMemorySaver(),
        interrupt_before=["tools"],
    )
    config = thread(f"ib-{shell}")
    state = call(agent, {"messages": [("user", "find invoice 99")]}, config, shell)
    for _ in range(10):
        if not agent.get_state(config).next:
            break
        state = call(agent, None, config, shell)
    assert SEARCHED == ["99", "99"]
    assert state["tether_outcome"].stopped_because is StopReason.REPEATED_ACTION


def test_every_turn_of_a_thread_is_guarded() -> None:
    """A second user turn on the same thread is a run of its own, guarded as the first."""
    script = itertools.chain([answer("Hello.")], forever("search", {"q": "99"}))
    agent = create_agent(
        Model(messages=script),
        tools=[search],
        middleware=[TetherMiddleware(Guard())],
        checkpointer=InMemorySaver(),
    )
    config = thread("turns")
    first = agent.invoke({"messages": [("user", "hi")]}, config)["tether_outcome"]
    second = agent.invoke({"messages": [("user", "find invoice 99")]}, config)["tether_outcome"]
    assert first.status == "success" and first.run_id != second.run_id
    assert second.stopped_because is StopReason.REPEATED_ACTION and SEARCHED == ["99", "99"]
    assert second.usage.model_calls == 3


def test_the_checkpoint_holds_plain_data(caplog: pytest.LogCaptureFixture) -> None:
    """Reading the thread back warns of no unregistered type; tether's part of the checkpoint
    is JSON."""
    agent = create_agent(
        Model(messages=forever("search", {"q": "99"})),
        tools=[search],
        middleware=[TetherMiddleware(Guard())],
        checkpointer=InMemorySaver(),
    )
    config = thread("plain")
    agent.invoke({"messages": [("user", "find invoice 99")]}, config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        values = agent.get_state(config).values
    tether_values = {k: v for k, v in values.items() if k.startswith("tether")}
    assert tether_values and plain(tether_values)
    assert not [r for r in caplog.records if "unregistered type" in r.getMessage()]


def plain(value: Any) -> bool:
    """JSON's own types only (no subclass: a str enum is not plain data to LangGraph)."""
    if type(value) in (dict, list):
        items = value.values() if type(value) is dict else value
        return all(type(k) is str for k in value if type(value) is dict) and all(map(plain, items))
    return type(value) in (str, int, float, bool, type(None))


def test_strict_msgpack_resumes_a_paused_thread() -> None:
    """LANGGRAPH_STRICT_MSGPACK=true: a thread paused and resumed through a checkpoint keeps
    its run (nothing of tether's is blocked)."""
    script = textwrap.dedent(
        """
        from langchain.agents import create_agent
        from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
        from langchain_core.messages import AIMessage
        from langchain_core.tools import tool
        from langgraph.checkpoint.memory import InMemorySaver
        from langgraph.types import Command, interrupt
        import tether
        from tether.integrations.langchain import TetherMiddleware

        class Model(GenericFakeChatModel):
            def bind_tools(self, tools, **kw):
                return self

        @tool
        def book(hotel: str) -> str:
            '''Book.'''
            return "booked" if interrupt("ok?") == "yes" else "no"

        saver = InMemorySaver()  # it stores serialized checkpoints: strict msgpack applies
        config = {"configurable": {"thread_id": "s"}}
        msgs = [AIMessage("", tool_calls=[{"name": "book", "args": {"hotel": "H"}, "id": "c0"}]),
                AIMessage("Booked.")]
        for part in (0, 1):  # a worker pauses the thread, another one (a new guard) resumes it
            agent = create_agent(Model(messages=iter(msgs[part:])), tools=[book],
                                 middleware=[TetherMiddleware(tether.Guard())], checkpointer=saver)
            if part == 0:
                agent.invoke({"messages": [("user", "book H")]}, config)
            else:
                out = agent.invoke(Command(resume="yes"), config)
                print(out["tether_outcome"].status, out["tether_outcome"].usage.model_calls)
                agent.get_state(config)  # read the thread back: nothing of tether's is blocked
        """
    )
    env = {"LANGGRAPH_STRICT_MSGPACK": "true", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "unregistered type" not in done.stderr and "blocked" not in done.stderr.lower()
    assert done.stdout.split() == ["success", "2"]


@pytest.mark.parametrize("how", ["declared", "metadata"])
def test_read_only_tools_poll_until_done(how: str) -> None:
    """A read-only tool (named in read_only=, or by its LangChain metadata readOnlyHint) may
    poll: 6 identical polls needed, 6 ran, then the answer."""
    polled: list[str] = []

    @tool
    def check_export(job: str) -> str:
        """Poll an export job."""
        polled.append(job)
        return "done" if len(polled) == 6 else "running"

    if how == "metadata":  # as langchain-mcp-adapters carries an MCP tool's annotations
        check_export.metadata = {"readOnlyHint": True}

    script = itertools.chain(
        itertools.islice(forever("check_export", {"job": "j"}), 6), [answer("Ready.")]
    )
    rules: dict[str, Any] = {"read_only": ["check_export"]} if how == "declared" else {}
    agent = create_agent(
        Model(messages=script),
        tools=[check_export],
        middleware=[TetherMiddleware(Guard(), **rules)],
    )
    outcome = agent.invoke({"messages": [("user", "export")]})["tether_outcome"]
    assert len(polled) == 6 and outcome.status == "success"


def test_a_request_key_makes_two_invocations_one_request() -> None:
    """key= names the request (like guard.start(key=)): the same key twice pays once; without
    one, each invocation is its own request."""
    paid: list[str] = []

    @tool
    def pay(order: str) -> str:
        """Pay an order."""
        paid.append(order)
        return f"paid {order}"

    guard = Guard()
    for key, expected in ((lambda config: config["configurable"]["ticket"], 1), (None, 2)):
        paid.clear()
        for turn in range(2):
            model = Model(messages=iter([ask("pay", {"order": "A-1"}, 0), answer("Paid.")]))
            agent = create_agent(
                model,
                tools=[pay],
                middleware=[TetherMiddleware(guard, side_effects=["pay"], key=key)],
            )
            agent.invoke(
                {"messages": [("user", "pay A-1")]},
                {"configurable": {"ticket": "T-7", "thread_id": f"k{turn}"}},
            )
        assert len(paid) == expected
