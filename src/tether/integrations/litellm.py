"""LiteLLM under tether: one retry layer, one limit and one price.

``completion(run, model=..., messages=...)`` / ``acompletion`` call ``litellm.completion``,
and ``guarded_router(router, run)`` a LiteLLM ``Router``, as one model turn of ``run``
(``run.model_turn``): the run's checks and the request's worst case priced before it is
sent, the attempts under tether's retry policy within the run's time, the reply's usage
read by tether's usage reader (OpenAI's shape, which LiteLLM returns for every provider)
and priced, and a failure classified (LiteLLM's exceptions carry the provider's status).

**tether is the one retry layer.** Every request goes out with LiteLLM's own retries off
(``num_retries=0`` and ``max_retries=0``: the Router's loop and the provider SDK's); a
Router built with ``num_retries`` is switched to 0 for its calls under tether with a
warning, once per Router. The Router keeps what only it does: choosing a deployment, its
cooldowns, and its ``fallbacks`` to other model groups; tether's ``Fallback`` is not offered
here, so the two are never both active.

**One price.** A model the guard prices (``Guard(prices=...)``) costs what tether's table
says; a model it does not price costs what LiteLLM reports (``response_cost``), so a run
without a cost budget still counts a cost. Under a cost budget the model must be priced by
the guard, checked before the request (:class:`tether.UnknownModelError`).

**Streams.** ``stream=True`` is one model turn as well: reserved before, the request sent
with ``stream_options={"include_usage": True}`` (LiteLLM reports a stream's usage in its
last chunk only when asked), the returned :class:`LiteLLMStream` counting that usage and
its price (the same as the reply read whole) when it ends. A stream that breaks before its
first chunk is retried under tether's policy; one that breaks after it ends ``truncated``,
never replayed, the usage seen counted.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from tether import ModelTurn, RetryPolicy, Run, Stopped
from tether._context import reset_if_here
from tether._errors import require
from tether.guards._tokens import estimate_tokens
from tether.integrations._common import (
    AsyncGuardedStream,
    GuardedStream,
    _StreamUsage,
)
from tether.providers._usage import RequestUsage
from tether.providers.litellm import usage as litellm_usage

require("litellm", "litellm")

from litellm.integrations.custom_logger import CustomLogger  # noqa: E402 - after the extra check

__all__ = [
    "AsyncLiteLLMStream",
    "GuardedRouter",
    "LiteLLMStream",
    "TetherLogger",
    "acompletion",
    "completion",
    "guarded_router",
    "litellm_usage",
]

_log = logging.getLogger("tether")

#: LiteLLM's own retries, off under tether: the Router's loop and the provider SDK's
_NO_RETRIES = {"num_retries": 0, "max_retries": 0}


def _bare(model: str) -> str:
    """``openai/gpt-6.1-terra`` → ``gpt-6.1-terra``: the name the guard's prices know."""
    return model.rpartition("/")[2]


def _max_output(kwargs: Mapping[str, Any]) -> int | None:
    value = kwargs.get("max_tokens", kwargs.get("max_completion_tokens"))
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _estimate(kwargs: Mapping[str, Any]) -> int | None:
    """The request's prompt in tokens, estimated (its messages and tools, about four
    characters a token; the token budget corrects the estimate from the replies' usage):
    what the fleet token budget reserves for it. None: no messages (nothing reserved)."""
    messages = kwargs.get("messages")
    return estimate_tokens(messages, kwargs.get("tools")) if messages else None


def _response_cost(reply: Any) -> float | None:
    hidden = getattr(reply, "_hidden_params", None)
    cost = hidden.get("response_cost") if isinstance(hidden, Mapping) else None
    return float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) else None


def _record(
    run: Run, turn: Any, model: str, usage: RequestUsage | None, cost: float | None
) -> None:
    """Count the reply's ``usage`` under the guard's name for its model: priced at tether's
    table when the guard prices the model, else at LiteLLM's ``cost`` (``response_cost``)."""
    if usage is None or not usage.counted:
        turn.record(unmeasured=True)
        return
    usage = RequestUsage(
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_write_tokens,
        usage.cache_read_tokens,
        model,  # the guard's name for it (the reply names the provider's deployment)
    )
    if run.guard.prices.knows(model):
        turn.record(usage)
    else:
        turn.record(usage, cost_usd=cost)


