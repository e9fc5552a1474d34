"""``tether serve``: every page and action over HTTP (the ASGI test client), the token and
CSRF refusals, and a real headless Chromium resolving a case in the inbox."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from starlette.testclient import TestClient

import tether
from tether import Guard, Records, ToolError
from tether.cli import main
from tether.serve import create_app
from tether.stores.redis._store import RedisStore

SECRET = "sk-live-" + "4f9a8b7c6d5e4f3a2b1c0d9e"


class World:
    """Records with one run of each kind: a success, an escalation, a pending approval, a
    dead letter; plus what the tools did."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.records = Records.sqlite(self.path)
        self.guard = Guard(records=self.records, retry=tether.RetryPolicy(base=0.01, cap=0.02))
        self.refunds: list[dict[str, Any]] = []
        self.replayed: list[dict[str, Any]] = []
        with self.guard.start(task="look up invoice 99") as run:
            run.proceed()
            run.record_model_call(model="claude-sonnet-4-6", input_tokens=1200, output_tokens=80)
            run.call_tool("search", lambda q: {"hits": 1}, {"q": "invoice 99"})
            run.succeed({"invoice": 99})
        with self.guard.start(task="<script>alert('x')</script> angry customer") as run:
            run.proceed()
            run.call_tool("search", lambda q: {"hits": 0}, {"q": "order 7"})
            run.escalate("the customer asked for a person")
        self.escalated = run.outcome
        with self.guard.start(task="refund order A-1") as run:
            run.proceed()
            self.refund(run)
        self.awaiting = run.outcome
        with self.guard.start(task="charge card") as run:

            def charge(customer: str, api_key: str) -> None:
                raise PermissionError("card declined")

            try:
                run.call_tool(
                    "charge", charge, {"customer": "c_1", "api_key": SECRET}, idempotent=False
                )
            except ToolError:
                pass
            run.fail("the card was declined")
        self.letter = self.records.dead_letters.list()[0]

    def refund(self, run: tether.Run) -> Any:
        def issue_refund(order: str, amount: int) -> dict[str, Any]:
            self.refunds.append({"order": order, "amount": amount})
            return {"id": f"re_{len(self.refunds)}"}

        return run.call_tool("issue_refund", issue_refund, {"order": "A-1", "amount": 9000},
                             idempotent=False, requires_approval=True)  # fmt: skip

    def replay_handler(self, customer: str, api_key: str = "", redacted: Any = None) -> str:
        self.replayed.append({"customer": customer, "redacted": redacted})
        return "charged"

    def close(self) -> None:
        self.records.close()
        self.guard.ledger.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path / "records.db")
    yield w
    w.close()


BASE = "http://127.0.0.1:8765"


def client(world: World, **options: Any) -> TestClient:
    """A browser on the page: its actions carry the page's own Origin, as a browser's do."""
    options.setdefault("handler", world.replay_handler)
    return TestClient(create_app(world.records, **options), base_url=BASE, headers={"origin": BASE})


def form_token(c: Any, page: str = "/inbox") -> str:
    """The CSRF token of a page's forms (it comes with the page, with its cookie)."""
    found = re.search(r'name="csrf" value="([^"]+)"', c.get(page).text)
    assert found, f"{page} has no form with a CSRF token"
    return found.group(1)


def post(c: TestClient, path: str, **form: str) -> Any:
    return c.post(path, data={"csrf": form_token(c), **form}, follow_redirects=False)


# --- pages --------------------------------------------------------------------------------------


def test_every_page_renders_what_the_records_hold(world: World) -> None:
    c = client(world)
    runs = c.get("/runs")
    assert runs.status_code == 200
    for words in (
        "look up invoice 99",
        "refund order A-1",
        "awaiting_approval",
        "escalated",
        "$0.0048",
    ):
        assert words in runs.text
    assert "&lt;script&gt;" in runs.text and "<script>alert" not in runs.text  # escaped
    only = c.get("/runs", params={"status": "escalated"}).text
    assert "angry customer" in only and "look up invoice 99" not in only
    assert "charge card" in c.get("/runs", params={"reason": "failed"}).text

    run = c.get(f"/runs/{world.escalated.run_id}").text
    for words in ("the customer asked for a person", "search", world.escalated.customer_message[:40],
                  world.escalated.handoff.id):  # fmt: skip
        assert words in run
    assert c.get("/runs/run_nope").status_code == 404

    inbox = c.get("/inbox").text
    assert "issue_refund" in inbox and "9000" in inbox and "angry customer" in inbox
    letters = c.get("/dead-letters").text
    assert "charge" in letters and "card declined" in letters
    letter = c.get(f"/dead-letters/{world.letter.id}").text
    assert "args.api_key" in letter and SECRET not in letter
    assert "--redis" in c.get("/breakers").text
    assert c.get("/", follow_redirects=False).headers["location"] == "/runs"


def test_values_are_redacted_again_when_shown(world: World) -> None:
    doc = {"run_id": "run_old", "task": f"old record with {SECRET}", "status": "failed", "reason": "error",
           "steps": 1, "cost_usd": 0, "seconds": 1, "open_issues": [], "ended_at": time.time(),
           "usage": {}, "transcript": [], "partial": [], "customer_message": "", "detail": ""}  # fmt: skip
    world.records.store.put("run", "run_old", doc, time.time())  # written by an old version
    old = Records.sqlite(world.path)  # opening the database indexes the runs it finds
    try:
        page = TestClient(create_app(old), base_url="http://127.0.0.1").get("/runs").text
        assert "old record with" in page and SECRET not in page
        assert SECRET not in client(world).get("/runs/run_old").text
    finally:
        old.close()


# --- actions ------------------------------------------------------------------------------------


def test_a_case_is_claimed_then_resolved(world: World) -> None:
    c = client(world)
    handoff = world.escalated.handoff.id
    assert post(c, f"/handoffs/{handoff}/claim", by="alice").status_code == 303
    assert world.records.handoffs.get(handoff)["claimed_by"] == "alice"
    response = post(c, f"/handoffs/{handoff}/resolve", by="alice", note="called the customer back")
    assert response.status_code == 303
    doc = world.records.handoffs.get(handoff)
    assert (doc["state"], doc["resolution"]) == ("resolved", "called the customer back")
    assert "Resolved by alice: called the customer back" in c.get("/inbox").text
    assert post(c, f"/handoffs/{handoff}/resolve", by="bob", note="again").status_code == 400
    assert post(c, f"/handoffs/{handoff}/claim", by="").status_code == 400


def test_an_approval_from_the_page_lets_the_resumed_run_pay_once(world: World) -> None:
    c = client(world)
    pending = world.awaiting.pending_approval
    assert post(c, f"/approvals/{pending['id']}/approve", by="alice", note="ok").status_code == 303
    with world.guard.resume(world.awaiting.checkpoint_id) as run:
        run.succeed(world.refund(run))
    assert len(world.refunds) == 1 and run.outcome.status == "success"
    assert post(c, f"/approvals/{pending['id']}/reject", by="bob").status_code == 400  # decided
    assert "used" in c.get("/inbox").text


def test_a_rejection_from_the_page_reaches_the_model(world: World) -> None:
    c = client(world)
    pending = world.awaiting.pending_approval
    assert (
        post(c, f"/approvals/{pending['id']}/reject", by="bob", note="too large").status_code == 303
    )
    with (
        world.guard.resume(world.awaiting.checkpoint_id) as run,
        pytest.raises(ToolError, match="too large"),
    ):
        world.refund(run)
    assert world.refunds == []
    assert post(c, f"/approvals/{pending['id']}/approve", by="").status_code == 400


def test_a_dead_letter_is_replayed_at_most_once(world: World) -> None:
    c = client(world)
    path = f"/dead-letters/{world.letter.id}/replay"
    assert post(c, path, by="dana").status_code == 303
    first = world.records.dead_letters.get(world.letter.id)
    assert post(c, path, by="erin").status_code == 303  # a second click, by someone else
    assert [r["redacted"] for r in world.replayed] == [["args.api_key"]]
    again = world.records.dead_letters.get(world.letter.id)  # not run: the letter unchanged
    assert (again.replayed_by, again.replayed_at) == ("dana", first.replayed_at)
    page = c.get(f"/dead-letters/{world.letter.id}").text
    assert "replayed" in page and "The handler returned" in page and "charged" in page


def test_a_replay_says_who_ran_it_and_closes_the_runs_case_linked_both_ways(world: World) -> None:
    """A replay asks who runs it; once its handler ran, the letter says so, and the case of
    its run is resolved by that person, the letter and the case linking each other (#45)."""
    with world.guard.start(task="charge card, then a person") as run:

        def charge(customer: str) -> None:
            raise PermissionError("card declined")

        try:
            run.call_tool("charge", charge, {"customer": "c_2"}, idempotent=False)
        except ToolError:
            pass
        run.escalate("the card was declined")
    case = run.outcome.handoff.id
    letter = next(x for x in world.records.dead_letters.list() if x.run_id == run.outcome.run_id)
    c = client(world, handler=lambda customer: "charged")
    path = f"/dead-letters/{letter.id}"
    page = c.get(path).text
    assert f'href="/inbox#{case}"' in page and "open" in page
    assert post(c, path + "/replay").status_code == 400  # nobody named: nothing runs
    assert world.records.handoffs.get(case)["state"] == "open"
    assert post(c, path + "/replay", by="dana").status_code == 303
    page = c.get(path).text
    assert "replayed</span> by dana" in page and "resolved by dana" in page
    assert world.records.dead_letters.get(letter.id).replayed_by == "dana"
    closed = world.records.handoffs.get(case)
    assert (closed["state"], closed["resolved_by"], closed["dead_letter"]) == (
        "resolved",
        "dana",
        letter.id,
    )
    assert f'href="/dead-letters/{letter.id}"' in c.get("/inbox").text


