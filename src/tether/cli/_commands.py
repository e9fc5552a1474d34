"""Subcommands of the ``tether`` command line."""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import sys
import textwrap
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tether.records._collections import DeadLetter, Replayed

__all__ = ["register"]


#: what ``tether bench --suite`` takes
SUITE_NAMES = ("agents", "fleet", "overhead", "soak", "tau", "tau-live", "fleet-live", "serve",
               "default")  # fmt: skip


def _suite(name: str) -> str:
    """A ``--suite`` value; 'all', which never ran every suite, says what does."""
    if name == "all":
        raise argparse.ArgumentTypeError(
            "'all' is no longer a suite (it ran the default set, not every suite): "
            "--suite default (or no --suite) runs agents, fleet and overhead; "
            "name each other suite to add it, e.g. --suite default --suite soak"
        )
    return name


def register(sub: Any) -> None:
    """Add every subcommand to the parser's subparsers."""
    bench = sub.add_parser(
        "bench",
        help="run the fault-injection benchmark",
        description="Run tether's benchmark. The default set (agents, fleet, overhead) took "
        "59.8 s on an idle 2-core machine, minutes on a busy one (its last line gives the time "
        "and the load); soak, tau, tau-live, fleet-live and serve run only when named.",
    )
    bench.add_argument(
        "--suite",
        action="append",
        type=_suite,
        choices=SUITE_NAMES,
        metavar="SUITE",
        help="a suite to run (repeatable): " + ", ".join(SUITE_NAMES) + ". Without --suite, "
        "or with 'default', the default set: agents, fleet, overhead; every other suite runs "
        "when named (--suite default --suite soak adds soak). "
        "soak: 10^6 guarded steps in one run; tau: a τ²-bench domain (--tau-data); "
        "tau-live: worker processes killed between a write and its record; "
        "fleet-live: real processes sharing Redis; serve: the operator page over real records",
    )
    _defaulted(bench, "--tasks", int, 1000, "tasks per agent cell")
    _defaulted(bench, "--seed", int, 7, "random seed")
    bench.add_argument("--scenario", action="append", help="only these scenarios (repeatable)")
    bench.add_argument("--json", metavar="PATH", help="write the results as JSON")
    bench.add_argument("--report", metavar="DIR", help="write a Markdown report with PNG plots")
    bench.add_argument("--quick", action="store_true", help="shorter overhead and soak suites")
    bench.add_argument(
        "--serve-runs",
        type=int,
        action="append",
        metavar="N",
        help="serve suite: a database of N runs (repeatable; default 1000, 10000, 100000)",
    )
    bench.add_argument(
        "--serve-pg",
        metavar="DSN",
        help="serve suite: time PostgreSQL too (a schema of its own, dropped after)",
    )
    tau = bench.add_argument_group("the tau suite (τ²-bench, graded by the database)")
    tau.add_argument(
        "--tau-data",
        metavar="DIR",
        help="a τ²-bench domain folder (a clone's data/tau2/domains/retail: db.json, "
        "tasks.json, policy.md); default $TETHER_TAU_DATA",
    )
    tau.add_argument(
        "--tau-policy",
        action="append",
        metavar="NAME",
        help="these policies (repeatable; 'all': every one; default: all but tether-no-lookup, "
        "tether-blind-lookup, tether-5-attempts and tether-openai)",
    )
    tau.add_argument(
        "--tau-lambda",
        action="append",
        type=float,
        metavar="RATE",
        help="fault rates (repeatable; default 0, 0.1, 0.2, 0.5)",
    )
    tau.add_argument(
        "--tau-task", action="append", metavar="ID", help="only these task ids (repeatable)"
    )
    _defaulted(tau, "--tau-seeds", int, 4, "trials per task, for pass^1..pass^N", metavar="N")
    bench.set_defaults(run_command=_bench)

    demo = sub.add_parser(
        "demo", help="the Northwind refund story, against a local payment service"
    )
    demo.set_defaults(
        run_command=lambda args: __import__("tether.cli._demo", fromlist=["main"]).main()
    )

    db_help = "the dead letters: a SQLite file or a PostgreSQL DSN"
    dlq = sub.add_parser("dlq", help="dead letters: list, show, replay")
    dlq.add_argument("--db", help=db_help)
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    listing = dlq_sub.add_parser(
        "list",
        help="list dead letters, newest first",
        description="The dead letters, newest first: ID, when it was parked (UTC), the tool, "
        "its error, TIMES (how many times the same call was asked and failed for good: a "
        "call asked again with a fresh request id joins its letter) and whether it was "
        "replayed. What it prints is redacted as on the operator page.",
    )
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.add_argument(
        "--limit", type=_limit, default=1000, help="at most this many (1..1000, default 1000)"
    )
    show = dlq_sub.add_parser("show", help="one dead letter as JSON")
    show.add_argument("id")
    replay = dlq_sub.add_parser(
        "replay",
        help="call a handler with a dead letter's arguments (once per letter)",
        description="Call HANDLER with the dead letter's stored arguments, once per letter: "
        "the call runs under the letter's ledger key, so a second replay (another terminal, "
        "a second click on the page) returns the recorded result and changes nothing, "
        "instead of calling the handler again (--force calls it again). "
        + HANDLER_CONTRACT
        + " --by names who replays it, as the page asks: kept on the letter, and once the "
        "handler ran the case of the letter's run is resolved in that name, linked to the "
        "letter (an outage's incident is left for a person to close).",
    )
    replay.add_argument("id")
    replay.add_argument(
        "--by",
        required=True,
        metavar="NAME",
        help="who replays it (a person's name, kept on the letter and on the case it "
        "resolves; required: a replay runs a side effect again)",
    )
    replay.add_argument(
        "--handler",
        required=True,
        help="module:function to call with the arguments (the contract: above)",
    )
    replay.add_argument(
        "--lookup",
        help="module:function that reads your records when a replay's outcome is "
        "unknown (returns the result if it happened, else None)",
    )
    replay.add_argument(
        "--force", action="store_true", help="run the handler again for a letter replayed before"
    )
    for action in (listing, show, replay):  # --db before or after the action
        action.add_argument("--db", default=argparse.SUPPRESS, help=db_help)
    dlq.set_defaults(run_command=_dlq)

    serve = sub.add_parser(
        "serve",
        help="the operator page: runs, inbox, dead letters, breakers, scopes",
        description="The operator page over the records a guard files. With --handler, a "
        "dead letter's page can replay it, at most once per letter. " + HANDLER_CONTRACT,
    )
    serve.add_argument(
        "--db",
        required=True,
        help="the records: a SQLite file or a PostgreSQL DSN (what Guard(records=...) writes)",
    )
    serve.add_argument(
        "--redis",
        help="a Redis URL: the breakers and the budget scopes a fleet shares there (the "
        "Breakers and Scopes pages)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    _defaulted(serve, "--port", int, 8765, "port")
    serve.add_argument(
        "--token",
        default=os.environ.get("TETHER_SERVE_TOKEN"),
        help="require this token (default $TETHER_SERVE_TOKEN); needed off loopback",
    )
    serve.add_argument(
        "--handler",
        help="module:function that replays dead letters (the contract: above)",
    )
    serve.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name browsers use to reach the page (repeatable; needs a token); "
        "without a token only 127.0.0.1, localhost and [::1] are served",
    )
    serve.add_argument(
        "--secrets",
        action="append",
        default=[],
        metavar="FILE_OR_MODULE:FN",
        help="your own secret names and patterns to redact on the pages: a TOML or "
        "JSON file, or module:function (repeatable)",
    )
    serve.set_defaults(run_command=_serve)

    records = sub.add_parser("records", help="the records a guard files: list, show, prune")
    records.add_argument("--db", help=RECORDS_DB)
    records_sub = records.add_subparsers(dest="records_command", required=True, metavar="ACTION")
    prune = records_sub.add_parser(
        "prune",
        help="remove records older than DAYS that nothing waits for",
        description="Remove run records, checkpoints, resumed approvals, resolved cases, "
        "replayed dead letters and ledger records expired before the cutoff, older than DAYS "
        "by the database's clock. Pending approvals, decisions not yet resumed, open cases, "
        "unreplayed dead letters (and their runs and checkpoints), and ledger records inside "
        "their ttl stay. A SQLite file is vacuumed after.",
    )
    prune.add_argument("--db", default=argparse.SUPPRESS, help=RECORDS_DB)
    _defaulted(prune, "--older-than", _days, 30.0, "how old a record must be", metavar="DAYS")
    prune.set_defaults(run_command=_records)
    from tether.cli._inspect import add_records_commands
    from tether.cli._scopes import add_scopes_commands

    add_records_commands(records_sub)
    add_scopes_commands(sub)


