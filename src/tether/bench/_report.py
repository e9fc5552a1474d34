"""Tables for the terminal, a Markdown report and its plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["markdown_tables", "print_tables", "strip_series", "write_report"]


def strip_series(results: dict[str, Any]) -> dict[str, Any]:
    """The results without the per-second series (kept for plots, not for --json)."""
    clean: dict[str, Any] = json.loads(json.dumps(results))
    for suite in ("fleet", "agents"):
        for scenario in clean.get("suites", {}).get(suite, {}).get("scenarios", {}).values():
            for cell in scenario["policies"].values():
                cell.pop("load_per_second", None)
                cell.pop("latency_samples", None)
    return clean


def _rows(results: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    tables: dict[str, tuple[list[str], list[list[str]]]] = {}
    suites = results.get("suites", {})
    if "agents" in suites:
        head = ["scenario", "policy", "success", "escalated", "runaway", "dup. effects", "false stops",
                "avg steps", "p50 s", "p95 s", "cost $", "dep. calls", "stopped by"]  # fmt: skip
        rows = []
        for scenario, cell in suites["agents"]["scenarios"].items():
            for policy, m in cell["policies"].items():
                stops = ", ".join(
                    f"{k} {v}" for k, v in sorted(m["stopped"].items(), key=lambda kv: -kv[1])[:2]
                )
                rows.append([scenario, policy, f"{m['success']:.1%}", f"{m['escalated']:.1%}", str(m["runaway"]),
                             str(m["duplicate_effects"]), str(m["false_stops"]), f"{m['avg_steps']:.1f}",
                             f"{m['p50_latency_s']:.1f}", f"{m['p95_latency_s']:.1f}", f"{m['cost_usd']:.2f}",
                             str(m["dependency_calls"]), stops])  # fmt: skip
        tables["agents"] = (head, rows)
    if "fleet" in suites:
        head = ["scenario", "policy", "success", "total calls", "x lower bound", "peak load / capacity",
                "completion s", "x lower bound"]  # fmt: skip
        rows = []
        for scenario, entry in suites["fleet"]["scenarios"].items():
            for policy, m in entry["policies"].items():
                rows.append([scenario, policy, f"{m['success']:.1%}", str(m["total_calls"]),
                             f"{m['total_calls'] / entry['lower_bound_calls']:.2f}",
                             f"{m['peak_load_ratio']:.2f}", f"{m['completion_s']:.1f}",
                             f"{m['completion_s'] / entry['lower_bound_s']:.2f}"])  # fmt: skip
        tables["fleet"] = (head, rows)
        head = ["backoff", "calls", "completion s"]
        rows = [
            [j, str(m["calls"]), f"{m['completion_s']:.1f}"]
            for j, m in suites["fleet"]["contention"].items()
        ]
        tables["contention (AWS backoff article experiment, 100 clients)"] = (head, rows)
    if "fleet-live" in suites:
        head = ["scenario", "run", "success", "calls", "x bound", "peak / capacity", "completion s",
                "x bound", "Redis round trips / call"]  # fmt: skip
        rows = []
        for scenario, e in suites["fleet-live"]["scenarios"].items():
            for run in ("live", "simulated"):
                m = e[run]
                done = m["completion_s"]
                rows.append([scenario, run, f"{m['success']:.1%}", str(m["total_calls"]),
                             f"{m['total_calls'] / e['lower_bound_calls']:.2f}", f"{m['peak_load_ratio']:.2f}",
                             "-" if done is None else f"{done:.1f}",
                             "-" if done is None else f"{done / e['lower_bound_s']:.2f}",
                             f"{m['round_trips_per_call']:.2f}" if "round_trips_per_call" in m else ""])  # fmt: skip
        tables[f"fleet-live ({e['clients']} clients in {e['workers']} processes, {e['capacity_rps']} req/s)"] = (
            head, rows)  # fmt: skip
        load = suites["fleet-live"].get("redis_load")
        if load:
            shard = load["shard"]
            title = (f"Redis load of a fleet (per client: {load['per_client']['outage']:.3f} round trips/s in an "
                     f"outage, {load['per_client']['recovery']:.3f} in recovery; one shard here: "
                     f"{shard['ops_per_s']:,} script calls/s, planned at {load['headroom']:.0%})")  # fmt: skip
            rows = [[f"{int(n):,}", f"{m['outage_ops_per_s']:,}", f"{m['recovery_ops_per_s']:,}", str(m["shards"])]
                    for n, m in load["fleets"].items()]  # fmt: skip
            tables[title] = (["clients", "ops/s in an outage", "ops/s in recovery", "shards"], rows)
    if "overhead" in suites:
        head = ["case", "impl", "ns per call", "vs floor / overhead"]
        rows = []
        for case, impls in suites["overhead"].items():
            for impl, m in impls.items():
                if "note" in m:
                    rows.append([case, impl, "", m["note"]])
                elif "ns_per_call" in m:
                    extra = ""
                    if "ratio" in m:
                        extra = f"{m['ratio']:.2f}x the floor"
                    elif "overhead_ns" in m:
                        extra = f"+{m['overhead_ns']:.0f} ns over a bare call"
                    elif "round_trips_per_call" in m:
                        extra = f"{m['round_trips_per_call']:g} round trips per call"
                    elif "run_state_bytes" in m:
                        extra = f"{m['run_state_bytes'] / 1e6:.1f} MB of run state after {m['steps']:,} steps"
                    rows.append([case, impl, f"{m['ns_per_call']:.0f}", extra])
                else:
                    rows.append([case, impl, "", f"{m['bytes_after_all_steps']} B after {m['steps']} steps "
                                 f"({m['bytes_after_10k_steps']} B after 10k)"])  # fmt: skip
        tables["overhead"] = (head, rows)
    return tables


def markdown_tables(results: dict[str, Any]) -> str:
    parts = []
    for title, (head, rows) in _rows(results).items():
        parts.append(f"### {title}\n")
        parts.append("| " + " | ".join(head) + " |")
        parts.append("|" + "|".join("---" for _ in head) + "|")
        parts.extend("| " + " | ".join(r) + " |" for r in rows)
        parts.append("")
    return "\n".join(parts)


def print_tables(results: dict[str, Any]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # the cli extra is not installed: plain text
        print(markdown_tables(results))
        return
    console = Console(width=None if Console().is_terminal else 200)
    for title, (head, rows) in _rows(results).items():
        table = Table(title=title, show_lines=False)
        for h in head:
            table.add_column(h, overflow="fold")
        for r in rows:
            table.add_row(*r)
        console.print(table)


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
    images = []
    suites = results.get("suites", {})
    if "agents" in suites:
        scenarios = list(suites["agents"]["scenarios"])
        policies = list(next(iter(suites["agents"]["scenarios"].values()))["policies"])
        fig, axes = plt.subplots(2, 1, figsize=(13, 8), sharex=True)
        width = 0.8 / len(policies)
        for k, metric in enumerate(["success", "escalated"]):
            for i, policy in enumerate(policies):
                values = [
                    suites["agents"]["scenarios"][s]["policies"][policy][metric] for s in scenarios
                ]
                axes[k].bar(
                    [x + i * width for x in range(len(scenarios))], values, width, label=policy
                )
            axes[k].set_ylabel(metric)
            axes[k].set_ylim(0, 1.05)
        axes[0].legend(ncol=len(policies))
        axes[1].set_xticks(
            [x + 0.4 - width / 2 for x in range(len(scenarios))], scenarios, rotation=30, ha="right"
        )
        fig.tight_layout()
        fig.savefig(out / "agents.png", dpi=110)
        plt.close(fig)
        images.append(("Success and escalation per scenario and policy", "agents.png"))
        cols = 4
        rows = (len(scenarios) + cols - 1) // cols
        fig, grid = plt.subplots(rows, cols, figsize=(16, 3.2 * rows), squeeze=False)
        for k, scenario in enumerate(scenarios):
            ax = grid[k // cols][k % cols]
            for policy in policies:
                samples = (
                    suites["agents"]["scenarios"][scenario]["policies"][policy].get(
                        "latency_samples"
                    )
                    or []
                )
                if samples:
                    ax.plot(
                        samples, [(i + 1) / len(samples) for i in range(len(samples))], label=policy
                    )
            ax.set_xscale("symlog", linthresh=10.0)
            ax.set_title(scenario, fontsize=10)
            ax.set_ylim(0, 1.02)
        for k in range(len(scenarios), rows * cols):
            grid[k // cols][k % cols].axis("off")
        grid[0][0].legend(fontsize=8)
        fig.supxlabel("simulated latency per task (s)")
        fig.supylabel("fraction of tasks")
        fig.tight_layout()
        fig.savefig(out / "latency.png", dpi=100)
        plt.close(fig)
        images.append(("Latency CDF per scenario and policy", "latency.png"))
    if "fleet" in suites:
        for scenario, entry in suites["fleet"]["scenarios"].items():
            fig, ax = plt.subplots(figsize=(10, 5))
            for policy, m in entry["policies"].items():
                series = m.get("load_per_second") or []
                ax.plot(
                    range(len(series)), [v / entry["capacity_rps"] for v in series], label=policy
                )
            ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
            ax.set_yscale("symlog", linthresh=1.0)
            ax.set_ylim(bottom=0)
            ax.set_xlim(0, 130)
            ax.set_xlabel("seconds")
            ax.set_ylabel("offered load / capacity")
            ax.set_title(f"fleet: {scenario}")
            ax.legend()
            fig.tight_layout()
            name = f"fleet-{scenario}.png"
            fig.savefig(out / name, dpi=110)
            plt.close(fig)
            images.append((f"Offered load over time ({scenario})", name))
    return images
