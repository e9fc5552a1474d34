"""The tau suite's tables and plot (the report module calls these)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["tau_live_tables", "tau_plot", "tau_tables"]

Table = tuple[list[str], list[list[str]]]


def _pct(value: float) -> str:
    return f"{value:.1%}"


def tau_tables(tau: dict[str, Any]) -> dict[str, Table]:
    """Per domain: pass^1 / pass^4 by λ for each policy, then every metric per policy and λ."""
    tables: dict[str, Table] = {}
    for domain, entry in tau["scenarios"].items():
        lams = list(entry["lambda"])
        policies = list(next(iter(entry["lambda"].values()))["policies"]) if lams else []
        head = [
            "policy",
            *(f"λ={lam} pass^1 / pass^4" for lam in lams),
            "dup. effects",
            "dishonest endings",
        ]
        rows = []
        for policy in policies:
            cells = [entry["lambda"][lam]["policies"][policy] for lam in lams]
            rows.append(
                [
                    policy,
                    *(f"{_pct(c['pass^1'])} / {_pct(c['pass^4'])}" for c in cells),
                    str(sum(c["duplicate_effects"] for c in cells)),
                    str(sum(c["dishonest_endings"] for c in cells)),
                ]
            )
        title = (
            f"tau {domain}: {entry['tasks']} tasks x {entry['seeds']} seeds, graded by the database "
            f"(wall {tau.get('wall_s', 0):g} s)"
        )
        tables[title] = (head, rows)
        head = [
            "λ",
            "policy",
            "pass^1",
            "pass^2",
            "pass^3",
            "pass^4",
            "dup. effects",
            "dishonest",
            "tool execs",
            "model calls",
            "tokens",
            "cost $",
            "p50 s",
            "p95 s",
            "endings",
        ]
        rows = []
        for lam in lams:
            for policy, m in entry["lambda"][lam]["policies"].items():
                endings = ", ".join(
                    f"{k} {v}" for k, v in sorted(m["endings"].items(), key=lambda kv: -kv[1])[:3]
                )
                rows.append(
                    [
                        lam,
                        policy,
                        *(_pct(m.get(f"pass^{k}", 0.0)) for k in range(1, 5)),
                        str(m["duplicate_effects"]),
                        str(m["dishonest_endings"]),
                        str(m["tool_executions"]),
                        str(m["model_calls"]),
                        f"{m['tokens']:,}",
                        f"{m['cost_usd']:.2f}",
                        f"{m['p50_s']:.1f}",
                        f"{m['p95_s']:.1f}",
                        endings,
                    ]
                )
        tables[f"tau {domain}: every metric"] = (head, rows)
    return tables


def tau_live_tables(live: dict[str, Any]) -> dict[str, Table]:
    """Per domain: one row per policy of the live mode (a worker killed after a write)."""
    tables: dict[str, Table] = {}
    for domain, entry in live["scenarios"].items():
        head = [
            "policy",
            "tasks",
            "pass",
            "workers killed",
            "writes run twice",
            "dup. effects",
            "dishonest endings",
            "p50 s",
        ]
        rows = [
            [
                policy,
                str(m["tasks"]),
                _pct(m["pass"]),
                str(m["killed"]),
                str(m["writes_executed_twice"]),
                str(m["duplicate_effects"]),
                str(m["dishonest_endings"]),
                f"{m['p50_s']:.2f}",
            ]
            for policy, m in entry["policies"].items()
        ]
        tables[
            f"tau-live {domain}: a worker killed between a write and its record ({entry['lease_s']:g} s lease)"
        ] = (head, rows)
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
