"""``tether scopes set`` and ``tether scopes list``: the budget scopes a fleet shares in Redis
(``--redis``) or in its records database on PostgreSQL or SQLite (``--db``)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

__all__ = ["add_scopes_commands"]


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text[:40]!r}")
    return value


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text[:40]!r}")
    return int(text)


#: ``--db`` of ``tether scopes``, before or after the action
_DB = (
    "instead of Redis: the records database the fleet's BudgetScopes(records) use, "
    "a PostgreSQL DSN or a SQLite file"
)


def _where(parser: Any) -> None:
    parser.add_argument(
        "--redis",
        default=os.environ.get("TETHER_REDIS_URL"),
        help="the Redis URL the fleet's BudgetScopes use (default $TETHER_REDIS_URL)",
    )
    parser.add_argument(
        "--prefix", default="tether", help="the RedisStore's prefix (default tether)"
    )
    parser.add_argument("--db", default=argparse.SUPPRESS, help=_DB)
    parser.add_argument(
        "--table",
        default="tether_documents",
        help="with --db DSN: the records' table, as Records.postgres(dsn, table) (default "
        "tether_documents)",
    )


def add_scopes_commands(sub: Any) -> None:
    """``tether scopes set NAME ...`` and ``tether scopes list``."""
    scopes = sub.add_parser("scopes", help="budget scopes shared by a fleet: set, list")
    scopes.add_argument("--db", help=_DB)
    scopes_sub = scopes.add_subparsers(dest="scopes_command", required=True, metavar="ACTION")
    put = scopes_sub.add_parser(
        "set",
        help="set a scope's limits (those not given stay as they are)",
        description="Set the limits of a budget scope (a tenant, a user, a team). A limit not "
        "given keeps its value; 'none' removes it. Raising a limit gives room at once: the "
        "runs it lists as waiting can be resumed (guard.resume(checkpoint_id)).",
    )
    put.add_argument("name", help='the scope\'s name, e.g. "tenant:acme"')
    for flag, kind, what in (
        ("--max-cost-usd", _number, "USD"),
        ("--max-tokens", _count, "tokens (input and output)"),
        ("--max-model-calls", _count, "model calls"),
        ("--window", _number, "seconds of a rolling window"),
    ):
        put.add_argument(flag, type=_or_none(kind), default=KEEP, help=f"{what}, or none")
    _where(put)
    put.set_defaults(run_command=scopes_set)
    listing = scopes_sub.add_parser(
        "list", help="every scope: its limits, spend, calls in flight and waiting runs"
    )
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _where(listing)
    listing.set_defaults(run_command=scopes_list)


#: an option not given: the limit keeps its value
KEEP: Any = object()


def _or_none(kind: Any) -> Any:
    def parse(text: str) -> Any:
        return None if text.lower() == "none" else kind(text)

    parse.__name__ = kind.__name__
    return parse


def _open(args: argparse.Namespace, command: str) -> Any:
    from tether.run._scopes import BudgetScopes

    if args.db:
        from tether._errors import StoreUnavailable
        from tether.records._records import Records

        try:
            if Records.is_dsn(args.db):
                return BudgetScopes(Records.postgres(args.db, args.table))
            return BudgetScopes(Records.sqlite(args.db))
        except StoreUnavailable as exc:
            print(f"tether scopes {command}: {exc}", file=sys.stderr)
            return None
    if not args.redis:
        print(
            f"tether scopes {command}: give --redis URL (or set TETHER_REDIS_URL), or --db "
            "DSN|PATH: the scopes a fleet shares live in Redis or in its records database",
            file=sys.stderr,
        )
        return None
    from tether.stores.redis._store import RedisStore

    return BudgetScopes(RedisStore(args.redis, prefix=args.prefix))


def scopes_set(args: argparse.Namespace) -> int:
    from tether._errors import StoreUnavailable

    scopes = _open(args, "set")
    if scopes is None:
        return 2
    try:
        old = scopes.view(args.name).limits
        given = {
            "max_cost_usd": args.max_cost_usd,
            "max_tokens": args.max_tokens,
            "max_model_calls": args.max_model_calls,
            "window": args.window,
        }
        limits = {k: getattr(old, k) if v is KEEP else v for k, v in given.items()}
        scopes.limit(args.name, **limits)
        view = scopes.view(args.name)
    except (StoreUnavailable, ValueError) as exc:
        print(f"tether scopes set: {exc}", file=sys.stderr)
        return 1
    finally:
        scopes.store.close()
    print(f"{args.name}: {_limits(view.limits)}; spent {_spent(view.spent)}")
    if view.waiting:
        print(f"{len(view.waiting)} run(s) waiting; resume them with guard.resume(checkpoint_id):")
        for run_id, checkpoint_id in sorted(view.waiting.items()):
            print(f"  {run_id}  {checkpoint_id}")
    return 0


def scopes_list(args: argparse.Namespace) -> int:
    from tether._errors import StoreUnavailable
    from tether.cli._where import scopes_filed

    if args.db and args.table == "tether_documents" and not scopes_filed(args.db):
        print("[]" if args.json else "no scopes")  # opening them would add their tables
        return 0
    scopes = _open(args, "list")
    if scopes is None:
        return 2
    try:
        views = [scopes.view(name) for name in scopes.names()]
    except StoreUnavailable as exc:
        print(f"tether scopes list: {exc}", file=sys.stderr)
        return 1
    finally:
        scopes.store.close()
    if args.json:
        print(json.dumps([_doc(v) for v in views], indent=2))
        return 0
    if not views:
        print("no scopes")
        return 0
    rows = [("SCOPE", "LIMITS", "SPENT", "IN FLIGHT", "WAITING")]
    rows += [
        (v.name, _limits(v.limits), _spent(v.spent), str(v.in_flight), str(len(v.waiting)))
        for v in views
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _limits(limits: Any) -> str:
    parts = []
    if limits.max_cost_usd is not None:
        parts.append(f"${limits.max_cost_usd:.4f}")
    if limits.max_tokens is not None:
        parts.append(f"{limits.max_tokens:,} tokens")
    if limits.max_model_calls is not None:
        parts.append(f"{limits.max_model_calls:,} calls")
    text = ", ".join(parts) or "no limit"
    return f"{text} per {limits.window:g} s" if limits.window is not None else text


def _spent(usage: Any) -> str:
    return f"${usage.cost_usd:.4f}, {usage.total_tokens:,} tokens, {usage.model_calls:,} calls"


def _doc(view: Any) -> dict[str, Any]:
    lim, spent = view.limits, view.spent
    return {
        "name": view.name,
        "limits": {
            "max_cost_usd": lim.max_cost_usd,
            "max_tokens": lim.max_tokens,
            "max_model_calls": lim.max_model_calls,
            "window": lim.window,
        },
        "spent": {
            "cost_usd": spent.cost_usd,
            "input_tokens": spent.input_tokens,
            "output_tokens": spent.output_tokens,
            "model_calls": spent.model_calls,
        },
        "in_flight": view.in_flight,
        "waiting": view.waiting,
    }
