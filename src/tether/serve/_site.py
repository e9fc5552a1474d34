"""What every area of the operator page shares: the records and stores it shows, and the
gate each page and action passes (host name, token, CSRF, origin), with the rendering in
a worker thread.

Cookies are not kept apart by port: a page on ``localhost:3000`` is "same site" as this one
on ``localhost:8765``, its requests carry this page's cookies, and it can set cookies of its
own for ``localhost``. So nothing here trusts a cookie's value alone: an action must come
from this page's exact origin (scheme, host and port: its ``Origin``, or else its
``Referer``, equals the origin the request was sent to), and its CSRF token is an HMAC of
the CSRF cookie under a secret of this process, which another page can neither read nor
compute. The token cookie (with ``--token``) holds an HMAC of the token, never the token.

The host names are checked by Starlette's ``TrustedHostMiddleware`` over :attr:`Site.hosts`
(see :func:`tether.serve.create_app`); :meth:`Site.page` and :meth:`Site.action` wrap an
area's functions into Starlette endpoints.
"""

from __future__ import annotations

import abc
import datetime
import hashlib
import hmac
import ipaddress
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import jinja2
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from tether.records._approvals import ApprovalError
from tether.records._collections import RedactedArguments
from tether.records._records import DAY, Records
from tether.redaction._redact import masks_pii, redact
from tether.serve._values import preview

__all__ = [
    "LOOPBACK_NAMES",
    "STATIC",
    "Area",
    "Site",
    "host_name",
    "is_loopback",
    "query_date",
    "query_number",
    "secured",
    "when",
]

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"
CSRF_COOKIE, TOKEN_COOKIE = "tether_csrf", "tether_token"
#: the host names served without a token (a browser on this machine)
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_HOST_NAME = re.compile(
    r"(?i)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*"
)

Handler = Callable[[Request], Awaitable[Response]]
#: a page's function: the template and its context (template "" and context["response"]:
#: that response as it is)
PageFn = Callable[[Request], tuple[str, dict[str, Any]]]
#: an action's function: given the request and its form, where to go next
ActionFn = Callable[[Request, dict[str, str]], str]


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(name: str) -> str:
    """``name`` as a ``Host`` header carries it (lower case, an IPv6 address in brackets);
    a ValueError for anything that is not a plain host name or IP address."""
    bare = name.strip().lower()
    if bare.startswith("[") and bare.endswith("]"):
        bare = bare[1:-1]
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        if not _HOST_NAME.fullmatch(bare) or len(bare) > 253:
            raise ValueError(
                f"an allowed host must be a host name or an IP address, without scheme, "
                f"port or wildcard (e.g. ops.example.com), got {name!r}"
            ) from None
        return bare
    return f"[{address}]" if address.version == 6 else str(address)


def when(value: Any) -> str:
    """Epoch seconds as a UTC date and time ("" for none)."""
    if not value:
        return ""
    return datetime.datetime.fromtimestamp(float(value), tz=datetime.UTC).strftime(
        "%Y-%m-%d %H:%M:%S UTC"
    )


def query_date(request: Request, name: str, *, end: bool = False) -> float | None:
    """A ``YYYY-MM-DD`` query parameter as epoch seconds (UTC; ``end``: the day after)."""
    text = request.query_params.get(name) or ""
    if not text:
        return None
    try:
        day = datetime.datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=datetime.UTC)
    except ValueError:
        raise ValueError(f"{name} must be a date like 2026-01-31, got {text[:40]!r}") from None
    return day.timestamp() + (DAY if end else 0.0)


def query_number(request: Request, name: str, default: int, low: int, high: int) -> int:
    """A whole-number query parameter from ``low`` to ``high`` (``default`` when absent)."""
    text = request.query_params.get(name) or ""
    if not text:
        return default
    if not text.isdigit() or not low <= int(text) <= high:
        raise ValueError(f"{name} must be a whole number from {low} to {high}, got {text[:20]!r}")
    return int(text)


