"""The tau suite: τ²-bench's retail domain as our own tools, the scripted model, the faults, the grading.

The domain folder is read at run time (``TETHER_TAU_DATA``, by default the shared data next to
the repository); nothing of τ²-bench is part of this project. A subset of tasks runs here; the
full run is ``tether bench --suite tau``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest

import tether
from tether.bench._tau import (
    TauData,
    _added,
    dishonest,
    duplicates,
    pass_hat_k,
    resolve_folder,
    run_episode,
    run_tau,
    summarize,
)
from tether.bench._tau_domain import RetailData, RetailDB, load_tasks
from tether.bench._tau_formats import anthropic_transport
from tether.bench._tau_model import LOOP_P, Answer, Call, ScriptedModel, claims_of, draw
from tether.bench._tau_policies import CRASH_TEXT, installed
from tether.bench._tau_tools import BLIND_LOOKUPS, LOOKUPS
from tether.bench._tau_world import Episode, execute, set_current
from tether.bench._vloop import run_virtual
from tether.cli import main


@pytest.fixture(scope="module")
def tau(tau_data: str) -> TauData:
    return TauData(tau_data)


def _first(data: RetailData, test: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    return next(o for o in data.orders.values() if test(o))


def _method(data: RetailData, order: dict[str, Any], source: str) -> str | None:
    methods = data.users[order["user_id"]]["payment_methods"]
    return next((m for m, v in methods.items() if v["source"] == source), None)


def _swap(
    data: RetailData, order: dict[str, Any], available: bool = True
) -> tuple[str, str] | None:
    """An item of the order and another variant of its product (available or not)."""
    for item in order["items"]:
        for vid, variant in data.products[item["product_id"]]["variants"].items():
            if vid != item["item_id"] and variant["available"] is available:
                return item["item_id"], vid
    return None


# --- the domain: reads, writes and the policy's rules -----------------------------------------


def test_reads_find_users_orders_products_and_calculate(tau: TauData) -> None:
    """Users by e-mail or name + zip; details as JSON; arithmetic only."""
    db = RetailDB(tau.data)
    user = next(iter(tau.data.users.values()))
    assert db.call("find_user_id_by_email", {"email": user["email"].upper()}) == user["user_id"]
    name = user["name"]
    args = {
        "first_name": name["first_name"],
        "last_name": name["last_name"],
        "zip": user["address"]["zip"],
    }
    assert db.call("find_user_id_by_name_zip", args) == user["user_id"]
    assert db.call("find_user_id_by_name_zip", {**args, "zip": "00000"}) == "Error: user not found"
    assert (
        json.loads(db.call("get_user_details", {"user_id": user["user_id"]}))["email"]
        == user["email"]
    )
    order_id = user["orders"][0]
    assert json.loads(db.call("get_order_details", {"order_id": order_id}))["order_id"] == order_id
    assert db.call("get_order_details", {"order_id": "#W0"}) == "Error: order not found"
    product_id, product = next(iter(tau.data.products.items()))
    item_id = next(iter(product["variants"]))
    assert json.loads(db.call("get_item_details", {"item_id": item_id}))["product_id"] == product_id
    assert json.loads(db.call("list_all_product_types", {}))[product["name"]] == product_id
    assert db.call("calculate", {"expression": "(3131.1 + 4777.75) * 2 / 4"}) == "3954.43"
    assert db.call("calculate", {"expression": "__import__('os')"}).startswith(
        "Error: invalid characters"
    )
    assert db.call("calculate", {"expression": "1 / 0"}).startswith("Error: cannot calculate")
    assert db.call("no_such_tool", {}) == "Error: unknown tool no_such_tool"
    assert db.call("get_order_details", {"id": "#W1"}).startswith(
        "Error: "
    )  # arguments that do not fit
    assert db.commits == [] and db.db_hash() == RetailDB(tau.data).db_hash()  # reads change nothing


def test_cancel_refunds_and_cannot_happen_twice(tau: TauData) -> None:
    """A pending order is cancelled once, for a policy reason; a gift card is refunded at once."""
    order = _first(
        tau.data,
        lambda o: (
            o["status"] == "pending" and "gift_card" in o["payment_history"][0]["payment_method_id"]
        ),
    )
    card = order["payment_history"][0]["payment_method_id"]
    before = tau.data.users[order["user_id"]]["payment_methods"][card]["balance"]
    db = RetailDB(tau.data)
    assert (
        db.call(
            "cancel_pending_order", {"order_id": order["order_id"], "reason": "changed my mind"}
        )
        == "Error: invalid reason"
    )
    done = json.loads(
        db.call(
            "cancel_pending_order", {"order_id": order["order_id"], "reason": "no longer needed"}
        )
    )
    assert (done["status"], done["cancel_reason"]) == ("cancelled", "no longer needed")
    assert done["payment_history"][-1] == {
        "transaction_type": "refund",
        "amount": order["payment_history"][0]["amount"],
        "payment_method_id": card,
    }
    after = json.loads(db.call("get_user_details", {"user_id": order["user_id"]}))[
        "payment_methods"
    ][card]["balance"]
    assert after == pytest.approx(before + order["payment_history"][0]["amount"])
    again = db.call(
        "cancel_pending_order", {"order_id": order["order_id"], "reason": "no longer needed"}
    )
    assert again == "Error: non-pending order cannot be cancelled"
    assert len(db.commits) == 1
    assert (
        tau.data.orders[order["order_id"]]["status"] == "pending"
    )  # the loaded data is never written


def test_modify_items_rules(tau: TauData) -> None:
    """Same product, another option, available, paid by the user's method; once per order."""
    order = _first(tau.data, lambda o: o["status"] == "pending" and _swap(tau.data, o) is not None)
    old, new = _swap(tau.data, order) or ("", "")
    pay = order["payment_history"][0]["payment_method_id"]
    base = {
        "order_id": order["order_id"],
        "item_ids": [old],
        "new_item_ids": [new],
        "payment_method_id": pay,
    }
    db = RetailDB(tau.data)
    other_product = next(i for i, p in tau.data.items.items() if p != tau.data.items[old])
    assert db.call(
        "modify_pending_order_items", {**base, "new_item_ids": [other_product]}
    ).startswith("Error: new item")
    assert db.call("modify_pending_order_items", {**base, "new_item_ids": [old]}).endswith(
        "is the same as the old one"
    )
    assert (
        db.call("modify_pending_order_items", {**base, "item_ids": ["0"]})
        == "Error: item 0 not found in the order"
    )
    assert db.call("modify_pending_order_items", {**base, "new_item_ids": [new, new]}) == (
        "Error: the number of items to be exchanged should match"
    )
    assert db.call("modify_pending_order_items", {**base, "payment_method_id": "nope"}) == (
        "Error: payment method not found"
    )
    done = json.loads(db.call("modify_pending_order_items", base))
    assert done["status"] == "pending (item modified)"
    assert new in [i["item_id"] for i in done["items"]]
    assert (
        db.call("modify_pending_order_items", base) == "Error: non-pending order cannot be modified"
    )
    assert db.call(
        "cancel_pending_order", {"order_id": order["order_id"], "reason": "ordered by mistake"}
    ) == ("Error: non-pending order cannot be cancelled")
    unavailable = _first(
        tau.data, lambda o: o["status"] == "pending" and _swap(tau.data, o, False) is not None
    )
    old, new = _swap(tau.data, unavailable, False) or ("", "")
    refused = RetailDB(tau.data).call(
        "modify_pending_order_items",
        {
            "order_id": unavailable["order_id"],
            "item_ids": [old],
            "new_item_ids": [new],
            "payment_method_id": unavailable["payment_history"][0]["payment_method_id"],
        },
    )
    assert refused == f"Error: new item {new} not available"


