"""OpenTelemetry instrumentation on ``opentelemetry-api`` alone (the ``otel`` extra).

Spans and events appear through OpenTelemetry's global tracer and meter providers
whenever ``opentelemetry-api`` is installed: there is nothing to switch on. Without
it every function here is a no-op that costs one attribute read. A failure inside
telemetry is logged and swallowed: it never breaks the agent.

Spans: ``tether.run``, ``tether.step``, ``tether.tool_call``, ``tether.attempt``.
Events: ``tether.retry``, ``tether.breaker``, ``tether.budget_exhausted``,
``tether.loop_detected``, ``tether.stop``.
Metrics: ``tether.attempts``, ``tether.retries``, ``tether.stops``,
``tether.breaker.transitions`` (counters) and ``tether.retry.delay`` (histogram, s).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tether.telemetry._events import BreakerEvent, RetryEvent

__all__ = [
    "StepSpan",
    "add_event",
    "enabled",
    "end_step",
    "on_breaker_change",
    "on_retry",
    "on_stop",
    "start_step",
    "subscribe",
    "record_attempt",
    "record_breaker",
    "record_retry",
    "record_stop",
    "span",
]

_log = logging.getLogger("tether")
_NAME = "tether"
_state: dict[str, Any] = {}
_hooks: dict[str, list[Callable[[Any], object]]] = {"retry": [], "stop": [], "breaker_change": []}


def subscribe(event: str, fn: Callable[[Any], object]) -> Callable[[Any], object]:
    """Call ``fn`` with the frozen event of every ``"retry"`` (:class:`tether.RetryEvent`),
    ``"stop"`` (:class:`tether.Outcome`) or ``"breaker_change"`` (:class:`tether.BreakerEvent`)
    in this process. Returns ``fn``; a hook that raises is logged and ignored."""
    if event not in _hooks:
        raise ValueError(f"event must be one of {', '.join(_hooks)}, got {event!r}")
    _hooks[event].append(fn)
    return fn


def unsubscribe(event: str, fn: Callable[[Any], object]) -> None:
    if fn in _hooks.get(event, []):
        _hooks[event].remove(fn)


def on_retry(fn: Callable[[Any], object]) -> Callable[[Any], object]:
    """Decorator: ``fn(RetryEvent)`` after every failed attempt that will be retried."""
    return subscribe("retry", fn)


def on_stop(fn: Callable[[Any], object]) -> Callable[[Any], object]:
    """Decorator: ``fn(Outcome)`` when any guarded run ends."""
    return subscribe("stop", fn)


def on_breaker_change(fn: Callable[[Any], object]) -> Callable[[Any], object]:
    """Decorator: ``fn(BreakerEvent)`` on every circuit breaker transition."""
    return subscribe("breaker_change", fn)


def notify(event: str, payload: Any) -> None:
    for fn in list(_hooks[event]):
        try:
            fn(payload)
        except Exception:
            _log.exception("tether %s hook %r raised; ignored", event, fn)


_UNLOADED: Any = object()
#: the ``opentelemetry.trace`` module once looked for (None: not installed)
_trace: Any = _UNLOADED


def _api() -> Any:
    """The ``opentelemetry.trace`` module, or None when the API is not installed."""
    global _trace, _DIRECT
    try:
        return _state["trace"]
    except KeyError:
        pass
    try:
        from opentelemetry import metrics, trace
        from opentelemetry.metrics import _internal as metrics_internal
    except ImportError:
        _state["trace"] = _state["metrics"] = _state["metrics_internal"] = None
    else:
        _state["trace"] = trace
        _state["metrics"] = metrics
        _state["metrics_internal"] = metrics_internal
    _trace = _state["trace"]
    _DIRECT = _trace is not None and hasattr(_trace, "_TRACER_PROVIDER") and not _ENV_PROVIDER
    return _trace


def _tracer() -> Any:
    """tether's tracer, asked for once (a proxy tracer follows a provider set later)."""
    tracer = _state.get("tracer")
    if tracer is None:
        tracer = _state["tracer"] = _api().get_tracer(_NAME)
    return tracer


