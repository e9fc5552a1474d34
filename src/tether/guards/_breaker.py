"""The circuit breaker: retries handle a blip, the breaker handles an outage."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from tether._errors import CircuitOpenError
from tether.classification._classify import Verdict, classify
from tether.clock import Clock, system_clock
from tether.stores._base import async_ops, bind_name
from tether.stores._logic import DENY, PROBE, BreakerConfig, config_text
from tether.stores._memory import MemoryStore, default_store
from tether.telemetry._emit import emit_breaker, safe_call
from tether.telemetry._events import BreakerEvent

if TYPE_CHECKING:
    from tether.stores._base import Store

__all__ = ["BreakerRegistry", "CircuitBreaker", "breakers"]

P = ParamSpec("P")
T = TypeVar("T")
BreakerHook = Callable[[BreakerEvent], object]


class CircuitBreaker:
    """Stop calling a dependency that is down; probe it until it answers again.

    States: ``closed`` (calls go through) → ``open`` after ``failure_threshold``
    consecutive failures, or when the failure rate over the last ``window`` calls
    reaches ``failure_rate`` (once ``min_calls`` are in the window) → ``half_open``
    when the wait is over: probes go through, one at first and one more for every probe
    that succeeds, never more than ``half_open_max_calls`` in all, whatever races for
    them → ``closed`` after ``half_open_max_calls`` successful probes, or
    ``open`` again when one fails.

    The wait follows the dependency: ``probe_interval`` (1 s) after the trip, then, while
    probes fail, the larger of ``probe_interval`` and 15% of the time open so far (at
    most doubling, never above ``cooldown``). A short outage is noticed within about a
    second of its end and a long one within 15% of its length, at the cost of a probe
    every few seconds. ``probe_interval=None`` waits ``cooldown`` every time.

    Only retryable failures (TRANSIENT, RATE_LIMITED, timeouts) count: a 400 or a
    business-rule rejection is the caller's fault, and proves the dependency answers.
    While open, :class:`tether.CircuitOpenError` is raised without calling it.

    State lives in ``store`` (default: this process's memory); breakers with the same
    name and the same :class:`~tether.stores.RedisStore` are one breaker. A breaker made
    with a name the store already holds with other settings is refused (ValueError
    naming both): one name, one breaker, one configuration.
    """

    def __init__(
        self,
        name: str,
        failure_threshold: int = 5,
        cooldown: float = 30.0,
        half_open_max_calls: int = 1,
        store: Store | None = None,
        clock: Clock | None = None,
        *,
        window: int = 0,
        min_calls: int = 10,
        failure_rate: float = 0.5,
        probe_interval: float | None = 1.0,
        on_change: BreakerHook | None = None,
        classifier: Callable[[BaseException], Verdict] | None = None,
    ) -> None:
        if not name or not isinstance(name, str):
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        self.name = name
        self.config = breaker_config(
            failure_threshold=failure_threshold,
            cooldown=cooldown,
            half_open_max_calls=half_open_max_calls,
            window=window,
            min_calls=min_calls,
            failure_rate=failure_rate,
            probe_interval=probe_interval,
        )
        self.store: Store = store if store is not None else default_store
        bind_name(self.store, "breaker", name, self.config)
        self.clock: Clock = clock or system_clock
        self.on_change = on_change
        self.classifier = classifier or classify
        self._local = threading.local()
        self._last_retry_at = 0.0
        # durations are measured on the monotonic clock when the state lives in this
        # process (stepping the system clock never keeps a breaker open); a store shared
        # by processes needs a time they share
        self._store_now = self.clock.now if isinstance(self.store, MemoryStore) else self.clock.wall

    def __repr__(self) -> str:
        return f"CircuitBreaker({self.name!r}, state={self.state!r})"

    @property
    def failure_threshold(self) -> int:
        return self.config.failure_threshold

    @property
    def cooldown(self) -> float:
        return self.config.cooldown

    @property
    def state(self) -> str:
        """``"closed"``, ``"open"`` or ``"half_open"`` (open past its cooldown reads half_open)."""
        return self.store.breaker_state(self.name, self._store_now())[0]

    # --- the primitives RetryPolicy uses --------------------------------------------

    def _emit(self, old: str, new: str, reason: str) -> None:
        if old == new:
            return
        event = BreakerEvent(self.name, old, new, self.clock.wall(), reason)
        emit_breaker(event)
        safe_call(self.on_change, event)

    def _acquire(self) -> str:
        """A permit (``"call"`` or ``"probe"``), or raise :class:`CircuitOpenError`."""
        now = self._store_now()
        answer = self.store.breaker_acquire(self.name, now, self.config)
        if answer[0] == answer[1] and answer[3] != DENY:  # no change to tell, a permit
            return answer[3]  # (_acquired's own answer, without its frame: most calls)
        return self._acquired(now, answer)

    async def _aacquire(self) -> str:
        """The async form of :meth:`_acquire` (a RedisStore answers on ``redis.asyncio``)."""
        now = self._store_now()
        answer = await async_ops(self.store).abreaker_acquire(self.name, now, self.config)
        return self._acquired(now, answer)

    def _acquired(self, now: float, answer: tuple[str, str, float, str]) -> str:
        old, new, retry_at, permit = answer
        if old != new:  # a change to tell (most calls find the breaker closed, as it was)
            probing = old == "open" and new == "half_open"
            self._emit(old, new, "wait over: probing" if probing else "seen in the shared store")
        if permit == DENY:
            self._last_retry_at = retry_at
            raise self._open_error(retry_at - now)
        return permit

    def _open_error(self, wait: float) -> CircuitOpenError:
        """The refusal, with the next probe's time on the breaker's wall clock and the
        exact wait (a difference of two wall-clock readings loses precision)."""
        wall = self.clock.wall()
        wait = max(0.0, wait)
        return CircuitOpenError(self.name, wall + wait, wall, retry_in=wait)

    def _record(self, permit: object, verdict: Verdict | None) -> None:
        """Record an outcome: ``verdict`` None for a success; a local verdict (tether's own
        failure, nothing sent) is not the dependency's and is not recorded."""
        if verdict is not None and verdict.local:
            return
        failed = verdict is not None and verdict.retryable
        now = self._store_now()
        answer = self.store.breaker_record(self.name, now, str(permit), failed, self.config)
        if answer[0] == answer[1]:  # no change to tell (most calls): _recorded's own steps
            self._last_retry_at = answer[2]
            self._local.last_state = answer[1]
            return
        self._recorded(permit, verdict, answer)

    async def _arecord(self, permit: object, verdict: Verdict | None) -> None:
        """The async form of :meth:`_record`."""
        if verdict is not None and verdict.local:
            return
        failed = verdict is not None and verdict.retryable
        now = self._store_now()
        ops = async_ops(self.store)
        answer = await ops.abreaker_record(self.name, now, str(permit), failed, self.config)
        self._recorded(permit, verdict, answer)

    def _recorded(
        self, permit: object, verdict: Verdict | None, answer: tuple[str, str, float]
    ) -> None:
        old, new, retry_at = answer
        self._last_retry_at = retry_at
        if old != new:
            if new == "open":
                why = (
                    "probe failed"
                    if permit == PROBE
                    else (verdict.reason if verdict else "failure rate over the window")
                )
                self._emit(old, new, f"tripped: {why}")
            else:
                self._emit(old, new, "probe succeeded")
        self._local.last_state = new

    def _refusal(self) -> CircuitOpenError | None:
        """The error to raise when the last recorded outcome left the breaker open."""
        if getattr(self._local, "last_state", "closed") == "open":
            return self._open_error(self._last_retry_at - self._store_now())
        return None

    # --- public calling forms -------------------------------------------------------

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Call ``fn`` through the breaker (no retries: combine with a RetryPolicy)."""
        permit = self._acquire()
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            self._record(permit, self.classifier(exc))
            raise
        self._record(permit, None)
        return result

    async def acall(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """The async form of :meth:`call`, with the same decisions (``_acquired``,
        ``_recorded``). The store is asked synchronously, as before: a RedisStore's async
        client outlives an event loop that ``asyncio.run`` closes (RetryPolicy.acall, which
        runs inside the caller's loop, uses the async twins)."""
        permit = self._acquire()
        try:
            result = await fn(*args, **kwargs)
        except Exception as exc:
            self._record(permit, self.classifier(exc))
            raise
        self._record(permit, None)
        return result

    def __enter__(self) -> CircuitBreaker:
        stack = getattr(self._local, "permits", None)
        if stack is None:
            stack = self._local.permits = []
        stack.append(self._acquire())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        permit = self._local.permits.pop()
        if exc is None:
            self._record(permit, None)
        elif isinstance(exc, Exception):
            self._record(permit, self.classifier(exc))

    def reset(self) -> None:
        """Forget this breaker's state (closed, no failures)."""
        self.store.reset(self.name)
        bind_name(self.store, "breaker", self.name, self.config)
        self._local = threading.local()


def breaker_config(
    *,
    failure_threshold: int = 5,
    cooldown: float = 30.0,
    half_open_max_calls: int = 1,
    window: int = 0,
    min_calls: int = 10,
    failure_rate: float = 0.5,
    probe_interval: float | None = 1.0,
) -> BreakerConfig:
    """A breaker's settings, checked (ValueError naming the field)."""
    if failure_threshold < 1:
        raise ValueError(f"failure_threshold must be >= 1, got {failure_threshold!r}")
    if cooldown < 0:
        raise ValueError(f"cooldown must be >= 0, got {cooldown!r}")
    if half_open_max_calls < 1:
        raise ValueError(f"half_open_max_calls must be >= 1, got {half_open_max_calls!r}")
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window!r}")
    if window and not 1 <= min_calls <= window:
        raise ValueError(f"min_calls must be between 1 and window ({window}), got {min_calls!r}")
    if not 0.0 < failure_rate <= 1.0:
        raise ValueError(f"failure_rate must be in (0, 1], got {failure_rate!r}")
    if probe_interval is not None and not probe_interval > 0:
        raise ValueError(f"probe_interval must be > 0 or None, got {probe_interval!r}")
    return BreakerConfig(
        failure_threshold,
        float(cooldown),
        half_open_max_calls,
        window,
        min_calls,
        failure_rate,
        0.0 if probe_interval is None else min(float(probe_interval), float(cooldown)),
    )


#: The settings of ``CircuitBreaker`` that make its configuration (the rest: where its
#: state lives, its clock, its hooks).
_CONFIG_SETTINGS = frozenset(inspect.signature(breaker_config).parameters)


class BreakerRegistry:
    """One breaker per dependency name: ``tether.breakers.get("stripe")``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._breakers: dict[str, CircuitBreaker] = {}

    def get(self, name: str, **settings: object) -> CircuitBreaker:
        """The breaker of ``name``, created with ``settings`` on first use; asked again with
        other settings, it refuses (ValueError naming both) rather than ignore them."""
        with self._lock:
            breaker = self._breakers.get(name)
            if breaker is None:
                breaker = CircuitBreaker(name, **settings)  # type: ignore[arg-type]
                self._breakers[name] = breaker
            elif settings.keys() & _CONFIG_SETTINGS:
                asked = {k: v for k, v in settings.items() if k in _CONFIG_SETTINGS}
                wanted = breaker_config(**asked)  # type: ignore[arg-type]
                if wanted != breaker.config:
                    raise ValueError(
                        f"tether.breakers[{name!r}] exists with {config_text(breaker.config)}; "
                        f"this asks {config_text(wanted)}: give it another name, or the same "
                        "settings"
                    )
            return breaker

    __getitem__ = get

    def __contains__(self, name: object) -> bool:
        return name in self._breakers

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(dict(self._breakers))

    def clear(self) -> None:
        with self._lock:
            for breaker in self._breakers.values():
                breaker.reset()
            self._breakers.clear()


breakers = BreakerRegistry()
