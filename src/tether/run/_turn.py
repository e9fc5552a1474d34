"""One model turn: a paid request from its checks to its usage, as one context manager.

``with run.model_turn(model=..., estimate=..., max_output=...) as turn:`` (``async with
run.amodel_turn(...)``) is what every adapter and guarded client does around a model
request, in the shape of stamina's ``retry_context``:

* on entry, the run's checks (not stopped, the model priced under a cost budget), the
  request's worst case priced **once** and read by the cost budget and the budget scopes
  alike, and the reservations (the scopes', then the token budget's, whose wait may stop
  the run ``TIMEOUT`` before the request);
* :meth:`ModelTurn.call` (``acall``): the request, the attempts under a retry policy
  within the run's time left, each asking the provider's breaker first (the policy's, else
  :attr:`ModelTurn.breaker`: one per provider on the guard, so every adapter's turns share
  it), an open one waited out as the run's time and ``Guard(outage_wait=...)`` allow, the
  retries counted;
* :meth:`ModelTurn.record`: the reply's usage (a :class:`tether.RequestUsage`
  or its counts), priced and counted, the reservations settled;
* on exit: a failure stops the run with the reason its classification gives (raised as
  :class:`tether.Stopped` from the failure; a programming error and a warning raised as an
  error are raised as they are, the run filed); a turn left without a usage counts as one
  model call whose tokens the provider did not report (never as free). A stop or a
  cancellation gives the reservations back.

A framework whose hooks split the request (a "before model" and an "after model" hook)
drives the same object by hand: :meth:`ModelTurn.open` and :meth:`ModelTurn.attempt` (the
provider's breaker asked for the framework's own attempt) in the first, :meth:`record` or
:meth:`fail` in the second.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, Unpack, cast

from tether._errors import CircuitOpenError
from tether.classification._classify import programming_error
from tether.guards._breaker import CircuitBreaker
from tether.providers import provider_of
from tether.run._options import ModelUsage
from tether.run._outcome import Stopped
from tether.run._pricing import UnknownModelError

if TYPE_CHECKING:
    from tether.providers._usage import RequestUsage
    from tether.retries._policy import RetryPolicy
    from tether.run._runstate import RunState
    from tether.run._settings import RunSettings

T = TypeVar("T")

__all__ = ["ModelTurn", "provider_breaker"]

#: a retry policy without a breaker, with each provider's breaker (built once: replace() validates)
_WITH_BREAKER: weakref.WeakKeyDictionary[RetryPolicy, dict[CircuitBreaker, RetryPolicy]] = (
    weakref.WeakKeyDictionary()
)
_WITH_LOCK = threading.Lock()


def provider_name(model: str) -> str:
    """The provider ``model`` is served by: through the provider profiles (``claude-...``:
    anthropic, ``gpt-...``: openai), else the prefix of a ``provider/model`` name
    (LiteLLM's, CrewAI's), else the model's own name."""
    found = provider_of(model)
    if found is None and "/" in model:
        prefix, _, rest = model.partition("/")
        found = provider_of(rest) or prefix
    return found or model or "model"


def provider_breaker(guard: RunSettings, model: str) -> CircuitBreaker:
    """The breaker of the provider ``model`` is served by (:func:`provider_name`): one per
    provider on ``guard``, on its store and clock, shared by all its runs and adapters,
    tripped by two model calls that failed after all their attempts (twice the guard's
    retry attempts). An open one makes a turn wait as ``Guard(outage_wait=...)`` allows,
    then ends the run ``CIRCUIT_OPEN``: one incident for every conversation the outage
    stopped."""
    provider = provider_name(model)
    key = f"model provider {provider}"  # beside the guard's tool breakers, by another key
    found = guard._breakers.get(key)
    if found is None:
        found = guard._breakers.setdefault(
            key,
            CircuitBreaker(
                provider,
                failure_threshold=2 * guard.retry.max_attempts,
                store=guard.store,
                clock=guard.clock,
            ),
        )
    return found


def _with_breaker(policy: RetryPolicy, breaker: CircuitBreaker) -> RetryPolicy:
    """``policy`` with ``breaker`` (made once per policy and breaker)."""
    with _WITH_LOCK:
        made = _WITH_BREAKER.setdefault(policy, {})
        found = made.get(breaker)
        if found is None:
            found = made[breaker] = policy.replace(breaker=breaker)
        return found


