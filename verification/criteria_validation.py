"""Post-time validation of `verificationCriteria`, as the task API applies it.

Refusals (`ok` false, one `code`):

* `VERIFICATION_CRITERIA_INVALID`: not an object, a wrong type, or a size limit
  exceeded (the limits of :mod:`schemas.criteria`);
* `REGEX_PATTERN_UNUSABLE`: a `regex_pattern` with nested quantifiers (or overlapping
  alternatives in a repeated group, or counted repeats too large to compile) or over
  200 characters, whatever the mode;
* `AUTO_CRITERIA_REQUIRED`, for `auto` only, unless one real check is set:
  `min_length` above 0, `contains_keywords`, `required_fields`, `expected_schema` with
  `type: "object"` or `required`, a `rubric` item with keywords, a compiling
  `regex_pattern`, or `expected_answer`. `forbidden_phrases` alone is not one: a wrong
  answer avoids the phrases.

Warnings never refuse. They report what the API drops or accepts silently: unknown
fields (dropped, so `min_lenght` sets nothing), a `regex_pattern` that does not compile
(every submission would then fail), and escapes JavaScript reads as plain letters
(`\\A` is "A").
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import ValidationError

from schemas.criteria import VerificationCriteria, unknown_fields
from schemas.verification import CriteriaValidation
from verification.js_regex import (
    JsRegexSyntaxError,
    JsRegexUnsafeError,
    compile_js_regex,
)
from verification.text import js_trim

CRITERIA_INVALID = "VERIFICATION_CRITERIA_INVALID"
REGEX_PATTERN_UNUSABLE = "REGEX_PATTERN_UNUSABLE"
AUTO_CRITERIA_REQUIRED = "AUTO_CRITERIA_REQUIRED"
MODES = ("auto", "agent", "manual")


def _describe(error: ValidationError) -> list[str]:
    messages = []
    for detail in error.errors(include_url=False):
        where = ".".join(str(part) for part in detail["loc"]) or "criteria"
        messages.append(f"{where}: {detail['msg']}")
    return messages


def _has_real_check(criteria: VerificationCriteria, regex_compiles: bool) -> bool:
    schema = criteria.expected_schema
    return bool(
        (criteria.min_length or 0) > 0
        or criteria.contains_keywords
        or criteria.required_fields
        or (schema is not None and (schema.type == "object" or schema.required))
        or any(item.keywords for item in criteria.rubric or ())
        or regex_compiles
        or (criteria.expected_answer and js_trim(criteria.expected_answer))
    )


def validate_criteria(data: object, mode: str = "auto") -> CriteriaValidation:
    """The API's verdict on `data` posted as `verificationCriteria` for a task in `mode`."""
    if mode not in MODES:
        raise ValueError(f"unknown verification mode {mode!r}; expected one of {MODES}")
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        return CriteriaValidation(
            ok=False, code=CRITERIA_INVALID, errors=("criteria must be a JSON object",)
        )

    warnings = [f"unknown field {path!r} was dropped" for path in unknown_fields(data)]
    try:
        criteria = VerificationCriteria.model_validate(dict(data))
    except ValidationError as error:
        return CriteriaValidation(
            ok=False,
            code=CRITERIA_INVALID,
            errors=tuple(_describe(error)),
            warnings=tuple(warnings),
        )

    regex_compiles = False
    if criteria.regex_pattern:
        try:
            compiled = compile_js_regex(criteria.regex_pattern)
        except JsRegexUnsafeError as error:
            return CriteriaValidation(
                ok=False,
                code=REGEX_PATTERN_UNUSABLE,
                errors=(f"regex_pattern: {error}",),
                warnings=tuple(warnings),
                criteria=criteria,
            )
        except JsRegexSyntaxError as error:
            warnings.append(
                f"regex_pattern is not a valid JavaScript regular expression ({error}): "
                "every submission will fail the auto check"
            )
        else:
            regex_compiles = True
            warnings.extend(f"regex_pattern: {warning}" for warning in compiled.warnings)

    if mode == "auto" and not _has_real_check(criteria, regex_compiles):
        message = "auto verification needs at least one real check"
        if criteria.forbidden_phrases:
            message += ": forbidden_phrases alone is not enough, a wrong answer avoids them"
        return CriteriaValidation(
            ok=False,
            code=AUTO_CRITERIA_REQUIRED,
            errors=(message,),
            warnings=tuple(warnings),
            criteria=criteria,
        )
    return CriteriaValidation(ok=True, warnings=tuple(warnings), criteria=criteria)
