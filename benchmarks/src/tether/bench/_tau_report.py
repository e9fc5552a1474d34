"""The tau suite's tables and plot (the report module calls these)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tether.bench._columns import (
    Cell,
    Column,
    Table,
    fixed,
    most,
    share,
    table,
    text,
    thousands,
)

__all__ = ["tau_live_tables", "tau_plot", "tau_tables"]

#: every metric of one policy at one fault rate λ
METRICS: list[Column] = [
    ("λ", text("lam")),
    ("policy", text("policy")),
    *((f"pass^{k}", share(f"pass^{k}", undefined=True)) for k in range(1, 5)),
    ("dup. effects", text("duplicate_effects")),
    ("dishonest", text("dishonest_endings")),
    ("tool execs", text("tool_executions")),
    ("model calls", text("model_calls")),
    ("tokens", thousands("tokens")),
    ("cost $", fixed("cost_usd", 2)),
    ("p50 s", fixed("p50_s", 1)),
    ("p95 s", fixed("p95_s", 1)),
    ("endings", most("endings", 3)),
]
#: the live mode: one policy
LIVE: list[Column] = [
    ("policy", text("policy")),
    ("tasks", text("tasks")),
    ("pass", share("pass")),
    ("workers killed", text("killed")),
    ("writes run twice", text("writes_executed_twice")),
    ("dup. effects", text("duplicate_effects")),
    ("dishonest endings", text("dishonest_endings")),
    ("p50 s", fixed("p50_s", 2)),
]


def tau_tables(tau: dict[str, Any]) -> dict[str, Table]:
    """Per domain: pass^1 / pass^k (k the seeds: the highest measured) by λ for each
    policy, then every metric per policy and λ."""
    tables: dict[str, Table] = {}
    for domain, entry in tau["scenarios"].items():
        lams = list(entry["lambda"])
        policies = list(next(iter(entry["lambda"].values()))["policies"]) if lams else []
        top = f"pass^{entry['seeds']}"  # the highest k the run measured
        by_lam: list[Column] = [
            (f"λ={lam} pass^1", share_at(lam, "pass^1"))
            if top == "pass^1"
            else (f"λ={lam} pass^1 / {top}", _both(lam, "pass^1", top))
            for lam in lams
        ]
        summary: list[Column] = [
            ("policy", text("policy")),
            *by_lam,
            ("dup. effects", _total("duplicate_effects", lams)),
            ("dishonest endings", _total("dishonest_endings", lams)),
        ]
        title = (
            f"tau {domain}: {entry['tasks']} tasks x {entry['seeds']} seeds, graded by the database "
            f"(wall {tau.get('wall_s', 0):g} s)"
        )
        per_policy = [
            {"policy": p, "cells": {lam: entry["lambda"][lam]["policies"][p] for lam in lams}}
            for p in policies
        ]
        tables[title] = table(summary, per_policy)
        tables[f"tau {domain}: every metric"] = table(
            METRICS,
            (
                {**m, "lam": lam, "policy": policy}
                for lam in lams
                for policy, m in entry["lambda"][lam]["policies"].items()
            ),
        )
    return tables


def _both(lam: str, first: str, second: str) -> Cell:
    """Two shares of a policy at one λ: ``"a% / b%"`` (``—`` for one a run with fewer
    seeds has not measured, as in the table of every metric)."""
    one, two = share(first, undefined=True), share(second, undefined=True)
    return lambda row: f"{one(row['cells'][lam])} / {two(row['cells'][lam])}"


def share_at(lam: str, key: str) -> Cell:
    """One share of a policy at one λ."""
    one = share(key, undefined=True)
    return lambda row: one(row["cells"][lam])


def _total(key: str, lams: list[str]) -> Cell:
    """A count of a policy summed over every λ."""
    return lambda row: str(sum(row["cells"][lam][key] for lam in lams))


def tau_live_tables(live: dict[str, Any]) -> dict[str, Table]:
    """Per domain: one row per policy of the live mode (a worker killed after a write)."""
    tables: dict[str, Table] = {}
    for domain, entry in live["scenarios"].items():
        rows = ({**m, "policy": policy} for policy, m in entry["policies"].items())
        tables[
            f"tau-live {domain}: a worker killed between a write and its record ({entry['lease_s']:g} s lease)"
        ] = table(LIVE, rows)
    return tables


def tau_plot(tau: dict[str, Any], out: Path, plt: Any) -> list[tuple[str, str]]:
    """pass^1, pass^4 and dishonest endings against λ, one line per policy, per domain."""
    images = []
    for domain, entry in tau["scenarios"].items():
        lams = list(entry["lambda"])
        xs = [float(lam) for lam in lams]
        policies = list(next(iter(entry["lambda"].values()))["policies"]) if lams else []
        fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
        colors = plt.get_cmap("tab20")
        for i, policy in enumerate(policies):
            cells = [entry["lambda"][lam]["policies"][policy] for lam in lams]
            style: dict[str, Any] = {"color": colors(i % 20)}
            style.update({"linewidth": 2.4} if policy.startswith("tether") else {"linestyle": "--"})
            axes[0].plot(xs, [c["pass^1"] for c in cells], marker="o", label=policy, **style)
            axes[1].plot(xs, [c["pass^4"] for c in cells], marker="o", label=policy, **style)
            axes[2].plot(
                xs, [c["dishonest_endings"] for c in cells], marker="o", label=policy, **style
            )
        for ax, title in zip(axes, ("pass^1", "pass^4", "dishonest endings"), strict=True):
            ax.set_title(title)
            ax.set_xlabel("fault rate λ")
            ax.set_xticks(xs)
            ax.grid(alpha=0.3)
        axes[0].set_ylim(0, 1.02)
        axes[1].set_ylim(0, 1.02)
        axes[2].set_ylabel("episodes")
        axes[2].legend(fontsize=8, loc="upper left")
        same: dict[tuple[float, ...], list[str]] = {}
        for policy in policies:
            series = tuple(
                entry["lambda"][lam]["policies"][policy][key]
                for lam in lams
                for key in ("pass^1", "pass^4", "dishonest_endings")
            )
            same.setdefault(series, []).append(policy)
        overlaps = ["; ".join(", ".join(group) for group in same.values() if len(group) > 1)]
        if overlaps[0]:
            note = f"same figures (lines on top of each other): {overlaps[0]}"
            fig.text(0.5, 0.005, note, ha="center", fontsize=8)
        fig.suptitle(
            f"τ²-bench {domain}: {entry['tasks']} tasks x {entry['seeds']} seeds per λ, graded by the database"
        )
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        name = f"tau-{domain}.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        images.append((f"τ² {domain}: pass^k and dishonest endings by fault rate", name))
    return images
