"""Properties of the auto check that hold for every result and every criteria."""

from __future__ import annotations

import json
import sys
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.criteria import VerificationCriteria
from schemas.verification import ALL_CRITERIA_MET, VerificationResult
from verification.auto_check import (
    REASON_CRITERIA_TOO_LARGE,
    auto_check,
    gate_names,
)

PROPERTY_SETTINGS = settings(
    max_examples=250,
    deadline=None,  # shared CI machines: timing is asserted in the ReDoS suite instead
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# ── strategies ────────────────────────────────────────────────────────────────

FRAGMENTS = [
    "The migration plan moves billing to the new cluster.",
    "Revenue grew 12% while churn fell to 2.1%.",
    "I was unable to access the report.",
    "As an AI, I cannot complete this task.",
    "Status: failed for 1,204 deliveries.",
    "Service unavailable.",
    "Error during LLM execution",
    "## Not done / assumptions",
    "**Assumptions:**",
    "- I could not verify one figure.",
    "Summary: all good.",
    "## Summary",
    '{"summary": "ok", "score": 5, "items": []}',
    '```json\n{"name": "Acme", "price": ""}\n```',
    "The answer is 42.",
    "yes",
    "no",
    "443.21",
    "Paris",
    "lorem\u200bipsum",
    "l\u043erem ipsum",
    "café don’t",
    "漢字かなカナ",
    "\u00ad\u200d\ufeff\u2028",
    "{{{{[[[[",
    "\r\n\t  ",
]

unicode_text = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=400)
lone_surrogates = st.sampled_from(["\ud800", "\udfff", "a\udc00b"])
output_text = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), unicode_text, lone_surrogates), max_size=25
).map(" ".join)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | unicode_text,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(unicode_text, children, max_size=5)
    ),
    max_leaves=30,
)
results = st.one_of(
    output_text.map(lambda text: {"output": text}),
    st.dictionaries(st.sampled_from(["output", "name", "price", "summary"]), json_values),
    json_values,
)

WORDS = ["billing", "cluster", "revenue", "churn", "Paris", "42", "yes", "lorem ipsum", "", "ACC"]
PATTERNS = [
    r"\d+",
    r"^Paris$",
    r"[A-Z]{3}-\d{3}",
    r"(?<=\$)\d+",
    r"billing|churn",
    "(a+)+",
    "(unclosed",
    "(?i)x",
    r"\Afoo",
    "a" * 201,
    "",
]
word_lists = st.lists(st.sampled_from(WORDS), max_size=6)
valid_criteria = st.fixed_dictionaries(
    {},
    optional={
        "min_length": st.integers(1, 400),
        "contains_keywords": word_lists,
        "forbidden_phrases": word_lists,
        "required_fields": st.lists(st.sampled_from(["name", "price", "summary", "score", ""])),
        "expected_schema": st.fixed_dictionaries(
            {},
            optional={
                "type": st.sampled_from(["object", "array"]),
                "required": st.lists(st.sampled_from(["name", "summary", "items"]), max_size=3),
                "properties": st.just({"name": {"type": "string"}}),
            },
        ),
        "expected_answer": st.sampled_from(
            ["42", "Paris", "yes", "443.21", "the plan moves billing", "->", " "]
        ),
        "regex_pattern": st.sampled_from(PATTERNS),
        "max_length": st.integers(1, 2000),
        "rubric": st.lists(
            st.fixed_dictionaries(
                {"criterion": st.sampled_from(["depth", "style", "x"])},
                optional={
                    "keywords": word_lists,
                    "min_mentions": st.integers(1, 20),
                    "weight": st.floats(0.01, 100),
                },
            ),
            max_size=4,
        ),
        "pass_threshold": st.floats(0, 100),
        "acceptance": st.text(max_size=50),
    },
)
hostile_criteria = st.one_of(
    st.dictionaries(st.text(max_size=10), json_values, max_size=6),
    st.just({"contains_keywords": ["k"] * 51}),
    st.just({"rubric": [{"criterion": "c", "weight": float("nan")}]}),
    st.just({"min_length": True}),
    st.just({"pass_threshold": float("inf")}),
    st.just({"expected_schema": {"properties": [1, 2]}}),
    st.just({"rubric": "everything"}),
    json_values,
)
any_criteria = st.one_of(valid_criteria, hostile_criteria)


