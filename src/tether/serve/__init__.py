"""``tether serve``: the operator page over the records tether writes.

Runs (filtered by status and stop reason), one run (its steps and tool calls, the stop,
what the customer was told, the handoff), the inbox (calls waiting for approval, then
handoffs, open cases first: claim, resolve), dead letters (replay at most once) and the
breakers of a Redis store (force open, close). Server-rendered HTML (Starlette, Jinja2
with autoescape, uvicorn), no JavaScript build step; extra ``tether[serve]``.

Safety: it binds to loopback unless a token is given; with a token every request must
carry it (``Authorization: Bearer``, or ``?token=`` once, which sets a cookie); every
state-changing action is a POST with a CSRF token (a double-submit cookie, SameSite
strict, and the ``Origin`` must be this host); every value shown is redacted again and
escaped.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tether._errors import require
from tether._governance import APPROVED, PENDING, REJECTED, ApprovalError
from tether._outcome import STATUSES, StopReason
from tether._persist import RedactedArguments
from tether._records import Records
from tether._redact import redact

require("starlette", "serve")
require("jinja2", "serve")

import jinja2  # noqa: E402 - after the extra check
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import HTMLResponse, RedirectResponse, Response  # noqa: E402
from starlette.routing import Route  # noqa: E402

__all__ = ["create_app", "is_loopback"]

TEMPLATES = Path(__file__).parent / "templates"
CSRF_COOKIE, TOKEN_COOKIE = "tether_csrf", "tether_token"

Handler = Callable[[Request], Awaitable[Response]]


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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

    def __init__(self, records: Records, *, redis: Any = None, token: str | None = None,
                 handler: Callable[..., Any] | None = None,
                 clock: Callable[[], float] | None = None) -> None:  # fmt: skip
        import time

        self.records = records
        self.redis = redis
        self.token = token
        self.handler = handler
        self.clock = clock or time.time
        self.env = _environment()

    # --- the gate: token, CSRF ----------------------------------------------------------

    def _token_ok(self, request: Request) -> bool:
        if self.token is None:
            return True
        given = request.cookies.get(TOKEN_COOKIE, "")
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        return hmac.compare_digest(given.encode(), self.token.encode())

    def page(self, fn: Callable[[Request], Awaitable[tuple[str, dict[str, Any]]]]) -> Handler:
        """A GET page: the token checked, a CSRF cookie set, the template rendered."""

        async def endpoint(request: Request) -> Response:
            query_token = request.query_params.get("token")
            if self.token is not None and query_token is not None:
                if not hmac.compare_digest(query_token.encode(), self.token.encode()):
                    return self._refuse(401, "The token is wrong.")
                response: Response = RedirectResponse(request.url.remove_query_params("token"), 303)
                response.set_cookie(TOKEN_COOKIE, query_token, httponly=True, samesite="strict")
                return response
            if not self._token_ok(request):
                return self._refuse(401, "This page needs the token: open it with ?token=... once.")
            csrf = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)
            try:
                template, context = await fn(request)
            except LookupError as exc:
                return self._refuse(404, str(exc.args[0] if exc.args else exc))
            html = self.env.get_template(template).render(csrf=csrf, path=request.url.path,
                                                          redis=self.redis is not None, **context)  # fmt: skip
            response = HTMLResponse(html)
            response.set_cookie(CSRF_COOKIE, csrf, httponly=True, samesite="strict")
            response.headers["content-security-policy"] = (
                "default-src 'self'; style-src 'self' 'unsafe-inline'"
            )
            response.headers["x-frame-options"] = "DENY"
            return response

        return endpoint

    def action(self, fn: Callable[[Request, dict[str, str]], Awaitable[str]]) -> Handler:
        """A POST action: token, CSRF and origin checked; then a redirect (with a notice)."""

        async def endpoint(request: Request) -> Response:
            if not self._token_ok(request):
                return self._refuse(401, "This action needs the token.")
            origin = request.headers.get("origin")
            if origin and urlsplit(origin).netloc != request.headers.get("host", ""):
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
                back = await fn(request, form)
            except (LookupError, ValueError, ApprovalError, RedactedArguments) as exc:
                return self._refuse(400, str(exc.args[0] if exc.args else exc))
            return RedirectResponse(back, 303)

        return endpoint

    def _refuse(self, status: int, why: str) -> Response:
        html = self.env.get_template("error.html").render(status=status, why=why, csrf="", path="",
                                                          redis=self.redis is not None)  # fmt: skip
        return HTMLResponse(html, status_code=status)

    # --- pages ---------------------------------------------------------------------------

    async def runs(self, request: Request) -> tuple[str, dict[str, Any]]:
        status = request.query_params.get("status") or ""
        reason = request.query_params.get("reason") or ""
        runs = self.records.runs.list(limit=500)
        shown = [r for r in runs if (not status or r.get("status") == status)
                 and (not reason or r.get("reason") == reason)]  # fmt: skip
        return "runs.html", {"runs": shown, "status": status, "reason": reason, "total": len(runs),
                             "statuses": STATUSES,
                             "reasons": [r.value for r in StopReason]}  # fmt: skip

    async def run(self, request: Request) -> tuple[str, dict[str, Any]]:
        run_id = request.path_params["run_id"]
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

    async def inbox(self, request: Request) -> tuple[str, dict[str, Any]]:
        approvals = self.records.approvals.list(limit=500)
        pending = [a for a in approvals if a.status == PENDING]
        decided = [a for a in approvals if a.status != PENDING][:20]
        handoffs = self.records.handoffs.list(limit=500)
        return "inbox.html", {"pending": pending, "decided": decided, "handoffs": handoffs,
                              "open": sum(1 for h in handoffs if h["state"] != "resolved")}  # fmt: skip

    async def letters(self, request: Request) -> tuple[str, dict[str, Any]]:
        letters = sorted(self.records.dead_letters.list(limit=500), key=lambda d: -d.at)
        return "dead_letters.html", {"letters": letters, "can_replay": self.handler is not None}

    async def letter(self, request: Request) -> tuple[str, dict[str, Any]]:
        letter_id = request.path_params["letter_id"]
        letter = self.records.dead_letters.get(letter_id)
        return "dead_letter.html", {"letter": letter, "can_replay": self.handler is not None}

    async def breakers(self, request: Request) -> tuple[str, dict[str, Any]]:
        rows = []
        if self.redis is not None:
            now = self.clock()
            for name in self.redis.breaker_names():
                state, retry_at = self.redis.breaker_state(name, now)
                rows.append({"name": name, "state": state,
                             "retry_in": max(0.0, retry_at - now) if state == "open" else 0.0})  # fmt: skip
        return "breakers.html", {"breakers": rows}

    # --- actions --------------------------------------------------------------------------

    async def claim(self, request: Request, form: dict[str, str]) -> str:
        handoff_id = request.path_params["handoff_id"]
        self.records.handoffs.claim(handoff_id, by=form.get("by", ""), at=self.clock())
        return f"/inbox#{handoff_id}"

    async def resolve(self, request: Request, form: dict[str, str]) -> str:
        handoff_id = request.path_params["handoff_id"]
        self.records.handoffs.resolve(handoff_id, by=form.get("by", ""), note=form.get("note", ""),
                                      at=self.clock())  # fmt: skip
        return f"/inbox#{handoff_id}"

    async def decide(self, request: Request, form: dict[str, str]) -> str:
        approval_id = request.path_params["approval_id"]
        verdict = APPROVED if request.path_params["verdict"] == "approve" else REJECTED
        by = form.get("by", "").strip()
        if not by:
            raise ValueError("say who decides (the 'by' field)")
        self.records.approvals.decide(approval_id, verdict, by[:100], str(redact(form.get("note", ""))),
                                      self.clock())  # fmt: skip
        return "/inbox"

    async def replay(self, request: Request, form: dict[str, str]) -> str:
        letter_id = request.path_params["letter_id"]
        if self.handler is None:
            raise ValueError("no replay handler: start tether serve with --handler module:function")
        self.records.dead_letters.replay(letter_id, self.handler)  # at most once per letter
        return f"/dead-letters/{letter_id}"

    async def force(self, request: Request, form: dict[str, str]) -> str:
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


def create_app(records: Records | str, *, redis: Any = None, token: str | None = None,
               handler: Callable[..., Any] | None = None) -> Starlette:  # fmt: skip
    """The operator page's ASGI app over ``records`` (a :class:`tether.Records`, a SQLite
    path or a PostgreSQL DSN); ``redis`` is a Redis URL or a ``RedisStore`` for the
    breakers page; ``handler`` replays dead letters."""
    if isinstance(records, str):
        records = Records.open(records)
    if isinstance(redis, str):
        from tether.stores._redis import RedisStore

        redis = RedisStore(redis)
    app = App(records, redis=redis, token=token or None, handler=handler)
    starlette = Starlette(routes=app.routes())
    starlette.state.tether = app
    return starlette
