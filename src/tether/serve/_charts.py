"""Charts of the overview page, drawn on the server as SVG (no script, no CDN).

Stacked bars per UTC day (runs by status, stops by reason, cost) and horizontal bars for
the tools that fail most. Every label is escaped and redacted; each bar carries its value
in a ``<title>`` (shown on hover) and the legend sits above the plot, never over it.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence

from markupsafe import Markup, escape

from tether.redaction._redact import redact

__all__ = ["failing_tools", "stacked_days"]

STATUS_COLOURS = {
    "success": "#12b76a",
    "partial": "#f79009",
    "failed": "#f04438",
    "escalated": "#2e90fa",
    "awaiting_approval": "#fdb022",
    "paused": "#7a5af8",
}
PALETTE = (
    "#7a5af8",
    "#ee46bc",
    "#06aed4",
    "#f04438",
    "#f79009",
    "#2e90fa",
    "#12b76a",
    "#667085",
    "#a15c07",
    "#6172f3",
)
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 960, 240, 56, 16, 44, 28


def colour(key: str, index: int) -> str:
    return STATUS_COLOURS.get(key) or PALETTE[index % len(PALETTE)]


def _label(text: str) -> Markup:
    return escape(str(redact(text)))


def _day(start: float) -> str:
    return datetime.datetime.fromtimestamp(start, tz=datetime.UTC).strftime("%m-%d")


def _nice(top: float) -> float:
    """A round axis maximum at or above ``top``."""
    if top <= 0:
        return 1.0
    step = 10 ** len(str(int(top))) / 10 if top >= 1 else 0.1
    while step * 10 < top:
        step *= 10
    for mult in (1, 2, 2.5, 5, 10):
        if step * mult >= top:
            return step * mult
    return step * 10


def stacked_days(
    days: Sequence[float],
    values: Mapping[float, Mapping[str, float]],
    *,
    keys: Sequence[str],
    title: str,
    fmt: Callable[[float], str] = lambda v: f"{v:g}",
) -> Markup:
    """One stacked bar per day, a segment per key; the legend above the plot."""
    top = _nice(max((sum(values.get(d, {}).values()) for d in days), default=0.0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(1, len(days))
    bar = max(1.0, slot * 0.8)
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{_label(title)}" xmlns="http://www.w3.org/2000/svg">',
        f'<text x="{LEFT}" y="14" class="title">{_label(title)}</text>',
    ]
    x = LEFT
    for i, key in enumerate(keys):  # the legend, in a row above the plot
        parts.append(
            f'<rect x="{x}" y="24" width="10" height="10" fill="{colour(key, i)}"/>'
            f'<text x="{x + 14}" y="33">{_label(key)}</text>'
        )
        x += 24 + 7 * len(key)
    for frac in (0.0, 0.5, 1.0):  # the axis: 0, the middle and the top, labelled
        y = TOP + plot_h * (1 - frac)
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(fmt(top * frac))}</text>'
        )
    every = max(1, len(days) // 10)
    for n, day in enumerate(days):
        x0 = LEFT + n * slot + (slot - bar) / 2
        y = TOP + plot_h
        stack = values.get(day, {})
        for i, key in enumerate(keys):
            value = float(stack.get(key, 0.0))
            if value <= 0:
                continue
            h = plot_h * value / top
            y -= h
            parts.append(
                f'<rect x="{x0:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{colour(key, i)}"><title>{_day(day)} {_label(key)}: '
                f"{escape(fmt(value))}</title></rect>"
            )
        if n % every == 0 or n == len(days) - 1:
            parts.append(
                f'<text x="{x0 + bar / 2:.1f}" y="{HEIGHT - 10}" text-anchor="middle">'
                f"{_day(day)}</text>"
            )
    parts.append("</svg>")
    return Markup("".join(parts))


def failing_tools(rows: Sequence[tuple[str, int, int]], *, title: str) -> Markup:
    """A horizontal bar per tool: its failed calls, labelled with failures of calls."""
    height = TOP + 24 * max(1, len(rows)) + 8
    top = max((f for _, f, _ in rows), default=0) or 1
    name_w, plot_w = 220, WIDTH - 220 - 160
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-label="{_label(title)}" xmlns="http://www.w3.org/2000/svg">',
        f'<text x="{LEFT}" y="14" class="title">{_label(title)}</text>',
    ]
    if not rows:
        parts.append(
            f'<text x="{LEFT}" y="{TOP}" class="muted">No tool failed in this window.</text>'
        )
    for n, (tool, failures, calls) in enumerate(rows):
        y = TOP + 24 * n
        w = max(1.0, plot_w * failures / top)
        parts.append(
            f'<text x="{name_w - 8}" y="{y + 14}" text-anchor="end">{_label(tool[:40])}</text>'
            f'<rect x="{name_w}" y="{y}" width="{w:.1f}" height="18" fill="#f04438">'
            f"<title>{_label(tool)}: {failures} of {calls} calls failed</title></rect>"
            f'<text x="{name_w + w + 6:.1f}" y="{y + 14}">{failures} of {calls} calls failed '
            f"({100 * failures / max(1, calls):.0f}%)</text>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))
