"""Scale rows: a LangChain v1 agent under TetherMiddleware against LangChain's own limit
middlewares (the overhead suite), and per-step time and memory from 10^3 to 10^6 steps
and from 100 to 10,000 concurrent asyncio runs (the soak suite)."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import tether
from tether.run._loops import LoopPolicy

__all__ = ["concurrent_runs", "langchain_middleware", "run_scale", "steps_at_scale"]

#: the overhead suite's ``_interleaved`` and ``_row``, handed in by the suite (which imports
#: this module: importing them here would make the two modules a circle)
Interleaved = Callable[..., dict[str, list[float]]]
Row = Callable[..., dict[str, dict[str, Any]]]

#: a turn of the scripted agent: three tool calls, then the answer
TURN_TOOLS = (
    ("lookup", {"order": "A-1042"}),
    ("weather", {"city": "Oslo"}),
    ("add", {"a": 2, "b": 3}),
)


# --- LangChain v1: TetherMiddleware against ModelCallLimitMiddleware + ToolCallLimitMiddleware


def _script() -> Iterator[Any]:
    """The fake model's replies, turn after turn: one tool call per model call, then an answer."""
    from langchain_core.messages import AIMessage

    usage = {"input_tokens": 200, "output_tokens": 20, "total_tokens": 220}
    for turn in itertools.count():
        for i, (name, args) in enumerate(TURN_TOOLS):
            call = {"name": name, "args": args, "id": f"call_{turn}_{i}"}
            yield AIMessage(content="", tool_calls=[call], usage_metadata=usage)
        yield AIMessage(content="done", usage_metadata=usage)


def _agent(middleware: list[Any]) -> Any:
    """A real ``create_agent`` graph with three tools and LangChain's scripted fake model."""
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.tools import tool

    class ToolModel(GenericFakeChatModel):
        model_name: str = "fake-model"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self  # the script already names the tools

    @tool
    def lookup(order: str) -> str:
        """Look an order up."""
        return json.dumps({"order": order, "status": "shipped"})

    @tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"{city}: 4 C, rain"

    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    model = ToolModel(messages=_script())
    return create_agent(model, tools=[lookup, weather, add], middleware=middleware)


def _turn(agent: Any) -> Callable[[], Any]:
    user = {"messages": [("user", "where is order A-1042?")]}

    def turn() -> Any:
        state = agent.invoke(user)
        tools = sum(1 for m in state["messages"] if getattr(m, "type", "") == "tool")
        if tools != len(TURN_TOOLS) or state["messages"][-1].content != "done":
            raise RuntimeError(f"the scripted turn did not run through: {state['messages']!r}")
        return state

    return turn


#: the LangChain peer of TetherMiddleware: LangChain's own middlewares for what it does
LANGCHAIN_PEER = "ModelCallLimitMiddleware + ToolCallLimitMiddleware + ModelRetryMiddleware + ToolRetryMiddleware"


def langchain_middleware(
    interleaved: Interleaved, row_of: Row, quick: bool = False, *, number: int | None = None
) -> dict[str, Any]:
    """One agent turn (4 model calls, 3 tool calls) with TetherMiddleware, with LangChain's
    own middlewares for what it does (ModelCallLimitMiddleware + ToolCallLimitMiddleware, and
    ModelRetryMiddleware + ToolRetryMiddleware, since TetherMiddleware retries too), and with
    no middleware: interleaved, ours against LangChain's, and each against no middleware."""
    try:
        from langchain.agents.middleware import (
            ModelCallLimitMiddleware,
            ModelRetryMiddleware,
            ToolCallLimitMiddleware,
            ToolRetryMiddleware,
        )

        from tether.integrations.langchain import TetherMiddleware
    except ImportError as exc:
        return {"tether": {"note": f"skipped: {exc} (pip install 'tether[langchain]')"}}
    prices = tether.PriceTable({"fake-model": tether.Price(3.0, 15.0)})
    guard = tether.Guard(budget=tether.Budget(max_steps=20), prices=prices)
    impls = {
        "tether": _turn(_agent([TetherMiddleware(guard)])),
        "langchain_middlewares": _turn(
            _agent(
                [
                    ModelCallLimitMiddleware(run_limit=20),
                    ToolCallLimitMiddleware(run_limit=20),
                    ModelRetryMiddleware(),
                    ToolRetryMiddleware(),
                ]
            )
        ),
        "none": _turn(_agent([])),
    }
    for turn in impls.values():
        turn()  # compiled, warm, and checked: every turn runs its three tools
    times = interleaved(impls, number=number or (2 if quick else 4), reps=3 if quick else 7)
    row = row_of(times, peer="langchain_middlewares", goal=1.25, unit="turn")
    row["langchain_middlewares"]["written_as"] = LANGCHAIN_PEER
    for name in ("tether", "langchain_middlewares"):
        row[name]["vs_none"] = row_of(times, ours=name, peer="none", goal=None)[name]["ratio"]
    return row


# --- one run of 10^3 to 10^6 steps, each in a fresh interpreter --------------------------------