def _instrument(kind: str, name: str, **kw: Any) -> Any:
    key = f"{kind}:{name}"
    inst = _state.get(key)
    if inst is None:
        meter = _state.get("meter")
        if meter is None:
            meter = _state["meter"] = _state["metrics"].get_meter(_NAME)
        inst = getattr(meter, kind)(name, **kw)
        _state[key] = inst
    return inst


def reset() -> None:
    """Forget cached tracers and instruments (tests swap providers)."""
    global _trace
    _state.clear()
    _trace = _UNLOADED


def _clean(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """OpenTelemetry attribute values, every text redacted."""
    from tether.redaction._redact import redact_text

    out: dict[str, Any] = {}
    for k, v in attrs.items():
        if v is None:
            continue
        if isinstance(v, bool | int | float):
            out[k] = v
        elif isinstance(v, str):
            out[k] = redact_text(v)
        elif isinstance(v, list | tuple):
            out[k] = [redact_text(str(x)) for x in v]
        else:
            out[k] = redact_text(str(getattr(v, "value", v)))
    return out


_NULL = contextlib.nullcontext()


def enabled() -> bool:
    """True when OpenTelemetry is installed and a tracer provider has been set.

    Called on every guarded step, so it avoids the public lookup (which reads the
    environment each time) when the API exposes its global directly.
    """
    trace = _trace
    if trace is _UNLOADED:
        if not _may_be_configured():  # nothing can record yet: OpenTelemetry not imported
            return False
        trace = _api()
    if trace is None:
        return False
    if _DIRECT:  # the one check paid while nothing records
        return trace._TRACER_PROVIDER is not None
    provider = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is None and not _ENV_PROVIDER:
        return False  # the one check paid while nothing records
    if provider is _UNKNOWN or provider is None:
        # a proxy provider means nobody configured OpenTelemetry: every span would be dropped
        return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    return provider is not None


def metering() -> bool:
    """True when OpenTelemetry is installed and a meter provider has been set: before
    that, a counter would drop what it is given."""
    if _trace is _UNLOADED and not _may_be_configured():
        return False
    if _api() is None:
        return False
    internal = _state["metrics_internal"]
    provider = getattr(internal, "_METER_PROVIDER", _UNKNOWN)
    if provider is _UNKNOWN or (provider is None and _ENV_METER):
        metrics = _state["metrics"]
        return type(metrics.get_meter_provider()).__name__ != "_ProxyMeterProvider"
    return provider is not None


def _may_be_configured() -> bool:
    """Whether a provider can have been set: a provider is set through OpenTelemetry's API
    (so its module is imported by whoever set it: your setup code, the SDK, the
    ``opentelemetry-instrument`` launcher) or named in the environment. Until then tether
    does not import OpenTelemetry at all: a run pays nothing for telemetry nobody reads,
    and the first run after a provider is set finds it."""
    modules = sys.modules
    return (
        _ENV_PROVIDER
        or _ENV_METER
        or "opentelemetry.trace" in modules
        or "opentelemetry.metrics" in modules
    )


_UNKNOWN = object()
_ENV_PROVIDER = bool(os.environ.get("OTEL_PYTHON_TRACER_PROVIDER"))
#: the API exposes its global provider and no environment variable names one: read it
_DIRECT = False
_ENV_METER = bool(os.environ.get("OTEL_PYTHON_METER_PROVIDER"))


def span(name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """A span under the current one; a no-op (yielding None) when OpenTelemetry is
    absent or not configured."""
    if not enabled():
        return _NULL
    return _span(name, attributes)


@contextlib.contextmanager
def _span(name: str, attributes: dict[str, Any]) -> Iterator[Any]:
    trace = _api()
    try:
        cm = _tracer().start_as_current_span(name, attributes=_clean(attributes))
        current = cm.__enter__()
    except Exception:
        _log.debug("telemetry: could not start span %s", name, exc_info=True)
        yield None
        return
    try:
        yield current
    except BaseException as exc:
        with contextlib.suppress(Exception):  # the exception event, its message redacted
            said = {"exception.type": type(exc).__qualname__, "exception.message": str(exc)[:1000]}
            current.add_event("exception", _clean(said))
            current.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))
        with contextlib.suppress(Exception):
            cm.__exit__(None, None, None)  # the SDK would record the raw message again
        raise
    else:
        with contextlib.suppress(Exception):
            cm.__exit__(None, None, None)


