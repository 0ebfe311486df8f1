"""Deterministic scorers for the panel tests (loaded as `plugin:tests.panels.plugins.scorer:...`)."""

from __future__ import annotations

import os
from typing import Any


def fixed(assignment: dict[str, Any]) -> dict[str, float]:
    """Quality and confidence from the bot's environment: the same answer for every delivery."""
    return {
        "quality": float(os.environ.get("PANEL_TEST_QUALITY", "0.8")),
        "confidence": float(os.environ.get("PANEL_TEST_CONFIDENCE", "0.9")),
    }


def cannot_judge(assignment: dict[str, Any]) -> dict[str, float]:
    """A scorer that fails: the bot must attest confidence 0."""
    raise RuntimeError("model unavailable")