_STEPS = """
import gc, json, resource, sys, time
import tether
from tether.run._loops import LoopPolicy

def lookup(**kwargs):
    return len(kwargs)

def high_water_kb():
    # this process's own peak RSS: ru_maxrss survives exec (a big parent's peak shows here)
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

steps = int(sys.argv[1])
guard = tether.Guard(loops=LoopPolicy(max_no_progress=None))
args = {"q": "x" * 64}
gc.collect()
base = high_water_kb()
start, cpu = time.perf_counter(), time.process_time()
with guard.start(task="soak") as run:
    for i in range(steps):
        run.proceed()
        run.call_tool("lookup", lookup, {**args, "n": i})
    run.succeed("done")
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
peak = high_water_kb()
print(json.dumps({"seconds": seconds, "cpu": cpu, "base_kb": base, "peak_kb": peak}))
"""


def steps_at_scale(sizes: tuple[int, ...]) -> dict[str, dict[str, Any]]:
    """One guarded run (start, ``steps`` times proceed + call_tool with ~100 B of arguments,
    end) per size, each in a fresh interpreter: µs per step and the process's peak RSS
    (``VmHWM``; ``ru_maxrss`` where there is no /proc), also above what it held before."""
    out: dict[str, dict[str, Any]] = {}
    for steps in sizes:
        done = subprocess.run(
            [sys.executable, "-c", _STEPS, str(steps)],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if done.returncode:
            failed = f"failed: {done.stderr.strip().splitlines()[-1:]}"
            out[f"{steps}_steps"] = {"note": failed, "summary": failed}
            continue
        m = json.loads(done.stdout)
        out[f"{steps}_steps"] = {
            "steps": steps,
            "ns_per_call": round(m["seconds"] / steps * 1e9, 1),
            "per": "step",
            "cpu_ns_per_step": round(m["cpu"] / steps * 1e9, 1),
            "peak_rss_mb": round(m["peak_kb"] / 1024, 1),
            "run_peak_mb": round((m["peak_kb"] - m["base_kb"]) / 1024, 1),
        }
        row = out[f"{steps}_steps"]
        row["summary"] = (
            f"{row['cpu_ns_per_step'] / 1e3:.1f} µs CPU a step; {row['peak_rss_mb']} MB peak RSS "
            f"({row['run_peak_mb']} MB over the start) "
            f"for {steps:,} steps"
        )
    return out


# --- many runs open at once on one event loop --------------------------------------------------


async def _alookup(**kwargs: Any) -> int:
    await asyncio.sleep(0)  # the other runs go on meanwhile
    return len(kwargs)


async def _many(runs: int, steps: int, traced: bool) -> tuple[float, float, int]:
    """``runs`` guarded runs on one loop, ``steps`` acall_tool steps each; all of them open at
    once before any ends. The seconds it took, and (``traced``) the bytes they held then."""
    guard = tether.Guard(loops=LoopPolicy(max_no_progress=None))
    arrived = [0]
    everyone = asyncio.Event()
    held = [0]
    base = tracemalloc.get_traced_memory()[0] if traced else 0

    async def one(n: int) -> None:
        async with guard.start(task="soak") as run:
            for i in range(steps):
                run.proceed()
                await run.acall_tool("lookup", _alookup, {"q": "x" * 64, "run": n, "n": i})
            arrived[0] += 1
            if arrived[0] == runs:
                if traced:
                    held[0] = tracemalloc.get_traced_memory()[0] - base
                everyone.set()
            await everyone.wait()
            run.succeed("done")

    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one(n) for n in range(runs)))
    return time.perf_counter() - start, time.process_time() - cpu, held[0]


def concurrent_runs(sizes: tuple[int, ...], steps: int = 3) -> dict[str, dict[str, Any]]:
    """100 to 10,000 runs open at once, each doing ``steps`` guarded ``acall_tool`` steps:
    steps per second (timed untraced), and the bytes per open run (traced by tracemalloc in
    a second pass: the run, its task and its coroutine)."""
    out: dict[str, dict[str, Any]] = {}
    for runs in sizes:
        seconds, cpu, _ = asyncio.run(_many(runs, steps, traced=False))
        tracemalloc.start()
        try:
            _, _, held = asyncio.run(_many(runs, steps, traced=True))
        finally:
            tracemalloc.stop()
        out[f"{runs}_runs"] = {
            "runs": runs,
            "steps": runs * steps,
            "ns_per_call": round(seconds / (runs * steps) * 1e9, 1),
            "per": "step",
            "cpu_ns_per_step": round(cpu / (runs * steps) * 1e9, 1),
            "steps_per_s": round(runs * steps / seconds),
            "cpu_steps_per_s": round(runs * steps / max(cpu, 1e-9)),
            "bytes_per_open_run": round(held / runs),
        }
        row = out[f"{runs}_runs"]
        row["summary"] = (
            f"{row['steps_per_s']:,} steps/s ({row['cpu_steps_per_s']:,} per CPU second), "
            f"{row['bytes_per_open_run']:,} B per open run "
            f"({runs:,} runs open at once)"
        )
    return out


def run_scale(quick: bool = False) -> dict[str, dict[str, Any]]:
    """The soak suite's scale rows: 10^3 to 10^6 steps (10^4 with ``quick``), 100 to 10,000
    concurrent runs (1,000 with ``quick``)."""
    steps = (1_000, 10_000) if quick else (1_000, 10_000, 100_000, 1_000_000)
    runs = (100, 1_000) if quick else (100, 1_000, 10_000)
    return {"steps_at_scale": steps_at_scale(steps), "concurrent_runs": concurrent_runs(runs)}
