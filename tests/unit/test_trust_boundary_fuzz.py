"""Fuzz targets (hypothesis) for the decoders at the trust boundary.

* `schemas.jsonbounds`: the linear depth scan agrees with the true depth of every valid
  JSON text, whatever its strings hold; `loads` on any bytes returns a value within the
  bounds or raises `JsonRefused`, nothing else, and agrees with the standard parser;
* `runtime.kafka.decode_headers`: any header list decodes, never raises, never yields NUL;
* `validate_criteria`: any JSON value gives a verdict, never an exception.

A bounded number of examples runs in the suite; `make soak` runs each target 100 times as
long (the `soak` marker).
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.kafka import MAX_HEADER_CHARS, decode_headers
from schemas import jsonbounds
from verification.criteria_validation import MODES, validate_criteria

SUITE = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SOAK = settings(max_examples=30_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Strings that look like structure: brackets, quotes and backslashes inside them must not count.
TRICKY_TEXT = st.text(alphabet=st.sampled_from('[]{}"\\\\ ,:ab\u00e9\U0001f600\n\t\u0001'), max_size=12)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TRICKY_TEXT
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY_TEXT, inner, max_size=3),
    max_leaves=12,
)


def depth_of(value: Any) -> int:
    """True nesting depth of a parsed value (the outermost array or object is 1)."""
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    return 0


@st.composite
def nested_json(draw: st.DrawFn) -> tuple[Any, bytes]:
    """A JSON value, possibly wrapped in up to 100 extra levels, and one text of it."""
    value = draw(JSON_VALUES)
    for _ in range(draw(st.integers(0, 100))):
        value = [value] if draw(st.booleans()) else {draw(TRICKY_TEXT): value}
    ascii_only = draw(st.booleans())
    indent = draw(st.sampled_from([None, 1]))
    return value, json.dumps(value, ensure_ascii=ascii_only, indent=indent).encode("utf-8")


def _depth_scan_agrees(case: tuple[Any, bytes]) -> None:
    value, text = case
    depth = depth_of(value)
    assert jsonbounds.nesting_depth(text) == depth
    if depth <= jsonbounds.MAX_DEPTH:
        assert jsonbounds.loads(text, max_bytes=None) == value
    else:
        with pytest.raises(jsonbounds.JsonRefused) as refused:
            jsonbounds.loads(text, max_bytes=None)
        assert refused.value.code == "JSON_TOO_DEEP"


def _loads_is_total(data: bytes) -> None:
    try:
        value = jsonbounds.loads(data, max_bytes=4096)
    except jsonbounds.JsonRefused as exc:
        assert exc.code in {"JSON_INVALID", "JSON_TOO_DEEP", "JSON_TOO_LARGE"}
        return
    assert len(data) <= 4096
    assert depth_of(value) <= jsonbounds.MAX_DEPTH
    # What is accepted, the standard parser reads the same way (and it is NUL- and surrogate-free).
    assert value == json.loads(data.decode("utf-8"))
    assert "\x00" not in json.dumps(value, ensure_ascii=False)
    json.dumps(value, ensure_ascii=False).encode("utf-8")


# JSON-ish bytes: mostly structure, so the fuzzer reaches deep and odd texts quickly.
JSONISH = st.lists(
    st.sampled_from([b"[", b"]", b"{", b"}", b'"', b"\\", b",", b":", b"1", b"12345678901234567890", b"1e999",
                     b"NaN", b"true", b"null", b"\\u0000", b"\\ud800", b"\\udc00", b"\xff", b"\xed\xa0\x80", b" "]),
    max_size=200,
).map(b"".join)  # fmt: skip


@SUITE
@given(nested_json())
def test_depth_scan_matches_the_true_depth(case: tuple[Any, bytes]) -> None:
    """For every valid JSON text the linear scan finds exactly the parsed value's depth."""
    _depth_scan_agrees(case)


@SUITE
@given(st.binary(max_size=300) | JSONISH)
def test_bounded_loads_returns_a_bounded_value_or_refuses(data: bytes) -> None:
    """Any bytes: a value within the bounds, equal to the standard parser's, or JsonRefused."""
    _loads_is_total(data)


