"""``tether demo``: the Northwind refund story, told against a real payment service on loopback.

Act 1: the payment service is down. tether retries with backoff and jitter, the
breaker opens, the run escalates; the customer gets a short, honest message and a
person gets the case with its history.

Act 2: the refund commits but the response is lost. The model tries again with a fresh
UUID; the ledger reconciles through the payment service's own records; no second
refund; the customer is told the refund went through, read from the records.
"""

from __future__ import annotations

import json
import logging
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import tether
from tether._errors import Picklable

__all__ = ["main"]


class PaymentService:
    """A small payment API: POST /refunds, GET /refunds?order=...; its own records."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.refunds: list[dict[str, Any]] = []
        self.requests = 0
        service = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                order = query.get("order", [""])[0]
                self._reply(200, [r for r in service.refunds if r["order"] == order])

            def do_POST(self) -> None:
                service.requests += 1
                body = json.loads(
                    self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}"
                )
                if service.mode == "down":
                    self._reply(503, {"error": "payment service unavailable"})
                    return
                refund = {
                    "id": f"re_{len(service.refunds) + 1:04d}",
                    "order": body["order"],
                    "amount": body["amount"],
                }
                service.refunds.append(refund)
                if service.mode == "lose_response":
                    service.mode = "ok"
                    self.close_connection = True
                    self.connection.close()  # committed, but the response never leaves
                    return
                self._reply(201, refund)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class HTTPStatusError(Picklable, Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status_code = status


class Story:
    """Prints the timeline, with rich when it is installed."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        try:
            from rich.console import Console

            self.console: Any = Console(highlight=False)
        except ImportError:
            self.console = None

    def _print(self, renderable: Any) -> None:
        """Print with rich, without the spaces it pads a line's end with."""
        with self.console.capture() as captured:
            self.console.print(renderable)
        print("\n".join(line.rstrip() for line in captured.get().splitlines()), flush=True)

    def say(self, who: str, text: str, style: str = "") -> None:
        stamp = f"{time.monotonic() - self.start:5.2f}s"
        if self.console is not None:  # a long line wraps under its text, on a terminal or not
            from rich.table import Table

            line = Table.grid()
            line.add_column(no_wrap=True)
            line.add_column()
            line.add_row(f"[dim]{stamp}[/dim]  [bold {style}]{who:<9}[/bold {style}] ", text)
            self._print(line)
        else:
            print(f"{stamp}  {who:<9} {text}")

    def title(self, text: str) -> None:
        if self.console is not None:
            from rich.rule import Rule

            self._print(Rule(f"[bold]{text}"))
        else:
            print(f"\n== {text} ==")

    def box(self, title: str, text: str) -> None:
        if self.console is not None:
            from rich.panel import Panel

            self._print(Panel(text, title=title, expand=False))
        else:
            print(f"[{title}]\n{text}\n")


def main() -> int:
    logging.getLogger("tether").setLevel(logging.ERROR)
    story = Story()
    service = PaymentService()
    try:
        _act_one(story, service)
        _act_two(story, service)
    finally:
        service.close()
    return 0


