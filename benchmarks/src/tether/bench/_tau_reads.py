"""The retail domain's read tools (they change nothing; ``calculate`` included)."""

from __future__ import annotations

import ast
import json
import operator
from collections.abc import Callable
from typing import Any

from tether.bench._tau_data import RetailError, Tables, email_key, name_zip_key

__all__ = ["Reads"]


class Reads:
    """The read tools over one episode's :class:`Tables`, each returning JSON text."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables
        self.data = tables.data

    def _find_user(
        self,
        index: dict[Any, list[str]],
        key_of: Callable[[dict[str, Any]], Any],
        key: Any,
    ) -> str:
        """The first user, in the table's order, whose record as it is now has ``key``:
        of the loaded users that match and were not written since, and the written ones."""
        written = self.tables.users
        found = [u for u in index.get(key, ()) if u not in written]
        found += [u for u, user in written.items() if key_of(user) == key]
        if not found:
            raise RetailError("user not found")
        return min(found, key=self.data.position.__getitem__)

    def find_user_id_by_email(self, email: str) -> str:
        return self._find_user(self.data.by_email, email_key, email.lower())

    def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:
        key = (first_name.lower(), last_name.lower(), zip)
        return self._find_user(self.data.by_name_zip, name_zip_key, key)

    def get_user_details(self, user_id: str) -> str:
        return json.dumps(self.tables.user(user_id))

    def get_order_details(self, order_id: str) -> str:
        return json.dumps(self.tables.order(order_id))

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
