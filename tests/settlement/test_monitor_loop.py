"""The health monitor's loop and the send gate, driven step by step (no chain: the checker is
a stand-in whose answer the test releases when it wants).

- a check in flight when a sender closes the gate (the escrow refused our key) does not
  reopen it, whatever it read; the next check decides;
- a check requested while one is in flight is not lost;
- the loop ends when cancelled, even while a check is being requested at that instant.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from relayer.settlement.health import (
    BridgeHealth,
    BridgeHealthChecker,
    ChainHealth,
    HealthMonitor,
    IndexerHealth,
    RelayerHealth,
    RpcHealth,
    VerifierHealth,
)
from relayer.settlement.sender import SendGate

CHAIN = 31337
OURS = "0x" + "11" * 20
OTHER = "0x" + "22" * 20


def _report(verifier: str) -> BridgeHealth:
    matches = verifier == OURS
    chain = ChainHealth(
        chain_id=CHAIN,
        rpc=RpcHealth(reachable=True, head=1),
        indexer=IndexerHealth(),
        relayer=RelayerHealth(address=OURS),
        verifier=VerifierHealth(
            escrow="0x" + "33" * 20,
            marketplace_verifier=verifier,
            relayer_address=OURS,
            verifier_matches=matches,
            reason=None if matches else "the escrow trusts another key",
        ),
    )
    return BridgeHealth(
        status="ok" if matches else "failing", checked_at=datetime.now(UTC), chains=[chain]
    )


class SteppedChecker:
    """Answers each check with what the test puts in `answers`, when the test says so."""

    def __init__(self) -> None:
        self.answers: asyncio.Queue[BridgeHealth] = asyncio.Queue()
        self.started = 0
        self.starts: asyncio.Queue[int] = asyncio.Queue()  # the number of each check begun
        self.in_flight = asyncio.Event()

    async def check(self) -> BridgeHealth:
        self.started += 1
        self.starts.put_nowait(self.started)
        self.in_flight.set()
        try:
            return await self.answers.get()
        finally:
            self.in_flight.clear()


def _monitor(checker: SteppedChecker, gate: SendGate, interval: float = 3600) -> HealthMonitor:
    return HealthMonitor(
        cast(BridgeHealthChecker, cast(Any, checker)), {CHAIN: gate}, interval=interval
    )


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_check_in_flight_when_the_gate_closes_does_not_reopen_it() -> None:
    checker, gate = SteppedChecker(), SendGate()
    monitor = _monitor(checker, gate)
    await checker.answers.put(_report(OURS))
    await monitor.check_once()
    assert gate.is_open

    in_flight = asyncio.create_task(monitor.check_once())
    await checker.in_flight.wait()
    # The check has read the escrow (our key, before the rotation was mined); now a sender
    # sees the escrow refuse the key and closes the gate.
    gate.close("the escrow refused our key (NotVerifier)")
    await checker.answers.put(_report(OURS))
    report = await in_flight
    assert not gate.is_open, "a check older than the refusal reopened the gate"
    assert gate.reason == "the escrow refused our key (NotVerifier)"
    assert report.chains[0].relayer.sending is False

    # A check that starts after the closure decides: still rotated, then matching again.
    await checker.answers.put(_report(OTHER))
    await monitor.check_once()
    assert not gate.is_open
    await checker.answers.put(_report(OURS))
    await monitor.check_once()
    assert gate.is_open


async def test_the_loop_checks_again_at_once_after_an_outdated_check() -> None:
    checker, gate = SteppedChecker(), SendGate()
    monitor = _monitor(checker, gate)  # an hour between scheduled checks
    loop = asyncio.create_task(monitor.run())
    try:
        assert await checker.starts.get() == 1
        await checker.answers.put(_report(OURS))
        await gate.wait_open()
        assert checker.started == 1

        monitor.request_check()
        assert await checker.starts.get() == 2
        gate.close("the escrow refused our key (NotVerifier)")
        await checker.answers.put(_report(OURS))
        # Not an hour later: the loop runs another check because the last one was outdated
        # (the sender's own request is not needed for that).
        assert await checker.starts.get() == 3
        assert not gate.is_open
        await checker.answers.put(_report(OTHER))
        await _turns()
        assert not gate.is_open
    finally:
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop


async def test_a_request_during_a_check_is_not_lost() -> None:
    checker, gate = SteppedChecker(), SendGate()
    monitor = _monitor(checker, gate)
    loop = asyncio.create_task(monitor.run())
    try:
        assert await checker.starts.get() == 1
        monitor.request_check()  # while the first check is in flight
        await checker.answers.put(_report(OTHER))
        assert await checker.starts.get() == 2  # not an hour later
    finally:
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop


@pytest.mark.parametrize("turns", range(4))
async def test_the_loop_ends_when_cancelled_as_a_check_is_requested(turns: int) -> None:
    checker, gate = SteppedChecker(), SendGate()
    monitor = _monitor(checker, gate)
    await checker.answers.put(_report(OURS))
    loop = asyncio.create_task(monitor.run())
    await gate.wait_open()
    await _turns()  # idle, waiting for the next request
    monitor.request_check()
    await _turns(turns)
    loop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loop