class _StreamCount(_StreamUsage):
    """A LiteLLM stream's usage (its last chunk, asked for with ``include_usage``) and
    LiteLLM's ``response_cost`` for it, counted as a reply read whole is."""

    def __init__(self, run: Run, model: str) -> None:
        super().__init__(litellm_usage)
        self._run = run
        self._model = model
        self._cost: float | None = None

    def see(self, event: Any) -> None:
        super().see(event)
        cost = _response_cost(event)
        if cost is not None:
            self._cost = cost

    def record(self, turn: ModelTurn | None) -> None:
        if turn is not None:
            _record(self._run, turn, self._model, self.usage, self._cost)


class LiteLLMStream(GuardedStream):
    """A guarded LiteLLM stream (``CustomStreamWrapper``): iterate it as LiteLLM's. Its
    usage and price are counted at its end (or where it broke: ``truncated`` is then True
    and ``error`` holds the cause); a stream that breaks before its first chunk is retried
    under tether's policy, one after it never."""

    def __init__(self, run: Run, model: str, stream: Any, events: Any, first: Any, turn: Any):
        super().__init__(stream, events, first, turn, litellm_usage)
        self._usage = _StreamCount(run, model)


class AsyncLiteLLMStream(AsyncGuardedStream):
    """The async form of :class:`LiteLLMStream` (``async for chunk in stream``)."""

    def __init__(self, run: Run, model: str, stream: Any, events: Any, first: Any, turn: Any):
        super().__init__(stream, events, first, turn, litellm_usage)
        self._usage = _StreamCount(run, model)


def _policy(run: Run, policy: RetryPolicy | None) -> RetryPolicy:
    return (policy or RetryPolicy(name="litellm")).replace(clock=run.clock)


