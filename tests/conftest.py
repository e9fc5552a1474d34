from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from scripted_server import ScriptedServer

pytest_plugins = ["tether.testing"]  # the tether_reset fixture users get

REDIS_URL = os.environ.get("TETHER_REDIS_URL", "redis://127.0.0.1:6379/0")
PG_DSN = os.environ.get("TETHER_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture(autouse=True)
def _reset_tether() -> Iterator[None]:
    from tether.testing import reset  # imported here: the plugin line above imports it first

    reset()
    yield
    reset()


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as s:
        yield s


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The real Redis server; fails (never skips) when it cannot be reached."""
    import redis

    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
        client.ping()
    except Exception as exc:
        pytest.fail(
            f"Redis is unreachable at TETHER_REDIS_URL={REDIS_URL!r} ({exc}); start Redis "
            "or point TETHER_REDIS_URL at one",
            pytrace=False,
        )
    # the Redis ledger refuses a server that does not persist its writes
    if client.config_get("appendonly").get("appendonly") != "yes":
        client.config_set("appendonly", "yes")
    client.close()
    return REDIS_URL


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """The real PostgreSQL server; fails (never skips) when it cannot be reached."""
    import psycopg

    try:
        psycopg.connect(PG_DSN, connect_timeout=3).close()
    except Exception as exc:
        pytest.fail(
            f"PostgreSQL is unreachable at TETHER_PG_DSN={PG_DSN!r} ({exc}); start it "
            "or point TETHER_PG_DSN at one",
            pytrace=False,
        )
    return PG_DSN


@pytest.fixture
def otel() -> Iterator[tuple[InMemorySpanExporter, InMemoryMetricReader]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace.set_tracer_provider(provider)
    metrics._internal._METER_PROVIDER_SET_ONCE = Once()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    from tether import telemetry

    telemetry.reset()
    yield exporter, reader
    provider.shutdown()
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    metrics._internal._METER_PROVIDER_SET_ONCE = Once()
    metrics._internal._METER_PROVIDER = None
    telemetry.reset()
