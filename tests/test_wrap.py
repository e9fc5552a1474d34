"""tether.wrap with the real stripe SDK against a scripted server on loopback."""

from __future__ import annotations

from typing import Any

import pytest
import stripe

import tether
from scripted_server import Reply, ScriptedServer, Seen
from tether import RetryPolicy, VirtualClock


class StripeLike:
    """A scripted Stripe: refunds keyed by Idempotency-Key; can drop the first response."""

    def __init__(self, drop_first: int = 1) -> None:
        self.refunds: dict[str, dict[str, Any]] = {}
        self.drop_first = drop_first
        self.keys: list[str | None] = []

    def __call__(self, seen: Seen) -> Reply:
        if seen.path.startswith("/v1/refunds") and seen.method == "POST":
            key = seen.headers.get("idempotency-key")
            self.keys.append(key)
            if key not in self.refunds:
                self.refunds[str(key)] = {"id": f"re_{len(self.refunds) + 1}", "object": "refund",
                                          "amount": 500, "status": "succeeded"}  # fmt: skip
                if self.drop_first > 0:
                    self.drop_first -= 1
                    return Reply(drop=True)  # committed, but the response is lost
            return Reply(200, self.refunds[str(key)])
        return Reply(404, {"error": {"type": "invalid_request_error", "message": "no such route"}})


def client(server: ScriptedServer) -> stripe.StripeClient:
    return stripe.StripeClient(
        "sk_test_123", base_addresses={"api": server.url}, max_network_retries=0
    )


def test_without_tether_a_lost_response_means_an_error(server: ScriptedServer) -> None:
    """The raw SDK with retries off: the refund committed and the caller saw an error."""
    fake = StripeLike()
    server.handler = fake
    with pytest.raises(stripe.APIConnectionError):
        client(server).v1.refunds.create(params={"charge": "ch_1"})
    assert len(fake.refunds) == 1


def test_wrap_retries_with_one_idempotency_key(server: ScriptedServer) -> None:
    """Commit, drop the connection, retry with the same key: exactly one refund exists."""
    fake = StripeLike()
    server.handler = fake
    wrapped = tether.wrap(client(server), connector="stripe", retryable=["refunds.create"],
                          policy=RetryPolicy(max_attempts=3, clock=VirtualClock()))  # fmt: skip
    refund = wrapped.v1.refunds.create(params={"charge": "ch_1"})
    assert refund.id == "re_1"
    assert len(fake.refunds) == 1
    assert len(fake.keys) == 2
    assert fake.keys[0] == fake.keys[1]
    assert fake.keys[0] is not None
    meta = tether.wrap_last_call()
    assert meta is not None
    assert (meta.method, meta.attempts, meta.idempotency_key) == (
        "v1.refunds.create",
        2,
        fake.keys[0],
    )


def test_non_whitelisted_methods_pass_straight_through(server: ScriptedServer) -> None:
    """A method not in retryable is called once, with no key added."""
    fake = StripeLike()
    server.handler = fake
    wrapped = tether.wrap(client(server), connector="stripe", retryable=["charges.create"],
                          policy=RetryPolicy(max_attempts=3, clock=VirtualClock()))  # fmt: skip
    with pytest.raises(stripe.APIConnectionError):
        wrapped.v1.refunds.create(params={"charge": "ch_1"})
    assert len(fake.keys) == 1


def test_model_reissue_with_fresh_uuid_is_deduplicated_by_the_ledger(
    server: ScriptedServer,
) -> None:
    """With a ledger the key is the intent: a re-issue with a new uuid gets the same refund."""
    fake = StripeLike(drop_first=0)
    server.handler = fake
    ledger = tether.Ledger.memory()
    wrapped = tether.wrap(client(server), connector="stripe", retryable=["refunds.create"],
                          ledger=ledger, policy=RetryPolicy(max_attempts=3, clock=VirtualClock()))  # fmt: skip
    first = wrapped.v1.refunds.create(params={"charge": "ch_1", "uuid": "a1"})
    second = wrapped.v1.refunds.create(params={"charge": "ch_1", "uuid": "b2"})
    assert len(fake.refunds) == 1
    assert len(fake.keys) == 1
    assert second["id"] == first.id
    # a field deeper in the request is data: another metadata id is another refund
    wrapped.v1.refunds.create(params={"charge": "ch_1", "metadata": {"uuid": "order-9"}})
    assert len(fake.refunds) == 2


def test_unknown_connector_is_a_clear_error() -> None:
    """An unknown connector names the valid ones."""
    with pytest.raises(ValueError, match="connector must be one of"):
        tether.wrap(object(), connector="fax")
    with pytest.raises(TypeError, match="list of method paths"):
        tether.wrap(object(), connector="stripe", retryable="refunds.create")


def test_httpx_connector_retries_an_error_status(server: ScriptedServer) -> None:
    """httpx returns a 503 instead of raising: the connector retries it, with one key."""
    import httpx

    from scripted_server import Reply

    server.script = [
        Reply(503, {"error": "busy"}),
        Reply(503, {"error": "busy"}),
        Reply(200, {"ok": True}),
    ]
    with httpx.Client(base_url=server.url) as raw:
        wrapped = tether.wrap(raw, connector="httpx", retryable=["post"],
                              policy=RetryPolicy(max_attempts=3, clock=VirtualClock()))  # fmt: skip
        response = wrapped.post("/refunds", json={"charge": "ch_1"})
    assert (response.status_code, response.json()) == (200, {"ok": True})
    assert len(server.requests) == 3
    assert len({r.headers.get("idempotency-key") for r in server.requests}) == 1


def test_httpx_connector_returns_the_final_response_and_never_retries_a_400(
    server: ScriptedServer,
) -> None:
    """Retries spent: the last response comes back; a 400 is returned at once."""
    import httpx

    from scripted_server import Reply

    server.default = Reply(503, {"error": "busy"})
    with httpx.Client(base_url=server.url) as raw:
        wrapped = tether.wrap(raw, connector="httpx", retryable=["post"],
                              policy=RetryPolicy(max_attempts=2, clock=VirtualClock()))  # fmt: skip
        assert wrapped.post("/refunds").status_code == 503
        assert len(server.requests) == 2
        server.default = Reply(400, {"error": "bad"})
        assert wrapped.post("/refunds").status_code == 400
    assert len(server.requests) == 3
