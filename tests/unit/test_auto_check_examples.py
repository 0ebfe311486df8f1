"""Every worked example of the verification spec, reproduced exactly: verdict, score, reasons.

Examples 4 and 5 describe their texts rather than quote them in full; the texts below
are built to the description (an incident report with "Status: failed for 1,204
deliveries"; a 637-character research report on Northvolt and ACC ending with the quoted
disclosure section).
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from schemas.verification import ALL_CRITERIA_MET, VerificationResult
from verification.auto_check import auto_check

DEFAULT_RULES = {"min_length": 10, "pass_threshold": 60}


def _check(output: str, criteria: Mapping[str, object]) -> VerificationResult:
    return auto_check({"output": output}, criteria)


# ── 1. The default rules don't check correctness ─────────────────────────────


def test_example1_bare_answer_is_under_the_floor() -> None:
    verdict = _check("Paris", DEFAULT_RULES)
    assert (verdict.passed, verdict.score) == (False, 0)
    assert verdict.reasons == ("Output too short: 5 characters, minimum 20",)
    assert verdict.breakdown == ()


@pytest.mark.parametrize(
    "output", ["The capital of France is Paris.", "The capital of France is Lyon."]
)
def test_example1_any_sentence_passes_right_or_wrong(output: str) -> None:
    verdict = _check(output, DEFAULT_RULES)
    assert (verdict.passed, verdict.score) == (True, 100)
    assert verdict.reasons == (ALL_CRITERIA_MET,)
    assert [(i.name, i.score, i.weight) for i in verdict.breakdown] == [
        ("basic_output", 1, 1),
        ("system_failure_detection", 1, 0.5),
    ]


# ── 2. A gate overrides the score ─────────────────────────────────────────────

EXAMPLE2_CRITERIA = {"required_fields": ["name", "price", "currency"]}
EXAMPLE2_RESULT = {"name": "Acme Widget", "price": "", "currency": "USD"}


@pytest.mark.parametrize(
    "result",
    [EXAMPLE2_RESULT, {"output": '{"name": "Acme Widget", "price": "", "currency": "USD"}'}],
    ids=["result-object", "output-string"],
)
def test_example2_gate_fails_above_threshold(result: dict[str, str]) -> None:
    verdict = auto_check(result, EXAMPLE2_CRITERIA)
    assert (verdict.passed, verdict.score) == (False, 73)
    assert verdict.reasons == ("required_fields: 67%",)


def test_example2_verification_result_json_shape() -> None:
    """The spec's `verificationResult.json`, value for value."""
    verdict = auto_check(EXAMPLE2_RESULT, EXAMPLE2_CRITERIA)
    assert verdict.to_json_dict() == {
        "passed": False,
        "score": 73,
        "reasons": ["required_fields: 67%"],
        "breakdown": [
            {"name": "required_fields", "score": 0.6666666666666666, "weight": 2, "reason": ""},
            {"name": "system_failure_detection", "score": 1, "weight": 0.5, "reason": ""},
        ],
        "errors": {},
    }
    assert verdict.to_json() == (
        '{"passed": false, "score": 73, "reasons": ["required_fields: 67%"], "breakdown": '
        '[{"name": "required_fields", "score": 0.6666666666666666, "weight": 2, "reason": ""}, '
        '{"name": "system_failure_detection", "score": 1, "weight": 0.5, "reason": ""}], '
        '"errors": {}}'
    )


# ── 3. A short expected answer must stand alone ───────────────────────────────


def test_example3_answer_alone_passes() -> None:
    verdict = _check("The answer is 42.", {"expected_answer": "42"})
    assert (verdict.passed, verdict.score) == (True, 100)
    assert verdict.reasons == (ALL_CRITERIA_MET,)


@pytest.mark.parametrize(
    ("output", "competing"),
    [("6 × 7 = 42, so the answer is 42.", "6"), ("42 (or 41 if you count the endpoint).", "41")],
)
def test_example3_worked_steps_offer_competing_answers(output: str, competing: str) -> None:
    verdict = _check(output, {"expected_answer": "42"})
    # expected_answer (gate, 1.5) scores 0, failure detection (0.5) 1: 0.5 / 2 = 25.
    assert (verdict.passed, verdict.score) == (False, 25)
    assert verdict.reasons == (
        f'expected_answer: output also offers "{competing}" — more than one answer',
    )


# ── 4. Failure wording costs points, and the threshold decides ────────────────

INCIDENT_REPORT = (
    "Incident report INC-2291: webhook delivery outage on 14 March.\n\n"
    "Between 09:12 and 10:47 UTC the outbound webhook queue stalled after a certificate "
    "rotation on the delivery gateway. Status: failed for 1,204 deliveries, all of which "
    "were replayed from the dead-letter queue by 11:30 UTC. Root cause: the new intermediate "
    "certificate was missing from the gateway trust bundle. Remediation: the bundle is now "
    "built from the same source as the certificates, and an alert fires when the delivery "
    "success rate drops below 98% for five minutes."
)


