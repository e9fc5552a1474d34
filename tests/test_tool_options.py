"""One keyword set for the per-tool options (``tether.integrations.ToolOptions``): every adapter
that takes a framework's tools by name takes all of them, checked the same way (#41)."""

from __future__ import annotations

import asyncio
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tether
from tether import Guard
from tether.integrations import SideEffects, ToolOptions

#: every option, for a tool named "refund"
ALL: ToolOptions = {
    "timeouts": {"refund": 2.0},
    "requires_approval": {"refund": True},
    "compensate": {"refund": lambda result: None},
    "labels": {"refund": "refund"},
    "hand_over": ["transfer_to_human"],
    "volatile": {"refund": ["meta.nonce"]},
}


def guard(tmp_path: Path) -> Guard:
    return Guard(records=tether.Records.sqlite(str(tmp_path / "r.db")))


def _middleware(g: Guard, **o: Any) -> Any:
    from tether.integrations.langchain import TetherMiddleware

    return TetherMiddleware(g, ["refund"], **o)


def _tool_guard(g: Guard, **o: Any) -> Any:
    from tether.integrations.langchain import ToolGuard

    return ToolGuard(["refund"], **o)


def _graph_guard(g: Guard, **o: Any) -> Any:
    from tether.integrations.langgraph import GraphGuard

    return GraphGuard(g, ["refund"], **o)


def _tool_wrapper(g: Guard, **o: Any) -> Any:
    from tether.integrations.langgraph import tool_wrapper

    with g.start() as run:
        wrapper = tool_wrapper(run, ["refund"], **o)
        run.succeed()
    return wrapper.guard  # type: ignore[attr-defined]


def _guard_tools(g: Guard, **o: Any) -> Any:
    from tether.integrations.openai_agents import guard_tools

    with g.start() as run:
        assert guard_tools([], run, ["refund"], **o) == []
        run.succeed()


def _agents_session(g: Guard, **o: Any) -> Any:
    from agents import Agent

    from tether.integrations.openai_agents import _Session

    return _Session(Agent(name="a"), "hi", guard=g, side_effects=["refund"], **o)


def _capability(g: Guard, **o: Any) -> Any:
    from tether.integrations.pydantic_ai import TetherCapability

    return TetherCapability(g, ["refund"], **o)


ADAPTERS: dict[str, Callable[..., Any]] = {
    "TetherMiddleware": _middleware,
    "ToolGuard": _tool_guard,
    "GraphGuard": _graph_guard,
    "langgraph.tool_wrapper": _tool_wrapper,
    "openai_agents.guard_tools": _guard_tools,
    "openai_agents.run": _agents_session,
    "pydantic_ai.TetherCapability": _capability,
}


@pytest.mark.parametrize("adapter", list(ADAPTERS))
def test_every_adapter_takes_every_option(adapter: str, tmp_path: Path) -> None:
    """All of ToolOptions at once: accepted (GraphGuard, tool_wrapper and guard_tools refused
    requires_approval, compensate, hand_over or volatile before)."""
    made = ADAPTERS[adapter](guard(tmp_path), **ALL)
    rules = getattr(made, "rules", None) or getattr(getattr(made, "_tools", None), "rules", None)
    if rules is None and hasattr(made, "_agent"):
        rules = made._agent._tools.rules
    if rules is not None:  # what reaches run.call_tool for the tool
        options = rules.options("refund")
        assert options["timeout"] == 2.0 and options["requires_approval"] is True
        assert options["label"] == "refund" and options["volatile"] == ("meta.nonce",)
        assert options["idempotent"] is False and callable(options["compensate"])
        assert rules.options("transfer_to_human")["hands_over"] is True


@pytest.mark.parametrize("adapter", list(ADAPTERS))
@pytest.mark.parametrize(
    ("option", "bad", "says"),
    [
        ("hand_over", "transfer_to_human", "hand_over must be a list"),
        ("requires_approval", {"refund": "yes"}, "requires_approval"),
        ("compensate", {"refund": "undo"}, "compensate"),
        ("volatile", {"refund": "meta.nonce"}, "volatile"),
    ],
)
def test_every_adapter_checks_the_options_alike(
    adapter: str, option: str, bad: Any, says: str, tmp_path: Path
) -> None:
    """A wrong option is refused with the same words by every adapter."""
    with pytest.raises(TypeError, match=says):
        ADAPTERS[adapter](guard(tmp_path), **{option: bad})


