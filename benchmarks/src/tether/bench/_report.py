"""Tables for the terminal, a Markdown report and its plots."""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tether.bench._columns import Column, Table, fixed, most, share, table, text
from tether.bench._summary import goal_holds

__all__ = ["markdown_tables", "print_tables", "strip_series", "write_report"]

#: the peers a row shows beside its own (the ratio under ``vs_<name>``)
BESIDE = ("insert_on_conflict", "set_nx_set")


def strip_series(results: dict[str, Any]) -> dict[str, Any]:
    """The results without the per-second series (kept for plots, not for --json)."""
    clean: dict[str, Any] = json.loads(json.dumps(results))
    for suite in ("fleet", "agents"):
        for scenario in clean.get("suites", {}).get(suite, {}).get("scenarios", {}).values():
            for cell in scenario["policies"].values():
                cell.pop("load_per_second", None)
                cell.pop("latency_samples", None)
    return clean


#: the agents suite: one policy in one scenario
AGENTS: list[Column] = [
    ("scenario", text("scenario")),
    ("policy", text("policy")),
    ("success", share("success")),
    ("escalated", share("escalated")),
    ("runaway", text("runaway")),
    ("dup. effects", text("duplicate_effects")),
    ("false stops", text("false_stops")),
    ("avg steps", fixed("avg_steps", 1)),
    ("p50 s", fixed("p50_latency_s", 1)),
    ("p95 s", fixed("p95_latency_s", 1)),
    ("cost $", fixed("cost_usd", 2)),
    ("dep. calls", text("dependency_calls")),
    ("stopped by", most("stopped", 2)),
]
#: the fleet suite: one policy in one scenario, against the scenario's lower bounds
FLEET: list[Column] = [
    ("scenario", text("scenario")),
    ("policy", text("policy")),
    ("success", share("success")),
    ("total calls", text("total_calls")),
    ("x lower bound", lambda r: f"{r['total_calls'] / r['bound']['lower_bound_calls']:.2f}"),
    ("peak load / capacity", fixed("peak_load_ratio", 2)),
    ("completion s", fixed("completion_s", 1)),
    ("x lower bound", lambda r: f"{r['completion_s'] / r['bound']['lower_bound_s']:.2f}"),
]
#: the provider-limits cells: one policy with its limits configured one way wrong
LIMITS: list[Column] = [
    ("policy", text("policy")),
    ("configured", lambda r: str(r["configured"]).removeprefix("configured-")),
    ("success", share("success")),
    ("429s / 1000 req", fixed("throttled_per_1000", 1)),
    ("ITPM used", lambda r: f"{r['input_share_of_limit']:.0%}"),
    ("OTPM used", lambda r: f"{r['output_share_of_limit']:.0%}"),
    ("p50 s", lambda r: _num(r["p50_completion_s"])),
    ("p95 s", lambda r: _num(r["p95_completion_s"])),
    ("longest wait s", fixed("longest_wait_s", 1)),
    ("store trips / call", fixed("store_round_trips_per_call", 2)),
]


def _cells(suite: dict[str, Any]) -> list[dict[str, Any]]:
    """A suite's figures as rows: each policy's in each scenario, with both names and the
    scenario's own figures (``bound``)."""
    return [
        {**m, "scenario": scenario, "policy": policy, "bound": entry}
        for scenario, entry in suite["scenarios"].items()
        for policy, m in entry["policies"].items()
    ]


