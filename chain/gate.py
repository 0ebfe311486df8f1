"""The fail-closed send gate: nothing is broadcast while it is closed.

A sender's owner closes it when the contract stops trusting the key (the escrow's
`marketplaceVerifier()`, its `arbiter()`), when that cannot be read, or while the key is
rotated; it starts closed, so nothing goes out before the first check.

Apart from it, a fee hold (`hold_fees`): the sender sets it while the chain's base fee is
above its fee cap, so no new transaction is signed (what is queued stays queued, what is in
flight is still tracked and re-broadcast) and lifts it when fees fall back.
"""

from __future__ import annotations

import asyncio


class SendGate:
    """Open while the contract trusts our key. Starts closed: nothing goes out unchecked."""

    def __init__(self, *, open_: bool = False) -> None:
        self._open = asyncio.Event()
        self.reason: str | None = "waiting for the first health check"
        self._closures = 0
        self.fee_hold: str | None = None
        self._fees_ok = asyncio.Event()
        self._fees_ok.set()
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

    def hold_fees(self, reason: str) -> None:
        """Hold new transactions: fees are above the cap."""
        self.fee_hold = reason
        self._fees_ok.clear()

    def release_fees(self) -> None:
        """Fees are back under the cap."""
        self.fee_hold = None
        self._fees_ok.set()

    async def wait_sendable(self) -> None:
        """Return once sending is allowed and no fee hold is on."""
        while not (self.is_open and self.fee_hold is None):
            await self._open.wait()
            await self._fees_ok.wait()