def test_bounded_loads_refuses_the_known_hostile_texts() -> None:
    """The texts of the issue, one by one, with their codes."""
    cases = {
        b"[" * 100_000 + b"]" * 100_000: "JSON_TOO_DEEP",
        b'{"a":' * 100_000 + b"1" + b"}" * 100_000: "JSON_TOO_DEEP",
        b"[" * 70 + b"12345678901234567890" + b"]" * 70: "JSON_TOO_DEEP",
        b'"\\ud800"': "JSON_INVALID",
        b'["x", 12345678901234567890, "\\ud800"]': "JSON_INVALID",
        b'{"salt": "a\\u0000b"}': "JSON_INVALID",
        b'[12345678901234567890, NaN]': "JSON_INVALID",
        b'[12345678901234567890, 1e999]': "JSON_INVALID",
        b'"\xed\xa0\x80"': "JSON_INVALID",
        b" " * (jsonbounds.DEFAULT_MAX_BYTES + 1): "JSON_TOO_LARGE",
    }
    for text, code in cases.items():
        with pytest.raises(jsonbounds.JsonRefused) as refused:
            jsonbounds.loads(text)
        assert refused.value.code == code, text[:40]
    assert jsonbounds.loads(b'[12345678901234567890123, "\\ud83d\\ude00", "\\\\u0000"]') == [
        12345678901234567890123, "\U0001f600", "\\u0000",
    ]  # fmt: skip


HEADERS = st.lists(
    st.tuples(st.text(max_size=20), st.none() | st.binary(max_size=50) | st.binary(min_size=5000, max_size=6000)),
    max_size=8,
)


def _headers_decode(headers: list[tuple[str, bytes | None]]) -> None:
    decoded = decode_headers(headers)
    for key, value in decoded.items():
        assert isinstance(key, str) and isinstance(value, str)
        assert "\x00" not in key and "\x00" not in value
        assert len(value) <= MAX_HEADER_CHARS
        value.encode("utf-8")  # storable as PostgreSQL text


@SUITE
@given(HEADERS)
def test_cloudevents_headers_decode_whatever_the_bytes(headers: list[tuple[str, bytes | None]]) -> None:
    """Null values, invalid UTF-8, NUL and huge values: a str mapping, never an exception."""
    _headers_decode(headers)


CRITERIA = st.one_of(
    JSON_VALUES,
    st.fixed_dictionaries(
        {},
        optional={
            "min_length": st.integers() | st.floats(allow_nan=False) | TRICKY_TEXT,
            "contains_keywords": st.lists(TRICKY_TEXT, max_size=5) | TRICKY_TEXT,
            "regex_pattern": st.text(alphabet=st.sampled_from("()*+?{}[]|\\ab.1,^$"), max_size=40),
            "required_fields": st.lists(TRICKY_TEXT, max_size=5),
            "expected_schema": JSON_VALUES,
            "expected_answer": JSON_VALUES,
            "forbidden_phrases": st.lists(TRICKY_TEXT, max_size=5),
            "rubric": st.lists(JSON_VALUES, max_size=3),
        },
    ),
)


def _criteria_verdict(data: Any, mode: str) -> None:
    verdict = validate_criteria(data, mode)
    assert isinstance(verdict.ok, bool)
    if not verdict.ok:
        assert verdict.code
    # Criteria holding a non-finite number (JSON has none, a Python caller may) are refused.
    numbers = [v for v in (data.values() if isinstance(data, dict) else ()) if isinstance(v, float)]
    if not all(math.isfinite(n) for n in numbers):
        assert not verdict.ok, verdict


@SUITE
@given(CRITERIA, st.sampled_from(MODES))
def test_criteria_validation_gives_a_verdict_for_any_value(data: Any, mode: str) -> None:
    """Criteria validation is total: any JSON value is accepted or refused with a code."""
    _criteria_verdict(data, mode)


@pytest.mark.soak
@SOAK
@given(nested_json(), st.binary(max_size=2000) | JSONISH, HEADERS, CRITERIA, st.sampled_from(MODES))
def test_trust_boundary_decoders_soak(
    case: tuple[Any, bytes], data: bytes, headers: list[tuple[str, bytes | None]], criteria: Any, mode: str
) -> None:
    """The targets above together, 100 times as many examples (`make soak`)."""
    _depth_scan_agrees(case)
    _loads_is_total(data)
    _headers_decode(headers)
    _criteria_verdict(criteria, mode)
