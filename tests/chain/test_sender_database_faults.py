"""The transaction sender on anvil and PostgreSQL when the database drops a connection in the
middle of a tracking round: the round is retried, and what it was writing (a call mined and
confirmed) still reaches the database and the caller waiting for it.

The fault is the one an operator's `pg_terminate_backend`, a failover or a server restart
causes: the backend running the round's write is terminated (SQLSTATE 57P01,
`AdminShutdownError`) while the write waits for a row lock the test holds.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from prometheus_client import CollectorRegistry

from chain.eth_rpc import EthRpc
from chain.gate import SendGate
from chain.keys import SecretKey
from chain.sender import CallSender, SenderMetrics, SenderOptions
from escrowd.devnet import Devnet
from runtime.db import connect, create_pool

pytestmark = pytest.mark.timeout(300)

BLOCKED_WRITE_SQL = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    " AND wait_event_type = 'Lock' AND query LIKE 'UPDATE settlement_transactions%'"
)


async def _until(condition, runner: asyncio.Task[None], what: str, timeout: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    """Poll `condition` (a coroutine function) while the sender keeps running."""
    async with asyncio.timeout(timeout):
        while not await condition():
            if runner.done():
                raise AssertionError(f"the sender stopped while waiting for {what}: {runner.exception()!r}")
            await asyncio.sleep(0.05)


async def test_a_tracking_round_cut_by_a_terminated_connection_is_retried_and_its_call_confirmed(
    devnet: Devnet, database_url: str
) -> None:
    wallet = devnet.spare[0]
    rpc = EthRpc([devnet.rpc_url], chain_id=devnet.chain_id)
    pool = await create_pool(database_url, max_size=4)
    locker = await connect(database_url)
    watcher = await connect(database_url)  # outside the lock's transaction, which sees one snapshot of the activity
    sender = CallSender(
        chain_id=devnet.chain_id, key=SecretKey.from_hex(wallet.private_key), rpc=rpc, pool=pool,
        gate=SendGate(open_=True), options=SenderOptions(recheck_interval=0.5, replace_after=3_600.0),
        metrics=SenderMetrics.create("test_sender_db_faults", "the test", CollectorRegistry()),
        confirmations=1, poll_interval=0.1,
    )  # fmt: skip
    runner = asyncio.create_task(sender.run())
    automine = True
    try:
        started = asyncio.create_task(sender.started.wait())
        await asyncio.wait({started, runner}, return_when=asyncio.FIRST_COMPLETED)
        assert not runner.done(), runner.exception()
        await asyncio.to_thread(devnet.rpc, "evm_setAutomine", False)
        automine = False
        nonce = await sender.send(devnet.spare[1].address, b"", 21_000)

        async def broadcast() -> bool:
            slot = sender.slots[nonce]
            return not slot.in_flight and slot.last_broadcast is not None

        await _until(broadcast, runner, "the broadcast")
        # Hold the slot's row: the round that finds the call mined waits on it.
        async with locker.transaction():
            await locker.execute(
                "SELECT 1 FROM settlement_transactions WHERE chain_id = $1 AND lower(sender) = lower($2)"
                " AND nonce = $3 FOR NO KEY UPDATE",
                devnet.chain_id, wallet.address, nonce,
            )  # fmt: skip
            await asyncio.to_thread(devnet.rpc, "evm_mine")

            async def blocked() -> bool:
                return bool(await watcher.fetch(BLOCKED_WRITE_SQL))

            await _until(blocked, runner, "the round's write to wait on the row lock")
            terminated = [
                r["t"] for r in await watcher.fetch(f"SELECT pg_terminate_backend(pid) AS t FROM ({BLOCKED_WRITE_SQL}) b")
            ]
            assert terminated and all(terminated)
        # The lock is gone: the retried round writes what the cut one could not.
        async def stored() -> bool:
            state = await watcher.fetchval(
                "SELECT state FROM settlement_transactions WHERE chain_id = $1 AND lower(sender) = lower($2)"
                " AND nonce = $3",
                devnet.chain_id, wallet.address, nonce,
            )  # fmt: skip
            return bool(state == "confirmed")

        await _until(stored, runner, "the slot confirmed in the database", timeout=60.0)
        mined_hash = await asyncio.wait_for(sender.confirmed(nonce), 60)
        row = await watcher.fetchrow(
            "SELECT mined_hash, receipt_status FROM settlement_transactions WHERE chain_id = $1"
            " AND lower(sender) = lower($2) AND nonce = $3",
            devnet.chain_id, wallet.address, nonce,
        )  # fmt: skip
        assert row is not None and (row["mined_hash"], row["receipt_status"]) == (mined_hash, 1)
        assert not runner.done()
    finally:
        if not automine:
            await asyncio.to_thread(devnet.rpc, "evm_setAutomine", True)
        runner.cancel()
        with contextlib.suppress(BaseException):
            await runner
        await locker.close()
        await watcher.close()
        await pool.close()
        await rpc.close()