def _request(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The request as sent: LiteLLM's retries off; a stream asked for its usage."""
    request = {**kwargs, **_NO_RETRIES}
    if request.get("stream"):
        options = request.get("stream_options")
        request["stream_options"] = {**(options or {}), "include_usage": True}
    return request


def _send(run: Run, fn: Any, kwargs: dict[str, Any], policy: RetryPolicy | None) -> Any:
    model = _bare(str(kwargs.get("model") or ""))
    request = _request(kwargs)
    with run.model_turn(model, estimate=_estimate(kwargs), max_output=_max_output(kwargs)) as turn:
        if request.get("stream"):

            def open_first() -> tuple[Any, Any, Any]:
                stream = fn(**request)
                events = iter(stream)
                return stream, events, next(events)

            # a stream that breaks before its first chunk is retried; after it, nothing
            stream, events, first = turn.call(open_first, policy=_policy(run, policy))
            return LiteLLMStream(run, model, stream, events, first, turn)
        reply = turn.call(lambda: fn(**request), policy=_policy(run, policy))
        _record(run, turn, model, litellm_usage(reply), _response_cost(reply))
    return reply


async def _asend(run: Run, fn: Any, kwargs: dict[str, Any], policy: RetryPolicy | None) -> Any:
    model = _bare(str(kwargs.get("model") or ""))
    request = _request(kwargs)
    async with run.amodel_turn(
        model, estimate=_estimate(kwargs), max_output=_max_output(kwargs)
    ) as turn:
        if request.get("stream"):

            async def open_first() -> tuple[Any, Any, Any]:
                stream = await fn(**request)
                events = stream.__aiter__()
                return stream, events, await events.__anext__()

            stream, events, first = await turn.acall(open_first, policy=_policy(run, policy))
            return AsyncLiteLLMStream(run, model, stream, events, first, turn)
        reply = await turn.acall(lambda: fn(**request), policy=_policy(run, policy))
        _record(run, turn, model, litellm_usage(reply), _response_cost(reply))
    return reply


def completion(run: Run, /, *, policy: RetryPolicy | None = None, **kwargs: Any) -> Any:
    """``litellm.completion(**kwargs)`` as one model turn of ``run``, tether's ``policy``
    the only retry layer (default: ``RetryPolicy(name="litellm")``). Raises
    :class:`tether.Stopped` when the run stops (a budget before the request, a failure
    after its attempts)."""
    import litellm

    return _send(run, litellm.completion, kwargs, policy)


async def acompletion(run: Run, /, *, policy: RetryPolicy | None = None, **kwargs: Any) -> Any:
    """The async form of :func:`completion` (``litellm.acompletion``)."""
    import litellm

    return await _asend(run, litellm.acompletion, kwargs, policy)


class GuardedRouter:
    """A LiteLLM ``Router`` whose ``completion`` / ``acompletion`` are model turns of a run,
    with the Router's retries off (see the module's docstring). The model a request names
    is the Router's model group: the guard prices it under that name (a model group named
    after its model is priced as that model)."""

    def __init__(self, router: Any, run: Run, policy: RetryPolicy | None = None) -> None:
        retries = getattr(router, "num_retries", 0) or 0
        if retries and not getattr(router, "_tether_warned", False):
            _log.warning(
                "tether: the LiteLLM Router retries on its own (num_retries=%d); under tether "
                "its calls go out with num_retries=0 so that retries happen at one layer, "
                "tether's policy",
                retries,
            )
            try:
                router._tether_warned = True
            except AttributeError:  # pragma: no cover - a Router that takes no attribute
                pass
        self.router = router
        self.run = run
        self.policy = policy

    def completion(self, **kwargs: Any) -> Any:
        """``router.completion(**kwargs)`` as one model turn of the run."""
        return _send(self.run, self.router.completion, kwargs, self.policy)

    async def acompletion(self, **kwargs: Any) -> Any:
        """``await router.acompletion(**kwargs)`` as one model turn of the run."""
        return await _asend(self.run, self.router.acompletion, kwargs, self.policy)


def guarded_router(router: Any, run: Run, policy: RetryPolicy | None = None) -> GuardedRouter:
    """``router`` (a ``litellm.Router``) under ``run``: see :class:`GuardedRouter`."""
    return GuardedRouter(router, run, policy)


# --- LiteLLM as the caller: a CustomLogger --------------------------------------------------

#: the run the requests of this context serve (``TetherLogger.serving``)
_SERVING: ContextVar[Run | None] = ContextVar("tether_litellm_run", default=None)
#: a sync Router's turn, opened by ``pre_call_check`` (the deployment only) and named by the
#: call's id in ``log_pre_api_call`` right after, in the same thread
_OPENED: ContextVar[_Held | None] = ContextVar("tether_litellm_opened", default=None)


class _Reestimated(Exception):
    """A turn's reservations given back to be taken again with its prompt's estimate."""


class _Held:
    """One attempt's turn, from LiteLLM's pre-call hook to its success or failure event."""

    __slots__ = ("breaker", "model", "permit", "run", "turn")

    def __init__(self, run: Run, model: str, turn: ModelTurn, permit: object) -> None:
        self.run, self.model, self.turn, self.permit = run, model, turn, permit
        self.breaker = turn.breaker


def _group(kwargs: Mapping[str, Any]) -> str:
    """The guard's name for a request's model: the Router's model group, else the model."""
    params = kwargs.get("litellm_params")
    metadata = kwargs.get("metadata") or (
        params.get("metadata") if isinstance(params, Mapping) else None
    )
    group = metadata.get("model_group") if isinstance(metadata, Mapping) else None
    return _bare(str(group or kwargs.get("model") or ""))


class TetherLogger(CustomLogger):  # type: ignore[misc]
    """tether's budgets, prices and breaker for users who keep LiteLLM (a ``Router``, the
    proxy) as the caller and its retry layer: ``litellm.callbacks = [TetherLogger()]``, and
    each request made inside ``with logger.serving(run):``.

    * **Before each attempt** (``async_pre_call_deployment_hook`` on every async call,
      ``pre_call_check`` on a sync Router's): the run's checks and the request's
      reservations (its worst case against the cost budget and the scopes, its place in the
      fleet token budget) as a model turn opens, and the provider's breaker asked; a run
      that may not send raises :class:`tether.Stopped` (an open breaker
      ``CircuitOpenError``) and nothing is sent. LiteLLM gives the sync ``pre_call_check``
      the deployment only: ``log_pre_api_call``, given the messages just before the
      request is sent, takes that turn's reservations again with the prompt's estimate.
      The proxy's ``async_pre_call_hook`` checks the model is priced under a cost budget
      and the run has not stopped.
    * **After it** (``log_success_event`` / ``async_log_success_event``): the reply's usage
      counted and priced (tether's table, else LiteLLM's ``response_cost``), the breaker told.
    * **A failed attempt** (``async_post_call_failure_deployment_hook`` in an async call's
      path, before the Router's next attempt; ``log_failure_event`` for a sync call, after
      it): the breaker told (a retryable failure counts toward opening it, and an open one
      refuses the next attempt before it is sent), the reservation given back; a failure
      tether classifies as permanent stops the run with its reason.
    """

    def __init__(self) -> None:
        super().__init__()
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()

    @staticmethod
    @contextlib.contextmanager
    def serving(run: Run) -> Iterator[Run]:
        """The requests made in this block (this thread, this task and the tasks it starts)
        count in ``run``."""
        token = _SERVING.set(run)
        try:
            yield run
        finally:
            reset_if_here(_SERVING, token)

    # --- before ---------------------------------------------------------------------------

    def _opened(self, run: Run, model: str, turn: ModelTurn) -> _Held:
        try:
            permit = turn.breaker._acquire()
        except BaseException as exc:
            turn.gave_way(exc)
            raise
        return _Held(run, model, turn, permit)

    def _keep(self, call_id: Any, held: _Held) -> None:
        with self._lock:
            self._held[str(call_id)] = held

    async def async_pre_call_deployment_hook(
        self, kwargs: dict[str, Any], call_type: Any
    ) -> dict[str, Any] | None:
        run = _SERVING.get()
        if run is None:
            return None
        model = _group(kwargs)
        turn = run.amodel_turn(model, estimate=_estimate(kwargs), max_output=_max_output(kwargs))
        await turn.aopen()
        self._keep(kwargs.get("litellm_call_id"), self._opened(run, model, turn))
        return None

    def pre_call_check(self, deployment: dict[str, Any]) -> dict[str, Any] | None:
        run = _SERVING.get()
        if run is None:
            return None
        model = _bare(str(deployment.get("model_name") or ""))
        params = deployment.get("litellm_params") or {}
        turn = run.model_turn(model, max_output=_max_output(params)).open()
        _OPENED.set(self._opened(run, model, turn))
        return None

    def log_pre_api_call(self, model: Any, messages: Any, kwargs: dict[str, Any]) -> None:
        held = _OPENED.get()
        if held is None:
            return
        _OPENED.set(None)
        self._keep(kwargs.get("litellm_call_id"), held)
        params = kwargs.get("optional_params")
        tools = params.get("tools") if isinstance(params, Mapping) else None
        estimate = _estimate({"messages": messages, "tools": tools})
        if estimate and held.turn.estimate is None:
            self._estimated(held.turn, estimate)

    @staticmethod
    def _estimated(turn: ModelTurn, estimate: int) -> None:
        """A sync Router's turn, opened by ``pre_call_check`` before its prompt was known
        (LiteLLM gives that hook the deployment only), takes its reservations again with
        the prompt's ``estimate`` as LiteLLM logs the request, before sending it: the
        fleet token budget reserves it (and may wait for room), the cost budget and the
        scopes weigh it. LiteLLM ignores what this hook raises, so a refusal stops the run
        (the next attempt is refused) and this request keeps what it held before."""
        turn.gave_way(_Reestimated())
        turn.estimate = estimate
        try:
            turn.open()
        except BaseException as exc:
            turn.estimate = None
            if not isinstance(exc, Exception):
                raise
            _log.warning("tether: the prompt's estimate could not be reserved: %s", exc)
            with contextlib.suppress(Exception):
                turn.open()

    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
    ) -> dict[str, Any] | None:
        run = _SERVING.get()
        if run is not None:
            if run.stopped is not None:
                raise Stopped(run.stopped, run.stop_detail)
            run.check_model(_group(data))
        return None

    # --- after ----------------------------------------------------------------------------

    def _take(self, kwargs: Mapping[str, Any]) -> _Held | None:
        with self._lock:
            return self._held.pop(str(kwargs.get("litellm_call_id")), None)

    def _succeeded(self, kwargs: dict[str, Any], response_obj: Any) -> None:
        held = self._take(kwargs)
        if held is None:
            return
        held.breaker._record(held.permit, None)
        _record(
            held.run,
            held.turn,
            held.model,
            litellm_usage(response_obj),
            _response_cost(response_obj),
        )

    def _failed(self, kwargs: dict[str, Any]) -> None:
        held = self._take(kwargs)
        if held is None:
            return
        exc = kwargs.get("exception")
        if not isinstance(exc, BaseException):
            exc = RuntimeError(str(exc or "the LiteLLM call failed"))
        breaker = held.breaker
        verdict = breaker.classifier(exc)
        breaker._record(held.permit, verdict)
        if verdict is not None and not verdict.retryable and isinstance(exc, Exception):
            held.turn.fail(exc)  # the run stops with the failure's reason
        else:
            held.turn.gave_way(exc)  # LiteLLM retries it: the reservation goes back

    def log_success_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._succeeded(kwargs, response_obj)

    async def async_log_success_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._succeeded(kwargs, response_obj)

    def log_failure_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._failed(kwargs)

    async def async_post_call_failure_deployment_hook(
        self, request_data: Mapping[str, Any], exception: Exception, call_type: Any, **more: Any
    ) -> None:
        """An async attempt's failure, told in the request's path before LiteLLM retries it
        (its log event comes later): the breaker knows it before the next attempt."""
        self._failed(
            {"litellm_call_id": request_data.get("litellm_call_id"), "exception": exception}
        )

    async def async_log_failure_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._failed(kwargs)