def _rows(results: dict[str, Any], busy: str | None = None) -> dict[str, Table]:
    tables: dict[str, Table] = {}
    suites = results.get("suites", {})
    if "agents" in suites:
        tables["agents"] = table(AGENTS, _cells(suites["agents"]))
    if "fleet" in suites:
        fleet = _cells(suites["fleet"])
        if fleet:
            tables["fleet"] = table(FLEET, fleet)
        head = ["backoff", "calls", "completion s"]
        rows = [
            [j, str(m["calls"]), f"{m['completion_s']:.1f}"]
            for j, m in suites["fleet"].get("contention", {}).items()
        ]
        if rows:
            tables["contention (AWS backoff article experiment, 100 clients)"] = (head, rows)
    limits = suites.get("fleet", {}).get("provider-limits")
    if limits:
        cells = [
            {**m, "policy": policy, "configured": misconfig}
            for policy, by_misconfig in limits["policies"].items()
            for misconfig, m in by_misconfig.items()
        ]
        title = f"provider-limits ({limits['agents']} agents, limits configured 2x wrong)"
        tables[title] = table(LIMITS, cells)
    for scenario in ("tenants", "tenants-redis", "tenants-postgres"):
        tenants = suites.get("fleet", {}).get(scenario)
        if tenants:
            title, rows_of = _tenants(tenants)
            tables[title] = rows_of
    if "fleet-live" in suites:
        from tether.bench._live_report import live_tables

        tables.update(live_tables(suites["fleet-live"]))
    if "tau" in suites:
        from tether.bench._tau_report import tau_tables

        tables.update(tau_tables(suites["tau"]))
    if "tau-live" in suites:
        from tether.bench._tau_report import tau_live_tables

        tables.update(tau_live_tables(suites["tau-live"]))
    if "overhead" in suites:
        tables["overhead"] = overhead_rows(suites["overhead"], busy)
    if "soak" in suites:
        head = ["case", "impl", "ns per call", "vs floor / overhead"]
        rows = []
        for case, impls in suites["soak"].items():
            for impl, m in impls.items():
                if "summary" in m:  # the scale rows say what they measured
                    ns = f"{m['ns_per_call']:.0f}" if "ns_per_call" in m else ""
                    rows.append([case, impl, ns, m["summary"]])
                elif "ns_per_call" in m:
                    extra = f"{m['run_state_bytes'] / 1e6:.1f} MB of run state after {m['steps']:,} steps"
                    rows.append([case, impl, f"{m['ns_per_call']:.0f}", extra])
                else:
                    rows.append(
                        [
                            case,
                            impl,
                            "",
                            f"{m['bytes_after_all_steps']} B after {m['steps']} steps "
                            f"({m['bytes_after_10k_steps']} B after 10k)",
                        ]
                    )
        tables["soak"] = (head, rows)
    return tables


def _time(ns: float) -> str:
    if abs(ns) >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if abs(ns) >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def overhead_rows(suite: dict[str, Any], busy: str | None = None) -> Table:
    """The overhead suite's table: each row's implementations, ours against its peer; with
    ``busy`` (the machine's load, e.g. ``"load 12 on 2 cores"``) a goal that does not hold
    says it was measured so."""
    failed = f"does not hold ({busy})" if busy else "does not hold"
    head = ["case", "impl", "time", "vs peer: median (min-max)", "goal"]
    rows = []
    for case, impls in suite.items():
        for impl, m in impls.items():
            if "note" in m:
                rows.append([case, impl, "", m["note"], ""])
                continue
            per = m.get("per", "call")
            over = " over a bare call" if m.get("overhead_over_bare") else ""
            cell = f"{_time(m['ns_per_call'])} / {per}{over}"
            extra = []
            if "modules" in m:
                extra.append(f"{m['modules']} modules")
            if "round_trips_per_call" in m:
                extra.append(f"{m['round_trips_per_call']:g} round trips")
            if "json_encodings_per_call" in m:
                extra.append(
                    f"{m['json_encodings_per_call']:g} JSON encodings, "
                    f"{m['sha256_per_call']:g} SHA-256 per call"
                )
            if "start_ns" in m:
                extra.append(f"start {_time(m['start_ns'])}")
            if extra:
                cell += " (" + ", ".join(extra) + ")"
            ratio = ""
            if "ratio" in m:
                ratio = f"{m['ratio']:.2f}x {m['vs']} ({m['ratio_min']:.2f}-{m['ratio_max']:.2f})"
                for name in BESIDE:  # the other peers shown beside the row's own
                    if f"vs_{name}" in m:
                        ratio += f"; {m[f'vs_{name}']:.2f}x {name}"
            goal, held = "", goal_holds(m)  # as the summary counts it
            if held is not None:
                bound = f"{m['goal']:g}x" if "goal" in m else _time(m.get("goal_ns", 0.0))
                goal = f"<= {bound}: {'holds' if held else failed}"
            rows.append([case, impl, cell, ratio, goal])
    return head, rows


#: the widest line of a Markdown table in the report (a terminal's 80 columns)
MARKDOWN_WIDTH = 80


def _markdown_width(head: list[str], rows: list[list[str]], column: int) -> int:
    """A column's width in a Markdown table: its header and its widest cell, whole."""
    return max(len(head[column]), *(len(r[column]) for r in rows))


