"""tether bench: deterministic, through the real library, and the goals hold."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tether import bench
from tether.bench._agents import run_cell
from tether.bench._fleet import contention, run_fleet
from tether.cli import main


def test_agent_cells_are_deterministic_for_a_seed() -> None:
    """The same seed gives the same figures."""
    assert run_cell("seed-profile", "tether", 40, 3) == run_cell("seed-profile", "tether", 40, 3)


@pytest.mark.parametrize("scenario", list(bench.SCENARIOS))
def test_tether_never_runs_away_or_pays_twice(scenario: str) -> None:
    """Every scenario: tether has no runaway and no duplicate effect."""
    cell = run_cell(scenario, "tether", 60, 11)
    assert cell["runaway"] == 0
    assert cell["duplicate_effects"] == 0


def test_stuck_search_stops_after_two_executions() -> None:
    """The third identical search is never executed."""
    cell = run_cell("stuck-search", "tether", 50, 5)
    assert cell["stopped"] == {"REPEATED_ACTION": 50}
    assert cell["dependency_calls"] == 100


def test_polling_is_never_stopped() -> None:
    """Legitimate polling: zero false stops for tether, some for the seed harness."""
    assert run_cell("polling", "tether", 100, 5)["false_stops"] == 0
    assert run_cell("polling", "seed-harness", 100, 5)["false_stops"] > 0


def test_the_naive_loop_pays_twice() -> None:
    """The duplicate-payment scenario is strong enough to catch the naive loop."""
    assert run_cell("duplicate-payment", "naive", 50, 5)["duplicate_effects"] > 0


def test_seed_profile_beats_the_seed_harness() -> None:
    """Seed 002's fault profile: tether at least 99% and above the harness, same budgets."""
    tether_cell = run_cell("seed-profile", "tether", 1000, 7)
    harness = run_cell("seed-profile", "seed-harness", 1000, 7)
    assert tether_cell["success"] >= 0.99
    assert tether_cell["success"] > harness["success"]


def test_fleet_outage_goals() -> None:
    """1,000 clients, 100 rps, 30 s down: tether within 1.5x the calls and 1.25x the time."""
    cell = run_fleet("outage", "tether")
    assert cell["success"] == 1.0
    assert cell["total_calls"] <= 1.5 * 1000
    assert cell["completion_s"] <= 1.25 * 40.0


def test_contention_ordering_matches_the_article() -> None:
    """No jitter is by far the worst; every jittered schedule does a fraction of its work."""
    results = {j: contention(j) for j in ("none", "full", "equal", "decorrelated")}
    assert all(
        results["none"]["calls"] > 3 * results[j]["calls"]
        for j in ("full", "equal", "decorrelated")
    )
    assert all(
        results["none"]["completion_s"] > 3 * results[j]["completion_s"]
        for j in ("full", "equal", "decorrelated")
    )


def test_cli_bench_json_layout(tmp_path: Path) -> None:
    """tether bench --json writes the DESIGN.md layout."""
    path = tmp_path / "out.json"
    assert (
        main(
            [
                "bench",
                "--suite",
                "agents",
                "--tasks",
                "5",
                "--scenario",
                "polling",
                "--json",
                str(path),
            ]
        )
        == 0
    )
    data = json.loads(path.read_text())
    cell = data["suites"]["agents"]["scenarios"]["polling"]["policies"]["tether"]
    assert data["seed"] == 7
    assert set(cell) >= {"tasks", "success", "escalated", "stopped", "false_stops", "runaway", "duplicate_effects",
                         "avg_steps", "avg_attempts", "p50_latency_s", "p95_latency_s", "tokens", "cost_usd",
                         "dependency_calls"}  # fmt: skip
    assert set(data["suites"]["agents"]["scenarios"]["polling"]["policies"]) == {
        "naive",
        "tenacity",
        "seed-harness",
        "tether",
    }


