"""The JSON guard's limits as literals (64 levels, 1 MiB), and integers that come back exact.

The property tests (`test_trust_boundary_fuzz.py`) go through the module's own constants;
these pin the numbers the documentation promises, so a changed constant fails here.
"""

from __future__ import annotations

from typing import Any

import pytest

from schemas import jsonbounds, jsoncodec


def nested(depth: int, open_: bytes = b"[", close: bytes = b"]") -> bytes:
    return open_ * depth + close * depth


def nested_objects(depth: int) -> bytes:
    return b'{"a":' * (depth - 1) + b"{}" + b"}" * (depth - 1)


def refusal(data: bytes | str, **bounds: Any) -> str:
    with pytest.raises(jsonbounds.JsonRefused) as refused:
        jsonbounds.loads(data, **bounds)
    return refused.value.code


def test_sixty_four_levels_pass_and_sixty_five_are_refused() -> None:
    assert jsonbounds.nesting_depth(nested(64)) == 64
    assert jsonbounds.loads(nested(64)) is not None
    assert refusal(nested(65)) == "JSON_TOO_DEEP"
    assert jsonbounds.loads(nested_objects(64)) is not None
    assert refusal(nested_objects(65)) == "JSON_TOO_DEEP"
    # Mixed arrays and objects count alike; the outermost value is level 1.
    assert jsonbounds.nesting_depth(b'[{"a":[{}]}]') == 4
    assert jsonbounds.nesting_depth(b"1") == 0


def test_a_caller_bound_on_depth_is_exact() -> None:
    assert jsonbounds.loads(nested(3), max_depth=3) == [[[]]]
    assert refusal(nested(4), max_depth=3) == "JSON_TOO_DEEP"
    # The 19-digit path (the standard library parser) is bounded the same way.
    assert refusal(b"[[[[1234567890123456789]]]]", max_depth=3) == "JSON_TOO_DEEP"


def test_brackets_inside_strings_are_not_nesting() -> None:
    text = b'["' + b"[" * 100 + b'\\"' + b"{" * 100 + b'"]'
    assert jsonbounds.nesting_depth(text) == 1
    assert jsonbounds.loads(text, max_depth=1) == ["[" * 100 + '"' + "{" * 100]
    assert jsonbounds.nesting_depth(b'["\\\\", [[]]]') == 3


def test_one_mebibyte_passes_and_one_byte_more_is_refused() -> None:
    exact = b'"' + b"a" * 1_048_574 + b'"'
    assert len(exact) == 1_048_576
    assert jsonbounds.loads(exact) == "a" * 1_048_574
    assert refusal(exact + b" ") == "JSON_TOO_LARGE"
    # Counted in UTF-8 bytes, not characters.
    assert jsonbounds.loads('"' + "é" * 524_287 + '"') == "é" * 524_287  # 1,048,576 bytes
    assert refusal('"' + "é" * 524_287 + ' "') == "JSON_TOO_LARGE"  # one more byte, 524,290 characters
    assert jsonbounds.loads(exact + b" ", max_bytes=None) == "a" * 1_048_574


def test_a_caller_bound_on_size_is_exact() -> None:
    assert jsonbounds.loads(b"[1,2,3,45]", max_bytes=10) == [1, 2, 3, 45]
    assert refusal(b"[1,2,3,456]", max_bytes=10) == "JSON_TOO_LARGE"
    assert jsoncodec.loads(b"[1,2,3,45]", max_bytes=10) == [1, 2, 3, 45]
    with pytest.raises(jsonbounds.JsonRefused, match="at most 10"):
        jsoncodec.loads(b"[1,2,3,456]", max_bytes=10)


@pytest.mark.parametrize(
    "text",
    [
        "-9223372036854775809",  # 19 digits, one below int64's minimum
        "-9999999999999999999",
        "9999999999999999999",
        "18446744073709551616",  # 2**64
        "-123456789012345678901234567890",
        "-922337203685477580",  # 18 digits
        "-9223372036854775808",
    ],
)
def test_long_integers_come_back_exact(text: str) -> None:
    """Every integer keeps every digit and stays an int, alone or inside a document, by both entry points."""
    exact = int(text)
    for parse in (jsonbounds.loads, jsoncodec.loads):
        value = parse(text)
        assert type(value) is int and value == exact
        document = parse(f'{{"amount": [{text}], "note": "x"}}')
        assert type(document["amount"][0]) is int and document["amount"][0] == exact
    assert jsoncodec.loads(jsoncodec.dumps({"amount": exact}))["amount"] == exact


def test_a_long_number_with_a_fraction_stays_a_float() -> None:
    assert jsonbounds.loads("-1234567890123456789.5") == -1234567890123456789.5
    assert refusal("1e400") == "JSON_INVALID"
