"""The ready-made policies fail closed: what they cannot check is denied, with the reason."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from tether import Checkpoints, Guard, Ledger, StopReason, ToolError, policies

LIMIT = policies.limit("pay", "amount", 5000)
AT_LEAST_ZERO = policies.limit("pay", "amount", 5000, minimum=0)


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        ({"amount": 100}, None),
        ({"amount": 5000}, None),
        ({"amount": 100.5}, None),
        ({"amount": "49.90"}, None),  # money as a numeral in a string, compared exactly
        ({"amount": Decimal("4999.99")}, None),
        ({"amount": Fraction(1, 3)}, None),
        ({"amount": 9000}, "amount 9000 is over the limit of 5000"),
        ({"amount": "9000"}, "amount 9000 is over the limit of 5000"),
        ({"amount": "5000.0000000000000001"}, "is over the limit of 5000"),
        ({"amount": Decimal("9000")}, "amount 9000 is over the limit of 5000"),
        ({"amount": 10**400}, "is over the limit of 5000"),
        ({}, "amount is missing (it must be a number of at most 5000)"),
        ({"amout": 9000}, "amount is missing"),  # misspelt by the model
        ({"Amount": 9000}, "amount is missing"),
        ({"amount": "nan"}, "amount must be a number, got the text 'nan'"),
        ({"amount": "NaN"}, "must be a number, got the text 'NaN'"),
        ({"amount": "inf"}, "must be a number, got the text 'inf'"),
        ({"amount": "1_000"}, "must be a number, got the text '1_000'"),
        ({"amount": " 100"}, "must be a number, got the text ' 100'"),
        ({"amount": "0x1388"}, "must be a number, got the text '0x1388'"),
        ({"amount": float("nan")}, "amount must be a finite number, got nan"),
        ({"amount": float("inf")}, "amount must be a finite number, got inf"),
        ({"amount": float("-inf")}, "amount must be a finite number, got -inf"),
        ({"amount": Decimal("NaN")}, "amount must be a finite number"),
        ({"amount": Decimal("Infinity")}, "amount must be a finite number"),
        ({"amount": True}, "amount must be a number, got True"),
        ({"amount": False}, "amount must be a number, got False"),
        ({"amount": None}, "amount must be a number, got NoneType"),
        ({"amount": [9000]}, "amount must be a number, got list"),
        ({"amount": {"value": 9000}}, "amount must be a number, got dict"),
        ("amount=9000", "amount is missing"),  # arguments that are not a mapping
    ],
)
def test_limit_denies_what_it_cannot_check(args: Any, reason: str | None) -> None:
    """limit: only a finite number within the limit passes; the rest is denied, saying why."""
    said = LIMIT("pay", args)
    if reason is None:
        assert said is None
    else:
        assert said is not None and said.startswith("pay: ") and reason in said


@pytest.mark.parametrize(
    ("value", "denied"),
    [(0, False), (-1, True), ("-0.01", True), (float("nan"), True), ("nan", True), (-0.0, False)],
)
def test_limit_with_a_minimum_fails_closed_too(value: Any, denied: bool) -> None:
    """limit(minimum=0): NaN is below nothing and above nothing, and is still denied."""
    assert (AT_LEAST_ZERO("pay", {"amount": value}) is not None) is denied


def test_limit_reaches_nested_fields_and_ignores_other_tools() -> None:
    """Dots reach into nested arguments; another tool's calls are not this policy's."""
    nested = policies.limit("pay", "refund.amount", 10)
    assert nested("pay", {"refund": {"amount": 5}}) is None
    assert (
        nested("pay", {"refund": {"amount": 50}}) == "pay: refund.amount 50 is over the limit of 10"
    )
    assert nested("pay", {"refund": 5}) == (
        "pay: refund.amount is missing (it must be a number of at most 10)"
    )
    assert nested("search", {"q": "nan"}) is None


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"maximum": float("nan")}, ValueError, "maximum must be a finite number, got nan"),
        ({"maximum": float("inf")}, ValueError, "maximum must be a finite number"),
        ({"maximum": True}, ValueError, "maximum must be a finite number, got True"),
        ({"maximum": "5000"}, ValueError, "maximum must be a finite number, got '5000'"),
        ({"maximum": 10, "minimum": float("nan")}, ValueError, "minimum must be a finite"),
        ({"maximum": 10, "minimum": 20}, ValueError, r"minimum \(20\) must be <= maximum \(10\)"),
        ({"maximum": 10, "field": ""}, ValueError, "field must be a non-empty string"),
        ({"maximum": 10, "field": "refund..amount"}, ValueError, "with dots between"),
        ({"maximum": 10, "tool": ""}, ValueError, "tool must be a non-empty string"),
    ],
)
def test_limit_refuses_a_bad_rule_at_construction(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    """A rule that could never decide is refused when it is made, naming the field."""
    settings = {"tool": "pay", "field": "amount", **kwargs}
    with pytest.raises(error, match=match):
        policies.limit(settings.pop("tool"), settings.pop("field"), **settings)


def test_allow_fails_closed() -> None:
    """allow: a missing field, a value of another type (True is not 1), an unhashable value."""
    currencies = policies.allow("pay", "currency", {"EUR", "USD"})
    assert currencies("pay", {"currency": "EUR"}) is None
    assert currencies("pay", {"currency": "GBP"}) == "pay: currency must be one of EUR, USD"
    assert currencies("pay", {}) == "pay: currency is missing (it must be one of EUR, USD)"
    assert currencies("pay", {"currency": ["EUR"]}) == "pay: currency must be one of EUR, USD"
    quantities = policies.allow("pay", "qty", [1, 2])
    assert quantities("pay", {"qty": 1}) is None
    assert quantities("pay", {"qty": True}) == "pay: qty must be one of 1, 2"
    flags = policies.allow("pay", "urgent", [False])
    assert flags("pay", {"urgent": False}) is None
    assert flags("pay", {"urgent": 0}) == "pay: urgent must be one of False"


@pytest.mark.parametrize(
    ("values", "error", "match"),
    [
        ("EUR", TypeError, "values must be a collection"),
        (b"EUR", TypeError, "values must be a collection"),
        (5, TypeError, "values must be a collection"),
        ([], ValueError, "would deny every call"),
        ([["EUR"]], TypeError, "values must be hashable"),
    ],
)
def test_allow_refuses_a_bad_rule_at_construction(
    values: Any, error: type[Exception], match: str
) -> None:
    """allow("pay", "currency", "EUR") would allow the letters E, U and R: refused."""
    with pytest.raises(error, match=match):
        policies.allow("pay", "currency", values)


def test_max_calls_outside_a_run_denies() -> None:
    """max_calls cannot count without the run: it denies rather than allowing."""
    cap = policies.max_calls("pay", 2)
    assert cap("pay", {}) == "pay: its calls cannot be counted outside a run (max_calls 2)"
    assert cap("search", {}) is None
    with pytest.raises(ValueError, match="tool must be a non-empty string"):
        policies.max_calls("", 2)


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_guard_never_runs_a_call_its_policy_cannot_check(shell: str) -> None:
    """Through a Guard: a "nan" text, a bool and a misspelt field are denied, nothing runs
    (a NaN float never gets this far: tool arguments refuse it)."""
    paid: list[Any] = []

    def pay(**args: Any) -> str:
        paid.append(args)
        return "paid"

    async def apay(**args: Any) -> str:
        return pay(**args)

    limit = policies.limit("pay", "amount", 5000, minimum=0)
    guard = Guard(policies=[limit], ledger=Ledger.memory())
    calls = [{"amount": True}, {"amount": "nan"}, {"amout": 9000}, {"amount": 10}]
    told: list[str] = []

    def sync_run() -> None:
        with guard.start(task="pay") as run:
            for args in calls:
                run.proceed()
                try:
                    run.call_tool("pay", pay, args, idempotent=False)
                except ToolError as exc:
                    told.append(exc.model_message)
            run.succeed()

    async def async_run() -> None:
        async with guard.start(task="pay") as run:
            for args in calls:
                run.proceed()
                try:
                    await run.acall_tool("pay", apay, args, idempotent=False)
                except ToolError as exc:
                    told.append(exc.model_message)
            run.succeed()

    if shell == "sync":
        sync_run()
    else:
        asyncio.run(async_run())
    assert paid == [{"amount": 10}]
    assert told == [
        "denied by policy: pay: amount must be a number, got True",
        "denied by policy: pay: amount must be a number, got the text 'nan'",
        "denied by policy: pay: amount is missing (it must be a number of at most 5000 and at "
        "least 0)",
    ]


def test_max_calls_counts_the_calls_before_a_resume(tmp_path: Path) -> None:
    """A run resumed after an approval keeps counting: max_calls(2) allows two in all."""
    db = str(tmp_path / "tether.db")
    refunds: list[int] = []

    def settings() -> dict[str, Any]:
        cap = policies.max_calls("refund", 2)
        return {
            "ledger": Ledger.sqlite(db),
            "checkpoints": Checkpoints.sqlite(db),
            "policies": [cap],
        }

    def refund(amount: int) -> dict[str, int]:
        refunds.append(amount)
        return {"amount": amount}

    guard = Guard(**settings())
    with guard.start(task="refund and close") as run:
        run.proceed()
        run.call_tool("refund", refund, {"amount": 100}, idempotent=False)
        run.call_tool("close_ticket", lambda: "closed", {}, requires_approval=True)
    assert run.outcome.stopped_because is StopReason.AWAITING_APPROVAL
    later = Guard(**settings())
    later.approve(run.outcome.checkpoint_id, by="alice")
    told = []
    with later.resume(run.outcome.checkpoint_id) as resumed:
        resumed.proceed()
        resumed.call_tool("close_ticket", lambda: "closed", {}, requires_approval=True)
        resumed.call_tool("refund", refund, {"amount": 200}, idempotent=False)
        try:
            resumed.call_tool("refund", refund, {"amount": 300}, idempotent=False)
        except ToolError as exc:
            told.append(exc.model_message)
        resumed.succeed()
    assert refunds == [100, 200]
    assert told == ["denied by policy: refund may be called at most 2 times in one run"]
