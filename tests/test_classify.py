"""Classification: one verdict for every failure shape an agent meets."""

from __future__ import annotations

import asyncio
import errno
import socket
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import anthropic
import openai
import pytest

import tether
from scripted_server import Reply, ScriptedServer
from tether import Kind, Verdict, classify

T, R, P, Q = Kind.TRANSIENT, Kind.RATE_LIMITED, Kind.PERMANENT, Kind.QUOTA


# --- seed 000 example 3 ------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "retryable"),
    [(TimeoutError(), True), (ValueError(), False), (ConnectionError(), True),
     (FileNotFoundError(), False)],
)  # fmt: skip
def test_seed_000_exceptions(exc: BaseException, retryable: bool) -> None:
    """The exception half of seed 000's example 3 table."""
    assert retryable == classify(exc).retryable


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(400, False), (404, False), (408, True), (429, True), (500, True), (503, True)],
)
def test_seed_000_statuses(status: int, retryable: bool) -> None:
    """The HTTP half of seed 000's example 3 table."""
    assert retryable == classify(status=status).retryable


# --- statuses ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"),
    [(408, T), (500, T), (502, T), (503, T), (504, T), (529, T), (429, R), (400, P), (401, P),
     (403, P), (404, P), (405, P), (410, P), (413, P), (422, P), (409, P), (425, T), (501, P)],
)  # fmt: skip
def test_status_table(status: int, kind: Kind) -> None:
    """Every status of the issue's table gets its kind."""
    assert kind == classify(status=status).kind


def test_409_with_should_retry_is_transient() -> None:
    """A 409 that the server marks retryable (a passing lock) is transient."""
    assert classify(status=409, headers={"x-should-retry": "true"}).kind == T


def test_should_retry_false_wins() -> None:
    """x-should-retry: false makes even a 503 permanent."""
    assert classify(status=503, headers={"x-should-retry": "false"}).kind == P


# --- built-ins ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (TimeoutError(), T),
        (ConnectionResetError(), T),
        (ConnectionRefusedError(), T),
        (BrokenPipeError(), T),
        (OSError(errno.ECONNRESET, "reset"), T),
        (OSError(errno.EHOSTUNREACH, "no route"), T),
        (OSError(errno.ENETUNREACH, "net unreachable"), T),
        (OSError(errno.ETIMEDOUT, "timed out"), T),
        (OSError(errno.ENOENT, "no file"), P),
        (PermissionError(), P),
        (FileNotFoundError(), P),
        (ValueError(), P),
        (TypeError(), P),
        (KeyError("x"), P),
        (RuntimeError("who knows"), P),
    ],
)
def test_builtin_exceptions(exc: BaseException, kind: Kind) -> None:
    """Built-in exceptions: network failures are transient, the rest permanent."""
    assert kind == classify(exc).kind


def test_refused_proves_nothing_was_sent() -> None:
    """A refused connection proves nothing happened; a reset leaves it unknown."""
    assert classify(ConnectionRefusedError()).outcome_unknown is False
    assert classify(ConnectionResetError()).outcome_unknown is True
    assert classify(TimeoutError()).outcome_unknown is True
    assert classify(TimeoutError()).timeout is True


def test_unknown_exception_is_permanent_and_says_how_to_teach() -> None:
    """Classify first, retry second: an unknown failure is never retried by default."""
    verdict = classify(RuntimeError("boom"))
    assert verdict.kind == P
    assert "register_classifier" in verdict.reason


def test_chain_is_walked() -> None:
    """A wrapper exception raised from a timeout classifies as the timeout."""

    class ToolError(Exception):
        pass

    try:
        try:
            raise TimeoutError("read timed out")
        except TimeoutError as inner:
            raise ToolError("search failed") from inner
    except ToolError as exc:
        assert classify(exc).kind == T


def test_context_chain_is_walked() -> None:
    """An exception raised while handling another one looks at the __context__."""

    class Wrapped(Exception):
        pass

    try:
        try:
            raise ConnectionResetError()
        except ConnectionResetError:
            raise Wrapped("x")  # noqa: B904
    except Wrapped as exc:
        assert classify(exc).kind == T


def test_cyclic_chain_terminates() -> None:
    """A cause cycle does not loop forever."""
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert classify(a).kind == P


@pytest.mark.parametrize(
    "exc", [asyncio.CancelledError(), KeyboardInterrupt(), SystemExit(0), GeneratorExit()]
)
def test_cancellation_is_not_retryable(exc: BaseException) -> None:
    """Cancellation is never a failure to retry."""
    assert classify(exc).retryable is False


