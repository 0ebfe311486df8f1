"""Post-time validation of verificationCriteria, as the task API applies it."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.criteria import VerificationCriteria, unknown_fields
from verification.criteria_validation import (
    AUTO_CRITERIA_REQUIRED,
    CRITERIA_INVALID,
    REGEX_PATTERN_UNUSABLE,
    validate_criteria,
)


@pytest.mark.parametrize(
    "criteria",
    [
        {"min_length": 1},
        {"contains_keywords": ["revenue"]},
        {"required_fields": ["summary"]},
        {"expected_schema": {"type": "object"}},
        {"expected_schema": {"required": ["summary"]}},
        {"rubric": [{"criterion": "depth", "keywords": ["risk"]}]},
        {"regex_pattern": r"^\d+$"},
        {"expected_answer": "42"},
        {"min_length": 10, "pass_threshold": 60},
    ],
)
def test_one_real_check_is_enough_for_auto(criteria: dict[str, Any]) -> None:
    verdict = validate_criteria(criteria, "auto")
    assert verdict.ok
    assert verdict.code is None
    assert verdict.criteria == VerificationCriteria.model_validate(criteria)


@pytest.mark.parametrize(
    "criteria",
    [
        {},
        None,
        {"pass_threshold": 80},
        {"max_length": 500},
        {"acceptance": "five concrete risks"},
        {"expected_schema": {"type": "array"}},
        {"expected_schema": {"properties": {"a": {"type": "string"}}}},
        {"rubric": [{"criterion": "style"}]},
        {"rubric": [{"criterion": "style", "keywords": []}]},
        {"expected_answer": "   "},
        {"regex_pattern": "(unclosed"},
        {"min_lenght": 40},
    ],
)
def test_auto_without_a_real_check_is_refused(criteria: dict[str, Any] | None) -> None:
    verdict = validate_criteria(criteria, "auto")
    assert not verdict.ok
    assert verdict.code == AUTO_CRITERIA_REQUIRED


def test_forbidden_phrases_alone_are_refused_for_auto_with_an_explanation() -> None:
    verdict = validate_criteria({"forbidden_phrases": ["lorem ipsum"]}, "auto")
    assert (verdict.ok, verdict.code) == (False, AUTO_CRITERIA_REQUIRED)
    assert "forbidden_phrases alone is not enough" in verdict.errors[0]
    assert validate_criteria(
        {"forbidden_phrases": ["lorem ipsum"], "contains_keywords": ["plan"]}, "auto"
    ).ok


@pytest.mark.parametrize("mode", ["agent", "manual"])
def test_other_modes_need_no_real_check(mode: str) -> None:
    assert validate_criteria({}, mode).ok
    assert validate_criteria({"forbidden_phrases": ["x"]}, mode).ok


@pytest.mark.parametrize("mode", ["auto", "agent", "manual"])
@pytest.mark.parametrize("pattern", ["(a+)+", "(a*)*b", "(a|a)+", "x" * 201])
def test_unusable_regex_is_refused_in_every_mode(mode: str, pattern: str) -> None:
    verdict = validate_criteria({"regex_pattern": pattern, "min_length": 10}, mode)
    assert (verdict.ok, verdict.code) == (False, REGEX_PATTERN_UNUSABLE)
    assert verdict.errors[0].startswith("regex_pattern: ")


def test_non_compiling_regex_is_accepted_with_a_warning_beside_a_real_check() -> None:
    verdict = validate_criteria({"regex_pattern": "(?i)abc", "min_length": 10})
    assert verdict.ok
    assert any("every submission will fail" in w for w in verdict.warnings)


def test_letter_escapes_are_reported() -> None:
    verdict = validate_criteria({"regex_pattern": r"\Afoo\Z"})
    assert verdict.ok
    assert verdict.warnings == (
        "regex_pattern: \\A is read by JavaScript as the letter 'A', not as an escape",
        "regex_pattern: \\Z is read by JavaScript as the letter 'Z', not as an escape",
    )


@pytest.mark.parametrize(
    ("criteria", "field"),
    [
        ({"contains_keywords": ["k"] * 51}, "contains_keywords"),
        ({"forbidden_phrases": ["x" * 201]}, "forbidden_phrases.0"),
        ({"rubric": [{"criterion": str(i)} for i in range(21)]}, "rubric"),
        ({"rubric": [{"criterion": "c", "keywords": ["k"] * 21}]}, "rubric.0.keywords"),
        ({"rubric": [{"criterion": "c", "weight": 0}]}, "rubric.0.weight"),
        ({"rubric": [{"criterion": "c", "min_mentions": 21}]}, "rubric.0.min_mentions"),
        ({"expected_schema": {"properties": {str(i): {} for i in range(51)}}}, "expected_schema"),
        ({"expected_answer": "a" * 2001}, "expected_answer"),
        ({"acceptance": "a" * 4001}, "acceptance"),
        ({"min_length": 0}, "min_length"),
        ({"min_length": 2.5}, "min_length"),
        ({"min_length": "10"}, "min_length"),
        ({"max_length": True}, "max_length"),
        ({"pass_threshold": -1}, "pass_threshold"),
        ({"required_fields": "name"}, "required_fields"),
    ],
)
def test_size_limits_and_types(criteria: dict[str, Any], field: str) -> None:
    verdict = validate_criteria(criteria)
    assert (verdict.ok, verdict.code) == (False, CRITERIA_INVALID)
    assert any(error.startswith(field) for error in verdict.errors), verdict.errors


def test_criteria_must_be_an_object() -> None:
    verdict = validate_criteria(["min_length", 10])
    assert (verdict.ok, verdict.code) == (False, CRITERIA_INVALID)


def test_unknown_fields_are_dropped_and_reported() -> None:
    raw = {
        "min_lenght": 40,
        "contains_keywords": ["plan"],
        "rubric": [{"criterion": "c", "wieght": 3}],
        "expected_schema": {
            "requird": ["a"],
            "properties": {"a": {"type": "string", "format": "x"}},
        },
    }
    verdict = validate_criteria(raw)
    assert verdict.ok
    assert verdict.warnings == (
        "unknown field 'min_lenght' was dropped",
        "unknown field 'rubric[0].wieght' was dropped",
        "unknown field 'expected_schema.requird' was dropped",
        "unknown field 'expected_schema.properties.a.format' was dropped",
    )
    assert verdict.criteria is not None
    assert verdict.criteria.min_length is None
    assert verdict.to_json_dict()["criteria"] == {
        "contains_keywords": ["plan"],
        "expected_schema": {"properties": {"a": {"type": "string"}}},
        "rubric": [{"criterion": "c"}],
    }


def test_unknown_fields_helper_ignores_known_ones() -> None:
    assert unknown_fields({"min_length": 1, "rubric": [{"criterion": "c"}]}) == []


def test_unknown_mode_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown verification mode"):
        validate_criteria({}, "oracle")
