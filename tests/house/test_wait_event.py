"""`asyncio.wait_for(event.wait(), t)` can swallow a cancellation that races the event on
CPython 3.11 (python/cpython gh-86296): a task group that never ends, a stop that hangs.
The project waits on events through `runtime.aio.wait_event`; this keeps it that way."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "schemas",
    "runtime",
    "chain",
    "indexer",
    "relayer",
    "verification",
    "lifecycle",
    "panels",
    "api",
    "escrowd",
    "bench",
)
PATTERN = re.compile(r"asyncio\.wait_for\(\s*[\w.]+\.wait\(\)")


def test_no_event_is_awaited_through_wait_for() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if PATTERN.search(line)
        and path != ROOT / "runtime" / "aio.py"  # its docstring names the pattern
    ]
    assert found == [], (
        f"use runtime.aio.wait_event instead of asyncio.wait_for(event.wait(), ...): {found}"
    )


def test_the_pattern_finds_what_it_forbids() -> None:
    assert PATTERN.search("await asyncio.wait_for(self._stopping.wait(), delay)")
    assert not PATTERN.search("await asyncio.wait_for(read_lag(bootstrap), 30)")