def fit_columns(
    head: list[str],
    rows: list[list[str]],
    width: int = MARKDOWN_WIDTH,
    measure: Callable[[list[str], list[list[str]], int], int] = _markdown_width,
) -> list[tuple[list[str], list[list[str]]]]:
    """The table as one or more tables whose lines fit ``width``: the first two columns
    (what a row is: scenario and policy) in each, the other columns packed in order. A
    table that fits stays whole; a column too wide on its own gets a table of its own.
    ``measure`` gives a column's width (its cells, its header); a drawn column takes 3 more
    (``"| cell "``, as a box's ``"│ cell "``), and the line 1 more."""

    def wide(column: int) -> int:
        return 3 + measure(head, rows, column)

    keys = list(range(min(2, len(head))))
    base = 1 + sum(wide(c) for c in keys)
    if base + sum(wide(c) for c in range(len(keys), len(head))) <= width:
        return [(head, rows)]
    groups: list[list[int]] = []
    used = base
    for column in range(len(keys), len(head)):
        if groups and used + wide(column) <= width:
            groups[-1].append(column)
            used += wide(column)
        else:
            groups.append([column])
            used = base + wide(column)
    return [([head[c] for c in keys + g], [[r[c] for c in keys + g] for r in rows]) for g in groups]


def markdown_tables(results: dict[str, Any]) -> str:
    from tether.bench._summary import summaries

    parts = ["### Summary\n", *(f"- {line}" for line in summaries(results)), ""]
    for title, (whole_head, whole_rows) in _rows(results).items():
        pieces = fit_columns(whole_head, whole_rows)
        for i, (head, rows) in enumerate(pieces, 1):
            part = f" ({i} of {len(pieces)}: {', '.join(head[2:])})" if len(pieces) > 1 else ""
            parts.append(f"### {title}{part}\n")
            parts.append("| " + " | ".join(head) + " |")
            parts.append("|" + "|".join("---" for _ in head) + "|")
            parts.extend("| " + " | ".join(r) + " |" for r in rows)
            parts.append("")
    return "\n".join(parts)


def narrow_table(title: str, head: list[str], rows: list[list[str]], width: int) -> str:
    """A table for a narrow terminal: each row a block, its first two cells as the block's
    heading and the others as ``header: value`` pairs filled into lines of ``width`` (a
    pair longer than a line wrapped between its words, never inside one)."""
    lines = textwrap.wrap(title, width, break_long_words=False, break_on_hyphens=False)
    lines.append("=" * min(len(title), width))
    for row in rows:
        lines.append(" / ".join(c for c in row[:2] if c))
        line = " "
        for h, cell in zip(head[2:], row[2:], strict=True):
            if not cell:  # nothing to say (a peer has no goal)
                continue
            pair = f" {h}: {cell};"
            if len(line) + len(pair) > width and line.strip():
                lines.append(line.rstrip(";"))
                line = " "
            if len(line) + len(pair) > width:  # one pair wider than a line: its words wrapped
                *whole, line = textwrap.wrap(
                    pair, width, initial_indent=" ", subsequent_indent="    ",
                    break_long_words=False, break_on_hyphens=False,
                )  # fmt: skip
                lines.extend(whole)
                continue
            line += pair
        if line.strip():
            lines.append(line.rstrip(";"))
    return "\n".join(lines) + "\n"


def _screen_width(head: list[str], rows: list[list[str]], column: int) -> int:
    """A column's width on the screen: its widest cell, or its header's longest word (the
    header is wrapped between its words)."""
    return max(*(len(w) for w in head[column].split()), *(len(r[column]) for r in rows))


def screen_width() -> int:
    """The width the tables are laid out for: the terminal's; piped or written to a file,
    ``$COLUMNS`` if it is set, else 80."""
    from rich.console import Console

    console = Console()
    if console.is_terminal:
        return console.width
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else MARKDOWN_WIDTH


