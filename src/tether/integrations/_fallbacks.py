"""A guarded client's fallback models: the same request to the next model of the chain.

A guarded client with ``fallbacks=[tether.Fallback("gpt-6.1-terra")]`` sends each request
to its own model first; when that model cannot answer (see :class:`tether.Fallback`)
the request goes to the next one, with its ``model`` changed (and to the fallback's own
client when it names one). Every candidate is its own model call: checked against the
run's cost budget by its own price, admitted by its own token budget, under the retry
policy and breaker of its client, in a span named with its model. The last candidate's
failure is the call's.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from tether import Fallback, Run, telemetry
from tether._errors import CircuitOpenError, LimiterTimeout
from tether.classification._classify import Kind, classify


class Guarded(Protocol):
    """What a chain needs of a guarded client (``tether.integrations._common.Guarded``)."""

    provider: str
    fallbacks: tuple[Fallback, ...]
    run: Run | None
    is_async: bool

    def bind(self, run: Run | None) -> Any: ...


__all__ = ["acall_chain", "call_chain", "candidates", "check_chain", "gives_way", "why_fall_back"]

_log = logging.getLogger("tether")

#: one candidate of a request: the guarded client that sends it and the model it names
Candidate = tuple[Any, str]
#: one candidate's request: ``send(client, kwargs, last)`` (``last``: no fallback after it)
Send = Callable[[Any, dict[str, Any], bool], Any]


def provider_of_client(client: Any) -> str | None:
    """``"anthropic"`` or ``"openai"`` for an SDK client (raw or guarded), else None."""
    provider = getattr(type(client), "provider", None)
    if isinstance(provider, str) and provider:  # a guarded client
        return provider
    root = type(client).__module__.split(".")[0]
    return root if root in ("anthropic", "openai") else None


def provider_of(entry: Fallback, default: str) -> str:
    """The provider of a fallback: its own, its client's, or ``default`` (the primary's)."""
    return entry.provider or provider_of_client(entry.client) or default


def check_chain(
    owner: Guarded, chain: Sequence[Fallback], request: Mapping[str, Any] | None = None
) -> tuple[Fallback, ...]:
    """A guarded client's chain, each fallback's client guarded once. Every entry is of the
    client's provider, unless ``request`` is given (an agent loop's first request, which
    tether built): then an entry of the other provider is allowed when it brings a client
    of the same kind (sync, async) and the request translates; refused otherwise, naming
    the entry, before any request."""
    checked = []
    for i, entry in enumerate(chain):
        provider = provider_of(entry, owner.provider)
        if provider != owner.provider and request is None:
            raise ValueError(
                f"fallbacks[{i}] ({entry.model!r}) is a {provider} model: a guarded "
                f"{owner.provider} client sends {owner.provider}'s requests and cannot "
                f"translate them: fall back to another {owner.provider} model (or use "
                "run_agent, whose requests tether builds and translates)"
            )
        if provider != owner.provider:
            entry = _other_provider(i, entry, provider, owner, request or {})
        elif entry.client is not None:
            if provider_of_client(entry.client) != owner.provider:
                raise ValueError(
                    f"fallbacks[{i}].client must be a {owner.provider} SDK client, "
                    f"got {entry.client!r}"
                )
            kind: Any = type(owner)  # the owner's guarded class, for the fallback's client
            if not isinstance(entry.client, kind):
                entry = replace(entry, client=kind(entry.client))
        checked.append(entry)
    return tuple(checked)


def _other_provider(
    i: int, entry: Fallback, provider: str, owner: Guarded, request: Mapping[str, Any]
) -> Fallback:
    """A fallback of the other provider in an agent loop: its client guarded, checked."""
    from tether.integrations._translate import Untranslatable, translation

    if entry.client is None or provider_of_client(entry.client) != provider:
        raise ValueError(
            f"fallbacks[{i}] ({entry.model!r}) is a {provider} model: give it the {provider} "
            f"SDK client that reaches it (tether.Fallback(..., client=...)); got "
            f"{entry.client!r}"
        )
    client = entry.client
    if getattr(client, "provider", None) != provider:  # a raw SDK client
        client = importlib.import_module(f"tether.integrations.{provider}").guarded(client)
    if client.is_async != owner.is_async:
        shell = "an async" if owner.is_async else "a sync"
        raise ValueError(f"fallbacks[{i}].client must be {shell} client, as the loop's is")
    try:
        translation(owner.provider, provider).request({**request, "model": entry.model})
    except (Untranslatable, KeyError, TypeError) as exc:
        raise ValueError(
            f"fallbacks[{i}] ({entry.model!r}): this {owner.provider} request cannot be "
            f"asked of a {provider} model ({exc}); no request was sent"
        ) from None
    return replace(entry, provider=provider, client=client)


def candidates(owner: Guarded, model: str) -> list[Candidate]:
    """A request's candidates in order: its own model on ``owner``, then each fallback on
    its own client (bound to the owner's run) or on ``owner``. The chain is the client's
    own, else the entries of its run's guard that are of the client's provider. Under a
    cost budget a model of the chain without a price raises UnknownModelError here, before
    the first request, not when the incident sends the call down the chain."""
    chain = owner.fallbacks
    if not chain and owner.run is not None:
        guard_chain = getattr(owner.run.guard, "fallbacks", ())
        mine = [f for f in guard_chain if provider_of(f, owner.provider) == owner.provider]
        chain = check_chain(owner, mine) if mine else ()
    if owner.run is not None:  # a chain of the client's own: each model priced, up front
        for entry in chain:
            owner.run.check_model(entry.model, provider_of(entry, owner.provider))
    out: list[Candidate] = [(owner, model)]
    for entry in chain:
        client = owner if entry.client is None else entry.client.bind(owner.run)
        out.append((client, entry.model))
    return out


def why_fall_back(exc: BaseException) -> str | None:
    """Why a failed candidate gives way to the next one; None when it does not (the
    failure is the call's: an ordinary rate limit, a bad request, a stopped run)."""
    if isinstance(exc, CircuitOpenError):
        return "its provider's breaker is open (or opened on its failed attempts)"
    if isinstance(exc, LimiterTimeout):
        return "its token budget or the fleet's limiter would admit it only after the run's time"
    if not isinstance(exc, Exception):
        return None
    verdict = classify(exc)
    if verdict.kind is Kind.QUOTA:
        return f"a quota or spend limit refused it ({verdict.code or verdict.reason})"
    return None


def gives_way(chain: Sequence[Candidate], i: int, exc: BaseException) -> bool:
    """Whether candidate ``i``'s failure ``exc`` sends the request to the next one (logged
    and recorded on the span); False when the failure is the call's."""
    why = why_fall_back(exc) if i < len(chain) - 1 else None
    if why is None:
        return False
    model, to = chain[i][1], chain[i + 1][1]
    _log.warning("tether: model %r cannot answer (%s); asking %r instead", model, why, to)
    telemetry.add_event(
        "tether.fallback",
        **{"gen_ai.request.model": model, "tether.fallback.model": to, "tether.reason": why},
    )
    return True


def call_chain(chain: Sequence[Candidate], send: Send, kwargs: dict[str, Any]) -> Any:
    """``send(client, request, last)`` for each candidate until one answers (sync)."""
    for i, (client, model) in enumerate(chain):
        try:
            return send(client, {**kwargs, "model": model}, i == len(chain) - 1)
        except BaseException as exc:
            if not gives_way(chain, i, exc):
                raise
    raise AssertionError("unreachable: the last candidate answers or raises")  # pragma: no cover


async def acall_chain(
    chain: Sequence[Candidate], send: Callable[..., Awaitable[Any]], kwargs: dict[str, Any]
) -> Any:
    """The async form of :func:`call_chain`."""
    for i, (client, model) in enumerate(chain):
        try:
            return await send(client, {**kwargs, "model": model}, i == len(chain) - 1)
        except BaseException as exc:
            if not gives_way(chain, i, exc):
                raise
    raise AssertionError("unreachable: the last candidate answers or raises")  # pragma: no cover