# --- SDK shapes without their SDKs ---------------------------------------------------


class _Obj:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


class _Err(Exception):
    def __init__(self, **kw: Any) -> None:
        super().__init__("error")
        self.__dict__.update(kw)


@pytest.mark.parametrize(
    ("exc", "kind", "status"),
    [
        (_Err(status_code=503), T, 503),  # httpx-style, the LLM SDKs
        (_Err(response=_Obj(status_code=429, headers={})), R, 429),  # requests.HTTPError
        (_Err(status=404), P, 404),  # PyGithub, aiohttp
        (_Err(http_status=402, code="card_declined"), P, 402),  # stripe
        (_Err(http_status=429, code="rate_limit"), R, 429),  # stripe
        (_Err(response={"Error": {"Code": "ThrottlingException"},
                        "ResponseMetadata": {"HTTPStatusCode": 400}}), R, 400),  # botocore
        (_Err(response={"Error": {"Code": "ProvisionedThroughputExceededException"},
                        "ResponseMetadata": {"HTTPStatusCode": 400}}), R, 400),
        (_Err(response={"Error": {"Code": "ValidationException"},
                        "ResponseMetadata": {"HTTPStatusCode": 400}}), P, 400),
        (_Err(response={"Error": {"Code": "InternalError"},
                        "ResponseMetadata": {"HTTPStatusCode": 500}}), T, 500),
        (_Err(response={"ok": False, "error": "ratelimited"}), R, None),  # slack
        (_Err(response=_Obj(data={"ok": False, "error": "ratelimited"})), R, None),
        (_Err(response={"ok": False, "error": "channel_not_found"}), P, None),
    ],
)  # fmt: skip
def test_sdk_shapes(exc: BaseException, kind: Kind, status: int | None) -> None:
    """Status and code are read from every common SDK shape."""
    verdict = classify(exc)
    assert (kind, status) == (verdict.kind, verdict.status)


class _GrpcCode:
    def __init__(self, name: str) -> None:
        self.name = name


@pytest.mark.parametrize(
    ("name", "kind"),
    [("UNAVAILABLE", T), ("DEADLINE_EXCEEDED", T), ("RESOURCE_EXHAUSTED", R),
     ("INVALID_ARGUMENT", P), ("PERMISSION_DENIED", P)],
)  # fmt: skip
def test_grpc_codes(name: str, kind: Kind) -> None:
    """gRPC status codes (exc.code() -> StatusCode)."""

    class RpcError(Exception):
        def code(self) -> _GrpcCode:
            return _GrpcCode(name)

    assert kind == classify(RpcError()).kind


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (429, {"error": {"code": "insufficient_quota", "type": "insufficient_quota"}}, Q),
        (429, {"error": {"code": "rate_limit_exceeded"}}, R),
        (429, {"error": {"code": "organization_spend_limit_exceeded"}}, Q),
        (429, {"error": {"code": "project_spend_limit_exceeded"}}, Q),
        (429, {"error": {"code": "credit_balance_exhausted"}}, Q),
        (429, {"error": {"code": "organization_usage_limit_exceeded"}}, Q),
        (400, {"type": "error", "error": {"type": "invalid_request_error",
               "message": "Your credit balance is too low to access the Anthropic API."}}, Q),
        (400, {"type": "error", "error": {"type": "invalid_request_error",
               "message": "You have reached your specified API usage limits."}}, Q),
        (400, {"type": "error", "error": {"type": "invalid_request_error",
               "message": "messages: field required"}}, P),
        (529, {"type": "error", "error": {"type": "overloaded_error"}}, T),
        (429, {"type": "error", "error": {"type": "rate_limit_error"}}, R),
        (429, {"type": "error", "error": {"type": "rate_limit_error",
               "details": {"error_code": "enforced_spend_limit_reached"}}}, Q),
        (429, {"type": "error", "error": {"type": "rate_limit_error",
               "details": {"error_code": "contract_spend_limit_reached"}}}, Q),
        (429, {"type": "error", "error": {"type": "rate_limit_error",
               "details": {"error_code": "linked_organization_spend_limit_reached"}}}, Q),
        (429, {"type": "error", "error": {"type": "rate_limit_error",
               "details": {"error_code": "ramp_limit_exceeded"}}}, R),
        (402, {"type": "error", "error": {"type": "billing_error"}}, Q),
    ],
)  # fmt: skip
def test_provider_codes(status: int, body: Any, kind: Kind) -> None:
    """The two kinds of 429 (and Anthropic's 400s) are told apart by their codes."""
    assert kind == classify(status=status, body=body).kind


