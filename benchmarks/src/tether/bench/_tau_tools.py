"""The retail tools as typed functions, for every framework, and the lookups of the writes.

Each tool is a plain async function with type hints and a docstring, so that each
framework builds its own schema from it (LangChain's ``StructuredTool``, the Agents SDK's
``function_tool``, PydanticAI's ``Tool``, ``tether.Tool``); ``SYNC`` holds the same tools
as plain functions for the synchronous ``run_agent``. They act on the episode that runs
in this process (:func:`tether.bench._tau_world.current`); a tool of many arguments sends
its ``locals()``, which at the top of its body are exactly its arguments.

``LOOKUPS`` are the writes' lookups for tether: each reads the domain's records for the
effect's own trace, the request id the write carried (``tether.current_idempotency_key()``
is sent with every write). ``BLIND_LOOKUPS`` are the mistake the docs warn about: they
re-read a field the write never sets, find nothing, and so tether runs the write again.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from tether.bench._tau_domain import WRITES
from tether.bench._tau_world import current, execute

__all__ = ["ASYNC", "BLIND_LOOKUPS", "LOOKUPS", "SYNC", "describe_effect"]


async def find_user_id_by_email(email: str) -> str:
    """Find a user id by e-mail address."""
    return execute("find_user_id_by_email", {"email": email})


async def find_user_id_by_name_zip(first_name: str, last_name: str, zip: str) -> str:
    """Find a user id by first name, last name and zip code."""
    return execute("find_user_id_by_name_zip", locals())


async def get_user_details(user_id: str) -> str:
    """Get a user's profile: name, address, e-mail, payment methods and orders."""
    return execute("get_user_details", {"user_id": user_id})


async def get_order_details(order_id: str) -> str:
    """Get an order's status, items, address, fulfilments and payments."""
    return execute("get_order_details", {"order_id": order_id})


async def get_product_details(product_id: str) -> str:
    """Get a product type's variants (item ids, options, availability, prices)."""
    return execute("get_product_details", {"product_id": product_id})


async def get_item_details(item_id: str) -> str:
    """Get one variant item by its item id."""
    return execute("get_item_details", {"item_id": item_id})


async def list_all_product_types() -> str:
    """List the product types and their product ids."""
    return execute("list_all_product_types", {})


async def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression (numbers, + - * / and parentheses)."""
    return execute("calculate", {"expression": expression})


async def cancel_pending_order(order_id: str, reason: str) -> str:
    """Cancel a pending order; the reason is 'no longer needed' or 'ordered by mistake'."""
    return execute("cancel_pending_order", {"order_id": order_id, "reason": reason})


async def modify_pending_order_address(
    order_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str
) -> str:
    """Change the shipping address of a pending order."""
    return execute("modify_pending_order_address", locals())


async def modify_pending_order_payment(order_id: str, payment_method_id: str) -> str:
    """Pay a pending order with another of the user's payment methods."""
    return execute(
        "modify_pending_order_payment",
        {"order_id": order_id, "payment_method_id": payment_method_id},
    )


async def modify_pending_order_items(
    order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
) -> str:
    """Swap items of a pending order for other options of the same products (once per order)."""
    return execute("modify_pending_order_items", locals())


async def modify_user_address(
    user_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str
) -> str:
    """Change a user's default address."""
    return execute("modify_user_address", locals())


async def return_delivered_order_items(
    order_id: str, item_ids: list[str], payment_method_id: str
) -> str:
    """Return items of a delivered order; the refund goes to the original method or a gift card."""
    return execute("return_delivered_order_items", locals())


async def exchange_delivered_order_items(
    order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
) -> str:
    """Exchange items of a delivered order for other options of the same products (once per order)."""
    return execute("exchange_delivered_order_items", locals())


async def transfer_to_human_agents(summary: str) -> str:
    """Transfer the customer to a human agent, with a summary of the issue."""
    return execute("transfer_to_human_agents", {"summary": summary})


ASYNC: dict[str, Callable[..., Any]] = {
    fn.__name__: fn
    for fn in (
        find_user_id_by_email,
        find_user_id_by_name_zip,
        get_user_details,
        get_order_details,
        get_product_details,
        get_item_details,
        list_all_product_types,
        calculate,
        cancel_pending_order,
        modify_pending_order_address,
        modify_pending_order_payment,
        modify_pending_order_items,
        modify_user_address,
        return_delivered_order_items,
        exchange_delivered_order_items,
        transfer_to_human_agents,
    )
}


def _sync(name: str) -> Callable[..., str]:
    def tool(**kwargs: Any) -> str:
        return execute(name, kwargs)

    tool.__name__ = name
    tool.__doc__ = ASYNC[name].__doc__
    return tool


SYNC: dict[str, Callable[..., str]] = {name: _sync(name) for name in ASYNC}


def _lookup(key: str) -> Any:
    """The write that carried ``key``, from the domain's records (None: it never happened)."""
    return current().db.request(key)


#: A correct lookup for every write: the effect's own trace.
LOOKUPS: dict[str, Callable[[str], Any]] = dict.fromkeys(WRITES, _lookup)

# the fields a careless lookup checks: none of them is ever set by the write it checks
_NEVER_SET = {
    "cancel_pending_order": "cancelled_at",
    "modify_pending_order_address": "address_changed",
    "modify_pending_order_payment": "payment_changed",
    "modify_pending_order_items": "items_modified",
    "modify_user_address": "address_changed",
    "return_delivered_order_items": "returned",
    "exchange_delivered_order_items": "exchanged",
    "transfer_to_human_agents": "transferred",
}


def _blind(tool: str, key: str) -> Any:
    """Looks for a flag on the customer's orders that the write never sets: finds nothing."""
    episode = current()
    user = json.loads(episode.db.reads.get_user_details(_user_of(episode)))
    for order_id in user["orders"]:
        order = json.loads(episode.db.reads.get_order_details(order_id))
        if order.get(_NEVER_SET[tool]):
            return json.dumps(order)
    return None


def _user_of(episode: Any) -> str:
    for action in episode.task["actions"]:
        args = action["arguments"]
        if "user_id" in args:
            return str(args["user_id"])
        if "order_id" in args:
            found = episode.db.data.orders.get(args["order_id"])
            if found is not None:
                return str(found["user_id"])
    return str(next(iter(episode.db.data.users)))


BLIND_LOOKUPS: dict[str, Callable[[str], Any]] = {
    tool: functools.partial(_blind, tool) for tool in WRITES
}


def describe_effect(tool: str, args: Any, result: Any) -> str | None:
    """How tether states a done effect to the customer; a refusal of the domain is not one."""
    if isinstance(result, str) and result.startswith("Error: "):
        return None
    target = (
        str(args.get("order_id") or args.get("user_id") or "") if isinstance(args, dict) else ""
    )
    return f"[completed: {tool} {target}]".replace(" ]", "]")