def test_example4_incident_report_passes_at_67() -> None:
    assert len(INCIDENT_REPORT) >= 300
    verdict = _check(INCIDENT_REPORT, {"min_length": 300})
    assert (verdict.passed, verdict.score) == (True, 67)
    assert verdict.reasons == (ALL_CRITERIA_MET, "system_failure_detection: 0%")


def test_example4_incident_report_fails_threshold_70() -> None:
    verdict = _check(INCIDENT_REPORT, {"min_length": 300, "pass_threshold": 70})
    assert (verdict.passed, verdict.score) == (False, 67)
    assert verdict.reasons == ("system_failure_detection: 0%",)


# ── 5. Refusals fail; an honest disclosure section doesn't ────────────────────

REFUSAL = (
    "I'm sorry, but I can't browse the web, so I was unable to check today's prices. "
    "Here is a general overview of how prices are set."
)
REPORT_BODY = (
    "# European battery cell capacity, 2025\n\n"
    "Northvolt's Skelleftea plant reached about 16 GWh of installed capacity in 2025, "
    "though output stayed well below that after the company's restructuring. ACC "
    "(Automotive Cells Company) runs its first gigafactory at Billy-Berclau/Douvrin in "
    "France at 13 GWh and has paused its planned German and Italian sites. Both still remain "
    "far behind the Chinese-owned plants in Hungary and Germany.\n\n"
)
DISCLOSURE_LINES = (
    "- I was unable to access the paywalled Benchmark Minerals report, so the 2025 "
    "capacity figures come from company press releases.\n"
    "- I could not verify the CATL Arnstadt output figure."
)
REPORT_WITH_SECTION = REPORT_BODY + "## Not done / assumptions\n\n" + DISCLOSURE_LINES
REPORT_WITHOUT_HEADING = REPORT_BODY + DISCLOSURE_LINES
REPORT_RULES = {"min_length": 300, "contains_keywords": ["Northvolt", "ACC"]}


def test_example5_refusal_fails_with_zero() -> None:
    verdict = _check(REFUSAL, {"min_length": 20})
    assert (verdict.passed, verdict.score) == (False, 0)
    assert verdict.reasons == ("Output is a failure excuse, not a deliverable",)
    assert verdict.breakdown == ()


def test_example5_report_with_disclosure_section_passes_at_100() -> None:
    assert len(REPORT_WITH_SECTION) == 637
    verdict = _check(REPORT_WITH_SECTION, REPORT_RULES)
    assert (verdict.passed, verdict.score) == (True, 100)
    assert verdict.reasons == (ALL_CRITERIA_MET,)


def test_example5_same_lines_without_heading_pass_at_75() -> None:
    verdict = _check(REPORT_WITHOUT_HEADING, REPORT_RULES)
    # keywords gate 1.5 × 1 + failure detection 0.5 × 0 = 1.5 / 2 = 75.
    assert (verdict.passed, verdict.score) == (True, 75)
    assert verdict.reasons == (ALL_CRITERIA_MET, "system_failure_detection: 0%")


# ── figures quoted in the rules ────────────────────────────────────────────────


def test_one_keyword_gate_and_unable_sentence_passes_at_75() -> None:
    """Step 3: 'One keyword gate plus a sentence like "I was unable to access the report"
    passes at 75.'"""
    output = (
        "The quarterly revenue grew by twelve percent, driven by new enterprise contracts in "
        "Germany and a recovery in the retail segment, while costs stayed flat across all "
        "regions and headcount was unchanged from the previous quarter. Gross margin improved "
        "to forty one percent as cloud hosting contracts were renegotiated in the spring. "
        "I was unable to access the report on churn."
    )
    verdict = _check(output, {"contains_keywords": ["revenue"]})
    assert (verdict.passed, verdict.score) == (True, 75)


def test_no_rule_beyond_length_and_failure_wording_is_67() -> None:
    """'With no rule beyond length, that drops the score to 67, which fails 70.'"""
    output = (
        "The nightly export job ran for all eleven regions and the archive was rotated, "
        "checksummed and copied to cold storage before six in the morning. "
        "Status: failed for the Lisbon mirror, which is retried on the next run."
    )
    assert _check(output, {"min_length": 20}).score == 67
    verdict = _check(output, {"min_length": 20, "pass_threshold": 70})
    assert (verdict.passed, verdict.score) == (False, 67)


def test_max_length_79_percent_over_next_to_one_keyword_gate_scores_84() -> None:
    """max_length: 'next to one keyword gate, a result 79% over the cap still scored 84.'"""
    words = " ".join(f"word{i}" for i in range(40))
    output = ("ledger " + words + " ")[:179]
    assert len(output) == 179
    verdict = _check(output, {"contains_keywords": ["ledger"], "max_length": 100, "min_length": 20})
    max_length = next(i for i in verdict.breakdown if i.name == "max_length")
    assert max_length.score == pytest.approx(0.21)
    assert (verdict.passed, verdict.score) == (True, 84)
