"""Fallback models: the chain a model call moves down when its model cannot answer in time.

A :class:`Fallback` names a model (and, for another provider or another account, the client
that reaches it). A call goes to the next model of its chain when the one it asked
cannot answer: its provider's breaker is open (no request is sent to it; or it opened on
this call's own failed attempts, which were sent and are counted), a quota or spend limit
refused it (OpenAI's ``insufficient_quota``, Anthropic's billing error: retrying does not
help), or its token budget (or the fleet's limiter) would admit it only after the run's
time is spent.
An ordinary rate limit (a 429 with ``Retry-After``) is not a reason: the retry policy and
the token budget wait it out. Each model is priced and budgeted as itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tether.providers import anthropic, openai_chat

__all__ = ["PROVIDERS", "Fallback", "is_chat_model"]

#: the providers whose requests tether builds (and can translate between, in ``run_agent``)
PROVIDERS = (anthropic.NAME, openai_chat.NAME)


@dataclass(frozen=True, slots=True)
class Fallback:
    """A model to ask when the one before it in the chain cannot answer.

    >>> Fallback("gpt-6.1-terra")                  # the same provider, the same client
    Fallback(model='gpt-6.1-terra', provider=None, client=None)

    ``provider``: ``"anthropic"`` or ``"openai"``; None means the provider of the call it
    stands in for (or of ``client``). ``client``: the SDK client (raw or guarded) that
    reaches the model, needed for another provider; for the same provider it may be a
    client of another account or region (its own breaker, its own quota). None: the
    primary's client, with the request's ``model`` changed.
    """

    model: str
    provider: str | None = None
    client: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(f"Fallback.model must be a model name, got {self.model!r}")
        if self.provider is not None and self.provider not in PROVIDERS:
            raise ValueError(
                f"Fallback.provider must be one of {', '.join(map(repr, PROVIDERS))} or None, "
                f"got {self.provider!r}"
            )
        if self.client is not None and not (
            hasattr(self.client, "with_options") or is_chat_model(self.client)
        ):
            raise TypeError(
                f"Fallback.client must be an Anthropic or OpenAI SDK client (raw or guarded) "
                f"or a LangChain chat model, got {self.client!r}"
            )

    @property
    def priced_as(self) -> str:
        """The model name its calls are priced by: a LangChain chat model's own
        (``model_name`` or ``model``), else :attr:`model`."""
        if self.client is not None and is_chat_model(self.client):
            for attr in ("model_name", "model"):
                value = getattr(self.client, attr, None)
                if isinstance(value, str) and value:
                    return value
        return self.model

    @staticmethod
    def chain(value: Any, field: str = "fallbacks") -> tuple[Fallback, ...]:
        """``fallbacks=``: None, a :class:`Fallback`, a model name, or an iterable of those;
        as a tuple of fallbacks (a wrong entry fails here, naming ``field`` and its place).
        What ``Guard(fallbacks=...)``, the guarded clients and the adapters take."""
        if value is None:
            return ()
        if isinstance(value, Fallback | str):
            value = [value]
        if not isinstance(value, Iterable):
            raise TypeError(f"{field} must be a list of tether.Fallback(model=...), got {value!r}")
        chain = []
        for i, entry in enumerate(value):
            if isinstance(entry, str):
                entry = Fallback(entry)
            if not isinstance(entry, Fallback):
                raise TypeError(
                    f"{field}[{i}] must be a tether.Fallback(model=...) or a model name, got {entry!r}"
                )
            chain.append(entry)
        return tuple(chain)


def is_chat_model(client: Any) -> bool:
    """Whether ``client`` is a LangChain chat model (a ``langchain_core`` BaseChatModel),
    told without importing LangChain."""
    return any(
        c.__name__ == "BaseChatModel" and c.__module__.startswith("langchain_core.")
        for c in type(client).__mro__
    )
