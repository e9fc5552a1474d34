"""``tether.wrap``: retries for connector SDK clients, with one idempotency key per call.

Only the method paths named in ``retryable`` are retried (on transient failures, as
classified by :func:`tether.classify`); every other method passes straight through.
An idempotency key is minted once, before attempt 1, and sent on every attempt in
the connector's native way, so the provider deduplicates the retries. With a
``ledger``, the key is the call's intent key and the whole call runs at most once:
the model re-issuing the same refund with a fresh UUID gets the recorded result.
"""

from __future__ import annotations

import contextvars
import inspect
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tether._errors import Picklable
from tether.effects._canonical import VOLATILE_FIELDS, intent_key
from tether.retries._policy import RetryPolicy

if TYPE_CHECKING:
    from tether.effects._ledger import Ledger
    from tether.guards._breaker import CircuitBreaker

__all__ = ["CONNECTORS", "CallMeta", "Connector", "ResponseStatusError", "wrap"]


#: A method call's request ids: at the top level of the request, that is of its keyword
#: arguments, of a body passed as ``params=``/``json=``/``data=`` (Stripe, httpx) and of each
#: positional mapping; a field deeper down (``destination={"uuid": ...}``) is data.
_CALL_VOLATILE = tuple(
    f"{where}.{f}"
    for where in ("kwargs", "kwargs.params", "kwargs.json", "kwargs.data", "args.*")
    for f in sorted(VOLATILE_FIELDS)
)


@dataclass(frozen=True, slots=True)
class CallMeta:
    """What a wrapped call did: the method, its attempts and the idempotency key."""

    method: str
    attempts: int
    idempotency_key: str | None
    retried: bool


KeyInjector = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any], str], None]