#: ``--db`` of ``tether records``: before or after the action
RECORDS_DB = "the records: a SQLite file or a PostgreSQL DSN"

#: what a dead letter's replay handler is (``dlq replay --help``, ``serve --help``)
HANDLER_CONTRACT = (
    "The handler is your function, module:function importable from the current "
    "directory: def handler(**arguments) -> result. It is called with the tool's keyword "
    "arguments as the letter stored them (handler(arguments) when they were not an "
    "object). Some arguments may have been redacted when the letter was stored (a secret, "
    "a card number: their value is '[redacted]'): then the handler must take a keyword "
    "'redacted' (or **kwargs), the list of their paths (e.g. ['args.api_key']), and fill "
    "those values itself from your secret store; a handler without it is refused before "
    "it is called. What it returns is the replay's result (JSON-able), recorded; the "
    "letter is then replayed. An exception means the replay failed: recorded as failed, "
    "the letter stays, and the next replay calls the handler again. It is called at most "
    "once per letter, but a process that dies while it runs leaves the outcome unknown: "
    "make it idempotent (an idempotency key your API takes, e.g. from the arguments); "
    "`tether dlq replay --lookup` reads your records to say whether it happened."
)


#: the most days ``--older-than`` takes (a ``datetime.timedelta`` holds no more)
MAX_DAYS = 999_999_999


