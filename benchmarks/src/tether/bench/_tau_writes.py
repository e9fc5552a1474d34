"""The retail domain's write tools: each checks the policy's rules before anything changes
(a broken rule is a :class:`RetailError`, nothing written), then writes the episode's
:class:`Tables`."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from tether.bench._tau_data import RetailError, Tables

__all__ = ["ADDRESS", "CANCEL_REASONS", "Writes"]

CANCEL_REASONS = ("no longer needed", "ordered by mistake")
#: the fields of an address, in the order the domain's records hold them
ADDRESS = ("address1", "address2", "city", "country", "state", "zip")


class Writes:
    """The write tools over one episode's :class:`Tables`, each returning the record written
    as JSON text; :attr:`transfers` holds the summaries of the handoffs to a person."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables
        self.data = tables.data
        self.transfers: list[str] = []

    # --- the rules ------------------------------------------------------------------------

    def _pending(self, order_id: str) -> dict[str, Any]:
        order = self.tables.order(order_id)
        if order["status"] != "pending":
            raise RetailError("non-pending order cannot be modified")
        return order

    def _delivered(self, order_id: str) -> dict[str, Any]:
        order = self.tables.order(order_id)
        if order["status"] != "delivered":
            raise RetailError("non-delivered order cannot be exchanged or returned")
        return order

    def _method(self, order: dict[str, Any], payment_method_id: str) -> dict[str, Any]:
        method = self.tables.user(order["user_id"])["payment_methods"].get(payment_method_id)
        if method is None:
            raise RetailError("payment method not found")
        return dict(method)

    def _credit_gift_card(self, user_id: str, method_id: str, amount: float) -> None:
        user = self.tables.writable_user(user_id)
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

    def _swap(
        self,
        state: Callable[[str], dict[str, Any]],
        order_id: str,
        item_ids: list[str],
        new_item_ids: list[str],
        payment_method_id: str,
    ) -> tuple[dict[str, Any], float, dict[str, Any]]:
        """Items of an order in the ``state`` a swap needs (``_pending``, ``_delivered``) for
        others of the same products, all checked: the order to write, the price difference,
        and the payment method that settles it (checked to cover it)."""
        order = state(order_id)
        diff = self._price_difference(order, item_ids, new_item_ids)
        method = self._method(order, payment_method_id)
        self._covered(method, diff)
        return self.tables.writable_order(order_id), diff, method

    # --- the tools ------------------------------------------------------------------------

    def cancel_pending_order(self, order_id: str, reason: str) -> str:
        order = self.tables.order(order_id)
        if order["status"] != "pending":
            raise RetailError("non-pending order cannot be cancelled")
        if reason not in CANCEL_REASONS:
            raise RetailError("invalid reason")
        order = self.tables.writable_order(order_id)
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

    def modify_pending_order_address(self, order_id: str, **address: str) -> str:
        """``address``: the fields of :data:`ADDRESS`."""
        fields = _address(address)
        self._pending(order_id)
        order = self.tables.writable_order(order_id)
        order["address"] = fields
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
        order = self.tables.writable_order(order_id)
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
        order, diff, method = self._swap(
            self._pending, order_id, item_ids, new_item_ids, payment_method_id
        )
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

    def modify_user_address(self, user_id: str, **address: str) -> str:
        """``address``: the fields of :data:`ADDRESS`."""
        fields = _address(address)
        user = self.tables.writable_user(user_id)
        user["address"] = fields
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
        order = self.tables.writable_order(order_id)
        order["status"] = "return requested"
        order["return_items"] = sorted(item_ids)
        order["return_payment_method_id"] = payment_method_id
        return json.dumps(order)

    def exchange_delivered_order_items(
        self, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
    ) -> str:
        order, diff, _ = self._swap(
            self._delivered, order_id, item_ids, new_item_ids, payment_method_id
        )
        order["status"] = "exchange requested"
        order["exchange_items"] = sorted(item_ids)
        order["exchange_new_items"] = sorted(new_item_ids)
        order["exchange_payment_method_id"] = payment_method_id
        order["exchange_price_difference"] = diff
        return json.dumps(order)

    def transfer_to_human_agents(self, summary: str) -> str:
        self.transfers.append(summary)
        return "Transfer successful"


def _address(fields: dict[str, str]) -> dict[str, str]:
    """An address as the domain's records hold it (its keys in their order); a TypeError
    (arguments that do not fit the tool) for a field missing or unknown."""
    missing = [name for name in ADDRESS if name not in fields]
    unknown = sorted(set(fields) - set(ADDRESS))
    if missing or unknown:
        raise TypeError(
            f"an address takes {', '.join(ADDRESS)}; missing {missing or 'none'}, "
            f"unknown {unknown or 'none'}"
        )
    return {name: fields[name] for name in ADDRESS}
