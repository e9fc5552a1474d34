"""The retail domain's data: the database as loaded from ``db.json`` (:class:`RetailData`,
read-only, shared by every episode of a process) and one episode's :class:`Tables` over it,
which copy a record only when it is written, so that a fresh database costs nothing and its
hash reads only what changed."""

from __future__ import annotations

import copy
import hashlib
import json
import os
from typing import Any

__all__ = ["RetailData", "RetailError", "Tables", "email_key", "name_zip_key"]


class RetailError(Exception):
    """A rule of the domain refused the call; nothing changed."""


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def email_key(user: dict[str, Any]) -> str:
    """What ``find_user_id_by_email`` matches of a user."""
    return str(user["email"]).lower()


def name_zip_key(user: dict[str, Any]) -> tuple[str, str, str]:
    """What ``find_user_id_by_name_zip`` matches of a user."""
    name = user["name"]
    return (name["first_name"].lower(), name["last_name"].lower(), user["address"]["zip"])


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
            self.by_email.setdefault(email_key(user), []).append(user_id)
            self.by_name_zip.setdefault(name_zip_key(user), []).append(user_id)
        self.digest = hashlib.sha256(_canonical(data).encode()).hexdigest()


class Tables:
    """One episode's users and orders: the loaded records, and a copy of each one written
    (:attr:`users`, :attr:`orders`: the copies)."""

    def __init__(self, data: RetailData) -> None:
        self.data = data
        self.users: dict[str, dict[str, Any]] = {}
        self.orders: dict[str, dict[str, Any]] = {}

    def user(self, user_id: str) -> dict[str, Any]:
        user = self.users.get(user_id) or self.data.users.get(user_id)
        if user is None:
            raise RetailError("user not found")
        return user

    def order(self, order_id: str) -> dict[str, Any]:
        order = self.orders.get(order_id) or self.data.orders.get(order_id)
        if order is None:
            raise RetailError("order not found")
        return order

    def writable_user(self, user_id: str) -> dict[str, Any]:
        if user_id not in self.users:
            self.users[user_id] = copy.deepcopy(self.user(user_id))
        return self.users[user_id]

    def writable_order(self, order_id: str) -> dict[str, Any]:
        if order_id not in self.orders:
            self.orders[order_id] = copy.deepcopy(self.order(order_id))
        return self.orders[order_id]

    def digest(self) -> str:
        """A digest of the whole database: the data as loaded, and each record that differs.

        Two databases in the same state have the same hash (a record written back to its
        loaded value counts as unchanged), whatever the order of the writes.
        """
        changed = []
        for table, overlay, base in (
            ("users", self.users, self.data.users),
            ("orders", self.orders, self.data.orders),
        ):
            for key in sorted(overlay):
                if overlay[key] != base.get(key):
                    changed.append([table, key, overlay[key]])
        return hashlib.sha256((self.data.digest + _canonical(changed)).encode()).hexdigest()
