"""Intent keys pinned: the same call gives the same key as the versions before (ledgers and
snapshots they stored must still match), whichever encoding path the arguments take and
whether the scoped key is made at once or when first asked for."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
from typing import Any

import pytest

from tether import RetryPolicy, intent_key
from tether.effects._canonical import intent_and_text, intent_keys_and_text
from tether.run._toolkit import _Call


class _Colour(str, enum.Enum):  # noqa: UP042 - the mixin, not StrEnum: str() differs
    RED = "red"


class _Loud(str):
    def __str__(self) -> str:
        return "LOUD"


def _deep(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


#: (tool, arguments, scope) and the key computed for them before #45's step work (main at b6e6d68)
PINNED: dict[str, tuple[str, Any, str, str]] = {
    "plain": (
        "refund",
        {"order": "A-1", "amount": 10, "uuid": "1f0c"},
        "",
        "a114afc436415806c29ca5858a78f3877a85739439a7e6004062bfd25239aff5",
    ),
    "nested": (
        "lookup",
        {
            "customer": "C-1042",
            "items": [{"id": 1, "sku": "SKU-1", "qty": 2.5, "ok": True, "note": None}],
        },
        "run-1",
        "2f7096ee6151b583f0343cc7dbc76e512e8ecbdf121dcabeb5ab12ae85d2d3e0",
    ),
    "int_key": (
        "lookup",
        {"m": {1: "a"}},
        "",
        "ba20ed1bff3aa4f625c9c4531eab39db7a1b223dddebf3cff74dd7b42aba1ab9",
    ),
    "true_key": (
        "lookup",
        {"m": {True: "a"}},
        "",
        "6e99ddc2eb214cbae3286f24168c8299b7440643e294847b5650b5f6e5f93d56",
    ),
    "none_key": (
        "lookup",
        {"m": {None: "a"}},
        "",
        "e393b51b791599280d029110ecd2bc8f5fc017f5bc86794ac3faab4d7778b4aa",
    ),
    "float_key": (
        "lookup",
        {"m": {1.5: "a", -2.0: "b"}},
        "",
        "c679a56debff1c41e817b47fe06c4275771ba57aafe683e4c9a6de98773c3da0",
    ),
    "str_digit_key": (
        "lookup",
        {"m": {"1": "a", "true": 2}},
        "",
        "5bb2b8e2333a1838736d1b11bd79fb4aba6d2c38226aba90db97c82e7f84c0c9",
    ),
    "dollar": (
        "lookup",
        {"$bytes": "x"},
        "",
        "fde013916a53a63a808c105c04906e3cd66c0ff1d8568cf36f94f76394f3869e",
    ),
    "unicode": (
        "lookup",
        {"name": "Zoë ☃", "q": 'say "hi"\n'},
        "s",
        "4fe9c0ad6e32ae07cbc8546be78c02498da366e911dd1900f488e4085e30e04b",
    ),
    "str_enum": (
        "lookup",
        {"c": _Colour.RED},
        "",
        "cd030d8fd276e47b23519b1bdc29da86dfa08a202b0563b94f353e94795220e8",
    ),
    "str_subclass": (
        "lookup",
        {"c": _Loud("low")},
        "",
        "3a825083f0d343241c7738cd660bcb7c04ce4862d44dba273755cddfb01448c4",
    ),
    "tuple_dates": (
        "lookup",
        {
            "t": (1, 2),
            "at": dt.date(2026, 1, 2),
            "d": decimal.Decimal("1.10"),
            "b": b"\x00",
        },
        "",
        "952d56aa41dfac18980145023b4e9b386b9acd4e5cb2d95ee8f4eedec8746741",
    ),
    "deep_40": (
        "lookup",
        {"d": _deep(40)},
        "",
        "87853a16c0d3821802940e8bd6060d1a7af7dc320b6d27e46c14aa591b3596bb",
    ),
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_a_key_is_the_one_older_versions_stored(name: str) -> None:
    """Each pinned call's key (computed before #45's step work) is unchanged, made at once or when asked for."""
    tool, args, scope, expected = PINNED[name]
    assert expected == intent_key(tool, args, scope)
    action, key, _, _ = intent_keys_and_text(tool, args, scope)
    assert (intent_key(tool, args), expected) == (action, key)
    tool_call = _Call(
        tool, args, action, None, 1, RetryPolicy(), encoded=encoded_of(tool, args), scope=scope
    )
    assert expected == tool_call.key


def encoded_of(tool: str, args: Any) -> str:
    return intent_and_text(tool, args)[1]
