"""A scripted HTTP server on loopback, for driving real SDKs in tests."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False  # close the connection without answering
    delay: float = 0.0  # seconds before answering
    raw: bytes | None = None  # a raw body (e.g. a server-sent event stream)
    content_type: str = "application/json"
    cut_after: int | None = None  # send this many bytes of the body, then drop the connection


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


class ScriptedServer:
    """Answers requests from a script: a list of replies, or a function of the request."""

    def __init__(self) -> None:
        self.script: list[Reply] = []
        self.handler: Callable[[Seen], Reply] | None = None
        self.default = Reply(500, {"error": {"type": "api_error", "message": "no script"}})
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                seen = Seen(
                    self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body
                )
                with server._lock:
                    server.requests.append(seen)
                    if server.handler is not None:
                        reply = server.handler(seen)
                    else:
                        reply = server.script.pop(0) if server.script else server.default
                if reply.delay:
                    time.sleep(reply.delay)
                if reply.drop:
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                payload = reply.raw if reply.raw is not None else json.dumps(reply.body).encode()
                self.send_response(reply.status)
                self.send_header("content-type", reply.content_type)
                self.send_header("content-length", str(len(payload)))
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                if reply.cut_after is not None:
                    self.wfile.write(payload[: reply.cut_after])
                    self.wfile.flush()
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                self.wfile.write(payload)

            do_GET = do_POST = do_DELETE = do_PUT = _serve

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> ScriptedServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def run_claude(shell: str, url: str, ask: dict[str, Any]) -> Any:
    """``tether.integrations.anthropic.run_agent`` ("sync") or ``arun_agent`` ("async")
    with the real Anthropic client against the server at ``url``; the Outcome."""
    import asyncio

    import anthropic

    from tether.integrations import anthropic as t_anthropic

    if shell == "sync":
        with anthropic.Anthropic(api_key="t", base_url=url) as raw:
            return t_anthropic.run_agent(raw, **ask)

    async def main() -> Any:
        async with anthropic.AsyncAnthropic(api_key="t", base_url=url) as raw:
            return await t_anthropic.arun_agent(raw, **ask)

    return asyncio.run(main())