def _shown(value: Any) -> Any:
    """Every value a page shows, redacted once more (records are redacted when written;
    this catches anything a store holds from before, or a pattern added since). Markup is
    what this page drew itself (a chart), from values redacted already."""
    if isinstance(value, Markup):
        return value
    return redact(value, pii=masks_pii()) if isinstance(value, str) else value


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        finalize=_shown,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["money"] = lambda v: f"${float(v or 0):.4f}"
    env.filters["secs"] = lambda v: f"{float(v or 0):.1f} s"
    env.filters["preview"] = preview
    env.filters["when"] = when
    env.filters["kb"] = lambda n: (
        f"{int(n) / 1024:,.0f} KB" if n >= 1024 else f"{int(n)} characters"
    )
    return env


class Site:
    """The records, stores and settings the areas share, and the gate of their endpoints."""

    def __init__(
        self,
        records: Records,
        *,
        redis: Any = None,
        token: str | None = None,
        handler: Callable[..., Any] | None = None,
        clock: Callable[[], float] | None = None,
        allowed_hosts: Iterable[str] = (),
        refresh: float = 5.0,
    ) -> None:
        self.records = records
        self.redis = redis
        self.token = token
        self.handler = handler
        self.clock = clock or time.time
        self.env = _environment()
        #: the key of the CSRF tokens and the token cookie: this process's own, never sent
        self._secret = secrets.token_bytes(32)
        extra = [host_name(h) for h in allowed_hosts]
        if extra and token is None:
            raise ValueError(
                "allowed_hosts needs a token: without one only the loopback names "
                f"({', '.join(LOOPBACK_NAMES)}) are served"
            )
        #: the Host names served (as a Host header carries them)
        self.hosts = tuple(dict.fromkeys([*LOOPBACK_NAMES, *extra]))
        if not refresh > 0:
            raise ValueError(f"refresh must be > 0 seconds, got {refresh!r}")
        #: seconds between the inbox's refreshes
        self.refresh = float(refresh)

    def _mac(self, purpose: str, value: str) -> str:
        """HMAC-SHA256 of ``value`` for ``purpose`` under this process's secret."""
        message = f"{purpose}\0{value}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def csrf_token(self, cookie: str) -> str:
        """The form token that goes with the CSRF cookie ``cookie``."""
        return self._mac("csrf", cookie)

    def _token_cookie(self) -> str:
        """What the token cookie holds: an HMAC of the token (the token itself never
        travels in a cookie, which every port of the host name receives)."""
        assert self.token is not None
        return self._mac("token", self.token)

    def _token_ok(self, request: Request) -> bool:
        if self.token is None:
            return True
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return hmac.compare_digest(auth[7:].strip().encode(), self.token.encode())
        given = request.cookies.get(TOKEN_COOKIE, "")
        return hmac.compare_digest(given.encode(), self._token_cookie().encode())

    def _foreign(self, request: Request) -> str | None:
        """Why a state-changing request does not come from this page (None: it does).

        Its ``Origin`` (or, when a browser sent none, its ``Referer``) must be exactly the
        origin the request was sent to: the same scheme, host name and port. The ``Host``
        it was sent to is one of the served names (``TrustedHostMiddleware``), and a browser
        sets ``Host``, ``Origin`` and ``Referer`` itself, so a page on another port or
        another name of this host never matches. A request with neither header is refused.
        """
        ours = _origin_of(f"{request.url.scheme}://{request.headers.get('host', '')}")
        if ours is None or ours[1] not in self.hosts:
            return "This action was not sent to a served address."
        origin = request.headers.get("origin")
        if origin is None:
            referer = request.headers.get("referer")
            if referer is None:
                return "This action carries neither Origin nor Referer: it is not from this page."
            origin = referer
        if _origin_of(origin) != ours:
            return "This action came from another site (or another port of this host)."
        return None

    def page(self, fn: PageFn) -> Handler:
        """A GET page: the token checked, a CSRF cookie set; ``fn`` (it reads the database)
        and the rendering run in a worker thread."""

        async def endpoint(request: Request) -> Response:
            query_token = request.query_params.get("token")
            if self.token is not None and query_token is not None:
                if not hmac.compare_digest(query_token.encode(), self.token.encode()):
                    return self.refuse(401, "The token is wrong.")
                response: Response = RedirectResponse(_without_token(request), 303)
                _cookie(response, request, TOKEN_COOKIE, self._token_cookie())
                return response
            if not self._token_ok(request):
                return self.refuse(401, "This page needs the token: open it with ?token=... once.")
            cookie = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)
            csrf = Markup(self.csrf_token(cookie))  # hex: nothing to escape or redact
            try:
                result = await run_in_threadpool(self._render_page, fn, request, csrf)
            except LookupError as exc:
                return self.refuse(404, str(exc.args[0] if exc.args else exc))
            except ValueError as exc:
                return self.refuse(400, str(exc.args[0] if exc.args else exc))
            response = secured(result if isinstance(result, Response) else HTMLResponse(result))
            _cookie(response, request, CSRF_COOKIE, cookie)
            return response

        return endpoint

    def _render_page(self, fn: PageFn, request: Request, csrf: Markup) -> str | Response:
        template, context = fn(request)
        if template == "":
            response: Response = context["response"]
            return response
        return self.env.get_template(template).render(
            csrf=csrf, path=request.url.path, redis=self.redis is not None, **context
        )

    def action(self, fn: ActionFn) -> Handler:
        """A POST action: token, exact origin and CSRF token checked; ``fn`` runs in a
        worker thread; then a redirect."""

        async def endpoint(request: Request) -> Response:
            if not self._token_ok(request):
                return self.refuse(401, "This action needs the token.")
            foreign = self._foreign(request)
            if foreign is not None:
                return self.refuse(403, foreign)
            form = {k: str(v) for k, v in (await request.form()).items()}
            cookie = request.cookies.get(CSRF_COOKIE, "")
            if not cookie or not hmac.compare_digest(
                form.get("csrf", "").encode(), self.csrf_token(cookie).encode()
            ):
                return self.refuse(
                    403, "The form is stale or forged (CSRF check): reload the page and try again."
                )
            try:
                back = await run_in_threadpool(fn, request, form)
            except (LookupError, ValueError, ApprovalError, RedactedArguments) as exc:
                return self.refuse(400, str(exc.args[0] if exc.args else exc))
            return RedirectResponse(back, 303)

        return endpoint

    def refuse(self, status: int, why: str) -> Response:
        """The error page, with ``status``, saying ``why``."""
        html = self.env.get_template("error.html").render(
            status=status, why=why, csrf="", path="", redis=self.redis is not None
        )
        return secured(HTMLResponse(html, status_code=status))


