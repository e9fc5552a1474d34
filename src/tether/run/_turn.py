"""One model turn: a paid request from its checks to its usage, as one context manager.

``with run.model_turn(model=..., estimate=..., max_output=...) as turn:`` (``async with
run.amodel_turn(...)``) is what every adapter and guarded client does around a model
request, in the shape of stamina's ``retry_context``:

* on entry, the run's checks (not stopped, the model priced under a cost budget), the
  request's worst case priced **once** and read by the cost budget and the budget scopes
  alike, and the reservations (the scopes', then the token budget's, whose wait may stop
  the run ``TIMEOUT`` before the request);
* :meth:`ModelTurn.call` (``acall``): the request, an open provider breaker waited out as
  the run's time allows, the attempts under a retry policy within the run's time left,
  the retries counted;
* :meth:`ModelTurn.record`: the reply's usage (a :class:`tether.RequestUsage`
  or its counts), priced and counted, the reservations settled;
* on exit: a failure stops the run with the reason its classification gives (raised as
  :class:`tether.Stopped` from the failure; a programming error and a warning raised as an
  error are raised as they are, the run filed); a turn left without a usage counts as one
  model call whose tokens the provider did not report (never as free). A stop or a
  cancellation gives the reservations back.

A framework whose hooks split the request (a "before model" and an "after model" hook)
drives the same object by hand: :meth:`ModelTurn.open` in the first, :meth:`record` or
:meth:`fail` in the second.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, Unpack, cast

from tether.classification._classify import programming_error
from tether.run._options import ModelUsage
from tether.run._outcome import Stopped
from tether.run._pricing import UnknownModelError

if TYPE_CHECKING:
    from tether.providers._usage import RequestUsage
    from tether.retries._policy import RetryPolicy
    from tether.run._runstate import RunState

T = TypeVar("T")

__all__ = ["ModelTurn"]


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

    __slots__ = ("_calls", "_held", "_later", "estimate", "max_output", "model", "provider")

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
        the run's time left, its retries counted; an open breaker (``CircuitOpenError``) is
        waited out as the run's time allows (``breaker_wait=False``: raised at once, for a
        request a fallback model would take). A failure after that is raised."""
        s = self._calls.s
        if policy is None:  # one attempt: no closure to build
            send = functools.partial(fn, *args, **kwargs) if args or kwargs else fn
            return s.through_breaker(send) if breaker_wait else send()

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

        async def attempts() -> T:
            if policy is None:
                return await fn(*args, **kwargs)
            try:
                return await policy.acall_within(s.time_left(), lambda: fn(*args, **kwargs))
            finally:
                s.retries += policy.statistics.retries

        return await (s.athrough_breaker(attempts) if breaker_wait else attempts())

    def record(
        self, usage: RequestUsage | None = None, /, **counts: Unpack[ModelUsage]
    ) -> float | None:
        """Count the reply: ``usage`` (its model, else the turn's) or the keywords of
        :meth:`tether.Run.record_model_call` (the turn's model and provider by default);
        settles the reservations. Returns the call's cost in USD (None: unknown)."""
        self._held = False
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
        return self._calls.model_call_failed(exc)

    def gave_way(self, exc: BaseException) -> None:
        """The request gave way (to a fallback model, a stop, a cancellation): its
        reservations go back and the run goes on as it stands."""
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
