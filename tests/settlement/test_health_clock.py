"""The relayer's health check against an indexer cursor stamped in the future (the database's
clock stepped back after the indexer's last write): real anvil and PostgreSQL. Its age read as
0 s, so an indexer that died behind the head looked live for as long as the stamp was ahead."""

from __future__ import annotations

import asyncpg

from chain.eth_rpc import EthRpc
from escrowd.devnet import Devnet
from relayer.settlement.config import ChainSettings
from relayer.settlement.health import BridgeHealthChecker, overall_status


async def test_a_cursor_from_the_future_behind_the_head_is_not_live(devnet: Devnet, database_url: str) -> None:
    for _ in range(3):
        devnet.mine()
    head = int(devnet.rpc("eth_blockNumber"), 16)
    chain = ChainSettings(chain_id=devnet.chain_id, rpc_urls=[devnet.rpc_url], escrow_addresses=[devnet.escrow_address])
    rpc = EthRpc(chain.rpc_urls, chain_id=chain.chain_id, timeout=10)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        checker = BridgeHealthChecker(
            chains=[chain], rpcs={chain.chain_id: rpc}, pool=pool,
            relayer_address=devnet.marketplace_verifier.address, indexer_stale_after=5.0,
        )  # fmt: skip

        async def cursor(updated_at: str) -> None:
            await pool.execute(
                "INSERT INTO chain_cursor (chain_id, block_number, block_hash, updated_at)"
                f" VALUES ($1, $2, $3, {updated_at}) ON CONFLICT (chain_id) DO UPDATE"
                " SET block_number = EXCLUDED.block_number, updated_at = EXCLUDED.updated_at",
                chain.chain_id, head - 2, "0x" + "00" * 32,
            )  # fmt: skip

        # The control: behind the head and moved just now is live.
        await cursor("now()")
        assert (await checker.check_chain(chain)).indexer.live is True
        # Behind the head, stamped an hour ahead: nothing says it still moves.
        await cursor("now() + interval '1 hour'")
        report = await checker.check_chain(chain)
        assert report.indexer.live is False
        assert "future" in (report.indexer.reason or "")
        assert overall_status([report]) == "failing"
    finally:
        await pool.close()
        await rpc.close()