def test_payment_address_return_and_exchange_rules(tau: TauData) -> None:
    """A different method that covers the total; the original method or a gift card for a refund;
    delivered orders only for returns and exchanges."""
    db = RetailDB(tau.data)
    pending = _first(tau.data, lambda o: o["status"] == "pending")
    current = pending["payment_history"][0]["payment_method_id"]
    assert db.call(
        "modify_pending_order_payment",
        {"order_id": pending["order_id"], "payment_method_id": current},
    ) == ("Error: the new payment method should be different from the current one")
    poor = _first(
        tau.data,
        lambda o: (
            o["status"] == "pending"
            and any(
                m["source"] == "gift_card"
                and m["balance"] < o["payment_history"][0]["amount"]
                and m["id"] != o["payment_history"][0]["payment_method_id"]
                for m in tau.data.users[o["user_id"]]["payment_methods"].values()
            )
        ),
    )
    card = next(
        m["id"]
        for m in tau.data.users[poor["user_id"]]["payment_methods"].values()
        if m["source"] == "gift_card" and m["balance"] < poor["payment_history"][0]["amount"]
    )
    assert db.call(
        "modify_pending_order_payment", {"order_id": poor["order_id"], "payment_method_id": card}
    ) == ("Error: insufficient gift card balance to pay for the price difference")
    address = {
        "address1": "1 Main St",
        "address2": "",
        "city": "Austin",
        "state": "TX",
        "country": "USA",
        "zip": "78701",
    }
    assert (
        json.loads(
            db.call("modify_pending_order_address", {"order_id": pending["order_id"], **address})
        )["address"]["zip"]
        == "78701"
    )
    delivered = _first(
        tau.data,
        lambda o: (
            o["status"] == "delivered"
            and _method(tau.data, o, "paypal") is not None
            and "paypal" not in o["payment_history"][0]["payment_method_id"]
        ),
    )
    item = delivered["items"][0]["item_id"]
    wrong = _method(tau.data, delivered, "paypal")
    assert db.call(
        "return_delivered_order_items",
        {"order_id": delivered["order_id"], "item_ids": [item], "payment_method_id": wrong},
    ) == ("Error: payment method should be the original payment method or a gift card")
    assert db.call(
        "exchange_delivered_order_items",
        {
            "order_id": pending["order_id"],
            "item_ids": [item],
            "new_item_ids": [item],
            "payment_method_id": current,
        },
    ) == ("Error: non-delivered order cannot be exchanged or returned")
    original = delivered["payment_history"][0]["payment_method_id"]
    done = json.loads(
        db.call(
            "return_delivered_order_items",
            {"order_id": delivered["order_id"], "item_ids": [item], "payment_method_id": original},
        )
    )
    assert (done["status"], done["return_items"]) == ("return requested", [item])
    user = next(iter(tau.data.users))
    assert (
        json.loads(db.call("modify_user_address", {"user_id": user, **address}))["address"]["city"]
        == "Austin"
    )
    assert (
        db.call("modify_user_address", {"user_id": "nobody_0", **address})
        == "Error: user not found"
    )
    assert (
        db.call("transfer_to_human_agents", {"summary": "wants a refund to another card"})
        == "Transfer successful"
    )


