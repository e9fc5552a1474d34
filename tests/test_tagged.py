"""One tagged-JSON format, two encoders: the ledger's result codec and the canonical
encoding of arguments write every value as the code before the shared codec did."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tagged_cases import CASES
from tether.effects._canonical import canonical_json
from tether.effects._codec import JsonCodec, RedactingCodec
from tether.effects._tagged import DECODERS, Tag

#: the texts the code before the shared codec wrote for each case (tests/tagged_cases.py)
WRITTEN = json.loads((Path(__file__).parent / "data" / "tagged_v1.json").read_text())


def test_every_case_has_its_old_texts() -> None:
    """The fixture and the cases name the same values."""
    assert sorted(WRITTEN) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_result_codec_writes_the_same_bytes(name: str) -> None:
    """A result is stored byte for byte as before, plain and redacted."""
    assert JsonCodec().encode(CASES[name]) == WRITTEN[name]["result"]
    assert RedactingCodec().encode(CASES[name]) == WRITTEN[name]["redacted"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_canonical_encoding_writes_the_same_bytes(name: str) -> None:
    """An intent's text (and so its key) is the same as before, or the same error."""
    old = WRITTEN[name]
    if "canonical_error" in old:
        with pytest.raises(Exception) as raised:
            canonical_json(CASES[name], ignore=())
        assert type(raised.value).__name__ == old["canonical_error"]
    else:
        assert canonical_json(CASES[name], ignore=()) == old["canonical"]


def _plain(value: Any) -> Any:
    """What a replay gives back for objects with fields (their fields), to compare with."""
    return JsonCodec().decode(JsonCodec().encode(value))


@pytest.mark.parametrize("name", sorted(CASES))
def test_records_written_before_read_back_as_the_value(name: str) -> None:
    """A result stored by the old code replays as the value (dataclasses and models as
    their fields, enums as their values)."""
    replayed = JsonCodec().decode(WRITTEN[name]["result"])
    assert replayed == _plain(CASES[name])
    if name in ("decimal", "tuple", "set", "frozenset", "bytes", "uuid", "datetime_tz"):
        assert replayed == CASES[name]  # the types JSON lacks come back as themselves


def test_every_tag_the_codec_writes_is_read_back() -> None:
    """Each tag but the canonical-only ``$obj`` has a decoder."""
    tags = {v for k, v in vars(Tag).items() if k.isupper()}
    assert tags - set(DECODERS) == {Tag.OBJ}


@pytest.mark.parametrize("wrap", [lambda v: {"a": v}, lambda v: [v]], ids=["dict", "list"])
def test_results_nested_past_200_levels_are_refused(wrap: Any) -> None:
    """A scalar 200 containers deep is stored; one more level is refused (a cycle stops
    there too, before the JSON encoder, which keeps no circular-reference check)."""
    value: Any = 1
    for _ in range(200):
        value = wrap(value)
    assert JsonCodec().decode(JsonCodec().encode(value)) == value
    with pytest.raises(ValueError, match="deeper than 200"):
        JsonCodec().encode(wrap(value))
    cycle: Any = wrap(None)
    cycle["a" if isinstance(cycle, dict) else 0] = cycle
    with pytest.raises(ValueError, match="deeper than 200"):
        JsonCodec().encode(cycle)


def test_encoding_a_result_leaves_it_as_it_was() -> None:
    """A plain dict is encoded without a copy: neither codec changes it (the redacting one
    writes its secrets redacted into a new value)."""
    result = {"id": "re_1", "password": "hunter2-hunter2", "amount": 10}
    before = dict(result)
    assert "hunter2" not in RedactingCodec().encode(result)
    assert JsonCodec().encode(result) == json.dumps(before, sort_keys=True)
    assert result == before
