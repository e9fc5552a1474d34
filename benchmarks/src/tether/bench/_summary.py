"""One line per suite saying what the run showed, for the reader who will not read the tables:
tether's figures first, then its peers' on the same measure."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

__all__ = ["busy", "goal_holds", "load_note", "summaries"]

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


def _count(n: int, noun: str) -> str:
    """``"1 dishonest ending"``, ``"2 dishonest endings"``."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


#: what the agents suite's summary says first: what the columns mean for the reader
AGENTS_LEAD = (
    "where a loop pays twice (duplicate effects), reports a cut reply as done (dishonest "
    "endings) or runs away, tether stops the task or hands it to a person: fewer successes, "
    "none of them false"
)


def _agents(suite: dict[str, Any]) -> str:
    by = _policies(
        (p, m) for entry in suite["scenarios"].values() for p, m in entry["policies"].items()
    )

    def said(policy: str) -> str:
        cells = by[policy]
        dup = sum(c["duplicate_effects"] for c in cells)
        dishonest = sum(c.get("stopped", {}).get("ACCEPTED_TRUNCATED", 0) for c in cells)
        runaway = sum(c["runaway"] for c in cells)
        false = sum(c["false_stops"] for c in cells)
        success = sum(c["success"] for c in cells) / len(cells)
        escalated = sum(c.get("escalated", 0.0) for c in cells) / len(cells)
        return (
            f"{_count(dup, 'duplicate effect')}, {_count(dishonest, 'dishonest ending')}, "
            f"{_count(runaway, 'runaway task')}, {_count(false, 'false stop')}, "
            f"{escalated:.1%} handed to a person, {success:.1%} succeeded"
        )

    figures = {policy: said(policy) for policy in by}
    return f"agents ({len(suite['scenarios'])} scenarios; {AGENTS_LEAD}): " + _grouped(figures)


def _contention(contention: dict[str, Any]) -> str | None:
    """The AWS article's experiment: calls and time of each backoff, against tether's (full
    jitter, ``RetryPolicy``'s)."""
    if "full" not in contention:
        return None
    full = contention["full"]
    others = "; ".join(
        f"{name}: {m['calls']:,} calls ({m['calls'] / full['calls']:.1f}x), {m['completion_s']:.1f} s"
        for name, m in contention.items()
        if name != "full"
    )
    return (
        f"contention (100 clients, one resource): full jitter (tether's backoff): "
        f"{full['calls']:,} calls, {full['completion_s']:.1f} s; {others}"
    )


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
            (p, {**m, "lam": lam})
            for lam, cell in entry["lambda"].items()
            for p, m in cell["policies"].items()
        )

        def said(policy: str, by: dict[str, list[dict[str, Any]]] = by) -> str:
            cells = by[policy]
            worst = min(cells, key=lambda c: c["pass^1"])
            dup = sum(c["duplicate_effects"] for c in cells)
            dishonest = sum(c["dishonest_endings"] for c in cells)
            return (
                f"lowest pass^1 {worst['pass^1']:.1%} (λ={worst['lam']}), "
                f"{_count(dup, 'duplicate effect')}, {_count(dishonest, 'dishonest ending')}"
            )

        lines.append(f"tau {domain}: " + _grouped({policy: said(policy) for policy in by}))
    return lines


def goal_holds(m: dict[str, Any]) -> bool | None:
    """Whether an overhead row's goal holds, as its table says: a ratio's (``holds``) or a
    time's (``goal_ns``); None for a row without a goal."""
    if "holds" in m or "goal" in m:
        return bool(m.get("holds"))
    if "goal_ns" in m and "ns_per_call" in m:
        return bool(m["ns_per_call"] <= m["goal_ns"])
    return None


def _overhead(suite: dict[str, Any]) -> str | None:
    """Every goal the table shows, counted as it shows it, and the rows skipped and why."""
    rows = [m for impls in suite.values() for m in impls.values()]
    goals = [held for m in rows if (held := goal_holds(m)) is not None]
    skipped = [m["note"].removeprefix("skipped: ") for m in rows
               if str(m.get("note", "")).startswith("skipped")]  # fmt: skip
    if not goals and not skipped:
        return None
    line = f"overhead: {sum(goals)} of {len(goals)} goals hold"
    if skipped:
        why = "; ".join(dict.fromkeys(skipped))  # each reason once
        line += f"; {_count(len(skipped), 'row')} skipped, not counted ({why})"
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


def busy(loads: Iterable[float]) -> str | None:
    """``"load 12 on 2 cores"`` when a load measured at the run's start or end is above the
    machine's cores (its timings are not to be trusted); None otherwise."""
    highest = max(loads, default=0.0)
    cores = os.cpu_count() or 1
    return f"load {highest:.0f} on {cores} cores" if highest > cores else None


def summaries(results: dict[str, Any]) -> list[str]:
    """One line per suite that has a verdict to give."""
    suites = results.get("suites", {})
    lines: list[str | None] = []
    if "agents" in suites:
        lines.append(_agents(suites["agents"]))
    if "fleet" in suites:
        lines.append(_fleet(suites["fleet"]))
        lines.append(_contention(suites["fleet"].get("contention", {})))
    if "tau" in suites:
        lines.extend(_tau(suites["tau"]))
    if "overhead" in suites:
        lines.append(_overhead(suites["overhead"]))
    return [line for line in lines if line]