def _stripe(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], key: str
) -> None:
    """StripeClient services take ``options={"idempotency_key": ...}``; legacy ``idempotency_key=``."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    if "options" in params:
        options = dict(kwargs.get("options") or {})
        options.setdefault("idempotency_key", key)
        kwargs["options"] = options
    else:
        kwargs.setdefault("idempotency_key", key)


def _header(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], key: str
) -> None:
    """Plain HTTP clients (httpx, requests): an ``Idempotency-Key`` header."""
    headers = dict(kwargs.get("headers") or {})
    headers.setdefault("Idempotency-Key", key)
    kwargs["headers"] = headers


def _none(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], key: str) -> None:
    """APIs with no idempotency key (GitHub, Slack): retry only what is safe to repeat."""


class ResponseStatusError(Picklable, Exception):
    """A plain HTTP client answered with a retryable error status (httpx and requests
    return such responses instead of raising): the attempt counts as failed.

    After the last attempt the wrapped call returns the final response, as the client
    would have; ``response`` holds it.
    """

    def __init__(self, response: Any) -> None:
        self.response = response
        self.status_code = getattr(response, "status_code", None)
        self.headers = getattr(response, "headers", None)
        super().__init__(f"HTTP {self.status_code} from {getattr(response, 'url', '?')}")


def _status_check(result: Any) -> None:
    """Raise for a response whose status a retry may clear (429, 5xx ...)."""
    from tether.classification._classify import classify

    status = getattr(result, "status_code", None)
    if isinstance(status, int) and status >= 400:
        error = ResponseStatusError(result)
        if classify(error).retryable:
            raise error


@dataclass(frozen=True, slots=True)
class Connector:
    name: str
    inject: KeyInjector
    #: called with each attempt's result: raises when the result is a failure to retry
    check: Callable[[Any], None] | None = None


#: How each connector carries the idempotency key; add your own entries.
CONNECTORS: dict[str, Connector] = {
    "stripe": Connector("stripe", _stripe),
    "http": Connector("http", _header, _status_check),
    "httpx": Connector("httpx", _header, _status_check),
    "requests": Connector("requests", _header, _status_check),
    "github": Connector("github", _none),
    "slack": Connector("slack", _none),
    "none": Connector("none", _none),
}

_last_meta: contextvars.ContextVar[CallMeta | None] = contextvars.ContextVar(
    "tether_wrap_meta", default=None
)


def last_call() -> CallMeta | None:
    """The :class:`CallMeta` of the last wrapped call in this thread or task."""
    return _last_meta.get()


class _Proxy:
    __slots__ = ("_tether_path", "_tether_target", "_tether_wrap")

    def __init__(self, target: Any, path: str, wrapper: _Wrap) -> None:
        object.__setattr__(self, "_tether_target", target)
        object.__setattr__(self, "_tether_path", path)
        object.__setattr__(self, "_tether_wrap", wrapper)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._tether_target, name)
        path = f"{self._tether_path}.{name}" if self._tether_path else name
        if isinstance(value, int | float | str | bytes | bool) or value is None:
            return value
        return _Proxy(value, path, self._tether_wrap)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._tether_wrap.call(self._tether_path, self._tether_target, args, kwargs)

    def __repr__(self) -> str:
        return f"<tether.wrap {self._tether_path or 'client'} of {self._tether_target!r}>"

    def __dir__(self) -> Iterable[str]:
        return dir(self._tether_target)


class _Wrap:
    def __init__(
        self,
        connector: Connector,
        retryable: frozenset[str],
        policy: RetryPolicy,
        ledger: Ledger | None,
        breaker: CircuitBreaker | None,
    ) -> None:
        self.connector = connector
        self.retryable = retryable
        self.policy = policy if breaker is None else policy.replace(breaker=breaker)
        self.ledger = ledger

    def _match(self, path: str) -> bool:
        return any(path == m or path.endswith("." + m) for m in self.retryable)

    def call(
        self, path: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if not self._match(path):
            return fn(*args, **kwargs)
        if self.ledger is not None:
            key = intent_key(
                f"{self.connector.name}:{path}",
                {"args": list(args), "kwargs": kwargs},
                ignore=_CALL_VOLATILE,
            )
        else:
            key = os.urandom(16).hex()
        send_kwargs = dict(kwargs)
        self.connector.inject(fn, args, send_kwargs, key)
        policy = self.policy.replace(name=f"{self.connector.name}:{path}")
        attempts = 0

        check = self.connector.check

        def attempt() -> Any:
            nonlocal attempts
            attempts += 1
            result = fn(*args, **send_kwargs)
            if check is not None:
                check(result)
            return result

        def retried() -> Any:
            return policy.call(attempt)

        try:
            if self.ledger is not None:
                # an unknown outcome is settled by sending the same key again: the
                # provider answers a repeated idempotency key with the original result
                result = self.ledger.once(key, retried, lookup=lambda _k: retried())
            else:
                result = retried()
        except ResponseStatusError as exc:  # retries spent: the client's own answer
            result = exc.response
        finally:
            _last_meta.set(CallMeta(path, attempts, key, attempts > 1))
        _attach(result, _last_meta.get())
        return result


def _attach(result: Any, meta: CallMeta | None) -> None:
    try:
        object.__setattr__(result, "_tether_meta", meta)
    except (AttributeError, TypeError):
        pass  # a result that takes no attributes: read tether.wrap.last_call()


def wrap(
    client: Any,
    connector: str = "stripe",
    retryable: Iterable[str] = (),
    policy: RetryPolicy | None = None,
    ledger: Ledger | None = None,
    breaker: CircuitBreaker | None = None,
) -> Any:
    """A proxy over ``client`` that retries only the whitelisted method paths.

    >>> stripe = tether.wrap(stripe_client, connector="stripe",
    ...                      retryable=["refunds.create"])  # doctest: +SKIP
    >>> stripe.v1.refunds.create(params={"charge": "ch_1"})  # doctest: +SKIP
    """
    if connector not in CONNECTORS:
        raise ValueError(
            f"connector must be one of {', '.join(sorted(CONNECTORS))}, got {connector!r}; "
            "add your own to tether.CONNECTORS"
        )
    if isinstance(retryable, str):
        raise TypeError("retryable must be a list of method paths, e.g. ['refunds.create']")
    methods = frozenset(retryable)
    policy = policy or RetryPolicy(max_attempts=3)
    return _Proxy(client, "", _Wrap(CONNECTORS[connector], methods, policy, ledger, breaker))
