"""The tables classification reads: HTTP statuses, errnos, provider error codes and
exception names, each with the verdict it stands for (pure data)."""

from __future__ import annotations

import errno

from tether.providers import anthropic, openai_chat

__all__ = [
    "CANCELLATION",
    "GRPC_PERMANENT",
    "PERMANENT_5XX",
    "QUOTA_CODES",
    "QUOTA_MESSAGES",
    "RATE_CODES",
    "TIMEOUT_NAMES",
    "TRANSIENT_CODES",
    "TRANSIENT_ERRNOS",
    "TRANSIENT_STATUS",
    "UNKNOWN_NAMES",
    "UNSENT_ERRNOS",
    "UNSENT_NAMES",
]

TRANSIENT_STATUS = frozenset(
    {408, 425, 500, 502, 503, 504, 507, 508, 520, 521, 522, 523, 524, 529, 598, 599}
)
PERMANENT_5XX = frozenset({501, 505, 506, 510, 511})
TRANSIENT_ERRNOS = frozenset(
    {
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.ECONNREFUSED,
        errno.ETIMEDOUT,
        errno.EPIPE,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        errno.EHOSTDOWN,
        errno.EAGAIN,
    }
)
# errnos that prove the request never left: nothing can have happened upstream
UNSENT_ERRNOS = frozenset(
    {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN, errno.EHOSTDOWN}
)

QUOTA_CODES = (
    anthropic.QUOTA_CODES
    | openai_chat.QUOTA_CODES
    | frozenset(
        {
            # AWS, Google
            "LimitExceededException",
            "ServiceQuotaExceededException",
            "QUOTA_EXCEEDED",
        }
    )
)
RATE_CODES = frozenset(
    {
        "rate_limit_exceeded",
        "rate_limit_error",
        "ramp_limit_exceeded",
        "ratelimited",
        "rate_limited",
        "too_many_requests",
        "secondary_rate_limit",
        # AWS throttling (botocore Error.Code)
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "ProvisionedThroughputExceededException",
        "SlowDown",
        "RequestThrottled",
        "RequestThrottledException",
        "BandwidthLimitExceeded",
        "TransactionInProgressException",
        "EC2ThrottledException",
        # gRPC
        "RESOURCE_EXHAUSTED",
    }
)
TRANSIENT_CODES = frozenset(
    {
        "overloaded_error",
        "api_error",
        "server_error",
        "service_unavailable",
        "internal_error",
        "fatal_error",
        "request_timeout",
        "timeout",
        "lock_timeout",
        "idempotency_key_in_use",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "UNAVAILABLE",
        "DEADLINE_EXCEEDED",
        "ABORTED",
    }
)
GRPC_PERMANENT = frozenset(
    {
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "FAILED_PRECONDITION",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "UNAUTHENTICATED",
        "DATA_LOSS",
        "INTERNAL",
        "UNKNOWN",
        "CANCELLED",
    }
)
# Anthropic sends these as a 400 with no machine-readable code: a documented fallback (a
# pattern, compiled when first used)
QUOTA_MESSAGES = (
    r"(?i)credit balance is too low|reached your specified (?:api )?usage limits|"
    r"exceeded your current quota|spend limit"
)
# names of exception classes of httpx, requests, urllib3, aiohttp and the LLM SDKs,
# matched on the class hierarchy so that none of them needs importing
UNSENT_NAMES = frozenset(
    {
        "ConnectError",
        "ConnectTimeout",
        "ConnectTimeoutError",
        "NewConnectionError",
        "NameResolutionError",
        "ClientConnectorError",
        "ProxyError",
    }
)
UNKNOWN_NAMES = frozenset(
    {
        "ReadTimeout",
        "WriteTimeout",
        "PoolTimeout",
        "TimeoutException",
        "ReadError",
        "WriteError",
        "RemoteProtocolError",
        "NetworkError",
        "TransportError",
        "ProtocolError",
        "ChunkedEncodingError",
        "ServerDisconnectedError",
        "ClientOSError",
        "ServerTimeoutError",
        "ClientPayloadError",
        "APIConnectionError",
        "APITimeoutError",
        "IncompleteRead",
        "RemoteDisconnected",
        # anyio streams (the MCP SDK's transports): the peer went away mid-request
        "BrokenResourceError",
        "ClosedResourceError",
        "EndOfStream",
    }
)
TIMEOUT_NAMES = frozenset(
    {
        "ReadTimeout",
        "WriteTimeout",
        "PoolTimeout",
        "TimeoutException",
        "ConnectTimeout",
        "ServerTimeoutError",
        "APITimeoutError",
    }
)
CANCELLATION = ("CancelledError", "KeyboardInterrupt", "SystemExit", "GeneratorExit")
