from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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

#: the benchmark (the tether-bench distribution, package tether.bench) of this checkout, whatever
#: the venv holds: in this process and in the processes the benchmark starts
BENCH_SRC = Path(__file__).resolve().parents[1] / "benchmarks" / "src"


def _this_checkouts_bench() -> None:
    import tether

    folder = str(BENCH_SRC / "tether")
    if folder in tether.__path__:
        tether.__path__.remove(folder)
    tether.__path__.insert(1, folder)
    paths = [str(BENCH_SRC), *filter(None, [os.environ.get("PYTHONPATH")])]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)


_this_checkouts_bench()

REDIS_URL = os.environ.get("TETHER_REDIS_URL", "redis://127.0.0.1:6379/0")
PG_DSN = os.environ.get("TETHER_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
#: τ²-bench's retail domain (data only, never part of this repository): next to the checkout
TAU_DATA = os.environ.get("TETHER_TAU_DATA") or str(
    Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tau2_retail"
)


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
def table(pg_dsn: str, request: pytest.FixtureRequest) -> Iterator[Callable[[], str]]:
    """Fresh PostgreSQL table names of this test (named after its module), dropped after it."""
    import psycopg

    prefix = request.module.__name__.rpartition(".")[2].removeprefix("test_")
    made: list[str] = []

    def fresh() -> str:
        made.append(f"{prefix}_{uuid.uuid4().hex[:12]}")
        return made[-1]

    yield fresh
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for name in made:
            conn.execute(f"DROP TABLE IF EXISTS {name}")


@pytest.fixture(scope="session")
def tau_data() -> str:
    """The τ²-bench retail folder; fails (never skips) when it is missing."""
    missing = [
        n for n in ("db.json", "tasks.json", "policy.md") if not (Path(TAU_DATA) / n).is_file()
    ]
    if missing:
        pytest.fail(
            f"the τ²-bench retail folder is missing at TETHER_TAU_DATA={TAU_DATA!r} (no "
            f"{', '.join(missing)}); point TETHER_TAU_DATA at tau2-bench's data/tau2/domains/retail",
            pytrace=False,
        )
    return TAU_DATA


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


class RedisCluster:
    """A 3-node Redis Cluster on free loopback ports, started with this machine's
    redis-server (AOF on: the ledger refuses a server that forgets), for the tests."""

    def __init__(self, root: Any) -> None:
        import shutil
        import socket
        import subprocess

        server = shutil.which("redis-server")
        if server is None:
            pytest.fail(
                "redis-server is not installed: the Redis Cluster tests need it", pytrace=False
            )
        import random

        def free(port: int) -> bool:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    return False
            return True

        # a node also listens on its port + 10000 (the cluster bus): stay well below 55535
        self.ports = []
        while len(self.ports) < 3:
            port = random.randrange(20_000, 30_000)
            if port not in self.ports and free(port) and free(port + 10_000):
                self.ports.append(port)
        self.root = root
        self.procs: dict[int, Any] = {}
        try:
            for port in self.ports:
                self.start(port)
            nodes = [f"127.0.0.1:{p}" for p in self.ports]
            subprocess.run(["redis-cli", "--cluster", "create", *nodes, "--cluster-replicas", "0",
                            "--cluster-yes"], check=True, capture_output=True, timeout=60)  # fmt: skip
            self.wait_ok()
        except BaseException:
            self.stop()
            raise

    def start(self, port: int) -> None:
        import shutil
        import subprocess

        node = self.root / str(port)
        node.mkdir(exist_ok=True)
        self.procs[port] = subprocess.Popen(
            [str(shutil.which("redis-server")), "--port", str(port), "--bind", "127.0.0.1",
             "--cluster-enabled", "yes", "--cluster-config-file", str(node / "nodes.conf"),
             "--dir", str(node), "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--cluster-node-timeout", "2000"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        self.wait_port(port)

    def wait_port(self, port: int) -> None:
        import socket
        import time

        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        pytest.fail(f"a Redis Cluster node did not start on port {port}", pytrace=False)

    def wait_ok(self) -> None:
        import time

        import redis

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                states = []
                for port in self.ports:
                    with redis.Redis(port=port) as node:
                        info = node.cluster("info")
                    states.append(
                        info.get("cluster_state") if isinstance(info, dict) else str(info)
                    )
                if all(str(state).endswith("ok") for state in states):
                    return
            except Exception:
                pass
            time.sleep(0.1)
        pytest.fail("the test Redis Cluster did not reach cluster_state:ok", pytrace=False)

    def client(self, **kw: Any) -> Any:
        from redis.cluster import RedisCluster as Client

        return Client(host="127.0.0.1", port=self.ports[0], **kw)

    def kill(self, port: int) -> None:
        proc = self.procs.pop(port)
        proc.kill()
        proc.wait(timeout=10)

    def stop(self) -> None:
        for port in list(self.procs):
            self.kill(port)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster"))
    yield cluster
    cluster.stop()
