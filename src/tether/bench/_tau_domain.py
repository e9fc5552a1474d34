"""τ²-bench's retail domain, our own code: the tools, the policy's rules, a database hash.

Written from the domain's ``policy.md`` and the shape of its ``db.json`` (neither is
part of this project: the folder is read at run time). Every read and write is a
method of :class:`RetailDB`; a rule the policy states is checked before anything
changes, and a broken rule is the domain's error, returned to the model as text
(``"Error: ..."``), as τ²-bench's tools do.

A database loaded once (:class:`RetailData`) is shared by every episode of a process;
an episode's :class:`RetailDB` copies a record only when it writes it, so that a fresh
database costs nothing and its hash reads only what changed.

Every committed write is kept in the domain's own records (:attr:`RetailDB.commits`),
with the request id its caller sent (an API's idempotency record): that is the trace
a correct ``lookup`` reads.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import json
import operator
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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

CANCEL_REASONS = ("no longer needed", "ordered by mistake")


class RetailError(Exception):
    """A rule of the domain refused the call; nothing changed."""


@dataclass(frozen=True, slots=True)
class Commit:
    """One write the domain applied."""

    tool: str
    target: str
    args: dict[str, Any]
    request_id: str | None
    result: str


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def target_of(tool: str, args: dict[str, Any]) -> str:
    """What a write acts on: its order, or its user ("" for a transfer)."""
    return str(args.get("order_id") or args.get("user_id") or "")


class RetailData:
    """The domain's database as loaded from ``db.json`` (read-only, shared)."""

    def __init__(self, folder: str) -> None:
        path = os.path.join(folder, "db.json")
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        for table in ("users", "orders", "products"):
            if not isinstance(data.get(table), dict):
                raise ValueError(f"{path}: no {table!r} table; is this a τ²-bench retail folder?")
        self.users: dict[str, dict[str, Any]] = data["users"]
        self.orders: dict[str, dict[str, Any]] = data["orders"]
        self.products: dict[str, dict[str, Any]] = data["products"]
        self.items: dict[str, str] = {}  # item id -> product id
        for product_id, product in self.products.items():
            for item_id in product["variants"]:
                self.items[item_id] = product_id
        # the users as loaded, by what the finds match (in the table's order)
        self.position = {user_id: i for i, user_id in enumerate(self.users)}
        self.by_email: dict[str, list[str]] = {}
        self.by_name_zip: dict[tuple[str, str, str], list[str]] = {}
        for user_id, user in self.users.items():
            self.by_email.setdefault(_email_key(user), []).append(user_id)
            self.by_name_zip.setdefault(_name_zip_key(user), []).append(user_id)
        self.digest = hashlib.sha256(_canonical(data).encode()).hexdigest()