def _issue_refund(service: PaymentService, story: Story):  # type: ignore[no-untyped-def]
    def issue_refund(order: str, amount: int, uuid: str) -> dict[str, Any]:
        data = json.dumps(
            {
                "order": order,
                "amount": amount,
                "idempotency_key": tether.current_idempotency_key() or uuid,
            }
        ).encode()
        req = urllib.request.Request(
            f"{service.url}/refunds",
            data=data,
            method="POST",
            headers={"content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=2.0) as resp:
                return dict(json.loads(resp.read()))
        except urllib.error.HTTPError as exc:
            raise HTTPStatusError(exc.code, exc.read().decode()) from None

    return issue_refund


def _find_refund(service: PaymentService):  # type: ignore[no-untyped-def]
    def lookup(key: str) -> dict[str, Any] | None:
        with urllib.request.urlopen(f"{service.url}/refunds?order=NW-1042", timeout=2.0) as resp:
            found = json.loads(resp.read())
        return dict(found[0]) if found else None

    return lookup


def _model_turn(story: Story, step: int) -> dict[str, Any]:
    args: dict[str, Any] = {"order": "NW-1042", "amount": 4999, "uuid": str(uuid.uuid4())}
    story.say(
        "model",
        f"step {step}: issue_refund(order=NW-1042, amount=49.99, uuid={args['uuid'][:8]}…)",
        "cyan",
    )
    return args


def _act_one(story: Story, service: PaymentService) -> None:
    story.title("Act 1 · the payment service is down")
    service.mode = "down"
    handoffs: list[tether.HandoffRecord] = []

    def on_retry(event: tether.RetryEvent) -> None:
        story.say(
            "tether",
            f"attempt {event.attempt} failed ({event.verdict.reason}); retrying in "
            f"{event.delay:.2f} s with backoff and jitter",
            "yellow",
        )

    def on_breaker(event: tether.BreakerEvent) -> None:
        story.say("breaker", f"{event.name}: {event.old} → {event.new}", "red")

    tether.telemetry.subscribe("breaker_change", on_breaker)
    guard = tether.Guard(
        budget=tether.Budget(max_steps=6, max_seconds=20.0),
        retry=tether.RetryPolicy(max_attempts=3, base=0.05, cap=0.4, on_retry=on_retry),
        escalation=tether.Escalation(sink=handoffs.append),
        breaker_threshold=4,
        store=tether.stores.MemoryStore(),
        wait_for_recovery=False,  # the story: the breaker opens and a person takes over now
    )
    refund = _issue_refund(service, story)
    with guard.start(task="Customer NW-1042 asks for a refund of $49.99") as run:
        while run.proceed():
            args = _model_turn(story, run.steps)
            try:
                result = run.call_tool("issue_refund", refund, args, timeout=3.0)
                run.succeed(result)
            except tether.ToolError as exc:
                story.say("model", f'sees only: "{exc.model_message}"', "cyan")
    tether.telemetry.unsubscribe("breaker_change", on_breaker)
    out = run.outcome
    story.say("tether", f"run {out.status}: {out.stopped_because.name} — {out.detail}", "magenta")
    story.say(
        "service",
        f"{service.requests} requests reached the payment service; refunds issued: "
        f"{len(service.refunds)}",
        "green",
    )
    story.box("customer sees", out.customer_message)
    if handoffs:
        h = handoffs[0]
        lines = [
            f"  step {e['step']}: {e['tool']} "
            + ("ok" if e.get("ok") else f"failed: {e.get('error', '')}")
            for e in h.history
            if "tool" in e
        ]
        history = "\n".join(lines)
        story.box(
            "handoff to a person",
            f"case {h.id} · reason {h.reason.value}\n{h.task}\nhistory:\n{history}\n"
            f"open issues: {'; '.join(h.open_issues)}",
        )


def _act_two(story: Story, service: PaymentService) -> None:
    story.title("Act 2 · the refund commits, the response is lost")
    service.mode = "lose_response"
    workdir = Path(tempfile.mkdtemp(prefix="tether-demo-"))
    ledger = tether.Ledger.sqlite(str(workdir / "effects.db"))
    guard = tether.Guard(
        budget=tether.Budget(max_steps=6, max_seconds=20.0),
        retry=tether.RetryPolicy(max_attempts=1),  # the model sees the failure and tries again
        ledger=ledger,
        describe_effect=lambda tool, args, result: (
            f"your refund of ${args['amount'] / 100:.2f} was issued (reference {result['id']})"
        ),
        store=tether.stores.MemoryStore(),
    )
    refund = _issue_refund(service, story)
    lookup = _find_refund(service)

    def checked_lookup(key: str) -> Any:
        found = lookup(key)
        story.say(
            "ledger",
            "outcome unknown: reading the payment service's records… "
            + (f"found {found['id']}: not paying again" if found else "nothing there"),
            "green",
        )
        return found

    with guard.start(task="Customer NW-1042 asks for a refund of $49.99") as run:
        while run.proceed():
            args = _model_turn(story, run.steps)
            try:
                result = run.call_tool(
                    "issue_refund", refund, args, idempotent=False, lookup=checked_lookup
                )
                story.say("tether", f"issue_refund returned {result['id']}", "magenta")
                run.succeed(result)
            except tether.ToolError as exc:
                story.say("service", "committed the refund, then the connection dropped", "green")
                story.say(
                    "model",
                    f'sees only: "{exc.model_message}"; it will try again with a new UUID',
                    "cyan",
                )
    ledger.close()
    out = run.outcome
    story.say(
        "service",
        f"refunds issued for NW-1042: {len(service.refunds)} in its records "
        f"({', '.join(r['id'] for r in service.refunds if r['order'] == 'NW-1042')})",
        "green",
    )
    story.box("customer sees", out.customer_message)
    story.say(
        "tether",
        f"run {out.status}; the fact came from the ledger, not from the model's text",
        "magenta",
    )
