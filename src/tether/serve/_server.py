"""The operator page under uvicorn, with its limits set.

uvicorn's own settings bound what they can: ``limit_concurrency`` (connections and tasks;
past it a request gets 503), ``timeout_keep_alive`` (an idle connection between requests),
``h11_max_incomplete_event_size`` (the request line and headers). uvicorn has no deadline
for a request's headers (a client that connects and sends nothing, or one byte at a time,
holds its connection forever; uvicorn issue #157), so :class:`HeaderDeadline` adds one to
its h11 protocol: a connection that has not sent a whole request head within
``header_timeout`` seconds of connecting (or of its last response) is closed.
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
    """uvicorn's h11 protocol, closing a connection whose request head is late."""

    header_timeout = HEADER_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch_head()

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
        elif not waiting:
            self._disarm()

    def _disarm(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

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