# --- Retry-After ---------------------------------------------------------------------

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "3"}, 3.0),
        ({"Retry-After": "1.5"}, 1.5),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after": format_datetime(datetime.fromtimestamp(NOW + 30, UTC), usegmt=True)}, 30.0),
        ({"retry-after": format_datetime(datetime.fromtimestamp(NOW - 30, UTC), usegmt=True)}, None),
        ({"retry-after": "soon"}, None),
        ({"retry-after": "-4"}, None),
        ({"retry-after": "nan"}, None),
        ({"x-ratelimit-reset-requests": "6m0s"}, 360.0),
        ({"x-ratelimit-reset-tokens": "20ms"}, 0.02),
        ({"x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "2.5s"}, 2.5),
        ({"anthropic-ratelimit-requests-reset":
          datetime.fromtimestamp(NOW + 12, UTC).isoformat().replace("+00:00", "Z")}, 12.0),
        ({"x-ratelimit-reset": str(int(NOW + 40))}, 40.0),
        ({}, None),
    ],
)  # fmt: skip
def test_retry_after(headers: dict[str, str], expected: float | None) -> None:
    """Retry-After in all its forms; garbage and past dates give None."""
    got = classify(status=429, headers=headers, now=NOW).retry_after
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


def test_reset_headers_only_for_rate_limits() -> None:
    """A provider reset header is not a reason to wait after a 500."""
    assert (
        classify(status=500, headers={"x-ratelimit-reset-requests": "5s"}, now=NOW).retry_after
        is None
    )


def test_classify_needs_something() -> None:
    """classify() with nothing to classify is a clear error."""
    with pytest.raises(ValueError, match="needs an exception"):
        classify()


# --- registered classifiers ----------------------------------------------------------


def test_register_classifier_is_tried_first() -> None:
    """A registered classifier wins over the built-in rules, and can be removed."""

    class Busy(Exception):
        pass

    def mine(exc: BaseException) -> Verdict | None:
        if isinstance(exc, Busy):
            return Verdict(Kind.RATE_LIMITED, "busy signal", retry_after=2.0)
        return None

    tether.register_classifier(mine)
    try:
        assert classify(Busy()).kind == R
        assert classify(Busy()).retry_after == 2.0
    finally:
        tether.unregister_classifier(mine)
    assert classify(Busy()).kind == P


# --- the real SDKs over loopback -----------------------------------------------------


def _anthropic(server: ScriptedServer, **kw: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="test-key", base_url=server.url, max_retries=0, **kw)


def _openai(server: ScriptedServer, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(api_key="test-key", base_url=server.url + "/v1", max_retries=0, **kw)


def _anthropic_error(server: ScriptedServer, reply: Reply, **kw: Any) -> BaseException:
    server.script = [reply]
    with _anthropic(server, **kw) as client, pytest.raises(anthropic.APIError) as info:
        client.messages.create(
            model="claude-test", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        )
    return info.value


def _openai_error(server: ScriptedServer, reply: Reply, **kw: Any) -> BaseException:
    server.script = [reply]
    with _openai(server, **kw) as client, pytest.raises(openai.APIError) as info:
        client.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "hi"}]
        )
    return info.value


def _anthropic_body(type_: str, message: str = "x", error_code: str | None = None) -> Any:
    err: dict[str, Any] = {"type": type_, "message": message}
    if error_code:
        err["details"] = {"error_code": error_code}
    return {"type": "error", "error": err}


