"""No secret reaches the model, the customer or the operator: every place tether writes or says.

One run per kind of failure (transient, permanent, internal, business rejection), with
secrets in the task, the tool arguments, the tool results and the error texts; then the
bytes of every SQLite file, the `tether` logger at DEBUG, the in-memory span exporter,
the handoff sink's records and the model's messages are searched for each secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import logging
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

import tether
from scripted_server import Reply, ScriptedServer, Seen
from tether import (
    Checkpoints,
    DeadLetters,
    Escalation,
    Guard,
    Handoffs,
    Records,
    RetryPolicy,
    StopReason,
    Tool,
    VirtualClock,
)
from tether.redaction._redact import redact_text

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
def test_no_secret_reaches_any_audience(
    kind: str, tmp_path: Path, otel: Any, caplog: pytest.LogCaptureFixture
) -> None:
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
                run.call_tool(
                    "refund",
                    refund,
                    {
                        "order": "A-1",
                        "api_key": "sk_live_51Habcdefghijklmnop",
                        "password": "correct-horse-battery",
                    },
                    idempotent=kind == "transient",
                )
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


# --- every secret shape and every false positive, over every surface -----------------------------
#
# The shapes the redaction missed once (issue: 22 of 39 probed), and those the maintained
# scanners know (gitleaks' rule ids, detect-secrets' plugins), each as a tool's error text, as an
# argument and as a result, through run_agent (sync, on SQLite records) and arun_agent (async, on
# PostgreSQL records) against a scripted Claude API; then the records database's bytes, every page
# of `tether serve`, the outcome (partial, error, open issues, detail, messages, handoff), what
# the model read, the OpenTelemetry spans and the tether logger are searched.

PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n"
    "VTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK\n-----END RSA PRIVATE KEY-----"
)
AZURE_KEY = "Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cQ=="


def luhn_complete(prefix: str) -> str:
    """``prefix`` with the check digit that makes it pass the Luhn check."""
    for digit in "0123456789":
        total = 0
        for i, ch in enumerate(reversed(prefix + digit)):
            d = int(ch) * (2 if i % 2 else 1)
            total += d - 9 if d > 9 else d
        if total % 10 == 0:
            return prefix + digit
    raise AssertionError("unreachable")


class Shape:
    """A secret as a tool says it in an error (``text``) and as it holds it (``value``)."""

    def __init__(self, text: str, secret: str, value: Any = None) -> None:
        self.text, self.secret = text, secret
        self.value = value if value is not None else {"note": text}


SHAPES: dict[str, Shape] = {
    # the ones the redaction missed
    "pem-private-key": Shape(
        f"could not sign: {PEM}", "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun"
    ),
    "azure-account-key": Shape(
        f"DefaultEndpointsProtocol=https;AccountName=acme;AccountKey={AZURE_KEY};EndpointSuffix=core.windows.net",
        AZURE_KEY[:40],
    ),
    "azure-shared-access-key": Shape(
        "Endpoint=sb://acme.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=AB1C2DeFGHIJ3KLmNOpQrst4uVWXYZaBCDefghijKlm=",
        "AB1C2DeFGHIJ3KLmNOpQrst4uVWXYZaBCDefghijKlm",
    ),
    "azure-sas-sig": Shape(
        "GET https://acme.blob.core.windows.net/c/b.txt?sv=2022-11-02&sp=r&se=2025-01-01T00:00:00Z&sig=Xk9%2FqTz7vLm2bN4pR8sW1yU6cE3hJ0aD5fG%2BiK%3D: 403",
        "Xk9%2FqTz7vLm2bN4pR8sW1yU6cE3hJ0aD5fG",
    ),
    "gitlab-pat": Shape("GitLab refused glpat-xY7zK9mN2pQ4rS6tU8vW (401)", "xY7zK9mN2pQ4rS6tU8vW"),
    "gitlab-runner-token": Shape(
        "runner glrt-t1_Ab3De5Gh7Jk9Lm1Np3Qr is not registered", "Ab3De5Gh7Jk9Lm1Np3Qr"
    ),
    "google-oauth-client-secret": Shape(
        "invalid_client for 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", "1a2B3c4D5e6F7g8H9i0JkLmNoPqR"
    ),
    "slack-webhook-url": Shape(
        "POST https://hooks.slack.com/services/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 answered 500",
        "Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2",
    ),
    "npm-access-token": Shape(
        "npm ERR! 401 Unauthorized with npm_Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2",
        "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2",
    ),
    "npmrc-auth-token": Shape(
        "//registry.npmjs.org/:_authToken=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
        "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
    ),
    "huggingface-access-token": Shape(
        "401 Client Error for hf_aBcDeFgHiJkLmNoPqRsTuVwXyZaBcDeFgH",
        "aBcDeFgHiJkLmNoPqRsTuVwXyZaBcDeFgH",
    ),
    "sendgrid-api-token": Shape(
        "SendGrid said 403 to 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",
        "TwL2iGABf9DHoTf-09kqeF8tAmbihYzrnopKc",
    ),
    "twilio-api-key": Shape(
        "Twilio 20003 for SK2f3e4d5c6b7a89012345678901abcdef", "2f3e4d5c6b7a89012345678901abcdef"
    ),
    "token-in-url": Shape(
        "git clone https://ghx7Yz9Wq2Lm4Np6Rs8Tu0Vw@github.com/acme/repo.git failed",
        "ghx7Yz9Wq2Lm4Np6Rs8Tu0Vw",
    ),
    "my-password-is": Shape(
        "the customer wrote: my password is Tr0ub4dor&3, please reset it", "Tr0ub4dor&3"
    ),
    "camelcase-access-token": Shape(
        '{"accessToken": "at-9f8e7d6c5b4a3210", "expiresIn": 3600}',
        "at-9f8e7d6c5b4a3210",
        {"accessToken": "at-9f8e7d6c5b4a3210", "expiresIn": 3600},
    ),
    "camelcase-client-secret": Shape(
        "OAuthConfig(clientId='app-1', clientSecret='cs_q1w2e3r4t5y6u7i8')",
        "cs_q1w2e3r4t5y6u7i8",
        {"clientId": "app-1", "clientSecret": "cs_q1w2e3r4t5y6u7i8"},
    ),
    "camelcase-private-key": Shape(
        "privateKey=mK8nL2pQ9rS4tV7wX1yZ",
        "mK8nL2pQ9rS4tV7wX1yZ",
        {"privateKey": "mK8nL2pQ9rS4tV7wX1yZ"},
    ),
    "headers-as-pairs": Shape(
        "headers=[('Accept', 'application/json'), ('X-Api-Key', 'k3y-9a8b7c6d5e4f')]",
        "k3y-9a8b7c6d5e4f",
        {"headers": [["Accept", "application/json"], ["X-Api-Key", "k3y-9a8b7c6d5e4f"]]},
    ),
    "name-value-record": Shape(
        '[{"name": "api_key", "value": "v4lue-1q2w3e4r5t"}]',
        "v4lue-1q2w3e4r5t",
        {"fields": [{"name": "api_key", "value": "v4lue-1q2w3e4r5t"}]},
    ),
    "lowercase-bearer": Shape(
        "authorization: bearer zz9yy8xx7ww6vv5", "zz9yy8xx7ww6vv5", {"bearer": "zz9yy8xx7ww6vv5"}
    ),
    "passcode": Shape("passcode=749201 rejected", "749201", {"passcode": "749201"}),
    # the ones it knew, kept
    "anthropic-api-key": Shape(
        "x-api-key: sk-ant-api03-abcdefghijklmnopqrstuvwxyz012345",
        "abcdefghijklmnopqrstuvwxyz012345",
    ),
    "openai-api-key": Shape(
        "Incorrect API key provided: sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz012345",
        "AbCdEfGhIjKlMnOpQrStUvWxYz012345",
    ),
    "stripe-access-token": Shape(
        "No such key: sk_live_51HabcdefghijklmnopQRST", "51HabcdefghijklmnopQRST"
    ),
    "github-pat": Shape(
        "Bad credentials for ghp_abcdefghijklmnopqrstuvwxyz0123456789",
        "abcdefghijklmnopqrstuvwxyz0123456789",
    ),
    "aws-access-token": Shape("InvalidClientTokenId AKIAIOSFODNN7EXAMPLE", "IOSFODNN7EXAMPLE"),
    "gcp-api-key": Shape(
        "API key not valid: AIzaSyA-1234567890abcdefghijklmnopqrstu",
        "SyA-1234567890abcdefghijklmnopqrstu",
    ),
    "slack-bot-token": Shape(
        "invalid_auth for xoxb-1234567890-0987654321-AbCdEfGhIjKl", "0987654321-AbCdEfGhIjKl"
    ),
    "jwt": Shape(
        "expired: eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    ),
    "dsn-password": Shape(
        "connect to postgresql://admin:hunter2pw@db-primary.internal.corp:5432/prod failed",
        "hunter2pw",
    ),
    "basic-auth-header": Shape("Authorization: Basic YWRtaW46aHVudGVyMg==", "YWRtaW46aHVudGVyMg=="),
    "password-pair": Shape(
        "login failed (user=svc, password=p4ssw0rd-42)",
        "p4ssw0rd-42",
        {"user": "svc", "password": "p4ssw0rd-42"},
    ),
    "card-number": Shape(
        "card 4242424242424242 was declined",
        "4242424242424242",
        {"card_number": "4242424242424242"},
    ),
    "card-number-grouped": Shape("paid with 5555 5555 5555 4444.", "5555 5555 5555 4444"),
    "telegram-bot-token": Shape(
        "Telegram 401 for 123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw0",
        "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw0",
    ),
    "azure-ad-client-secret": Shape(
        "AADSTS7000215 for abc8Q~dEfGhIjKlMnOpQrStUvWxYz0123456789",
        "dEfGhIjKlMnOpQrStUvWxYz0123456789",
    ),
    "digitalocean-pat": Shape("401 for dop_v1_" + "0a1b2c3d" * 8, "0a1b2c3d" * 8),
}

# texts the redaction once blanked: they must reach every surface unchanged
NANOSECONDS = luhn_complete("171455895112345678")  # 19 digits, a nanosecond timestamp
FALSE_POSITIVES: dict[str, str] = {
    "session-steps": "session: 3 steps",
    "auth-ok": "auth: ok",
    "pin-zip": "pin: 94107",
    "nanosecond-timestamp": f"ts={NANOSECONDS}",
    "nanosecond-timestamp-prose": f"event at {NANOSECONDS} ns",
    "order-number": f"order {luhn_complete('453957876362148')} shipped",  # Visa-like, Luhn-valid
    "order-id-field": f"order_id={luhn_complete('601100099013942')}",  # Discover-like, Luhn-valid
    "invoice-number": f"invoice #{luhn_complete('510510510510510')}",  # Mastercard-like
    "fourteen-digits": f"created {luhn_complete('2024011512345')}",  # 14 digits, no card range
    "token-counts": "max_tokens=1024 input_tokens: 10",
    "basic-details": "we need basic details from the customer",
    "token-expired": "the token is expired",
    "handoff-id": "handoff ho_00dc9935611846658d95",
}


def test_the_false_positives_really_pass_the_card_check() -> None:
    """The digit runs above pass Luhn: they are kept because of their context or range."""
    from tether.redaction._secret_text import _luhn

    for text in FALSE_POSITIVES.values():
        for run in re.findall(r"\d{13,19}", text):
            assert _luhn(run), run


POSITIONS = ("argument", "result", "error")


def _otel() -> tuple[Any, Any]:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.util._once import Once

    from tether import telemetry

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace.set_tracer_provider(provider)
    telemetry.reset()
    return exporter, provider


def _otel_off(provider: Any) -> None:
    from opentelemetry import trace
    from opentelemetry.util._once import Once

    from tether import telemetry

    provider.shutdown()
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    telemetry.reset()


class Surfaces:
    """Everything tether wrote or said in the runs of one case, by surface."""

    def __init__(self) -> None:
        self.outcomes: dict[tuple[str, str], tether.Outcome] = {}
        self.model: dict[str, list[str]] = {}  # what the model read, by case
        self.spans: dict[str, str] = {}
        self.logs: dict[str, str] = {}
        self.pages: dict[str, str] = {}
        self.records = ""

    def of(self, case: str, surface: str) -> str:
        if surface == "records":
            return self.records
        if surface == "page":
            return self.pages[case]
        if surface == "outcome":
            return "\n".join(
                repr(
                    (
                        o.partial,
                        o.error,
                        o.open_issues,
                        o.detail,
                        o.customer_message,
                        o.messages,
                        o.handoff.to_doc() if o.handoff else None,
                    )
                )
                for (c, _), o in self.outcomes.items()
                if c == case
            )
        if surface == "model":
            return "\n".join(self.model[case])
        return getattr(self, surface)[case]  # type: ignore[no-any-return]


SURFACES = ("records", "page", "outcome", "model", "spans", "logs")


def claude_message(content: list[dict[str, Any]], stop: str = "end_turn") -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-haiku-4-5",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 100, "output_tokens": 20},
    }


def scripted_claude(server: ScriptedServer, position: str, value: Any, read: list[str]) -> None:
    """The model calls the probe tool once (with ``value`` as its arguments when the case is
    an argument), then answers; ``read`` collects the tool results it was sent."""

    def reply(seen: Seen) -> Reply:
        last = seen.body["messages"][-1]
        if last["role"] == "user" and isinstance(last["content"], list):  # a tool result
            read.extend(json.dumps(block) for block in last["content"])
            return Reply(200, claude_message([{"type": "text", "text": "done"}]))
        args = value if position == "argument" else {}
        use = {"type": "tool_use", "id": "tu_1", "name": "probe", "input": args}
        return Reply(200, claude_message([use], "tool_use"))

    server.handler = reply


def probe_tool(position: str, text: str, value: Any) -> Tool:
    def probe(**kwargs: Any) -> Any:
        if position == "error":
            raise ValueError(text)  # a business rule: its (redacted) text reaches the model
        return value if position == "result" else {"ok": True}

    return Tool("probe", probe, input_schema={"type": "object"}, idempotent=False, label="probe")


CASES = {
    **{k: (v.text, v.value) for k, v in SHAPES.items()},
    **{k: (v, {"note": v}) for k, v in FALSE_POSITIVES.items()},
}


def _agent_run(
    guard: Guard, server: ScriptedServer, tools: list[Tool], prompt: str, shell: str
) -> tether.Outcome:
    from tether.integrations import anthropic as t_anthropic

    messages = [{"role": "user", "content": prompt}]
    if shell == "sync":
        with anthropic.Anthropic(api_key="t", base_url=server.url) as raw:
            return t_anthropic.run_agent(
                raw, model="claude-haiku-4-5", messages=messages, tools=tools, guard=guard
            )

    async def main() -> tether.Outcome:
        async with anthropic.AsyncAnthropic(api_key="t", base_url=server.url) as raw:
            return await t_anthropic.arun_agent(
                raw, model="claude-haiku-4-5", messages=messages, tools=tools, guard=guard
            )

    return asyncio.run(main())


def _all_cases(records: Records, surfaces: Surfaces, server: ScriptedServer, shell: str) -> None:
    """One run per case and position, plus a run whose own code fails with the text."""
    from tether.testing import capture_logs

    exporter, provider = _otel()
    try:
        for case, (text, value) in CASES.items():
            guard = Guard(
                clock=VirtualClock(),
                records=records,
                escalation=Escalation(),
                retry=RetryPolicy(max_attempts=2, base=0.01, cap=0.02),
            )
            read: list[str] = []
            with capture_logs() as logs:
                for position in POSITIONS:
                    scripted_claude(server, position, value, read)
                    tools = [probe_tool(position, text, value)]
                    prompt = f"case {case} ({position})"
                    surfaces.outcomes[(case, position)] = _agent_run(
                        guard, server, tools, prompt, shell
                    )
                surfaces.outcomes[(case, "own code")] = _failing_run(guard, case, text, shell)
            surfaces.model[case] = read
            surfaces.logs[case] = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in logs)
            surfaces.spans[case] = "\n".join(
                repr(
                    (
                        s.name,
                        dict(s.attributes or {}),
                        [(e.name, dict(e.attributes or {})) for e in s.events],
                    )
                )
                for s in exporter.get_finished_spans()
            )
            exporter.clear()
    finally:
        _otel_off(provider)


def _failing_run(guard: Guard, case: str, text: str, shell: str) -> tether.Outcome:
    """A run whose own code fails with ``text`` (the run records it, the error goes on)."""
    run = guard.start(task=f"case {case} (own code)")
    with pytest.raises(RuntimeError):
        if shell == "sync":
            with run:
                run.proceed()
                raise RuntimeError(text)
        else:

            async def main() -> None:
                async with run:
                    run.proceed()
                    raise RuntimeError(text)

            asyncio.run(main())
    return run.outcome


def _pages(records: Records, surfaces: Surfaces) -> None:
    from starlette.testclient import TestClient

    from tether.serve import create_app

    client = TestClient(create_app(records), base_url="http://127.0.0.1:8765")
    shared = [client.get(path).text for path in ("/runs", "/inbox", "/dead-letters")]
    for letter in records.dead_letters.list(limit=1000):
        shared.append(client.get(f"/dead-letters/{letter.id}").text)
    for case in CASES:
        own = [
            client.get(f"/runs/{o.run_id}").text
            for (c, _), o in surfaces.outcomes.items()
            if c == case
        ]
        surfaces.pages[case] = "\n".join([*own, *shared])


@pytest.fixture(scope="module", params=["sync-sqlite", "async-postgres"])
def surfaces(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, pg_dsn: str
) -> Surfaces:
    """Every case run through one shell into one kind of records database."""
    shell, backend = request.param.split("-")
    found = Surfaces()
    table = f"tether_secrets_{uuid.uuid4().hex[:8]}"
    path = tmp_path_factory.mktemp("secrets") / "records.db"
    records = (
        Records.sqlite(str(path)) if backend == "sqlite" else Records.postgres(pg_dsn, table=table)
    )
    with ScriptedServer() as server:
        _all_cases(records, found, server, shell)
    _pages(records, found)
    if backend == "sqlite":
        records.close()
        found.records = b"".join(p.read_bytes() for p in path.parent.iterdir()).decode(
            "utf-8", "replace"
        )
    else:
        records.close()
        found.records = _postgres_rows(pg_dsn, table)
    return found


def _postgres_rows(dsn: str, table: str) -> str:
    """Every row of every table the records made (documents, run index, ledger, replays),
    as text; the tables of this test are dropped."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' "
                "AND (table_name LIKE %s OR table_name = 'tether_replays')",
                (f"{table}%",),
            ).fetchall()
        ]
        assert table in names and f"{table}_ledger" in names, names
        text = "\n".join(
            " ".join(map(str, row))
            for name in names
            for row in conn.execute(f"SELECT * FROM {name}").fetchall()
        )
        for name in names:
            if name.startswith(table):
                conn.execute(f"DROP TABLE {name}")
    return text


