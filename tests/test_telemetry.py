"""Telemetry: spans, events and metrics seen through the OpenTelemetry SDK's in-memory exporter."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import tether
from scripted_server import Reply, ScriptedServer
from tether import Budget, Guard, RetryPolicy, StopReason, Tool, VirtualClock, telemetry
from tether.integrations import anthropic as t_anthropic


def _metric_names(reader: InMemoryMetricReader) -> set[str]:
    data = reader.get_metrics_data()
    return {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


def test_a_retry_and_a_stop_are_visible(otel: Any) -> None:
    """A run with a flaky tool: run, step, tool_call and attempt spans; retry and stop events."""
    exporter, reader = otel
    calls = 0

    def flaky(q: str) -> dict[str, str]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionResetError()
        return {"hit": q}

    guard = Guard(clock=VirtualClock(), retry=RetryPolicy(max_attempts=3, base=0.01))
    with guard.start(task="search") as run:
        while run.proceed():
            run.call_tool("search", flaky, {"q": "invoice 99"})
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert {"tether.run", "tether.step", "tether.tool_call", "tether.attempt"} <= set(spans)
    attempts = [s for s in exporter.get_finished_spans() if s.name == "tether.attempt"]
    assert len(attempts) >= 2
    retry = [e for s in exporter.get_finished_spans() if s.name == "tether.tool_call" for e in s.events
             if e.name == "tether.retry"]  # fmt: skip
    assert retry[0].attributes["tether.verdict"] == "transient"
    assert retry[0].attributes["tether.attempt"] == 1
    assert "tether.delay_s" in retry[0].attributes
    stop = [e for e in spans["tether.run"].events if e.name == "tether.stop"]
    assert stop[0].attributes["tether.stop_reason"] == StopReason.REPEATED_ACTION.value
    loop = [
        e
        for s in exporter.get_finished_spans()
        for e in s.events
        if e.name == "tether.loop_detected"
    ]
    assert loop
    tool = spans["tether.tool_call"]
    assert tool.parent is not None
    assert {
        "tether.attempts",
        "tether.retries",
        "tether.stops",
        "tether.retry.delay",
    } <= _metric_names(reader)


def test_breaker_transitions_and_budget_exhaustion_are_events(otel: Any) -> None:
    """An opened breaker and an exhausted budget show up as events."""
    exporter, _ = otel
    guard = Guard(clock=VirtualClock(), retry=RetryPolicy(max_attempts=2, base=0.01), breaker_threshold=2,
                  budget=Budget(max_steps=2))  # fmt: skip

    def down(x: int) -> None:
        raise ConnectionRefusedError()

    with guard.start() as run:
        while run.proceed():
            try:
                run.call_tool("pay", down, {"x": run.steps})
            except tether.ToolError:
                pass
    events = {e.name for s in exporter.get_finished_spans() for e in s.events}
    assert "tether.breaker" in events
    assert run.outcome.stopped_because is StopReason.CIRCUIT_OPEN


def test_genai_attributes_on_model_calls(otel: Any, server: ScriptedServer) -> None:
    """A guarded SDK call is a GenAI span: model, token usage, finish reasons."""
    exporter, _ = otel
    server.default = Reply(200, {"id": "msg_9", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
                                 "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
                                 "stop_sequence": None, "usage": {"input_tokens": 12, "output_tokens": 3}})  # fmt: skip
    with anthropic.Anthropic(api_key="t", base_url=server.url) as raw:
        out = t_anthropic.run_agent(raw, model="claude-haiku-4-5", messages=[{"role": "user", "content": "hello"}],
                                    tools=[Tool("noop", lambda: None)], guard=Guard(clock=VirtualClock()))  # fmt: skip
    assert out.status == "success"
    chat = next(s for s in exporter.get_finished_spans() if s.name == "chat claude-haiku-4-5")
    assert chat.attributes["gen_ai.provider.name"] == "anthropic"
    assert chat.attributes["gen_ai.usage.input_tokens"] == 12
    assert chat.attributes["gen_ai.usage.output_tokens"] == 3
    assert tuple(chat.attributes["gen_ai.response.finish_reasons"]) == ("end_turn",)


def test_hooks_get_frozen_events() -> None:
    """on_retry, on_stop and on_breaker_change receive frozen events; a broken hook is ignored."""
    seen: list[Any] = []
    hooks = [telemetry.on_retry(seen.append), telemetry.on_stop(seen.append),
             telemetry.on_breaker_change(seen.append), telemetry.on_retry(lambda e: 1 / 0)]  # fmt: skip
    try:
        guard = Guard(
            clock=VirtualClock(), retry=RetryPolicy(max_attempts=3, base=0.01), breaker_threshold=2
        )

        def down() -> None:
            raise ConnectionResetError()

        with guard.start() as run:
            run.proceed()
            run.call_tool("t", down, {})
    finally:
        for event, fn in zip(["retry", "stop", "breaker_change", "retry"], hooks, strict=True):
            telemetry.unsubscribe(event, fn)
    kinds = {type(e).__name__ for e in seen}
    assert {"RetryEvent", "Outcome", "BreakerEvent"} <= kinds


def test_zero_cost_when_not_configured() -> None:
    """Without a configured provider telemetry is off: spans are a shared no-op."""
    assert telemetry.enabled() is False
    assert telemetry.span("x") is telemetry.span("y")


def test_subscribe_rejects_unknown_events() -> None:
    """A typo in an event name is an error."""
    with pytest.raises(ValueError, match="event must be one of"):
        telemetry.subscribe("retyr", print)


def test_a_run_imports_no_opentelemetry_until_someone_configures_it() -> None:
    """A first run in a fresh process loads no OpenTelemetry module (nothing could record);
    once the process sets a tracer provider, the next run's spans are exported."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import sys
        import tether

        def one_run():
            with tether.Guard().start(task="t") as run:
                run.proceed()
                run.call_tool("lookup", lambda q: {"q": q}, {"q": "x"})
                run.succeed("ok")

        one_run()
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        one_run()
        print(sorted({s.name for s in exporter.get_finished_spans()}))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after = out.stdout.splitlines()
    assert before == "[]"
    assert "tether.run" in after and "tether.tool_call" in after
