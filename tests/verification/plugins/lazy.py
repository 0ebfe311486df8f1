"""A plugin the lazy-import test watches: imported only when a task first needs it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def always(task: Mapping[str, Any], trajectory: Any) -> float:
    """Full marks."""
    return 1.0