def test_a_runs_page_shows_its_conversation_redacted(world: World, server: Any) -> None:
    """The run's page shows the conversation an agent loop had, redacted as every value on
    the page (#45): the customer's words, the tool call, the model's answer."""
    import anthropic

    from scripted_server import Reply
    from tether.integrations import anthropic as t_anthropic

    def reply(content: list[dict[str, Any]], stop: str) -> Reply:
        return Reply(200, {"id": "m", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
                           "content": content, "stop_reason": stop, "stop_sequence": None,
                           "usage": {"input_tokens": 10, "output_tokens": 5}})  # fmt: skip

    use = {"type": "tool_use", "id": "tu_1", "name": "lookup", "input": {"order": "A-7"}}
    server.script = [reply([use], "tool_use"),
                     reply([{"type": "text", "text": "Order A-7 ships Monday."}], "end_turn")]  # fmt: skip
    ask = f"Where is order A-7? my api key is {SECRET}"
    tools = [tether.Tool("lookup", lambda order: {"ships": "Monday"})]
    with anthropic.Anthropic(api_key="t", base_url=server.url) as raw:
        out = t_anthropic.run_agent(raw, model="claude-haiku-4-5", tools=tools, guard=world.guard,
                                    messages=[{"role": "user", "content": ask}])  # fmt: skip
    assert out.status == "success"
    page = client(world).get(f"/runs/{out.run_id}").text
    talk = page[page.index('id="conversation"') :]
    for words in (
        "Where is order A-7?",
        "lookup",
        "A-7",
        "ships",
        "Order A-7 ships Monday.",
        "assistant",
    ):
        assert words in talk
    assert SECRET not in page
    assert "The conversation" not in client(world).get(f"/runs/{world.escalated.run_id}").text


def test_the_runs_say_which_agent_or_framework_filed_them(world: World) -> None:
    """Each run names who started it: a framework's adapter, or the agent's own module (#45)."""
    adapter: dict[str, Any] = {"__name__": "tether.integrations.langchain", "guard": world.guard}
    exec(
        "def start():\n    with guard.start(task='from the middleware') as run:\n        run.succeed(1)\n    return run",
        adapter,
    )
    framework_run = adapter["start"]()
    c = client(world)
    rows = {
        m.group(1): m.group(2)
        for m in re.finditer(
            r'href="/runs/([^"]+)">[^<]*</a></td>\s*<td class="muted">([^<]*)</td>',
            c.get("/runs").text,
        )
    }
    assert rows[framework_run.run_id] == "langchain"
    assert rows[world.escalated.run_id] == "test_serve"  # this test module started it
    assert "filed by langchain" in c.get(f"/runs/{framework_run.run_id}").text


def test_the_overview_shows_the_last_hour(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """On-call's first question: what ended in the last hour, by status and stop reason (#45)."""
    page = client(world).get("/overview").text
    start = page.index('id="last-hour"')
    hour = page[start : page.index("\n</div>", start)]
    for words in ("success 1", "escalated 1", "awaiting_approval 1", "failed 1", "escalated</a> 1",
                  "charge</a> 1/1"):  # fmt: skip
        assert words in hour
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 2 * 3600)  # the page's clock, 2 h on
    later = client(world).get("/overview").text
    assert "No run ended in the last hour." in later


def test_a_failed_replay_shows_its_error_and_can_be_replayed_once_fixed(world: World) -> None:
    calls = []

    def broken(customer: str, api_key: str = "", redacted: Any = None) -> str:
        calls.append("broken")
        raise RuntimeError("the payment service said no")

    path = f"/dead-letters/{world.letter.id}"
    c = client(world, handler=broken)
    assert post(c, path + "/replay", by="dana").status_code == 303 and calls == ["broken"]
    page = c.get(path).text
    assert "The handler failed" in page and "the payment service said no" in page
    assert "Replay once" in page  # a failed replay can be replayed again
    fixed = client(world)
    assert post(fixed, path + "/replay", by="dana").status_code == 303
    assert "The handler returned" in fixed.get(path).text and len(world.replayed) == 1


def test_a_handler_that_cannot_fill_redacted_fields_is_refused(world: World) -> None:
    def careless(customer: str, api_key: str = "") -> None:
        world.replayed.append({"customer": customer})

    c = client(world, handler=careless)
    response = post(c, f"/dead-letters/{world.letter.id}/replay", by="dana")
    assert response.status_code == 400 and "redacted" in response.text
    assert world.replayed == []
    no_handler = client(world, handler=None)
    assert "Replay is off" in no_handler.get("/dead-letters").text
    assert post(no_handler, f"/dead-letters/{world.letter.id}/replay", by="dana").status_code == 400


def test_breakers_from_redis_can_be_forced_open_and_closed(world: World, redis_url: str) -> None:
    store = RedisStore(redis_url, prefix=f"t_{uuid.uuid4().hex[:8]}")
    try:
        breaker = tether.CircuitBreaker("payments", failure_threshold=2, store=store)
        for _ in range(2):
            with pytest.raises(ConnectionError):
                breaker.call(lambda: (_ for _ in ()).throw(ConnectionError("down")))
        c = client(world, redis=store)
        page = c.get("/breakers").text
        assert "payments" in page and 'pill open">open' in page
        assert post(c, "/breakers/payments/close").status_code == 303
        assert store.breaker_state("payments", time.time())[0] == "closed"
        assert post(c, "/breakers/payments/open", seconds="120").status_code == 303
        state, retry_at = store.breaker_state("payments", time.time())
        assert state == "open" and 100 < retry_at - time.time() <= 120
        assert post(c, "/breakers/payments/open", seconds="-1").status_code == 400
    finally:
        store.reset()
        store.close()


# --- safety -------------------------------------------------------------------------------------


def test_a_token_is_required_when_configured(world: World) -> None:
    c = client(world, token="s3cret-token")
    assert c.get("/runs").status_code == 401
    assert c.get("/runs", params={"token": "wrong"}).status_code == 401
    hop = c.get("/runs", params={"token": "s3cret-token"}, follow_redirects=False)
    assert hop.status_code == 303 and "token" not in hop.headers["location"]
    assert c.get("/runs").status_code == 200  # the cookie carries it now
    bearer = client(world, token="s3cret-token")
    assert bearer.get("/inbox", headers={"authorization": "Bearer s3cret-token"}).status_code == 200
    stranger = client(world, token="s3cret-token")
    assert (
        stranger.post(f"/handoffs/{world.escalated.handoff.id}/claim", data={"by": "x"}).status_code
        == 401
    )


def test_state_changes_need_the_csrf_token_and_this_origin(world: World) -> None:
    c = client(world)
    handoff = world.escalated.handoff.id
    csrf = form_token(c)
    assert c.post(f"/handoffs/{handoff}/claim", data={"by": "mallory"}).status_code == 403
    assert (
        c.post(f"/handoffs/{handoff}/claim", data={"by": "m", "csrf": "forged"}).status_code == 403
    )
    # the cookie's own value is not the token (a page that can set cookies cannot forge it)
    cookie = c.cookies.get("tether_csrf") or ""
    assert cookie and cookie != csrf
    assert c.post(f"/handoffs/{handoff}/claim", data={"by": "m", "csrf": cookie}).status_code == 403
    cross = c.post(f"/handoffs/{handoff}/claim", data={"by": "m", "csrf": csrf},
                   headers={"origin": "https://evil.example"})  # fmt: skip
    assert cross.status_code == 403
    # a token from another process (another secret) is not this one's
    other = client(world)
    assert form_token(other) != csrf
    assert c.get(f"/handoffs/{handoff}/claim").status_code == 405  # never a GET
    assert world.records.handoffs.get(handoff)["state"] == "open"


def test_a_foreign_host_is_refused_over_asgi(world: World) -> None:
    """DNS rebinding: a page reached through another name gets nothing, not even a CSRF token."""
    pending = world.awaiting.pending_approval["id"]
    for base in ("http://rebound.example:8765", "http://127.0.0.1.nip.io:8765", "http://evil"):
        c = TestClient(create_app(world.records), base_url=base)
        for path in ("/", "/runs", "/inbox", f"/runs/{world.escalated.run_id}", "/dead-letters"):
            page = c.get(path, follow_redirects=False)
            assert page.status_code == 400 and "tether_csrf" not in page.headers.get(
                "set-cookie", ""
            )
        c.cookies.set("tether_csrf", "x")
        forged = c.post(f"/approvals/{pending}/approve", data={"by": "attacker", "csrf": "x"})
        assert forged.status_code == 400
    assert world.records.approvals.get(pending).status == "pending"
    for base in ("http://127.0.0.1:8765", "http://localhost:8765", "http://[::1]:8765"):
        assert TestClient(create_app(world.records), base_url=base).get("/runs").status_code == 200