def test_db_hash_is_the_state_not_the_history(tau: TauData) -> None:
    """Same state, same hash: whatever the order of the writes; a write back to the loaded value
    counts as unchanged; any change shows; two loads of the folder agree."""
    user = next(iter(tau.data.users.values()))
    moved = {
        "address1": "1 Main St",
        "address2": "",
        "city": "Austin",
        "state": "TX",
        "country": "USA",
        "zip": "78701",
    }
    orders = [o for o in tau.data.orders.values() if o["status"] == "pending"][:2]
    one, two = RetailDB(tau.data), RetailDB(tau.data)
    initial = one.db_hash()
    for db, order in ((one, orders[0]), (one, orders[1]), (two, orders[1]), (two, orders[0])):
        db.call(
            "cancel_pending_order", {"order_id": order["order_id"], "reason": "no longer needed"}
        )
    assert one.db_hash() == two.db_hash() != initial
    three = RetailDB(tau.data)
    three.call("modify_user_address", {"user_id": user["user_id"], **moved})
    assert three.db_hash() != initial
    three.call("modify_user_address", {"user_id": user["user_id"], **user["address"]})
    assert three.db_hash() == initial
    again = TauData(tau.folder)
    assert {t: g.hash for t, g in again.golden.items()} == {
        t: g.hash for t, g in tau.golden.items()
    }
    assert len(tau.tasks) == 114 and len({g.hash for g in tau.golden.values()}) > 90


