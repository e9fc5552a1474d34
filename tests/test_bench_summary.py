"""The bench's report for the reader: a summary line per suite, undefined figures shown as
undefined, tables that fit a narrow terminal, a word on the machine's load."""

from __future__ import annotations

from typing import Any

import pytest

from tether.bench import _summary
from tether.bench._columns import UNDEFINED
from tether.bench._report import fit_columns, markdown_tables, narrow_table
from tether.bench._tau_report import tau_tables


def _tau_cell(pass1: float, seeds: int, dishonest: int = 0) -> dict[str, Any]:
    cell: dict[str, Any] = {f"pass^{k}": pass1 for k in range(1, seeds + 1)}
    return cell | {"duplicate_effects": 0, "dishonest_endings": dishonest, "tool_executions": 1,
                   "model_calls": 1, "tokens": 1, "cost_usd": 0.0, "p50_s": 1.0, "p95_s": 1.0,
                   "endings": {"success": 1}}  # fmt: skip


def _tau(seeds: int) -> dict[str, Any]:
    policies = {"tether": _tau_cell(1.0, seeds), "tether-langchain": _tau_cell(1.0, seeds),
                "naive": _tau_cell(0.25, seeds, dishonest=2)}  # fmt: skip
    return {"wall_s": 1.0, "scenarios": {"retail": {"tasks": 2, "seeds": seeds,
            "lambda": {"0": {"policies": policies}, "0.5": {"policies": policies}}}}}  # fmt: skip


def test_an_unmeasured_pass_k_reads_undefined_never_zero() -> None:
    """With 2 seeds pass^3 and pass^4 are undefined: the tables say so, not 0.0%."""
    tables = tau_tables(_tau(seeds=2))
    head, rows = tables["tau retail: every metric"]
    row = dict(zip(head, rows[0], strict=True))
    assert (row["pass^2"], row["pass^3"], row["pass^4"]) == ("100.0%", UNDEFINED, UNDEFINED)
    (summary_head, summary_rows) = next(v for k, v in tables.items() if "graded" in k)
    headline = dict(zip(summary_head, summary_rows[0], strict=True))
    assert headline["λ=0.5 pass^1 / pass^2"] == "100.0% / 100.0%"  # the highest k measured


def test_one_seed_heads_its_column_pass_1_alone() -> None:
    """With 1 seed only pass^1 is measured: the headline column shows it, not "— " beside it."""
    tables = tau_tables(_tau(seeds=1))
    head, rows = next(v for k, v in tables.items() if "graded" in k)
    assert dict(zip(head, rows[0], strict=True))["λ=0.5 pass^1"] == "100.0%"


def test_a_summary_line_per_suite_groups_policies_with_the_same_figures() -> None:
    """tether and its adapters share a line when their figures agree; peers follow."""
    agents = {"scenarios": {"outage": {"policies": {
        "tether": {"duplicate_effects": 0, "runaway": 0, "false_stops": 0, "success": 0.75, "escalated": 0.25},
        "naive": {"duplicate_effects": 7, "runaway": 3, "false_stops": 0, "success": 0.5, "escalated": 0.0}}}}}  # fmt: skip
    lines = _summary.summaries({"suites": {"tau": _tau(seeds=4), "agents": agents}})
    assert lines[0] == ("agents (1 scenarios; " + _summary.AGENTS_LEAD + "): tether: 0 duplicate "
                        "effects, 0 dishonest endings, 0 runaway tasks, 0 false stops, 25.0% handed "
                        "to a person, 75.0% succeeded; naive: 7 duplicate effects, 0 dishonest "
                        "endings, 3 runaway tasks, 0 false stops, 0.0% handed to a person, "
                        "50.0% succeeded")  # fmt: skip
    assert lines[1] == ("tau retail: tether, tether-langchain: lowest pass^1 100.0% (λ=0), 0 "
                        "duplicate effects, 0 dishonest endings; naive: lowest pass^1 25.0% "
                        "(λ=0), 0 duplicate effects, 4 dishonest endings")  # fmt: skip


def test_the_agents_line_says_what_tether_does_instead_and_counts_in_words() -> None:
    """The agents line says tether hands over where a peer pays twice or ends dishonestly,
    counts the dishonest endings (a cut reply accepted as done), and says "1 ending"."""
    cell = {"duplicate_effects": 1, "runaway": 0, "false_stops": 0, "success": 0.5,
            "escalated": 0.0, "stopped": {"ACCEPTED_TRUNCATED": 1}}  # fmt: skip
    (line,) = _summary.summaries({"suites": {"agents": {"scenarios": {"truncated": {"policies": {
        "naive": cell}}}}}})  # fmt: skip
    assert "hands it to a person" in line
    assert "naive: 1 duplicate effect, 1 dishonest ending, 0 runaway tasks" in line