def _forms(secret: str) -> list[str]:
    """The secret as text, as JSON escapes it and as HTML escapes it."""
    return [
        secret,
        json.dumps(secret)[1:-1],
        html.escape(secret),
        html.escape(json.dumps(secret)[1:-1]),
    ]


@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize("case", list(SHAPES))
def test_no_shape_reaches_any_surface(surfaces: Surfaces, case: str, surface: str) -> None:
    """Each secret shape, as error text, argument and result, is absent from the surface."""
    where = surfaces.of(case, surface)
    assert where.strip(), f"{surface} holds nothing"
    leaked = [
        where[max(0, where.find(f) - 160) : where.find(f) + 40]
        for f in _forms(SHAPES[case].secret)
        if f in where
    ]
    assert not leaked, f"{case} leaked into {surface}: {leaked[0]!r}"


@pytest.mark.parametrize("surface", ["records", "page", "outcome", "model"])
@pytest.mark.parametrize("case", list(FALSE_POSITIVES))
def test_no_false_positive_is_blanked_on_any_surface(
    surfaces: Surfaces, case: str, surface: str
) -> None:
    """Useful text that looks a little like a secret reaches every surface unchanged."""
    text = FALSE_POSITIVES[case]
    assert redact_text(text) == text and tether.redact({"note": text}) == {"note": text}
    where = surfaces.of(case, surface)
    assert any(form in where for form in _forms(text)), f"{case} was blanked on {surface}"