def _gates_below_full(verdict: VerificationResult, criteria: dict[str, Any]) -> list[str]:
    gates = gate_names(VerificationCriteria.model_validate(criteria))
    return [i.name for i in verdict.breakdown if i.name in gates and i.score < 1]


# ── properties ────────────────────────────────────────────────────────────────


@PROPERTY_SETTINGS
@given(result=results, criteria=valid_criteria)
def test_score_bounds_gates_and_pass_reason(result: object, criteria: dict[str, Any]) -> None:
    verdict = auto_check(result, criteria)
    assert 0 <= verdict.score <= 100
    assert all(0 <= item.score <= 1 for item in verdict.breakdown)
    if _gates_below_full(verdict, criteria):
        assert not verdict.passed
    if verdict.passed:
        assert verdict.reasons[0] == ALL_CRITERIA_MET
        assert verdict.breakdown
    else:
        assert ALL_CRITERIA_MET not in verdict.reasons
    if not verdict.breakdown:
        # A hard failure: score 0 and exactly one reason.
        assert (verdict.passed, verdict.score, len(verdict.reasons)) == (False, 0, 1)
    else:
        assert verdict.breakdown[-1].name == "system_failure_detection"


@PROPERTY_SETTINGS
@given(result=results, criteria=valid_criteria)
def test_score_is_the_rounded_weighted_average(result: object, criteria: dict[str, Any]) -> None:
    verdict = auto_check(result, criteria)
    if verdict.breakdown:
        total = sum(i.weight for i in verdict.breakdown)
        average = 100 * sum(i.score * i.weight for i in verdict.breakdown) / total
        assert abs(verdict.score - average) <= 0.5 + 1e-9
        threshold = criteria.get("pass_threshold", 60)
        expected_pass = average / 100 >= threshold / 100 - 1e-12 and not _gates_below_full(
            verdict, criteria
        )
        if abs(average - threshold) > 1e-6:
            assert verdict.passed == expected_pass


@PROPERTY_SETTINGS
@given(result=results, criteria=any_criteria)
def test_never_raises_and_is_deterministic(result: object, criteria: Any) -> None:
    first = auto_check(result, criteria)
    second = auto_check(result, criteria)
    assert first == second
    json.dumps(first.to_json_dict(), ensure_ascii=False)


@PROPERTY_SETTINGS
@given(result=results, criteria=hostile_criteria)
def test_hostile_criteria_are_refused_or_judged(result: object, criteria: Any) -> None:
    verdict = auto_check(result, criteria)
    try:
        VerificationCriteria.model_validate(criteria)
    except Exception:
        assert verdict.reasons == (REASON_CRITERIA_TOO_LARGE,)
    else:
        assert verdict.reasons != (REASON_CRITERIA_TOO_LARGE,)


@PROPERTY_SETTINGS
@given(output=output_text, criteria=valid_criteria)
def test_model_and_raw_criteria_agree(output: str, criteria: dict[str, Any]) -> None:
    model = VerificationCriteria.model_validate(criteria)
    assert auto_check({"output": output}, criteria) == auto_check({"output": output}, model)


# ── sizes and depths hypothesis does not reach ────────────────────────────────


