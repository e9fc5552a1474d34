"""The overview: the last hour (runs by status and by stop reason, cost, the tools that
fail), then runs per day by status and by stop reason, cost per day and the tools that fail
most, over the last N days, drawn as charts (_charts)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.routing import Route

from tether.records._records import DAY
from tether.run._outcome import STATUSES
from tether.serve._charts import failing_tools, stacked_days
from tether.serve._site import Area, query_number

__all__ = ["Overview"]

HOUR = 3600.0


def _summed(per_day: Mapping[float, Mapping[str, int]]) -> dict[str, int]:
    """Counts per day, summed (an hour spans at most two UTC days), largest first."""
    total: dict[str, int] = {}
    for counts in per_day.values():
        for key, n in counts.items():
            total[key] = total.get(key, 0) + n
    return dict(sorted(total.items(), key=lambda kv: -kv[1]))


class Overview(Area):
    """/overview."""

    def routes(self) -> list[Route]:
        return [Route("/overview", self.site.page(self.overview))]

    def overview(self, request: Request) -> tuple[str, dict[str, Any]]:
        days = query_number(request, "days", 30, 1, 366)
        today = (self.site.clock() // DAY) * DAY
        since, until = today - (days - 1) * DAY, today + DAY
        view = self.site.records.runs.overview(since=since, until=until)
        statuses = [s for s in STATUSES if any(s in v for v in view.by_status.values())]
        reasons = sorted({r for v in view.by_reason.values() for r in v})
        totals = {s: sum(v.get(s, 0) for v in view.by_status.values()) for s in statuses}
        # what on-call needs first: the last hour, whatever the days shown below
        now = self.site.clock()
        hour = self.site.records.runs.overview(since=now - HOUR, until=now + 1)
        last_hour = {
            "by_status": _summed(hour.by_status),
            "by_reason": _summed(hour.by_reason),
            "cost": sum(hour.cost_usd.values()),
            "failing_tools": hour.failing_tools,
        }
        return "overview.html", {
            "last_hour": last_hour,
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
