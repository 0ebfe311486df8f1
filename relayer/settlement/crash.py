"""Fault injection for crash tests: kill -9 this process at a named point.

Off unless the settings carry `relayer_fault_injection = "point:probability,..."`. The
points are the places where a crash matters (see docs/relayer.md): the kill-9 tests turn
them on so that every one of them is hit across a run, besides kills from outside at
random instants. SIGKILL, not an exception: nothing gets to clean up, exactly as in a
real crash.
"""

from __future__ import annotations

import os
import random
import signal

POINTS = (
    "before_sign",  # verdicts claimed and preflighted, nothing signed
    "after_sign",  # transactions signed, the database transaction not committed
    "after_persist",  # nonce + signed transactions committed, nothing broadcast
    "after_broadcast",  # broadcast, the broadcast not recorded
    "after_mined",  # receipts seen, confirmation not recorded
)


class CrashPoints:
    """Probabilities of dying at each named point."""

    def __init__(self, spec: str | None, *, seed: int | None = None) -> None:
        self._odds: dict[str, float] = {}
        self._random = random.Random(seed)
        for part in (spec or "").split(","):
            if not part.strip():
                continue
            name, _, odds = part.partition(":")
            name = name.strip()
            if name not in POINTS:
                raise ValueError(f"unknown crash point {name!r}; known: {', '.join(POINTS)}")
            self._odds[name] = float(odds or "1")

    @property
    def enabled(self) -> bool:
        """True when any point is armed."""
        return bool(self._odds)

    def maybe_crash(self, point: str) -> None:
        """SIGKILL ourselves at `point` with its configured probability."""
        odds = self._odds.get(point)
        if odds and self._random.random() < odds:
            os.write(2, f'{{"event": "fault_injected_kill", "point": "{point}"}}\n'.encode())
            os.kill(os.getpid(), signal.SIGKILL)