class RetailDB:
    """One episode's database over the shared :class:`RetailData`, and its tools."""

    def __init__(self, data: RetailData) -> None:
        self.data = data
        self._users: dict[str, dict[str, Any]] = {}
        self._orders: dict[str, dict[str, Any]] = {}
        self.commits: list[Commit] = []
        self.transfers: list[str] = []

    # --- records --------------------------------------------------------------------------

    def _user(self, user_id: str) -> dict[str, Any]:
        user = self._users.get(user_id) or self.data.users.get(user_id)
        if user is None:
            raise RetailError("user not found")
        return user

    def _order(self, order_id: str) -> dict[str, Any]:
        order = self._orders.get(order_id) or self.data.orders.get(order_id)
        if order is None:
            raise RetailError("order not found")
        return order

    def _writable_user(self, user_id: str) -> dict[str, Any]:
        if user_id not in self._users:
            self._users[user_id] = copy.deepcopy(self._user(user_id))
        return self._users[user_id]

    def _writable_order(self, order_id: str) -> dict[str, Any]:
        if order_id not in self._orders:
            self._orders[order_id] = copy.deepcopy(self._order(order_id))
        return self._orders[order_id]

    def db_hash(self) -> str:
        """A digest of the whole database: the data as loaded, and each record that differs.

        Two databases in the same state have the same hash (a record written back to its
        loaded value counts as unchanged), whatever the order of the writes.
        """
        changed = []
        for table, overlay, base in (
            ("users", self._users, self.data.users),
            ("orders", self._orders, self.data.orders),
        ):
            for key in sorted(overlay):
                if overlay[key] != base.get(key):
                    changed.append([table, key, overlay[key]])
        return hashlib.sha256((self.data.digest + _canonical(changed)).encode()).hexdigest()

    def request(self, request_id: str) -> str | None:
        """The result of the committed write that carried ``request_id``, or None."""
        for commit in reversed(self.commits):
            if commit.request_id == request_id:
                return commit.result
        return None

    def call(self, tool: str, args: dict[str, Any], request_id: str | None = None) -> str:
        """Run ``tool`` with ``args``; its result, or the domain's error as text."""
        method: Callable[..., str] | None = getattr(self, tool, None)
        if tool not in READS + WRITES or method is None:
            return f"Error: unknown tool {tool}"
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

    # --- reads ----------------------------------------------------------------------------

    def _find_user(
        self,
        index: dict[Any, list[str]],
        key_of: Callable[[dict[str, Any]], Any],
        key: Any,
    ) -> str:
        """The first user, in the table's order, whose record as it is now has ``key``:
        of the loaded users that match and were not written since, and the written ones."""
        found = [u for u in index.get(key, ()) if u not in self._users]
        found += [u for u, user in self._users.items() if key_of(user) == key]
        if not found:
            raise RetailError("user not found")
        return min(found, key=self.data.position.__getitem__)

    def find_user_id_by_email(self, email: str) -> str:
        return self._find_user(self.data.by_email, _email_key, email.lower())

    def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:
        key = (first_name.lower(), last_name.lower(), zip)
        return self._find_user(self.data.by_name_zip, _name_zip_key, key)

    def get_user_details(self, user_id: str) -> str:
        return json.dumps(self._user(user_id))

    def get_order_details(self, order_id: str) -> str:
        return json.dumps(self._order(order_id))

    def get_product_details(self, product_id: str) -> str:
        product = self.data.products.get(product_id)
        if product is None:
            raise RetailError("product not found")
        return json.dumps(product)

    def get_item_details(self, item_id: str) -> str:
        product_id = self.data.items.get(item_id)
        if product_id is None:
            raise RetailError("item not found")
        item = self.data.products[product_id]["variants"][item_id]
        return json.dumps({**item, "product_id": product_id})

    def list_all_product_types(self) -> str:
        names = {p["name"]: pid for pid, p in self.data.products.items()}
        return json.dumps(dict(sorted(names.items())))

    def calculate(self, expression: str) -> str:
        if not expression or any(c not in "0123456789+-*/(). " for c in expression):
            raise RetailError("invalid characters in expression")
        try:
            value = _evaluate(ast.parse(expression, mode="eval").body)
        except (SyntaxError, ZeroDivisionError, ValueError) as exc:
            raise RetailError(f"cannot calculate {expression!r}: {exc}") from None
        return str(round(value, 2))

    # --- writes ---------------------------------------------------------------------------

    def _pending(self, order_id: str) -> dict[str, Any]:
        order = self._order(order_id)
        if order["status"] != "pending":
            raise RetailError("non-pending order cannot be modified")
        return order

    def _delivered(self, order_id: str) -> dict[str, Any]:
        order = self._order(order_id)
        if order["status"] != "delivered":
            raise RetailError("non-delivered order cannot be exchanged or returned")
        return order

    def _method(self, order: dict[str, Any], payment_method_id: str) -> dict[str, Any]:
        method = self._user(order["user_id"])["payment_methods"].get(payment_method_id)
        if method is None:
            raise RetailError("payment method not found")
        return dict(method)

    def _credit_gift_card(self, user_id: str, method_id: str, amount: float) -> None:
        user = self._writable_user(user_id)
        card = user["payment_methods"][method_id]
        card["balance"] = round(card["balance"] + amount, 2)

    def _check_items(self, order: dict[str, Any], item_ids: list[str]) -> None:
        if not item_ids:
            raise RetailError("no items given")
        have = Counter(item["item_id"] for item in order["items"])
        for item_id, count in Counter(item_ids).items():
            if have[item_id] < count:
                raise RetailError(f"item {item_id} not found in the order")

    def _price_difference(
        self, order: dict[str, Any], item_ids: list[str], new_item_ids: list[str]
    ) -> float:
        if len(item_ids) != len(new_item_ids):
            raise RetailError("the number of items to be exchanged should match")
        self._check_items(order, item_ids)
        prices = {item["item_id"]: item for item in order["items"]}
        diff = 0.0
        for old, new in zip(item_ids, new_item_ids, strict=True):
            product_id = prices[old]["product_id"]
            variant = self.data.products[product_id]["variants"].get(new)
            if variant is None:
                raise RetailError(f"new item {new} not found or not of the same product")
            if new == old:
                raise RetailError(f"new item {new} is the same as the old one")
            if not variant["available"]:
                raise RetailError(f"new item {new} not available")
            diff += variant["price"] - prices[old]["price"]
        return round(diff, 2)

    def _covered(self, method: dict[str, Any], amount: float) -> None:
        if method["source"] == "gift_card" and method["balance"] < amount:
            raise RetailError("insufficient gift card balance to pay for the price difference")

    def cancel_pending_order(self, order_id: str, reason: str) -> str:
        order = self._order(order_id)
        if order["status"] != "pending":
            raise RetailError("non-pending order cannot be cancelled")
        if reason not in CANCEL_REASONS:
            raise RetailError("invalid reason")
        order = self._writable_order(order_id)
        refunds = []
        for payment in order["payment_history"]:
            if payment["transaction_type"] != "payment":
                continue
            refunds.append(
                {
                    "transaction_type": "refund",
                    "amount": payment["amount"],
                    "payment_method_id": payment["payment_method_id"],
                }
            )
            method = self._method(order, payment["payment_method_id"])
            if method["source"] == "gift_card":  # refunded at once
                self._credit_gift_card(order["user_id"], method["id"], payment["amount"])
        order["payment_history"].extend(refunds)
        order["status"] = "cancelled"
        order["cancel_reason"] = reason
        return json.dumps(order)

    def modify_pending_order_address(
        self,
        order_id: str,
        address1: str,
        address2: str,
        city: str,
        state: str,
        country: str,
        zip: str,
    ) -> str:
        self._pending(order_id)
        order = self._writable_order(order_id)
        order["address"] = _address(address1, address2, city, state, country, zip)
        return json.dumps(order)

    def modify_pending_order_payment(self, order_id: str, payment_method_id: str) -> str:
        order = self._pending(order_id)
        payments = [p for p in order["payment_history"] if p["transaction_type"] == "payment"]
        if len(payments) != 1:
            raise RetailError("there should be exactly one payment for a pending order")
        old = payments[0]
        if old["payment_method_id"] == payment_method_id:
            raise RetailError("the new payment method should be different from the current one")
        method = self._method(order, payment_method_id)
        amount = old["amount"]
        self._covered(method, amount)
        order = self._writable_order(order_id)
        order["payment_history"].extend(
            [
                {
                    "transaction_type": "payment",
                    "amount": amount,
                    "payment_method_id": payment_method_id,
                },
                {
                    "transaction_type": "refund",
                    "amount": amount,
                    "payment_method_id": old["payment_method_id"],
                },
            ]
        )
        if method["source"] == "gift_card":
            self._credit_gift_card(order["user_id"], payment_method_id, -amount)
        if self._method(order, old["payment_method_id"])["source"] == "gift_card":
            self._credit_gift_card(order["user_id"], old["payment_method_id"], amount)
        return json.dumps(order)

    def modify_pending_order_items(
        self, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
    ) -> str:
        order = self._pending(order_id)
        diff = self._price_difference(order, item_ids, new_item_ids)
        method = self._method(order, payment_method_id)
        self._covered(method, diff)
        order = self._writable_order(order_id)
        if diff:
            order["payment_history"].append(
                {
                    "transaction_type": "payment" if diff > 0 else "refund",
                    "amount": abs(diff),
                    "payment_method_id": payment_method_id,
                }
            )
        if method["source"] == "gift_card":
            self._credit_gift_card(order["user_id"], payment_method_id, -diff)
        for old, new in zip(item_ids, new_item_ids, strict=True):
            for item in order["items"]:
                if item["item_id"] == old:
                    variant = self.data.products[item["product_id"]]["variants"][new]
                    item.update(item_id=new, price=variant["price"], options=variant["options"])
                    break
        order["status"] = "pending (item modified)"
        return json.dumps(order)

    def modify_user_address(
        self,
        user_id: str,
        address1: str,
        address2: str,
        city: str,
        state: str,
        country: str,
        zip: str,
    ) -> str:
        user = self._writable_user(user_id)
        user["address"] = _address(address1, address2, city, state, country, zip)
        return json.dumps(user)

    def return_delivered_order_items(
        self, order_id: str, item_ids: list[str], payment_method_id: str
    ) -> str:
        order = self._delivered(order_id)
        self._check_items(order, item_ids)
        method = self._method(order, payment_method_id)
        original = order["payment_history"][0]["payment_method_id"]
        if payment_method_id != original and method["source"] != "gift_card":
            raise RetailError("payment method should be the original payment method or a gift card")
        order = self._writable_order(order_id)
        order["status"] = "return requested"
        order["return_items"] = sorted(item_ids)
        order["return_payment_method_id"] = payment_method_id
        return json.dumps(order)

    def exchange_delivered_order_items(
        self, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
    ) -> str:
        order = self._delivered(order_id)
        diff = self._price_difference(order, item_ids, new_item_ids)
        self._covered(self._method(order, payment_method_id), diff)
        order = self._writable_order(order_id)
        order["status"] = "exchange requested"
        order["exchange_items"] = sorted(item_ids)
        order["exchange_new_items"] = sorted(new_item_ids)
        order["exchange_payment_method_id"] = payment_method_id
        order["exchange_price_difference"] = diff
        return json.dumps(order)

    def transfer_to_human_agents(self, summary: str) -> str:
        self.transfers.append(summary)
        return "Transfer successful"


_OPERATORS: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _evaluate(node: ast.AST) -> float:
    """Arithmetic only: numbers, + - * / and parentheses (no names, no calls)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    raise ValueError("not an arithmetic expression")


def _email_key(user: dict[str, Any]) -> str:
    return str(user["email"]).lower()


def _name_zip_key(user: dict[str, Any]) -> tuple[str, str, str]:
    name = user["name"]
    return (name["first_name"].lower(), name["last_name"].lower(), user["address"]["zip"])


def _address(
    address1: str, address2: str, city: str, state: str, country: str, zip: str
) -> dict[str, str]:
    """An address as the domain's records hold it (its keys in their order)."""
    return {
        "address1": address1,
        "address2": address2,
        "city": city,
        "country": country,
        "state": state,
        "zip": zip,
    }


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