# --- the scripted model ------------------------------------------------------------------------


ACTIONS = [
    {"name": "get_order_details", "arguments": {"order_id": "#W1"}},
    {
        "name": "cancel_pending_order",
        "arguments": {"order_id": "#W1", "reason": "no longer needed"},
    },
]
ORDER = json.dumps({"order_id": "#W1", "status": "pending"})


def _turn(
    model: ScriptedModel, last: Call | Answer | None, text: str, flagged: bool = False
) -> Call | Answer:
    return model.decide({last.id: (text, flagged)} if isinstance(last, Call) else {})


def test_the_model_replays_the_golden_actions_then_answers() -> None:
    """One call per turn, in order; the answer states each write."""
    model = ScriptedModel(ACTIONS, "s")
    first = model.decide({})
    assert isinstance(first, Call) and (first.name, first.args) == (
        "get_order_details",
        {"order_id": "#W1"},
    )
    second = _turn(model, first, ORDER)
    assert (
        isinstance(second, Call) and second.name == "cancel_pending_order" and second.id != first.id
    )
    answer = _turn(model, second, ORDER)
    assert isinstance(answer, Answer)
    assert "[completed: cancel_pending_order #W1]" in answer.text
    assert model.input_tokens > 2600 and model.output_tokens > 0


def test_a_failed_write_is_reissued_then_a_refusal_is_believed() -> None:
    """TimeoutError: the same write again; the domain's refusal then: told "could not"."""
    model = ScriptedModel(ACTIONS, "s")
    read = model.decide({})
    write = _turn(model, read, ORDER)
    again = _turn(model, write, "TimeoutError: the retail API did not answer", flagged=True)
    assert isinstance(again, Call) and (again.name, again.args) == (write.name, write.args)  # type: ignore[union-attr]
    answer = _turn(model, again, "Error: non-pending order cannot be cancelled")
    assert isinstance(answer, Answer)
    assert "[could not complete: cancel_pending_order #W1]" in answer.text


def test_a_write_that_keeps_failing_is_reported_not_done() -> None:
    """Two re-issues, then the model gives that write up and says so."""
    model = ScriptedModel(ACTIONS, "s")
    turn = _turn(model, model.decide({}), ORDER)
    for _ in range(2):
        turn = _turn(model, turn, "An error occurred while running the tool.")
        assert isinstance(turn, Call) and turn.name == "cancel_pending_order"
    answer = _turn(model, turn, "An error occurred while running the tool.")
    assert (
        isinstance(answer, Answer)
        and "[could not complete: cancel_pending_order #W1]" in answer.text
    )


def test_a_read_that_keeps_failing_ends_with_an_apology() -> None:
    model = ScriptedModel(ACTIONS, "s")
    turn = model.decide({})
    for _ in range(3):
        turn = _turn(model, turn, "ConnectionError: 503", flagged=True)
    assert isinstance(turn, Answer) and turn.text.startswith("I'm sorry")
    assert "[could not complete: cancel_pending_order #W1]" in turn.text


@pytest.mark.parametrize("loops", [True, False])
def test_a_read_that_worked_after_failing_is_sometimes_read_again(loops: bool) -> None:
    """The loop on a read: seeded, at most once per read, only after a failure."""
    seed = next(f"s{n}" for n in range(1000) if (draw(f"s{n}", 0, "loop") < LOOP_P) is loops)
    model = ScriptedModel(ACTIONS, seed)
    read = model.decide({})
    retry = _turn(model, read, "ConnectionError: 503", flagged=True)
    after = _turn(model, retry, ORDER)
    assert isinstance(after, Call)
    assert after.name == ("get_order_details" if loops else "cancel_pending_order")
    if loops:
        assert _turn(model, after, ORDER).name == "cancel_pending_order"  # type: ignore[union-attr]