class _Calls(Protocol):
    """What a turn asks of the run's model calls (:class:`tether.run._modelcalls.ModelCalls`)."""

    s: RunState

    def turn(
        self,
        *,
        model: str = ...,
        provider: str | None = ...,
        estimated_input_tokens: int | None = ...,
        max_output_tokens: int | None = ...,
    ) -> tuple[str, str | None, int | None, int | None, float | None]: ...
    def reserve(self, *request: Any) -> None: ...
    async def areserve(self, *request: Any) -> None: ...
    def record_model_call(self, **usage: Unpack[ModelUsage]) -> float | None: ...
    def model_call_failed(self, exc: BaseException) -> Stopped: ...
    def model_call_gave_way(self, exc: BaseException) -> None: ...


class ModelTurn:
    """One paid model request of a run (made by :meth:`tether.Run.model_turn`)."""

    __slots__ = (
        "_calls",
        "_held",
        "_later",
        "_permit",
        "estimate",
        "max_output",
        "model",
        "provider",
    )

    def __init__(
        self,
        calls: _Calls,
        model: str,
        provider: str | None,
        estimate: int | None,
        max_output: int | None,
    ) -> None:
        self._calls = calls
        self.model = model
        self.provider = provider
        self.estimate = estimate
        self.max_output = max_output
        self._held = False  # reservations taken, not yet settled or given back
        self._later = False  # the usage comes after the block (a stream's last event)
        # the breaker's permit of the framework's own attempt (attempt()), until it is told
        self._permit: tuple[CircuitBreaker, str] | None = None

    def __repr__(self) -> str:
        return f"ModelTurn(model={self.model!r}, max_output={self.max_output!r})"

    def _request(self) -> tuple[str, str | None, int | None, int | None, float | None]:
        return self._calls.turn(
            model=self.model,
            provider=self.provider,
            estimated_input_tokens=self.estimate,
            max_output_tokens=self.max_output,
        )

    def open(self) -> ModelTurn:
        """Check the run and take the request's reservations (see the module); raises
        :class:`tether.Stopped` or :class:`tether.UnknownModelError` before any request."""
        self._calls.reserve(*self._request())
        self._held = True
        return self

    async def aopen(self) -> ModelTurn:
        """The async form of :meth:`open`: a token budget's wait sleeps on the event loop."""
        await self._calls.areserve(*self._request())
        self._held = True
        return self

    @property
    def breaker(self) -> CircuitBreaker:
        """The breaker this turn's attempts ask: the guard's retry policy's when it has one,
        else its provider's (``provider``, else the model's) on the guard
        (:func:`provider_breaker`), the same for every
        adapter and run of the guard, so one outage is one incident."""
        guard = self._calls.s.guard
        return guard.retry.breaker or provider_breaker(guard, self.provider or self.model)

    def _policy(self, policy: RetryPolicy) -> RetryPolicy:
        """``policy``, with the breaker of the turn's provider when it has none of its own
        (a fallback's policy, made without the primary's breaker, gets its own provider's)."""
        if policy.breaker is not None:
            return policy
        breaker = provider_breaker(self._calls.s.guard, self.provider or self.model)
        return _with_breaker(policy, breaker)

    def attempt(self) -> ModelTurn:
        """The framework sends the request itself (its hooks split it): ask the provider's
        breaker (:attr:`breaker`) for this attempt, an open one waited out as the run's time
        and ``Guard(outage_wait=...)`` allow; past that the run stops ``CIRCUIT_OPEN``
        (raised as :class:`tether.Stopped`), one incident with every run the outage stopped.
        :meth:`record`, :meth:`fail`, :meth:`gave_way` or :meth:`attempt_failed` tell the
        breaker how the attempt went."""
        self._tell(None)
        breaker = self.breaker

        def acquire() -> None:
            self._permit = (breaker, breaker._acquire())

        try:
            self._calls.s.through_breaker(acquire)
        except CircuitOpenError as exc:
            raise self.fail(exc) from None
        return self

    async def aattempt(self) -> ModelTurn:
        """The async form of :meth:`attempt`: the wait sleeps on the event loop."""
        self._tell(None)
        breaker = self.breaker

        async def acquire() -> None:
            self._permit = (breaker, await breaker._aacquire())

        try:
            await self._calls.s.athrough_breaker(acquire)
        except CircuitOpenError as exc:
            raise self.fail(exc) from None
        return self

    def attempt_failed(self, exc: BaseException) -> bool:
        """The framework's own attempt (:meth:`attempt`) failed with ``exc``: the breaker is
        told. True when that left it open: the provider is down, and the next attempt (a
        probe, after :meth:`attempt`'s wait) starts the request's attempts afresh, as a
        wait in :meth:`call` does."""
        breaker = None if self._permit is None else self._permit[0]
        self._tell(exc)
        return breaker is not None and breaker._refusal() is not None

    def _tell(self, exc: BaseException | None) -> None:
        """Tell the breaker how the attempt it gave a permit for went (None: answered; not
        an Exception, a stop or a cancellation: not the provider's doing, not counted)."""
        if self._permit is None:
            return
        (breaker, permit), self._permit = self._permit, None
        if exc is None:
            breaker._record(permit, None)
        elif isinstance(exc, Exception) and not isinstance(exc, Stopped | CircuitOpenError):
            breaker._record(permit, breaker.classifier(exc))

    @property
    def time_left(self) -> float | None:
        """The run's time left (the request's deadline); None: no time budget."""
        return self._calls.s.time_left()

    def call(
        self,
        fn: Callable[..., T],
        /,
        *args: Any,
        policy: RetryPolicy | None = None,
        breaker_wait: bool = True,
        **kwargs: Any,
    ) -> T:
        """``fn(*args, **kwargs)``: its attempts under ``policy`` (None: one attempt) within
        the run's time left, its retries counted; each attempt asks the policy's breaker, or
        the turn's provider's (:func:`provider_breaker`) when it has none; an open breaker
        (``CircuitOpenError``) is waited out as the run's time allows (``breaker_wait=False``:
        raised at once, for a request a fallback model would take). A failure after that is
        raised."""
        s = self._calls.s
        if policy is None:  # one attempt: no closure to build
            send = functools.partial(fn, *args, **kwargs) if args or kwargs else fn
            return s.through_breaker(send) if breaker_wait else send()

        policy = self._policy(policy)

        def attempts() -> T:
            try:
                return policy.call_within(s.time_left(), lambda: fn(*args, **kwargs))
            finally:
                s.retries += policy.statistics.retries

        return s.through_breaker(attempts) if breaker_wait else attempts()

    async def acall(
        self,
        fn: Callable[..., Awaitable[T]],
        /,
        *args: Any,
        policy: RetryPolicy | None = None,
        breaker_wait: bool = True,
        **kwargs: Any,
    ) -> T:
        """The async form of :meth:`call`."""
        s = self._calls.s
        with_breaker = None if policy is None else self._policy(policy)

        async def attempts() -> T:
            if with_breaker is None:
                return await fn(*args, **kwargs)
            try:
                return await with_breaker.acall_within(s.time_left(), lambda: fn(*args, **kwargs))
            finally:
                s.retries += with_breaker.statistics.retries

        return await (s.athrough_breaker(attempts) if breaker_wait else attempts())

    def record(
        self, usage: RequestUsage | None = None, /, **counts: Unpack[ModelUsage]
    ) -> float | None:
        """Count the reply: ``usage`` (its model, else the turn's) or the keywords of
        :meth:`tether.Run.record_model_call` (the turn's model and provider by default);
        settles the reservations. Returns the call's cost in USD (None: unknown)."""
        self._held = False
        if self._permit is not None:
            self._tell(None)
        if usage is not None and not counts:  # the common case, without a dict to merge
            return self._calls.record_model_call(
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cache_write_tokens=usage.cache_write_tokens,
                cache_read_tokens=usage.cache_read_tokens,
                model=usage.model or self.model,
                provider=self.provider,
            )
        given = (
            {**usage.counts(), **counts} if usage is not None else cast("dict[str, Any]", counts)
        )
        if not given.get("model"):
            given["model"] = self.model
        if "provider" not in given:
            given["provider"] = self.provider
        return self._calls.record_model_call(**given)

    def record_later(self) -> ModelTurn:
        """The usage comes after the block (a stream counts it at its last event, through
        :meth:`record`): leaving the block does not count the call unmeasured."""
        self._later = True
        return self

    def fail(self, exc: BaseException) -> Stopped:
        """The request failed after its attempts: the run stops with the reason the failure
        gives (see :meth:`tether.Run.model_call_failed`); returns the Stopped to raise."""
        self._held = False
        self._tell(exc)
        return self._calls.model_call_failed(exc)

    def gave_way(self, exc: BaseException) -> None:
        """The request gave way (to a fallback model, a stop, a cancellation): its
        reservations go back and the run goes on as it stands."""
        self._tell(exc)
        if self._held:
            self._held = False
            self._calls.model_call_gave_way(exc)

    def __enter__(self) -> ModelTurn:
        return self.open()

    async def __aenter__(self) -> ModelTurn:
        return await self.aopen()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            if self._held and not self._later:
                self.record(unmeasured=True)
            return
        if not self._held:  # counted already: the failure is the caller's, after the reply
            return
        if isinstance(exc, Stopped | UnknownModelError) or not isinstance(exc, Exception):
            self.gave_way(exc)
            return
        stopped = self.fail(exc)  # a warning raised as an error is raised here, unchanged
        if programming_error(exc):
            return  # raised as it is, the run filed
        raise stopped from exc

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)
