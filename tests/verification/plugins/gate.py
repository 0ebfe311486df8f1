"""A plugin verifier whose first call waits at a gate the test opens (a judge that stalls)."""

from __future__ import annotations

import asyncio
from typing import Any

calls: list[Any] = []
gate = asyncio.Event()


async def score(task: dict[str, Any], trajectory: Any) -> float:
    calls.append(trajectory)
    if len(calls) == 1:
        await gate.wait()
    return 1.0
