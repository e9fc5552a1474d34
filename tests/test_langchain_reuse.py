"""TetherMiddleware continues the run its last hook left instead of rebuilding it from the
snapshot at every hook (``guard.restore(doc, reuse=run)``): the same turn, the same state,
the same outcome as a run rebuilt at every hook; a snapshot taken before the run changed
again, or a copy of one, is rebuilt."""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool

import tether
from tether import Guard, Run, StopReason, VirtualClock
from tether.integrations.langchain import TetherMiddleware

SHELLS = ["invoke", "ainvoke", "stream", "astream"]
USAGE = {"input_tokens": 100, "output_tokens": 10, "total_tokens": 110}


class Model(GenericFakeChatModel):
    """LangChain's fake chat model, bindable to tools."""

    model_name: str = "fake-model"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def ask(calls: list[tuple[str, dict[str, Any]]], i: int) -> AIMessage:
    tool_calls = [{"name": n, "args": a, "id": f"{n}_{i}_{j}"} for j, (n, a) in enumerate(calls)]
    return AIMessage("", tool_calls=tool_calls, usage_metadata=USAGE)


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return json.dumps({"order": order, "status": "shipped"})


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: 4 C"


def script(stuck: bool) -> Iterator[AIMessage]:
    """Two calls, an answer; ``stuck``: the same lookup forever (the loop detector ends it).
    One call at a time: parallel calls that do not overlap in time each rebuild the run
    from the snapshot they share (as they always did), and which of their snapshots the
    state keeps depends on the threads' timing."""
    yield ask([("lookup", {"order": "A-1"})], 0)
    yield ask([("weather", {"city": "Bergen"})], 1)
    if stuck:
        for i in itertools.count(2):
            yield ask([("lookup", {"order": "A-1"})], i)
    yield AIMessage("shipped", usage_metadata=USAGE)