def test_the_contention_experiment_has_a_summary_line() -> None:
    """Each backoff's calls against full jitter's (tether's)."""
    contention = {"none": {"calls": 5050, "completion_s": 942.7},
                  "full": {"calls": 754, "completion_s": 26.81}}  # fmt: skip
    lines = _summary.summaries({"suites": {"fleet": {"scenarios": {}, "contention": contention}}})
    assert lines == ["contention (100 clients, one resource): full jitter (tether's backoff): "
                     "754 calls, 26.8 s; none: 5,050 calls (6.7x), 942.7 s"]  # fmt: skip


def test_a_goal_that_does_not_hold_on_a_busy_machine_says_the_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Above the cores at the run's start or end, a goal that does not hold names the load."""
    from tether.bench._report import overhead_rows

    monkeypatch.setattr(_summary.os, "cpu_count", lambda: 2)
    row = {"step": {"tether": {"ns_per_call": 1.0, "ratio": 1.5, "vs": "loop", "ratio_min": 1.4,
                               "ratio_max": 1.6, "goal": 1.2, "holds": False}}}  # fmt: skip
    _head, rows = overhead_rows(row, _summary.busy([12.2, 3.0]))
    assert rows[0][-1] == "<= 1.2x: does not hold (load 12 on 2 cores)"
    assert _summary.busy([1.5, 2.0]) is None
    _head, rows = overhead_rows(row, _summary.busy([1.5, 2.0]))
    assert rows[0][-1] == "<= 1.2x: does not hold"


def test_a_wide_table_becomes_blocks_that_fit_the_terminal() -> None:
    """Every line fits 80 columns and every cell is still there, whole."""
    head = ["scenario", "policy", *(f"metric number {i}" for i in range(12))]
    rows = [["duplicate-payment", "tether", *(f"{i * 1234.5:,.1f}" for i in range(12))]]
    text = narrow_table("agents", head, rows, 80)
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "duplicate-payment / tether" in text
    for i in range(12):
        assert f"metric number {i}: {i * 1234.5:,.1f}" in text


