"""Failure classification: busy, or no such number?

:func:`classify` turns any failure an agent meets (an exception of any SDK, or a raw
HTTP status with headers and body) into one :class:`Verdict`. It is a pure function:
no I/O, no sleeping.

Decisions that are not obvious:

* **409 Conflict is permanent.** It says the request conflicts with the current state
  of the resource (a duplicate create, a stale version); sending the same bytes again
  meets the same state. Servers that use 409 for a passing lock (the Anthropic and
  OpenAI APIs, Stripe's ``lock_timeout`` and ``idempotency_key_in_use``) say so with
  ``x-should-retry: true`` or an error code, and those win.
* **425 Too Early is transient.** RFC 8470: the server refused a request that might be
  replayed from TLS early data; the same request after the handshake succeeds.
* **Unknown exceptions are permanent.** Classify first, retry second: retrying
  everything turns a bug into an expensive loop. Teach tether a new shape with
  :func:`register_classifier`.
* **Cancellation is not a failure.** ``asyncio.CancelledError``, ``KeyboardInterrupt``,
  ``SystemExit`` and ``GeneratorExit`` are never caught by tether's retry loops.
"""

from __future__ import annotations

import enum
import errno
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from tether._errors import (
    CircuitOpenError,
    DeadlineExceeded,
    EffectInProgress,
    LimiterTimeout,
    StoreUnavailable,
    TransientError,
)
from tether._frozen import Value, frozen_dataclass
from tether.classification._headers import (
    _header,
    limit_named,
    retry_after_from_headers,
    sane_wait,
)
from tether.classification._tables import (
    CANCELLATION,
    GRPC_PERMANENT,
    PERMANENT_5XX,
    QUOTA_CODES,
    QUOTA_MESSAGES,
    RATE_CODES,
    TIMEOUT_NAMES,
    TRANSIENT_CODES,
    TRANSIENT_ERRNOS,
    TRANSIENT_STATUS,
    UNKNOWN_NAMES,
    UNSENT_ERRNOS,
    UNSENT_NAMES,
)

__all__ = ["Kind", "Verdict", "classify", "register_classifier", "unregister_classifier"]


class Kind(enum.Enum):
    """What kind of failure this is, and so what to do about it."""

    TRANSIENT = "transient"  # busy: retry with backoff
    RATE_LIMITED = "rate_limited"  # busy: wait (Retry-After), then retry
    PERMANENT = "permanent"  # no such number: retrying repeats the failure
    QUOTA = "quota"  # a spend or credit limit: retries will not help until it resets


@frozen_dataclass
class Verdict(Value):
    """The classification of one failure."""

    kind: Kind
    reason: str
    status: int | None = None
    code: str | None = None
    retry_after: float | None = None
    #: True when the failure leaves it open whether a write took effect (a timeout, a
    #: reset after sending, a 5xx); False when it proves nothing happened (connection
    #: refused, a 4xx or a 429 rejected the request).
    outcome_unknown: bool = False
    #: True when the failure was a timeout (a retry after a timeout costs more budget).
    timeout: bool = False
    #: True when the failure is tether's own and not the dependency's (another worker
    #: holds the effect's claim, tether's store did not answer): nothing was sent, so
    #: breakers and limiters do not count it.
    local: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "retry_after", sane_wait(self.retry_after))

    @property
    def retryable(self) -> bool:
        return self.kind in (Kind.TRANSIENT, Kind.RATE_LIMITED)


Classifier = Callable[[BaseException], "Verdict | None"]
_classifiers: list[Classifier] = []
_classifiers_lock = threading.Lock()


def register_classifier(fn: Classifier) -> Classifier:
    """Add a classifier, tried before the built-in rules on every exception of a chain.

    ``fn(exc)`` returns a :class:`Verdict`, or ``None`` to leave ``exc`` to the next
    classifier. Usable as a decorator; returns ``fn``.
    """
    with _classifiers_lock:
        _classifiers.insert(0, fn)
    return fn