def test_claims_of_endings() -> None:
    """What each kind of ending tells the customer."""
    assert claims_of("Here is what I did. [completed: cancel_pending_order #W1]") == (
        {("cancel_pending_order", "#W1"): "done"},
        None,
    )
    assert claims_of(CRASH_TEXT) == ({}, "failed")
    assert claims_of("Model call failed after 3 attempts with RateLimitError") == ({}, "failed")
    assert claims_of("We could not confirm whether every step of your request went through.") == (
        {},
        None,
    )
    assert claims_of(
        "We could only finish part of this automatically. Done: [completed: x #W2]. A member "
        "of our team can pick up the rest if you reply here."
    ) == ({("x", "#W2"): "done"}, None)


# --- the faults ----------------------------------------------------------------------------------


def _episode(tau: TauData, lam: float, task: int = 0) -> Episode:
    return tau.episode(tau.tasks[task], lam, seed=1)


def test_a_faulted_write_commits_then_times_out(tau: TauData) -> None:
    """λ=1: the write is applied, the caller waits 5 s and gets TimeoutError; a retry meets the
    domain as it now is."""
    episode = _episode(tau, 1.0)
    order = _first(tau.data, lambda o: o["status"] == "pending")
    args = {"order_id": order["order_id"], "reason": "no longer needed"}
    with pytest.raises(TimeoutError):
        episode.tool("cancel_pending_order", args, "key-1")
    assert [c.request_id for c in episode.db.commits] == ["key-1"]
    assert episode.clock.now() == pytest.approx(5.4)
    assert (
        episode.tool("cancel_pending_order", args, "key-1")
        == "Error: non-pending order cannot be cancelled"
    )
    assert (
        json.loads(episode.db.request("key-1") or "{}")["status"] == "cancelled"
    )  # the trace a lookup reads


def test_a_faulted_read_fails_for_a_while(tau: TauData) -> None:
    """λ=1: ConnectionError (503) for 0.5 to 3 s from the first attempt, then the answer."""
    episode = _episode(tau, 1.0)
    user = next(iter(tau.data.users))
    failures = 0
    while True:
        try:
            episode.tool("get_user_details", {"user_id": user}, None)
            break
        except ConnectionError:
            failures += 1
    assert failures >= 1 and 0.5 <= episode.clock.now() <= 3.3
    assert episode.tool_executions == failures + 1


def test_the_model_endpoint_rate_limits_with_retry_after_and_overloads(tau: TauData) -> None:
    """λ=1: every request of the window is refused (429 with Retry-After, or 529), then answered;
    through the real Anthropic SDK, the 429 carries its Retry-After."""
    statuses = set()
    for task in range(12):
        episode = _episode(tau, 1.0, task)
        first = episode.model_fault()
        assert first is not None
        statuses.add(first[0])
        assert episode.model_fault() is not None  # the same request, still in the window
        episode.clock.advance(first[1] + 0.01)
        assert episode.model_fault() is None
    assert statuses == {429, 529}
    episode = next(
        e
        for e in (_episode(tau, 1.0, t) for t in range(12))
        if e.model_fault() and e._faults[("model", 0)].status == 429
    )  # type: ignore[union-attr]
    set_current(episode)
    try:
        client = anthropic.Anthropic(
            api_key="k", http_client=httpx2.Client(transport=anthropic_transport()), max_retries=0
        )
        with pytest.raises(anthropic.RateLimitError) as info:
            client.messages.create(
                model="claude-sonnet-4-6",
                max_tokens=10,
                messages=[{"role": "user", "content": "hi"}],
            )
        assert int(info.value.response.headers["retry-after"]) >= 1
        assert tether.classify(info.value).retry_after is not None
    finally:
        set_current(None)


def test_no_faults_at_lambda_zero_and_the_same_faults_for_every_policy(tau: TauData) -> None:
    """λ=0 draws nothing; the draws depend on the seed, the task, λ and the call only."""
    episode = _episode(tau, 0.0)
    assert episode.model_fault() is None
    assert (
        draw(1, "0", 0.5, "model", 0)
        == draw(1, "0", 0.5, "model", 0)
        != draw(2, "0", 0.5, "model", 0)
    )