@pytest.mark.parametrize(
    ("reply", "kind", "retry_after"),
    [
        (Reply(529, _anthropic_body("overloaded_error", "Overloaded")), T, None),
        (Reply(429, _anthropic_body("rate_limit_error"), {"retry-after": "7"}), R, 7.0),
        (Reply(429, _anthropic_body("rate_limit_error"), {"retry-after-ms": "1500"}), R, 1.5),
        (Reply(429, _anthropic_body("rate_limit_error", error_code="enforced_spend_limit_reached")), Q, None),
        (Reply(400, _anthropic_body("invalid_request_error",
               "Your credit balance is too low to access the Anthropic API.")), Q, None),
        (Reply(400, _anthropic_body("invalid_request_error", "max_tokens: required")), P, None),
        (Reply(401, _anthropic_body("authentication_error", "invalid x-api-key")), P, None),
        (Reply(500, _anthropic_body("api_error")), T, None),
        (Reply(409, _anthropic_body("api_error"), {"x-should-retry": "true"}), T, None),
        (Reply(503, _anthropic_body("api_error"), {"x-should-retry": "false"}), P, None),
    ],
)  # fmt: skip
def test_real_anthropic_errors(
    server: ScriptedServer, reply: Reply, kind: Kind, retry_after: float | None
) -> None:
    """Exceptions raised by the real anthropic SDK talking to a scripted server."""
    verdict = classify(_anthropic_error(server, reply))
    assert (kind, reply.status, retry_after) == (verdict.kind, verdict.status, verdict.retry_after)


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        (Reply(429, {"error": {"message": "quota", "type": "insufficient_quota", "code": "insufficient_quota"}}), Q),
        (Reply(429, {"error": {"message": "slow down", "type": "requests", "code": "rate_limit_exceeded"}},
               {"retry-after": "2"}), R),
        (Reply(500, {"error": {"message": "oops", "type": "server_error", "code": None}}), T),
        (Reply(400, {"error": {"message": "bad", "type": "invalid_request_error", "code": None}}), P),
        (Reply(404, {"error": {"message": "no model", "type": "invalid_request_error", "code": "model_not_found"}}), P),
    ],
)  # fmt: skip
def test_real_openai_errors(server: ScriptedServer, reply: Reply, kind: Kind) -> None:
    """Exceptions raised by the real openai SDK talking to a scripted server."""
    assert kind == classify(_openai_error(server, reply)).kind


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_real_sdk_connection_refused() -> None:
    """A refused connection through the SDK: transient, and nothing was sent."""
    client = anthropic.Anthropic(
        api_key="k", base_url=f"http://127.0.0.1:{_closed_port()}", max_retries=0
    )
    with pytest.raises(anthropic.APIConnectionError) as info:
        client.messages.create(model="m", max_tokens=1, messages=[{"role": "user", "content": "x"}])
    verdict = classify(info.value)
    assert (verdict.kind, verdict.outcome_unknown) == (T, False)


def test_real_sdk_timeout(server: ScriptedServer) -> None:
    """A read timeout through the SDK: transient, a timeout, outcome unknown."""
    exc = _openai_error(server, Reply(200, {}, delay=1.0), timeout=0.2)
    verdict = classify(exc)
    assert (verdict.kind, verdict.timeout, verdict.outcome_unknown) == (T, True, True)


def test_real_sdk_dropped_connection(server: ScriptedServer) -> None:
    """A connection dropped by the server mid-request: transient, outcome unknown."""
    exc = _anthropic_error(server, Reply(drop=True))
    verdict = classify(exc)
    assert (verdict.kind, verdict.outcome_unknown) == (T, True)


# --- the reset of the bucket that refused, not the longest ------------------------------

OPENAI_RESETS = {
    "x-ratelimit-limit-requests": "500",
    "x-ratelimit-remaining-requests": "499",
    "x-ratelimit-reset-requests": "5m59.8s",
    "x-ratelimit-limit-tokens": "30000",
    "x-ratelimit-remaining-tokens": "120",
    "x-ratelimit-reset-tokens": "0.44s",
}
TPM = (
    "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): "
    "Limit 30000, Used 29880, Requested 900. Please try again in 440ms."
)
RPM = "Rate limit reached for gpt-4o in organization org-x on requests per min (RPM): Limit 500"


def _openai_429(message: str, type_: str | None = None) -> Any:
    return {"error": {"message": message, "type": type_, "code": "rate_limit_exceeded"}}


@pytest.mark.parametrize(
    ("body", "headers", "retry_after"),
    [
        (_openai_429(TPM, "tokens"), {}, 0.44),
        (_openai_429(TPM), {}, 0.44),
        (_openai_429("slow down", "tokens"), {}, 0.44),
        (_openai_429(RPM, "requests"), {}, 359.8),
        (_openai_429("slow down", "requests"), {}, 359.8),
        # the error names no limit: the bucket with nothing left
        (_openai_429("slow down"), {"x-ratelimit-remaining-tokens": "0"}, 0.44),
        (_openai_429("slow down"), {"x-ratelimit-remaining-requests": "0"}, 359.8),
        # nothing left nowhere: the lowest share of its limit (120 of 30,000 tokens)
        (_openai_429("slow down"), {}, 0.44),
        # no levels at all: the longest (the safe side)
        (None, {"x-ratelimit-remaining-requests": "", "x-ratelimit-remaining-tokens": ""}, 359.8),
    ],
)  # fmt: skip
def test_an_openai_429_waits_for_the_bucket_that_refused(
    body: Any, headers: dict[str, str], retry_after: float
) -> None:
    """No Retry-After, tokens reset in 0.44 s and requests in 5m59.8s: the wait is the
    reset of the limit the error names, else of the bucket that is empty."""
    verdict = classify(status=429, headers=OPENAI_RESETS | headers, body=body)
    assert verdict.kind is R
    assert verdict.retry_after == pytest.approx(retry_after)