def test_cli_bench_report(tmp_path: Path) -> None:
    """--report writes a Markdown report with plots."""
    assert (
        main(
            [
                "bench",
                "--suite",
                "agents",
                "--tasks",
                "3",
                "--scenario",
                "truncated",
                "--report",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert "tether bench report" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "agents.png").stat().st_size > 1000


def test_cli_rejects_unknown_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    """A bad scenario is a clear error listing the valid ones."""
    assert main(["bench", "--scenario", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown scenario(s) nope" in err
    assert "stuck-search" in err


def test_the_litellm_router_scenario_says_where_it_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """Where LiteLLM is not installed (this venv cannot hold its pins), the fleet-live
    litellm-router scenario says how to run it and exits 2, before anything runs."""
    if importlib.util.find_spec("litellm") is not None:
        pytest.skip("LiteLLM is installed here: tests/test_fleet_live_litellm.py runs it")
    assert main(["bench", "--suite", "fleet-live", "--scenario", "litellm-router"]) == 2
    err = capsys.readouterr().err
    assert "litellm-router scenario needs LiteLLM" in err
    assert ".venv-crewai/bin/tether bench --suite fleet-live --scenario litellm-router" in err
    assert "Traceback" not in err


def test_cli_rejects_bad_flags() -> None:
    """A bad flag exits with argparse's usage error."""
    with pytest.raises(SystemExit) as info:
        main(["bench", "--suite", "everything"])
    assert info.value.code == 2


def test_bench_without_the_bench_distribution_says_how_to_install_it() -> None:
    """Without tether-bench installed, `tether bench` says how to install it and exits 2."""
    src = Path(__file__).resolve().parents[1] / "src"
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from tether.cli import main; "
        "sys.exit(main(['bench', '--suite', 'agents']))"
    )
    # -S: no site-packages, so no editable install of tether-bench: only the library from src/
    out = subprocess.run(
        [sys.executable, "-S", "-c", code, str(src)],
        capture_output=True,
        text=True,
        env={"PATH": os.environ.get("PATH", "")},
    )
    assert out.returncode == 2, out.stderr
    assert "tether-bench" in out.stderr
    assert "make bench" in out.stderr
    assert "pip install -e benchmarks" in out.stderr


def test_bench_says_its_progress_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    """Piped (make bench in CI or a log), each suite says on stderr when it starts, so a long
    suite is never silent; the tables stay on stdout."""
    args = ["bench", "--suite", "agents", "--suite", "fleet", "--tasks", "3"]
    assert main([*args, "--scenario", "truncated", "--scenario", "outage-5"]) == 0
    captured = capsys.readouterr()
    assert "tether bench: agents started" in captured.err
    assert "tether bench: fleet started" in captured.err
    assert "started" not in captured.out
    # the time it took, and the machine's load it took it at
    last = " ".join(captured.out.split("\n\ntether bench: ")[-1].split())
    assert re.match(r"[0-9.]+ s \(.*; load [0-9.?]+ -> [0-9.?]+ on", last), last
    assert max(len(line) for line in captured.out.splitlines()) <= 80  # the last line too


def test_version_command() -> None:
    """tether --version works from the console script."""
    out = subprocess.run(
        [sys.executable, "-m", "tether.cli", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.startswith("tether ")


def test_overhead_suite_reports_every_case() -> None:
    """The overhead suite measures every row of the success-path table against its peer, in the same run."""
    from tether.bench._overhead import run_overhead

    seen: list[str] = []
    out = run_overhead(quick=True, progress=lambda message, total: seen.append(message))
    rows = {
        "guarded_run_20_steps": "tenacity_loop",
        "guarded_run_500_steps": "tenacity_loop",
        "end_of_20_call_run": "steps",
        "call_tool_1kb": "floor",
        "retry_3_failures_then_success": "tenacity",
        "retry_3_failures_no_opentelemetry": "tenacity",
        "retry_success_path": "tenacity",
        "ledger_memory_new_key": "dict",
        "ledger_sqlite_new_key": "insert_update",
        "ledger_redis_new_key": "set_nx_cas",
        "ledger_postgres_new_key": "two_statements",
        "record_model_call_prices_extra": "own_table",
        "import_tether": "tenacity",
        "langchain_middleware": "langchain_middlewares",
    }
    assert set(out) == set(rows) | {"breaker_success_path"}
    assert len(seen) == 12 and all(m.startswith("overhead: ") for m in seen)
    for case, peer in rows.items():
        ours = out[case]["tether"]
        assert ours["vs"] == peer and peer in out[case], case
        assert ours["ratio_min"] <= ours["ratio"] <= ours["ratio_max"], case
    assert {"bare", "tether", "tenacity"} <= set(out["retry_success_path"])
    assert out["breaker_success_path"]["redis"]["round_trips_per_call"] == 0
    assert out["breaker_success_path"]["redis_exact"]["round_trips_per_call"] == 1
    assert out["ledger_postgres_new_key"]["two_statements"]["round_trips_per_call"] == 2
    assert out["ledger_redis_new_key"]["tether"]["round_trips_per_call"] == 2
    assert (
        out["import_tether"]["tether"]["modules"]
        < out["import_tether"]["tether_first_run"]["modules"]
    )
    assert out["import_tether"]["tether_first_run"]["goal"] == 1.5
    assert out["call_tool_1kb"]["tether"]["json_encodings_per_call"] >= 1


def test_soak_suite_bounds_the_run_state() -> None:
    """The soak suite (its own, not in the default set): one long run bounded and unbounded."""
    from tether.bench._overhead import run_soak

    seen: list[str] = []
    out = run_soak(quick=True, progress=lambda message, total: seen.append(message))
    assert len(seen) == 4 and all(m.startswith("soak: ") for m in seen)
    memory = out["detector_memory"]["tether"]
    assert memory["bytes_after_all_steps"] <= 1.1 * memory["bytes_after_10k_steps"]
    bounded, unbounded = out["long_run"]["keep_last=1000"], out["long_run"]["unbounded"]
    assert bounded["steps"] == unbounded["steps"] == 100_000
    assert bounded["run_state_bytes"] < 5_000_000 < 50_000_000 < unbounded["run_state_bytes"]
    assert "soak" not in bench.SUITES and "soak" in bench.EXTRA_SUITES


def test_the_default_set_is_the_fast_one() -> None:
    """`tether bench` and `--suite all` run agents, fleet and overhead; the rest when named."""
    assert bench.SUITES == ("agents", "fleet", "overhead")
    assert set(bench.EXTRA_SUITES) == {"soak", "tau", "tau-live", "fleet-live", "serve"}
    assert set(bench.TAU_POLICIES) >= {
        "naive",
        "tenacity",
        "langchain",
        "openai-agents",
        "pydantic-ai",
        "tether",
        "tether-langchain",
        "tether-openai-agents",
        "tether-pydantic-ai",
    }


def test_report_plots_show_every_value_with_the_legend_outside_the_data(tmp_path: Path) -> None:
    """Every bar labelled (a zero too, marked on the axis), tick labels under every panel,
    the legend outside every panel; cost and duplicate effects plotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tether.bench._report import _count, _dollars, _plots, _share, bars_figure

    cell = {
        "tasks": 10,
        "success": 0.995,
        "escalated": 0.0,
        "duplicate_effects": 0,
        "cost_usd": 2.5,
        "latency_samples": [1.0, 2.0, 30.0],
    }
    cells = {
        s: {
            "policies": {
                p: dict(cell, duplicate_effects=3 if p == "naive" else 0)
                for p in ("naive", "tether")
            }
        }
        for s in ("outage", "polling")
    }
    fig = bars_figure(
        plt,
        cells,
        [
            ("success", "success", _share),
            ("escalated", "escalated", _share),
            ("duplicate_effects", "dup.", _count),
            ("cost_usd", "cost", _dollars),
        ],
    )
    panels = fig.axes
    labels = [[t.get_text() for t in ax.texts] for ax in panels]
    assert labels[0] == ["99.5%"] * 4 and labels[1] == ["0%"] * 4  # 99.5% is not rounded to 100%
    assert labels[2] == ["3", "3", "0", "0"] and labels[3] == ["2.50"] * 4
    assert all(len(ax.lines) == 4 for ax in panels[1:2])  # each zero is drawn as a mark
    fig.canvas.draw()
    (legend,) = fig.legends
    box = legend.get_window_extent()
    for ax in panels:
        assert [t.get_text() for t in ax.get_xticklabels()] == ["outage", "polling"]
        assert not box.overlaps(ax.get_window_extent()), "the legend covers a panel"
    plt.close(fig)
    images = _plots({"suites": {"agents": {"scenarios": cells}}}, tmp_path)
    assert [name for _, name in images] == ["agents.png", "agents-effects.png", "latency.png"]
    assert all((tmp_path / name).stat().st_size > 10_000 for _, name in images)


def test_overhead_peers_are_written_as_users_write_them() -> None:
    """The retry peers are tenacity's @retry decorator (a Retrying copied per call), the
    tool fails with a builtin error."""
    from tether.bench import _overhead

    row = _overhead._retry_rows(quick=True)
    assert row["retry_3_failures_then_success"]["tether"]["error"] == "ConnectionResetError"
    for case in ("retry_3_failures_then_success", "retry_success_path"):
        assert row[case]["tenacity"]["written_as"].startswith("@tenacity.retry"), case
    # the guarded loop's tool is under the decorator: its calls go through a copy each time
    import tenacity

    copies: list[object] = []
    real = tenacity.Retrying.copy

    def counted(self: tenacity.Retrying, *args: object, **kwargs: object) -> tenacity.Retrying:
        copies.append(self)
        return real(self, *args, **kwargs)

    tenacity.Retrying.copy = counted  # type: ignore[method-assign]
    try:
        _overhead._tenacity_loop({"q": "x"}, 3)()
    finally:
        tenacity.Retrying.copy = real  # type: ignore[method-assign]
    assert len(copies) == 3


def test_the_guarded_runs_peer_keeps_a_transcript_and_a_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loop users write keeps each call and its result, and stops at its deadline."""
    from tether.bench import _overhead

    transcript = _overhead._tenacity_loop({"q": "x"}, 2)()
    assert transcript == [
        {"step": 1, "tool": "lookup", "args": {"q": "x", "n": 0}, "result": {"ok": True, "n": 0}},
        {"step": 2, "tool": "lookup", "args": {"q": "x", "n": 1}, "result": {"ok": True, "n": 1}},
    ]
    run = _overhead._tenacity_loop({"q": "x"}, 2)
    now = iter([0.0, _overhead.PEER_DEADLINE_S])
    monkeypatch.setattr(_overhead.time, "monotonic", lambda: next(now))
    with pytest.raises(TimeoutError):
        run()


def test_langchain_middleware_row_times_both_middlewares() -> None:
    """A real create_agent turn under TetherMiddleware, LangChain's limit and retry middlewares
    and none: every implementation timed, the ratio ours over LangChain's from their rounds."""
    from tether.bench._overhead import _interleaved, _row
    from tether.bench._scale import langchain_middleware

    row = langchain_middleware(_interleaved, _row, quick=True, number=1)
    assert set(row) == {"tether", "langchain_middlewares", "none"}
    ours, theirs = row["tether"], row["langchain_middlewares"]
    assert ours["vs"] == "langchain_middlewares" and ours["per"] == "turn"
    # the peer does what TetherMiddleware does: limits and retries, LangChain's own middlewares
    assert "ModelRetryMiddleware" in theirs["written_as"]
    assert "ToolRetryMiddleware" in theirs["written_as"]
    assert ours["ns_per_call"] > 0 and theirs["ns_per_call"] > 0 and row["none"]["ns_per_call"] > 0
    assert ours["ratio_min"] <= ours["ratio"] <= ours["ratio_max"]
    # the ratio of the medians lies within the per-round ratios' spread (min <= it <= max)
    medians = ours["ns_per_call"] / theirs["ns_per_call"]
    assert ours["ratio_min"] - 0.01 <= medians <= ours["ratio_max"] + 0.01
    assert ours["vs_none"] > 0 and theirs["vs_none"] > 0
    assert ours["holds"] == (ours["ratio"] <= ours["goal"])


def test_scale_rows_at_tiny_sizes() -> None:
    """Steps at scale in fresh interpreters and concurrent runs on one loop: their shape."""
    from tether.bench._report import _rows
    from tether.bench._scale import concurrent_runs, steps_at_scale

    steps = steps_at_scale((100, 1_000))
    assert list(steps) == ["100_steps", "1000_steps"]
    for n, row in zip((100, 1_000), steps.values(), strict=True):
        assert row["steps"] == n and row["ns_per_call"] > 0
        assert row["peak_rss_mb"] >= row["run_peak_mb"] >= 0 and row["peak_rss_mb"] > 5
    runs = concurrent_runs((10, 100), steps=2)
    assert list(runs) == ["10_runs", "100_runs"]
    for n, row in zip((10, 100), runs.values(), strict=True):
        assert row["runs"] == n and row["steps"] == 2 * n and row["steps_per_s"] > 0
        assert 1_000 < row["bytes_per_open_run"] < 1_000_000  # a run holds something, not a lot
    _, table = _rows({"suites": {"soak": {"steps_at_scale": steps, "concurrent_runs": runs}}})[
        "soak"
    ]
    assert len(table) == 4 and all(r[3] for r in table)


def test_the_overhead_suite_skips_the_servers_it_cannot_reach(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without Redis or PostgreSQL (`make bench` on a bare machine) their rows say they were
    skipped and where they were looked for; the suite does not fail (it raised
    StoreUnavailable for Redis), and its summary line counts the skipped rows."""
    from tether.bench._overhead import run_overhead
    from tether.bench._summary import summaries

    monkeypatch.setenv("TETHER_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("TETHER_PG_DSN", "postgresql://postgres@127.0.0.1:1/test")
    out = run_overhead(quick=True)
    redis_note = (
        "skipped: Redis unreachable at redis://127.0.0.1:1/0 (StoreUnavailable; TETHER_REDIS_URL)"
    )
    assert out["ledger_redis_new_key"] == {"tether": {"note": redis_note}}
    assert out["breaker_success_path"]["redis"]["note"].endswith("; TETHER_REDIS_URL)")
    pg_note = out["ledger_postgres_new_key"]["tether"]["note"]
    assert pg_note.startswith("skipped: PostgreSQL unreachable at postgresql://***@127.0.0.1:1/")
    (line,) = summaries({"suites": {"overhead": out}})
    assert "4 rows skipped, not counted" in line  # the breaker on Redis twice, two ledgers
    assert "ratio" in out["ledger_sqlite_new_key"]["tether"]  # the rest is measured


TAU_DATA = os.environ.get("TETHER_TAU_DATA", "")


@pytest.mark.skipif(not TAU_DATA, reason="TETHER_TAU_DATA is not set")
def test_an_unknown_tau_task_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """--tau-task with an id the domain lacks: a clear error and exit 2 (it was a
    ZeroDivisionError traceback), before any suite runs."""
    assert main(["bench", "--suite", "tau", "--tau-task", "99999", "--tau-data", TAU_DATA]) == 2
    err = capsys.readouterr().err
    assert "unknown tau task(s) 99999: retail has 114 tasks, ids 0 to 113" in err


@pytest.mark.skipif(not TAU_DATA, reason="TETHER_TAU_DATA is not set")
@pytest.mark.parametrize(
    ("policy", "package", "extra", "venv"),
    [("adk", "google.adk", "adk", ".venv-frameworks"),
     ("tether-strands", "strands", "strands", ".venv-frameworks"),
     ("crewai", "crewai", "crewai", ".venv-crewai"),
     ("litellm", "litellm", "litellm", ".venv-crewai")],
)  # fmt: skip
def test_a_framework_tau_policy_without_its_framework_says_what_to_install(
    capsys: pytest.CaptureFixture[str], policy: str, package: str, extra: str, venv: str
) -> None:
    """A framework's tau policy where the framework is not installed: which extra (or venv)
    to install, exit 2 (it was a ModuleNotFoundError traceback)."""
    import importlib.util

    try:
        present = importlib.util.find_spec(package) is not None
    except ModuleNotFoundError:
        present = False
    if present:
        pytest.skip(f"{package} is installed here")
    argv = ["bench", "--suite", "tau", "--tau-policy", policy, "--tau-data", TAU_DATA]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{policy} need {package}, which is not installed here" in err
    assert f"pip install 'tether[{extra}]'" in err and venv in err


@pytest.mark.skipif(not TAU_DATA, reason="TETHER_TAU_DATA is not set")
def test_the_last_line_names_agent_tasks_only_when_the_agents_suite_ran(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--suite tau` ends without "1000 tasks per agent cell" (no agent cell ran)."""
    argv = ["bench", "--suite", "tau", "--tau-task", "0", "--tau-policy", "tether",
            "--tau-lambda", "0", "--tau-seeds", "1", "--tau-data", TAU_DATA]  # fmt: skip
    assert main(argv) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("tether bench: ") and "(seed 7; load " in last
    assert "agent cell" not in last


def test_the_overhead_progress_names_the_step_running(monkeypatch: pytest.MonkeyPatch) -> None:
    """While a step of the overhead suite runs, the last progress message names it (ending
    " …"); it named the step that had just finished."""
    from tether.bench import _overhead, _scale

    seen: list[str] = []
    running: dict[str, str] = {}

    def step(name: str, result: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            running[name] = seen[-1]
            return result

        return run

    for name, result in [("_guarded", {}), ("_retry_rows", {}), ("_retry_without_otel", {}),
                         ("_ledgers", {}), ("_prices", {}), ("_breakers", {}),
                         ("_import_times", {})]:  # fmt: skip
        monkeypatch.setattr(_overhead, name, step(name, result))
    monkeypatch.setattr(_scale, "langchain_middleware", step("langchain", {}))
    _overhead.run_overhead(quick=True, progress=lambda message, total: seen.append(message))
    assert running["_ledgers"] == "overhead: ledgers against their statements …"
    assert running["_breakers"] == "overhead: breaker …"
    assert running["_guarded"] == "overhead: guarded runs against tenacity + a counter …"
    assert seen[-1] == "overhead: import time"


def test_the_fleet_reports_its_cells_as_they_end_not_after_the_agents() -> None:
    """The fleet's cells go to the workers first: their progress comes as each ends, not all
    after the agents suite's (a piped run was silent for minutes)."""
    seen: list[str] = []
    bench.run(["agents", "fleet"], tasks=3, scenarios=["truncated", "outage-5"],
              progress=lambda message, total: seen.append(message))  # fmt: skip
    first_fleet = next(i for i, m in enumerate(seen) if m.startswith("fleet: outage-5"))
    last_agents = max(i for i, m in enumerate(seen) if m.startswith("agents: "))
    assert first_fleet < last_agents, seen
    assert any(m.startswith("fleet: contention / full") for m in seen)


def test_every_suite_says_it_started_before_any_cell_ends() -> None:
    """The agents' cells run after the fleet's: their suite says it started (a running
    step, counting nothing) before any cell ends, so its bar shows from the start."""
    seen: list[tuple[str, int]] = []
    bench.run(["agents", "fleet"], tasks=3, scenarios=["truncated", "outage-5"],
              progress=lambda message, total: seen.append((message, total)))  # fmt: skip
    agents = sum(1 for m, _ in seen if m.startswith("agents: ") and not m.endswith(" …"))
    assert seen[0] == (f"agents: {agents} cells queued …", agents), seen
    assert seen[1][0].startswith("fleet: ") and seen[1][0].endswith(" cells queued …"), seen


def test_piped_progress_speaks_every_few_seconds_while_a_step_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Off a terminal a line comes at most `every` seconds apart even while a long step sends
    nothing, naming the step running and the count done."""
    import time

    from tether.cli._commands import _Lines

    lines = _Lines(every=0.05)
    lines("fleet: outage / tether …", 5)
    time.sleep(0.3)
    lines.close()
    err = capsys.readouterr().err
    assert "tether bench: fleet started" in err
    assert "tether bench: fleet: outage / tether … (0 of 5 done, " in err


def test_bench_help_names_the_default_set_and_fits_80_columns(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`bench --help` names every suite and the default set in lines of at most 80 columns
    (its usage line was 97), with a measured time, not "under a minute"."""
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    help_text = capsys.readouterr().out
    assert max(len(line) for line in help_text.splitlines()) <= 80
    out = " ".join(help_text.split())
    assert "Without --suite, or with 'default', the default set: agents, fleet, overhead" in out
    assert "under a minute" not in out and "59.8 s on an idle 2-core machine" in out


def test_the_redis_ledger_peer_fences_a_writer_that_lost_its_claim(redis_url: str) -> None:
    """The Redis ledger row's peer writes the result only while the claim is still the
    writer's, as the ledger does (two plain SETs would overwrite a takeover's record)."""
    import uuid

    import redis

    from tether.bench._overhead import REDIS_CAS

    client = redis.Redis.from_url(redis_url)
    settle = client.register_script(REDIS_CAS)
    key = f"tether-test-cas-{uuid.uuid4().hex}"
    try:
        client.set(key, "pending-b", px=60_000)  # b took the claim over after a's lease
        assert settle(keys=[key], args=["pending-a", "done-a", 60_000]) is None
        assert client.get(key) == b"pending-b"
        assert settle(keys=[key], args=["pending-b", "done-b", 60_000]) is not None
        assert client.get(key) == b"done-b"
    finally:
        client.delete(key)


def test_suite_all_says_what_runs_every_suite(capsys: pytest.CaptureFixture[str]) -> None:
    """--suite all never ran every suite (it was the default set's older name): a usage error
    that says what runs the default set and how to add the others."""
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--suite", "all"])
    err = " ".join(capsys.readouterr().err.split())
    assert exit_.value.code == 2
    assert "'all' is no longer a suite" in err and "--suite default --suite soak" in err