@pytest.mark.parametrize("case", list(SHAPES))
def test_redaction_is_idempotent(case: str) -> None:
    """Redacting twice gives what redacting once gave (never "[redacted]]")."""
    shape = SHAPES[case]
    once_text, once_value = redact_text(shape.text), tether.redact(shape.value)
    assert shape.secret not in once_text and shape.secret not in json.dumps(once_value)
    assert redact_text(once_text) == once_text and tether.redact(once_value) == once_value
    assert "[redacted]]" not in once_text and "[[redacted]" not in once_text


# --- personal data, the user's own secrets, tether serve --secrets --------------------------------


@pytest.fixture
def forget_registrations() -> Iterator[None]:
    """Names, patterns and settings registered by a test are forgotten after it."""
    from tether.redaction import _redact

    yield
    _redact._reset()


def test_personal_data_is_masked_for_the_model_and_the_page(forget_registrations: None) -> None:
    """E-mail addresses and phone numbers in a failure: masked in what the model reads and on
    the page; kept in the records (a person may need them); register_secrets(mask_pii=False)
    shows them."""
    from starlette.testclient import TestClient

    from tether.serve import create_app

    said = "no account for ana.silva@example.com (phone +351 912 345 678, or (415) 555-0100)"

    def lookup(email: str) -> None:
        raise ValueError(said)

    records = Records.memory()
    with Guard(clock=VirtualClock(), records=records).start(task="find the customer") as run:
        run.proceed()
        with pytest.raises(tether.ToolError) as caught:
            run.call_tool("lookup", lookup, {"email": "ana.silva@example.com"})
        run.fail("not found")
    assert (
        caught.value.model_message == "rejected: no account for [email] (phone [phone], or [phone])"
    )
    page = (
        TestClient(create_app(records), base_url="http://127.0.0.1:8765")
        .get(f"/runs/{run.run_id}")
        .text
    )
    letters = (
        TestClient(create_app(records), base_url="http://127.0.0.1:8765").get("/dead-letters").text
    )
    assert "ana.silva@example.com" not in page + letters and "[email]" in letters
    assert records.dead_letters.list()[0].args == {"email": "ana.silva@example.com"}
    tether.register_secrets(mask_pii=False)
    assert (
        "ana.silva@example.com"
        in TestClient(create_app(records), base_url="http://127.0.0.1:8765")
        .get("/dead-letters")
        .text
    )


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("write to c@example.com", "write to [email]"),
        ("call +1 415 555 0100 today", "call [phone] today"),
        ("tel: 912345678", "tel: [phone]"),
        ("order 1200-195 Lisboa on 2024-05-03 10:22:31, v1.2.3, 10.0.0.1", None),  # no phones
        ("order 4242424242424242 for c@example.com", "order 4242424242424242 for [email]"),
    ],
)
def test_what_counts_as_personal_data(text: str, masked: str | None) -> None:
    """Addresses and numbers people are reached at; dates, postcodes, versions are not."""
    assert redact_text(text, pii=True) == (masked or text)
    assert redact_text(text) == text  # secrets only, unless asked
    assert redact_text(redact_text(text, pii=True), pii=True) == (masked or text)