def states(shell: str, stuck: bool, reuse: bool, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The graph state after each step of one turn (``stream_mode="values"``), the run in
    it as plain data without its id (the clock is virtual: the same seconds), and the
    turn's outcome; ``reuse=False``: every hook rebuilds the run from the snapshot."""
    if not reuse:
        monkeypatch.setattr(TetherMiddleware, "_parked", lambda self, doc: None)
    prices = tether.PriceTable({"fake-model": tether.Price(3.0, 15.0)})
    agent = create_agent(
        Model(messages=script(stuck)),
        tools=[lookup, weather],
        middleware=[TetherMiddleware(Guard(prices=prices, clock=VirtualClock()))],
    )
    value = {"messages": [("user", "where is A-1?")]}
    if shell in ("invoke", "ainvoke"):
        final = agent.invoke(value) if shell == "invoke" else asyncio.run(agent.ainvoke(value))
        chunks = [final]
    elif shell == "stream":
        chunks = list(agent.stream(value, stream_mode="values"))
    else:

        async def collect() -> list[Any]:
            return [c async for c in agent.astream(value, stream_mode="values")]

        chunks = asyncio.run(collect())
    monkeypatch.undo()
    out: list[Any] = []
    for chunk in chunks:
        doc = chunk.get("tether_run")
        if isinstance(doc, dict):
            doc = json.loads(json.dumps(doc).replace(doc["run_id"], "<run>"))
            doc["ledger"] = "<the guard's in-process ledger>"  # each guard has its own
            rows = list(doc["counts"].values())  # each copy counts under an id of its own
            doc["counts"] = [round(sum(r[i] for r in rows), 9) for i in range(1, 11)]
        out.append((doc, [(m.type, m.content) for m in chunk["messages"]]))
    outcome = chunks[-1]["tether_outcome"]
    out.append((outcome.status, outcome.stopped_because, outcome.customer_message))
    out.append((outcome.usage.steps, outcome.usage.tool_calls, outcome.usage.cost_usd))
    out.append((outcome.partial, outcome.result, outcome.detail, outcome.models))
    return out


@pytest.mark.parametrize("stuck", [False, True])
@pytest.mark.parametrize("shell", SHELLS)
def test_a_turn_goes_as_a_turn_rebuilt_at_every_hook(
    shell: str, stuck: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two tool calls and an answer (or a loop the detector stops): every state of the turn
    and its outcome are those of the same turn rebuilt at every hook."""
    reused = states(shell, stuck, True, monkeypatch)
    rebuilt = states(shell, stuck, False, monkeypatch)
    assert reused == rebuilt
    stop = StopReason.REPEATED_ACTION if stuck else StopReason.GOAL_REACHED
    assert reused[-3][1] is stop


@pytest.mark.parametrize("shell", ["invoke", "ainvoke"])
def test_a_turn_builds_its_run_once(shell: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn of three model calls and two tool calls: its run is built once
    (``guard.start``), never rebuilt from the state at a hook."""
    built: list[Run] = []
    init = Run.__init__

    def counted(self: Run, *args: Any, **kwargs: Any) -> None:
        built.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(Run, "__init__", counted)
    agent = create_agent(
        Model(messages=script(False)),
        tools=[lookup, weather],
        middleware=[TetherMiddleware(Guard())],
    )
    value = {"messages": [("user", "where is A-1?")]}
    final = agent.invoke(value) if shell == "invoke" else asyncio.run(agent.ainvoke(value))
    assert final["tether_outcome"].usage.tool_calls == 2
    assert len(built) == 1


def test_an_older_snapshot_of_a_run_still_going_continues_it() -> None:
    """A hook given an older snapshot of a run that a hook took since and that has not
    ended (a parallel tool call of the same model turn, a node LangGraph runs again)
    continues that run, with everything it counted since: never a copy rebuilt from the
    older snapshot, which would not count the other calls (#38). Once the run has ended, an
    older snapshot is rebuilt."""
    middleware = TetherMiddleware(Guard())
    state: dict[str, Any] = {"messages": [], **(middleware.before_agent({"messages": []}, None))}
    first = middleware._take(state)
    assert first is not None
    first.run.proceed()
    newer = {"tether_run": middleware._put(first)}
    again = middleware._take(state)  # the snapshot from before the step
    assert again is not None and again.run is first.run and again.run.steps == 1
    middleware._let_go(again)
    went_on = middleware._take(newer)
    assert went_on is not None and went_on.run is first.run and went_on.run.steps == 1
    middleware._end_run(went_on.run)
    middleware._let_go(went_on)
    rebuilt = middleware._take(state)
    assert rebuilt is not None and rebuilt.run is not first.run and rebuilt.run.steps == 0
    middleware._let_go(rebuilt)


def test_a_run_held_by_a_hook_is_shared_not_continued_twice() -> None:
    """Two hooks given one snapshot at once (parallel tool calls) share one run; a hook given
    the snapshot the first of them let go of continues that run too (it has gone on)."""
    middleware = TetherMiddleware(Guard())
    state = middleware.before_agent({"messages": []}, None)
    one, two = middleware._take(state), middleware._take(state)
    assert one is not None and two is not None and one.run is two.run
    one.run.proceed()
    early = {"tether_run": middleware._put(one)}
    two.run.proceed()
    late = {"tether_run": middleware._put(two)}
    stale = middleware._take(early)
    assert stale is not None and stale.run is one.run and stale.run.steps == 2
    middleware._let_go(stale)
    last = middleware._take(late)
    assert last is not None and last.run is one.run and last.run.steps == 2
    middleware._let_go(last)


def test_a_copy_of_the_snapshot_is_plain_data() -> None:
    """The snapshot in the state copies, pickles and checkpoints as a plain dict, without
    the run; a copy is rebuilt."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    middleware = TetherMiddleware(Guard())
    doc = middleware.before_agent({"messages": []}, None)["tether_run"]
    serde = JsonPlusSerializer()
    copies = [
        copy.copy(doc),
        copy.deepcopy(doc),
        pickle.loads(pickle.dumps(doc)),
        serde.loads_typed(serde.dumps_typed(doc)),
    ]
    for other in copies:
        assert type(other) is dict and other == doc
        hold = middleware._take({"tether_run": other})
        assert hold is not None
        middleware._let_go(hold)
        original = middleware._take({"tether_run": doc})
        assert original is not None and original.run is not hold.run
        middleware._let_go(original)


def test_reuse_makes_the_run_what_a_restore_would() -> None:
    """``guard.restore(doc, reuse=run)``: the run itself, its clock from the snapshot's
    elapsed time (time between the hooks is not the run's, as after a restore), the same
    snapshot as a rebuilt run's; a run holding what a snapshot keeps in another form (an
    effect's arguments), of another guard or of another snapshot is not reused."""
    clock = VirtualClock()
    guard = Guard(clock=clock)
    run = guard.start(task="find")
    run.proceed()
    run.call_tool("search", lambda q: "none", {"q": "99"})
    run.record_model_call(input_tokens=10, output_tokens=2)
    clock.advance(2.0)
    doc = run.snapshot()
    clock.advance(30.0)  # outside the hooks
    rebuilt = guard.restore(doc)
    assert guard.restore(doc, reuse=run) is run
    assert run.elapsed == rebuilt.elapsed == 2.0
    assert run.snapshot() == rebuilt.snapshot()
    assert Guard(clock=clock).restore(doc, reuse=run) is not run
    other = guard.start(task="other")
    assert guard.restore(doc, reuse=other) is not other
    run.proceed()
    run.call_tool("pay", lambda order: "ok", {"order": "A"}, idempotent=False)
    paid = run.snapshot()
    again = guard.restore(paid, reuse=run)
    assert again is not run and again.snapshot() == guard.restore(paid).snapshot()


def test_a_tools_estimate_is_its_json_whenever_the_tool_changes() -> None:
    """The prompt's estimate counts each tool's (name, description, arguments) as JSON:
    read once per tool (its schema is built anew at each read), read again when the tool's
    description or argument schema is another object."""
    from pydantic import BaseModel

    from tether.guards._tokens import estimate_tokens
    from tether.integrations.langchain import prompt_tokens

    @tool
    def lookup_order(order: str) -> str:
        """Look an order up."""
        return order

    def direct() -> int:
        t = lookup_order
        return estimate_tokens(None, "hi", None, (t.name, t.description, t.args))

    messages = [AIMessage("hi")]
    assert prompt_tokens(messages, None, [lookup_order]) == direct()
    assert prompt_tokens(messages, None, [lookup_order]) == direct()
    lookup_order.description = "Look an order up by its number, in every store we have. " * 5
    assert prompt_tokens(messages, None, [lookup_order]) == direct()

    class Wider(BaseModel):
        order: str
        store: str
        since: int

    before = prompt_tokens(messages, None, [lookup_order])
    lookup_order.args_schema = Wider
    assert prompt_tokens(messages, None, [lookup_order]) == direct() > before


def test_parallel_branches_of_a_hand_built_graph_share_the_run() -> None:
    """Two branches of one step (``Send`` to a hand-written tool node each) on one snapshot:
    ``GraphGuard.call_tools`` holds the run until its update is made, so the two share it
    and the merged state counts both calls (sync shell: threads)."""
    import threading

    from langchain_core.messages import HumanMessage

    from tether.integrations.langchain import _newest
    from tether.integrations.langgraph import GraphGuard

    barrier = threading.Barrier(2, timeout=5)

    @tool
    def find(q: str) -> str:
        """Look q up."""
        barrier.wait()  # both branches are in their call at once
        return "found " + q

    guarded = GraphGuard(Guard(), read_only=["find"])
    doc = guarded._agent.before_agent({"messages": [HumanMessage("hi")]}, None)["tether_run"]
    outs: dict[int, Any] = {}

    def branch(i: int) -> None:
        call = {"name": "find", "args": {"q": f"q{i}"}, "id": f"c{i}"}
        state = {
            "messages": [HumanMessage("hi"), AIMessage("", tool_calls=[call])],
            "tether_run": doc,
        }
        outs[i] = guarded.call_tools(state, [find])

    threads = [threading.Thread(target=branch, args=(i,)) for i in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    merged = _newest(_newest(doc, outs[1]["tether_run"]), outs[2]["tether_run"])
    assert merged["tool_calls"] == 2
    assert sorted(e["args"]["q"] for e in merged["partial"]["entries"]) == ["q1", "q2"]


def test_parallel_tool_calls_on_one_snapshot_share_the_run_async() -> None:
    """The same through the async tool wrapper (``ToolNode(awrap_tool_call=...)``): two
    calls awaiting at once on one snapshot share the run; both are counted."""
    from langchain_core.messages import HumanMessage, ToolMessage

    from tether.integrations.langchain import _newest
    from tether.integrations.langgraph import GraphGuard

    guarded = GraphGuard(Guard(), read_only=["find"])
    doc = guarded._agent.before_agent({"messages": [HumanMessage("hi")]}, None)["tether_run"]

    class Request:
        def __init__(self, i: int) -> None:
            self.tool_call = {"name": "find", "args": {"q": f"q{i}"}, "id": f"c{i}"}
            self.tool = None
            self.state = {"messages": [HumanMessage("hi")], "tether_run": doc}

    async def both() -> list[Any]:
        arrived = asyncio.Event()
        waiting = [0]

        async def handler(request: Any) -> ToolMessage:
            waiting[0] += 1
            if waiting[0] == 2:
                arrived.set()
            await asyncio.wait_for(arrived.wait(), 5)  # both calls are in at once
            return ToolMessage("found", tool_call_id=request.tool_call["id"], name="find")

        return list(
            await asyncio.gather(*(guarded.atool_wrapper(Request(i), handler) for i in (1, 2)))
        )

    replies = asyncio.run(both())
    docs = [reply[-1].update["tether_run"] for reply in replies]
    merged = _newest(_newest(doc, docs[0]), docs[1])
    assert merged["tool_calls"] == 2


def test_a_dict_schema_changed_in_place_is_read_again() -> None:
    """A tool whose ``args_schema`` is a dict (changed in place, say) is estimated from its
    schema as it is at each call."""
    from langchain_core.tools import StructuredTool

    from tether.integrations.langchain import prompt_tokens

    schema: dict[str, Any] = {
        "title": "s",
        "type": "object",
        "properties": {"q": {"type": "string"}},
    }
    search = StructuredTool.from_function(
        func=lambda **kw: "x", name="search", description="d", args_schema=schema
    )
    before = prompt_tokens([], tools=[search])
    schema["properties"]["since"] = {"type": "string", "description": "word " * 200}
    assert prompt_tokens([], tools=[search]) > before + 200


def _cyclic_garbage(fn: Any) -> list[str]:
    """The types of what ``fn()`` leaves for the cycle collector (freed by nothing else)."""
    import gc

    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        fn()
        gc.collect()
        return sorted({type(o).__name__ for o in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def test_a_run_is_freed_when_it_is_let_go_not_by_the_cycle_collector() -> None:
    """A run and its state, its token reservations and its records hold no reference cycle:
    a run let go is freed at once with all it holds (in an agent's turn: the conversation),
    never left for the cycle collector (whose collections a turn would pay for)."""
    guard = Guard()

    def one_run() -> None:
        with guard.start(task="t") as run:
            run.proceed()
            run.record_model_call(input_tokens=10, output_tokens=2)
            run.call_tool("search", lambda q: "none", {"q": "99"})
            assert run.guard is guard and run._state.owner is run
            run.succeed("done")

    agent = create_agent(
        Model(messages=itertools.cycle(list(script(False)))),
        tools=[lookup, weather],
        middleware=[TetherMiddleware(guard)],
    )

    def one_turn() -> None:
        state = agent.invoke({"messages": [("user", "where is A-1?")]})
        assert state["tether_outcome"].stopped_because is StopReason.GOAL_REACHED

    one_turn()  # LangChain's own first-call set-up (its schemas) aside
    assert _cyclic_garbage(one_run) == []
    assert _cyclic_garbage(one_turn) == []


def test_a_run_held_only_by_a_callback_still_has_its_run() -> None:
    """A run whose only holder is a framework's callback (a bound method, a partial) keeps
    working: a policy that takes ``run=`` is given the run itself, mid-call; a state read
    after its run was let go raises instead of giving None."""
    import functools
    import gc

    seen: list[Any] = []

    def policy(tool: str, args: Any, *, run: Any) -> None:
        seen.append(run)

    guard = Guard(policies=[policy])
    run = guard.start(task="t")
    step, call = run.proceed, functools.partial(run.call_tool, "search", lambda q: "none")
    state = run._state
    run_id = run.run_id
    del run
    gc.collect()
    assert step()
    assert call({"q": "99"}) == "none"
    assert len(seen) == 1 and isinstance(seen[0], Run) and seen[0].run_id == run_id
    assert seen[0]._state is state
    del step, call
    seen.clear()
    gc.collect()
    with pytest.raises(ReferenceError, match="let go"):
        _ = state.owner
