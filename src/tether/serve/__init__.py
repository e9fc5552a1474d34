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

import datetime
import hmac
import ipaddress
import json
import logging
import re
import secrets
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from tether._errors import require
from tether.records._approvals import APPROVED, PENDING, REJECTED, USED, ApprovalError
from tether.records._collections import CaseState, RedactedArguments, check_run_id
from tether.records._records import DAY, Records
from tether.redaction._redact import masks_pii, redact
from tether.run._outcome import STATUSES, StopReason
from tether.stores._documents import DocKind
from tether.stores._logic import BreakerState

require("starlette", "serve")
require("jinja2", "serve")

import jinja2  # noqa: E402 - after the extra check
from markupsafe import Markup  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.concurrency import run_in_threadpool  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402
from starlette.middleware.trustedhost import TrustedHostMiddleware  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response  # noqa: E402
from starlette.routing import Route  # noqa: E402

from tether.serve._charts import failing_tools, stacked_days  # noqa: E402
from tether.serve._values import at_path, preview, redact_whole, run_view, short, shown  # noqa: E402

__all__ = ["LOOPBACK_NAMES", "create_app", "is_loopback"]

_log = logging.getLogger("tether")
TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"
#: runs on a page of /runs; approvals and cases the inbox shows at once (oldest first)
PAGE, INBOX = 50, 50
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
    env.filters["when"] = _when
    env.filters["kb"] = lambda n: (
        f"{int(n) / 1024:,.0f} KB" if n >= 1024 else f"{int(n)} characters"
    )
    return env


def _when(value: Any) -> str:
    if not value:
        return ""
    return datetime.datetime.fromtimestamp(float(value), tz=datetime.UTC).strftime(
        "%Y-%m-%d %H:%M:%S UTC"
    )


def _date(request: Request, name: str, *, end: bool = False) -> float | None:
    """A ``YYYY-MM-DD`` query parameter as epoch seconds (UTC; ``end``: the day after)."""
    text = request.query_params.get(name) or ""
    if not text:
        return None
    try:
        day = datetime.datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=datetime.UTC)
    except ValueError:
        raise ValueError(f"{name} must be a date like 2026-01-31, got {text[:40]!r}") from None
    return day.timestamp() + (DAY if end else 0.0)


