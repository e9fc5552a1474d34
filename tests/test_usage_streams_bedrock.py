"""Bedrock Converse (Strands): a reply read whole (``converse``) and the same reply streamed
(``converse_stream``, AWS's binary event stream) give one usage and one price, through
Strands' ``BedrockModel`` on the real boto3 client against a loopback server, in Strands'
sync and async shells."""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import pytest
from strands import Agent
from strands.models.bedrock import BedrockModel

from scripted_server import Reply, ScriptedServer
from test_strands import SHELLS
from tether import Guard, Price, PriceTable
from tether.integrations.strands import TetherHooks

MODEL = "us.anthropic.claude-sonnet-4-6"
PRICES = PriceTable({MODEL: Price(input=3.0, output=15.0, cache_write=3.75, cache_read=0.30)})
USAGE = {"inputTokens": 2000, "outputTokens": 200, "totalTokens": 10700,
         "cacheReadInputTokens": 8000, "cacheWriteInputTokens": 500}  # fmt: skip

WHOLE = {"output": {"message": {"role": "assistant", "content": [{"text": "Hello there"}]}},
         "stopReason": "end_turn", "usage": USAGE, "metrics": {"latencyMs": 10}}  # fmt: skip
STREAM = [
    ("messageStart", {"role": "assistant"}),
    ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hello"}}),
    ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": " there"}}),
    ("contentBlockStop", {"contentBlockIndex": 0}),
    ("messageStop", {"stopReason": "end_turn"}),
    ("metadata", {"usage": USAGE, "metrics": {"latencyMs": 10}}),
]


def _frame(event: str, payload: dict[str, Any]) -> bytes:
    """One message of AWS's event stream: prelude, headers, payload, CRC-32s."""
    headers = b""
    for name, value in ((":event-type", event), (":content-type", "application/json"),
                        (":message-type", "event")):  # fmt: skip
        headers += bytes([len(name)]) + name.encode() + b"\x07"
        headers += struct.pack(">H", len(value)) + value.encode()
    body = json.dumps(payload).encode()
    prelude = struct.pack(">II", 16 + len(headers) + len(body), len(headers))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + headers + body
    return message + struct.pack(">I", zlib.crc32(message))


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"),
                        ("AWS_REGION", "us-east-1")):  # fmt: skip
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def _outcome(server: ScriptedServer, shell: str, stream: bool) -> tuple[Any, ...]:
    model = BedrockModel(model_id=MODEL, endpoint_url=server.url, streaming=stream)
    hooks = TetherHooks(Guard(prices=PRICES))
    SHELLS[shell](Agent(model=model, hooks=[hooks], callback_handler=None), "hi")
    outcome = hooks.last_outcome
    assert outcome is not None
    u = outcome.usage
    return (u.model_calls, u.input_tokens, u.output_tokens, u.cache_write_tokens,
            u.cache_read_tokens, u.cost_usd)  # fmt: skip


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_streamed_bedrock_reply_costs_what_the_whole_reply_costs(
    server: ScriptedServer, shell: str
) -> None:
    """inputTokens are the uncached prompt; cache reads and writes beside them."""
    price = PRICES.cost(MODEL, 2000, 200, 500, 8000)
    want = (1, 2000, 200, 500, 8000, pytest.approx(price))
    server.script = [Reply(200, WHOLE)]
    assert _outcome(server, shell, stream=False) == want
    stream = b"".join(_frame(*e) for e in STREAM)
    server.script = [Reply(200, raw=stream, content_type="application/vnd.amazon.eventstream")]
    assert _outcome(server, shell, stream=True) == want
    assert [r.path.rsplit("/", 1)[-1] for r in server.requests] == ["converse", "converse-stream"]
