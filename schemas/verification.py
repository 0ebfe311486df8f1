"""The auto check's verdict (`verificationResult`) and the post-time criteria verdict.

`VerificationResult` serialises to the spec's shape,
`{passed, score, reasons, breakdown: [{name, score, weight, reason}], errors: {}}`.
Whole numbers in `breakdown` are written as JSON integers (`"weight": 2`, `"score": 1`),
as the spec's example shows them; other item scores keep full float precision
(`0.6666666666666666`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_serializer

from schemas.criteria import VerificationCriteria

ALL_CRITERIA_MET = "All verification criteria met"


def _whole_as_int(value: float) -> float | int:
    return int(value) if value.is_integer() else value


class BreakdownItem(BaseModel):
    """One scored item: its 0-1 score, its weight and `reason` (`""` or `"CRASHED"`)."""

    model_config = ConfigDict(frozen=True)

    name: str
    score: Annotated[float, Field(ge=0, le=1)]
    weight: Annotated[float, Field(gt=0)]
    reason: str = ""

    @field_serializer("score", "weight")
    def _number(self, value: float) -> float | int:
        return _whole_as_int(value)


class VerificationResult(BaseModel):
    """The verdict stored with the task as `verificationResult`."""

    model_config = ConfigDict(frozen=True)

    passed: bool
    score: Annotated[int, Field(ge=0, le=100)]
    reasons: tuple[str, ...]
    breakdown: tuple[BreakdownItem, ...] = ()
    errors: dict[str, str] = Field(default_factory=dict)

    def to_json_dict(self) -> dict[str, Any]:
        """The result as plain JSON values, in the spec's field order."""
        return self.model_dump(mode="json")

    def to_json(self) -> str:
        """The result as one line of JSON (non-ASCII kept as is)."""
        return json.dumps(self.to_json_dict(), ensure_ascii=False)


class CriteriaValidation(BaseModel):
    """Post-time verdict on posted criteria.

    `ok` is false when the post would be refused; `code` is then the API error code
    (`VERIFICATION_CRITERIA_INVALID`, `REGEX_PATTERN_UNUSABLE` or
    `AUTO_CRITERIA_REQUIRED`). `warnings` never refuse: dropped unknown fields, a
    regex that will fail every submission, and similar.
    """

    model_config = ConfigDict(frozen=True)

    ok: bool
    code: str | None = None
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    criteria: VerificationCriteria | None = None

    def to_json_dict(self) -> dict[str, Any]:
        """The verdict as plain JSON values; `criteria` as normalised, unset fields left out."""
        return {
            "ok": self.ok,
            "code": self.code,
            "errors": list(self.errors),
            "warnings": list(self.warnings),
            "criteria": (
                self.criteria.model_dump(mode="json", exclude_none=True)
                if self.criteria is not None
                else None
            ),
        }
