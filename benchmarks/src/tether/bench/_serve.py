"""The ``serve`` suite: how fast the operator page answers over many runs (real time).

Each size is a records database filled by real guarded runs (``Guard(records=...)``: the
runs a user's agent files, spread over 30 days: successes, escalations, permanent
failures with dead letters, repeated actions, calls waiting for approval); the page runs
under uvicorn with the limits ``tether serve`` sets, and each page is fetched over HTTP
on loopback. Then, over the largest database, a run with a 5 MB result is opened again
and again while ``/runs`` is timed beside it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["fill", "run_serve"]

SIZES = (1_000, 10_000, 100_000)
SAMPLES = 15


def fill(records: Any, n: int, *, now: float | None = None, days: float = 30.0) -> None:
    """``n`` real guarded runs filed in ``records``, ending over the ``days`` before ``now``."""
    import tether

    now = time.time() if now is None else now
    clock = tether.VirtualClock(wall_start=now - days * 86_400)
    guard = tether.Guard(records=records, clock=clock, retry=tether.RetryPolicy(max_attempts=1))
    step = days * 86_400 / max(1, n)

    def declined(order: str, amount: int) -> None:
        raise PermissionError("card declined")

    for i in range(n):
        clock.advance(step)
        order = f"A-{i}"
        with guard.start(task=f"refund order {order} for customer c_{i % 997}") as run:
            run.proceed()
            run.record_model_call(
                model="claude-sonnet-4-6", input_tokens=1200 + i % 500, output_tokens=80
            )
            run.call_tool(
                "lookup_order", lambda order: {"order": order, "total": 90}, {"order": order}
            )
            kind = i % 10
            if kind == 0:
                run.escalate("the customer asked for a person")
            elif kind == 1:
                with contextlib.suppress(tether.ToolError):
                    run.call_tool(
                        "charge_card", declined, {"order": order, "amount": 90}, idempotent=False
                    )
                run.fail("the card was declined")
            elif kind == 2:
                for _ in range(3):  # the third identical call stops the run (REPEATED_ACTION)
                    run.call_tool("search", lambda q: None, {"q": "the same thing"})
            elif i % 50 == 3:  # stops AWAITING_APPROVAL
                refund = {"order": order, "amount": 9000}
                run.call_tool(
                    "issue_refund", _refund, refund, idempotent=False, requires_approval=True
                )
            else:
                run.succeed({"order": order})


def _refund(order: str, amount: int) -> dict[str, str]:
    return {"id": f"re_{order}"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _serving(where: str) -> Iterator[str]:
    """``tether serve --db where`` in a process of its own (as operators run it)."""
    import subprocess
    import sys

    import httpx

    port = _free_port()
    command = [sys.executable, "-m", "tether.cli", "serve", "--db", where, "--port", str(port)]
    base = f"http://127.0.0.1:{port}"
    with (
        tempfile.TemporaryFile() as errors,
        subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors) as server,
    ):
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(base + "/runs", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    errors.seek(0)
                    raise RuntimeError(
                        f"tether serve did not start: {errors.read().decode()[-500:]}"
                    )
                time.sleep(0.1)
            yield base
        finally:
            server.terminate()
            server.wait(20)


def _timed(get: Callable[[str], Any], path: str, samples: int) -> dict[str, float]:
    get(path)  # warm
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        response = get(path)
        times.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            raise RuntimeError(f"{path} answered {response.status_code}")
    times.sort()
    return {"p50_ms": round(statistics.median(times), 1), "max_ms": round(times[-1], 1)}


def _pages(records: Any) -> dict[str, str]:
    page = records.runs.search(limit=50)
    last = max(1, -(-page.total // 50))
    return {
        "/runs": "/runs",
        "/runs last page": f"/runs?page={last}",
        "/runs?status=escalated": "/runs?status=escalated",
        "/runs?tool=charge_card": "/runs?tool=charge_card",
        "/runs?q=customer c_42": "/runs?q=customer+c_42",
        "/overview": "/overview",
        "/inbox": "/inbox",
    }


def _big_run(records: Any, size: int) -> str:
    import tether

    guard = tether.Guard(records=records)
    blob = ("invoice line 42: refunded 90.00 EUR to card ending 4242\n" * (size // 55 + 1))[:size]
    with guard.start(task="export every invoice (a 5 MB result)") as run:
        run.call_tool("export", lambda: blob, {})
        run.succeed("exported")
    return run.run_id


def _while_big(base: str, big: str, samples: int) -> dict[str, float]:
    """/runs timed while another client opens the 5 MB run again and again."""
    import httpx

    stop, fetched = threading.Event(), threading.Event()
    big_times: list[float] = []
    failed: list[BaseException] = []

    def hammer() -> None:
        try:
            with httpx.Client(base_url=base, timeout=60) as c:
                while not stop.is_set():
                    started = time.perf_counter()
                    if c.get(f"/runs/{big}").status_code != 200:
                        raise RuntimeError(f"/runs/{big} did not answer 200")
                    big_times.append((time.perf_counter() - started) * 1000)
                    fetched.set()
        except BaseException as exc:  # said by the caller, not lost with the thread
            failed.append(exc)
            fetched.set()

    worker = threading.Thread(target=hammer, daemon=True)
    worker.start()
    fetched.wait(60)  # one whole fetch first: /runs is then timed beside the next ones
    try:
        with httpx.Client(base_url=base, timeout=60) as c:
            timed = _timed(c.get, "/runs", samples * 4)
    finally:
        stop.set()
        worker.join(60)
    if failed:
        raise RuntimeError(f"the big run's page failed while /runs was timed: {failed[0]!r}")
    return {
        "runs_p50_ms": timed["p50_ms"],
        "runs_max_ms": timed["max_ms"],
        "big_page_p50_ms": round(statistics.median(big_times), 1) if big_times else 0.0,
    }


def run_serve(
    sizes: Sequence[int] = SIZES,
    *,
    pg_dsn: str | None = None,
    samples: int = SAMPLES,
    big: int = 5_000_000,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Page timings (median and max of ``samples`` requests) per database and size."""
    from tether.records._records import Records

    out: dict[str, Any] = {}
    backends: list[tuple[str, Callable[[int], Any]]] = []
    folder = tempfile.mkdtemp(prefix="tether-bench-serve-")
    backends.append(("sqlite", lambda n: Records.sqlite(os.path.join(folder, f"records-{n}.db"))))
    if pg_dsn:
        backends.append(("postgres", lambda n: Records.postgres(_schema(pg_dsn))))
    try:
        for name, make in backends:
            out[name] = _backend(name, make, sizes, samples, big, progress)
    finally:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    return out


