"""The runs: every run (filtered, searched and paged in SQL), one run (its steps and tool
calls, the stop, what the customer was told, the handoff), and any record's whole value."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tether.records._collections import check_run_id
from tether.redaction._redact import redact_text
from tether.run._outcome import STATUSES, StopReason
from tether.serve._site import Area, query_date, query_number
from tether.serve._values import at_path, redact_whole, run_view, short, shown
from tether.stores._documents import DocKind

__all__ = ["VALUE_KINDS", "RunPages"]

#: runs on a page of /runs
PAGE = 50
#: the records whose values /values/{kind}/{id} serves whole
VALUE_KINDS = {
    "run": DocKind.RUN,
    "dead-letter": DocKind.DEAD_LETTER,
    "approval": DocKind.APPROVAL,
    "handoff": DocKind.HANDOFF,
}


class RunPages(Area):
    """/runs, /runs/{run_id} and /values/{kind}/{doc_id}."""

    def routes(self) -> list[Route]:
        page = self.site.page
        return [
            Route("/runs", page(self.runs)),
            Route("/runs/{run_id}", page(self.run)),
            Route("/values/{kind}/{doc_id}", page(self.value)),
        ]

    def runs(self, request: Request) -> tuple[str, dict[str, Any]]:
        """Every run, newest first, filtered, searched and paged in SQL."""
        q = request.query_params
        filters: dict[str, Any] = {
            "status": q.get("status") or None,
            "reason": q.get("reason") or None,
            "tool": (q.get("tool") or "").strip()[:200] or None,
            "text": (q.get("q") or "").strip()[:200] or None,
            "since": query_date(request, "since"),
            "until": query_date(request, "until", end=True),
        }
        number = query_number(request, "page", 1, 1, 10**7)
        runs = self.site.records.runs
        found = runs.search(**filters, limit=PAGE, offset=(number - 1) * PAGE)
        pages = max(1, -(-found.total // PAGE))
        keep = [(k, v) for k, v in q.multi_items() if k not in ("page", "token") and v]
        agents = self._agents([str(r["run_id"]) for r in found.runs])
        return "runs.html", {
            "agents": agents,
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
            "tools": runs.tool_names(),
            "statuses": STATUSES,
            "reasons": [r.value for r in StopReason],
        }

    def _agents(self, run_ids: list[str]) -> dict[str, str]:
        """The agent or framework that filed each run of a page (one query for the page)."""
        if not run_ids:
            return {}
        records = self.site.records
        t = records.tables
        marks = ", ".join("?" for _ in run_ids)
        with records.store.sql() as sql:
            rows = sql.rows(
                f"SELECT id, {t.field('agent')} FROM {t.docs} WHERE kind = ? AND id IN ({marks})",
                [DocKind.RUN.value, *run_ids],
            )
        return {str(r[0]): short(str(r[1] or "")) for r in rows}

    def run(self, request: Request) -> tuple[str, dict[str, Any]]:
        """One run: its steps, tool calls and stop, with its handoff when it has one."""
        records = self.site.records
        run_id = check_run_id(request.path_params["run_id"])
        text = records.store.get(DocKind.RUN, run_id)
        if text is None:
            raise LookupError(f"no run {run_id!r} in these records")
        view = run_view(text)
        run = view["run"]
        handoff = None
        if run.get("handoff_id"):
            try:
                handoff = short(records.handoffs.get(str(run["handoff_id"])))
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
        conversation = [
            dict(
                t,
                text=str(redact_text(t["text"])),
                value=shown(t["value"]) if t["value"] is not None else None,
            )
            for t in view["conversation"]
        ]
        return "run.html", {
            "run": run,
            "partial": partial,
            "values": values,
            "handoff": handoff,
            "conversation": conversation,
        }

    def value(self, request: Request) -> tuple[str, dict[str, Any]]:
        """A whole value of a record (what a page cut), as JSON, redacted."""
        kind = request.path_params["kind"]
        if kind not in VALUE_KINDS:
            raise LookupError(f"no such kind of record: {kind!r}")
        doc_id = check_run_id(request.path_params["doc_id"], "a record id")
        text = self.site.records.store.get(VALUE_KINDS[kind], doc_id)
        if text is None:
            raise LookupError(f"no {kind} {doc_id!r} in these records")
        value = redact_whole(at_path(json.loads(text), request.query_params.get("at") or ""))
        body = json.dumps(value, indent=2, ensure_ascii=False, default=str)
        return "", {"response": Response(body, media_type="application/json")}