@pytest.mark.parametrize(("load", "busy"), [(0.5, False), (1.9, True)])
def test_the_overhead_line_says_when_the_machine_was_busy(
    monkeypatch: pytest.MonkeyPatch, load: float, busy: bool
) -> None:
    """A load above 0.75 per core adds a word on noisy timings to the overhead's line."""
    monkeypatch.setattr(_summary.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(_summary.os, "cpu_count", lambda: 2)
    overhead = {"step": {"tether": {"goal": 1.2, "holds": True}},
                "end": {"tether": {"goal": 1.2, "holds": False}}}  # fmt: skip
    (line,) = _summary.summaries({"suites": {"overhead": overhead}})
    assert line.startswith("overhead: 1 of 2 goals hold")
    assert ("the machine was busy: load 1.9 on 2 cores" in line) is busy


def test_the_overhead_line_counts_the_goals_in_time_too() -> None:
    """A row whose goal is a time (the memory ledger's 10 us) counts as the table prints it:
    a run whose table said "does not hold" on it no longer read "11 of 11 goals hold"."""
    overhead = {
        "ratio": {"tether": {"holds": True}},
        "memory": {"tether": {"ns_per_call": 10_600.0, "goal_ns": 10_000}},
        "prices": {"tether": {"ns_per_call": 4_000.0, "goal_ns": 10_000}},
        "no_goal": {"floor": {"ns_per_call": 1.0}},
    }
    (line,) = _summary.summaries({"suites": {"overhead": overhead}})
    assert line.startswith("overhead: 2 of 3 goals hold")


def test_the_markdown_agents_tables_fit_80_columns() -> None:
    """The report's agents table (13 columns) is cut into tables of at most 80 characters a
    line, each keeping scenario and policy, every figure in one of them."""
    from tether.bench._agents import run_cell

    cells = {
        scenario: {"policies": {p: run_cell(scenario, p, 5, 7) for p in ("naive", "tether")}}
        for scenario in ("duplicate-payment", "cost-blowup")
    }
    text = markdown_tables({"suites": {"agents": {"scenarios": cells}}})
    tables = [line for line in text.splitlines() if line.startswith("|")]
    assert tables and all(len(line) <= 80 for line in tables), max(tables, key=len)
    heads = [line for line in tables if line.startswith("| scenario | policy |")]
    assert len(heads) >= 2  # cut, each piece with the row's names
    named = {h.strip() for line in heads for h in line.strip("|").split("|")}
    assert {"success", "dup. effects", "cost $", "stopped by"} <= named


def test_a_table_that_fits_stays_whole() -> None:
    head, rows = ["scenario", "policy", "success"], [["outage", "tether", "100%"]]
    assert fit_columns(head, rows) == [(head, rows)]


def _every_agents_cell(tasks: int) -> dict[str, Any]:
    from tether.bench import POLICIES, SCENARIOS
    from tether.bench._agents import run_cell

    return {"scenarios": {s: {"policies": {p: run_cell(s, p, tasks, 7) for p in POLICIES}}
                          for s in SCENARIOS}}  # fmt: skip


def test_the_printed_tables_fit_80_columns_with_no_cell_cut(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Piped (COLUMNS=80) every line of every table fits 80 columns, with no ellipsis and
    every word of every cell printed whole: never "see | d-p | rof | ile"."""
    from tether.bench._report import _rows, print_tables

    overhead = {"step": {"tether": {"ns_per_call": 12345.6, "ratio": 1.31, "vs": "tenacity",
                                    "ratio_min": 1.2, "ratio_max": 1.5, "goal": 1.2,
                                    "holds": False, "json_encodings_per_call": 2,
                                    "sha256_per_call": 1, "modules": 158}},
                "ledger_redis_new_key": {"tether": {
                    "note": "skipped: StoreUnavailable (set TETHER_REDIS_URL)"}}}  # fmt: skip
    results = {"suites": {"agents": _every_agents_cell(2), "overhead": overhead}}
    monkeypatch.setenv("COLUMNS", "80")
    print_tables(results)
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80, max(out.splitlines(), key=len)
    assert "…" not in out
    for _head, rows in _rows(results).values():
        for word in {w for row in rows for cell in row for w in cell.split()}:
            assert word in out, word


def test_the_overhead_line_counts_every_goal_its_table_shows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ratio goals and time goals (``goal_ns``) alike, as the rows say them, and the skipped
    rows with their reasons. It said "9 of 9 goals hold" over two rows that did not hold."""
    from tether.bench._report import overhead_rows

    monkeypatch.setattr(_summary.os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    ratio = {"ns_per_call": 1.0, "ratio": 1.1, "vs": "loop", "ratio_min": 1.0, "ratio_max": 1.2}
    unreachable = "skipped: Redis unreachable at redis://***@127.0.0.1:1/0 (ConnectionError)"
    overhead = {
        "step": {"tether": {**ratio, "goal": 1.2, "holds": True}},
        "retry": {"tether": {**ratio, "goal": 1.0, "holds": False}},
        "breaker": {"tether": {"ns_per_call": 900.0, "goal_ns": 1000.0},
                    "redis": {"note": unreachable}, "redis_exact": {"note": unreachable}},
        "first_run": {"tether": {"ns_per_call": 2000.0, "goal_ns": 1000.0}},
        "import": {"tenacity": {"ns_per_call": 5.0}},
    }  # fmt: skip
    _head, rows = overhead_rows(overhead)
    shown = [row[-1] for row in rows if row[-1]]
    held = sum(goal.endswith(": holds") for goal in shown)
    (line,) = _summary.summaries({"suites": {"overhead": overhead}})
    assert (held, len(shown)) == (2, 4)
    assert line == (
        "overhead: 2 of 4 goals hold; 2 rows skipped, not counted (Redis unreachable at "
        "redis://***@127.0.0.1:1/0 (ConnectionError))"
    )


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (None, "skipped: no Redis at the default address (ConnectionError; set TETHER_REDIS_URL)"),
        ("redis://:s3cret@127.0.0.1:1/0",
         "skipped: Redis unreachable at redis://***@127.0.0.1:1/0 (ConnectionError; "
         "TETHER_REDIS_URL)"),
    ],
)  # fmt: skip
def test_a_skipped_server_row_says_where_it_was_looked_for(
    monkeypatch: pytest.MonkeyPatch, given: str | None, said: str
) -> None:
    """A variable set to a wrong address: unreachable there (the password masked), not "set
    TETHER_REDIS_URL" as if it were not set."""
    from tether.bench._overhead import _skipped

    if given is None:
        monkeypatch.delenv("TETHER_REDIS_URL", raising=False)
    else:
        monkeypatch.setenv("TETHER_REDIS_URL", given)
    assert _skipped(ConnectionError("refused"), "Redis", "TETHER_REDIS_URL") == {"note": said}


def test_piped_tables_and_summary_lines_end_without_spaces(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Piped, no line ends in spaces (rich padded its centred titles and wrapped lines)."""
    from tether.bench._report import print_tables

    results = {"suites": {"agents": _every_agents_cell(2)}}
    monkeypatch.setenv("COLUMNS", "80")
    print_tables(results)
    out = capsys.readouterr().out
    assert "agents (1 of " in out  # a centred title
    assert [line for line in out.splitlines() if line != line.rstrip()] == []
