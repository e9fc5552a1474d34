"""No secret reaches the model, the customer or the operator: every place tether writes or says.

One run per kind of failure (transient, permanent, internal, business rejection), with
secrets in the task, the tool arguments, the tool results and the error texts; then the
bytes of every SQLite file, the `tether` logger at DEBUG, the in-memory span exporter,
the handoff sink's records and the model's messages are searched for each secret.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import tether
from tether import (
    Checkpoints,
    DeadLetters,
    Escalation,
    Guard,
    Handoffs,
    RetryPolicy,
    StopReason,
    VirtualClock,
)
from tether._redact import redact_text

DSN = "postgresql://admin:hunter2pw@db-primary.internal.corp:5432/prod"
AWS = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
OPENAI_KEY = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz012345"
SECRETS = {
    "dsn password": "hunter2pw",
    "dsn host": "db-primary.internal.corp",
    "aws secret": AWS,
    "password": "p4ssw0rd-42",
    "query api key": "abc123secretvalue",
    "basic auth": "YWRtaW46aHVudGVyMg==",
    "token": "tok9f8e7d6c5b4a",
    "card": "4242424242424242",
    "repr password": "s3cr3t-pass",
    "openai key": OPENAI_KEY,
    "arg api key": "sk_live_51Habcdefghijklmnop",
    "arg password": "correct-horse-battery",
    "result card": "5555555555554444",
}
ERROR_TEXT = (
    f"connect to {DSN} failed (aws_secret_access_key={AWS}, password=p4ssw0rd-42, "
    "GET /v1/charges?api_key=abc123secretvalue, Authorization: Basic YWRtaW46aHVudGVyMg==, "
    "token=tok9f8e7d6c5b4a, card 4242424242424242, Creds(password='s3cr3t-pass'))"
)


class Creds:
    def __init__(self, password: str) -> None:
        self.password = password

    def __repr__(self) -> str:
        return f"Creds(password={self.password!r})"


FAILURES: dict[str, Any] = {
    "transient": lambda: ConnectionError(ERROR_TEXT),
    "permanent": lambda: KeyError(
        f"order A-1001 not in table orders (db=prod-eu-1, user=svc_refunds) {ERROR_TEXT}"
    ),
    "internal": lambda: RuntimeError(f"{Creds('s3cr3t-pass')!r} {ERROR_TEXT}"),
    "business": lambda: ValueError(f"refund rejected: order older than 90 days; {ERROR_TEXT}"),
}


def sqlite_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in folder.iterdir() if p.is_file())


def assert_clean(where: str, text: str | bytes) -> None:
    data = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    leaked = [name for name, secret in SECRETS.items() if secret in data]
    assert not leaked, f"{where} leaked {leaked}"


@pytest.mark.parametrize("kind", list(FAILURES))
def test_no_secret_reaches_any_audience(kind: str, tmp_path: Path, otel: Any,
                                        caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """Secrets in the task, arguments, results and errors appear nowhere tether writes or says."""
    exporter, _ = otel
    files = tmp_path / "files"
    files.mkdir()
    sink: list[Any] = []
    table = Handoffs.sqlite(str(files / "handoffs.db"))
    guard = Guard(
        clock=VirtualClock(),
        retry=RetryPolicy(max_attempts=3, base=0.01, cap=0.02),
        dead_letters=DeadLetters.sqlite(str(files / "letters.db")),
        checkpoints=Checkpoints.sqlite(str(files / "checkpoints.db")),
        ledger=tether.Ledger.sqlite(str(files / "ledger.db")),
        escalation=Escalation(sink=lambda record: (sink.append(record), table(record))),
    )

    def lookup_customer(email: str) -> dict[str, Any]:
        return {"email": email, "card_number": "5555555555554444", "note": "ok"}

    def refund(order: str, api_key: str, password: str) -> None:
        raise FAILURES[kind]()

    model_messages: list[str] = []
    with (
        caplog.at_level(logging.DEBUG, logger="tether"),
        guard.start(task=f"refund A-1 with key {OPENAI_KEY}") as run,
    ):
        run.proceed()
        run.call_tool("lookup_customer", lookup_customer, {"email": "c@example.com"})
        for _ in range(3):
            run.proceed()
            try:
                run.call_tool("refund", refund, {"order": "A-1", "api_key": "sk_live_51Habcdefghijklmnop",
                                                 "password": "correct-horse-battery"}, idempotent=kind == "transient")  # fmt: skip
            except tether.ToolError as exc:
                model_messages.append(exc.model_message)
        run.escalate("needs a person")
    out = run.outcome

    # the model
    assert model_messages, "the model heard about the failures"
    for message in model_messages:
        assert_clean("the model's message", message)
        assert (
            "svc_refunds" not in message and "orders" not in message and "Traceback" not in message
        )
    if kind == "business":
        assert model_messages[0].startswith("rejected: refund rejected: order older than 90 days")
    elif kind == "transient":
        assert "temporarily unavailable" in model_messages[0]
    else:
        assert model_messages[0].startswith("rejected: the tool could not do this")
    # the customer
    assert_clean("the customer message", out.customer_message)
    # the operator: the outcome, the files, the handoff sink, the logs, the spans
    for where, text in [
        ("detail", out.detail),
        ("open_issues", repr(out.open_issues)),
        ("error", repr(out.error)),
    ]:
        assert_clean(f"outcome.{where}", text)
    assert out.status == "escalated"
    assert sink and sink[0].task == "refund A-1 with key [redacted]"
    assert_clean("the handoff record", repr(sink[0].to_doc()))
    for closable in (guard.dead_letters, guard.checkpoints, table, guard.ledger):
        closable.close()  # type: ignore[union-attr]
    assert_clean("the SQLite files", sqlite_bytes(files))
    assert_clean("the tether logger", "\n".join(caplog.text.splitlines()))
    spans = exporter.get_finished_spans()
    assert spans
    for span in spans:
        assert_clean(f"span {span.name}", repr(dict(span.attributes or {})))
        for event in span.events:
            assert_clean(f"span event {event.name}", repr(dict(event.attributes or {})))


def test_retry_log_lines_say_what_failed_redacted(caplog: pytest.LogCaptureFixture) -> None:
    """A retry line names the function and carries the redacted exception text."""
    calls = []

    def charge_card() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError(f"reset by {DSN}")
        return "ok"

    with caplog.at_level(logging.INFO, logger="tether"):
        RetryPolicy(base=0.0, clock=VirtualClock()).call(charge_card)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("retry ")]
    assert (
        "charge_card" in line and "ConnectionError: reset by postgresql://[redacted]/prod" in line
    )


def test_redis_passwords_stay_out_of_logs_reprs_and_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A Redis URL's password is in no warning, repr or StoreUnavailable message."""
    from tether.stores import RedisStore

    url = "redis://:hunter2redis@127.0.0.1:1/0"
    store = RedisStore(url, socket_timeout=0.2)
    with caplog.at_level(logging.WARNING, logger="tether"):
        breaker = tether.CircuitBreaker("secret-redis", store=store)
        assert breaker.call(lambda: "ok") == "ok"
    assert "hunter2redis" not in repr(store)
    assert "hunter2redis" not in caplog.text and "is unavailable" in caplog.text
    with pytest.raises(tether.StoreUnavailable) as caught:
        tether.Ledger.redis(url, assume_durable=True).once("k", lambda: 1)
    assert "hunter2redis" not in str(caught.value)
    assert "hunter2redis" not in repr(tether.Ledger.redis(url, assume_durable=True))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Bearer abcdefghijklmnop", "Bearer [redacted]"),
        ("x-api-key: sk-ant-api03-abcdefghijklmnopqrstuvwxyz", "x-api-key: [redacted]"),
        ("AKIAIOSFODNN7EXAMPLE", "[redacted]"),
        ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", "[redacted]"),
        ("xoxb-1234567890-abcdefghij", "[redacted]"),
        ("AIzaSyA-1234567890abcdefghijklmnopqrstu", "[redacted]"),
        ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjMifQ.abcdefghijk", "[redacted]"),
        ("rk_live_51Habcdefghijklmnop", "[redacted]"),
        (
            '{"password": "hunter2", "idempotency_key": "abc"}',
            '{"password": "[redacted]", "idempotency_key": "abc"}',
        ),
        ("order 1234567890123 ok", "order 1234567890123 ok"),  # not a Luhn number
        ("4242 4242 4242 4242", "[redacted]"),
        ("paid with 4242424242424242.", "paid with [redacted]."),
        # ids whose hex holds a Luhn-valid digit run are not cards (a handoff id once was)
        ("handoff ho_00dc9935611846658d95", "handoff ho_00dc9935611846658d95"),
        ("max_tokens=1024 input_tokens: 10", "max_tokens=1024 input_tokens: 10"),
        ("refund rejected: order older than 90 days", "refund rejected: order older than 90 days"),
    ],
)
def test_text_patterns(text: str, expected: str) -> None:
    """Provider key shapes, JSON pairs and Luhn-checked cards; ordinary text is left alone."""
    assert redact_text(text) == expected


