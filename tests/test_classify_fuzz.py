"""classify never raises, and its waits are sane, whatever a dependency throws."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tether
from tether import Kind
from tether.classification._headers import RETRY_AFTER_CEILING

CI_SETTINGS = settings(max_examples=400, derandomize=True, deadline=None,
                       suppress_health_check=[HealthCheck.too_slow])  # fmt: skip

HEADER_NAMES = ["retry-after", "retry-after-ms", "x-should-retry", "x-ratelimit-reset-requests",
                "x-ratelimit-reset", "anthropic-ratelimit-tokens-reset", "ratelimit-reset", "X-Other"]  # fmt: skip
odd_text = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        [
            "-0",
            "1e308",
            "inf",
            "nan",
            "²",
            "0 JAN 3000000000 0:0",
            "9" * 5000,
            "1" * 400 + "h",
            "Wed, 21 Oct 2015 07:28:00 GMT",
            "2",
            "-5",
            "1.5",
        ]
    ),
)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), odd_text, st.binary(max_size=8)
)


class Exploding:
    """An object every access of which raises."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"no {name}")

    def __str__(self) -> str:
        raise RuntimeError("no str")

    def get(self, *args: Any) -> Any:
        raise RuntimeError("no get")


class BadMapping(dict):  # type: ignore[type-arg]
    def get(self, *args: Any) -> Any:
        raise RuntimeError("no get")


class PropertyError(Exception):
    @property
    def response(self) -> Any:
        raise RuntimeError("the property fails")

    @property
    def status_code(self) -> Any:
        raise RuntimeError("so does this one")


class NoStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")


class Response:
    def __init__(self, status: Any, headers: Any, body: Any) -> None:
        self.status_code = status
        self.headers = headers
        self.data = body


headers_st = st.one_of(
    st.none(),
    st.dictionaries(st.sampled_from(HEADER_NAMES), odd_text, max_size=4),
    st.just(BadMapping({"retry-after": "1"})),
    st.builds(Exploding),
)
bodies = st.one_of(
    st.none(),
    scalars,
    st.dictionaries(
        st.sampled_from(["error", "code", "type", "message", "details", "Error"]),
        st.one_of(
            scalars,
            st.dictionaries(
                st.sampled_from(["code", "type", "message", "error_code", "Code"]),
                scalars,
                max_size=3,
            ),
        ),
        max_size=3,
    ),
    st.just(BadMapping({"error": "x"})),
)


@st.composite
def exceptions(draw: st.DrawFn) -> BaseException:
    kind = draw(st.sampled_from([Exception, ValueError, TimeoutError, ConnectionError, OSError,
                                 PropertyError, NoStr, tether.TransientError]))  # fmt: skip
    exc = kind(draw(odd_text)) if kind is not OSError else OSError(draw(st.integers(-5, 200)), "x")
    for attr in draw(st.lists(st.sampled_from(["status_code", "status", "http_status", "code",
                                               "error_code", "type", "body", "headers"]), max_size=4)):  # fmt: skip
        try:
            value = (
                draw(bodies)
                if attr == "body"
                else draw(headers_st)
                if attr == "headers"
                else draw(scalars)
            )
            setattr(exc, attr, value)
        except (AttributeError, TypeError):
            pass
    if draw(st.booleans()) and not isinstance(exc, PropertyError):
        exc.response = draw(
            st.one_of(
                st.builds(Response, scalars, headers_st, bodies),  # type: ignore[attr-defined]
                st.builds(Exploding),
                bodies,
            )
        )
    if draw(st.booleans()):
        other = ValueError("inner")
        exc.__cause__ = other
        if draw(st.booleans()):
            other.__cause__ = exc  # a cycle
    return exc


def assert_sane(verdict: tether.Verdict) -> None:
    assert isinstance(verdict, tether.Verdict)
    wait = verdict.retry_after
    assert wait is None or (math.isfinite(wait) and 0 <= wait <= RETRY_AFTER_CEILING)
    assert wait is None or math.copysign(1.0, wait) == 1.0  # never -0.0


