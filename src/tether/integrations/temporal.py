"""Temporal activities under tether: at most once where the engine gives at least once.

Temporal runs an activity *at least once*: a worker that crashes after the effect and
before it reports the result has the activity re-delivered, and the effect runs again
(Temporal asks that activities be idempotent). Here the activity's body runs through
tether's ledger, keyed by the activity's identity (namespace, workflow id, run id and
activity id: what every attempt of one scheduled activity shares) and its intent (the
activity type and its exact arguments), so that a re-delivered attempt

* returns the recorded result when the earlier attempt finished,
* reconciles through ``lookup`` when the earlier attempt died mid-effect, and
* raises a non-retryable ``ApplicationError`` (type ``"UnknownOutcome"``) when nothing
  can tell whether the effect happened: tether never re-executes it blindly.

Temporal's retry stays the one retry layer: a failure leaves the activity as an
``ApplicationError`` whose ``non_retryable`` and ``next_retry_delay`` come from
:func:`tether.classify` (a 400 is not retried, a 429's ``Retry-After`` sets the delay).
A fleet-shared :class:`tether.CircuitBreaker` and :class:`tether.RetryBudget` (give them
a ``RedisStore``) refuse attempts and retries for every worker at once. A tether
``RetryPolicy`` that retries inside an activity Temporal also retries is warned about
(:class:`RetryLayersWarning`).

Two shells over one core: :func:`effect` decorates one activity function, and
:class:`TetherInterceptor` guards the activities of a worker
(``Worker(..., interceptors=[TetherInterceptor(...)])``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import functools
import threading
import warnings
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from datetime import timedelta
from typing import Any, cast

from tether import telemetry
from tether._errors import (
    UnknownOutcome,
    require,
)
from tether.classification._classify import Kind, Verdict, classify, register_classifier
from tether.effects._canonical import intent_key
from tether.effects._ledger import Ledger
from tether.guards._breaker import CircuitBreaker
from tether.guards._budget import RetryBudget
from tether.integrations._common import is_async
from tether.integrations._durable import (
    F,
    Lookup,
    RetryLayersWarning,
    check_effect,
    engine_verdict,
)
from tether.redaction._redact import redact
from tether.retries._policy import RetryPolicy

require("temporalio", "temporal")

from temporalio import activity  # noqa: E402 - after the extra check
from temporalio import common as temporal_common  # noqa: E402
from temporalio.exceptions import ApplicationError, CancelledError  # noqa: E402
from temporalio.worker import (  # noqa: E402
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

__all__ = [
    "RetryLayersWarning",
    "TetherInterceptor",
    "activity_key",
    "effect",
    "engine_error",
    "identity",
    "retry_policy",
]

# --- classification of Temporal's own exceptions -------------------------------------------


@register_classifier
def _temporal_verdict(exc: BaseException) -> Verdict | None:
    """A cancelled activity may have sent its effect; an ``ApplicationError`` says itself
    whether to retry it, and after how long."""
    if isinstance(exc, CancelledError):
        return Verdict(
            Kind.PERMANENT,
            "CancelledError: the activity was cancelled mid-call",
            outcome_unknown=True,
        )
    if isinstance(exc, ApplicationError):
        if exc.non_retryable:
            return Verdict(Kind.PERMANENT, f"ApplicationError: {exc.type or 'non-retryable'}")
        delay = exc.next_retry_delay.total_seconds() if exc.next_retry_delay else None
        return Verdict(
            Kind.TRANSIENT, f"ApplicationError: {exc.type or 'retryable'}", retry_after=delay
        )
    return None


# --- identity -----------------------------------------------------------------------------


def identity() -> str:
    """What every attempt of the running activity shares, and nothing else does:
    ``temporal:<namespace>/<workflow id>/<run id>/<activity id>`` (the run id too: a
    workflow that continued as new numbers its activities from 1 again). A standalone
    activity is ``temporal:<namespace>/activity/<activity id>/<activity run id>``; outside
    an activity, ``""``."""
    if not activity.in_activity():
        return ""
    info = activity.info()
    if info.workflow_id:
        return (
            f"temporal:{info.workflow_namespace or info.namespace}/{info.workflow_id}/"
            f"{info.workflow_run_id}/{info.activity_id}"
        )
    run_id = getattr(info, "activity_run_id", None) or ""
    return f"temporal:{info.namespace}/activity/{info.activity_id}/{run_id}"


def activity_key(
    name: str, args: Iterable[Any] = (), kwargs: Mapping[str, Any] | None = None
) -> str:
    """The ledger key of activity ``name`` called with ``args``: its identity and its exact
    arguments (nothing dropped: a re-delivery sends the same ones)."""
    return intent_key(
        name,
        {"args": list(args), "kwargs": dict(kwargs or {})},
        scope=identity() or "temporal",
        ignore=(),
    )


# --- the verdict, as Temporal's retry --------------------------------------------------------


def _engine_retries() -> bool:
    """Will Temporal retry the running activity after this attempt? (Without a policy in
    the activity's info, the server's default retries without limit.)"""
    if not activity.in_activity():
        return False
    info = activity.info()
    policy = info.retry_policy
    if policy is None or not policy.maximum_attempts:
        return True
    return info.attempt < policy.maximum_attempts


def _said(exc: BaseException) -> str:
    """The failure's message for the engine's history (redacted; the type is its own field)."""
    return str(redact(str(exc).strip() or type(exc).__name__))[:1000]


def engine_error(exc: BaseException) -> BaseException:
    """The exception an activity should raise for ``exc``, so that Temporal's retry does
    what tether's verdict says: an ``ApplicationError`` with ``non_retryable`` and
    ``next_retry_delay`` set (cancellations and ``ApplicationError`` pass unchanged)."""
    if isinstance(exc, ApplicationError | CancelledError) or not isinstance(exc, Exception):
        return exc
    retry, wait = engine_verdict(exc)
    if retry:
        return _retryable(exc, wait)
    kind = "UnknownOutcome" if isinstance(exc, UnknownOutcome) else type(exc).__name__
    return ApplicationError(_said(exc), type=kind, non_retryable=True)


def _retryable(exc: BaseException, wait: float | None) -> ApplicationError:
    delay = timedelta(seconds=wait) if wait is not None else None
    return ApplicationError(_said(exc), type=type(exc).__name__, next_retry_delay=delay)


def retry_policy(
    policy: RetryPolicy | None = None, **overrides: Any
) -> temporal_common.RetryPolicy:
    """Temporal's ``RetryPolicy`` with a tether policy's numbers (first wait ``base``,
    doubling, capped at ``cap``, ``max_attempts``): give it to ``execute_activity`` and
    keep tether's own attempts at one. Temporal's backoff has no jitter."""
    p = policy or RetryPolicy()
    fields: dict[str, Any] = {
        "initial_interval": timedelta(seconds=p.base),
        "backoff_coefficient": 2.0,
        "maximum_interval": timedelta(seconds=max(p.cap, p.base)),
        "maximum_attempts": p.max_attempts,
    }
    fields.update(overrides)
    return temporal_common.RetryPolicy(**fields)


@telemetry.on_retry
def _warn_two_layers(event: Any) -> None:
    """A tether RetryPolicy retried inside an activity that Temporal retries too."""
    if not activity.in_activity() or not _engine_retries():
        return
    info = activity.info()
    limit = info.retry_policy.maximum_attempts if info.retry_policy else 0
    warnings.warn(
        f"tether retried {event.name!r} inside Temporal activity {info.activity_type!r}, which "
        f"Temporal retries too (maximum_attempts={limit or 'unlimited'}): the attempts multiply. "
        "Keep one layer: RetryPolicy(max_attempts=1) inside the activity, or the activity's "
        "retry_policy=tether.integrations.temporal.retry_policy(policy) with maximum_attempts",
        RetryLayersWarning,
        stacklevel=2,
    )


# --- the core -------------------------------------------------------------------------------


class _Effects:
    """How one worker runs a guarded activity: ledger, breaker, budget, heartbeats."""

    def __init__(
        self,
        ledger: Ledger | None,
        lease: float | None,
        breaker: CircuitBreaker | None,
        budget: RetryBudget | None,
        heartbeat: bool,
    ) -> None:
        check_effect(ledger, lease)
        if breaker is not None and not isinstance(breaker, CircuitBreaker):
            raise TypeError(f"breaker must be a tether.CircuitBreaker, got {breaker!r}")
        if budget is not None and not isinstance(budget, RetryBudget):
            raise TypeError(f"budget must be a tether.RetryBudget, got {budget!r}")
        self.ledger = ledger
        self.lease = lease
        self.breaker = breaker
        self.budget = budget
        self.heartbeat = heartbeat

    def _lease(self) -> float:
        assert self.ledger is not None
        return self.lease if self.lease is not None else self.ledger.lease

    def _failed(self, exc: BaseException) -> BaseException:
        """The engine's error for ``exc``; a retry the fleet's budget cannot pay is not retried."""
        error = engine_error(exc)
        if (
            self.budget is not None
            and isinstance(error, ApplicationError)
            and not error.non_retryable
            and _engine_retries()
            and not self.budget.try_spend(timeout=classify(exc).timeout)
        ):
            return ApplicationError(
                f"retry budget {self.budget.name!r} is spent: not retrying ({_said(exc)})",
                type="RetryBudgetExhausted",
                non_retryable=True,
            )
        return error

    @contextlib.contextmanager
    def _engine_errors(self, stop_beat: Callable[[], Any] | None) -> Iterator[None]:
        """The body's failure as the engine's error (:meth:`_failed`); the heartbeat
        stopped, whatever happened."""
        try:
            yield
        except BaseException as exc:
            error = self._failed(exc)
            if error is exc:
                raise
            raise error from exc
        finally:
            if stop_beat is not None:
                stop_beat()

    def call(
        self,
        name: str,
        fn: Callable[..., Any],
        lookup: Lookup | None,
        effect: bool,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run a sync activity body (in the activity's thread)."""
        body = fn if self.breaker is None else functools.partial(self.breaker.call, fn)
        beat = _SyncBeat.start() if self.heartbeat else None
        with self._engine_errors(beat.stop if beat is not None else None):
            if effect and self.ledger is not None:
                key = activity_key(name, args, kwargs)
                result = self.ledger.once(
                    key, body, *args, lookup=lookup, lease=self._lease(), **kwargs
                )
            else:
                result = body(*args, **kwargs)
        if self.budget is not None:
            self.budget.on_success()
        return result

    async def acall(
        self,
        name: str,
        fn: Callable[..., Awaitable[Any]],
        lookup: Lookup | None,
        effect: bool,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run an async activity body (on the worker's event loop)."""
        body = fn if self.breaker is None else functools.partial(self.breaker.acall, fn)
        beat = _async_beat() if self.heartbeat else None
        with self._engine_errors(beat.cancel if beat is not None else None):
            if effect and self.ledger is not None:
                key = activity_key(name, args, kwargs)
                result = await self.ledger.aonce(
                    key, body, *args, lookup=lookup, lease=self._lease(), **kwargs
                )
            else:
                result = await body(*args, **kwargs)
        if self.budget is not None:
            await self.budget.aon_success()
        return result


def _beat_interval() -> float | None:
    """A third of the activity's heartbeat timeout, or None when it has none."""
    if not activity.in_activity():
        return None
    timeout = activity.info().heartbeat_timeout
    return None if not timeout else max(0.05, timeout.total_seconds() / 3)


class _SyncBeat:
    """Heartbeats a sync activity from a thread while its effect runs, so that Temporal
    does not time it out and hand it to another worker while it is still working."""

    def __init__(self, interval: float) -> None:
        self._stop = threading.Event()
        context = contextvars.copy_context()  # the activity's context, for activity.heartbeat

        def loop() -> None:
            while not self._stop.wait(interval):
                try:
                    context.run(activity.heartbeat)
                except Exception:  # a heartbeat that fails is the engine's business
                    return

        self._thread = threading.Thread(target=loop, name="tether-temporal-heartbeat", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls) -> _SyncBeat | None:
        interval = _beat_interval()
        return None if interval is None else cls(interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)


def _async_beat() -> asyncio.Task[None] | None:
    interval = _beat_interval()
    if interval is None:
        return None

    async def loop() -> None:
        while True:
            await asyncio.sleep(interval)
            activity.heartbeat()

    return asyncio.get_running_loop().create_task(loop())


# --- the decorator ----------------------------------------------------------------------------


def effect(
    ledger: Ledger | None = None,
    *,
    lookup: Lookup | None = None,
    name: str | None = None,
    lease: float | None = None,
    breaker: CircuitBreaker | None = None,
    budget: RetryBudget | None = None,
    heartbeat: bool = True,
) -> Callable[[F], F]:
    """An activity whose body runs at most once per scheduled activity (place it under
    ``@activity.defn``; sync or async).

    ``ledger``: where the record lives (a fleet needs a shared one: ``Ledger.postgres`` or
    ``Ledger.redis``; None only maps failures onto Temporal's retry). ``lookup(key)``
    reads the provider's records when an earlier attempt died mid-effect (None: raise
    ``UnknownOutcome``). ``name`` is the intent's name (default: the function's).
    ``breaker`` and ``budget`` are the fleet's (a ``RedisStore`` shares them); with
    ``heartbeat`` an activity that has a heartbeat timeout heartbeats while its body runs
    (pass False when the activity heartbeats with details of its own).
    """
    effects = _Effects(ledger, lease, breaker, budget, heartbeat)

    def decorate(fn: F) -> F:
        tool: str = name or str(getattr(fn, "__name__", "activity"))
        if is_async(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                return await effects.acall(tool, fn, lookup, True, args, kwargs)

            return cast(F, run_async)

        @functools.wraps(fn)
        def run_sync(*args: Any, **kwargs: Any) -> Any:
            return effects.call(tool, fn, lookup, True, args, kwargs)

        return cast(F, run_sync)

    return decorate


# --- the interceptor --------------------------------------------------------------------------


class TetherInterceptor(Interceptor):
    """tether's guards for a worker's activities: ``Worker(..., interceptors=[...])``.

    ``side_effects`` names the activity types (names, or a mapping of name to ``lookup``)
    whose bodies run at most once through ``ledger``; every activity has its failures
    mapped onto Temporal's retry, and, given a ``store``, a breaker per activity type
    shared by every worker on that store (``breaker_threshold`` retryable failures open it
    for ``breaker_cooldown`` seconds). ``budget`` is a fleet's :class:`tether.RetryBudget`.
    Sync activities must run on a thread pool (``activity_executor=ThreadPoolExecutor``).
    """

    def __init__(
        self,
        ledger: Ledger | None = None,
        *,
        side_effects: Mapping[str, Lookup | None] | Iterable[str] | None = None,
        store: Any = None,
        breaker_threshold: int = 5,
        breaker_cooldown: float = 30.0,
        budget: RetryBudget | None = None,
        lease: float | None = None,
        heartbeat: bool = True,
    ) -> None:
        if isinstance(side_effects, str):
            raise TypeError("side_effects must be a collection of activity names, not one string")
        found = (
            dict(side_effects)
            if isinstance(side_effects, Mapping)
            else dict.fromkeys(side_effects or ())
        )
        for key, value in found.items():
            if not isinstance(key, str) or (value is not None and not callable(value)):
                raise TypeError(
                    f"side_effects maps activity names to lookup(key) or None, got {key!r}: {value!r}"
                )
        if found and ledger is None:
            raise ValueError(
                "side_effects need a ledger: pass ledger=tether.Ledger.postgres(dsn) (or .redis)"
            )
        self.side_effects: dict[str, Lookup | None] = found
        self.store = store
        self.breaker_threshold = breaker_threshold
        self.breaker_cooldown = breaker_cooldown
        self._effects = _Effects(ledger, lease, None, budget, heartbeat)
        self._breakers: dict[str, CircuitBreaker] = {}
        self._lock = threading.Lock()

    def breaker(self, activity_type: str) -> CircuitBreaker | None:
        """The breaker of an activity type (None without a store)."""
        if self.store is None:
            return None
        with self._lock:
            found = self._breakers.get(activity_type)
            if found is None:
                found = CircuitBreaker(
                    f"activity:{activity_type}",
                    failure_threshold=self.breaker_threshold,
                    cooldown=self.breaker_cooldown,
                    store=self.store,
                )
                self._breakers[activity_type] = found
            return found

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next, self)


class _Inbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, owner: TetherInterceptor) -> None:
        super().__init__(next)
        self._owner = owner

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        owner = self._owner
        name = activity.info().activity_type or "activity"
        base = owner._effects
        effects = _Effects(
            base.ledger, base.lease, owner.breaker(name), base.budget, base.heartbeat
        )
        is_effect = name in owner.side_effects
        lookup = owner.side_effects.get(name)
        fn = input.fn
        if is_async(fn):

            async def run_async(*args: Any) -> Any:
                return await effects.acall(name, fn, lookup, is_effect, args, {})

            return await self.next.execute_activity(dataclasses.replace(input, fn=run_async))

        if input.executor is not None and not isinstance(
            input.executor, concurrent.futures.ThreadPoolExecutor
        ):
            raise ApplicationError(
                f"tether guards sync activity {name!r} only on a thread pool "
                "(Worker(activity_executor=ThreadPoolExecutor(...))); decorate it with "
                "tether.integrations.temporal.effect for a process pool",
                type="TetherConfiguration",
                non_retryable=True,
            )

        def run_sync(*args: Any) -> Any:
            return effects.call(name, fn, lookup, is_effect, args, {})

        return await self.next.execute_activity(dataclasses.replace(input, fn=run_sync))
