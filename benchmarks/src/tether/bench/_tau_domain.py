"""τ²-bench's retail domain, our own code: the tools, the policy's rules, a database hash.

Written from the domain's ``policy.md`` and the shape of its ``db.json`` (neither is
part of this project: the folder is read at run time). :class:`RetailDB` is one episode's
database: its :class:`~tether.bench._tau_data.Tables` (over the data loaded once per
process, :class:`RetailData`, copying a record only when it writes it), the read tools
(``_tau_reads``) and the write tools (``_tau_writes``) over them, and the commits. A rule
the policy states is checked before anything changes, and a broken rule is the domain's
error, returned to the model as text (``"Error: ..."``), as τ²-bench's tools do.

Every committed write is kept in the domain's own records (:attr:`RetailDB.commits`),
with the request id its caller sent (an API's idempotency record): that is the trace
a correct ``lookup`` reads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tether.bench._tau_data import RetailData, RetailError, Tables
from tether.bench._tau_reads import Reads
from tether.bench._tau_writes import Writes

__all__ = [
    "READS",
    "WRITES",
    "Commit",
    "domain_of",
    "RetailData",
    "RetailDB",
    "RetailError",
    "load_tasks",
    "target_of",
]

#: Tools that change nothing (``calculate`` included).
READS = (
    "find_user_id_by_email",
    "find_user_id_by_name_zip",
    "get_user_details",
    "get_order_details",
    "get_product_details",
    "get_item_details",
    "list_all_product_types",
    "calculate",
)
#: Tools with an effect (the transfer changes no record, but it hands the customer over).
WRITES = (
    "cancel_pending_order",
    "modify_pending_order_address",
    "modify_pending_order_payment",
    "modify_pending_order_items",
    "modify_user_address",
    "return_delivered_order_items",
    "exchange_delivered_order_items",
    "transfer_to_human_agents",
)


@dataclass(frozen=True, slots=True)
class Commit:
    """One write the domain applied."""

    tool: str
    target: str
    args: dict[str, Any]
    request_id: str | None
    result: str


def target_of(tool: str, args: dict[str, Any]) -> str:
    """What a write acts on: its order, or its user ("" for a transfer)."""
    return str(args.get("order_id") or args.get("user_id") or "")


class RetailDB:
    """One episode's database over the shared :class:`RetailData`: its tables, the read
    and write tools over them, and the commits of the writes."""

    def __init__(self, data: RetailData) -> None:
        self.data = data
        self.tables = Tables(data)
        self.reads = Reads(self.tables)
        self.writes = Writes(self.tables)
        self.commits: list[Commit] = []

    def db_hash(self) -> str:
        """A digest of the whole database (:meth:`Tables.digest`)."""
        return self.tables.digest()

    def request(self, request_id: str) -> str | None:
        """The result of the committed write that carried ``request_id``, or None."""
        for commit in reversed(self.commits):
            if commit.request_id == request_id:
                return commit.result
        return None

    def call(self, tool: str, args: dict[str, Any], request_id: str | None = None) -> str:
        """Run ``tool`` with ``args``; its result, or the domain's error as text."""
        if tool not in READS + WRITES:
            return f"Error: unknown tool {tool}"
        method: Callable[..., str] = getattr(self.writes if tool in WRITES else self.reads, tool)
        try:
            if tool in WRITES:
                result = method(**args)
                self.commits.append(
                    Commit(tool, target_of(tool, args), dict(args), request_id, result)
                )
                return result
            return method(**args)
        except RetailError as exc:
            return f"Error: {exc}"
        except TypeError as exc:  # arguments that do not fit the tool
            return f"Error: {exc}"


def domain_of(folder: str) -> str:
    """The domain's name, as its tasks state it (``retail``), else the folder's name."""
    with open(os.path.join(folder, "tasks.json"), encoding="utf-8") as f:
        tasks = json.load(f)
    for task in tasks if isinstance(tasks, list) else ():
        instructions = ((task.get("user_scenario") or {}).get("instructions")) or {}
        if isinstance(instructions, dict) and isinstance(instructions.get("domain"), str):
            return str(instructions["domain"])
    return os.path.basename(os.path.normpath(folder))


def load_tasks(folder: str) -> list[dict[str, Any]]:
    """The domain's tasks (``tasks.json``): each with its id and golden actions."""
    path = os.path.join(folder, "tasks.json")
    with open(path, encoding="utf-8") as f:
        tasks = json.load(f)
    if not isinstance(tasks, list):
        raise ValueError(f"{path}: expected a list of tasks")
    out = []
    for task in tasks:
        actions = (task.get("evaluation_criteria") or {}).get("actions") or []
        out.append(
            {
                "id": str(task["id"]),
                "actions": [
                    {"name": a["name"], "arguments": dict(a["arguments"])} for a in actions
                ],
            }
        )
    return out