def _limit(text: str) -> int:
    from tether.cli._inspect import limit

    return limit(text)


def _days(text: str) -> float:
    """``--older-than``: a finite number of days from 0 to :data:`MAX_DAYS` (argparse
    refuses anything else with exit code 2, naming the option)."""
    try:
        days = float(text)
    except ValueError:
        days = math.nan
    if not (math.isfinite(days) and 0 <= days <= MAX_DAYS):
        raise argparse.ArgumentTypeError(
            f"must be a number of days from 0 to {MAX_DAYS:,} (e.g. 30), got {text[:40]!r}"
        )
    return days


def _defaulted(
    parser: Any,
    flag: str,
    kind: Callable[[str], float],
    default: float,
    help: str,
    metavar: str | None = None,
) -> None:
    """A number option whose help ends with its default (given once, so the two agree)."""
    parser.add_argument(
        flag, type=kind, default=default, metavar=metavar, help=f"{help} (default {default:g})"
    )


#: what ``tether bench`` says when the tether-bench distribution is not installed
BENCH_MISSING = (
    "tether bench: the benchmark is not installed. It is the tether-bench distribution, "
    "the benchmarks/ folder of tether's repository: from a checkout, `make bench` installs "
    "and runs it, or `pip install -e benchmarks` installs it (with tether[all]); "
    "then run `tether bench` again."
)