def unregister_classifier(fn: Classifier) -> None:
    """Remove a classifier added with :func:`register_classifier`."""
    with _classifiers_lock:
        if fn in _classifiers:
            _classifiers.remove(fn)


# strength of a verdict: the strongest in an exception chain wins, the outermost first
_REGISTERED, _PROTOCOL, _NETWORK, _GENERIC_NETWORK, _WEAK = 5, 4, 3, 2, 1


# --- helpers ------------------------------------------------------------------------


def _body_codes(body: Any, add: Callable[[Any], None]) -> str:
    """Add the error codes a response body names; returns its message text."""
    message = ""
    if not isinstance(body, Mapping):
        return message
    err = body.get("error", body)
    if isinstance(err, Mapping):
        details = err.get("details")
        if isinstance(details, Mapping):
            add(details.get("error_code"))
        add(err.get("code"))
        add(err.get("type"))
        msg = err.get("message")
        message = msg if isinstance(msg, str) else ""
    elif isinstance(err, str):  # Slack: {"ok": false, "error": "ratelimited"}
        add(err)
    boto = body.get("Error")
    if isinstance(boto, Mapping):  # botocore ClientError.response
        add(boto.get("Code"))
        message = message or _text(boto.get("Message", ""))
    return message


def _codes_and_message(body: Any, exc: BaseException | None) -> tuple[list[str], str]:
    """Error codes in priority order (most specific first), and the message text."""
    codes: list[str] = []

    def add(value: Any) -> None:
        if isinstance(value, str) and value and value not in codes:
            codes.append(value)

    try:
        message = _body_codes(body, add)
    except Exception:  # a body whose mapping methods fail says nothing
        message = ""
    if exc is not None:
        add(_attr(exc, "error_code"))  # anthropic: error.details.error_code
        code = _attr(exc, "code")
        if callable(code):  # gRPC: exc.code() -> StatusCode
            try:
                code = code()
            except Exception:
                code = None
            code = _attr(code, "name") or code
        add(code)
        add(_attr(exc, "type"))
        if not message:
            message = _text(exc)
    return codes, message


def _verdict_from_response(
    status: int | None,
    headers: Any,
    body: Any,
    exc: BaseException | None,
    now_wall: float | None,
) -> Verdict | None:
    codes, message = _codes_and_message(body, exc)
    kind: Kind | None = None
    reason = ""
    code: str | None = None
    for c in codes:
        if c in QUOTA_CODES:
            kind, code, reason = Kind.QUOTA, c, f"quota or spend limit ({c})"
        elif c in RATE_CODES:
            kind, code, reason = Kind.RATE_LIMITED, c, f"rate limited ({c})"
        elif c in TRANSIENT_CODES:
            kind, code, reason = Kind.TRANSIENT, c, f"transient ({c})"
        elif c in GRPC_PERMANENT:
            kind, code, reason = Kind.PERMANENT, c, f"permanent ({c})"
        if kind is not None:
            break
    if code is None and codes:
        code = codes[0]
    if kind is None and status in (400, 402, 403, 429) and re.search(QUOTA_MESSAGES, message):
        kind, reason = Kind.QUOTA, "quota or spend limit (from the error message)"
    if kind is None and status is not None:
        if status == 429:
            kind, reason = Kind.RATE_LIMITED, "HTTP 429 Too Many Requests"
        elif status in TRANSIENT_STATUS or (500 <= status < 600 and status not in PERMANENT_5XX):
            kind, reason = Kind.TRANSIENT, f"HTTP {status}"
        elif status >= 400:
            kind, reason = Kind.PERMANENT, f"HTTP {status}"
        else:
            kind, reason = Kind.PERMANENT, f"HTTP {status} is not an error status"
    if kind is None:
        if not codes:
            return None
        return None if exc is not None else Verdict(Kind.PERMANENT, f"error {codes[0]}", code=code)
    should_retry = _header(headers, "x-should-retry")
    if should_retry == "true" and not (kind is Kind.TRANSIENT or kind is Kind.RATE_LIMITED):
        kind, reason = Kind.TRANSIENT, f"{reason}; server sent x-should-retry: true"
    elif should_retry == "false" and kind in (Kind.TRANSIENT, Kind.RATE_LIMITED):
        kind, reason = Kind.PERMANENT, f"{reason}; server sent x-should-retry: false"
    retry_after = None
    if kind in (Kind.TRANSIENT, Kind.RATE_LIMITED):
        retry_after = retry_after_from_headers(
            headers,
            now_wall=now_wall,
            include_reset=kind is Kind.RATE_LIMITED,
            limit=limit_named(codes, message),
        )
    unknown = kind is Kind.TRANSIENT and (status is None or status >= 500 or status == 408)
    return Verdict(
        kind,
        reason,
        status=status,
        code=code,
        retry_after=retry_after,
        outcome_unknown=unknown,
        timeout=status in (408, 504) or code == "DEADLINE_EXCEEDED",
    )