def test_approval_needs_a_place_to_wait_in_every_adapter() -> None:
    """requires_approval under a guard with no checkpoints: refused before any request."""
    for name, adapter in ADAPTERS.items():
        if name == "ToolGuard":  # takes no guard: what holds it checks (the two above)
            continue
        with pytest.raises(ValueError, match="nowhere to wait"):
            adapter(Guard(), requires_approval={"refund": True})


def test_an_unknown_option_is_refused() -> None:
    from tether.integrations._common import ToolRules

    with pytest.raises(TypeError, match="unknown tool option"):
        ToolRules(["refund"], timeout={"refund": 1.0})  # type: ignore[call-arg]


def test_the_typed_keywords_are_the_options() -> None:
    """The public names: SideEffects and ToolOptions, the keys every adapter takes."""
    assert set(ToolOptions.__optional_keys__) == {
        "timeouts", "requires_approval", "compensate", "labels", "hand_over", "volatile",
    }  # fmt: skip
    assert typing.get_origin(SideEffects) is types.UnionType
    assert tether.integrations.__all__ == ["SideEffects", "ToolOptions"]


def test_the_first_tool_guard_form_still_works() -> None:
    """ToolGuard(side_effects, timeouts, requires_approval, compensate), positionally."""
    from tether.integrations.langchain import ToolGuard

    undo = {"refund": lambda result: None}
    tools = ToolGuard({"refund": None}, {"refund": 2.0}, {"refund": True}, undo)
    assert tools.timeouts == {"refund": 2.0} and tools.rules.needing_approval() == ["refund"]
    with pytest.raises(TypeError, match="given twice"):
        ToolGuard(None, {"refund": 2.0}, timeouts={"refund": 3.0})
    with pytest.raises(TypeError, match="at most 4"):
        ToolGuard(None, None, None, None, None)


def test_volatile_paths_reach_the_intent_key_in_a_pydantic_agent() -> None:
    """volatile, now an option of every adapter: a PydanticAI re-issued refund whose nonce
    changes runs once."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    from tether.integrations import pydantic_ai as ta_pydantic

    refunds: list[str] = []
    turn = iter(range(100))

    def respond(messages: list[Any], info: Any) -> ModelResponse:
        i = next(turn)
        if i < 2:
            args = {"order": "A-1", "meta": {"nonce": f"n{i}"}}
            return ModelResponse(parts=[ToolCallPart("refund", args, tool_call_id=f"c{i}")])
        return ModelResponse(parts=[TextPart("Refunded.")])

    agent: Any = Agent(FunctionModel(respond, model_name="scripted"))

    @agent.tool_plain
    def refund(order: str, meta: dict[str, str]) -> str:
        """Refund an order."""
        refunds.append(order)
        return "re_1"

    out = asyncio.run(ta_pydantic.run(agent, "refund A-1", guard=Guard(), side_effects=["refund"],
                                      volatile={"refund": ["meta.nonce"]}))  # fmt: skip
    assert out.status == "success" and refunds == ["A-1"]


@pytest.mark.parametrize(
    "module",
    ["anthropic", "openai", "langchain", "langgraph", "openai_agents", "pydantic_ai", "mcp",
     "dbos", "temporal"],
)  # fmt: skip
def test_no_entry_point_declares_the_options_again(module: str) -> None:
    """A public entry point takes the per-tool option maps through ``**Unpack[ToolOptions]``,
    never as parameters of its own (GraphGuard, tool_wrapper, atool_wrapper, guard_tools,
    ToolGuard and TetherMiddleware declared them: 6 → 0); ``tether.Tool`` is one tool's."""
    import importlib
    import inspect

    mod = importlib.import_module(f"tether.integrations.{module}")
    own = []
    for name in mod.__all__:
        fn = getattr(mod, name)
        if fn is tether.Tool or not callable(fn):
            continue
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):  # pragma: no cover - a builtin
            continue
        own += [f"{name}({p.name})" for p in params
                if p.name in ToolOptions.__optional_keys__ and p.kind is not p.VAR_KEYWORD]  # fmt: skip
    assert own == []