# --- grading ---------------------------------------------------------------------------------------


def test_a_duplicated_write_is_counted(tau: TauData) -> None:
    """Two workers that both saw the order pending cancel it twice: two refunds, one duplicate."""
    order = _first(tau.data, lambda o: o["status"] == "pending")
    args = {"order_id": order["order_id"], "reason": "no longer needed"}
    golden = RetailDB(tau.data)
    golden.call("cancel_pending_order", args)
    twice = RetailDB(tau.data)
    twice.call("cancel_pending_order", args)
    twice.tables.orders[order["order_id"]]["status"] = (
        "pending"  # the second worker read it before the first wrote
    )
    twice.call("cancel_pending_order", args)
    assert duplicates(_added(twice), _added(golden)) == 1
    assert duplicates(_added(golden), _added(golden)) == 0
    assert twice.db_hash() != golden.db_hash()


def test_dishonest_endings(tau: TauData) -> None:
    """Told it failed when it committed, or done when it did not; an error message after a commit."""
    order = _first(tau.data, lambda o: o["status"] == "pending")
    task = {
        "id": "t",
        "actions": [
            {
                "name": "cancel_pending_order",
                "arguments": {"order_id": order["order_id"], "reason": "no longer needed"},
            }
        ],
    }
    done = RetailDB(tau.data)
    done.call("cancel_pending_order", task["actions"][0]["arguments"])  # type: ignore[index]
    said_done = f"[completed: cancel_pending_order {order['order_id']}]"
    said_failed = f"[could not complete: cancel_pending_order {order['order_id']}]"
    assert not dishonest(said_done, task, done)
    assert dishonest(said_failed, task, done)
    assert dishonest(CRASH_TEXT, task, done)
    assert dishonest(said_done, task, RetailDB(tau.data))
    assert not dishonest(said_failed, task, RetailDB(tau.data))
    assert not dishonest(
        "We could not confirm whether every step of your request went through.", task, done
    )


def test_pass_hat_k() -> None:
    """τ-bench's estimator: C(c, k) / C(n, k), averaged over tasks."""
    assert pass_hat_k([4, 4], 4, 4) == 1.0
    assert pass_hat_k([3, 4], 4, 1) == pytest.approx((0.75 + 1.0) / 2)
    assert pass_hat_k([3, 4], 4, 4) == pytest.approx(0.5)
    assert pass_hat_k([2], 4, 2) == pytest.approx(1 / 6)
    with pytest.raises(ValueError, match="at least 5 trials"):
        pass_hat_k([1], 4, 5)
    cell = summarize(
        [
            {
                "task": "a",
                "reward": 1,
                "duplicates": 0,
                "dishonest": False,
                "how": "answer",
                "tool_executions": 3,
                "model_calls": 4,
                "input_tokens": 10,
                "output_tokens": 5,
                "seconds": 2.0,
            }
        ]
        * 4,
        4,
    )
    assert cell["pass^4"] == 1.0 and cell["episodes"] == 4 and cell["cost_usd"] >= 0


# --- the lookups -------------------------------------------------------------------------------------


def test_the_correct_lookup_reads_the_effect_s_own_trace(tau: TauData) -> None:
    """The write carried its ledger key: the lookup finds the result by it; the blind one never does."""
    episode = _episode(tau, 0.0)
    order = _first(tau.data, lambda o: o["status"] == "pending")
    set_current(episode)
    try:
        ledger = tether.Ledger.memory()
        key = tether.intent_key("cancel_pending_order", {"order_id": order["order_id"]})
        result = ledger.once(
            key,
            execute,
            "cancel_pending_order",
            {"order_id": order["order_id"], "reason": "no longer needed"},
        )
        assert LOOKUPS["cancel_pending_order"](key) == result
        assert LOOKUPS["cancel_pending_order"]("another-key") is None
        assert BLIND_LOOKUPS["cancel_pending_order"](key) is None
    finally:
        set_current(None)


# --- the policies, a few tasks ------------------------------------------------------------------------