def set_attributes(target: Any, **attributes: Any) -> None:
    """Set attributes on a span yielded by :func:`span` (None is fine)."""
    if target is None:
        return
    try:
        target.set_attributes(_clean(attributes))
    except Exception:
        _log.debug("telemetry: set_attributes failed", exc_info=True)


def add_event(name: str, **attributes: Any) -> None:
    """An event on the current span (nothing is built unless that span records)."""
    if not enabled():
        return
    try:
        current = _api().get_current_span()
        if current.is_recording():
            current.add_event(name, _clean(attributes))
    except Exception:
        _log.debug("telemetry: add_event %s failed", name, exc_info=True)


def _count(name: str, value: float = 1, **attributes: Any) -> None:
    if not metering():
        return
    try:
        _instrument("create_counter", name).add(value, _clean(attributes))
    except Exception:
        _log.debug("telemetry: counter %s failed", name, exc_info=True)


def record_attempt(name: str, attempt: int) -> None:
    _count("tether.attempts", 1, **{"tether.name": name, "tether.attempt": attempt})


class StepSpan:
    """A ``tether.step`` span made current between two ``run.proceed()`` calls."""

    __slots__ = ("span", "token")

    def __init__(self, span: Any, token: Any) -> None:
        self.span = span
        self.token = token


def start_step(**attributes: Any) -> StepSpan | None:
    """Start a ``tether.step`` span and make it current; None when telemetry is off."""
    if not enabled():
        return None
    try:
        from opentelemetry import context as otel_context

        trace = _api()
        step = _tracer().start_span("tether.step", attributes=_clean(attributes))
        token = otel_context.attach(trace.set_span_in_context(step))
        return StepSpan(step, token)
    except Exception:
        _log.debug("telemetry: could not start a step span", exc_info=True)
        return None


def end_step(step: StepSpan | None) -> None:
    if step is None:
        return
    try:
        from opentelemetry import context as otel_context

        otel_context.detach(step.token)
        step.span.end()
    except Exception:
        _log.debug("telemetry: could not end a step span", exc_info=True)


def record_retry(event: RetryEvent) -> None:
    if _hooks["retry"]:
        notify("retry", event)
    v = event.verdict
    if enabled():
        attrs = {
            "tether.name": event.name,
            "tether.attempt": event.attempt,
            "tether.verdict": v.kind.value,
            "http.response.status_code": v.status,
            "tether.error.code": v.code,
            "tether.delay_s": event.delay,
            "tether.retry_after_s": v.retry_after,
            "error.type": type(event.error).__name__,
        }
        add_event("tether.retry", **attrs)
    if not metering():
        return
    _count("tether.retries", 1, **{"tether.name": event.name, "tether.verdict": v.kind.value})
    try:
        _instrument("create_histogram", "tether.retry.delay", unit="s").record(
            event.delay, _clean({"tether.name": event.name})
        )
    except Exception:
        _log.debug("telemetry: histogram failed", exc_info=True)


def record_breaker(event: BreakerEvent) -> None:
    if _hooks["breaker_change"]:
        notify("breaker_change", event)
    if enabled():
        attrs = {
            "tether.breaker": event.name,
            "tether.breaker.from": event.old,
            "tether.breaker.to": event.new,
            "tether.reason": event.reason,
        }
        add_event("tether.breaker", **attrs)
    _count("tether.breaker.transitions", 1, **{"tether.breaker": event.name, "to": event.new})


def record_stop(reason: str, status: str, **attributes: Any) -> None:
    if enabled():
        attrs = {"tether.stop_reason": reason, "tether.status": status}
        add_event("tether.stop", **attrs, **attributes)
    _count("tether.stops", 1, **{"tether.stop_reason": reason, "tether.status": status})
