"""``tether serve``: the operator page over the records tether writes.

Runs (filtered by status and stop reason), one run (its steps and tool calls, the stop,
what the customer was told, the handoff), the inbox (calls waiting for approval, then
handoffs, open cases first: claim, resolve), dead letters (replay at most once) and the
breakers of a Redis store (force open, close). Server-rendered HTML (Starlette, Jinja2
with autoescape, uvicorn), no JavaScript build step; extra ``tether[serve]``.

Safety: it binds to loopback unless a token is given; with a token every request must
carry it (``Authorization: Bearer``, or ``?token=`` once, which sets a cookie). Only the
host names it is told of are served (Starlette's ``TrustedHostMiddleware``): the loopback
names without a token, plus each ``allowed_hosts`` name with one, so a DNS-rebound name
never reaches a page. Every state-changing action is a POST with a CSRF token (a
double-submit cookie, SameSite strict) whose ``Origin``, when sent, must be one of those
hosts (never compared with the request's own ``Host``); every value shown is redacted
again and escaped. Database reads, rendering and replay handlers run in worker threads,
never on the event loop.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import secrets
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from tether._errors import require
from tether._governance import APPROVED, PENDING, REJECTED, ApprovalError
from tether._outcome import STATUSES, StopReason
from tether._persist import RedactedArguments, check_run_id
from tether._records import Records
from tether._redact import redact

require("starlette", "serve")
require("jinja2", "serve")

import jinja2  # noqa: E402 - after the extra check
from starlette.applications import Starlette  # noqa: E402
from starlette.concurrency import run_in_threadpool  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402
from starlette.middleware.trustedhost import TrustedHostMiddleware  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import HTMLResponse, RedirectResponse, Response  # noqa: E402
from starlette.routing import Route  # noqa: E402

__all__ = ["LOOPBACK_NAMES", "create_app", "is_loopback"]

TEMPLATES = Path(__file__).parent / "templates"
CSRF_COOKIE, TOKEN_COOKIE = "tether_csrf", "tether_token"
#: the host names served without a token (a browser on this machine)
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_HOST_NAME = re.compile(
    r"(?i)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*"
)

Handler = Callable[[Request], Awaitable[Response]]


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


def _shown(value: Any) -> Any:
    """Every value a page shows, redacted once more (records are redacted when written;
    this catches anything a store holds from before, or a pattern added since)."""
    return redact(value) if isinstance(value, str) else value


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             finalize=_shown, undefined=jinja2.StrictUndefined)  # fmt: skip
    env.filters["money"] = lambda v: f"${float(v or 0):.4f}"
    env.filters["secs"] = lambda v: f"{float(v or 0):.1f} s"
    env.filters["json"] = _pretty
    env.filters["when"] = _when
    return env


def _pretty(value: Any) -> str:
    import json

    return json.dumps(
        redact(value), indent=2, default=str, ensure_ascii=False
    )  # finalize redacts it again


def _when(value: Any) -> str:
    import datetime

    if not value:
        return ""
    return datetime.datetime.fromtimestamp(float(value), tz=datetime.UTC).strftime(
        "%Y-%m-%d %H:%M:%S UTC"
    )


class App:
    """The operator page: pages and actions over one :class:`tether.Records`."""

    def __init__(
        self,
        records: Records,
        *,
        redis: Any = None,
        token: str | None = None,
        handler: Callable[..., Any] | None = None,
        clock: Callable[[], float] | None = None,
        allowed_hosts: Iterable[str] = (),
    ) -> None:
        import time

        self.records = records
        self.redis = redis
        self.token = token
        self.handler = handler
        self.clock = clock or time.time
        self.env = _environment()
        extra = [host_name(h) for h in allowed_hosts]
        if extra and token is None:
            raise ValueError(
                "allowed_hosts needs a token: without one only the loopback names "
                f"({', '.join(LOOPBACK_NAMES)}) are served"
            )
        #: the Host names served (as a Host header carries them)
        self.hosts = tuple(dict.fromkeys([*LOOPBACK_NAMES, *extra]))

    # --- the gate: host, token, CSRF, origin --------------------------------------------

    def _token_ok(self, request: Request) -> bool:
        if self.token is None:
            return True
        given = request.cookies.get(TOKEN_COOKIE, "")
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        return hmac.compare_digest(given.encode(), self.token.encode())

    def _origin_ok(self, request: Request) -> bool:
        """No Origin (a client that is not a browser), or one of the served hosts."""
        origin = request.headers.get("origin")
        if origin is None:
            return True
        try:
            name = urlsplit(origin).hostname
            return name is not None and host_name(name) in self.hosts
        except ValueError:
            return False

    def page(self, fn: Callable[[Request], tuple[str, dict[str, Any]]]) -> Handler:
        """A GET page: the token checked, a CSRF cookie set; ``fn`` (it reads the database)
        and the rendering run in a worker thread."""

        async def endpoint(request: Request) -> Response:
            query_token = request.query_params.get("token")
            if self.token is not None and query_token is not None:
                if not hmac.compare_digest(query_token.encode(), self.token.encode()):
                    return self._refuse(401, "The token is wrong.")
                response: Response = RedirectResponse(_without_token(request), 303)
                response.set_cookie(TOKEN_COOKIE, query_token, httponly=True, samesite="strict")
                return response
            if not self._token_ok(request):
                return self._refuse(401, "This page needs the token: open it with ?token=... once.")
            csrf = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)
            try:
                html = await run_in_threadpool(self._render_page, fn, request, csrf)
            except LookupError as exc:
                return self._refuse(404, str(exc.args[0] if exc.args else exc))
            except ValueError as exc:
                return self._refuse(400, str(exc.args[0] if exc.args else exc))
            response = _secured(HTMLResponse(html))
            response.set_cookie(CSRF_COOKIE, csrf, httponly=True, samesite="strict")
            return response

        return endpoint

    def _render_page(
        self, fn: Callable[[Request], tuple[str, dict[str, Any]]], request: Request, csrf: str
    ) -> str:
        template, context = fn(request)
        return self.env.get_template(template).render(
            csrf=csrf, path=request.url.path, redis=self.redis is not None, **context
        )

    def action(self, fn: Callable[[Request, dict[str, str]], str]) -> Handler:
        """A POST action: token, origin and CSRF checked; ``fn`` runs in a worker thread;
        then a redirect."""

        async def endpoint(request: Request) -> Response:
            if not self._token_ok(request):
                return self._refuse(401, "This action needs the token.")
            if not self._origin_ok(request):
                return self._refuse(403, "This action came from another site.")
            form = {k: str(v) for k, v in (await request.form()).items()}
            cookie = request.cookies.get(CSRF_COOKIE, "")
            if not cookie or not hmac.compare_digest(
                form.get("csrf", "").encode(), cookie.encode()
            ):
                return self._refuse(
                    403, "The form is stale or forged (CSRF check): reload the page and try again."
                )
            try:
                back = await run_in_threadpool(fn, request, form)
            except (LookupError, ValueError, ApprovalError, RedactedArguments) as exc:
                return self._refuse(400, str(exc.args[0] if exc.args else exc))
            return RedirectResponse(back, 303)

        return endpoint

    def _refuse(self, status: int, why: str) -> Response:
        html = self.env.get_template("error.html").render(
            status=status, why=why, csrf="", path="", redis=self.redis is not None
        )
        return _secured(HTMLResponse(html, status_code=status))

    # --- pages ---------------------------------------------------------------------------

    def runs(self, request: Request) -> tuple[str, dict[str, Any]]:
        status = request.query_params.get("status") or ""
        reason = request.query_params.get("reason") or ""
        runs = self.records.runs.list(limit=500)
        shown = [
            r
            for r in runs
            if (not status or r.get("status") == status)
            and (not reason or r.get("reason") == reason)
        ]
        return "runs.html", {
            "runs": shown,
            "status": status,
            "reason": reason,
            "total": len(runs),
            "statuses": STATUSES,
            "reasons": [r.value for r in StopReason],
        }

    def run(self, request: Request) -> tuple[str, dict[str, Any]]:
        run_id = check_run_id(request.path_params["run_id"])
        run = self.records.runs.get(run_id)
        if run is None:
            raise LookupError(f"no run {run_id!r} in these records")
        handoff = None
        if run.get("handoff_id"):
            try:
                handoff = self.records.handoffs.get(str(run["handoff_id"]))
            except KeyError:
                handoff = None
        return "run.html", {"run": run, "handoff": handoff}

    def inbox(self, request: Request) -> tuple[str, dict[str, Any]]:
        approvals = self.records.approvals.list(limit=500)
        pending = [a for a in approvals if a.status == PENDING]
        decided = [a for a in approvals if a.status != PENDING][:20]
        handoffs = self.records.handoffs.list(limit=500)
        return "inbox.html", {
            "pending": pending,
            "decided": decided,
            "handoffs": handoffs,
            "open": sum(1 for h in handoffs if h["state"] != "resolved"),
        }

    def letters(self, request: Request) -> tuple[str, dict[str, Any]]:
        letters = sorted(self.records.dead_letters.list(limit=500), key=lambda d: -d.at)
        return "dead_letters.html", {"letters": letters, "can_replay": self.handler is not None}

    def letter(self, request: Request) -> tuple[str, dict[str, Any]]:
        letter_id = check_run_id(request.path_params["letter_id"], "a dead letter id")
        letter = self.records.dead_letters.get(letter_id)
        return "dead_letter.html", {"letter": letter, "can_replay": self.handler is not None}

    def breakers(self, request: Request) -> tuple[str, dict[str, Any]]:
        rows = []
        if self.redis is not None:
            now = self.clock()
            for name in self.redis.breaker_names():
                state, retry_at = self.redis.breaker_state(name, now)
                retry_in = max(0.0, retry_at - now) if state == "open" else 0.0
                rows.append({"name": name, "state": state, "retry_in": retry_in})
        return "breakers.html", {"breakers": rows}

    # --- actions --------------------------------------------------------------------------

    def claim(self, request: Request, form: dict[str, str]) -> str:
        handoff_id = check_run_id(request.path_params["handoff_id"], "a handoff id")
        self.records.handoffs.claim(handoff_id, by=form.get("by", ""), at=self.clock())
        return f"/inbox#{handoff_id}"

    def resolve(self, request: Request, form: dict[str, str]) -> str:
        handoff_id = check_run_id(request.path_params["handoff_id"], "a handoff id")
        self.records.handoffs.resolve(
            handoff_id, by=form.get("by", ""), note=form.get("note", ""), at=self.clock()
        )
        return f"/inbox#{handoff_id}"

    def decide(self, request: Request, form: dict[str, str]) -> str:
        approval_id = check_run_id(request.path_params["approval_id"], "an approval id")
        verdict = APPROVED if request.path_params["verdict"] == "approve" else REJECTED
        by = form.get("by", "").strip()
        if not by:
            raise ValueError("say who decides (the 'by' field)")
        note = str(redact(form.get("note", "")))
        self.records.approvals.decide(approval_id, verdict, by[:100], note, self.clock())
        return "/inbox"

    def replay(self, request: Request, form: dict[str, str]) -> str:
        letter_id = check_run_id(request.path_params["letter_id"], "a dead letter id")
        if self.handler is None:
            raise ValueError("no replay handler: start tether serve with --handler module:function")
        self.records.dead_letters.replay(letter_id, self.handler)  # at most once per letter
        return f"/dead-letters/{letter_id}"

    def force(self, request: Request, form: dict[str, str]) -> str:
        if self.redis is None:
            raise ValueError("no Redis store: start tether serve with --redis URL")
        name, state = request.path_params["name"], request.path_params["state"]
        seconds = float(form.get("seconds") or 60)
        if state == "open" and not 0 < seconds <= 86_400:
            raise ValueError("seconds must be between 0 and 86400")
        self.redis.breaker_force(name, "open" if state == "open" else "closed", seconds)
        return "/breakers"

    async def home(self, request: Request) -> Response:
        return RedirectResponse("/runs", 303)

    def routes(self) -> list[Route]:
        return [
            Route("/", self.home),
            Route("/runs", self.page(self.runs)),
            Route("/runs/{run_id}", self.page(self.run)),
            Route("/inbox", self.page(self.inbox)),
            Route("/handoffs/{handoff_id}/claim", self.action(self.claim), methods=["POST"]),
            Route("/handoffs/{handoff_id}/resolve", self.action(self.resolve), methods=["POST"]),
            Route(
                "/approvals/{approval_id}/{verdict:str}", self.action(self.decide), methods=["POST"]
            ),
            Route("/dead-letters", self.page(self.letters)),
            Route("/dead-letters/{letter_id}", self.page(self.letter)),
            Route("/dead-letters/{letter_id}/replay", self.action(self.replay), methods=["POST"]),
            Route("/breakers", self.page(self.breakers)),
            Route("/breakers/{name}/{state:str}", self.action(self.force), methods=["POST"]),
        ]


def _without_token(request: Request) -> str:
    """Where the ``?token=`` hop goes: this path and query, relative (never another host)."""
    query = "&".join(
        f"{quote(k, safe='')}={quote(v, safe='')}"
        for k, v in request.query_params.multi_items()
        if k != "token"
    )
    return quote(request.url.path) + (f"?{query}" if query else "")


def _secured(response: Response) -> Response:
    response.headers["content-security-policy"] = (
        "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; "
        "form-action 'self'; base-uri 'none'"
    )
    response.headers["x-frame-options"] = "DENY"
    response.headers["x-content-type-options"] = "nosniff"
    response.headers["referrer-policy"] = "same-origin"  # no-referrer makes Origin "null"
    return response


def create_app(
    records: Records | str,
    *,
    redis: Any = None,
    token: str | None = None,
    handler: Callable[..., Any] | None = None,
    allowed_hosts: Iterable[str] = (),
) -> Starlette:
    """The operator page's ASGI app over ``records`` (a :class:`tether.Records`, a SQLite
    path or a PostgreSQL DSN); ``redis`` is a Redis URL or a ``RedisStore`` for the
    breakers page; ``handler`` replays dead letters.

    Only requests whose ``Host`` is a loopback name (``127.0.0.1``, ``localhost``,
    ``[::1]``) are served, plus, with a ``token``, the names in ``allowed_hosts`` (how the
    operators' browsers reach it, e.g. ``ops.example.com``); any other Host gets 400.
    """
    if isinstance(records, str):
        records = Records.open(records)
    if isinstance(redis, str):
        from tether.stores._redis import RedisStore

        redis = RedisStore(redis)
    app = App(
        records, redis=redis, token=token or None, handler=handler, allowed_hosts=allowed_hosts
    )
    starlette = Starlette(
        routes=app.routes(),
        middleware=[
            Middleware(TrustedHostMiddleware, allowed_hosts=list(app.hosts), www_redirect=False)
        ],
    )
    starlette.state.tether = app
    return starlette
