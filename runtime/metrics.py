"""Every series whose labels are known, created at 0 when a service starts.

A labelled Prometheus family has no series until a label set is first used, and
`increase(x[5m]) > 0` over a series that did not exist before reads nothing: the first
forged verdict, the first reverted transaction would not fire their alert, only the second.
Each service calls its metrics module's `at_start(...)` with what it knows at start-up
(its chains, its endpoints); the label values come from the closed sets the code uses.
Gauges are left alone: 0 is a value (a balance, a lag), and their loops set them at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any


def at_zero(metric: Any, *dimensions: Iterable[object]) -> None:
    """Create `metric`'s series for every combination of `dimensions` (one iterable per label)."""
    values: list[Sequence[str]] = [[str(v) for v in dimension] for dimension in dimensions]
    for labels in itertools.product(*values):
        metric.labels(*labels)