def test_register_secrets_adds_names_patterns_and_the_pii_setting(
    forget_registrations: None,
) -> None:
    """One hook: names (camelCase, dashes alike), patterns, mask_pii; bad input says what."""
    tether.register_secrets(names=["license_code"], patterns=[r"\bACME-[0-9A-F]{12}\b"])
    assert tether.redact({"licenseCode": "L-1", "note": "ACME-0123456789AB"}) == {
        "licenseCode": "[redacted]",
        "note": "[redacted]",
    }
    assert redact_text("license-code: L-1") == "license-code: [redacted]"
    with pytest.raises(TypeError, match="take lists"):
        tether.register_secrets(names="license_code")
    with pytest.raises(ValueError, match="not a regular expression"):
        tether.register_secrets(patterns=["(unclosed"])
    with pytest.raises(ValueError, match="non-empty strings"):
        tether.register_secrets(names=[""])
    with pytest.raises(TypeError, match="mask_pii"):
        tether.register_secrets(mask_pii="no")  # type: ignore[arg-type]


def test_a_weak_name_keeps_plain_values_in_structured_data() -> None:
    """``auth: ok`` and ``session: {steps: 3}`` stay; a PIN, a session token do not."""
    assert tether.redact(
        {
            "auth": "ok",
            "session": {"id": "s-1", "steps": 3},
            "pin": "1234",
            "token": "tok9f8e7d6c5b4a",
            "sessionToken": "x",
        }
    ) == {
        "auth": "ok",
        "session": {"id": "s-1", "steps": 3},
        "pin": "[redacted]",
        "token": "[redacted]",
        "sessionToken": "[redacted]",
    }