def test_an_anthropic_429_waits_for_the_bucket_that_refused() -> None:
    """Anthropic's buckets: the input-tokens limit named in the message wins."""
    now = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC).timestamp()
    headers = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-requests-reset": "2026-12-01T12:00:50Z",
        "anthropic-ratelimit-input-tokens-limit": "50000",
        "anthropic-ratelimit-input-tokens-remaining": "800",
        "anthropic-ratelimit-input-tokens-reset": "2026-12-01T12:00:02Z",
        "anthropic-ratelimit-output-tokens-limit": "8000",
        "anthropic-ratelimit-output-tokens-remaining": "0",
        "anthropic-ratelimit-output-tokens-reset": "2026-12-01T12:00:30Z",
    }
    message = (
        "This request would exceed the rate limit for your organization (org) of 50,000 "
        "input tokens per minute. For details, refer to: https://docs.anthropic.com"
    )
    named = classify(status=429, headers=headers, body=_anthropic_body("rate_limit_error", message), now=now)  # fmt: skip
    assert named.retry_after == pytest.approx(2.0)
    # the message names none: the output bucket is the one with nothing left
    unnamed = classify(status=429, headers=headers, body=_anthropic_body("rate_limit_error"), now=now)  # fmt: skip
    assert unnamed.retry_after == pytest.approx(30.0)


def test_the_real_openai_sdks_429_is_retried_after_the_tokens_reset(server: ScriptedServer) -> None:
    """Through the openai SDK and RetryPolicy: the retry waits about 0.44 s, not its 60 s cap."""
    exc = _openai_error(server, Reply(429, _openai_429(TPM, "tokens"), OPENAI_RESETS))
    assert classify(exc).retry_after == pytest.approx(0.44)
    clock = tether.VirtualClock()
    calls: list[float] = []

    def call() -> str:
        calls.append(clock.now())
        if len(calls) == 1:
            raise exc
        return "ok"

    assert tether.RetryPolicy(max_attempts=2, clock=clock).call(call) == "ok"
    assert 0.44 <= calls[1] - calls[0] < 2.0


# --- plain builtin exceptions: classified once per shape ------------------------------


def _reset() -> ConnectionResetError:
    return ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")


def test_a_plain_builtin_error_is_classified_once_per_shape() -> None:
    """What users' tools raise most (a builtin error, nothing set on it, nothing chained)
    keeps one verdict per type and errno: the retry failure path does not walk it again."""
    first = classify(_reset())
    assert first.kind == T and first.outcome_unknown
    assert classify(_reset()) is first
    assert classify(ConnectionResetError(errno.ETIMEDOUT, "x")) is not first  # another errno
    assert classify(TimeoutError()) is classify(TimeoutError())

    def silent(exc: BaseException) -> Verdict | None:
        return None

    tether.register_classifier(silent)  # asked first, says nothing: the rules' verdict
    try:
        assert classify(_reset()) is first
    finally:
        tether.unregister_classifier(silent)


def test_a_builtin_error_carrying_more_is_classified_whole() -> None:
    """An attribute set on it, a cause, or a registered classifier: the whole walk, as
    before (none of them read from the memo)."""
    classify(_reset())  # the plain shape remembered
    told = _reset()
    told.status_code = 429  # type: ignore[attr-defined]
    assert classify(told).kind == R
    try:
        raise ConnectionResetError(errno.ECONNRESET, "reset") from PermissionError("no")
    except ConnectionResetError as exc:
        assert classify(exc).kind == T  # the outer network error is the stronger evidence
        assert classify(exc) is not classify(_reset())

    def mine(exc: BaseException) -> Verdict | None:
        return Verdict(Kind.PERMANENT, "mine") if isinstance(exc, ConnectionResetError) else None

    tether.register_classifier(mine)
    try:
        assert classify(_reset()).reason == "mine"
    finally:
        tether.unregister_classifier(mine)
    assert classify(_reset()).kind == T
