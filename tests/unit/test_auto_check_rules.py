"""The auto check, rule by rule and hard failure by hard failure, from the spec's text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from schemas.criteria import VerificationCriteria
from schemas.verification import ALL_CRITERIA_MET, VerificationResult
from verification.auto_check import (
    REASON_CRITERIA_TOO_LARGE,
    REASON_EMPTY,
    REASON_EXCUSE,
    REASON_LLM_ERROR,
    REASON_REGEX_INVALID,
    REASON_REGEX_TIMEOUT,
    REASON_REGEX_UNSAFE,
    auto_check,
    gate_names,
    result_text,
)

# Forty-odd plain words of real content, no failure language, no numbers.
PROSE = (
    "The migration plan moves the billing service to the new cluster in three stages. "
    "First the read replicas are created and checked against production traffic. Then "
    "writes are mirrored for one week while dashboards compare both databases. Finally "
    "the old primary is retired after a full backup has been restored on a spare host."
)


def check(output: str, criteria: dict[str, Any] | VerificationCriteria) -> VerificationResult:
    return auto_check({"output": output}, criteria)


def item(verdict: VerificationResult, name: str) -> float:
    return next(i.score for i in verdict.breakdown if i.name == name)


def names(verdict: VerificationResult) -> list[str]:
    return [i.name for i in verdict.breakdown]


# ── what the check reads ──────────────────────────────────────────────────────


def test_reads_string_output_field() -> None:
    assert result_text({"output": "hello", "other": 1}) == "hello"


def test_reads_whole_result_as_compact_json_without_string_output() -> None:
    assert result_text({"output": 5, "b": [1.0, None]}) == '{"output":5,"b":[1,null]}'
    assert result_text({"answer": "é"}) == '{"answer":"é"}'
    assert result_text(["x", 2]) == '["x",2]'


def test_json_result_counts_its_json_length_for_max_length() -> None:
    result = {"note": "alpha beta gamma"}  # {"note":"alpha beta gamma"} is 27 characters
    assert len(result_text(result)) == 27
    assert item(auto_check(result, {"max_length": 27}), "max_length") == 1.0
    assert item(auto_check(result, {"max_length": 18}), "max_length") == 0.5


# ── step 1: hard failures ─────────────────────────────────────────────────────

OVERSIZED_CRITERIA = [
    {"contains_keywords": ["k"] * 51},
    {"forbidden_phrases": ["x" * 201]},
    {"required_fields": [str(i) for i in range(51)]},
    {"rubric": [{"criterion": f"c{i}"} for i in range(21)]},
    {"rubric": [{"criterion": "c", "keywords": ["k"] * 21}]},
    {"rubric": [{"criterion": "c", "weight": 101}]},
    {"expected_schema": {"properties": {f"p{i}": {} for i in range(51)}}},
    {"expected_schema": {"required": ["r"] * 51}},
    {"expected_answer": "a" * 2001},
    {"acceptance": "a" * 4001},
    {"min_length": 1_000_001},
    {"min_length": 0},
    {"max_length": -1},
    {"pass_threshold": 101},
    {"min_length": "20"},
    {"contains_keywords": "revenue"},
]


@pytest.mark.parametrize("criteria", OVERSIZED_CRITERIA)
def test_criteria_outside_limits_fail_with_score_zero(criteria: dict[str, Any]) -> None:
    verdict = check(PROSE, criteria)
    assert (verdict.passed, verdict.score, verdict.breakdown) == (False, 0, ())
    assert verdict.reasons == (REASON_CRITERIA_TOO_LARGE,)


def test_criteria_at_the_limits_are_accepted() -> None:
    criteria = {
        "contains_keywords": ["migration"] + ["plan"] * 49,
        "rubric": [{"criterion": f"c{i}", "keywords": ["k"] * 20} for i in range(20)],
        "expected_answer": "a" * 2000,
        "min_length": 1,
        "pass_threshold": 0,
    }
    assert check(PROSE, criteria).reasons != (REASON_CRITERIA_TOO_LARGE,)


def test_non_object_criteria_fail_as_unsupported() -> None:
    assert auto_check({"output": PROSE}, ["min_length"]).reasons == (  # type: ignore[arg-type]
        REASON_CRITERIA_TOO_LARGE,
    )


@pytest.mark.parametrize("output", ["", "   ", "\n\t \u3000"])
def test_empty_or_whitespace_output(output: str) -> None:
    verdict = check(output, {"min_length": 10})
    assert (verdict.passed, verdict.score, verdict.reasons) == (False, 0, (REASON_EMPTY,))


def test_criteria_checked_before_empty_output() -> None:
    assert check("", {"min_length": 0}).reasons == (REASON_CRITERIA_TOO_LARGE,)


@pytest.mark.parametrize(
    "output",
    [
        "Error during LLM execution: upstream model timed out after 60 seconds of waiting",
        "Result: Error during LLM execution (rate limited) — nothing was produced here",
        "Summary of the run. LLM execution failed while generating the final section text.",
    ],
)
def test_llm_error_marker_in_first_200_characters(output: str) -> None:
    verdict = check(output, {"min_length": 10})
    assert verdict.reasons == (REASON_LLM_ERROR,)


def test_llm_error_marker_after_200_characters_is_not_a_hard_failure() -> None:
    output = PROSE + " " + PROSE + " Error during LLM execution was logged once."
    assert output.find("Error during") > 200
    assert check(output, {"min_length": 10}).reasons != (REASON_LLM_ERROR,)


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("(a+)+$", REASON_REGEX_UNSAFE),
        ("(x*)*y", REASON_REGEX_UNSAFE),
        ("a" * 201, REASON_REGEX_UNSAFE),
        ("(unclosed", REASON_REGEX_INVALID),
        ("*abc", REASON_REGEX_INVALID),
        ("(?i)abc", REASON_REGEX_INVALID),
    ],
)
def test_regex_pattern_refusals(pattern: str, reason: str) -> None:
    verdict = check(PROSE, {"regex_pattern": pattern})
    assert (verdict.passed, verdict.score, verdict.reasons) == (False, 0, (reason,))


def test_regex_pattern_timeout_is_a_hard_failure() -> None:
    verdict = check("1" * 5_000 + "x", {"regex_pattern": r"^(\d|\d\d)+$"})
    assert verdict.reasons == (REASON_REGEX_TIMEOUT,)


def test_regex_reasons_read_as_the_spec_abbreviates_them() -> None:
    assert REASON_REGEX_UNSAFE.startswith("regex_pattern was not applied")
    assert "is not a valid regular expression" in REASON_REGEX_INVALID
    assert "timed out on this output" in REASON_REGEX_TIMEOUT


def test_content_floor_default_is_20_characters() -> None:
    verdict = check("Short but fine ok.", {"min_length": 1})
    assert verdict.reasons == ("Output too short: 18 characters, minimum 20",)


@pytest.mark.parametrize(
    ("criteria", "floor"),
    [({"min_length": 1}, 20), ({"min_length": 20}, 20), ({"min_length": 37}, 37)],
)
def test_output_of_exactly_the_floor_passes_it_and_one_less_does_not(
    criteria: dict[str, Any], floor: int
) -> None:
    """The floor is inclusive: `floor` characters are enough, `floor - 1` are short."""
    at_floor = ("The plan covers billing and churn now " * 3)[:floor]
    assert len(at_floor) == floor and at_floor == at_floor.strip()
    verdict = check(at_floor, criteria)
    assert verdict.passed, verdict.reasons
    shorter = at_floor[:-1].rstrip()
    verdict = check(shorter, criteria)
    assert verdict.reasons == (f"Output too short: {len(shorter)} characters, minimum {floor}",)


def test_content_floor_uses_the_larger_min_length() -> None:
    verdict = check(PROSE, {"min_length": 500})
    assert verdict.reasons == (f"Output too short: {len(PROSE)} characters, minimum 500",)


def test_content_floor_is_counted_after_whitespace_collapse_and_invisibles() -> None:
    output = "ok" + "\u200b" * 40 + "   \n\n   " + "yes"
    verdict = check(output, {"min_length": 1})
    assert verdict.reasons == ("Output too short: 6 characters, minimum 20",)


@pytest.mark.parametrize(
    "criteria",
    [
        {"expected_answer": "Paris"},
        {"regex_pattern": "^Paris$"},
        {"required_fields": ["city"]},
        {"expected_schema": {"required": ["city"]}},
    ],
)
def test_short_answer_rules_waive_the_20_character_floor(criteria: dict[str, Any]) -> None:
    verdict = check("Paris", criteria)
    assert not verdict.reasons[0].startswith("Output too short")
    assert not verdict.reasons[0].startswith("Output has no real content")


def test_waived_floor_still_applies_own_min_length() -> None:
    verdict = check("Paris", {"expected_answer": "Paris", "min_length": 10})
    assert verdict.reasons == ("Output too short: 5 characters, minimum 10",)


def test_schema_without_required_does_not_waive_the_floor() -> None:
    verdict = check('{"a": 1}', {"expected_schema": {"type": "object"}})
    assert verdict.reasons == ("Output too short: 8 characters, minimum 20",)


def test_three_distinct_words_rule() -> None:
    verdict = check("aaaa aaaa aaaa aaaa aaaa", {"min_length": 1})
    assert verdict.reasons == ("Output has no real content: 1 distinct words, minimum 3",)
    verdict = check("......................", {"min_length": 1})
    assert verdict.reasons == ("Output has no real content: 0 distinct words, minimum 3",)


def test_three_word_rule_is_waived_with_a_pinned_answer() -> None:
    verdict = check("aaaa aaaa aaaa aaaa aaaa", {"regex_pattern": "a{4}"})
    assert verdict.passed


@pytest.mark.parametrize(
    "output",
    [
        "As an AI language model, I cannot complete this task for you.",
        "I'm sorry, but I can't help with that request at the moment.",
        "I don't have access to the internet, so there is nothing to report here.",
        "Unfortunately I was unable to finish. The data source was outside my control.",
        "I am unable to complete the task as described by the poster.",
    ],
)
def test_refusals_fail_outright(output: str) -> None:
    verdict = check(output, {"min_length": 10})
    assert (verdict.passed, verdict.score, verdict.reasons) == (False, 0, (REASON_EXCUSE,))


def test_refusal_with_curly_apostrophe_is_normalised() -> None:
    verdict = check("I don’t have access to that system, sorry about it.", {"min_length": 10})
    assert verdict.reasons == (REASON_EXCUSE,)


@pytest.mark.parametrize(
    "output",
    ["Service unavailable. Please try again later today.", "Status: failed. Task incomplete."],
)
def test_bare_neutral_failure_message_fails(output: str) -> None:
    verdict = check(output, {"min_length": 10})
    assert verdict.reasons == (REASON_EXCUSE,)


def test_refusal_beside_40_words_of_work_passes_the_gate_but_loses_the_item() -> None:
    output = PROSE + " " + "I was unable to check the staging cluster."
    verdict = check(output, {"min_length": 20})
    assert verdict.passed
    assert item(verdict, "system_failure_detection") == 0.0
    assert verdict.score == 67


def test_refusal_sentences_over_half_of_all_words_fail() -> None:
    refusals = (
        "I was unable to reach the vendor portal from our network. "
        "I could not access the billing exports for March or April. "
        "I cannot provide the reconciliation of the two ledgers either. "
        "I was unable to confirm the totals with the finance team. "
        "I did not have access to the audit trail of the old primary. "
        "I could not complete the comparison of both database schemas. "
        "I am not able to verify the restored backup on the spare host. "
        "I was not able to run the dashboards for the mirrored week. "
    )
    output = PROSE + " " + refusals
    assert len(PROSE.split()) >= 40
    assert len(refusals.split()) > len(PROSE.split())
    verdict = check(output, {"min_length": 20})
    assert verdict.reasons == (REASON_EXCUSE,)


def test_neutral_wording_in_a_real_document_passes_the_gate() -> None:
    output = "Users were unable to connect between noon and one. " + PROSE
    verdict = check(output, {"min_length": 20})
    assert verdict.passed
    assert item(verdict, "system_failure_detection") == 0.0


def test_failure_language_is_read_only_in_the_first_and_last_64000_characters() -> None:
    filler = ("alpha beta gamma delta. " * 6_000)[:100_000]
    middle = filler + " I was unable to finish the job. " + filler
    verdict = check(middle, {"min_length": 20})
    assert item(verdict, "system_failure_detection") == 1.0
    ending = filler + filler + " I was unable to finish the job."
    assert item(check(ending, {"min_length": 20}), "system_failure_detection") == 0.0


# ── the disclosure section ────────────────────────────────────────────────────

EXCUSE_LINES = "- I was unable to access the paywalled report.\n- I could not verify one figure."


@pytest.mark.parametrize(
    "heading",
    [
        "## Not done / assumptions",
        "Not done:",
        "Assumptions:",
        "### Assumptions",
        "- Not done & assumptions:",
        "1. Not done and assumptions",
        "**Not done, assumptions**",
        "**Not done:**",
        "__Assumptions__",
        "# NOT DONE/ASSUMPTIONS",
    ],
)
def test_disclosure_section_forms_are_exempt(heading: str) -> None:
    output = PROSE + "\n\n" + heading + "\n" + EXCUSE_LINES
    verdict = check(output, {"min_length": 20})
    assert (verdict.passed, verdict.score) == (True, 100)


def test_a_sentence_starting_with_assumptions_is_not_a_section() -> None:
    output = PROSE + "\n\nAssumptions about growth: none.\nI was unable to access the report."
    # "Assumptions about growth" is not a section label: the refusal line counts.
    assert item(check(output, {"min_length": 20}), "system_failure_detection") == 0.0


def test_disclosure_section_ends_at_next_heading_of_same_or_higher_level() -> None:
    output = (
        "# Report\n" + PROSE + "\n## Not done\n### Detail\n" + EXCUSE_LINES + "\n"
        "## Appendix\nI was unable to access the appendix source."
    )
    verdict = check(output, {"min_length": 20})
    # The "### Detail" part is still inside the section; "## Appendix" is not.
    assert item(verdict, "system_failure_detection") == 0.0
    exempt = output.replace("\n## Appendix\nI was unable to access the appendix source.", "")
    assert item(check(exempt, {"min_length": 20}), "system_failure_detection") == 1.0


def test_floor_is_counted_without_the_disclosure_section() -> None:
    output = "Done: the table is attached.\n\n## Not done / assumptions\n" + PROSE
    verdict = check(output, {"min_length": 100})
    assert verdict.reasons == ("Output too short: 28 characters, minimum 100",)


def test_expected_answer_ignores_the_disclosure_section() -> None:
    output = "The answer is 42.\n\nAssumptions:\n- 41 if the endpoint is counted."
    assert check(output, {"expected_answer": "42"}).passed


def test_other_rules_still_read_the_disclosure_section() -> None:
    output = PROSE + "\n\n## Not done / assumptions\n- The Kubernetes upgrade, lorem ipsum."
    assert check(output, {"contains_keywords": ["kubernetes"], "min_length": 20}).passed
    verdict = check(output, {"forbidden_phrases": ["lorem ipsum"], "min_length": 20})
    assert not verdict.passed
    assert verdict.reasons == ("forbidden_phrases: 0%",)


# ── step 2: items, weights and gates ──────────────────────────────────────────


def test_items_weights_and_order() -> None:
    criteria = {
        "required_fields": ["summary"],
        "contains_keywords": ["billing"],
        "max_length": 10_000,
        "forbidden_phrases": ["lorem"],
        "regex_pattern": "billing",
        "expected_schema": {"required": ["summary"]},
        "expected_answer": "billing service cluster migration plan",
        "rubric": [{"criterion": "depth", "keywords": ["backup"], "weight": 3}, {"criterion": "x"}],
    }
    output = '{"summary": "' + PROSE + '"}'
    verdict = check(output, criteria)
    assert [(i.name, i.weight) for i in verdict.breakdown] == [
        ("required_fields", 2),
        ("contains_keywords", 1.5),
        ("max_length", 0.5),
        ("forbidden_phrases", 2),
        ("regex_pattern", 1.5),
        ("expected_schema", 2),
        ("expected_answer", 1.5),
        ("rubric_depth", 3),
        ("rubric_x", 1),
        ("system_failure_detection", 0.5),
    ]


def test_basic_output_only_when_no_rule_is_set() -> None:
    assert names(check(PROSE, {"min_length": 20})) == ["basic_output", "system_failure_detection"]
    assert names(check(PROSE, {})) == ["basic_output", "system_failure_detection"]
    assert "basic_output" not in names(check(PROSE, {"max_length": 5000}))


def test_gate_names_depend_on_expected_answer_length() -> None:
    short = VerificationCriteria(expected_answer="Paris France")
    long = VerificationCriteria(expected_answer="the capital of France is Paris")
    assert "expected_answer" in gate_names(short)
    assert "expected_answer" not in gate_names(long)
    assert {"required_fields", "expected_schema", "forbidden_phrases"} <= gate_names(long)


# contains_keywords


def test_keywords_score_is_the_share_found_and_is_a_gate() -> None:
    verdict = check(PROSE, {"contains_keywords": ["billing", "kafka"], "min_length": 20})
    assert item(verdict, "contains_keywords") == 0.5
    assert not verdict.passed
    assert verdict.reasons == ("contains_keywords: 50%",)


def test_keywords_are_case_insensitive_substrings() -> None:
    output = PROSE + " According to the plan, this is fine."
    verdict = check(output, {"contains_keywords": ["BILLING", "acc"], "min_length": 20})
    assert item(verdict, "contains_keywords") == 1.0


def test_keywords_do_not_fold_accents_or_punctuation() -> None:
    output = PROSE + " The cafe team don’t mind."
    verdict = check(output, {"contains_keywords": ["café", "don't"], "min_length": 20})
    assert item(verdict, "contains_keywords") == 0.0


@pytest.mark.parametrize("min_length", [None, 10, 19])
def test_keywords_need_30_other_words_without_a_real_min_length(min_length: int | None) -> None:
    criteria: dict[str, Any] = {"contains_keywords": ["revenue", "churn"]}
    if min_length is not None:
        criteria["min_length"] = min_length
    verdict = check("Revenue and churn: revenue churn revenue churn figures.", criteria)
    assert item(verdict, "contains_keywords") == 0.0
    assert verdict.reasons == ("contains_keywords: only 2 words besides the keywords, 30 needed",)


def test_keywords_30_word_rule_lifted_at_min_length_20() -> None:
    verdict = check(
        "Revenue and churn: revenue churn figures.",
        {"contains_keywords": ["revenue", "churn"], "min_length": 20},
    )
    assert verdict.passed


# forbidden_phrases


@pytest.mark.parametrize(
    "output",
    [
        "This draft is LOREM IPSUM placeholder text for the page and nothing else.",
        "This draft is lorem ípsum placeholder text for the page and nothing else.",
        "This draft is l\u043erem ipsum placeholder text for the page and nothing else.",
        "This draft is lo\u00adrem ipsum placeholder text for the page and nothing else.",
        "This draft is lor\u200bem ipsum placeholder text for the page and nothing else.",
        "This draft is lorem\u00a0ipsum placeholder text for the page and nothing else.",
    ],
)
def test_forbidden_phrase_is_caught_through_folding(output: str) -> None:
    verdict = check(output, {"forbidden_phrases": ["lorem ipsum"], "min_length": 20})
    assert item(verdict, "forbidden_phrases") == 0.0
    assert not verdict.passed


def test_zero_width_space_replacing_the_space_is_not_caught() -> None:
    output = "This draft is lorem\u200bipsum placeholder text for the page."
    verdict = check(output, {"forbidden_phrases": ["lorem ipsum"], "min_length": 20})
    assert item(verdict, "forbidden_phrases") == 1.0


def test_forbidden_phrases_are_folded_too() -> None:
    verdict = check(PROSE, {"forbidden_phrases": ["BÍLLING  SERVICE"], "min_length": 20})
    assert item(verdict, "forbidden_phrases") == 0.0


# required_fields


@pytest.mark.parametrize(
    "output",
    [
        '{"summary": "ok", "score": 5}',
        'Here you go:\n```json\n{"summary": "ok", "score": 5}\n```\nThanks.',
        'The result is {"summary": "ok", "score": 5} as requested.',
    ],
)
def test_required_fields_in_a_json_object(output: str) -> None:
    verdict = check(output, {"required_fields": ["summary", "score"]})
    assert item(verdict, "required_fields") == 1.0
    assert verdict.passed


@pytest.mark.parametrize("empty", ['""', "[]", "{}", "null", '"   "'])
def test_empty_values_do_not_count(empty: str) -> None:
    verdict = check(
        '{"summary": ' + empty + ', "score": 5}', {"required_fields": ["summary", "score"]}
    )
    assert item(verdict, "required_fields") == 0.5
    assert verdict.reasons == ("required_fields: 50%",)


@pytest.mark.parametrize("value", ["0", "false"])
def test_zero_and_false_are_values(value: str) -> None:
    verdict = check('{"score": ' + value + "}", {"required_fields": ["score"]})
    assert item(verdict, "required_fields") == 1.0


@pytest.mark.parametrize(
    "output",
    [
        "Summary: the plan is sound.\nRisks: two, both minor.",
        "## Summary\nThe plan is sound.\n## Risks\nTwo, both minor.",
        "**Summary**\nThe plan is sound.\n**Risks:** two, both minor.",
        "- summary: the plan is sound\n- RISKS: two, both minor",
    ],
)
def test_required_fields_as_labelled_sections(output: str) -> None:
    verdict = check(output, {"required_fields": ["summary", "risks"]})
    assert item(verdict, "required_fields") == 1.0


@pytest.mark.parametrize(
    "output",
    [
        "**Price** 40 USD\n**Currency** USD",  # seed 000: "`**Summary**` followed by text"
        "__Price__ 40 USD\n__Currency__ USD",
        "Quote below.\n**Price** 40 USD. **Currency** USD",
        "**Price** — 40\n**Currency**: USD",
    ],
)
def test_bold_label_followed_by_text_on_the_same_line_is_a_section(output: str) -> None:
    verdict = check(output, {"required_fields": ["price", "currency"]})
    assert item(verdict, "required_fields") == 1.0
    assert verdict.passed


@pytest.mark.parametrize(
    ("output", "share"),
    [
        ("Price 40 USD\nCurrency USD", 0.0),  # plain words, no label form
        ("**Price** **Currency** USD", 0.0),  # Price's text is only the next label
        ("**Price**\n**Currency** USD", 0.5),
        ("The **price** is 40 USD", 0.0),  # bold inside a sentence is emphasis, not a label
    ],
)
def test_bold_label_needs_its_own_text(output: str, share: float) -> None:
    verdict = check(output, {"required_fields": ["price", "currency"]})
    assert item(verdict, "required_fields") == share


def test_bare_labels_are_a_template_not_a_deliverable() -> None:
    verdict = check("Summary:\nRisks:\n", {"required_fields": ["summary", "risks"]})
    assert item(verdict, "required_fields") == 0.0
    verdict = check("Summary:\nRisks: two", {"required_fields": ["summary", "risks"]})
    assert item(verdict, "required_fields") == 0.5


def test_json_object_takes_precedence_over_labels() -> None:
    output = 'Summary: the plan is sound.\n{"risks": "two"}'
    verdict = check(output, {"required_fields": ["summary", "risks"]})
    assert item(verdict, "required_fields") == 0.5


# expected_schema


def test_expected_schema_needs_a_json_object() -> None:
    verdict = check(PROSE, {"expected_schema": {"type": "object", "required": ["a"]}})
    assert item(verdict, "expected_schema") == 0.0
    assert verdict.reasons == ("expected_schema: output contains no JSON object",)
    verdict = check('["a", "b", "c", "d", "e", "f", "g"]', {"expected_schema": {"required": ["a"]}})
    assert item(verdict, "expected_schema") == 0.0


def test_expected_schema_scores_share_of_required_keys_with_values() -> None:
    schema = {"required": ["a", "b", "c", "d"], "properties": {"a": {"type": "integer"}}}
    verdict = check('{"a": "not an integer", "b": 1, "c": "", "e": 2}', {"expected_schema": schema})
    assert item(verdict, "expected_schema") == 0.5
    assert not verdict.passed


def test_expected_schema_without_required_is_satisfied_by_any_object() -> None:
    verdict = check(
        'Result: {"anything": 1} and some words to pass the floor.',
        {"expected_schema": {"type": "object"}},
    )
    assert item(verdict, "expected_schema") == 1.0


# expected_answer


@pytest.mark.parametrize("output", ["Paris.", "**Paris**", "The answer is Paris", "PARIS"])
def test_short_expected_answer_matches_words(output: str) -> None:
    verdict = check(output, {"expected_answer": "Paris"})
    assert (verdict.passed, verdict.score) == (True, 100)


def test_numbers_with_separators_stay_one_word() -> None:
    assert check("The total is 443.21.", {"expected_answer": "443.21"}).passed
    verdict = check("The total is 443.22.", {"expected_answer": "443.21"})
    assert not verdict.passed
    verdict = check("The total is 443.21 or 1,204.", {"expected_answer": "443.21"})
    assert verdict.reasons == (
        'expected_answer: output also offers "1,204" — more than one answer',
    )


@pytest.mark.parametrize(
    ("expected", "output", "competing"),
    [
        ("yes", "Yes. Well, no.", "no"),
        ("true", "true, or false", "false"),
        ("no", "no / yes", "yes"),
    ],
)
def test_opposite_of_yes_no_true_false_competes(expected: str, output: str, competing: str) -> None:
    verdict = check(output, {"expected_answer": expected})
    assert verdict.reasons == (
        f'expected_answer: output also offers "{competing}" — more than one answer',
    )


def test_buried_short_answer_fails() -> None:
    output = "Paris London Berlin Madrid Rome Vienna Prague Lisbon"
    verdict = check(output, {"expected_answer": "Paris"})
    assert not verdict.passed
    assert verdict.reasons == (
        "expected_answer: expected answer is present but buried among 7 other words",
    )


def test_short_answer_partly_present() -> None:
    verdict = check("George Bush", {"expected_answer": "George Washington"})
    assert verdict.reasons == ("expected_answer: only part of the expected answer is present",)


def test_long_expected_answer_is_scored_not_gated() -> None:
    criteria = {"expected_answer": "alpha beta gamma delta", "pass_threshold": 50}
    verdict = check("alpha beta and some other words entirely", criteria)
    assert item(verdict, "expected_answer") == 0.5
    # (1.5 × 0.5 + 0.5 × 1) / 2 = 62.5 → 63; not a gate, so this passes.
    assert (verdict.passed, verdict.score) == (True, 63)


# regex_pattern


def test_regex_is_a_gate_and_case_sensitive() -> None:
    assert check("Order ABC-123 shipped", {"regex_pattern": r"[A-Z]{3}-\d{3}"}).passed
    verdict = check("Order abc-123 shipped", {"regex_pattern": r"[A-Z]{3}-\d{3}"})
    assert (verdict.passed, verdict.reasons) == (False, ("regex_pattern: 0%",))


def test_regex_dollar_anchors_the_whole_text_only() -> None:
    assert check("12345", {"regex_pattern": r"^\d+$"}).passed
    assert not check("12345\n", {"regex_pattern": r"^\d+$"}).passed
    assert not check("ab\n12345", {"regex_pattern": r"^\d+$"}).passed


def test_regex_reads_the_full_result_including_disclosure() -> None:
    output = "Done.\n\n## Not done\n- ticket T-42 open"
    assert check(output, {"regex_pattern": r"T-\d+"}).passed


def test_regex_reads_only_the_first_20000_characters() -> None:
    output = "x " * 10_000 + "needle"
    assert not check(output, {"regex_pattern": "needle", "min_length": 1}).passed
    assert check("needle " + output, {"regex_pattern": "needle", "min_length": 1}).passed


# max_length


@pytest.mark.parametrize(
    ("length", "score"), [(100, 1.0), (150, 0.5), (200, 0.0), (400, 0.0), (50, 1.0)]
)
def test_max_length_falls_off_linearly_to_twice_the_cap(length: int, score: float) -> None:
    output = (PROSE * 2)[:length]
    verdict = check(output, {"max_length": 100, "min_length": 20})
    assert item(verdict, "max_length") == pytest.approx(score)


# rubric


def test_rubric_counts_distinct_keywords_over_min_mentions() -> None:
    rubric = [
        {"criterion": "coverage", "keywords": ["replica", "backup", "kafka"], "min_mentions": 2}
    ]
    verdict = check(PROSE, {"rubric": rubric, "min_length": 20})
    assert item(verdict, "rubric_coverage") == 1.0
    rubric[0]["min_mentions"] = 3
    assert item(check(PROSE, {"rubric": rubric}), "rubric_coverage") == pytest.approx(2 / 3)


def test_rubric_repeating_one_keyword_does_not_count_twice() -> None:
    output = "backup backup backup, then another backup of the backup. " * 3
    rubric = [{"criterion": "c", "keywords": ["backup", "replica"], "min_mentions": 2}]
    assert item(check(output, {"rubric": rubric}), "rubric_c") == 0.5
    rubric = [{"criterion": "c", "keywords": ["backup", "BACKUP"], "min_mentions": 2}]
    assert item(check(output, {"rubric": rubric}), "rubric_c") == 0.5


def test_rubric_without_keywords_scores_flat_half_and_is_not_a_gate() -> None:
    verdict = check(PROSE, {"rubric": [{"criterion": "style", "weight": 2}]})
    assert item(verdict, "rubric_style") == 0.5
    assert verdict.passed
    # (2 × 0.5 + 0.5) / 2.5 = 60.
    assert verdict.score == 60
    assert verdict.reasons == (ALL_CRITERIA_MET,)


def test_rubric_under_half_is_listed_in_reasons_without_failing() -> None:
    rubric = [{"criterion": "depth", "keywords": ["kafka"]}]
    verdict = check(PROSE, {"rubric": rubric, "contains_keywords": ["billing"], "min_length": 20})
    # (1.5 + 0 + 0.5) / 3 = 66.67 → 67, a pass with the weak item listed.
    assert (verdict.passed, verdict.score) == (True, 67)
    assert verdict.reasons == (ALL_CRITERIA_MET, "rubric_depth: 0%")


# ── step 3: score and verdict ─────────────────────────────────────────────────


def test_score_rounds_half_up() -> None:
    verdict = check(PROSE, {"rubric": [{"criterion": "s", "weight": 1.5}]})
    # (1.5 × 0.5 + 0.5) / 2 = 0.625 → 62.5 → 63.
    assert verdict.score == 63


def test_threshold_compares_the_unrounded_score() -> None:
    criteria = {"rubric": [{"criterion": "s", "weight": 2.01}], "pass_threshold": 60}
    verdict = check(PROSE, criteria)
    # (2.01 × 0.5 + 0.5) / 2.51 = 59.96 %: shown as 60, below a threshold of 60.
    assert verdict.score == 60
    assert not verdict.passed
    assert verdict.reasons == ()


def test_percentages_in_reasons_round_half_up() -> None:
    rubric = [{"criterion": "c", "keywords": ["billing"], "min_mentions": 8}]
    verdict = check(PROSE, {"rubric": rubric})
    assert "rubric_c: 13%" in verdict.reasons


def test_every_gate_must_be_full() -> None:
    criteria = {"contains_keywords": ["billing", "cluster", "kafka"], "min_length": 20}
    verdict = check(PROSE, criteria)
    assert verdict.score == pytest.approx(75, abs=1)
    assert not verdict.passed
    assert verdict.reasons == ("contains_keywords: 67%",)


def test_pass_lists_all_criteria_met_first() -> None:
    verdict = check(PROSE, {"contains_keywords": ["billing"], "min_length": 20})
    assert verdict.reasons[0] == ALL_CRITERIA_MET
    assert verdict.errors == {}


def test_model_and_mapping_criteria_agree_and_unknown_fields_are_dropped() -> None:
    raw = {"contains_keywords": ["billing"], "min_length": 20, "min_lenght": 10_000}
    assert check(PROSE, raw) == check(PROSE, VerificationCriteria.model_validate(raw))
    assert check(PROSE, raw).passed


# ── building blocks ───────────────────────────────────────────────────────────


def test_unicode_tables_match_the_interpreter() -> None:
    import unicodedata

    from verification.unicode_tables import FORMAT_CHARACTERS, MARKS

    def ranges(wanted: Callable[[str], bool]) -> list[tuple[int, int]]:
        found: list[tuple[int, int]] = []
        for code in range(0x110000):
            if wanted(unicodedata.category(chr(code))):
                if found and found[-1][1] == code - 1:
                    found[-1] = (found[-1][0], code)
                else:
                    found.append((code, code))
        return found

    assert list(FORMAT_CHARACTERS) == ranges(lambda category: category == "Cf")
    assert list(MARKS) == ranges(lambda category: category.startswith("M"))


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("a\u200bb\u00adc\ufeffd", "abcd"),
        ("ｆｕｌｌ　ｗｉｄｔｈ", "full width"),
        ("don’t ʼn ‘x’", "don't 'n 'x'"),
        ("a\x1cb\x85c\x00d", "abcd"),
        ("line\r\nnext\rthird", "line\nnext\nthird"),
        ("tab\there\vand\fform", "tab\there\vand\fform"),
        ("ﬁ ligature", "fi ligature"),
    ],
)
def test_canonical_normalisation(raw: str, normalised: str) -> None:
    from verification.text import canonical

    assert canonical(raw) == normalised


def test_flatten_and_fold() -> None:
    from verification.text import flatten, fold

    assert flatten("  a \n\n b\t\u3000c  ") == "a b c"
    assert fold("Ÿ Crème LОREM ΙΡSUM") == "y creme lorem ipsum"


def test_words_and_answer_words() -> None:
    from verification.text import answer_words, words

    assert words("Don't stop end-to-end 漢字 snake_case") == [
        "don't", "stop", "end-to-end", "漢", "字", "snake", "case",
    ]  # fmt: skip
    assert answer_words("Total 1,204 or 443.21, then 42.") == [
        "total", "1,204", "or", "443.21", "then", "42",
    ]  # fmt: skip


def test_fenced_block_scan_matches_the_regex_definition() -> None:
    import random
    import re

    from verification.structured import _fenced_blocks

    fence = re.compile(r"```(?:json)?\s*\n([\s\S]*?)```", re.IGNORECASE)
    rng = random.Random(3)
    pieces = ["```", "json", "JSON", "\n", " ", "{}", "x", "`", "\t"]
    for _ in range(2_000):
        sample = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        assert _fenced_blocks(sample) == [m.span(1) for m in fence.finditer(sample)], sample


def test_json_text_is_written_as_javascript_writes_it() -> None:
    from verification.js_json import js_number, to_js_json

    assert [js_number(x) for x in (1.0, 0.5, 1e-7, 1e16, 1e21, -2.5, 0.1 + 0.2)] == [
        "1", "0.5", "1e-7", "10000000000000000", "1e+21", "-2.5", "0.30000000000000004",
    ]  # fmt: skip
    assert to_js_json({"b": 1, "10": 2, "2": [True, None, float("nan")]}) == (
        '{"2":[true,null,null],"10":2,"b":1}'
    )
    assert to_js_json("x") == '"x"'


def test_answer_word_fast_path_matches_the_two_branch_pattern() -> None:
    import random
    import re

    from verification.text import answer_words, is_number

    reference = re.compile(r"[0-9]+(?:[.,][0-9]+)+(?![a-z0-9])|[a-z0-9]+(?:['-][a-z0-9]+)*")
    rng = random.Random(5)
    pieces = ["1", "12", "a", "x", ".", ",", "'", "-", " ", "5", "b2", "!", "\n"]
    for _ in range(5_000):
        sample = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 16)))
        assert answer_words(sample) == reference.findall(sample.lower()), sample
    assert [is_number(w) for w in ("42", "1,204", "443.21", "4x", "x4", "٤٢", "")] == [
        True, True, True, False, False, True, False,
    ]  # fmt: skip
