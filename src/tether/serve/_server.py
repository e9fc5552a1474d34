"""The operator page under uvicorn, with its limits set.

uvicorn's own settings bound what they can: ``limit_concurrency`` (connections and tasks;
past it a request gets 503), ``timeout_keep_alive`` (an idle connection between requests),
``h11_max_incomplete_event_size`` (the request line and headers). Two things uvicorn does
not have, :class:`HeaderDeadline` adds to its h11 protocol:

* a deadline for a request's head (a client that connects and sends nothing, or one byte
  at a time, would hold its connection forever; uvicorn issue #157): a connection that has
  not sent a whole request head within ``header_timeout`` seconds of connecting (or of its
  last response) is closed;
* room for a request at the limit: uvicorn counts every open connection against
  ``limit_concurrency``, those that never sent a request too, so 64 half-open connections
  would make every request of the operator's get 503 until the deadline, and again when
  they reconnect. A connection that arrives at the limit closes the one that has waited
  longest for a request head instead (never one whose request is being served).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["HEADER_TIMEOUT", "LIMIT_CONCURRENCY", "HeaderDeadline", "server_config"]

#: seconds a connection has to send a whole request head
HEADER_TIMEOUT = 10.0
#: connections (and requests in progress) served at once; more get 503
LIMIT_CONCURRENCY = 64
#: bytes of request line and headers
MAX_HEAD_BYTES = 16 * 1024
#: seconds an idle keep-alive connection stays open
KEEP_ALIVE = 5


class HeaderDeadline(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request head is late, and at the
    connection limit the one that has waited longest for a request head."""

    header_timeout = HEADER_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_deadline: asyncio.TimerHandle | None = None
        #: loop time since when this connection waits for a request head (None: it has one)
        self._waiting_since: float | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch_head()
        self._make_room()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _watch_head(self) -> None:
        """Armed while the connection waits for a request head, disarmed once it has one."""
        waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
        if waiting and self._head_deadline is None:
            self._head_deadline = self.loop.call_later(self.header_timeout, self._late)
            self._waiting_since = self.loop.time()
        elif not waiting:
            self._disarm()

    def _disarm(self) -> None:
        self._waiting_since = None
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _make_room(self) -> None:
        """At the connection limit, close the connections that have waited longest for a
        request head, so that this one's request is served (uvicorn answers 503 to a
        request while ``limit_concurrency`` connections are open)."""
        if self.limit_concurrency is None:
            return
        live = [c for c in self.connections if not c.transport.is_closing()]
        excess = len(live) - (self.limit_concurrency - 1)
        if excess <= 0:
            return
        idle = [
            c
            for c in live
            if c is not self and isinstance(c, HeaderDeadline) and c._waiting_since is not None
        ]
        idle.sort(key=lambda c: c._waiting_since or 0.0)
        for connection in idle[:excess]:
            self.logger.info(
                "tether serve: at %d connections, closed the one that waited longest "
                "for a request head",
                self.limit_concurrency,
            )
            connection._disarm()
            connection.transport.close()

    def _late(self) -> None:
        self._head_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.logger.info("tether serve: closed a connection that sent no request head in time")
            self.transport.close()


def server_config(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    header_timeout: float = HEADER_TIMEOUT,
    limit_concurrency: int = LIMIT_CONCURRENCY,
    log_level: str = "warning",
) -> uvicorn.Config:
    """uvicorn's configuration for the page: its limits and the header deadline."""
    if not header_timeout > 0:
        raise ValueError(f"header_timeout must be > 0 seconds, got {header_timeout!r}")
    if limit_concurrency < 1:
        raise ValueError(f"limit_concurrency must be >= 1, got {limit_concurrency!r}")
    protocol = type("HeaderDeadline", (HeaderDeadline,), {"header_timeout": float(header_timeout)})
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol,
        limit_concurrency=limit_concurrency,
        timeout_keep_alive=KEEP_ALIVE,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        timeout_graceful_shutdown=5,
        server_header=False,
        log_level=log_level,
    )
