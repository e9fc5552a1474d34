"""Keep your retry library: tenacity and stamina with tether's classification, against the
real Anthropic SDK (its own retries off) and a scripted server on loopback."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest
import stamina
import tenacity

from scripted_server import Reply, ScriptedServer
from tether.integrations.stamina import retryable
from tether.integrations.tenacity import retry_if_retryable, wait_retry_after

OVERLOADED = Reply(
    529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
)
QUOTA = Reply(429, {"error": {"type": "insufficient_quota", "code": "insufficient_quota",
                              "message": "You exceeded your current quota"}})  # fmt: skip
SLOW_DOWN = Reply(429, {"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}},
                  headers={"retry-after": "2"})  # fmt: skip
OK = Reply(200, {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
                 "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
                 "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}})  # fmt: skip


def ask(server: ScriptedServer) -> Any:
    with anthropic.Anthropic(api_key="test", base_url=server.url, max_retries=0) as client:
        return client.messages.create(model="claude-haiku-4-5", max_tokens=10,
                                      messages=[{"role": "user", "content": "hi"}])  # fmt: skip


def with_tenacity(server: ScriptedServer, slept: list[float]) -> Any:
    @tenacity.retry(retry=retry_if_retryable(), stop=tenacity.stop_after_attempt(4), reraise=True,
                    wait=wait_retry_after(fallback=tenacity.wait_fixed(0.5)), sleep=slept.append)  # fmt: skip
    def call() -> Any:
        return ask(server)

    return call()


def with_stamina(
    server: ScriptedServer, slept: list[float], monkeypatch: pytest.MonkeyPatch
) -> Any:
    monkeypatch.setattr(tenacity.nap.time, "sleep", slept.append)  # stamina sleeps through tenacity

    @stamina.retry(on=retryable, attempts=4, wait_initial=0.5, wait_jitter=0.0, timeout=None)
    def call() -> Any:
        return ask(server)

    return call()


@pytest.mark.parametrize("library", ["tenacity", "stamina"])
def test_always_overloaded_makes_exactly_the_configured_attempts(
    library: str, server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 529 is transient: retried, 4 attempts, then the SDK's own error."""
    server.default = OVERLOADED
    slept: list[float] = []
    run = with_tenacity if library == "tenacity" else lambda s, w: with_stamina(s, w, monkeypatch)
    with pytest.raises(anthropic.APIStatusError):
        run(server, slept)
    assert len(server.requests) == 4
    assert len(slept) == 3


@pytest.mark.parametrize("library", ["tenacity", "stamina"])
def test_a_quota_429_is_tried_once(
    library: str, server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """429 insufficient_quota is not a rate limit: retrying cannot help."""
    server.default = QUOTA
    slept: list[float] = []
    run = with_tenacity if library == "tenacity" else lambda s, w: with_stamina(s, w, monkeypatch)
    with pytest.raises(anthropic.RateLimitError):
        run(server, slept)
    assert len(server.requests) == 1
    assert slept == []


@pytest.mark.parametrize("library", ["tenacity", "stamina"])
def test_retry_after_becomes_the_wait(
    library: str, server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 429 with retry-after: 2 waits 2 s, then the answer."""
    server.script = [SLOW_DOWN]
    server.default = OK
    slept: list[float] = []
    run = with_tenacity if library == "tenacity" else lambda s, w: with_stamina(s, w, monkeypatch)
    assert run(server, slept).content[0].text == "ok"
    assert slept == [2.0]
    assert len(server.requests) == 2


def test_wait_retry_after_caps_and_falls_back() -> None:
    """The cap bounds a server's wish; without one the fallback decides."""
    import tether

    class Slow(Exception):
        status_code = 429
        headers = {"retry-after": "600"}

    wait = wait_retry_after(fallback=tenacity.wait_fixed(0.3), cap=30.0)
    state = tenacity.RetryCallState(retry_object=tenacity.Retrying(), fn=None, args=(), kwargs={})
    state.set_exception((Slow, Slow(), None))
    assert wait(state) == 30.0
    state = tenacity.RetryCallState(retry_object=tenacity.Retrying(), fn=None, args=(), kwargs={})
    state.set_exception((ConnectionError, ConnectionError(), None))
    assert wait(state) == 0.3
    assert retryable(ConnectionError()) is True and retryable(ValueError()) is False
    assert tether.classify(Slow()).retry_after == 600.0
