"""A loopback TCP relay that counts round trips: the client speaks, the server answers.

Put between a client and its server (PostgreSQL, Redis), it counts each time the client
starts sending after the server last spoke: one request and its answer, whatever the
driver does above the socket (a pool's connection check counts, a pipelined batch counts
once). Used by the overhead suite and the tests that count a ledger's round trips.
"""

from __future__ import annotations

import asyncio
import math
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = ["Relay", "serve_until"]


class Relay:
    """Listens on 127.0.0.1 and relays each connection to ``host:port``.

    ``round_trips`` counts the requests of every connection (client bytes after server
    bytes, or the first client bytes). ``url(original)`` is ``original`` pointed at the
    relay. ``drop()`` cuts every open connection, as a server that restarts does.
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.round_trips = 0
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="tether-relay").start()

    @classmethod
    def to(cls, url: str) -> Relay:
        """A relay to the server of ``url`` (postgresql://, redis://)."""
        parts = urlsplit(url)
        default = 6379 if parts.scheme.startswith("redis") else 5432
        return cls(parts.hostname or "127.0.0.1", parts.port or default)

    def url(self, original: str) -> str:
        """``original`` with its host and port replaced by the relay's."""
        parts = urlsplit(original)
        auth = parts.netloc.rpartition("@")[0]
        netloc = f"{auth}@127.0.0.1:{self.port}" if auth else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self._closed:  # accepted while closing: refuse it, as a dead server would
                client.close()
                return
            upstream = socket.create_connection(self.target)
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._open += [client, upstream]
            state = {"last": "server"}
            for src, dst, side in ((client, upstream, "client"), (upstream, client, "server")):
                threading.Thread(
                    target=self._pump,
                    args=(src, dst, side, state),
                    daemon=True,
                    name="tether-relay-pump",
                ).start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, side: str, state: dict[str, Any]
    ) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                with self._lock:
                    if side == "client" and state["last"] == "server":
                        self.round_trips += 1
                    state["last"] = side
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def drop(self) -> None:
        """Cut every open connection (both sides), as a restarting server does."""
        with self._lock:
            opened, self._open = self._open, []
        for s in opened:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._closed = True
        try:  # wakes the thread blocked in accept(): close() alone does not on Linux
            self._server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._server.close()
        self.drop()

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def serve_until(handle: Any, port_q: Any, stop: Any, until: float = math.inf) -> None:
    """Serve ``handle`` on a loopback port (put on ``port_q``) until ``stop`` is set or the
    clock passes ``until``."""
    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    port_q.put(server.sockets[0].getsockname()[1])
    while not stop.is_set() and time.time() < until:
        await asyncio.sleep(0.1)
    server.close()