def _number(request: Request, name: str, default: int, low: int, high: int) -> int:
    text = request.query_params.get(name) or ""
    if not text:
        return default
    if not text.isdigit() or not low <= int(text) <= high:
        raise ValueError(f"{name} must be a whole number from {low} to {high}, got {text[:20]!r}")
    return int(text)


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
        refresh: float = 5.0,
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
        if not refresh > 0:
            raise ValueError(f"refresh must be > 0 seconds, got {refresh!r}")
        #: seconds between the inbox's refreshes
        self.refresh = float(refresh)

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
                result = await run_in_threadpool(self._render_page, fn, request, csrf)
            except LookupError as exc:
                return self._refuse(404, str(exc.args[0] if exc.args else exc))
            except ValueError as exc:
                return self._refuse(400, str(exc.args[0] if exc.args else exc))
            response = _secured(result if isinstance(result, Response) else HTMLResponse(result))
            response.set_cookie(CSRF_COOKIE, csrf, httponly=True, samesite="strict")
            return response

        return endpoint

    def _render_page(
        self, fn: Callable[[Request], tuple[str, dict[str, Any]]], request: Request, csrf: str
    ) -> str | Response:
        template, context = fn(request)
        if template == "":
            response: Response = context["response"]
            return response
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
        """Every run, newest first, filtered, searched and paged in SQL."""
        q = request.query_params
        filters: dict[str, Any] = {
            "status": q.get("status") or None,
            "reason": q.get("reason") or None,
            "tool": (q.get("tool") or "").strip()[:200] or None,
            "text": (q.get("q") or "").strip()[:200] or None,
            "since": _date(request, "since"),
            "until": _date(request, "until", end=True),
        }
        number = _number(request, "page", 1, 1, 10**7)
        found = self.records.runs.search(**filters, limit=PAGE, offset=(number - 1) * PAGE)
        pages = max(1, -(-found.total // PAGE))
        keep = [(k, v) for k, v in q.multi_items() if k not in ("page", "token") and v]
        return "runs.html", {
            "found": found,
            "filtered": any(v is not None for v in filters.values()),
            "runs": [short(r) for r in found.runs],
            "number": number,
            "pages": pages,
            "link": lambda n: "/runs?" + urlencode([*keep, ("page", str(n))]),
            "status_link": lambda s: (
                "/runs?"
                + urlencode(
                    [*(kv for kv in keep if kv[0] != "status"), *([("status", s)] if s else [])]
                )
            ),
            "q": q.get("q") or "",
            "tool": q.get("tool") or "",
            "since": q.get("since") or "",
            "until": q.get("until") or "",
            "status": q.get("status") or "",
            "reason": q.get("reason") or "",
            "tools": self.records.runs.tool_names(),
            "statuses": STATUSES,
            "reasons": [r.value for r in StopReason],
        }

    def run(self, request: Request) -> tuple[str, dict[str, Any]]:
        run_id = check_run_id(request.path_params["run_id"])
        text = self.records.store.get(DocKind.RUN, run_id)
        if text is None:
            raise LookupError(f"no run {run_id!r} in these records")
        view = run_view(text)
        run = view["run"]
        handoff = None
        if run.get("handoff_id"):
            try:
                handoff = short(self.records.handoffs.get(str(run["handoff_id"])))
            except KeyError:
                handoff = None
        usage = run.get("usage") if isinstance(run.get("usage"), dict) else {}
        run["usage"] = {
            k: usage.get(k, 0) for k in ("model_calls", "tool_calls", "retries", "unpriced_calls")
        }
        for name in ("transcript", "open_issues", "compensated"):
            run[name] = run.get(name) if isinstance(run.get(name), list) else []
        for name in (
            "task",
            "status",
            "reason",
            "detail",
            "checkpoint_id",
            "error",
            "customer_message",
        ):
            run.setdefault(name, "")
        for name in ("steps", "cost_usd", "seconds", "ended_at"):
            run.setdefault(name, 0)
        partial = [
            dict(p, args=shown(p["args"]), result=shown(p["result"])) for p in view["partial"]
        ]
        values = {
            "result": shown(view["result"]),
            "pending": shown(view["pending"]) if view["pending"] is not None else None,
        }
        return "run.html", {"run": run, "partial": partial, "values": values, "handoff": handoff}

    def value(self, request: Request) -> tuple[str, dict[str, Any]]:
        """A whole value of a record (what a page cut), as JSON, redacted."""
        kind = request.path_params["kind"]
        if kind not in VALUE_KINDS:
            raise LookupError(f"no such kind of record: {kind!r}")
        doc_id = check_run_id(request.path_params["doc_id"], "a record id")
        text = self.records.store.get(VALUE_KINDS[kind], doc_id)
        if text is None:
            raise LookupError(f"no {kind} {doc_id!r} in these records")
        value = redact_whole(at_path(json.loads(text), request.query_params.get("at") or ""))
        body = json.dumps(value, indent=2, ensure_ascii=False, default=str)
        return "", {"response": Response(body, media_type="application/json")}

    def inbox(self, request: Request) -> tuple[str, dict[str, Any]]:
        return "inbox.html", self._inbox()

    def inbox_live(self, request: Request) -> tuple[str, dict[str, Any]]:
        """The inbox's lists alone, for the page to refresh itself."""
        return "inbox_live.html", self._inbox()

    def _inbox(self) -> dict[str, Any]:
        records = self.records
        pending, waiting = records.pending(DocKind.APPROVAL, (PENDING,), limit=INBOX)
        open_states = (CaseState.OPEN, CaseState.CLAIMED)
        cases, open_cases = records.pending(DocKind.HANDOFF, open_states, limit=INBOX)
        cases.sort(key=lambda h: 0 if h.get("state", CaseState.OPEN) == CaseState.OPEN else 1)
        resolved = records.recent(DocKind.HANDOFF, (CaseState.RESOLVED,), limit=20)
        decided = records.recent(DocKind.APPROVAL, (APPROVED, REJECTED, USED), limit=20)
        taken = records.resumptions([d["id"] for d in decided])
        runs = {d["run_id"]: records.runs.get(d["run_id"]) for d in decided if d.get("run_id")}
        return {
            "pending": [dict(short(a), args=preview(a.get("args"))) for a in pending],
            "waiting": waiting,
            "handoffs": [_case(h) for h in cases + resolved],
            "open": open_cases,
            "decided": [
                _decided(d, taken.get(d["id"]), runs.get(d.get("run_id"))) for d in decided
            ],
            "refresh": self.refresh,
        }

    def overview(self, request: Request) -> tuple[str, dict[str, Any]]:
        days = _number(request, "days", 30, 1, 366)
        today = (self.clock() // DAY) * DAY
        since, until = today - (days - 1) * DAY, today + DAY
        view = self.records.runs.overview(since=since, until=until)
        statuses = [s for s in STATUSES if any(s in v for v in view.by_status.values())]
        reasons = sorted({r for v in view.by_reason.values() for r in v})
        totals = {s: sum(v.get(s, 0) for v in view.by_status.values()) for s in statuses}
        return "overview.html", {
            "days": days,
            "view": view,
            "totals": totals,
            "cost": sum(view.cost_usd.values()),
            "runs_chart": stacked_days(
                view.days, view.by_status, keys=statuses, title="Runs per day, by status"
            ),
            "reasons_chart": stacked_days(
                view.days,
                view.by_reason,
                keys=reasons,
                title="Runs that did not succeed, per day, by stop reason",
            ),
            "cost_chart": stacked_days(
                view.days,
                {d: {"cost": c} for d, c in view.cost_usd.items()},
                keys=["cost"],
                title="Cost per day (USD)",
                fmt=lambda v: f"${v:,.2f}",
            ),
            "tools_chart": failing_tools(view.failing_tools, title="The tools that fail most"),
        }

    def letters(self, request: Request) -> tuple[str, dict[str, Any]]:
        letters = sorted(self.records.dead_letters.list(limit=500), key=lambda d: -d.at)
        return "dead_letters.html", {
            "letters": [short(letter.to_doc()) for letter in letters],
            "can_replay": self.handler is not None,
        }

    def letter(self, request: Request) -> tuple[str, dict[str, Any]]:
        letter_id = check_run_id(request.path_params["letter_id"], "a dead letter id")
        letter = self.records.dead_letters.get(letter_id)
        replay = self.records.dead_letters.last_replay(letter_id)
        if replay is not None and "result" in replay:
            replay["result"] = preview(replay["result"])
        return "dead_letter.html", {
            "letter": short(letter.to_doc()),
            "args": preview(letter.args),
            "replay": short(replay) if replay is not None else None,
            "can_replay": self.handler is not None,
        }

    def breakers(self, request: Request) -> tuple[str, dict[str, Any]]:
        rows = []
        if self.redis is not None:
            now = self.clock()
            for name in self.redis.breaker_names():
                state, retry_at = self.redis.breaker_state(name, now)
                retry_in = max(0.0, retry_at - now) if state == BreakerState.OPEN else 0.0
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
        letters = self.records.dead_letters
        letters.get(letter_id)  # a KeyError (404) for no such letter, before anything runs
        try:
            letters.replay(letter_id, self.handler)  # at most once per intent, via the ledger
        except RedactedArguments:
            raise
        except Exception as exc:  # the handler's failure: the letter's page shows it
            _log.warning("tether serve: the replay of %s failed: %s", letter_id, type(exc).__name__)
        return f"/dead-letters/{letter_id}#replay"

    def force(self, request: Request, form: dict[str, str]) -> str:
        if self.redis is None:
            raise ValueError("no Redis store: start tether serve with --redis URL")
        name = request.path_params["name"]
        is_open = request.path_params["state"] == BreakerState.OPEN
        seconds = float(form.get("seconds") or 60)
        if is_open and not 0 < seconds <= 86_400:
            raise ValueError("seconds must be between 0 and 86400")
        state = BreakerState.OPEN if is_open else BreakerState.CLOSED
        self.redis.breaker_force(name, state, seconds)
        return "/breakers"

    async def home(self, request: Request) -> Response:
        return RedirectResponse("/runs", 303)

    async def script(self, request: Request) -> Response:
        return _secured(FileResponse(STATIC / "tether.js", media_type="text/javascript"))

    def routes(self) -> list[Route]:
        return [
            Route("/", self.home),
            Route("/static/tether.js", self.script),
            Route("/favicon.ico", lambda request: Response(status_code=204)),
            Route("/runs", self.page(self.runs)),
            Route("/runs/{run_id}", self.page(self.run)),
            Route("/values/{kind}/{doc_id}", self.page(self.value)),
            Route("/overview", self.page(self.overview)),
            Route("/inbox", self.page(self.inbox)),
            Route("/inbox/live", self.page(self.inbox_live)),
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


#: the records whose values /values/{kind}/{id} serves whole
VALUE_KINDS = {
    "run": DocKind.RUN,
    "dead-letter": DocKind.DEAD_LETTER,
    "approval": DocKind.APPROVAL,
    "handoff": DocKind.HANDOFF,
}


def _case(doc: dict[str, Any]) -> dict[str, Any]:
    """A handoff as the inbox shows it, with what a person must check for each effect whose
    outcome is unknown (the tool, its redacted arguments, the ledger key)."""
    case: dict[str, Any] = short({k: v for k, v in doc.items() if k != "history"})
    case.setdefault("state", CaseState.OPEN)
    case["unknown"] = [
        {"tool": short(e.get("tool")), "args": preview(e.get("args")), "key": short(e.get("key"))}
        for e in doc.get("history") or ()
        if isinstance(e, dict) and e.get("key") and not e.get("ok")
    ]
    return case


def _decided(
    doc: dict[str, Any], taken: dict[str, Any] | None, run: dict[str, Any] | None
) -> dict[str, Any]:
    """A decided approval with what became of its run: waiting for a worker, taken by one,
    or resumed and ended (how)."""
    out: dict[str, Any] = short(doc)
    decided_at = float(doc.get("decided_at") or 0.0)
    ended_after = run is not None and float(run.get("ended_at") or 0.0) > decided_at
    if ended_after and run is not None and (taken is None or taken.get("done_at") is not None):
        out["resumed"] = "resumed" + (f" by {taken['worker']}" if taken else "")
        out["ended"] = f"{run.get('status')} ({run.get('reason')})"
    elif taken is not None:
        out["resumed"] = f"taken by {taken['worker']} at {_when(taken['taken_at'])}, resuming"
        out["ended"] = ""
    else:
        out["resumed"], out["ended"] = "not yet: waiting for a worker (records.decisions())", ""
    return out


def _without_token(request: Request) -> str:
    """Where the ``?token=`` hop goes: this path and query, relative (never another host)."""
    query = "&".join(
        f"{quote(k, safe='')}={quote(v, safe='')}"
        for k, v in request.query_params.multi_items()
        if k != "token"
    )
    path = "/" + request.url.path.lstrip("/")  # never //host: a relative path on this host
    return quote(path) + (f"?{query}" if query else "")


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
    starlette = Starlette(
        routes=app.routes(),
        middleware=[
            Middleware(TrustedHostMiddleware, allowed_hosts=list(app.hosts), www_redirect=False)
        ],
    )
    starlette.state.tether = app
    return starlette
