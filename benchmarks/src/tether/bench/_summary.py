"""One line per suite saying what the run showed, for the reader who will not read the tables:
tether's figures first, then its peers' on the same measure."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

__all__ = ["load_note", "summaries"]

#: the one-minute load per core above which the overhead suite's timings are noisy
BUSY = 0.75


def _policies(cells: Iterable[tuple[str, dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Every cell of each policy, the policies in the order they first appear."""
    found: dict[str, list[dict[str, Any]]] = {}
    for policy, m in cells:
        found.setdefault(policy, []).append(m)
    return found


def _ours_first(names: Iterable[str]) -> list[str]:
    return sorted(names, key=lambda p: (p != "tether", not p.startswith("tether"), p))


def _grouped(figures: dict[str, str]) -> str:
    """Policies with the same figures said once: ``"a, b: figures; c: figures"``."""
    groups: dict[str, list[str]] = {}
    for policy in _ours_first(figures):
        groups.setdefault(figures[policy], []).append(policy)
    return "; ".join(f"{', '.join(names)}: {said}" for said, names in groups.items())


def _agents(suite: dict[str, Any]) -> str:
    by = _policies(
        (p, m) for entry in suite["scenarios"].values() for p, m in entry["policies"].items()
    )

    def said(policy: str) -> str:
        cells = by[policy]
        dup = sum(c["duplicate_effects"] for c in cells)
        runaway = sum(c["runaway"] for c in cells)
        false = sum(c["false_stops"] for c in cells)
        success = sum(c["success"] for c in cells) / len(cells)
        escalated = sum(c.get("escalated", 0.0) for c in cells) / len(cells)
        return (
            f"{dup:,} duplicate effects, {runaway:,} runaway, {false:,} false stops, "
            f"{success:.1%} success, {escalated:.1%} handed to a person"
        )

    figures = {policy: said(policy) for policy in by}
    return f"agents ({len(suite['scenarios'])} scenarios): " + _grouped(figures)


def _fleet(suite: dict[str, Any]) -> str | None:
    scenarios = suite.get("scenarios", {})
    if not scenarios:
        return None
    by = _policies(
        (p, {**m, "bound": e}) for e in scenarios.values() for p, m in e["policies"].items()
    )

    def said(policy: str) -> str:
        cells = by[policy]
        calls = max(c["total_calls"] / c["bound"]["lower_bound_calls"] for c in cells)
        peak = max(c["peak_load_ratio"] for c in cells)
        return f"at most {calls:.2f}x the necessary calls, peak {peak:.2f}x capacity"

    figures = {policy: said(policy) for policy in by}
    return f"fleet ({len(scenarios)} scenarios): " + _grouped(figures)


def _tau(suite: dict[str, Any]) -> list[str]:
    lines = []
    for domain, entry in suite["scenarios"].items():
        by = _policies(
            (p, m) for lam in entry["lambda"].values() for p, m in lam["policies"].items()
        )

        def said(policy: str, by: dict[str, list[dict[str, Any]]] = by) -> str:
            cells = by[policy]
            worst = min(c["pass^1"] for c in cells)
            dup = sum(c["duplicate_effects"] for c in cells)
            dishonest = sum(c["dishonest_endings"] for c in cells)
            return (
                f"pass^1 at least {worst:.1%}, {dup} duplicate effects, "
                f"{dishonest} dishonest endings"
            )

        lines.append(f"tau {domain}: " + _grouped({policy: said(policy) for policy in by}))
    return lines


def _overhead(suite: dict[str, Any]) -> str | None:
    goals = [m["holds"] for impls in suite.values() for m in impls.values() if "holds" in m]
    if not goals:
        return None
    line = f"overhead: {sum(goals)} of {len(goals)} goals hold"
    note = load_note()
    return f"{line} ({note})" if note else line


def load_note() -> str | None:
    """A word on the machine's load when it is high enough to move timings; None otherwise."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not every platform has it
        return None
    cores = os.cpu_count() or 1
    if load / cores <= BUSY:
        return None
    return (
        f"the machine was busy: load {load:.1f} on {cores} cores, timings are noisy; "
        "run again on an idle machine before reading them as a regression"
    )


def summaries(results: dict[str, Any]) -> list[str]:
    """One line per suite that has a verdict to give."""
    suites = results.get("suites", {})
    lines: list[str | None] = []
    if "agents" in suites:
        lines.append(_agents(suites["agents"]))
    if "fleet" in suites:
        lines.append(_fleet(suites["fleet"]))
    if "tau" in suites:
        lines.extend(_tau(suites["tau"]))
    if "overhead" in suites:
        lines.append(_overhead(suites["overhead"]))
    return [line for line in lines if line]
