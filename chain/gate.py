"""The fail-closed send gate: nothing is broadcast while it is closed.

A sender's owner closes it when the contract stops trusting the key (the escrow's
`marketplaceVerifier()`, its `arbiter()`), when that cannot be read, or while the key is
rotated; it starts closed, so nothing goes out before the first check.
"""

from __future__ import annotations

import asyncio


class SendGate:
    """Open while the contract trusts our key. Starts closed: nothing goes out unchecked."""

    def __init__(self, *, open_: bool = False) -> None:
        self._open = asyncio.Event()
        self.reason: str | None = "waiting for the first health check"
        self._closures = 0
        if open_:
            self.open()

    @property
    def closures(self) -> int:
        """How many times the gate was closed: a health check that started before the last
        closure read the chain too early to reopen it."""
        return self._closures

    @property
    def is_open(self) -> bool:
        """True while sending is allowed."""
        return self._open.is_set()

    def open(self) -> None:
        """Allow sending."""
        self.reason = None
        self._open.set()

    def close(self, reason: str) -> None:
        """Stop sending, saying why."""
        self.reason = reason
        self._closures += 1
        self._open.clear()

    async def wait_open(self) -> None:
        """Return once sending is allowed."""
        await self._open.wait()
