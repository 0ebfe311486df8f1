"""Adaptive `eth_getLogs` range sizing (pure).

Providers refuse ranges that return too many logs or take too long; a range that was cheap
suggests a bigger one would be too. The sizer halves on a refusal or a timeout and grows by
half while responses stay fast and small, within [min_size, max_size].
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class RangeSizer:
    """Current range size and the rules that move it."""

    size: int = 100
    min_size: int = 1
    max_size: int = 5000
    target_logs: int = 5000
    target_seconds: float = 1.0

    def shrink(self) -> RangeSizer:
        """After a "too many results", response-size or timeout error."""
        return replace(self, size=max(self.min_size, self.size // 2))

    def observe(self, *, logs: int, seconds: float) -> RangeSizer:
        """After a successful request: grow while cheap, shrink gently when heavy."""
        if logs < self.target_logs // 2 and seconds < self.target_seconds / 2:
            return replace(self, size=min(self.max_size, max(self.size + 1, self.size * 3 // 2)))
        if logs > self.target_logs:
            # Dense blocks: jump straight to the size that would have met the target.
            return replace(self, size=max(self.min_size, self.size * self.target_logs // logs))
        if seconds > self.target_seconds:
            return replace(self, size=max(self.min_size, self.size * 3 // 4))
        return self


def plan_ranges(start: int, end: int, size: int, count: int) -> list[tuple[int, int]]:
    """Up to `count` consecutive inclusive ranges of `size` blocks from `start`, none past `end`."""
    ranges: list[tuple[int, int]] = []
    cursor = start
    while cursor <= end and len(ranges) < count:
        last = min(end, cursor + size - 1)
        ranges.append((cursor, last))
        cursor = last + 1
    return ranges