def test_huge_outputs_never_raise() -> None:
    criteria = {
        "contains_keywords": ["billing"],
        "forbidden_phrases": ["lorem ipsum"],
        "required_fields": ["summary"],
        "expected_schema": {"required": ["summary"]},
        "expected_answer": "42",
        "regex_pattern": r"\d+$",
        "rubric": [{"criterion": "c", "keywords": ["cluster"]}],
        "max_length": 1000,
    }
    for output in [
        "billing cluster " * 400_000,
        "{" * 1_000_000,
        '{"summary": "' + "x" * 2_000_000 + '"}',
        "I was unable to do it. " * 100_000,
        "\u200b" * 500_000 + "a",
        "漢" * 300_000,
    ]:
        verdict = auto_check({"output": output}, criteria)
        assert 0 <= verdict.score <= 100


def test_deeply_nested_results_never_raise() -> None:
    nested_list: Any = "core"
    nested_dict: Any = "core"
    for _ in range(30_000):
        nested_list = [nested_list]
        nested_dict = {"k": nested_dict}
    for result in (nested_list, nested_dict, {"output": "[" * 30_000 + "]" * 30_000}):
        verdict = auto_check(result, {"required_fields": ["k"], "min_length": 5})
        assert 0 <= verdict.score <= 100
    verdict = auto_check(nested_dict, {"expected_schema": {"required": ["k"]}})
    # Whether 30,000 levels parse depends on the JSON parser's depth limit (an object too
    # deep to parse counts as no object); either way the item is scored, never raised.
    assert verdict.breakdown[0].name == "expected_schema"
    assert verdict.breakdown[0].score in (0.0, 1.0)
    shallow = auto_check({"k": {"k": "v"}}, {"expected_schema": {"required": ["k"]}})
    assert shallow.breakdown[0].score == 1.0


def test_circular_result_never_raises() -> None:
    result: dict[str, Any] = {"name": "loop"}
    result["self"] = result
    verdict = auto_check(result, {"required_fields": ["name"]})
    assert verdict.breakdown[0].score == 1.0


def test_deep_json_text_is_not_handed_to_the_decoder() -> None:
    # Some processes raise the recursion limit (py_ecc sets 100,000): the C decoder would
    # then overflow the C stack on 200,000 levels (a crash) instead of raising.
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous, 100_000))
    try:
        hostile = '{"summary": ' + "[" * 200_000 + "]" * 200_000 + "}"
        verdict = auto_check({"output": hostile}, {"required_fields": ["summary"]})
    finally:
        sys.setrecursionlimit(previous)
    assert verdict.breakdown[0].name == "required_fields"


def test_json_nesting_cap_is_512_levels() -> None:
    def nested(depth: int) -> str:
        return '{"summary": ' + "[" * (depth - 1) + "1" + "]" * (depth - 1) + "}"

    shallow = auto_check({"output": nested(500)}, {"expected_schema": {"required": ["summary"]}})
    assert shallow.breakdown[0].score == 1.0
    deep = auto_check({"output": nested(600)}, {"expected_schema": {"required": ["summary"]}})
    assert deep.breakdown[0].score == 0.0
    assert deep.reasons == ("expected_schema: output contains no JSON object",)


@PROPERTY_SETTINGS
@given(output=output_text, phrases=st.lists(st.sampled_from(FRAGMENTS + WORDS), min_size=1))
def test_forbidden_phrases_follow_their_definition(output: str, phrases: list[str]) -> None:
    """Whatever shortcut the check takes, a phrase is found iff its folded, flattened form
    is in the folded, flattened result (with or without a disclosure section)."""
    from verification.text import canonical, flatten, fold

    criteria = {"forbidden_phrases": phrases, "regex_pattern": "(?:)"}  # pins the floor
    verdict = auto_check({"output": output}, criteria)
    items = {item.name: item.score for item in verdict.breakdown}
    if "forbidden_phrases" not in items:
        return  # a hard failure, or every phrase folds to nothing
    folded = fold(flatten(canonical(output)))
    wanted = [p for p in (fold(flatten(canonical(p))) for p in phrases) if p]
    assert items["forbidden_phrases"] == (0.0 if any(p in folded for p in wanted) else 1.0)