@CI_SETTINGS
@given(exceptions())
def test_classify_never_raises_on_any_exception(exc: BaseException) -> None:
    """Exceptions with arbitrary attributes, headers, bodies and cyclic chains: a verdict."""
    assert_sane(tether.classify(exc))


@CI_SETTINGS
@given(st.one_of(st.integers(), odd_text), headers_st, bodies)
def test_classify_never_raises_on_any_response(status: Any, headers: Any, body: Any) -> None:
    """Raw responses with odd statuses, headers and bodies: a verdict."""
    assert_sane(tether.classify(status=status, headers=headers, body=body))


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "0 JAN 3000000000 0:0"}, None),
        ({"retry-after": "-0"}, 0.0),
        ({"retry-after": "1e308"}, RETRY_AFTER_CEILING),
        ({"x-ratelimit-reset-requests": "1" * 400 + "h"}, None),
        ({"x-ratelimit-reset-requests": "30000h"}, RETRY_AFTER_CEILING),
    ],
)
def test_found_by_fuzzing(headers: dict[str, str], expected: float | None) -> None:
    """The inputs the adversarial pass found: no OverflowError, no inf, no -0.0."""
    verdict = tether.classify(status=429, headers=headers)
    assert verdict.retryable
    assert verdict.retry_after == expected
    assert_sane(verdict)


@pytest.mark.parametrize(
    "status",
    ["²", "9" * 5000, 10**5000, -1, "429x"],
    ids=["superscript", "long-str", "huge-int", "negative", "suffix"],
)
def test_odd_status_codes(status: Any) -> None:
    """Statuses that are not HTTP statuses are ignored, never parsed into a crash."""
    exc = Exception("boom")
    exc.status_code = status  # type: ignore[attr-defined]
    assert_sane(tether.classify(exc))


def test_numeric_string_status_classifies_like_the_int() -> None:
    """classify(status="429") is a rate limit, as 429 is."""
    assert tether.classify(status="429").kind is Kind.RATE_LIMITED  # type: ignore[arg-type]
    assert tether.classify(status=" 503 ").kind is Kind.TRANSIENT  # type: ignore[arg-type]


def test_a_broken_registered_classifier_is_skipped() -> None:
    """A user classifier that raises does not break classification."""

    def broken(exc: BaseException) -> tether.Verdict | None:
        raise RuntimeError("bug")

    tether.register_classifier(broken)
    try:
        assert tether.classify(TimeoutError()).kind is Kind.TRANSIENT
    finally:
        tether.unregister_classifier(broken)


QUOTA_BODY = {"error": {"message": "You exceeded your current quota", "type": "insufficient_quota",
                        "code": "insufficient_quota"}}  # fmt: skip
SPEND_BODY = {"type": "error", "error": {"type": "rate_limit_error", "message": "spend limit",
              "details": {"error_code": "credit_balance_exhausted"}}}  # fmt: skip


@pytest.mark.parametrize("body", [QUOTA_BODY, SPEND_BODY])
def test_httpx_status_error_reads_the_body(body: dict[str, Any]) -> None:
    """httpx.HTTPStatusError for a 429 whose body says quota: QUOTA, not retried."""
    request = httpx.Request("POST", "http://127.0.0.1/v1/x")
    response = httpx.Response(429, json=body, request=request)
    with pytest.raises(httpx.HTTPStatusError) as caught:
        response.raise_for_status()
    assert tether.classify(caught.value).kind is Kind.QUOTA
    plain = httpx.Response(429, json={"error": {"type": "rate_limit_error"}}, request=request)
    with pytest.raises(httpx.HTTPStatusError) as caught:
        plain.raise_for_status()
    assert tether.classify(caught.value).kind is Kind.RATE_LIMITED


def test_requests_http_error_reads_the_body() -> None:
    """requests.HTTPError for a 429 insufficient_quota: QUOTA."""
    import json

    response = requests.models.Response()
    response.status_code = 429
    response._content = json.dumps(QUOTA_BODY).encode()
    response.headers["content-type"] = "application/json"
    error = requests.HTTPError("429 Client Error", response=response)
    assert tether.classify(error).kind is Kind.QUOTA
