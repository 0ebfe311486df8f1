"""Well-behaved plugin verifiers; `IMPORTS` counts how often this module was executed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

IMPORTS = 0
IMPORTS += 1
CALLS: list[Any] = []


def score_arithmetic(task: Mapping[str, Any], trajectory: Any) -> float:
    """Seed 001's example: the last word of the trajectory must equal the task's reference."""
    CALLS.append(trajectory)
    expected = str(task.get("reference", "")).strip()
    answer = str(trajectory).strip().split()[-1] if trajectory else ""
    return 1.0 if answer == expected else 0.0


def length_score(task: Mapping[str, Any], trajectory: Any) -> float:
    """An unbounded measure (for optimisation scores): the length of the output."""
    return float(len(str(trajectory)))


def no_reference(task: Mapping[str, Any], trajectory: Any) -> float:
    """A verifier that cannot answer raises, as seed 001 asks."""
    raise ValueError("this task has no reference; it cannot be scored")


def not_a_number(task: Mapping[str, Any], trajectory: Any) -> object:
    """Returns something float() refuses."""
    return "high"
