"""Gemini (Google ADK): a reply read whole and the same reply streamed (ADK's SSE mode) give
one usage and one price, through ADK's ``Gemini`` model on the real google-genai client
against a loopback server, in ADK's sync and async runners."""

from __future__ import annotations

import json
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.agents.run_config import RunConfig, StreamingMode
from google.adk.models.google_llm import Gemini
from google.adk.plugins.base_plugin import BasePlugin
from google.genai import Client, types

from scripted_server import Reply, ScriptedServer
from test_adk import SHELLS
from tether import Guard, Price, PriceTable
from tether.integrations.adk import TetherPlugin

MODEL = "gemini-2.5-flash"
PRICES = PriceTable({MODEL: Price(input=0.30, output=2.50, cache_read=0.03)})

USAGE = {"promptTokenCount": 10000, "cachedContentTokenCount": 8000,
         "candidatesTokenCount": 150, "thoughtsTokenCount": 50, "totalTokenCount": 10200}  # fmt: skip


def _chunk(text: str, usage: dict[str, int], finish: str | None = None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": [{"text": text}]},
                                 "index": 0}  # fmt: skip
    if finish:
        candidate["finishReason"] = finish
    return {"candidates": [candidate], "usageMetadata": usage, "modelVersion": MODEL}


WHOLE = _chunk("Hello there", USAGE, "STOP")
#: Gemini's stream: every chunk carries the usage so far (the prompt's at once, the output's
#: growing), the last one the whole count
STREAM = [
    _chunk("Hello", {"promptTokenCount": 10000, "cachedContentTokenCount": 8000,
                     "candidatesTokenCount": 1, "thoughtsTokenCount": 50,
                     "totalTokenCount": 10051}),
    _chunk(" there", USAGE, "STOP"),
]  # fmt: skip
#: the same, its usage in a last chunk of its own (no text)
STREAM_TAIL = [
    *(_chunk(t, {"promptTokenCount": 10000, "cachedContentTokenCount": 8000,
                 "totalTokenCount": 10000}) for t in ("Hello", " there")),
    {"candidates": [{"content": {"role": "model", "parts": [{"text": ""}]},
                     "finishReason": "STOP", "index": 0}],
     "usageMetadata": USAGE, "modelVersion": MODEL},
]  # fmt: skip


def _sse(events: list[dict[str, Any]]) -> bytes:
    return "".join(f"data: {json.dumps(e)}\r\n\r\n" for e in events).encode()


class _Closes(BasePlugin):  # type: ignore[misc]
    """Closes the client's async session on the loop that opened it, as the run ends."""

    def __init__(self, client: Client) -> None:
        super().__init__(name="closes")
        self.client = client

    async def after_run_callback(self, *, invocation_context: Any) -> None:
        await self.client.aio.aclose()


def _outcome(server: ScriptedServer, shell: str, stream: bool) -> tuple[Any, ...]:
    client = Client(api_key="test", http_options=types.HttpOptions(base_url=server.url))
    agent = LlmAgent(name="clerk", model=Gemini(model=MODEL, client=client))
    plugin = TetherPlugin(Guard(prices=PRICES))
    mode = StreamingMode.SSE if stream else StreamingMode.NONE
    SHELLS[shell](agent, [plugin, _Closes(client)], "hi", RunConfig(streaming_mode=mode))
    client.close()
    outcome = plugin.last_outcome
    assert outcome is not None
    u = outcome.usage
    return (u.model_calls, u.input_tokens, u.output_tokens, u.cache_write_tokens,
            u.cache_read_tokens, u.cost_usd)  # fmt: skip


@pytest.mark.parametrize("stream", [STREAM, STREAM_TAIL], ids=["usage-growing", "usage-last"])
@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_streamed_gemini_reply_costs_what_the_whole_reply_costs(
    server: ScriptedServer, shell: str, stream: list[dict[str, Any]]
) -> None:
    """Uncached prompt = prompt - cached; output = candidates + thoughts; one model call."""
    price = PRICES.cost(MODEL, 2000, 200, 0, 8000)
    want = (1, 2000, 200, 0, 8000, pytest.approx(price))
    server.script = [Reply(200, WHOLE)]
    assert _outcome(server, shell, stream=False) == want
    server.script = [Reply(200, raw=_sse(stream), content_type="text/event-stream")]
    assert _outcome(server, shell, stream=True) == want
    assert [r.path.split(":")[-1] for r in server.requests] == [
        "generateContent", "streamGenerateContent?alt=sse"]  # fmt: skip