WRITE_TASKS = [
    "0",
    "5",
    "17",
    "24",
    "60",
]  # exchanges, returns, cancellations, item and address changes


def test_every_policy_replays_the_golden_actions_at_lambda_zero(tau: TauData) -> None:
    """No faults: every policy passes and tells the truth; tool calls are exactly the golden ones;
    two seeds are the same episode (why the suite runs λ = 0 once per task)."""
    task = next(t for t in tau.tasks if t["id"] == "0")
    for policy in installed():  # the frameworks venv runs ADK and Strands too
        result = run_episode(tau, policy, task, 0.0, 0)
        assert (policy, result["reward"], result["dishonest"]) == (policy, 1, False)
        assert result["tool_executions"] == len(task["actions"])
        assert result["model_calls"] == len(task["actions"]) + 1
        assert run_episode(tau, policy, task, 0.0, 3) == result


def test_under_faults_tether_is_right_and_honest_where_the_naive_loop_is_not(tau_data: str) -> None:
    """λ=0.5 on a few tasks: tether through its loop and the adapters passes, honestly; the naive
    loop and the frameworks' defaults do not; a lookup that reads what the write never sets makes
    tether run the write again and the customer is told it failed."""
    out = run_tau(
        tau_data,
        policies=[
            "naive",
            "langchain",
            "tether",
            "tether-langchain",
            "tether-openai-agents",
            "tether-pydantic-ai",
            "tether-blind-lookup",
            "tether-no-lookup",
        ],
        lambdas=[0.5],
        tasks=WRITE_TASKS,
        seeds=2,
        workers=1,
    )
    cells = out["scenarios"]["retail"]["lambda"]["0.5"]["policies"]
    for name in ("tether", "tether-langchain", "tether-openai-agents", "tether-pydantic-ai"):
        assert (name, cells[name]["pass^1"], cells[name]["dishonest_endings"]) == (name, 1.0, 0)
        assert cells[name]["duplicate_effects"] == 0
    assert cells["naive"]["pass^1"] < 1.0
    assert cells["naive"]["dishonest_endings"] + cells["langchain"]["dishonest_endings"] > 0
    assert cells["tether-blind-lookup"]["dishonest_endings"] > 0
    assert cells["tether-no-lookup"]["dishonest_endings"] == 0
    assert set(cells["tether"]) >= {
        "pass^1",
        "pass^2",
        "duplicate_effects",
        "dishonest_endings",
        "tool_executions",
        "model_calls",
        "cost_usd",
        "tokens",
        "p50_s",
        "p95_s",
    }


def test_the_suite_is_deterministic_for_a_seed(tau_data: str) -> None:
    args: dict[str, Any] = {
        "policies": ["tenacity", "tether-openai"],
        "lambdas": [0.2],
        "tasks": ["0", "5"],
        "seeds": 2,
        "workers": 1,
    }
    first = run_tau(tau_data, **args)["scenarios"]
    assert first == run_tau(tau_data, **args)["scenarios"]


# --- the command line ------------------------------------------------------------------------------------


def test_cli_tau_writes_the_design_layout(tau_data: str, tmp_path: Path) -> None:
    """--suite tau --tau-data DIR: suites.tau.scenarios.retail.lambda.<λ>.policies.<policy>."""
    path = tmp_path / "out.json"
    code = main(
        [
            "bench",
            "--suite",
            "tau",
            "--tau-data",
            tau_data,
            "--tau-task",
            "5",
            "--tau-lambda",
            "0",
            "--tau-lambda",
            "0.1",
            "--tau-policy",
            "tether",
            "--tau-policy",
            "naive",
            "--json",
            str(path),
            "--report",
            str(tmp_path / "report"),
        ]
    )
    assert code == 0
    data = json.loads(path.read_text())
    cell = data["suites"]["tau"]["scenarios"]["retail"]["lambda"]["0.1"]["policies"]["tether"]
    assert {
        "pass^1",
        "pass^2",
        "pass^3",
        "pass^4",
        "duplicate_effects",
        "dishonest_endings",
        "tool_executions",
        "model_calls",
        "cost_usd",
    } <= set(cell)
    assert set(data["suites"]["tau"]["scenarios"]["retail"]["lambda"]) == {"0", "0.1"}
    assert "tau retail" in (tmp_path / "report" / "report.md").read_text()
    assert (tmp_path / "report" / "tau-retail.png").stat().st_size > 10_000