def _int(value: Any) -> int | None:
    """An HTTP status (100-999) from an int or a numeric string; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        value = value.strip()
        if not (value.isascii() and value.isdigit() and len(value) <= 3):
            return None
        value = int(value)
    if isinstance(value, int) and 100 <= value <= 999:
        return int(value)
    return None


def _attr(obj: Any, name: str) -> Any:
    """``getattr`` that never raises: a property that fails counts as absent."""
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def _text(value: Any) -> str:
    try:
        return str(value)
    except Exception:
        return f"<{type(value).__name__}>"


def _response_json(response: Any) -> Any:
    """The JSON body an httpx or requests response carries (already read), or None."""
    module = type(response).__module__.split(".")[0]
    if module not in ("httpx", "requests"):
        return None
    try:
        return response.json()
    except Exception:
        return None


#: What the MCP SDK says when a streamable HTTP server no longer knows the session (it
#: restarted, or expired it): the server's 404 body, or the client's words for a bare 404.
_SESSION_LOST = ("session not found", "session terminated")


def session_lost(exc: BaseException) -> bool:
    """An MCP request refused because the server lost its session (``MCPError`` "Session
    not found", or an HTTP 404 saying so): refused before anything ran."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & {"MCPError", "McpError"}:
        error = _attr(exc, "error")
        text = str(_attr(error, "message") or "") if error is not None else str(exc)
        return text.strip().lower() in _SESSION_LOST
    status = _int(_attr(exc, "status_code")) or _int(_attr(_attr(exc, "response"), "status_code"))
    if status != 404:
        return False
    said = f"{exc} {_attr(_attr(exc, 'response'), 'text') or ''}"
    return _SESSION_LOST[0] in said.lower()


def _registered(exc: BaseException) -> Verdict | None:
    """The verdict of the first registered classifier that gives one."""
    for fn in list(_classifiers):
        try:
            verdict = fn(exc)
        except Exception:  # a broken classifier never breaks classification
            continue
        if isinstance(verdict, Verdict):
            return verdict
    return None


def _from_exception(
    exc: BaseException, now_wall: float | None, registered: bool = True
) -> tuple[int, Verdict] | None:
    """The verdict one exception carries by itself, with its strength; None if none.
    ``registered``: the registered classifiers are asked first (False: the rules alone)."""
    verdict = _registered(exc) if registered and _classifiers else None
    if verdict is not None:
        return _REGISTERED, verdict
    names = {cls.__name__ for cls in type(exc).__mro__}
    if isinstance(exc, DeadlineExceeded):
        return _PROTOCOL, Verdict(Kind.PERMANENT, "the call's deadline was exceeded", timeout=True)
    if isinstance(exc, TransientError):
        return _PROTOCOL, Verdict(
            Kind.TRANSIENT, f"{type(exc).__name__}: marked transient by the caller"
        )
    if isinstance(exc, CircuitOpenError | LimiterTimeout):
        return _PROTOCOL, Verdict(Kind.TRANSIENT, str(exc))
    if isinstance(exc, EffectInProgress):  # not a failure: another attempt is running it
        return _PROTOCOL, Verdict(
            Kind.TRANSIENT,
            "another attempt holds this effect's claim: a retry replays its outcome",
            local=True,
        )
    if isinstance(exc, StoreUnavailable) and "LedgerNotDurable" not in names:
        return _PROTOCOL, Verdict(
            Kind.TRANSIENT, "tether's store did not answer; nothing was executed", local=True
        )
    if not isinstance(exc, Exception) or names & set(CANCELLATION):
        return _PROTOCOL, Verdict(Kind.PERMANENT, f"{type(exc).__name__}: cancellation")

    if session_lost(exc):
        return _PROTOCOL, Verdict(
            Kind.TRANSIENT,
            f"{type(exc).__name__}: the MCP server lost the session (a restart): nothing "
            "ran; a new session may retry it",
        )

    # an HTTP-ish response: status on the exception or on its response
    response = _attr(exc, "response")
    status = None
    for attr in ("status_code", "http_status", "status"):
        status = _int(_attr(exc, attr))
        if status is not None:
            break
    if status is None and response is not None:
        status = _int(_attr(response, "status_code")) or _int(_attr(response, "status"))
    headers = _attr(exc, "headers")
    if headers is None and response is not None:
        headers = _attr(response, "headers")
    body = _attr(exc, "body")
    if body is None:
        body = _attr(exc, "json_body")  # stripe
    if isinstance(response, Mapping):  # botocore ClientError.response, Slack dicts
        body = response
        meta = response.get("ResponseMetadata")
        if isinstance(meta, Mapping):
            status = status or _int(meta.get("HTTPStatusCode"))
            headers = headers or meta.get("HTTPHeaders")
    elif response is not None and body is None:
        data = _attr(response, "data")  # slack_sdk SlackResponse
        body = data if isinstance(data, Mapping) else _response_json(response)
    verdict = _verdict_from_response(status, headers, body, exc, now_wall)
    if verdict is not None:
        return _PROTOCOL, verdict

    # network-layer failures
    if names & UNSENT_NAMES or isinstance(exc, ConnectionRefusedError):
        return _NETWORK, Verdict(
            Kind.TRANSIENT,
            f"{type(exc).__name__}: connection not established",
            timeout=bool(names & TIMEOUT_NAMES),
        )
    if isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS:
        return _NETWORK, Verdict(
            Kind.TRANSIENT,
            f"{type(exc).__name__} ({errno.errorcode.get(exc.errno, exc.errno)})",
            outcome_unknown=exc.errno not in UNSENT_ERRNOS,
            timeout=exc.errno == errno.ETIMEDOUT,
        )
    if isinstance(exc, TimeoutError) or names & TIMEOUT_NAMES:
        return _NETWORK, Verdict(
            Kind.TRANSIENT, f"{type(exc).__name__}: timed out", outcome_unknown=True, timeout=True
        )
    if isinstance(exc, ConnectionError) or names & UNKNOWN_NAMES:
        strength = _NETWORK if isinstance(exc, ConnectionError) else _GENERIC_NETWORK
        return strength, Verdict(
            Kind.TRANSIENT, f"{type(exc).__name__}: connection failed", outcome_unknown=True
        )
    if "gaierror" in names:  # DNS failure: nothing was sent
        return _NETWORK, Verdict(Kind.TRANSIENT, "name resolution failed")
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 32:
        seen.add(id(current))
        yield current
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )


