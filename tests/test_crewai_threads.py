"""CrewAI runs one reply's tool calls in threads: a policy's per-tool limit holds there as in
one thread (#38 case 5), on the real ``Crew`` with CrewAI's own ``LLM`` against a scripted
loopback server (the model's replies). (Identical calls in one reply meet CrewAI's own check
first: the same arguments answered the same way 5 times end its agent.)"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

with warnings.catch_warnings():  # crewai's lazy imports warn on import (ImportWarning)
    warnings.simplefilter("ignore", ImportWarning)
    from crewai.tools import tool
from scripted_server import ScriptedServer
from test_crewai import completion, crew_with, script
from tether import Budget, Guard, policies
from tether.integrations.crewai import kickoff
from tether.run import _toolgate

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CALLS = 12


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as s:
        yield s


@pytest.fixture(autouse=True)
def _gap_widened(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each thread lets the others run right after the policies were checked (a gap between a
    policy's check and the count it reads is then met in every run)."""
    check = _toolgate.check_policies

    def widened(*args: Any, **kwargs: Any) -> Any:
        try:
            return check(*args, **kwargs)
        finally:
            time.sleep(0.005)

    monkeypatch.setattr(_toolgate, "check_policies", widened)


def meet(n: int) -> Callable[[], None]:
    """The calls that run wait for one another inside the tool (at most 0.3 s)."""
    barrier = threading.Barrier(n, timeout=0.3)

    def wait() -> None:
        try:
            barrier.wait()
        except threading.BrokenBarrierError:  # fewer came: they were refused
            pass

    return wait


@pytest.mark.parametrize("rerun", range(10))
def test_crewai_parallel_calls_respect_a_policy_s_max_calls(
    server: ScriptedServer, rerun: int
) -> None:
    """One reply asking for 12 searches under max_calls("search", 3): 3 run (before: 12)."""
    ran: list[str] = []
    arrive = meet(CALLS)

    @tool("search")
    def search(q: str) -> str:
        """Search the orders."""
        arrive()
        ran.append(q)
        return "found"

    calls = [("search", {"q": f"A-{i}"}) for i in range(CALLS)]
    script(server, [completion(calls=calls), completion("done")])
    guard = Guard(Budget(max_steps=30), policies=[policies.max_calls("search", 3)])
    kickoff(crew_with(server, search), guard=guard)
    assert len(ran) == 3, f"{len(ran)} of {CALLS} ran under max_calls('search', 3)"