def test_cli_tau_without_a_folder_names_the_flag(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    tau_data: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No folder, or a folder that is not a τ² domain: exit 2, naming --tau-data and the variable."""
    monkeypatch.delenv("TETHER_TAU_DATA", raising=False)
    assert main(["bench", "--suite", "tau"]) == 2
    err = capsys.readouterr().err
    assert "--tau-data" in err and "TETHER_TAU_DATA" in err
    assert main(["bench", "--suite", "tau", "--tau-data", str(tmp_path)]) == 2
    assert (
        "not a τ²-bench domain folder (missing db.json, tasks.json, policy.md)"
        in capsys.readouterr().err
    )
    with pytest.raises(ValueError, match="unknown tau policy"):
        run_tau(tau_data, policies=["nope"])
    monkeypatch.setenv("TETHER_TAU_DATA", tau_data)
    assert resolve_folder(None) == tau_data


# --- the virtual event loop ----------------------------------------------------------------------------


def test_the_virtual_loop_moves_time_instead_of_sleeping() -> None:
    """asyncio.sleep(600) takes no real time; work in a thread is waited for, in real time."""
    clock = tether.VirtualClock()

    async def body() -> float:
        await asyncio.sleep(600)
        done = await asyncio.to_thread(lambda: time.sleep(0.01) or threading.get_ident())
        assert done != threading.get_ident()
        await asyncio.wait_for(asyncio.sleep(1), timeout=30)
        return asyncio.get_running_loop().time()

    started = time.perf_counter()
    assert run_virtual(clock, body()) == pytest.approx(601.0)
    assert time.perf_counter() - started < 5
    assert clock.now() == pytest.approx(601.0)


def test_load_tasks_keeps_ids_and_actions(tau_data: str) -> None:
    tasks = load_tasks(tau_data)
    assert tasks[0]["id"] == "0" and tasks[0]["actions"][0]["name"] == "find_user_id_by_name_zip"


# --- the live mode: a worker process killed between a write and its record ------------------


def test_live_a_worker_killed_after_the_write(tau_data: str) -> None:
    """Real processes: the first worker dies once the domain committed the write; the second
    serves the same request. naive runs the write again (an address is set twice; a cancelled
    order refuses and the customer hears it failed); tether settles it from the domain's records."""
    from tether.bench._tau_live import run_live_tau

    out = run_live_tau(tau_data, tasks=["5", "17"])["scenarios"]["retail"]["policies"]
    assert {p: m["killed"] for p, m in out.items()} == {
        "naive": 2,
        "tether": 2,
        "tether-no-lookup": 2,
    }
    assert out["naive"]["writes_executed_twice"] >= 1 and out["naive"]["dishonest_endings"] >= 1
    assert (
        out["tether"]["pass"],
        out["tether"]["writes_executed_twice"],
        out["tether"]["dishonest_endings"],
    ) == (1.0, 0, 0)
    assert (
        out["tether-no-lookup"]["writes_executed_twice"]
        == out["tether-no-lookup"]["dishonest_endings"]
        == 0
    )
    with pytest.raises(ValueError, match="unknown tau-live policy"):
        run_live_tau(tau_data, policies=["nope"])


def test_cli_tau_with_one_seed_prints_its_tables(
    tau_data: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--tau-seeds 1 measures pass^1 only: the headline shows it alone, the table of every
    metric the others as undefined (—), not a KeyError and not a 0 never measured."""
    narrow = ["--tau-task", "5", "--tau-lambda", "0", "--tau-policy", "tether", "--tau-seeds", "1"]
    assert main(["bench", "--suite", "tau", "--tau-data", tau_data, *narrow]) == 0
    out = capsys.readouterr().out
    assert "pass^4" in out and "—" in out and "/ —" not in out