class Area(abc.ABC):
    """A part of the page (runs, inbox, ...): its routes, over the shared :class:`Site`."""

    def __init__(self, site: Site) -> None:
        self.site = site

    @abc.abstractmethod
    def routes(self) -> list[Route]:
        """The area's pages (``site.page``) and actions (``site.action``)."""


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_of(url: str) -> tuple[str, str, int] | None:
    """``url``'s origin as (scheme, host name as a Host header carries it, port), the
    scheme's default port filled in; None for anything else (``null``, no host, a port
    out of range, a scheme other than http or https)."""
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS or not parts.hostname:
            return None
        return scheme, host_name(parts.hostname), parts.port or _DEFAULT_PORTS[scheme]
    except ValueError:
        return None


def _cookie(response: Response, request: Request, name: str, value: str) -> None:
    """A cookie of the page: HttpOnly, SameSite strict, for the whole page, Secure over
    https."""
    response.set_cookie(
        name,
        value,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def _without_token(request: Request) -> str:
    """Where the ``?token=`` hop goes: this path and query, relative (never another host)."""
    query = "&".join(
        f"{quote(k, safe='')}={quote(v, safe='')}"
        for k, v in request.query_params.multi_items()
        if k != "token"
    )
    path = "/" + request.url.path.lstrip("/")  # never //host: a relative path on this host
    return quote(path) + (f"?{query}" if query else "")


def secured(response: Response) -> Response:
    """``response`` with the page's security headers (CSP, no framing, no sniffing)."""
    response.headers["content-security-policy"] = (
        "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; "
        "form-action 'self'; base-uri 'none'"
    )
    response.headers["x-frame-options"] = "DENY"
    response.headers["x-content-type-options"] = "nosniff"
    response.headers["referrer-policy"] = "same-origin"  # no-referrer makes Origin "null"
    return response
