"""The tables of the fleet-live suite: the outages (live beside simulated), where their
calls went, the Redis load they project, the provider-limits scenario and the
litellm-router one."""

from __future__ import annotations

from typing import Any

__all__ = ["live_tables"]

Table = tuple[list[str], list[list[str]]]

#: the columns of the calls-by-class table: (key of ``calls_by_class``, heading)
_CLASSES = (
    ("before_trip", "before the trip"),
    ("probes", "probes"),
    ("queued_permits", "permits of before the trip"),
    ("after_close_throttled", "429 after the close"),
    ("after_close_failed", "other failures after the close"),
    ("after_close_ok", "successes after the close"),
    ("retries", "of which not a job's first call"),
)


def _outages(scenarios: dict[str, Any]) -> Table:
    head = [
        "scenario",
        "run",
        "success",
        "calls",
        "x bound",
        "peak / capacity",
        "completion s",
        "x bound",
        "Redis round trips / call",
        "Redis fallbacks",
    ]
    rows = []
    for scenario, e in scenarios.items():
        for run in ("live", "simulated"):
            m = e[run]
            done = m["completion_s"]
            rows.append(
                [
                    scenario,
                    run,
                    f"{m['success']:.1%}",
                    str(m["total_calls"]),
                    f"{m['total_calls'] / e['lower_bound_calls']:.2f}",
                    f"{m['peak_load_ratio']:.2f}",
                    "-" if done is None else f"{done:.1f}",
                    "-" if done is None else f"{done / e['lower_bound_s']:.2f}",
                    f"{m['round_trips_per_call']:.2f}" if "round_trips_per_call" in m else "",
                ]
            )
    return head, rows


def _by_class(scenarios: dict[str, Any]) -> Table:
    head = ["scenario", "run", "calls", *(title for _, title in _CLASSES)]
    rows = [
        [scenario, run, str(e[run]["total_calls"])]
        + [str(e[run]["calls_by_class"][key]) for key, _ in _CLASSES]
        for scenario, e in scenarios.items()
        for run in ("live", "simulated")
        if "calls_by_class" in e[run]
    ]
    return head, rows


def _load(load: dict[str, Any]) -> tuple[str, Table]:
    shard = load["shard"]
    title = (
        f"Redis load of a fleet (per client: {load['per_client']['outage']:.3f} round trips/s in an "
        f"outage, {load['per_client']['recovery']:.3f} in recovery; one shard here: "
        f"{shard['ops_per_s']:,} script calls/s, planned at {load['headroom']:.0%})"
    )
    rows = [
        [
            f"{int(n):,}",
            f"{m['outage_ops_per_s']:,}",
            f"{m['recovery_ops_per_s']:,}",
            str(m["shards"]),
        ]
        for n, m in load["fleets"].items()
    ]
    return title, (["clients", "ops/s in an outage", "ops/s in recovery", "shards"], rows)


def _limits(limits: dict[str, Any]) -> tuple[str, Table]:
    head = [
        "configured",
        "success",
        "requests",
        "429s / 1000 req",
        "ITPM (OpenAI: TPM) used",
        "OTPM used",
        "p50 s",
        "p95 s",
        "Redis round trips / call",
        "Redis fallbacks",
    ]
    rows = [
        [
            misconfig,
            f"{m['success']:.1%}",
            str(m["requests"]),
            f"{m['throttled_per_1000']:.1f}",
            f"{m['input_share_of_limit']:.0%}",
            "-" if m["output_share_of_limit"] is None else f"{m['output_share_of_limit']:.0%}",
            "-" if m["p50_completion_s"] is None else f"{m['p50_completion_s']:.1f}",
            "-" if m["p95_completion_s"] is None else f"{m['p95_completion_s']:.1f}",
            f"{m['round_trips_per_call']:.2f}",
            str(m.get("redis_fallbacks", "-")),
        ]
        for misconfig, m in limits["runs"].items()
    ]
    title = (
        f"fleet-live provider-limits ({limits['agents']} agents in {limits['workers']} processes, "
        "limits configured 2x wrong, or right with a Redis that times out now and then)"
    )
    return title, (head, rows)


def _litellm(router: dict[str, Any]) -> tuple[str, Table]:
    head = ["configuration", "success", "requests", "429s / 1000 req", "TPM used", "wall s",
            "load"]  # fmt: skip
    rows = [
        [config, f"{m['success']:.1%}", str(m["requests"]), f"{m['throttled_per_1000']:.1f}",
         f"{m['tpm_share_of_limit']:.0%}", f"{m['wall_s']:.1f}", f"{m['load']:.1f}"]
        for config, m in router["runs"].items()
    ]  # fmt: skip
    limits = router["real_limits"]
    title = (
        f"fleet-live litellm-router ({router['agents']} agents in {router['workers']} "
        f"processes; the key's real limits {limits['requests_per_minute']:,.0f} RPM, "
        f"{limits['tokens_per_minute']:,.0f} TPM, set in LiteLLM's Router or tether's budget)"
    )
    return title, (head, rows)


def live_tables(suite: dict[str, Any]) -> dict[str, Table]:
    """The fleet-live suite's tables, by title."""
    tables: dict[str, Table] = {}
    scenarios = suite.get("scenarios") or {}
    if scenarios:
        e = next(iter(scenarios.values()))
        where = f"{e['clients']} clients in {e['workers']} processes, {e['capacity_rps']} req/s"
        tables[f"fleet-live ({where})"] = _outages(scenarios)
        by_class = _by_class(scenarios)
        if by_class[1]:
            tables["fleet-live: where the calls went"] = by_class
    if suite.get("redis_load"):
        title, table = _load(suite["redis_load"])
        tables[title] = table
    if suite.get("provider-limits"):
        title, table = _limits(suite["provider-limits"])
        tables[title] = table
    if suite.get("litellm-router"):
        title, table = _litellm(suite["litellm-router"])
        tables[title] = table
    return tables
