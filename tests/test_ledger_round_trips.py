"""A new key's cost on each ledger backend, counted where it is paid: on the wire, at the driver.

PostgreSQL and Redis are counted by a loopback relay between the client and the server
(every request the client sends after the server last spoke), so a pool's probe or a
driver's extra statement counts too; SQLite by its own trace callback on the backend's
connection.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tether
from tether import StoreUnavailable
from tether.bench._wire import Relay


@pytest.fixture
def relayed_pg(pg_dsn: str) -> Iterator[tuple[tether.Ledger, Relay, str]]:
    """A PostgreSQL ledger whose every connection goes through a counting relay."""
    table = f"ledger_rt_{uuid.uuid4().hex[:8]}"
    relay = Relay.to(pg_dsn)
    ledger = tether.Ledger.postgres(relay.url(pg_dsn), table=table)
    yield ledger, relay, table
    import psycopg

    ledger.close()
    relay.close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")


def new_keys(ledger: tether.Ledger, count: int) -> list[Any]:
    return [ledger.once(f"k-{uuid.uuid4().hex}", lambda i=i: {"n": i}) for i in range(count)]


def test_postgres_new_key_is_two_round_trips(relayed_pg: tuple[tether.Ledger, Relay, str]) -> None:
    """Claim and result: two round trips on the wire per new key, no probe per checkout."""
    ledger, relay, _ = relayed_pg
    new_keys(ledger, 6)  # psycopg prepares a statement on its 5th use: one extra trip, once
    before, counted = relay.round_trips, ledger.backend.round_trips  # type: ignore[attr-defined]
    assert new_keys(ledger, 20) == [{"n": i} for i in range(20)]
    assert relay.round_trips - before == 40
    assert ledger.backend.round_trips - counted == 40  # type: ignore[attr-defined]


def test_postgres_survives_a_server_side_kill_between_calls(
    relayed_pg: tuple[tether.Ledger, Relay, str], pg_dsn: str
) -> None:
    """The server kills the ledger's idle connections (pg_terminate_backend): the next calls
    work, on fresh connections, and every effect runs once."""
    import psycopg

    ledger, _, table = relayed_pg
    assert new_keys(ledger, 2) == [{"n": 0}, {"n": 1}]
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE %s",
            (f"%{table}%",),
        ).fetchone()
    assert killed is not None and killed[0] >= 1
    runs: list[int] = []
    for i in range(3):
        assert ledger.once(f"after-kill-{i}", lambda i=i: runs.append(i) or i) == i
    assert runs == [0, 1, 2]
    assert ledger.backend.reconnects >= 1  # type: ignore[attr-defined]
    assert ledger.once("after-kill-0", lambda: runs.append(99)) == 0  # recorded: not run again
    assert runs == [0, 1, 2]


def test_postgres_survives_a_cut_connection_between_calls(
    relayed_pg: tuple[tether.Ledger, Relay, str],
) -> None:
    """Every TCP connection cut between two calls (a restart, a proxy): the next call works."""
    ledger, relay, _ = relayed_pg
    new_keys(ledger, 2)
    relay.drop()
    assert ledger.once("after-cut", lambda: "ran") == "ran"


def test_postgres_away_is_store_unavailable_and_nothing_runs(
    relayed_pg: tuple[tether.Ledger, Relay, str],
) -> None:
    """The server gone for good: StoreUnavailable, and the effect never ran (one retry, no loop)."""
    ledger, relay, _ = relayed_pg
    new_keys(ledger, 1)
    relay.close()
    ran: list[str] = []
    with pytest.raises(StoreUnavailable):
        ledger.once("while-away", lambda: ran.append("x"))
    assert ran == []


def test_redis_new_key_is_two_round_trips(redis_url: str) -> None:
    """Two scripts, two round trips on the wire per new key."""
    prefix = f"rt-{uuid.uuid4().hex[:8]}"
    with Relay.to(redis_url) as relay:
        ledger = tether.Ledger.redis(relay.url(redis_url), prefix=prefix, allow_lost_records=True)
        new_keys(ledger, 2)
        before = relay.round_trips
        assert new_keys(ledger, 10) == [{"n": i} for i in range(10)]
        assert relay.round_trips - before == 20
        client: Any = ledger.backend.client  # type: ignore[attr-defined]
        for key in client.scan_iter(match=f"{prefix}:*"):
            client.delete(key)
        ledger.close()


def test_sqlite_new_key_is_two_statements(tmp_path: Path) -> None:
    """A new key: one INSERT and one UPDATE, each its own transaction (no BEGIN, no SELECT)."""
    ledger = tether.Ledger.sqlite(os.fspath(tmp_path / "ledger.db"))
    sent: list[str] = []
    ledger.backend._db.set_trace_callback(sent.append)  # type: ignore[attr-defined]
    assert ledger.once("fresh", lambda: 1) == 1
    assert [s.split()[0] for s in sent] == ["INSERT", "UPDATE"]
    changes = ledger.backend._db.total_changes  # type: ignore[attr-defined]
    assert ledger.once("fresh", lambda: 2) == 1  # a replay writes nothing
    assert ledger.backend._db.total_changes == changes  # type: ignore[attr-defined]
    ledger.close()


def test_sqlite_existing_key_still_decides_under_a_lock(tmp_path: Path) -> None:
    """A key with a live claim by someone else takes the decided path, and is not claimed."""
    path = os.fspath(tmp_path / "ledger.db")
    first, second = tether.Ledger.sqlite(path), tether.Ledger.sqlite(path, wait=0)
    from tether.stores._ledger_logic import Record

    record = Record.claim_of("busy", None, "someone-else", 60.0, 3600.0)
    assert first.backend.claim(record, None) == (True, None)
    with pytest.raises(tether.EffectInProgress):
        second.once("busy", lambda: "never")
    first.close()
    second.close()