def test_with_a_token_only_the_allowed_hosts_are_served(world: World) -> None:
    app = create_app(world.records, token="s3cret-token", allowed_hosts=["Ops.Example.com"])
    ops = TestClient(app, base_url="https://ops.example.com")
    assert ops.get("/runs", headers={"authorization": "Bearer s3cret-token"}).status_code == 200
    other = TestClient(app, base_url="https://rebound.example")
    assert other.get("/runs", headers={"authorization": "Bearer s3cret-token"}).status_code == 400
    assert other.get("/runs", params={"token": "s3cret-token"}).status_code == 400  # no hop either
    hop = ops.get(
        "/runs", params={"token": "s3cret-token", "status": "failed"}, follow_redirects=False
    )
    assert hop.status_code == 303 and hop.headers["location"] == "/runs?status=failed"  # relative
    with pytest.raises(ValueError, match="needs a token"):
        create_app(world.records, allowed_hosts=["ops.example.com"])
    for bad in ("*", "*.example.com", "ops.example.com:8765", "https://ops.example.com", "a b"):
        with pytest.raises(ValueError, match="allowed host"):
            create_app(world.records, token="t", allowed_hosts=[bad])


def test_an_action_must_come_from_the_exact_origin_of_the_page(world: World) -> None:
    """Scheme, host name and port: the Origin (or, without one, the Referer) must be the
    origin the request was sent to; a request with neither is refused."""
    handoff = world.escalated.handoff.id
    c = TestClient(create_app(world.records), base_url=BASE)
    csrf = form_token(c)
    path = f"/handoffs/{handoff}/claim"
    for origin in (
        "http://rebound.example:8765",
        "null",
        "http://127.0.0.1.evil.example",
        "http://127.0.0.1:3000",  # another port of this host
        "http://127.0.0.1",  # port 80
        "https://127.0.0.1:8765",  # another scheme
        "http://localhost:8765",  # another name of this host: another origin
        "http://127.0.0.1:99999",
        "",
    ):
        refused = c.post(path, data={"by": "m", "csrf": csrf}, headers={"origin": origin})
        assert refused.status_code == 403, origin
    for referer in ("http://127.0.0.1:3000/attack.html", "http://localhost:8765/inbox"):
        refused = c.post(path, data={"by": "m", "csrf": csrf}, headers={"referer": referer})
        assert refused.status_code == 403, referer
    neither = c.post(path, data={"by": "m", "csrf": csrf})
    assert neither.status_code == 403 and "neither Origin nor Referer" in neither.text
    assert world.records.handoffs.get(handoff)["state"] == "open"
    by_referer = c.post(path, data={"by": "bob", "csrf": csrf},
                        headers={"referer": f"{BASE}/inbox"}, follow_redirects=False)  # fmt: skip
    assert by_referer.status_code == 303
    assert world.records.handoffs.get(handoff)["claimed_by"] == "bob"
    resolved = c.post(
        f"/handoffs/{handoff}/resolve",
        data={"by": "bob", "note": "done", "csrf": csrf},
        headers={"origin": "HTTP://127.0.0.1:8765"},  # the same origin, spelt otherwise
        follow_redirects=False,
    )
    assert (
        resolved.status_code == 303 and world.records.handoffs.get(handoff)["state"] == "resolved"
    )


def raw_http(port: int, request: bytes) -> bytes:
    """One request as bytes on a socket (``Connection: close``: read to the end)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_a_foreign_host_is_refused_over_raw_http(world: World, live: str) -> None:
    """The attack as a rebound browser sends it: a real uvicorn, a foreign Host header."""
    port = int(live.rsplit(":", 1)[1])
    foreign = raw_http(
        port,
        f"GET /inbox HTTP/1.1\r\nHost: rebound.example:{port}\r\n"
        "Connection: close\r\n\r\n".encode(),
    )
    assert foreign.startswith(b"HTTP/1.1 400") and b"issue_refund" not in foreign
    assert b"tether_csrf" not in foreign
    pending = world.awaiting.pending_approval["id"]
    body = b"by=attacker&csrf=x"
    approve = raw_http(
        port,
        f"POST /approvals/{pending}/approve HTTP/1.1\r\n"
        f"Host: rebound.example:{port}\r\nOrigin: http://rebound.example:{port}\r\n"
        "Cookie: tether_csrf=x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body,
    )
    assert approve.startswith(b"HTTP/1.1 400")
    assert world.records.approvals.get(pending).status == "pending"
    ours = raw_http(
        port, f"GET /inbox HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode()
    )
    assert ours.startswith(b"HTTP/1.1 200") and b"issue_refund" in ours


def cross_port_post(port: int, path: str, body: str, cookies: dict[str, str], **head: str) -> bytes:
    """A form POST as a browser sends it from a page on another port of this host: to
    ``localhost:port``, with the operator's cookies (cookies are not kept apart by port)
    and the cookies that page set for ``localhost`` itself."""
    lines = [f"POST {path} HTTP/1.1", f"Host: localhost:{port}"]
    lines += [f"{name.title()}: {value}" for name, value in head.items()]
    lines += [
        "Cookie: " + "; ".join(f"{k}={v}" for k, v in cookies.items()),
        "Content-Type: application/x-www-form-urlencoded",
        f"Content-Length: {len(body.encode())}",
        "Connection: close",
    ]
    return raw_http(port, ("\r\n".join(lines) + "\r\n\r\n" + body).encode())


@pytest.mark.parametrize("token", [None, "s3cret-token"])
def test_a_page_on_another_port_of_this_host_cannot_act(
    world: World, redis_url: str, token: str | None
) -> None:
    """A page on localhost:OTHER, in the operator's browser (which holds the page's
    cookies, and the token's), submits forms to the page on localhost:PORT: it cannot
    force the payments breaker open nor approve a payment, whatever CSRF cookie it sets
    and whatever Origin or Referer it carries; the operator's own form still acts."""
    import httpx

    store = RedisStore(redis_url, prefix=f"t_{uuid.uuid4().hex[:8]}")
    pending = world.awaiting.pending_approval["id"]
    try:
        breaker = tether.CircuitBreaker("payments", failure_threshold=2, store=store)
        breaker.call(lambda: "ok")
        with contextlib.ExitStack() as stack:
            base = stack.enter_context(serving(world, redis=store, token=token))
            port = int(base.rsplit(":", 1)[1])
            ours = f"http://localhost:{port}"
            operator = stack.enter_context(
                httpx.Client(base_url=ours, headers={"origin": ours}, timeout=10)
            )
            if token is not None:
                assert operator.get("/runs", params={"token": token}).status_code == 303
            csrf = form_token(operator)
            jar = dict(operator.cookies.items())
            assert "tether_csrf" in jar and (token is None or "tether_token" in jar)
            other = f"http://localhost:{free_port()}"
            attacks = [
                ({"origin": other}, {**jar, "tether_csrf": "x"}, "x"),  # cookie it set itself
                ({"origin": other}, jar, jar["tether_csrf"]),  # the cookie's value, guessed
                ({"origin": other, "referer": f"{ours}/breakers"}, jar, "x"),
                ({"referer": f"{other}/attack.html"}, {**jar, "tether_csrf": "x"}, "x"),
                ({}, {**jar, "tether_csrf": "x"}, "x"),  # Origin and Referer withheld
                ({"origin": ours}, {**jar, "tether_csrf": "x"}, "x"),  # a script's own Origin
                ({"origin": "null"}, {**jar, "tether_csrf": "x"}, "x"),  # a sandboxed frame
            ]
            for head, cookies, token_sent in attacks:
                opened = cross_port_post(
                    port, "/breakers/payments/open", f"seconds=86400&csrf={token_sent}",
                    cookies, **head,
                )  # fmt: skip
                approved = cross_port_post(
                    port, f"/approvals/{pending}/approve", f"by=mallory&csrf={token_sent}",
                    cookies, **head,
                )  # fmt: skip
                assert opened.startswith(b"HTTP/1.1 403"), (head, opened[:200])
                assert approved.startswith(b"HTTP/1.1 403"), (head, approved[:200])
            assert store.breaker_state("payments", time.time())[0] == "closed"
            assert world.records.approvals.get(pending).status == "pending"
            # the operator's own form, from the page's own origin, still acts
            opened = operator.post("/breakers/payments/open", data={"seconds": "60", "csrf": csrf})
            assert opened.status_code == 303
            assert store.breaker_state("payments", time.time())[0] == "open"
            approved = operator.post(
                f"/approvals/{pending}/approve", data={"by": "alice", "csrf": csrf}
            )
            assert approved.status_code == 303
            assert world.records.approvals.get(pending).status == "approved"
    finally:
        store.reset()
        store.close()