SERVE_SECRETS = """
import tether

def secrets():
    return {"names": ["ticket_pass"], "patterns": [r"\\bINTERNAL-[0-9]{6}\\b"]}

def register():
    tether.register_secrets(patterns=[r"\\bVAULT-[a-z]{8}\\b"])
"""


def test_tether_serve_loads_the_users_secrets_from_a_module_and_a_file(tmp_path: Path) -> None:
    """``tether serve --secrets module:fn --secrets file.toml``: the pages redact them."""
    import os
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    records = Records.sqlite(str(tmp_path / "records.db"))
    task = "ticket_pass=open-sesame, INTERNAL-123456, VAULT-abcdefgh, partner key PK-7f3a9b2c"
    with Guard(clock=VirtualClock(), records=records).start(task=task) as run:
        run.fail("stop here")
    records.close()
    (tmp_path / "mysecrets.py").write_text(SERVE_SECRETS)
    (tmp_path / "more.toml").write_text(
        'patterns = ["\\\\bPK-[0-9a-f]{8}\\\\b"]\nmask_pii = true\n'
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [
        sys.executable,
        "-c",
        "import sys; from tether.cli import main; sys.exit(main(sys.argv[1:]))",
        "serve",
        "--db",
        "records.db",
        "--port",
        str(port),
        "--secrets",
        "mysecrets:secrets",
        "--secrets",
        "mysecrets:register",
        "--secrets",
        "more.toml",
    ]
    server = subprocess.Popen(
        command,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": ""},
    )
    try:
        deadline, page = time.monotonic() + 20, ""
        while time.monotonic() < deadline and not page:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/runs/{run.run_id}", timeout=2
                ) as r:
                    page = r.read().decode()
            except OSError:
                assert server.poll() is None, server.communicate()[1].decode()
                time.sleep(0.1)
    finally:
        server.terminate()
        server.communicate(timeout=10)
    assert "stop here" in page
    for secret in ("open-sesame", "INTERNAL-123456", "VAULT-abcdefgh", "PK-7f3a9b2c"):
        assert secret not in page, secret


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("nomodule:fn", "No module named"),
        ("no-colon", "module:function"),
        ("missing.toml", "No such file"),
        ("bad.toml", "unknown setting 'secret_names'"),
    ],
)
def test_tether_serve_refuses_secrets_it_cannot_load(
    spec: str,
    says: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A --secrets that cannot be read stops the command (exit 2), saying why."""
    from tether.cli import main

    Records.sqlite(str(tmp_path / "records.db")).close()
    (tmp_path / "bad.toml").write_text('secret_names = ["x"]\n')
    monkeypatch.chdir(tmp_path)
    assert main(["serve", "--db", "records.db", "--secrets", spec]) == 2
    assert says in capsys.readouterr().err


# --- honest promises: a person is promised only when a case is filed --------------------------------

PROMISE = re.compile(r"member of our team|our team|a person|colleague", re.I)


def _ending(reason: str, run: tether.Run) -> None:
    """Bring ``run`` to the ending named ``reason`` (after one completed refund)."""

    def refund(order: str) -> dict[str, str]:
        return {"id": "re_1"}

    def charge(order: str) -> None:
        raise TimeoutError("read timed out")  # the charge may have happened

    run.proceed()
    run.call_tool("issue_refund", refund, {"order": "A-1"}, idempotent=False, label="refund")
    if reason == "unknown_outcome":
        with pytest.raises(tether.Stopped):
            run.call_tool(
                "charge_card",
                charge,
                {"order": "A-1"},
                idempotent=False,
                timeout=1.0,
                label="payment",
            )
    elif reason == "repeated_action":
        for _ in range(3):
            run.proceed()
            run.call_tool("search", lambda q: [], {"q": "A-1"})
    elif reason == "truncated":
        run.stop(StopReason.TRUNCATED, "the reply was cut at the token limit")
    elif reason == "escalated":
        run.escalate("the customer asked for a person")
    elif reason == "permanent_error":
        raise LookupError("no such order")


ENDINGS = ["unknown_outcome", "repeated_action", "truncated", "escalated", "permanent_error"]
WHERE = ["nowhere", "records", "sink", "broken sink"]


def _guard_for(where: str, records: Records, sink: list[Any]) -> Guard:
    def broken(record: Any) -> None:
        raise ConnectionError("the ticket system is down")

    options: dict[str, Any] = {
        "clock": VirtualClock(),
        "retry": RetryPolicy(max_attempts=2, base=0.01, cap=0.02),
    }
    if where == "records":
        options["records"] = records
    elif where == "sink":
        options["escalation"] = Escalation(sink=sink.append)
    elif where == "broken sink":
        options["escalation"] = Escalation(sink=broken)
    return Guard(**options)


@pytest.mark.parametrize("shell", ["sync", "async"])
@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("reason", ENDINGS)
def test_a_person_is_promised_only_when_a_case_is_filed(
    reason: str, where: str, shell: str
) -> None:
    """After UNKNOWN_OUTCOME, REPEATED_ACTION, TRUNCATED, an escalation, a permanent error:
    the customer is told a person will reply exactly when a case exists (in the records,
    hence in the inbox, or delivered to a sink); the tool's name is never said."""
    from starlette.testclient import TestClient

    from tether.serve import create_app

    records, sink = Records.memory(), []
    guard = _guard_for(where, records, sink)
    run = guard.start(task=f"refund A-1 ({reason}, {where})")
    if shell == "sync":
        with contextlib.suppress(LookupError), run:
            _ending(reason, run)
    else:

        async def main() -> None:
            async with run:
                _ending(reason, run)

        with contextlib.suppress(LookupError):
            asyncio.run(main())
    out = run.outcome
    filed = [h for h in records.handoffs.list() if h["run_id"] == run.run_id] + [
        h for h in sink if h.run_id == run.run_id
    ]
    promised = bool(PROMISE.search(out.customer_message))
    assert promised == bool(filed), (out.status, out.customer_message)
    assert "issue_refund" not in out.customer_message and "charge_card" not in out.customer_message
    assert "Done: refund completed (reference re_1)" in out.customer_message
    if where == "records" and reason in ("unknown_outcome", "escalated", "permanent_error"):
        assert filed and out.status == "escalated"  # records= files the default triggers' cases
        assert (
            f"refund A-1 ({reason}, records)"
            in TestClient(create_app(records), base_url="http://127.0.0.1:8765").get("/inbox").text
        )
    if reason == "unknown_outcome":  # may have happened: never an invitation to do it again
        assert "do not repeat" in out.customer_message and "try again" not in out.customer_message
    if out.status == "escalated" and not filed:
        assert any("reached no one" in issue for issue in out.open_issues)


def test_run_agent_says_the_label_of_a_tool_never_its_name() -> None:
    """``Tool(..., label="refund")`` through run_agent: "Done: refund completed."."""
    from tether.integrations import anthropic as t_anthropic

    with ScriptedServer() as server:

        def reply(seen: Seen) -> Reply:
            if len(seen.body["messages"]) > 1:
                return Reply(200, claude_message([{"type": "text", "text": "Refunded."}]))
            use = {
                "type": "tool_use",
                "id": "tu_1",
                "name": "issue_refund",
                "input": {"order": "A-1"},
            }
            return Reply(200, claude_message([use], "tool_use"))

        server.handler = reply
        tool = Tool("issue_refund", lambda order: {"id": "re_9"}, idempotent=False, label="refund")
        with anthropic.Anthropic(api_key="t", base_url=server.url) as raw:
            out = t_anthropic.run_agent(
                raw,
                model="claude-haiku-4-5",
                tools=[tool],
                guard=Guard(clock=VirtualClock()),
                messages=[{"role": "user", "content": "refund A-1"}],
            )
    assert (
        out.customer_message == "Your request is complete. Done: refund completed (reference re_9)."
    )
    unlabelled = Guard(clock=VirtualClock())
    with unlabelled.start() as run:
        run.proceed()
        run.call_tool(
            "issue_refund", lambda order: {"id": "re_1"}, {"order": "A-1"}, idempotent=False
        )
        run.succeed()
    assert "issue_refund" not in run.outcome.customer_message
    assert "a step of your request completed (reference re_1)" in run.outcome.customer_message
    with pytest.raises(TypeError, match="label"):
        Tool("x", lambda: None, label=3)  # type: ignore[arg-type]
    with Guard().start() as run, pytest.raises(ValueError, match="label"):
        run.call_tool("x", lambda: None, label=" ")