def test_users_add_names_and_patterns() -> None:
    """Own field names and own key shapes are redacted too."""
    tether.add_secret_names("license_code")
    tether.add_secret_patterns(r"\bACME-[0-9A-F]{12}\b")
    assert tether.redact({"license_code": "X-1", "note": "key ACME-0123456789AB"}) == {
        "license_code": "[redacted]",
        "note": "key [redacted]",
    }
    assert redact_text("license_code=X-1") == "license_code=[redacted]"


def test_tool_error_raised_on_purpose_reaches_the_model() -> None:
    """tether.ToolError("why") from a tool: the model reads its (redacted) text."""

    def refund(order: str) -> None:
        raise tether.ToolError("refund rejected: order older than 90 days (token=tok9f8e7d6c5b4a)")

    with Guard(clock=VirtualClock()).start() as run:
        run.proceed()
        with pytest.raises(tether.ToolError) as caught:
            run.call_tool("refund", refund, {"order": "A-1"})
        run.succeed()
    assert (
        caught.value.model_message == "refund rejected: order older than 90 days (token=[redacted])"
    )


def test_which_errors_reach_the_model_is_configurable() -> None:
    """Guard(model_errors=...) chooses the exceptions whose text the model may read."""

    class RuleBroken(Exception):
        pass

    def refund(order: str) -> None:
        raise RuleBroken("refunds above 500 need a manager")

    guard = Guard(clock=VirtualClock(), model_errors=(RuleBroken,))
    with guard.start() as run:
        run.proceed()
        with pytest.raises(tether.ToolError) as caught:
            run.call_tool("refund", refund, {"order": "A-1"})
        run.succeed()
    assert caught.value.model_message == "rejected: refunds above 500 need a manager"
    assert run.outcome.stopped_because is StopReason.GOAL_REACHED
