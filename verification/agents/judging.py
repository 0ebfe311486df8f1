"""What the judges ask the model and what they accept back (pure: prompts in, typed answers out).

* The hosted verifier (seed 000): brief and result, each cut to 12,000 characters, plus the
  poster's `acceptance` note → `{passed, reasons (1–10)}`.
* The rubric judge (seed 001): rubric text, the task's prompt, the flattened trajectory and
  the reference → `{reward in [0, 1], reasons (1–10)}`.

Every text that may be cut travels with its original length in characters (Unicode code
points) and a flag saying whether it was cut (`resultChars`, `resultTruncated`, …), so the
model knows when it sees only the start of a side and can fail rather than assume the rest.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from verification.agents.model import finite, prompts, render

BRIEF_CHARS = 12_000
RESULT_CHARS = 12_000
ACCEPTANCE_CHARS = 4_000
RUBRIC_CHARS = 20_000
PROMPT_CHARS = 12_000
TRAJECTORY_CHARS = 24_000
REFERENCE_CHARS = 12_000
MAX_REASONS = 10

Reason = Annotated[str, StringConstraints(min_length=1, max_length=300)]


class VerifierAnswer(BaseModel):
    """The model's verdict on a delivered result."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    passed: bool
    reasons: list[Reason] = Field(min_length=1, max_length=MAX_REASONS)


class RubricAnswer(BaseModel):
    """The model's score of a trajectory against a rubric."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reward: Annotated[float, Field(ge=0.0, le=1.0), AfterValidator(finite)]
    reasons: list[Reason] = Field(min_length=1, max_length=MAX_REASONS)


def cut(text: str, limit: int) -> str:
    """The first `limit` characters."""
    return text[:limit]


def side(name: str, text: str | None, limit: int) -> dict[str, Any]:
    """`{name: first limit characters, nameChars: original length, nameTruncated: whether cut}`
    (a missing text is `null`, 0 characters, not cut)."""
    value = text or ""
    return {
        name: cut(value, limit) if text is not None else None,
        f"{name}Chars": len(value),
        f"{name}Truncated": len(value) > limit,
    }


def verifier_messages(brief: str, result: str, acceptance: str | None) -> list[dict[str, str]]:
    """The hosted verifier's question (seed 000: each cut to 12,000 characters, data not instructions)."""
    data: dict[str, Any] = {
        **side("brief", brief, BRIEF_CHARS),
        **side("acceptance", acceptance or None, ACCEPTANCE_CHARS),
        **side("result", result, RESULT_CHARS),
    }
    return render(prompts().verifier, data)


def rubric_messages(rubric: str, prompt: str | None, trajectory: str, reference: Any) -> list[dict[str, str]]:
    """The rubric judge's question."""
    ref = reference if reference is None or isinstance(reference, str) else str(reference)
    data: dict[str, Any] = {
        **side("rubric", rubric, RUBRIC_CHARS),
        **side("prompt", prompt or None, PROMPT_CHARS),
        **side("trajectory", trajectory, TRAJECTORY_CHARS),
        **side("reference", ref, REFERENCE_CHARS),
    }
    return render(prompts().rubric_judge, data)