def _backend(
    name: str,
    make: Callable[[int], Any],
    sizes: Sequence[int],
    samples: int,
    big: int,
    progress: Callable[[str], None] | None,
) -> dict[str, Any]:
    """One database's cells, by size."""
    import httpx

    cells: dict[str, Any] = {}
    for n in sizes:
        records = make(n)
        try:
            started = time.perf_counter()
            fill(records, n)
            filled = time.perf_counter() - started
            if progress:
                progress(f"serve {name} {n} runs filed in {filled:.0f} s")
            with _serving(where(records)) as base, httpx.Client(base_url=base, timeout=60) as c:
                cell: dict[str, Any] = {
                    p: _timed(c.get, path, samples) for p, path in _pages(records).items()
                }
                if n == max(sizes):
                    cell[f"while a {big / 1e6:g} MB run renders"] = _while_big(
                        base, _big_run(records, big), samples
                    )
            cell["fill_s"] = round(filled, 1)
            cells[str(n)] = cell
        finally:
            _drop(records)
    return cells


def where(records: Any) -> str:
    """What ``tether serve --db`` takes for these records."""
    store = records.store
    if getattr(store, "dialect", "") == "postgres":
        return str(store.dsn)
    return str(store.path)


def _schema(dsn: str) -> str:
    """A DSN whose tables live in a new schema of their own (dropped afterwards)."""
    import uuid

    import psycopg

    schema = f"tether_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return dsn + ("&" if "?" in dsn else "?") + f"options=-csearch_path%3D{schema}"


def _drop(records: Any) -> None:
    """The benchmark's own database goes (its PostgreSQL schema, its SQLite file)."""
    store = records.store
    dsn = getattr(store, "dsn", None)
    path = getattr(store, "path", None)
    records.close()
    if dsn and "search_path%3Dtether_bench_" in dsn:
        import psycopg

        schema = dsn.rsplit("search_path%3D", 1)[1]
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
    if path and os.path.exists(path):
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path + suffix)