#: A program's own mistakes (a missing import, a misspelt name or attribute, a call with
#: the wrong signature, code that does not parse): never retried, never turned into words
#: for the model or the customer; an adapter ends and files the run, then raises them, as
#: a plain Python program would. The one list every adapter reads.
PROGRAMMING_ERRORS: tuple[type[BaseException], ...] = (
    ImportError,
    NameError,
    AttributeError,
    TypeError,
    SyntaxError,
)


def programming_error(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a program's own mistake (:data:`PROGRAMMING_ERRORS`)."""
    return isinstance(exc, PROGRAMMING_ERRORS)


def classify(
    exc: BaseException | None = None,
    *,
    status: int | None = None,
    headers: Mapping[str, str] | None = None,
    body: Any = None,
    now: float | None = None,
) -> Verdict:
    """Classify a failure: an exception of any shape, or a raw HTTP response.

    The exception's ``__cause__``/``__context__`` chain is walked; the most specific
    evidence wins (a registered classifier, then an HTTP status or provider error code,
    then a network error), the outermost first. ``now`` is the wall time used to read
    HTTP-date ``Retry-After`` values (default: the system clock).

    >>> classify(status=429, headers={"retry-after": "2"}).retry_after
    2.0
    >>> classify(TimeoutError()).kind
    <Kind.TRANSIENT: 'transient'>
    >>> classify(ValueError("bad date")).retryable
    False
    """
    if exc is None:
        if status is None and body is None:
            raise ValueError("classify() needs an exception, or status=/body= of a response")
        code = _int(status)
        try:
            verdict = _verdict_from_response(code, headers, body, None, now)
        except Exception as error:  # never raise on odd input: say so in the verdict
            return Verdict(
                Kind.PERMANENT, f"unreadable response ({type(error).__name__})", status=code
            )
        return verdict or Verdict(Kind.PERMANENT, "unrecognised response", status=code)
    try:
        return _classify_exception(exc, now)
    except Exception as error:
        return Verdict(
            Kind.PERMANENT,
            f"{type(exc).__name__}: could not be classified ({type(error).__name__}); "
            "treated as permanent",
        )


#: the verdicts of plain builtin exceptions, by (type, errno): what users' tools raise most
#: (``ConnectionResetError``, ``TimeoutError``...), classified once per shape
_PLAIN: dict[tuple[type, Any], Verdict] = {}


def _plain_key(exc: BaseException) -> tuple[type, Any] | None:
    """The shape of an exception whose verdict the built-in rules give from its type and
    errno alone: a builtin type, no attribute set on it, nothing chained (None: not)."""
    kind = type(exc)
    if (
        kind.__module__ != "builtins"
        or exc.__dict__
        or exc.__cause__ is not None
        or (exc.__context__ is not None and not exc.__suppress_context__)
    ):
        return None
    return kind, getattr(exc, "errno", None)


def _classify_exception(exc: BaseException, now: float | None) -> Verdict:
    key = _plain_key(exc)
    if key is None:
        return _classify_chain(exc, now)
    # one exception, nothing chained: the registered classifiers first, as the walk asks
    # them, then the built-in rules' verdict for its shape
    verdict = _registered(exc) if _classifiers else None
    if verdict is not None:
        return verdict
    found = _PLAIN.get(key)
    if found is None:
        found = _classify_chain(exc, now, registered=False)
        if len(_PLAIN) < 512:  # errnos are open-ended: the memo is not
            _PLAIN[key] = found
    return found


def _classify_chain(exc: BaseException, now: float | None, registered: bool = True) -> Verdict:
    best: tuple[int, Verdict] | None = None
    for link in _chain(exc):
        found = _from_exception(link, now, registered)
        if found is not None and (best is None or found[0] > best[0]):
            best = found
            if found[0] >= _PROTOCOL:
                break
    if best is not None:
        return best[1]
    name = type(exc).__name__
    if programming_error(exc):
        return Verdict(Kind.PERMANENT, f"{name}: a programming error; a retry would repeat it")
    if isinstance(exc, ValueError | TypeError | KeyError | LookupError | AttributeError | OSError):
        return Verdict(Kind.PERMANENT, f"{name}: a retry would repeat it")
    return Verdict(
        Kind.PERMANENT,
        f"{name}: unrecognised failure, treated as permanent "
        "(teach tether with tether.register_classifier)",
    )
