"""The operator page's app: one :class:`Site` (records, stores, the gate), the areas that
serve its pages and actions (runs, inbox, overview, replays, breakers), and Starlette
routing to them behind ``TrustedHostMiddleware``."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import Route

from tether.records._records import Records
from tether.serve._breakers import BreakerPages
from tether.serve._inbox import Inbox
from tether.serve._overview import Overview
from tether.serve._replays import Replays
from tether.serve._runs import RunPages
from tether.serve._scopes import ScopePages
from tether.serve._site import STATIC, Site, secured

__all__ = ["App", "create_app"]


class App:
    """The operator page: the areas' pages and actions over one :class:`tether.Records`."""

    def __init__(self, records: Records, **settings: Any) -> None:
        #: what the areas share (``settings``: those of :class:`Site`)
        self.site = Site(records, **settings)
        site = self.site
        self.areas = (
            RunPages(site),
            Inbox(site),
            Overview(site),
            Replays(site),
            BreakerPages(site),
            ScopePages(site),
        )

    def routes(self) -> list[Route]:
        """Home (to /runs), the page's script and favicon, then every area's routes."""
        return [
            Route("/", _home),
            Route("/static/tether.js", _script),
            Route("/favicon.ico", lambda request: Response(status_code=204)),
            *(route for area in self.areas for route in area.routes()),
        ]


async def _home(request: Request) -> Response:
    return RedirectResponse("/runs", 303)


async def _script(request: Request) -> Response:
    return secured(FileResponse(STATIC / "tether.js", media_type="text/javascript"))


def create_app(
    records: Records | str,
    *,
    redis: Any = None,
    token: str | None = None,
    handler: Callable[..., Any] | None = None,
    allowed_hosts: Iterable[str] = (),
    refresh: float = 5.0,
) -> Starlette:
    """The operator page's ASGI app over ``records`` (a :class:`tether.Records`, a SQLite
    path or a PostgreSQL DSN); ``redis`` is a Redis URL or a ``RedisStore`` for the
    breakers page; ``handler`` replays dead letters; the inbox refreshes itself every
    ``refresh`` seconds.

    Only requests whose ``Host`` is a loopback name (``127.0.0.1``, ``localhost``,
    ``[::1]``) are served, plus, with a ``token``, the names in ``allowed_hosts`` (how the
    operators' browsers reach it, e.g. ``ops.example.com``); any other Host gets 400.
    """
    if isinstance(records, str):
        records = Records.open(records)
    if isinstance(redis, str):
        from tether.stores.redis._store import RedisStore

        redis = RedisStore(redis)
    app = App(
        records,
        redis=redis,
        token=token or None,
        handler=handler,
        allowed_hosts=allowed_hosts,
        refresh=refresh,
    )
    hosts = list(app.site.hosts)
    starlette = Starlette(
        routes=app.routes(),
        middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=hosts, www_redirect=False)],
    )
    starlette.state.tether = app
    return starlette
