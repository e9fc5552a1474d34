"""The inbox: calls waiting for approval (approve, reject), then handoffs, open cases
first (claim, resolve), and what became of the runs of decided approvals."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.routing import Route

from tether.records._approvals import APPROVED, PENDING, REJECTED, USED
from tether.records._collections import CaseState, check_run_id
from tether.redaction._redact import redact
from tether.serve._site import Area, when
from tether.serve._values import preview, short
from tether.stores._documents import DocKind

#: the conversations an incident's case lists on the inbox (the newest; the rest are counted)
INCIDENT_RUNS = 10

__all__ = ["Inbox"]

#: approvals and cases the inbox shows at once (oldest first)
INBOX = 50


class Inbox(Area):
    """/inbox and its live lists, and the actions on handoffs and approvals."""

    def routes(self) -> list[Route]:
        page, action = self.site.page, self.site.action
        return [
            Route("/inbox", page(self.inbox)),
            Route("/inbox/live", page(self.inbox_live)),
            Route("/handoffs/{handoff_id}/claim", action(self.claim), methods=["POST"]),
            Route("/handoffs/{handoff_id}/resolve", action(self.resolve), methods=["POST"]),
            Route("/approvals/{approval_id}/{verdict:str}", action(self.decide), methods=["POST"]),
        ]

    def inbox(self, request: Request) -> tuple[str, dict[str, Any]]:
        return "inbox.html", self._lists()

    def inbox_live(self, request: Request) -> tuple[str, dict[str, Any]]:
        """The inbox's lists alone, for the page to refresh itself."""
        return "inbox_live.html", self._lists()

    def _lists(self) -> dict[str, Any]:
        records = self.site.records
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
            "handoffs": [_incident(records, _case(h)) for h in cases + resolved],
            "open": open_cases,
            "decided": [
                _decided(d, taken.get(d["id"]), runs.get(d.get("run_id"))) for d in decided
            ],
            "refresh": self.site.refresh,
        }

    def claim(self, request: Request, form: dict[str, str]) -> str:
        handoff_id = check_run_id(request.path_params["handoff_id"], "a handoff id")
        self.site.records.handoffs.claim(handoff_id, by=form.get("by", ""), at=self.site.clock())
        return f"/inbox#{handoff_id}"

    def resolve(self, request: Request, form: dict[str, str]) -> str:
        handoff_id = check_run_id(request.path_params["handoff_id"], "a handoff id")
        self.site.records.handoffs.resolve(
            handoff_id, by=form.get("by", ""), note=form.get("note", ""), at=self.site.clock()
        )
        return f"/inbox#{handoff_id}"

    def decide(self, request: Request, form: dict[str, str]) -> str:
        approval_id = check_run_id(request.path_params["approval_id"], "an approval id")
        verdict = APPROVED if request.path_params["verdict"] == "approve" else REJECTED
        by = form.get("by", "").strip()
        if not by:
            raise ValueError("say who decides (the 'by' field)")
        note = str(redact(form.get("note", "")))
        self.site.records.approvals.decide(approval_id, verdict, by[:100], note, self.site.clock())
        return "/inbox"


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


def _incident(records: Any, case: dict[str, Any]) -> dict[str, Any]:
    """An outage's incident lists the conversations it stopped (the newest few), and how
    many in all: one case for all of them."""
    if case.get("incident"):
        held, total = records.incidents.runs(str(case["id"]), limit=INCIDENT_RUNS)
        case["conversations"], case["conversations_total"] = [short(r) for r in held], total
    return case


def _decided(
    doc: dict[str, Any], taken: dict[str, Any] | None, run: dict[str, Any] | None
) -> dict[str, Any]:
    """A decided approval with what became of its run: waiting for a worker, taken by one,
    or resumed and ended (how)."""
    out: dict[str, Any] = short(doc)
    # resumed: its run's newest record has moved past the approval's checkpoint (no clock
    # compared: the approver's and the agent's may disagree)
    moved_on = run is not None and run.get("checkpoint_id") not in (None, doc.get("checkpoint_id"))
    if moved_on and run is not None and (taken is None or taken.get("done_at") is not None):
        out["resumed"] = "resumed" + (f" by {taken['worker']}" if taken else "")
        out["ended"] = f"{run.get('status')} ({run.get('reason')})"
    elif taken is not None:
        out["resumed"] = f"taken by {taken['worker']} at {when(taken['taken_at'])}, resuming"
        out["ended"] = ""
    else:
        out["resumed"], out["ended"] = "not yet: waiting for a worker (records.decisions())", ""
    return out