def _bench(args: argparse.Namespace) -> int:
    import importlib

    try:
        bench = importlib.import_module("tether.bench")
    except ModuleNotFoundError as exc:
        if exc.name != "tether.bench":  # installed, but something it needs is not: say so
            raise
        print(BENCH_MISSING, file=sys.stderr)
        return 2
    from tether.bench._report import print_tables, screen_width, strip_series, write_report

    suites = args.suite or ["default"]
    if "default" in suites:  # the default set, and whatever else was named
        named = (s for s in suites if s != "default")
        suites = list(dict.fromkeys([*bench.SUITES, *named]))
    started, load = time.perf_counter(), _load()
    progress = _progress_printer()
    interrupt = _stop_on_interrupt()
    try:
        results = bench.run(
            suites,
            tasks=args.tasks,
            seed=args.seed,
            scenarios=args.scenario,
            quick_overhead=args.quick,
            progress=progress,
            serve_runs=args.serve_runs,
            serve_pg=args.serve_pg,
            tau_data=args.tau_data,
            tau_policies=args.tau_policy,
            tau_lambdas=args.tau_lambda,
            tau_tasks=args.tau_task,
            tau_seeds=args.tau_seeds,
        )
    except ValueError as exc:
        print(f"tether bench: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the processes are stopped; one line, the shell's 130
        progress.close()
        took = time.perf_counter() - started
        print(f"tether bench: interrupted after {took:.0f} s", file=sys.stderr)
        return 130
    finally:
        progress.close()
        signal.signal(signal.SIGINT, interrupt)
    elapsed, end_load = time.perf_counter() - started, _load()
    print_tables(results, [float(x) for x in (load, end_load) if x != "?"])
    _print_serve(results["suites"].get("serve"))
    tasks = f", {args.tasks} tasks per agent cell" if "agents" in results["suites"] else ""
    last = (
        f"tether bench: {elapsed:.1f} s (seed {args.seed}{tasks}; "
        f"load {load} -> {end_load} on {os.cpu_count() or '?'} cores)"
    )
    print("\n" + textwrap.fill(last, screen_width(), break_on_hyphens=False))
    command = (
        "tether " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        if len(sys.argv) > 1
        else "tether bench"
    )
    command = (
        "tether bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        if sys.argv[1:2] == ["bench"]
        else command
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(strip_series(results), f, indent=2)
        print(f"results written to {args.json}")
    if args.report:
        path = write_report(results, args.report, command.strip())
        print(f"report written to {path}")
    return 0


def _stop_on_interrupt() -> Any:
    """SIGINT (Ctrl-C) while the benchmark runs: its worker and provider processes, which
    ignore it, are terminated at once, then ``KeyboardInterrupt`` (a second Ctrl-C while
    they stop is ignored). Returns the handler it replaced."""
    from tether.bench._interrupt import stop_children

    def stop(signum: int, frame: object) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stop_children()
        raise KeyboardInterrupt

    return signal.signal(signal.SIGINT, stop)


def _print_serve(cells: Any) -> None:
    """The serve suite's timings: one line per database, size and page."""
    for backend, sizes in (cells or {}).items():
        for size, pages in sizes.items():
            for page, timing in pages.items():
                if isinstance(timing, dict):
                    figures = ", ".join(f"{k} {v}" for k, v in timing.items())
                    print(f"serve {backend} {size} runs  {page}: {figures}")


#: a progress message ending so names the step now running (nothing more is done yet)
RUNNING = " …"


class _Lines:
    """Progress off a terminal (``make bench`` piped, CI, a log): a line on stderr when a
    suite starts, then one at most every ``every`` seconds with the step running, the count
    done and the time, also while a long step sends nothing, so a long suite is never silent."""

    def __init__(self, every: float = 10.0) -> None:
        import threading

        self.every = every
        self.started = time.perf_counter()
        self.seen: dict[str, list[float]] = {}  # suite -> [done, total]
        self.last = ("", self.started)  # the latest message, when a line was last printed
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.beat = threading.Thread(target=self._beat, daemon=True)
        self.beat.start()

    def __call__(self, message: str, total: int) -> None:
        suite = message.split(":", 1)[0]
        with self.lock:
            state = self.seen.get(suite)
            if state is None:
                state = self.seen[suite] = [0, total]
                print(f"tether bench: {suite} started", file=sys.stderr, flush=True)
            if not message.endswith(RUNNING):
                state[0] += 1
            state[1] = total
            self.last = (message, self.last[1])
            if time.perf_counter() - self.last[1] >= self.every:
                self._say()

    def _say(self) -> None:
        message = self.last[0]
        now = time.perf_counter()
        done, total = self.seen[message.split(":", 1)[0]]
        count = f"{done:.0f} of {total:.0f} done" if total else f"{done:.0f} done"
        print(
            f"tether bench: {message} ({count}, {now - self.started:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
        self.last = (message, now)

    def _beat(self) -> None:
        while not self.stopped.wait(self.every / 4):
            with self.lock:
                if self.last[0] and time.perf_counter() - self.last[1] >= self.every:
                    self._say()

    def close(self) -> None:
        self.stopped.set()
        self.beat.join()


class _Progress:
    """A rich progress bar per suite on a terminal (``progress(message, total)``, where the
    message starts with ``suite:`` and ends with ``" …"`` while a step runs); :class:`_Lines`
    elsewhere."""

    def __init__(self, bar: Any) -> None:
        self.bar = bar
        self.tasks: dict[str, Any] = {}
        self.started = time.perf_counter()

    def __call__(self, message: str, total: int) -> None:
        suite = message.split(":", 1)[0]
        if suite not in self.tasks:
            if not self.bar.live.is_started:
                self.bar.start()
            self.tasks[suite] = self.bar.add_task(suite, total=total or None)
        task = self.tasks[suite]
        advance = 0 if message.endswith(RUNNING) else 1
        self.bar.update(task, advance=advance, description=message, total=total or None)

    def close(self) -> None:
        if self.bar.live.is_started:
            self.bar.stop()


def _progress_printer() -> _Progress | _Lines:
    """A rich progress bar on a terminal; lines on stderr elsewhere (or without rich)."""
    if not sys.stderr.isatty():
        return _Lines()
    try:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )
    except ImportError:
        return _Lines()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    return _Progress(Progress(*columns, console=Console(stderr=True), transient=True))


def _dlq(args: argparse.Namespace) -> int:
    from tether.cli import _inspect

    # --db was checked before (tether.cli.main): given, and a file or a DSN that answers
    if args.dlq_command == "replay":
        return _replay(args)
    with _inspect.dead_letters(args.db) as letters:
        if args.dlq_command == "list":
            return _inspect.list_letters(letters, args.json, args.limit)
        try:
            letter = letters.get(args.id)
        except KeyError as exc:
            print(f"tether dlq: {exc.args[0]}", file=sys.stderr)
            return 1
        return _inspect.show_doc(letter.to_doc())


def _import_handler(spec: str, command: str) -> Any:
    """``module:function``, imported from the current directory as ``python -m`` would;
    None (after saying why) when it cannot be."""
    module, _, name = spec.partition(":")
    if not module or not name:
        print(f"tether {command}: --handler must be module:function", file=sys.stderr)
        return None
    import importlib

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        print(f"tether {command}: cannot import the handler {spec!r}: {exc}", file=sys.stderr)
        return None


def _serve(args: argparse.Namespace) -> int:
    from tether.serve import create_app, host_name, is_loopback

    if not is_loopback(args.host) and not args.token:
        print(
            f"tether serve: {args.host} is not a loopback address: give a token (--token or "
            "TETHER_SERVE_TOKEN) so that only people who have it can act",
            file=sys.stderr,
        )
        return 2
    if args.allowed_host and not args.token:
        return _refused(
            "--allowed-host needs a token (--token or TETHER_SERVE_TOKEN); without "
            "one only 127.0.0.1, localhost and [::1] are served"
        )
    allowed = list(args.allowed_host)
    if not is_loopback(args.host):
        if args.host not in ("0.0.0.0", "::", ""):  # a browser may use the address itself
            allowed.append(args.host)
        elif not allowed:
            return _refused(
                f"binding {args.host or 'every address'} needs --allowed-host NAME: "
                "the names browsers use to reach the page (any other Host is refused)"
            )
    try:
        allowed = [host_name(name) for name in allowed]
    except ValueError as exc:
        return _refused(f"--allowed-host: {exc}")
    handler = None
    if args.handler:
        handler = _import_handler(args.handler, "serve")
        if handler is None:
            return 2
    from tether.redaction._redact import load_secrets

    for spec in args.secrets:
        try:
            load_secrets(spec)
        except (ValueError, TypeError, ImportError, AttributeError, OSError) as exc:
            print(f"tether serve: --secrets {spec}: {exc}", file=sys.stderr)
            return 2
    import uvicorn

    from tether.serve._server import server_config

    app = create_app(
        args.db, redis=args.redis, token=args.token, handler=handler, allowed_hosts=allowed
    )
    print(
        f"tether serve: http://{args.host}:{args.port}/"
        + ("  (token required)" if args.token else "")
    )
    uvicorn.Server(server_config(app, host=args.host, port=args.port)).run()
    return 0


def _records(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from tether.records._records import Records

    def refused(why: str) -> int:
        print(f"tether records prune: {why}", file=sys.stderr)
        return 2

    if not (math.isfinite(args.older_than) and 0 <= args.older_than <= MAX_DAYS):
        return refused(f"--older-than must be a number of days from 0 to {MAX_DAYS:,}")
    with Records.open(args.db) as records:
        before = os.path.getsize(args.db) if not Records.is_dsn(args.db) else None
        pruned = records.prune(timedelta(days=args.older_than), vacuum=True)
    removed = (
        (pruned.runs, "runs"),
        (pruned.checkpoints, "checkpoints"),
        (pruned.approvals, "approvals"),
        (pruned.handoffs, "resolved cases"),
        (pruned.dead_letters, "replayed dead letters"),
        (pruned.ledger, "expired ledger records"),
    )
    width = max(len(f"{n:,}") for n, _ in removed)
    print(f"tether records prune: removed, older than {args.older_than:g} days:")
    for n, what in removed:
        print(f"  {n:>{width},}  {what}")
    print(
        "kept: pending approvals, decisions not yet resumed, open cases, dead letters\n"
        "not yet replayed (and their runs), ledger records inside their ttl"
    )
    if before is not None:
        after = os.path.getsize(args.db)
        print(f"the file, vacuumed: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
    return 0


def _refused(why: str) -> int:
    print(f"tether serve: {why}", file=sys.stderr)
    return 2


def _replay(args: argparse.Namespace) -> int:
    """``dlq replay``: the page's replay (:func:`tether.records._replay.replay_letter`), in
    the name ``--by`` gives, on the records in ``--db``."""
    by, force = args.by.strip(), args.force
    if not by:
        print("tether dlq: --by NAME: say who replays it", file=sys.stderr)
        return 2
    handler = _import_handler(args.handler, "dlq")
    lookup = _import_handler(args.lookup, "dlq") if args.lookup else None
    if handler is None or (args.lookup and lookup is None):
        return 2
    from tether.clock import system_clock
    from tether.records._records import Records
    from tether.records._replay import case_of_run, replay_letter

    with Records.open(args.db) as records:
        try:
            letter = records.dead_letters.get(args.id)
        except KeyError as exc:
            print(f"tether dlq: {exc.args[0]}", file=sys.stderr)
            return 1
        at = system_clock.wall()

        def replay() -> Replayed:
            return replay_letter(
                records, letter.id, handler, by=by, at=at, force=force, lookup=lookup
            )

        def now() -> DeadLetter:
            return records.dead_letters.get(letter.id)

        code = _replayed(letter.id, force, replay, now)
        case = case_of_run(records, letter.run_id) if code == 0 else None
        if case is not None and case.get("dead_letter") == letter.id:
            print(f"case {case['id']} resolved by {case.get('resolved_by', by)}")
        elif case is not None and case.get("incident"):
            print(f"case {case['id']} is an outage's incident: left open for a person to close")
    return code


def _replayed(
    letter_id: str, force: bool, replay: Callable[[], Replayed], now: Callable[[], DeadLetter]
) -> int:
    """Run ``replay`` and say how it went (``now``: the letter as it is); the exit code."""
    from tether._errors import EffectInProgress, UnknownOutcome
    from tether.records._collections import RedactedArguments

    try:
        replayed = replay()
    except RedactedArguments as exc:
        print(f"tether dlq: {exc}", file=sys.stderr)
        return 2
    except EffectInProgress:
        print(
            f"tether dlq: {letter_id} is being replayed right now{_by(now(), 'replaying')} "
            "(another terminal or process holds its replay, and its handler has not ended): "
            f"the handler was not called here. Once it ends, `tether dlq show {letter_id}` or "
            "a replay again tells how",
            file=sys.stderr,
        )
        return 1
    except UnknownOutcome as exc:
        print(
            f"tether dlq: an earlier replay of {letter_id} may have happened ({exc}); the "
            "handler was not called. Give --lookup module:function to check your records",
            file=sys.stderr,
        )
        return 1
    except Exception as exc:
        print(f"tether dlq: the handler failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    result, letter = replayed.result, replayed.letter
    if replayed.repaired:
        print(
            f"{letter_id} was replayed before{_by(letter, 'replayed')}: its handler ran then "
            "but the letter was not marked; it is marked now and the handler was not called "
            f"again (its recorded result: {result!r})"
        )
    elif not replayed.ran:
        print(
            f"{letter_id} was replayed before{_by(letter, 'replayed')}: the handler was not "
            f"called again and the letter is unchanged (its recorded result: {result!r}); "
            "pass --force to call it again"
        )
    else:
        print(f"replayed {letter_id}{' (forced)' if force else ''}: {result!r}")
    return 0


def _by(letter: DeadLetter, which: str) -> str:
    """ " by NAME at TIME" of the letter's ``which`` ("replayed" or "replaying"), as far as
    the letter knows them."""
    who, when = getattr(letter, f"{which}_by"), getattr(letter, f"{which}_at")
    return (f" by {who}" if who else "") + (f" at {_iso(when)}" if when else "")


def _iso(at: Any) -> Any:
    from tether.cli._inspect import iso

    return iso(at)


def _load() -> str:
    """The machine's 1-minute load average (what the bench's time depends on), or "?"."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except (AttributeError, OSError):  # not on this platform
        return "?"