def test_a_connection_that_sends_no_request_head_is_closed(world: World) -> None:
    """Half-open connections (nothing, or a partial head) are dropped after the header
    deadline; the page still answers meanwhile and afterwards."""
    with serving(world, header_timeout=0.5) as base:
        port = int(base.rsplit(":", 1)[1])
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(10)]
        partial = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(10)]
        for s in partial:
            s.sendall(b"GET /runs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        import httpx

        assert httpx.get(base + "/runs").status_code == 200
        time.sleep(1.0)
        for s in partial:
            s.sendall(b"1")  # too late: the server closed it
        for s in idle + partial:
            assert s.recv(1024) == b"", "the server still holds a connection with no request head"
            s.close()
        assert httpx.get(base + "/runs").status_code == 200


class Gate:
    """A pause inside the page's work: ``entered`` once it waits, ``release()`` to go on."""

    def __init__(self) -> None:
        self.entered, self.go = threading.Event(), threading.Event()

    def wait(self) -> None:
        self.entered.set()
        assert self.go.wait(20), "the gate was never released"

    def release(self) -> None:
        self.go.set()


def answers_while(base: str, gate: Gate, slow: Callable[[], Any]) -> None:
    """Start ``slow`` (it stops at the gate); /runs must answer meanwhile."""
    import httpx

    worker = threading.Thread(target=slow, daemon=True)
    worker.start()
    try:
        assert gate.entered.wait(10), "the slow request never reached the gate"
        assert httpx.get(base + "/runs", timeout=5).status_code == 200
        assert worker.is_alive()  # the slow one still waits: /runs did not queue behind it
    finally:
        gate.release()
        worker.join(10)


@pytest.mark.parametrize("token", [None, "s3cret-token"])
def test_half_open_connections_never_keep_the_operator_out(world: World, token: str | None) -> None:
    """Far more connections than the limit each send nothing or half a request head and
    hold (within the header deadline): the operator's own requests still get their pages,
    not 503, and a request being served when they came (a slow replay) is never cut."""
    import httpx

    from tether.serve._server import LIMIT_CONCURRENCY

    gate = Gate()

    def slow_handler(customer: str, api_key: str = "", redacted: Any = None) -> str:
        gate.wait()
        return "charged"

    auth = {"authorization": f"Bearer {token}"} if token else {}
    with contextlib.ExitStack() as stack:
        base = stack.enter_context(serving(world, token=token, handler=slow_handler))
        operator = stack.enter_context(
            httpx.Client(base_url=base, headers={"origin": base, **auth}, timeout=20)
        )
        csrf = form_token(operator)
        replay: dict[str, Any] = {}
        worker = threading.Thread(
            target=lambda: replay.setdefault(
                "response",
                operator.post(
                    f"/dead-letters/{world.letter.id}/replay", data={"csrf": csrf, "by": "dana"}
                ),
            ),
            daemon=True,
        )
        worker.start()
        try:
            assert gate.entered.wait(10), "the replay never reached its handler"
            port = int(base.rsplit(":", 1)[1])
            held = []
            for n in range(2 * LIMIT_CONCURRENCY):
                s = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
                if n % 2:
                    s.sendall(b"GET /runs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                held.append(s)
            time.sleep(0.3)  # every one of them accepted and waiting
            for _ in range(5):
                with httpx.Client(base_url=base, headers=auth, timeout=10) as another:
                    assert another.get("/runs").status_code == 200
                    assert another.get("/inbox").status_code == 200
        finally:
            gate.release()
            worker.join(10)
        assert replay["response"].status_code == 303  # the replay in progress was kept
        assert world.records.dead_letters.get(world.letter.id).replayed
        # the oldest of the connections with no request head made room for the operator
        for s in held[:4]:
            try:
                assert s.recv(1024) == b"", "the oldest half-open connection is still held"
            except ConnectionResetError:
                pass  # closed with its half head unread: a reset


def test_a_slow_database_read_never_blocks_the_other_requests(world: World) -> None:
    """Database reads run in worker threads: while one page waits on the database, /runs answers."""
    import httpx

    gate, store = Gate(), world.records.store
    plain_get = store.get

    def slow_get(kind: str, doc_id: str) -> str | None:
        if doc_id == world.escalated.run_id:
            gate.wait()
        return plain_get(kind, doc_id)

    store.get = slow_get  # type: ignore[method-assign]
    try:
        with serving(world) as base:
            answers_while(
                base, gate, lambda: httpx.get(f"{base}/runs/{world.escalated.run_id}", timeout=30)
            )
    finally:
        store.get = plain_get  # type: ignore[method-assign]


def test_a_slow_replay_handler_never_blocks_the_other_requests(world: World) -> None:
    import httpx

    gate = Gate()

    def slow_handler(customer: str, api_key: str = "", redacted: Any = None) -> str:
        gate.wait()
        return "charged"

    with (
        serving(world, handler=slow_handler) as base,
        httpx.Client(base_url=base, timeout=30, headers={"origin": base}) as c,
    ):
        csrf = form_token(c)
        answers_while(
            base,
            gate,
            lambda: c.post(
                f"/dead-letters/{world.letter.id}/replay", data={"csrf": csrf, "by": "dana"}
            ),
        )


def test_a_replay_while_another_runs_says_it_is_being_replayed(world: World) -> None:
    import httpx

    gate = Gate()
    calls: list[str] = []

    def slow_handler(customer: str, api_key: str = "", redacted: Any = None) -> str:
        calls.append(customer)
        gate.wait()
        return "charged"

    with (
        serving(world, handler=slow_handler) as base,
        httpx.Client(base_url=base, timeout=30, headers={"origin": base}) as c,
    ):
        csrf = form_token(c)
        path = f"/dead-letters/{world.letter.id}/replay"
        form = {"csrf": csrf, "by": "dana"}
        first = threading.Thread(target=lambda: c.post(path, data=form), daemon=True)
        first.start()
        try:
            assert gate.entered.wait(10)
            second = c.post(path, data={**form, "by": "erin"})
        finally:
            gate.release()
            first.join(10)
    assert second.status_code == 400 and "is being replayed right now by dana" in second.text
    assert calls == ["c_1"]
    assert world.records.dead_letters.get(world.letter.id).replayed_by == "dana"


@pytest.mark.parametrize(
    "bad",
    ["a/b", "line\r\nSet-Cookie: x=1", "<script>alert(1)</script>", "", " x", "x" * 129, "../etc"],
)
def test_run_ids_are_checked_where_they_enter(world: World, bad: str) -> None:
    with pytest.raises(ValueError, match="run_id must be 1 to 128 letters, digits"):
        world.guard.start(task="t", run_id=bad)
    with pytest.raises(ValueError, match="checkpoint_id must be 1 to 128"):
        world.guard.resume(bad)
    if bad and "/" not in bad:
        page = client(world).get("/runs/" + quote(bad, safe=""))
        assert page.status_code == 400 and "letters, digits" in page.text


def test_a_valid_run_id_is_kept_and_shown(world: World) -> None:
    with world.guard.start(task="ticket", run_id="ticket-42:turn.3_a") as run:
        run.succeed(1)
    assert client(world).get("/runs/ticket-42:turn.3_a").status_code == 200


def test_a_checkpoint_with_a_bad_run_id_is_corrupt(world: World) -> None:
    checkpoints = world.records.checkpoints
    doc = {"run_id": "a/b", "task": "t", "usage": {}, "partial": [], "transcript": []}
    checkpoint_id = checkpoints.save(doc, time.time())
    with pytest.raises(tether.CheckpointError, match="run_id must be 1 to 128"):
        world.guard.resume(checkpoint_id)


def test_the_command_refuses_an_open_address_without_a_token(world: World, capsys: Any) -> None:
    assert main(["serve", "--db", world.path, "--host", "0.0.0.0"]) == 2
    assert "not a loopback address" in capsys.readouterr().err
    assert main(["serve", "--db", "/nonexistent/records.db"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["serve", "--db", world.path, "--handler", "nomodule"]) == 2


def test_records_on_postgres(pg_dsn: str) -> None:
    table = f"t_rec_{uuid.uuid4().hex[:8]}"
    records = Records.postgres(pg_dsn, table=table)
    try:
        guard = Guard(records=records)
        with guard.start(task="escalate me") as run:
            run.escalate("needs a person")
        page = TestClient(create_app(records), base_url="http://localhost").get("/inbox").text
        assert "escalate me" in page and "needs a person" in page
    finally:
        records.close()


# --- a real browser ----------------------------------------------------------------------------

CHROMIUM = os.environ.get("TETHER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(world: World, **options: Any) -> Iterator[str]:
    """The page under a real uvicorn (the limits ``tether serve`` sets) on a free port."""
    import uvicorn

    from tether.serve._server import server_config

    timeout = options.pop("header_timeout", 10.0)
    app = create_app(world.records, **{"handler": world.replay_handler, **options})
    port = free_port()
    server = uvicorn.Server(server_config(app, port=port, header_timeout=timeout))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def live(world: World) -> Iterator[str]:
    with serving(world) as base:
        yield base


def not_blank(path: Path) -> None:
    from PIL import Image

    with Image.open(path) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1_000_000)
    assert colours is not None and len(colours) > 20, f"{path.name} looks blank"


def test_every_action_in_a_real_browser(world: World, tmp_path: Path) -> None:
    """Headless Chromium (Debian's package) driven by Playwright: every page is drawn;
    search, filter and page through the runs; approve, reject, claim, resolve and replay by
    clicking; the inbox shows a new approval and a resumed run without a reload."""
    from playwright.sync_api import expect, sync_playwright

    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium is not installed at {CHROMIUM} (apt-get install chromium; "
                    "or set TETHER_CHROMIUM)", pytrace=False)  # fmt: skip
    file_runs(world.records, 60, start=time.time() - 3 * 86_400, every=3600)
    with world.guard.start(task="refund order B-7") as run:  # a second call waiting: to reject
        run.call_tool(
            "issue_refund",
            lambda order, amount: None,
            {"order": "B-7", "amount": 7000},
            idempotent=False,
            requires_approval=True,
        )
    to_reject = run.outcome.pending_approval["id"]
    to_approve = world.awaiting.pending_approval["id"]
    case = world.escalated.handoff.id
    shots = tmp_path / "shots"
    shots.mkdir()
    with serving(world, refresh=1.0) as live, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        errors: list[str] = []
        page.on(
            "console",
            lambda m: errors.append(m.text) if m.type == "error" else None,
        )
        for name, path in (
            ("runs", "/runs"),
            ("run", f"/runs/{world.escalated.run_id}"),
            ("overview", "/overview"),
            ("inbox", "/inbox"),
            ("dead-letters", "/dead-letters"),
            ("dead-letter", f"/dead-letters/{world.letter.id}"),
            ("breakers", "/breakers"),
        ):
            page.goto(live + path)
            page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
            not_blank(shots / f"{name}.png")

        # the last hour, first on the overview (#45)
        page.goto(live + "/overview")
        expect(page.locator("#last-hour")).to_contain_text("escalated")

        # search, filter and page
        page.goto(live + "/runs")
        expect(page.locator("h1")).to_contain_text("65 matches")
        page.fill("input[name=q]", "invoice 99")
        page.click("form.filters button[type=submit]")
        expect(page.locator("table tr td a")).to_have_text(["look up invoice 99"])
        page.goto(live + "/runs")
        page.select_option("select[name=status]", "escalated")
        page.click("form.filters button[type=submit]")
        expect(page.locator("h1")).to_contain_text("10 matches")  # 9 of the 60, and the world's
        page.goto(live + "/runs")
        first = page.locator("table tr td a").all_inner_texts()
        page.click("a[rel=next]")
        expect(page.locator("nav.pager")).to_contain_text("page 2 of 2")
        second = page.locator("table tr td a").all_inner_texts()
        assert len(first) == 50 and len(second) == 15 and not set(first) & set(second)

        # approve one call, reject the other, claim and resolve the case
        page.goto(live + "/inbox")
        card = page.locator(f"#{to_approve}")
        card.locator("form[action$='/approve'] input[name=by]").fill("alice")
        card.locator("form[action$='/approve'] input[name=note]").fill("long-standing customer")
        card.locator("form[action$='/approve'] button").click()
        page.wait_for_url("**/inbox")
        card = page.locator(f"#{to_reject}")
        card.locator("form[action$='/reject'] input[name=by]").fill("bob")
        card.locator("form[action$='/reject'] input[name=note]").fill("older than 90 days")
        card.locator("form[action$='/reject'] button").click()
        page.wait_for_url("**/inbox")
        expect(page.locator(f"tr#{to_approve}")).to_contain_text("not yet: waiting for a worker")
        expect(page.locator(f"tr#{to_reject}")).to_contain_text("rejected")
        page.locator(f"#{case} form[action$='/claim'] input[name=by]").fill("carol")
        page.locator(f"#{case} form[action$='/claim'] button").click()
        expect(page.locator(f"#{case}")).to_contain_text("Claimed by carol")
        page.locator(f"#{case} form[action$='/resolve'] input[name=by]").fill("carol")
        page.locator(f"#{case} form[action$='/resolve'] input[name=note]").fill("refunded by hand")
        page.locator(f"#{case} form[action$='/resolve'] button").click()
        expect(page.locator(f"#{case}")).to_contain_text("Resolved by carol: refunded by hand")
        page.screenshot(path=str(shots / "inbox-decided.png"), full_page=True)

        # the inbox refreshes itself: a new call waiting, then the approved run resumed
        with world.guard.start(task="refund order C-3") as run:
            run.call_tool(
                "issue_refund",
                lambda order, amount: None,
                {"order": "C-3", "amount": 6000},
                idempotent=False,
                requires_approval=True,
            )
        expect(page.locator(f"#{run.outcome.pending_approval['id']}")).to_contain_text(
            "C-3", timeout=10_000
        )
        for decision in world.records.decisions(worker="billing-1"):
            with world.guard.resume(decision.checkpoint_id) as resumed:
                try:
                    resumed.succeed(world.refund(resumed))
                except ToolError as rejected:
                    resumed.fail(rejected.model_message)
        expect(page.locator(f"tr#{to_approve}")).to_contain_text(
            "resumed by billing-1", timeout=10_000
        )
        expect(page.locator(f"tr#{to_approve}")).to_contain_text("success (goal_reached)")

        # replay the dead letter; its page shows what the handler returned
        page.goto(live + f"/dead-letters/{world.letter.id}")
        page.fill("form[action$='/replay'] input[name=by]", "dana")
        page.click("form[action$='/replay'] button")
        expect(page.locator("#replay")).to_contain_text("charged")
        expect(page.locator("#replayed")).to_contain_text("by dana")
        browser.close()
        assert errors == []
    assert len(world.refunds) == 1 and world.replayed and world.replayed[0]["customer"] == "c_1"
    assert world.records.handoffs.get(case)["state"] == "resolved"
    target = os.environ.get("TETHER_SCREENSHOTS")  # set to docs/img to refresh the docs' images
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        for name in ("runs", "inbox", "overview"):
            shutil.copy(shots / f"{name}.png", Path(target) / f"{name}.png")


@contextlib.contextmanager
def attack_site(pages: dict[str, str]) -> Iterator[str]:
    """Another web server on this host (``localhost:OTHER``): it serves ``pages`` and sets
    the page's CSRF cookie for ``localhost`` to a value of its own (cookies are not kept
    apart by port, and a server may overwrite even an HttpOnly cookie)."""
    import http.server

    class Attack(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path.split("?")[0], "").encode()
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Set-Cookie", "tether_csrf=x; Path=/; SameSite=Strict; HttpOnly")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Attack)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.mark.parametrize("token", [None, "s3cret-token"])
def test_a_page_on_another_port_cannot_act_in_a_real_browser(
    world: World, redis_url: str, token: str | None
) -> None:
    """Headless Chromium: the operator opens the page (with ``?token=`` when there is one),
    then a page on another port of localhost submits forms to it, with the CSRF cookie it
    set itself and the matching form field: the breaker stays closed, the payment waits."""
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium is not installed at {CHROMIUM}", pytrace=False)
    store = RedisStore(redis_url, prefix=f"t_{uuid.uuid4().hex[:8]}")
    pending = world.awaiting.pending_approval["id"]
    try:
        tether.CircuitBreaker("payments", store=store).call(lambda: "ok")
        with serving(world, redis=store, token=token) as live:
            ours = live.replace("127.0.0.1", "localhost")

            def form(action: str, **fields: str) -> str:
                inputs = "".join(
                    f'<input type="hidden" name="{k}" value="{v}">' for k, v in fields.items()
                )
                return (
                    f'<form method="post" action="{ours}{action}">{inputs}</form>'
                    "<script>document.forms[0].submit()</script>"
                )

            pages = {
                "/breaker.html": form("/breakers/payments/open", seconds="86400", csrf="x"),
                "/approve.html": form(f"/approvals/{pending}/approve", by="mallory", csrf="x"),
            }
            with attack_site(pages) as other, sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                page = browser.new_page()
                first = ours + "/inbox" + (f"?token={token}" if token else "")
                assert page.goto(first).status == 200  # type: ignore[union-attr]
                statuses = []
                for name in ("/breaker.html", "/approve.html"):
                    with page.expect_navigation(url=f"{ours}/**") as sent:
                        page.goto(other + name)
                    statuses.append(sent.value.status if sent.value else 0)
                # the operator, back on the page, still acts
                page.goto(ours + "/inbox")
                card = page.locator(f"#{pending}")
                card.locator("form[action$='/approve'] input[name=by]").fill("alice")
                card.locator("form[action$='/approve'] button").click()
                page.wait_for_url("**/inbox")
                browser.close()
        assert statuses == [403, 403]
        assert world.records.approvals.get(pending).status == "approved"
        assert world.records.approvals.get(pending).decided_by == "alice"
        assert store.breaker_state("payments", time.time())[0] == "closed"
    finally:
        store.reset()
        store.close()


def test_a_records_store_that_fails_at_the_end_never_loses_the_outcome(tmp_path: Path) -> None:
    records = Records.sqlite(str(tmp_path / "r.db"))
    guard = Guard(records=records)
    with guard.start(task="late failure") as run:
        run.call_tool("search", lambda q: 1, {"q": "x"})
        records.close()  # the database goes away before the run ends
        run.succeed(1)
    assert run.outcome.status == "success" and run.outcome.result == 1
    assert any("checkpoint failed" in i for i in run.outcome.open_issues)


# --- at scale: filters, search, pages and counts in SQL ------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def records(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Records]:
    """Empty records on SQLite, then on PostgreSQL (a table set of its own)."""
    if request.param == "sqlite":
        found = Records.sqlite(str(tmp_path / "records.db"))
    else:
        dsn = request.getfixturevalue("pg_dsn")
        found = Records.postgres(dsn, table=f"t_rec_{uuid.uuid4().hex[:8]}")
    yield found
    if request.param == "postgres":
        t = found.tables
        with found.store.sql(write=True) as sql:
            for table in (t.docs, t.runs, t.tools, t.decisions):
                sql.run(f"DROP TABLE IF EXISTS {table}")
    found.close()


def file_runs(
    records: Records, n: int, *, start: float = 1_750_000_000.0, every: float = 3600.0
) -> list[str]:
    """``n`` real runs (every 7th escalated, every 5th with a failing charge), one an hour."""
    clock = tether.VirtualClock(wall_start=start)
    guard = Guard(records=records, clock=clock, retry=tether.RetryPolicy(max_attempts=1))
    ids = []

    def declined(order: str) -> None:
        raise PermissionError("card declined")

    for i in range(n):
        clock.advance(every)
        with guard.start(
            task=f"refund order A-{i} for {'alice' if i % 2 else 'bob'} 50%_off"
        ) as run:
            run.proceed()
            run.record_model_call(model="claude-sonnet-4-6", input_tokens=1000, output_tokens=100)
            run.call_tool("lookup", lambda order: {"order": order}, {"order": f"A-{i}"})
            if i % 7 == 0:
                run.escalate("asked for a person")
            elif i % 5 == 0:
                with contextlib.suppress(ToolError):
                    run.call_tool("charge", declined, {"order": f"A-{i}"}, idempotent=False)
                run.fail("declined")
            else:
                run.succeed(i)
        ids.append(run.run_id)
    return ids


def walk(c: TestClient, url: str) -> tuple[list[str], str]:
    """Every run linked from the pages of /runs, following 'older' to the end."""
    import re

    seen, first = [], ""
    while url:
        page = c.get(url)
        assert page.status_code == 200
        first = first or page.text
        seen += re.findall(r'<td><a href="/runs/([^"]+)">', page.text)
        more = re.search(r'<a href="([^"]+)" rel="next">', page.text)
        url = more.group(1).replace("&amp;", "&") if more else ""
    return seen, first


def test_600_runs_are_all_reachable_and_filters_count_them_all(records: Records) -> None:
    """With 600 runs the page said "500 of 500"; filters applied after the cap."""
    ids = file_runs(records, 600)
    c = TestClient(create_app(records), base_url="http://127.0.0.1")
    seen, first = walk(c, "/runs")
    assert sorted(seen) == sorted(ids) and len(seen) == 600  # each once, none missing
    assert "600 matches" in first and "page 1 of 12" in first
    escalated = [ids[i] for i in range(600) if i % 7 == 0]
    seen, first = walk(c, "/runs?status=escalated")
    assert sorted(seen) == sorted(escalated)
    assert f"{len(escalated)} matches" in first and f"escalated {len(escalated)}" in first
    assert f"failed {sum(1 for i in range(600) if i % 7 and i % 5 == 0)}" in first  # counts beside


def test_runs_are_searched_in_sql(records: Records) -> None:
    ids = file_runs(records, 40)
    runs = records.runs
    assert runs.search(status="escalated").total == 6  # 0, 7, ..., 35
    assert runs.search(reason="goal_reached").total == 40 - 6 - 6  # 5, 10, 15, 20, 25, 30 failed
    charged = runs.search(tool="charge")
    assert {r["run_id"] for r in charged.runs} == {ids[i] for i in (5, 10, 15, 20, 25, 30)}
    assert (
        runs.search(text="ALICE").total == 20 and runs.search(text="order a-3 ").total == 11
    )  # 3, 30..39
    assert runs.search(text=ids[17][:14]).runs[0]["run_id"] == ids[17]  # the start of a run id
    assert (
        runs.search(text="%").total == 40 and runs.search(text="5_%").total == 0
    )  # literal, not wildcards
    assert runs.search(text="50%_off").total == 40
    start = 1_750_000_000.0
    window = runs.search(
        since=start + 10 * 3600, until=start + 20 * 3600
    )  # runs 9 .. 18 ended inside
    assert window.total == 10 and {r["run_id"] for r in window.runs} == set(ids[9:19])
    page = runs.search(limit=15, offset=30)
    assert [r["run_id"] for r in page.runs] == ids[::-1][30:40][:15] and page.total == 40
    assert runs.search(status="escalated", tool="charge").total == 0
    assert runs.tool_names() == ["charge", "lookup"]
    with pytest.raises(ValueError, match="limit must be"):
        runs.search(limit=0)


def test_the_page_searches_by_every_filter(records: Records) -> None:
    file_runs(records, 40)
    c = TestClient(create_app(records), base_url="http://127.0.0.1")
    page = c.get(
        "/runs",
        params={"q": "alice", "tool": "charge", "since": "2025-06-15", "until": "2025-06-16"},
    )
    assert page.status_code == 200
    import re

    tasks = re.findall(r'<td><a href="/runs/[^"]+">([^<]+)</a>', page.text)
    assert tasks and all("alice" in t for t in tasks)
    assert c.get("/runs", params={"since": "tomorrow"}).status_code == 400
    assert "since must be a date" in c.get("/runs", params={"since": "tomorrow"}).text
    assert c.get("/runs", params={"page": "0"}).status_code == 400
    assert "No run matches these filters" in c.get("/runs", params={"q": "nobody"}).text


def test_the_overview_draws_what_the_records_hold(records: Records) -> None:
    file_runs(records, 48, start=time.time() - 3 * 86_400, every=1800)  # the last three days
    view = records.runs.overview(since=time.time() - 5 * 86_400, until=time.time() + 60)
    assert sum(sum(v.values()) for v in view.by_status.values()) == 48
    assert sum(v.get("escalated", 0) for v in view.by_status.values()) == 7
    assert view.failing_tools == (("charge", 8, 8),)  # 5, 10, ..., 45 without 35
    assert round(sum(view.cost_usd.values()), 4) == round(48 * 0.0045, 4)
    page = TestClient(create_app(records), base_url="http://127.0.0.1").get("/overview").text
    for words in (
        "Runs per day, by status",
        "by stop reason",
        "Cost per day",
        "8 of 8 calls failed",
        "escalated 7",
        "<svg",
    ):
        assert words in page
    assert "<script" not in page.split("</head>")[1]  # drawn on the server


def test_the_inbox_refreshes_itself(world: World) -> None:
    c = client(world)
    inbox = c.get("/inbox").text
    assert (
        'id="live" data-src="/inbox/live"' in inbox and '<script src="/static/tether.js"' in inbox
    )
    script = c.get("/static/tether.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert "default-src 'self'" in script.headers["content-security-policy"]
    before = c.get("/inbox/live").text
    with world.guard.start(task="refund order B-2") as run:
        run.call_tool(
            "issue_refund",
            lambda order, amount: None,
            {"order": "B-2", "amount": 7000},
            idempotent=False,
            requires_approval=True,
        )
    after = c.get("/inbox/live").text
    assert "B-2" not in before and "B-2" in after and "<html" not in after
    assert "(2 to approve" in after


def test_a_large_value_is_cut_with_a_link_to_the_whole(world: World) -> None:
    """A 5 MB tool result: the page shows a preview and links to the whole value; both redacted."""
    head = "x" * 1990 + f" api_key={SECRET} "  # a secret across the preview's cut
    blob = head + ("invoice line: 90.00 EUR\n" * 210_000) + f"token={SECRET}\n"
    with world.guard.start(task="export invoices") as run:
        run.call_tool("export", lambda: {"csv": blob}, {})
        run.succeed("exported")
    c = client(world)
    page = c.get(f"/runs/{run.run_id}")
    assert page.status_code == 200 and len(page.text) < 100_000
    assert (
        "the whole value" in page.text and SECRET not in page.text and SECRET[:12] not in page.text
    )
    import re

    link = re.search(r'<a href="(/values/run/[^"]+)">the whole value', page.text)
    assert link is not None
    whole = c.get(link.group(1).replace("&amp;", "&"))
    assert whole.status_code == 200 and whole.headers["content-type"].startswith("application/json")
    assert (
        len(whole.text) > 5_000_000
        and SECRET not in whole.text
        and whole.text.count("[redacted]") == 2
    )
    assert c.get(f"/values/run/{run.run_id}", params={"at": "partial.9.result"}).status_code == 404
    assert c.get(f"/values/nothing/{run.run_id}").status_code == 404


def test_an_unknown_outcome_case_shows_the_tool_its_arguments_and_the_ledger_key(
    tmp_path: Path,
) -> None:
    """The case said "check the provider's records" but showed neither the call nor its key."""
    records = Records.sqlite(str(tmp_path / "r.db"))
    guard = Guard(
        records=records,
        escalation=tether.Escalation(),
        retry=tether.RetryPolicy(base=0.01, cap=0.02),
    )

    def charge(customer: str, amount: int, api_key: str) -> None:
        time.sleep(0.5)  # outlives its timeout: it may have charged

    try:
        with guard.start(task="charge the customer") as run:
            run.call_tool(
                "charge",
                charge,
                {"customer": "c_9", "amount": 4200, "api_key": SECRET},
                idempotent=False,
                timeout=0.05,
            )
        assert run.outcome.stopped_because is tether.StopReason.UNKNOWN_OUTCOME
        entry = next(e for e in records.runs.get(run.run_id)["transcript"] if e.get("key"))
        key = entry["key"]
        assert guard.ledger.get(key).state.value == "unknown"  # the ledger's own key for it
        inbox = TestClient(create_app(records), base_url="http://127.0.0.1").get("/inbox").text
        case = inbox[inbox.index(run.outcome.handoff.id) :]
        assert "Outcome unknown: charge" in case and "4200" in case and "c_9" in case
        assert key in case
        assert SECRET not in inbox and "[redacted]" in case
    finally:
        records.close()
        guard.ledger.close()


# --- approve, and the run continues: records.decisions() -----------------------------------------

WORKER = """
import sys
import tether

records = tether.Records.sqlite(sys.argv[1])
guard = tether.Guard(records=records)

def issue_refund(order: str, amount: int) -> dict:
    with open(sys.argv[2], "a") as log:          # the effect: one line per refund made
        log.write(f"{order} {amount}\\n")
    return {"id": "re_1"}

for decision in records.decisions(worker=sys.argv[3]):    # the documented worker loop
    with guard.resume(decision.checkpoint_id) as run:
        try:                                     # the agent's turn again, as before the stop
            refund = run.call_tool("issue_refund", issue_refund, {"order": "A-1", "amount": 9000},
                                   idempotent=False, requires_approval=True)
            run.succeed(refund)
        except tether.ToolError as rejected:     # a rejection reaches the model
            run.fail(rejected.model_message)
    print(decision.approval_id, decision.approved, run.outcome.status)
records.close()
"""


def resume_in_another_process(tmp_path: Path, db: str, worker: str) -> list[str]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(script), db, str(tmp_path / "refunds.log"), worker],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[:-1]


def test_an_approval_from_the_page_resumes_in_a_second_process_and_pays_once(
    world: World, tmp_path: Path
) -> None:
    """The operator approves on the page; the agent's own worker, another process, takes the
    decision from records.decisions(), resumes the run and pays once; the page shows it."""
    pending = world.awaiting.pending_approval["id"]
    c = client(world)
    assert "not yet: waiting for a worker" not in c.get("/inbox").text
    assert post(c, f"/approvals/{pending}/approve", by="alice", note="ok").status_code == 303
    assert "not yet: waiting for a worker" in c.get("/inbox").text
    assert resume_in_another_process(tmp_path, world.path, "billing-1") == [
        f"{pending} True success"
    ]
    assert resume_in_another_process(tmp_path, world.path, "billing-2") == []  # once each
    assert (tmp_path / "refunds.log").read_text() == "A-1 9000\n"  # paid once
    inbox = c.get("/inbox").text
    row = inbox[inbox.index(f'<tr id="{pending}">') :]
    assert "resumed by billing-1" in row and "success (goal_reached)" in row
    assert world.records.runs.get(world.awaiting.run_id)["status"] == "success"


def test_a_rejection_reaches_the_resumed_run_in_a_second_process(
    world: World, tmp_path: Path
) -> None:
    pending = world.awaiting.pending_approval["id"]
    c = client(world)
    assert post(c, f"/approvals/{pending}/reject", by="bob", note="too large").status_code == 303
    assert resume_in_another_process(tmp_path, world.path, "w") == [f"{pending} False failed"]
    assert not (tmp_path / "refunds.log").exists()
    assert "too large" in (world.records.runs.get(world.awaiting.run_id)["detail"] or "")
    assert resume_in_another_process(tmp_path, world.path, "w") == []


def awaiting(records: Records, n: int) -> list[str]:
    """``n`` runs stopped for approval, each decided (approved) at once."""
    guard = Guard(records=records)
    ids = []
    for i in range(n):
        with guard.start(task=f"refund {i}") as run:
            run.call_tool(
                "issue_refund",
                lambda order: None,
                {"order": f"A-{i}"},
                idempotent=False,
                requires_approval=True,
            )
        guard.approve(run.outcome.checkpoint_id, by="alice")
        ids.append(run.outcome.pending_approval["id"])
    return ids


def test_each_decision_goes_to_one_worker_of_many(records: Records) -> None:
    """8 workers iterate at once (threads, each with its own connection): every decision is
    taken once, atomically in SQL."""
    ids = awaiting(records, 6)
    where = records.store.path if records.tables.dialect == "sqlite" else records.store.dsn  # type: ignore[union-attr]
    table = records.tables.docs
    taken: list[tuple[str, str]] = []
    lock, start = threading.Lock(), threading.Barrier(8)

    def worker(n: int) -> None:
        mine = (
            Records.sqlite(where)
            if records.tables.dialect == "sqlite"
            else Records.postgres(where, table=table)
        )
        try:
            start.wait()
            for decision in mine.decisions(worker=f"w{n}", limit=2):
                with lock:
                    taken.append((decision.approval_id, decision.worker))
        finally:
            mine.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(a for a, _ in taken) == sorted(ids)  # each once, none lost
    assert list(records.decisions()) == []  # taken, and held by their workers' leases


def test_a_decision_whose_worker_died_goes_to_the_next_after_the_lease(records: Records) -> None:
    (approval,) = awaiting(records, 1)
    first = next(records.decisions(worker="dies", lease=0.3))
    assert first.approval_id == approval and first.approved and first.checkpoint_id
    assert list(records.decisions(worker="other")) == []  # held
    time.sleep(0.4)
    again = next(records.decisions(worker="next"))  # the lease ran out: redelivered
    assert again.approval_id == approval and again.worker == "next"
    guard = Guard(records=records)
    with guard.resume(again.checkpoint_id) as run:
        run.call_tool(
            "issue_refund",
            lambda order: None,
            {"order": "A-0"},
            idempotent=False,
            requires_approval=True,
        )
        run.succeed()
    time.sleep(0.4)
    assert list(records.decisions(worker="late", lease=0.1)) == []  # done once its run ended
    with pytest.raises(ValueError, match="lease must be"):
        next(records.decisions(lease=0))


# --- retention: Records.prune and tether records prune -------------------------------------------

DAY_S = 86_400.0


class Aged:
    """Records with every kind of record, 40 days old, and a few of today."""

    def __init__(self, records: Records) -> None:
        from datetime import timedelta

        self.records = records
        old = tether.VirtualClock(wall_start=time.time() - 40 * DAY_S)
        guard = Guard(records=records, clock=old, escalation=tether.Escalation(on=[]))
        self.old_success = []
        for i in range(200):  # the bulk: old runs that are done with
            with guard.start(task=f"old lookup {i} " + "padding " * 60) as run:
                run.call_tool("lookup", lambda q: {"rows": ["x" * 200] * 5}, {"q": i})
                run.succeed(i)
            self.old_success.append(run.run_id)
        with guard.start(task="waits for approval") as run:
            run.call_tool(
                "pay", lambda to: None, {"to": "acct-1"}, idempotent=False, requires_approval=True
            )
        self.pending = run.outcome
        with guard.start(task="approved, not resumed yet") as run:
            run.call_tool(
                "pay", lambda to: None, {"to": "acct-2"}, idempotent=False, requires_approval=True
            )
        self.decided = run.outcome
        guard.approve(self.decided.checkpoint_id, by="alice")
        with guard.start(task="an open case") as run:
            run.escalate("needs a person")
        self.open_case = run.outcome
        with guard.start(task="a resolved case") as run:
            run.escalate("needs a person")
        self.resolved_case = run.outcome
        records.handoffs.resolve(run.outcome.handoff.id, by="alice", note="done", at=old.wall())

        def declined(order: str) -> None:
            raise PermissionError("card declined")

        with guard.start(task="a letter not replayed") as run:
            with contextlib.suppress(ToolError):
                run.call_tool("charge", declined, {"order": "A-1"}, idempotent=False)
            run.fail("declined")
        self.letter_run = run.run_id
        self.ledger = Ledger_of(records, old)
        now = Guard(records=records)
        with now.start(task="today") as run:
            run.succeed(1)
        self.today = run.run_id
        self.timedelta = timedelta


def Ledger_of(records: Records, clock: Any) -> dict[str, str]:
    """Two old effects in the records' own ledger: one past its ttl, one inside it."""
    short = records.ledger(clock=clock)
    short.once("expired-effect", lambda: 1)
    long = (
        tether.Ledger.sqlite(records.store.path, ttl=100 * DAY_S, clock=clock)
        if records.tables.dialect == "sqlite"
        else tether.Ledger.postgres(
            records.store.dsn, table=records.tables.ledgers[0], ttl=100 * DAY_S, clock=clock
        )
    )  # type: ignore[union-attr]
    long.once("long-lived-effect", lambda: 2)
    long.close()
    return {"expired": "expired-effect", "kept": "long-lived-effect"}


def test_prune_keeps_what_must_stay_and_removes_the_rest(records: Records) -> None:
    from datetime import timedelta

    aged = Aged(records)
    pruned = records.prune(older_than=timedelta(days=30))
    assert pruned.runs == 200 + 1  # the old successes and the resolved case's run
    assert pruned.handoffs == 1 and pruned.ledger >= 1
    runs = records.runs
    for kept in (
        aged.pending.run_id,
        aged.decided.run_id,
        aged.open_case.run_id,
        aged.letter_run,
        aged.today,
    ):
        assert runs.get(kept) is not None, kept
    assert all(runs.get(r) is None for r in aged.old_success[:5]) and runs.search().total == 5
    assert runs.get(aged.resolved_case.run_id) is None
    assert records.approvals.get(aged.pending.pending_approval["id"]).status == "pending"
    assert records.handoffs.get(aged.open_case.handoff.id)["state"] == "open"
    with pytest.raises(KeyError):
        records.handoffs.get(aged.resolved_case.handoff.id)
    assert len(records.dead_letters.list()) == 1
    ledger = records.ledger()
    assert ledger.get("long-lived-effect") is not None  # inside its ttl
    assert ledger.get("expired-effect") is None
    # what stayed still works: the approved call resumes from its checkpoint, once
    decision = next(records.decisions(worker="w"))
    assert decision.approval_id == aged.decided.pending_approval["id"]
    paid = []
    with Guard(records=records).resume(decision.checkpoint_id) as run:
        run.call_tool(
            "pay",
            lambda to: paid.append(to),
            {"to": "acct-2"},
            idempotent=False,
            requires_approval=True,
        )
        run.succeed()
    assert paid == ["acct-2"] and run.outcome.status == "success"
    assert records.prune(older_than=timedelta(days=30)).runs == 0  # nothing more to remove


def test_prune_keeps_live_decisions_whatever_the_clocks(
    records: Records, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The approver's clock a minute behind the agent's: an approved and a rejected call,
    not yet resumed, keep their approval, run and checkpoint through a prune (they were
    taken for resumed: the run had "ended after" the decision), and a pruning host whose
    clock is a year ahead removes nothing that is not 30 days old by the database's clock.
    Both resume afterwards; a decision resumed and ended goes."""
    from datetime import timedelta

    start = time.time() - 40 * DAY_S
    agent = Guard(records=records, clock=tether.VirtualClock(wall_start=start))
    approver = Guard(records=records, clock=tether.VirtualClock(wall_start=start - 60))
    paid: list[str] = []

    def turn(run: tether.Run, to: str) -> Any:
        return run.call_tool(
            "pay", lambda to: paid.append(to), {"to": to}, idempotent=False, requires_approval=True
        )

    waiting = {}
    for to in ("approved", "rejected", "resumed"):
        with agent.start(task=f"pay {to}") as run:
            turn(run, to)
        waiting[to] = run.outcome
    approver.approve(waiting["approved"].checkpoint_id, by="alice")
    approver.reject(waiting["rejected"].checkpoint_id, by="bob", reason="no")
    approver.approve(waiting["resumed"].checkpoint_id, by="alice")
    with agent.resume(waiting["resumed"].checkpoint_id) as run:
        run.succeed(turn(run, "resumed"))
    with Guard(records=records).start(task="today") as run:
        run.succeed(1)
    today = run.run_id

    pruned = records.prune(older_than=timedelta(days=30))
    monkeypatch.setattr(time, "time", lambda: start + 440 * DAY_S)  # the pruner, a year ahead
    pruned_ahead = records.prune(older_than=timedelta(days=30))
    monkeypatch.undo()

    assert (pruned.approvals, pruned.runs, pruned_ahead.runs) == (1, 1, 0)
    assert records.runs.get(today) is not None
    for to in ("approved", "rejected"):
        outcome = waiting[to]
        assert records.approvals.get(outcome.pending_approval["id"]).status == to
        assert records.runs.get(outcome.run_id) is not None
        assert records.store.get("checkpoint", outcome.checkpoint_id) is not None
    assert records.approvals.get(waiting["resumed"].pending_approval["id"]) is None
    inbox = TestClient(create_app(records), base_url=BASE).get("/inbox").text
    assert inbox.count("not yet: waiting for a worker") == 2  # not "resumed", whatever the clocks
    ended = {}
    for decision in records.decisions(worker="w"):
        with agent.resume(decision.checkpoint_id) as run:
            try:
                run.succeed(turn(run, "approved" if decision.approved else "rejected"))
            except ToolError as rejected:
                run.fail(rejected.model_message)
        ended[decision.approved] = run.outcome.status
    assert ended == {True: "success", False: "failed"} and paid == ["resumed", "approved"]


def test_prune_shrinks_the_sqlite_file(tmp_path: Path) -> None:
    from datetime import timedelta

    path = tmp_path / "records.db"
    records = Records.sqlite(str(path))
    try:
        Aged(records)
        with records.store.sql() as sql:
            sql.run("VACUUM")
        before = path.stat().st_size
        pruned = records.prune(older_than=timedelta(days=30), vacuum=True)
        after = path.stat().st_size
        assert pruned.runs == 201 and after < before / 2, (before, after)
    finally:
        records.close()


def test_prune_refuses_what_is_not_a_duration(records: Records) -> None:
    with pytest.raises(TypeError, match="timedelta"):
        records.prune(older_than=30)  # type: ignore[arg-type]
    from datetime import timedelta

    with pytest.raises(ValueError, match=">= 0"):
        records.prune(older_than=timedelta(days=-1))
    assert records.prune().total == 0  # the default: 30 days; nothing that old here


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """What ``--db`` takes: a SQLite path, or a DSN whose tables live in a schema of their own."""
    if request.param == "sqlite":
        yield str(tmp_path / "records.db")
        return
    import psycopg

    dsn, schema = request.getfixturevalue("pg_dsn"), f"t_cli_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield dsn + ("&" if "?" in dsn else "?") + f"options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def test_the_command_prunes_sqlite_and_postgres(where: str, capsys: Any) -> None:
    records = Records.open(where)
    try:
        aged = Aged(records)
    finally:
        records.close()
    assert main(["records", "prune", "--db", where, "--older-than", "30"]) == 0
    out = capsys.readouterr().out
    assert "  201  runs" in out and "    1  resolved cases" in out
    assert "kept" in out and "pending approvals" in out
    records = Records.open(where)
    try:
        assert records.runs.get(aged.pending.run_id) is not None and records.runs.get(aged.today)
    finally:
        records.close()
    assert main(["records", "prune", "--db", where]) == 0  # the default: 30 days
    assert "  0  runs" in capsys.readouterr().out


def test_the_command_refuses_bad_arguments(tmp_path: Path, capsys: Any) -> None:
    assert main(["records", "prune", "--db", str(tmp_path / "none.db"), "--older-than", "3"]) == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.parametrize(
    "days", ["inf", "-inf", "nan", "-3", "-0.5", "thirty", "", "1e400", "1e12"]
)
def test_the_command_refuses_a_bad_age(tmp_path: Path, capsys: Any, days: str) -> None:
    """Exit code 2 and what --older-than takes, never a traceback; nothing removed."""
    path = str(tmp_path / "r.db")
    with Records.sqlite(path) as records:
        old = tether.VirtualClock(wall_start=time.time() - 40 * DAY_S)
        with Guard(records=records, clock=old).start(task="old") as run:
            run.succeed(1)
    with pytest.raises(SystemExit) as exited:
        main(["records", "prune", "--db", path, f"--older-than={days}"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "Traceback" not in err
    assert "--older-than" in err and "a number of days" in err, err
    with Records.sqlite(path) as records:
        assert records.runs.get(run.run_id) is not None


def test_the_command_refuses_infinity_in_its_own_process(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = str(tmp_path / "r.db")
    Records.sqlite(path).close()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tether.cli",
            "records",
            "prune",
            "--db",
            path,
            "--older-than",
            "inf",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--older-than" in done.stderr and "inf" in done.stderr


def test_the_serve_bench_times_the_real_page(pg_dsn: str) -> None:
    """``tether bench --suite serve``: real runs filed, ``tether serve`` in its own process,
    each page fetched over HTTP (small sizes here; the figures come from the full run)."""
    from tether.bench._serve import run_serve

    results = run_serve((40,), pg_dsn=pg_dsn, samples=2, big=600_000)
    for backend in ("sqlite", "postgres"):
        cell = results[backend]["40"]
        assert {"/runs", "/runs last page", "/runs?tool=charge_card", "/overview", "/inbox"} <= set(
            cell
        )
        assert cell["/runs"]["p50_ms"] > 0 and cell["fill_s"] > 0
        beside = cell["while a 0.6 MB run renders"]
        assert beside["runs_p50_ms"] > 0 and beside["big_page_p50_ms"] > 0
