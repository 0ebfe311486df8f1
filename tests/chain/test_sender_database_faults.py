"""The transaction sender on anvil and PostgreSQL when the database drops a connection in the
middle of a tracking round: the round is retried, and what it was writing (a call mined and
confirmed) still reaches the database and the caller waiting for it.

The fault is the one an operator's `pg_terminate_backend`, a failover or a server restart
causes: the backend running the round's write is terminated (SQLSTATE 57P01,
`AdminShutdownError`) while the write waits for a row lock the test holds.
"""

from __future__ import annotations

import asyncio

import pytest

from chain.keys import SecretKey
from escrowd.devnet import Devnet
from runtime.db import connect
from tests.support.call_sender import running_call_sender

pytestmark = pytest.mark.timeout(300)

BLOCKED_WRITE_SQL = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    " AND wait_event_type = 'Lock' AND query LIKE 'UPDATE settlement_transactions%'"
)


async def test_a_tracking_round_cut_by_a_terminated_connection_is_retried_and_its_call_confirmed(
    devnet: Devnet, database_url: str
) -> None:
    wallet = devnet.spare[0]
    locker = await connect(database_url)
    watcher = await connect(database_url)  # outside the lock's transaction, which sees one snapshot of the activity
    try:
        async with running_call_sender(
            devnet, database_url, SecretKey.from_hex(wallet.private_key), rpc_url=devnet.rpc_url,
            name="test_sender_db_faults", recheck_interval=0.5,
        ) as running:  # fmt: skip
            nonce = await running.send_unmined(devnet.spare[1].address)
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

                await running.until(blocked, "the round's write to wait on the row lock")
                terminated = [
                    r["t"]
                    for r in await watcher.fetch(f"SELECT pg_terminate_backend(pid) AS t FROM ({BLOCKED_WRITE_SQL}) b")
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

            await running.until(stored, "the slot confirmed in the database", timeout=60.0)
            mined_hash = await asyncio.wait_for(running.sender.confirmed(nonce), 60)
            row = await watcher.fetchrow(
                "SELECT mined_hash, receipt_status FROM settlement_transactions WHERE chain_id = $1"
                " AND lower(sender) = lower($2) AND nonce = $3",
                devnet.chain_id, wallet.address, nonce,
            )  # fmt: skip
            assert row is not None and (row["mined_hash"], row["receipt_status"]) == (mined_hash, 1)
    finally:
        await locker.close()
        await watcher.close()
