"""A secret-named argument of a call that waits for approval: the checkpoint keeps it
redacted (never in clear), so a resumed run cannot complete the call. It must end saying
so, never ask for approval forever, and never run the effect with the placeholder."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import anthropic
import pytest

import tether
from scripted_server import Reply, ScriptedServer
from tether import Checkpoints, Guard, Ledger, StopReason, ToolError
from tether.integrations import anthropic as t_anthropic

CARD = "4242424242424242"


def _guard(tmp: Path) -> Guard:
    db = str(tmp / "tether.db")
    return Guard(ledger=Ledger.sqlite(db), checkpoints=Checkpoints.sqlite(db))


def _reply(content: list[dict[str, Any]], stop: str = "end_turn") -> Reply:
    return Reply(
        200,
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-6",
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": 9, "output_tokens": 8},
        },
    )


def test_resuming_from_the_stored_conversation_ends_honestly(
    server: ScriptedServer, tmp_path: Path
) -> None:
    charged: list[str] = []

    def charge(order: str, card_number: str) -> dict[str, Any]:
        charged.append(card_number)
        return {"id": "ch_1"}

    ask = {
        "type": "tool_use",
        "id": "tu_1",
        "name": "charge",
        "input": {"order": "A-1", "card_number": CARD},
    }
    server.script = [_reply([ask], "tool_use")] + [_reply([ask], "tool_use")] * 3
    tools = [tether.Tool("charge", charge, idempotent=False, requires_approval=True)]
    with anthropic.Anthropic(api_key="t", base_url=server.url) as raw:
        first = t_anthropic.run_agent(
            raw,
            model="claude-sonnet-4-6",
            tools=tools,
            messages=[{"role": "user", "content": "charge A-1"}],
            guard=_guard(tmp_path),
        )
        assert first.status == "awaiting_approval" and first.checkpoint_id is not None
        guard = _guard(tmp_path)
        stored = guard.checkpoints.load(first.checkpoint_id)["messages"]
        assert CARD not in json.dumps(stored)  # the secret is never kept
        guard.approve(first.checkpoint_id, by="alice")
        second = t_anthropic.run_agent(
            raw,
            model="claude-sonnet-4-6",
            messages=stored,
            tools=tools,
            guard=guard,
            resume=first.checkpoint_id,
        )
    assert charged == []  # never run with "[redacted]"
    assert (second.status, second.stopped_because) == ("failed", StopReason.FAILED)
    assert "card_number was redacted" in second.detail
    assert second.pending_approval is None  # no second approval asked
    assert any("ask the customer for it again" in i for i in second.open_issues)


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_live_run_tells_the_model_the_value_is_a_placeholder(shell: str) -> None:
    ran: list[Any] = []

    def charge(order: str, card_number: str) -> None:
        ran.append(card_number)

    async def acharge(order: str, card_number: str) -> None:
        ran.append(card_number)

    args = {"order": "A-1", "card_number": "[redacted]"}
    with Guard().start() as run:
        run.proceed()
        with pytest.raises(ToolError) as told:
            if shell == "sync":
                run.call_tool("charge", charge, args, idempotent=False)
            else:
                asyncio.run(run.acall_tool("charge", acharge, args, idempotent=False))
        run.succeed()
    assert ran == []
    assert "card_number holds a redacted placeholder" in told.value.model_message
