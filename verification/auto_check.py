"""The auto check: score a submitted result against the poster's criteria.

:func:`auto_check` is pure (no I/O, no clock other than the regex time bound) and
deterministic. It follows the verification spec step by step:

1. **Hard failures**, each ending the check with score 0, one reason and an empty
   breakdown, in this order: criteria outside the size limits; an empty result; an LLM
   error marker in the first 200 characters; a `regex_pattern` that is unsafe, does not
   compile or times out; a deliverable under the content floor; fewer than 3 distinct
   words (when the floor applies); a refusal or bare failure message.
2. **Scored items**, in this breakdown order: `required_fields` (2, gate),
   `contains_keywords` (1.5, gate), `max_length` (0.5), `forbidden_phrases` (2, gate),
   `regex_pattern` (1.5, gate), `expected_schema` (2, gate), `expected_answer` (1.5; a
   gate when 3 words or fewer), each `rubric_<criterion>` (its weight, default 1),
   `basic_output` (1, only when none of the above is set) and
   `system_failure_detection` (0.5, always).
3. **Score and verdict**: ``score = round(100 × Σ(score × weight) / Σ weight)``, rounding
   half up; the result passes when the *unrounded* score is at least `pass_threshold`
   (default 60) and every gate scored 100%.

`reasons` lists every gate under 100% and every other item under 50%, as `name: N%` or
`name: <explanation>`, after "All verification criteria met" on a pass.

Texts read (see :mod:`verification.text`): the *result text* is the string
`output` field, else the whole result as JavaScript's `JSON.stringify` writes it; the
*deliverable* is the normalised result text without its "Not done / assumptions"
section, flattened to one line. The floor, the failure-language checks and
`expected_answer` read the deliverable; every other rule reads the result text.

Decisions where the spec is silent are recorded in `docs/autocheck.md`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from functools import lru_cache, partial
from typing import NamedTuple

from pydantic import ValidationError

from schemas.criteria import DEFAULT_PASS_THRESHOLD, ExpectedSchema, VerificationCriteria
from schemas.verification import ALL_CRITERIA_MET, VerificationResult
from verification import failure_language, text
from verification.js_json import to_js_json
from verification.js_regex import (
    JsRegex,
    JsRegexSyntaxError,
    JsRegexTimeout,
    JsRegexUnsafeError,
    compile_js_regex,
)
from verification.structured import LabelFinder, extract_json_object, share_present

REASON_CRITERIA_TOO_LARGE = (
    "Verification criteria exceed the supported size — cannot auto-verify against them"
)
REASON_EMPTY = "Empty output"
REASON_LLM_ERROR = "Worker reported an LLM execution error instead of output"
REASON_REGEX_UNSAFE = (
    "regex_pattern was not applied (nested quantifiers or too long) — cannot auto-verify against it"
)
REASON_REGEX_INVALID = (
    "regex_pattern is not a valid regular expression — cannot auto-verify against it"
)
REASON_REGEX_TIMEOUT = "regex_pattern timed out on this output — cannot auto-verify against it"
REASON_EXCUSE = "Output is a failure excuse, not a deliverable"

DEFAULT_MIN_CONTENT_CHARS = 20
MIN_DISTINCT_WORDS = 3
MIN_KEYWORD_CONTEXT_WORDS = 30
SHORT_ANSWER_WORDS = 3
MIN_EXPECTED_SHARE = 1 / 3

WEIGHT_REQUIRED_FIELDS = 2.0
WEIGHT_EXPECTED_SCHEMA = 2.0
WEIGHT_FORBIDDEN_PHRASES = 2.0
WEIGHT_CONTAINS_KEYWORDS = 1.5
WEIGHT_REGEX_PATTERN = 1.5
WEIGHT_EXPECTED_ANSWER = 1.5
WEIGHT_MAX_LENGTH = 0.5
WEIGHT_RUBRIC_DEFAULT = 1.0
WEIGHT_FAILURE_DETECTION = 0.5
WEIGHT_BASIC_OUTPUT = 1.0

GATE_ITEMS = frozenset(
    {
        "required_fields",
        "expected_schema",
        "forbidden_phrases",
        "contains_keywords",
        "regex_pattern",
    }
)

# Words that dress a short answer ("The answer is 42.") without competing with it.
ANSWER_FILLER = frozenset(
    {
        "the", "a", "an", "is", "are", "was", "it", "its", "it's", "this", "that", "of", "to",
        "in", "for", "and", "so", "answer", "result", "final", "correct", "output", "value",
        "equals", "equal", "therefore", "thus", "hence",
    }
)  # fmt: skip
OPPOSITE_ANSWERS: Mapping[str, frozenset[str]] = {
    "yes": frozenset({"no"}),
    "no": frozenset({"yes"}),
    "true": frozenset({"false"}),
    "false": frozenset({"true"}),
}


# ── per-criteria preparation (cached) ──────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class _RubricPlan:
    name: str
    weight: float
    keywords: tuple[str, ...]  # lowercased, distinct
    min_mentions: int


@dataclass(frozen=True, slots=True)
class _Plan:
    """Everything about the criteria that does not depend on the result."""

    criteria: VerificationCriteria
    threshold: float
    required_fields: tuple[str, ...]
    labels: LabelFinder | None
    keywords: tuple[str, ...]  # lowercased
    keyword_words: frozenset[str]
    keyword_context_rule: bool
    forbidden: tuple[str, ...]  # folded, flattened
    # The same, any whitespace run between words, each with its first word.
    forbidden_patterns: tuple[tuple[str, re.Pattern[str]], ...]
    regex: JsRegex | None
    regex_refusal: str | None
    schema: ExpectedSchema | None
    expected_answer: str | None
    expected_words: tuple[str, ...]
    expected_literal: str
    short_answer: bool
    rubric: tuple[_RubricPlan, ...]
    pins_short_answer: bool  # expected_answer, required_fields or expected_schema.required


def _phrase_text(value: str) -> str:
    """A phrase as forbidden-phrase matching compares it."""
    return text.fold(text.flatten(text.canonical(value)))


_PLANS_BY_IDENTITY: dict[int, tuple[VerificationCriteria, _Plan]] = {}
_PLANS_BY_IDENTITY_MAX = 256


def _plan(criteria: VerificationCriteria) -> _Plan:
    """The cached plan for `criteria`; the same object skips hashing the whole model."""
    entry = _PLANS_BY_IDENTITY.get(id(criteria))
    if entry is not None and entry[0] is criteria:
        return entry[1]
    plan = _plan_for(criteria)
    if len(_PLANS_BY_IDENTITY) >= _PLANS_BY_IDENTITY_MAX:
        _PLANS_BY_IDENTITY.clear()
    # Holding the criteria keeps its id from being reused while the entry lives.
    _PLANS_BY_IDENTITY[id(criteria)] = (criteria, plan)
    return plan


@lru_cache(maxsize=512)
def _plan_for(criteria: VerificationCriteria) -> _Plan:
    keywords = tuple(k.lower() for k in criteria.contains_keywords or ())
    keyword_words = frozenset(w for k in keywords for w in text.words(k))
    forbidden = tuple(p for p in map(_phrase_text, criteria.forbidden_phrases or ()) if p)

    regex: JsRegex | None = None
    refusal: str | None = None
    if criteria.regex_pattern:
        try:
            regex = compile_js_regex(criteria.regex_pattern)
        except JsRegexUnsafeError:
            refusal = REASON_REGEX_UNSAFE
        except JsRegexSyntaxError:
            refusal = REASON_REGEX_INVALID

    expected = criteria.expected_answer
    if expected is not None and not text.js_trim(expected):
        expected = None
    expected_literal = text.flatten(text.canonical(expected)) if expected else ""
    expected_words = tuple(text.answer_words(expected_literal))

    rubric = []
    for item in criteria.rubric or ():
        distinct = tuple(dict.fromkeys(k.lower() for k in item.keywords or ()))
        rubric.append(
            _RubricPlan(
                name=f"rubric_{item.criterion}",
                weight=item.weight if item.weight is not None else WEIGHT_RUBRIC_DEFAULT,
                keywords=distinct,
                min_mentions=max(1, item.min_mentions or 1),
            )
        )

    required = tuple(criteria.required_fields or ())
    schema_required = criteria.expected_schema.required if criteria.expected_schema else None
    return _Plan(
        criteria=criteria,
        threshold=(
            criteria.pass_threshold
            if criteria.pass_threshold is not None
            else DEFAULT_PASS_THRESHOLD
        ),
        required_fields=required,
        labels=LabelFinder(required) if required else None,
        keywords=keywords,
        keyword_words=keyword_words,
        keyword_context_rule=(criteria.min_length or 0) < DEFAULT_MIN_CONTENT_CHARS,
        forbidden=forbidden,
        forbidden_patterns=tuple(
            (
                phrase.split(" ")[0],
                re.compile(r"\s+".join(re.escape(word) for word in phrase.split(" "))),
            )
            for phrase in forbidden
        ),
        regex=regex,
        regex_refusal=refusal,
        schema=criteria.expected_schema,
        expected_answer=expected,
        expected_words=expected_words,
        expected_literal=expected_literal,
        short_answer=expected is not None and len(expected_words) <= SHORT_ANSWER_WORDS,
        rubric=tuple(rubric),
        pins_short_answer=bool(
            expected
            or any(text.js_trim(f) for f in required)
            or any(text.js_trim(k) for k in schema_required or ())
        ),
    )


# ── the check ────────────────────────────────────────────────────────────────


def result_text(result: object) -> str:
    """The text the check reads: the string `output` field, else the result as JSON."""
    if isinstance(result, Mapping):
        output = result.get("output")
        if isinstance(output, str):
            return output
    return to_js_json(result)


def _hard_fail(reason: str) -> VerificationResult:
    return VerificationResult(passed=False, score=0, reasons=(reason,), breakdown=(), errors={})


def _coerce_criteria(criteria: object) -> VerificationCriteria | None:
    if isinstance(criteria, VerificationCriteria):
        return criteria
    if not isinstance(criteria, Mapping):
        return None
    try:
        return VerificationCriteria.model_validate(dict(criteria))
    except (ValidationError, ValueError, TypeError, RecursionError):
        return None


def gate_names(criteria: VerificationCriteria) -> frozenset[str]:
    """Names of the breakdown items that are gates under `criteria`."""
    if _plan(criteria).short_answer:
        return GATE_ITEMS | {"expected_answer"}
    return GATE_ITEMS


def auto_check(
    result: object, criteria: VerificationCriteria | Mapping[str, object]
) -> VerificationResult:
    """Judge `result` against `criteria` (a model, or raw criteria as posted)."""
    checked = _coerce_criteria(criteria)
    if checked is None:
        return _hard_fail(REASON_CRITERIA_TOO_LARGE)
    plan = _plan(checked)

    output = result_text(result)
    if not text.js_trim(output):
        return _hard_fail(REASON_EMPTY)

    normalised = text.canonical(output)
    deliverable_lines, disclosed = text.split_disclosure(normalised)
    deliverable = text.flatten(deliverable_lines)
    scanned = failure_language.scan_text(deliverable)
    if failure_language.has_llm_error_marker(scanned):
        return _hard_fail(REASON_LLM_ERROR)

    regex_matched: bool | None = None
    if plan.regex_refusal is not None:
        return _hard_fail(plan.regex_refusal)
    if plan.regex is not None:
        try:
            regex_matched = plan.regex.test(output)
        except JsRegexTimeout:
            return _hard_fail(REASON_REGEX_TIMEOUT)

    pins_short_answer = plan.pins_short_answer or regex_matched is not None
    floor = max(checked.min_length or 0, 0 if pins_short_answer else DEFAULT_MIN_CONTENT_CHARS)
    if len(deliverable) < floor:
        return _hard_fail(f"Output too short: {len(deliverable)} characters, minimum {floor}")
    if not pins_short_answer:
        distinct = text.count_distinct_words(
            deliverable[: failure_language.SCAN_WINDOW], MIN_DISTINCT_WORDS
        )
        if distinct < MIN_DISTINCT_WORDS:
            return _hard_fail(
                f"Output has no real content: {distinct} distinct words, "
                f"minimum {MIN_DISTINCT_WORDS}"
            )

    failure = failure_language.scan(scanned)
    if failure.is_excuse:
        return _hard_fail(REASON_EXCUSE)

    if not disclosed and len(deliverable) <= 2 * failure_language.SCAN_WINDOW:
        folded_output = scanned  # the same text, already folded
    else:
        folded_output = None
    return _score(
        plan, output, normalised, deliverable, folded_output, regex_matched, failure.found
    )


class _Scored(NamedTuple):
    name: str
    score: float
    weight: float
    reason: str


class _Items:
    """Collects scored items; an item that raises scores 0 and is reported, not fatal."""

    def __init__(self) -> None:
        self.breakdown: list[_Scored] = []
        self.notes: dict[str, str] = {}
        self.errors: dict[str, str] = {}

    def add(self, name: str, weight: float, score: Callable[[], float]) -> None:
        try:
            value = float(score())
            reason = ""
        except Exception as exc:
            value, reason = 0.0, "CRASHED"
            self.errors[name] = f"{name}: {exc}"
        if not 0.0 <= value <= 1.0:  # also catches NaN
            value = 0.0 if math.isnan(value) else min(1.0, max(0.0, value))
        self.breakdown.append(_Scored(name, value, weight, reason))

    def note(self, name: str, explanation: str) -> None:
        self.notes[name] = explanation


def _score(
    plan: _Plan,
    output: str,
    normalised: str,
    deliverable: str,
    folded_output: str | None,
    regex_matched: bool | None,
    failure_found: bool,
) -> VerificationResult:
    items = _Items()
    json_object: list[dict[str, object] | None] = []

    def found_object() -> dict[str, object] | None:
        if not json_object:
            json_object.append(extract_json_object(output))
        return json_object[0]

    if plan.required_fields:

        def required_fields() -> float:
            obj = found_object()
            if obj is not None:
                return share_present(plan.required_fields, obj)
            assert plan.labels is not None
            return plan.labels.share_present(plan.required_fields, output)

        items.add("required_fields", WEIGHT_REQUIRED_FIELDS, required_fields)

    if plan.keywords:
        items.add(
            "contains_keywords",
            WEIGHT_CONTAINS_KEYWORDS,
            lambda: _contains_keywords(plan, output, items),
        )

    max_length = plan.criteria.max_length
    if max_length:
        items.add("max_length", WEIGHT_MAX_LENGTH, lambda: _length_score(len(output), max_length))

    if plan.forbidden:

        def forbidden_phrases() -> float:
            if folded_output is not None:
                found = any(phrase in folded_output for phrase in plan.forbidden)
            else:
                # Unflattened text: the patterns accept any whitespace run between words,
                # which is what flattening would have turned into one space.
                folded = text.fold(normalised)
                found = any(
                    # The first word is a cheap necessary condition for the pattern.
                    first in folded and pattern.search(folded) is not None
                    for first, pattern in plan.forbidden_patterns
                )
            return 0.0 if found else 1.0

        items.add("forbidden_phrases", WEIGHT_FORBIDDEN_PHRASES, forbidden_phrases)

    if regex_matched is not None:
        matched = regex_matched
        items.add("regex_pattern", WEIGHT_REGEX_PATTERN, lambda: 1.0 if matched else 0.0)

    schema = plan.schema
    if schema is not None:

        def expected_schema() -> float:
            obj = found_object()
            if obj is None:
                items.note("expected_schema", "output contains no JSON object")
                return 0.0
            return share_present(schema.required or (), obj)

        items.add("expected_schema", WEIGHT_EXPECTED_SCHEMA, expected_schema)

    if plan.expected_answer is not None:
        items.add(
            "expected_answer",
            WEIGHT_EXPECTED_ANSWER,
            lambda: _expected_answer(plan, deliverable, items),
        )

    if plan.rubric:
        lowered = output.lower()
        for rubric in plan.rubric:
            items.add(rubric.name, rubric.weight, partial(_rubric_score, rubric, lowered))

    if not items.breakdown:
        items.add("basic_output", WEIGHT_BASIC_OUTPUT, lambda: 1.0 if output else 0.0)

    items.add(
        "system_failure_detection",
        WEIGHT_FAILURE_DETECTION,
        lambda: 0.0 if failure_found else 1.0,
    )
    return _verdict(plan, items)


def _verdict(plan: _Plan, items: _Items) -> VerificationResult:
    gates = GATE_ITEMS | {"expected_answer"} if plan.short_answer else GATE_ITEMS
    weighted = 0.0
    total_weight = 0.0
    for item in items.breakdown:
        weighted += item.score * item.weight
        total_weight += item.weight
    ratio = weighted / total_weight if total_weight > 0 else 0.0

    reasons: list[str] = []
    gate_missed = False
    for item in items.breakdown:
        is_gate = item.name in gates
        crashed = item.name in items.errors and item.reason == "CRASHED"
        if is_gate and (crashed or item.score < 1):
            gate_missed = True
        if crashed:
            reasons.append(f"[CRASHED] {items.errors[item.name]}")
        elif item.score < 0.5 or (is_gate and item.score < 1):
            note = items.notes.get(item.name)
            reasons.append(f"{item.name}: {note if note is not None else _percent(item.score)}")

    passed = ratio >= plan.threshold / 100 and not gate_missed
    if passed:
        reasons.insert(0, ALL_CRITERIA_MET)
    # One validation call for the whole result: cheaper than building each item.
    return VerificationResult.model_validate(
        {
            "passed": passed,
            "score": _round_half_up(ratio * 100),
            "reasons": reasons,
            "breakdown": [item._asdict() for item in items.breakdown],
            "errors": items.errors,
        }
    )


# ── item scores ──────────────────────────────────────────────────────────────


_CONTEXT_WINDOWS = (300, 3_000, 30_000, 300_000)


def _context_words(plan: _Plan, lowered: str) -> int:
    """Words that are not keywords, counted no further than the rule needs."""
    finder = text.word_finder(lowered)
    is_keyword = plan.keyword_words.__contains__
    # Most outputs have 30 such words in their first few hundred characters: widen the
    # window only as needed. A window ends at a space so that no word is cut in two.
    for size in _CONTEXT_WINDOWS:
        window_end = lowered.find(" ", size)
        if window_end == -1:
            break
        words = finder.findall(lowered, 0, window_end)
        if len(words) - sum(map(is_keyword, words)) >= MIN_KEYWORD_CONTEXT_WORDS:
            return MIN_KEYWORD_CONTEXT_WORDS
    words = finder.findall(lowered)
    return min(MIN_KEYWORD_CONTEXT_WORDS, len(words) - sum(map(is_keyword, words)))


def _contains_keywords(plan: _Plan, output: str, items: _Items) -> float:
    lowered = output.lower()
    if plan.keyword_context_rule:
        # Echoing the keywords is not content: count words that are not keywords.
        context = _context_words(plan, lowered)
        if context < MIN_KEYWORD_CONTEXT_WORDS:
            items.note(
                "contains_keywords",
                f"only {context} words besides the keywords, {MIN_KEYWORD_CONTEXT_WORDS} needed",
            )
            return 0.0
    hits = sum(1 for keyword in plan.keywords if keyword in lowered)
    return hits / len(plan.keywords)


def _length_score(length: int, cap: int) -> float:
    ratio = length / cap
    return 1.0 if ratio <= 1 else max(0.0, 1 - (ratio - 1))


def _expected_answer(plan: _Plan, deliverable: str, items: _Items) -> float:
    expected = plan.expected_words
    if not expected:
        # Nothing word-like to compare ("->", "∅"): plain containment.
        return 1.0 if plan.expected_literal in deliverable else 0.0
    present = dict.fromkeys(text.answer_words(deliverable))
    overlap = sum(1 for word in expected if word in present) / len(expected)
    if not plan.short_answer:
        return overlap
    if overlap < 1:
        if overlap > 0:
            items.note("expected_answer", "only part of the expected answer is present")
        return 0.0
    expected_set = set(expected)
    others = [w for w in present if w not in expected_set and w not in ANSWER_FILLER]
    expects_number = any(text.is_number(word) for word in expected)
    opposites = frozenset().union(*(OPPOSITE_ANSWERS.get(word, frozenset()) for word in expected))
    for word in others:
        if (expects_number and text.is_number(word)) or word in opposites:
            items.note("expected_answer", f'output also offers "{word}" — more than one answer')
            return 0.0
    if len(expected_set) / (len(expected_set) + len(others)) < MIN_EXPECTED_SHARE:
        items.note(
            "expected_answer",
            f"expected answer is present but buried among {len(others)} other words",
        )
        return 0.0
    return 1.0


def _rubric_score(rubric: _RubricPlan, lowered: str) -> float:
    if not rubric.keywords:
        return 0.5
    hits = sum(1 for keyword in rubric.keywords if keyword in lowered)
    return min(1.0, hits / rubric.min_mentions)


# ── numbers as the spec writes them ───────────────────────────────────────────


def _round_half_up(value: float) -> int:
    """`Math.round` for the non-negative scores here: halves round up."""
    floor = math.floor(value)
    return floor + 1 if value - floor >= 0.5 else floor


def _percent(score: float) -> str:
    """`(score * 100).toFixed(0) + "%"`: the exact binary value, halves rounded up."""
    return f"{Decimal(score * 100).quantize(Decimal(1), rounding=ROUND_HALF_UP)}%"