def render_tables(results: dict[str, Any], width: int, busy: str | None = None) -> Iterator[Any]:
    """Every table of the results as rich renderables that fit ``width``: a table too wide is
    cut into tables that keep its first two columns (scenario, policy) with as many of the
    others as fit; one still too wide (a long cell) becomes one block per row. No cell is
    cut: a header wraps between its words, a cell never wraps."""
    from rich.table import Table
    from rich.text import Text

    for title, (whole_head, whole_rows) in _rows(results, busy).items():
        pieces = fit_columns(whole_head, whole_rows, width, _screen_width)
        measured = [(h, r, [_screen_width(h, r, c) for c in range(len(h))]) for h, r in pieces]
        if any(1 + sum(3 + w for w in widths) > width for _, _, widths in measured):
            yield Text(narrow_table(title, whole_head, whole_rows, width))
            continue
        for i, (head, rows, widths) in enumerate(measured, 1):
            name = f"{title} ({i} of {len(pieces)})" if len(pieces) > 1 else title
            drawn = Table(title=name, show_lines=False)
            for h, w in zip(head, widths, strict=True):
                header = textwrap.fill(h, w, break_long_words=False, break_on_hyphens=False)
                drawn.add_column(header, no_wrap=True, min_width=w)
            for r in rows:
                drawn.add_row(*r)
            yield drawn


def print_tables(results: dict[str, Any], loads: Sequence[float] = ()) -> None:
    """The tables for the terminal (80 columns piped), then a summary line per suite;
    ``loads``: the machine's load at the run's start and end, which marks the overhead goals
    that do not hold when it is above the cores."""
    try:
        from rich.console import Console
    except ImportError:  # the cli extra is not installed: plain text
        print(markdown_tables(results))
        return
    from tether.bench._summary import busy, summaries

    width = screen_width()
    console = Console(width=width)
    with console.capture() as captured:  # rich pads centred titles and wrapped lines
        for renderable in render_tables(results, width, busy(loads)):
            console.print(renderable, highlight=False, markup=False)
        for line in summaries(results):
            console.print(line, highlight=False, markup=False)
    print("\n".join(line.rstrip() for line in captured.get().splitlines()))


