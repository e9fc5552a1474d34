"""Redis Cluster: a node killed and restarted mid-run. The store falls back to this
process's memory and recovers; the ledger raises a clear error and never executes an
effect twice. (The store and ledger suites also run on the cluster: test_fleet.py and
test_ledger.py, parametrised.)"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import pytest

import tether
from tether import Ledger, StoreUnavailable
from tether.stores.redis._store import RedisStore


def node_of(cluster: Any, client: Any, key: str) -> int:
    return int(client.get_node_from_key(key).port)


def quick_client(cluster: Any) -> Any:
    """A cluster client that gives up quickly on a dead node (one retry, short timeouts)."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return cluster.client(
        socket_timeout=0.5, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 1)
    )


def restart(cluster: Any, port: int) -> None:
    cluster.start(port)
    cluster.wait_ok()


def test_the_store_falls_back_when_a_node_dies_and_recovers_when_it_returns(
    redis_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    client = quick_client(redis_cluster)
    store = RedisStore(client=client, prefix=f"t-{uuid.uuid4().hex[:8]}", cache_ttl=0.0,
                       server_time=False, reconnect_interval=0.2)  # fmt: skip
    breaker = tether.CircuitBreaker("payments", failure_threshold=3, store=store)
    try:
        assert breaker.call(lambda: "ok") == "ok"
        port = node_of(redis_cluster, client, store._key("breaker", "payments"))
        redis_cluster.kill(port)
        with caplog.at_level(logging.WARNING, logger="tether"):
            # the node is gone: calls still go through, on this process's memory
            assert [breaker.call(lambda: "ok") for _ in range(3)] == ["ok"] * 3
            assert any("unavailable" in r.getMessage() for r in caplog.records)
            restart(redis_cluster, port)
            client.nodes_manager.initialize()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                time.sleep(0.25)
                breaker.call(lambda: "ok")
                if any("answers again" in r.getMessage() for r in caplog.records):
                    break
            assert any("answers again" in r.getMessage() for r in caplog.records)
        assert store.breaker_state("payments", time.time())[0] == "closed"
    finally:
        if port not in redis_cluster.procs:
            restart(redis_cluster, port)
        store.reset()
        client.close()


def test_the_ledger_refuses_clearly_and_never_pays_twice_across_a_node_restart(
    redis_cluster: Any,
) -> None:
    client = quick_client(redis_cluster)
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    ledger = Ledger.redis(client=client, prefix=prefix, lease=1.0)
    paid: list[str] = []

    def refund() -> dict[str, str]:
        paid.append("A-1")
        return {"id": "re_1"}

    key = "refund-A-1"
    port = node_of(redis_cluster, client, ledger.backend._key(key))  # type: ignore[attr-defined]
    try:
        redis_cluster.kill(port)
        with pytest.raises(StoreUnavailable, match="did not answer"):
            ledger.once(key, refund)
        assert paid == []  # nothing runs without a claim
        restart(redis_cluster, port)
        client.nodes_manager.initialize()
        assert ledger.once(key, refund) == {"id": "re_1"}

        # the node dies and comes back (its AOF keeps the record): the refund is replayed
        redis_cluster.kill(port)
        restart(redis_cluster, port)
        client.nodes_manager.initialize()
        assert ledger.once(key, refund) == {"id": "re_1"}
        assert paid == ["A-1"]

        # the node dies while the next refund runs: it is never run again
        def slow_refund() -> dict[str, str]:
            paid.append("B-2")
            redis_cluster.kill(port_b)
            return {"id": "re_2"}

        key_b = "refund-B-2"
        port_b = node_of(redis_cluster, client, ledger.backend._key(key_b))  # type: ignore[attr-defined]
        with pytest.raises(tether.UnknownOutcome):
            ledger.once(key_b, slow_refund)
        restart(redis_cluster, port_b)
        client.nodes_manager.initialize()
        with pytest.raises((tether.UnknownOutcome, tether.EffectInProgress)):
            ledger.once(key_b, slow_refund)
        assert paid == ["A-1", "B-2"]
    finally:
        for p in (port,):
            if p not in redis_cluster.procs:
                restart(redis_cluster, p)
        for k in client.scan_iter(match=f"{prefix}:*"):
            client.delete(k)
        client.close()


def test_a_cluster_url_builds_a_cluster_client(redis_cluster: Any) -> None:
    """``redis+cluster://`` names a cluster for the store (sync and asyncio) and the ledger."""
    import asyncio

    url = f"redis+cluster://127.0.0.1:{redis_cluster.ports[1]}"
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    store = RedisStore(url, prefix=prefix, cache_ttl=0.0)
    ledger = Ledger.redis(url, prefix=prefix)
    try:
        assert type(store.client).__name__ == "RedisCluster"
        breaker = tether.CircuitBreaker("search", store=store)
        assert breaker.call(lambda: 1) == 1

        async def go() -> int:
            result: int = await breaker.acall(asyncio.sleep, 0, 2)
            await store.aclose()
            return result

        assert asyncio.run(go()) == 2
        assert (
            ledger.once("k", lambda: "done") == "done"
            and ledger.once("k", lambda: "again") == "done"
        )
        with pytest.raises(ConnectionError):
            breaker.call(lambda: (_ for _ in ()).throw(ConnectionError("down")))
        assert store.breaker_names() == ["search"]  # a failure is written; a success is not
    finally:
        store.reset()
        store.close()
        for k in ledger.backend.client.scan_iter(match=f"{prefix}:*"):  # type: ignore[attr-defined]
            ledger.backend.client.delete(k)  # type: ignore[attr-defined]
        ledger.close()


def test_the_ledger_says_it_needs_a_sync_client() -> None:
    import redis.asyncio

    client = redis.asyncio.Redis()
    with pytest.raises(TypeError, match="sync client"):
        Ledger.redis(client=client)