def write_report(results: dict[str, Any], directory: str, command: str) -> Path:
    """A Markdown report with PNG plots (matplotlib, the bench extra)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    images = _plots(results, out)
    lines = ["# tether bench report", "", f"Produced by `{command}` (seed {results['seed']}).", ""]
    lines.append(markdown_tables(results))
    for title, name in images:
        lines += [f"## {title}", "", f"![{title}]({name})", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    (out / "results.json").write_text(json.dumps(strip_series(results), indent=2))
    return path


def _plots(results: dict[str, Any], out: Path) -> list[tuple[str, str]]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    images: list[tuple[str, str]] = []
    suites = results.get("suites", {})
    if "tau" in suites:
        from tether.bench._tau_report import tau_plot

        images += tau_plot(suites["tau"], out, plt)
    if "agents" in suites:
        cells = suites["agents"]["scenarios"]
        for name, rows, title in _AGENT_PLOTS:
            images.append(_agent_bars(plt, cells, out, name, rows, title))
        images.append(_latency(plt, cells, out))
    if "fleet" in suites:
        for scenario, entry in suites["fleet"]["scenarios"].items():
            images.append(_fleet(plt, scenario, entry, out))
    return images


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _share(v: float) -> str:
    return f"{v * 100:.1f}".rstrip("0").rstrip(".") + "%"  # 99.5% is not 100%


def _count(v: float) -> str:
    return f"{v:,.0f}"


def _dollars(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.2f}"


def _legend(fig: Any, handles: list[Any], labels: list[str]) -> None:
    """One legend for the figure, above the plots (never over the data)."""
    fig.legend(
        handles,
        labels,
        loc="upper center",
        ncol=len(labels),
        frameon=False,
        bbox_to_anchor=(0.5, 1.0),
        fontsize=10,
    )


#: the agents suite's bar charts: file, (metric, label, how shown) per panel, title
_AGENT_PLOTS: list[tuple[str, list[tuple[str, str, Any]], str]] = [
    (
        "agents.png",
        [
            ("success", "tasks that reached their goal", _share),
            ("escalated", "tasks handed to a person", _share),
        ],
        "Success and escalation per scenario and policy",
    ),
    (
        "agents-effects.png",
        [
            ("duplicate_effects", "duplicate effects (payments made twice...)", _count),
            ("cost_usd", "model cost of the tasks ($, log scale)", _dollars),
        ],
        "Duplicate effects and cost per scenario and policy",
    ),
]


def _agent_bars(
    plt: Any,
    cells: dict[str, Any],
    out: Path,
    name: str,
    metrics: list[tuple[str, str, Any]],
    title: str,
) -> tuple[str, str]:
    fig = bars_figure(plt, cells, metrics)
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return title, name


def bars_figure(plt: Any, cells: dict[str, Any], metrics: list[tuple[str, str, Any]]) -> Any:
    """Grouped bars, one panel per metric: every bar labelled with its value, a zero drawn
    as a mark on the axis with its "0", the scenario names under every panel, the legend
    above the panels."""
    scenarios = list(cells)
    policies = list(next(iter(cells.values()))["policies"])
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    width = 0.8 / len(policies)
    fig, axes = plt.subplots(len(metrics), 1, figsize=(15, 4.6 * len(metrics)), squeeze=False)
    handles: list[Any] = []
    for ax, (metric, label, fmt) in zip((row[0] for row in axes), metrics, strict=True):
        values = {p: [float(cells[s]["policies"][p][metric]) for s in scenarios] for p in policies}
        top = max((v for vs in values.values() for v in vs), default=0.0)
        log = metric == "cost_usd" and top > 0
        if log:
            ax.set_yscale("log")
            low = min(v for vs in values.values() for v in vs if v > 0)
            ax.set_ylim(low / 3, top * 8)
            ax.yaxis.set_major_formatter(
                plt.FuncFormatter(lambda v, _: f"${v:,.0f}" if v >= 1 else f"${v:g}")
            )
        elif metric in ("success", "escalated"):
            ax.set_ylim(0, 1.2)  # room for the labels above 100%
            ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
            ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:.0%}"))
        else:
            ax.set_ylim(0, (top or 1.0) * 1.25)
        for i, policy in enumerate(policies):
            xs = [x + (i - (len(policies) - 1) / 2) * width for x in range(len(scenarios))]
            colour = colours[i % len(colours)]
            bars = ax.bar(xs, values[policy], width * 0.92, color=colour, label=policy)
            if len(handles) < len(policies):
                handles.append(bars)
            for x, v in zip(xs, values[policy], strict=True):
                base = ax.get_ylim()[0]
                if v == 0:  # nothing to draw as a bar: a mark on the axis, and its value
                    ax.plot(
                        [x - width * 0.45, x + width * 0.45],
                        [base, base],
                        color=colour,
                        linewidth=3,
                        solid_capstyle="butt",
                        clip_on=False,
                    )
                ax.annotate(
                    fmt(v),
                    (x, v if v > 0 else base),
                    xytext=(0, 3),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    rotation=90,
                    fontsize=7,
                )
        ax.set_ylabel(label)
        ax.set_xticks(range(len(scenarios)), scenarios, rotation=20, ha="right")
        ax.set_xlim(-0.6, len(scenarios) - 0.4)
        ax.grid(axis="y", alpha=0.3)
    tasks = next(iter(next(iter(cells.values()))["policies"].values())).get("tasks")
    if tasks:
        fig.suptitle(f"{tasks} tasks per scenario and policy", y=0.955, fontsize=9)
    _legend(fig, handles, policies)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return fig


def _latency(plt: Any, cells: dict[str, Any], out: Path) -> tuple[str, str]:
    """The latency CDF of each scenario: policies told apart by colour and line style (an
    identical curve stays visible under another), the median marked, numbered ticks."""
    import matplotlib.ticker

    scenarios = list(cells)
    policies = list(next(iter(cells.values()))["policies"])
    styles = ["-", "--", "-.", ":"]
    cols = 4
    rows = (len(scenarios) + cols - 1) // cols
    fig, grid = plt.subplots(rows, cols, figsize=(16, 3.4 * rows), squeeze=False)
    handles: dict[str, Any] = {}
    for k, scenario in enumerate(scenarios):
        ax = grid[k // cols][k % cols]
        for i, policy in enumerate(policies):
            samples = cells[scenario]["policies"][policy].get("latency_samples") or []
            if not samples:
                continue
            ys = [(n + 1) / len(samples) for n in range(len(samples))]
            (line,) = ax.step(
                samples,
                ys,
                where="post",
                linestyle=styles[i % len(styles)],
                linewidth=2.6 - 0.5 * i,
                label=policy,
            )
            median = samples[len(samples) // 2]
            ax.plot([median], [0.5], marker="o", markersize=4, color=line.get_color())
            handles.setdefault(policy, line)
        seen = [
            x for p in policies for x in cells[scenario]["policies"][p].get("latency_samples") or ()
        ]
        low, high = (min(seen), max(seen)) if seen else (0.0, 0.0)
        if low > 0 and high / low >= 10:  # a wide range: log, with 1-2-5 ticks numbered
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(plt.FuncFormatter(_seconds))
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_title(scenario, fontsize=10)
        ax.set_ylim(0, 1.04)
        ax.grid(alpha=0.3)
    for k in range(len(scenarios), rows * cols):
        grid[k // cols][k % cols].axis("off")
    _legend(fig, list(handles.values()), list(handles))
    fig.supxlabel(
        "simulated latency per task (s; log scale where the range is wide; a dot marks the median)"
    )
    fig.supylabel("fraction of tasks done within")
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(out / "latency.png", dpi=100)
    plt.close(fig)
    return "Latency CDF per scenario and policy", "latency.png"


def _seconds(value: float, _: Any) -> str:
    return f"{value / 1000:g}k" if value >= 1000 else f"{value:.3g}"


def _fleet(plt: Any, scenario: str, entry: dict[str, Any], out: Path) -> tuple[str, str]:
    """Offered load of every policy against the capacity line: over the whole run (none cut
    off) and, below, over the time the other policies needed when one runs much longer."""
    runs = {
        p: [v / entry["capacity_rps"] for v in m.get("load_per_second") or []]
        for p, m in entry["policies"].items()
    }
    lengths = sorted((len(series) for series in runs.values()), reverse=True)
    longest = max(lengths[0] if lengths else 1, 1)
    others = lengths[1] if len(lengths) > 1 else longest
    spans = [(longest, "the whole run")]
    if longest > 2 * others:  # one policy's tail would squeeze the rest into a sliver
        spans.append(
            (max(others + others // 5, 10), f"the first {max(others + others // 5, 10)} s")
        )
    fig, axes = plt.subplots(len(spans), 1, figsize=(11, 4.2 * len(spans)), squeeze=False)
    for ax, (until, what) in zip((row[0] for row in axes), spans, strict=True):
        for policy, series in runs.items():
            ax.plot(range(len(series)), series, label=policy)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="capacity")
        ax.set_yscale("symlog", linthresh=1.0)
        top = ax.get_ylim()[1]
        ticks = [t for t in (0, 0.25, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if t <= top]
        ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
        ax.set_ylim(0, top)
        ax.set_xlim(0, until)
        ax.set_xlabel("seconds")
        ax.set_ylabel("offered load / capacity (symlog)")
        ax.set_title(f"fleet: {scenario}, {what}")
        ax.grid(alpha=0.3)
    axes[0][0].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    name = f"fleet-{scenario}.png"
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return f"Offered load over time ({scenario})", name


def _tenants(tenants: dict[str, Any]) -> tuple[str, Table]:
    """The tenants scenario's table (one store's)."""
    head = ["policy", "low tenants over", "max overspend", "total overspend",
            "<= 1 call/run", "others completed", "paused -> resumed", "ms / call"]  # fmt: skip
    rows = []
    for policy, m in tenants["policies"].items():
        resumed = f"{m['paused_runs']} -> {m['resumed_completed']}" if "paused_runs" in m else "-"
        rows.append([
            policy,
            f"{m['low_tenants_over']}/{m['low_tenants']}",
            f"${m['max_overspend_usd']:.4f} ({m['max_overspend_pct']:.1f}%)",
            f"${m['total_overspend_usd']:.4f}",
            "yes" if m["within_one_call_per_run"] else "no",
            f"{m['other_tenants_runs_completed']:.0%}",
            resumed,
            f"{m['ms_per_call']:.2f}" if "ms_per_call" in m else "-",
        ])  # fmt: skip
    any_cell = next(iter(tenants["policies"].values()))
    store = any_cell.get("store", "memory")
    title = (
        f"tenants ({any_cell['tenants']} tenants x {any_cell['runs_per_tenant']} runs, "
        f"{any_cell['low_tenants']} with ${any_cell['low_limit_usd']:g} limits"
        + ("" if store == "memory" else f"; scopes in {store}")
        + ")"
    )
    return title, (head, rows)
