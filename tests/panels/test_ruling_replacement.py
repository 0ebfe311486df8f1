"""The ruling path when the chain does not cooperate, on anvil and PostgreSQL.

- A stuck ruling (its max fee under the base fee, or unmined for `replace_after`) is replaced
  with the same nonce and both fee fields raised by at least 10 %, never above the cap; every
  version is recorded and a receipt for any of them counts; it lands once.
- A confirmed ruling is watched until the finality depth: a reorg that takes its block away
  sends it back to pending, and it is sent again with the same nonce, or, when another
  transaction of the arbiter key took that nonce meanwhile, queued again and sent with a
  fresh one after the preflight. Never two live nonces for one ruling.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from chain.eth_rpc import EthRpc
from chain.fees import FeePolicy, Fees, is_valid_replacement
from chain.keys import SecretKey
from escrowd.devnet import Devnet
from relayer.settlement.rulings import RulingSender
from schemas.task_state import TaskStatus
from tests.panels.rulings_support import admit, disputed_task, ruling_consumer, ruling_message


def _sender(devnet: Devnet, rpc: EthRpc, **options: object) -> RulingSender:
    key = SecretKey.from_hex(devnet.arbiter.private_key)
    return RulingSender(rpc, key, devnet.chain_id, devnet.escrow_address, **options)  # type: ignore[arg-type]


async def _ruling(pool: asyncpg.Pool, task_id: int) -> asyncpg.Record:
    async with pool.acquire() as conn:
        row = await conn.fetchrow("SELECT * FROM settlement_rulings WHERE task_id = $1", task_id)
    assert row is not None
    return row


async def _versions(pool: asyncpg.Pool, task_id: int) -> list[asyncpg.Record]:
    async with pool.acquire() as conn:
        return list(await conn.fetch(
            "SELECT * FROM settlement_ruling_txs WHERE task_id = $1 ORDER BY nonce, version", task_id))


async def _in_pool(devnet: Devnet) -> set[str]:
    pending = (await asyncio.to_thread(devnet.rpc, "txpool_content"))["pending"]
    return {tx["hash"] for txs in pending.values() for tx in txs.values()}


async def _receipt(devnet: Devnet, tx_hash: str) -> dict[str, object] | None:
    result = await asyncio.to_thread(devnet.rpc, "eth_getTransactionReceipt", tx_hash)
    return None if result is None else dict(result)


async def _resolved_events(devnet: Devnet, task_id: int) -> int:
    events = await asyncio.to_thread(lambda: list(devnet.logs()))
    return sum(1 for e in events if e.name == "DisputeResolved" and int(e.args["taskId"]) == task_id)


async def _step_until(pool: asyncpg.Pool, sender: RulingSender, task_id: int, status: str, *,
                      mine: Devnet | None = None, passes: int = 60) -> asyncpg.Record:
    """Step (mining a block between passes when asked) until the ruling has `status`.

    Bounded by passes, not by time: each pass either advances the ruling or mines.
    """
    for _ in range(passes):
        await sender.step(pool)
        row = await _ruling(pool, task_id)
        if row["status"] == status:
            return row
        if mine is not None:
            await asyncio.to_thread(mine.mine)
        await asyncio.sleep(0.05)
    raise AssertionError(f"ruling {task_id} never reached {status}: {row['status']}")


def _fees(version: asyncpg.Record) -> Fees:
    return Fees(int(version["max_fee_per_gas"]), int(version["max_priority_fee_per_gas"]))


async def test_a_ruling_priced_under_the_base_fee_is_replaced_and_lands_once(
    devnet: Devnet, pool: asyncpg.Pool, rpc: EthRpc
) -> None:
    task_id = await asyncio.to_thread(disputed_task, devnet)
    await admit(pool, ruling_consumer(devnet), ruling_message(devnet, task_id, 7_500))
    sender = _sender(devnet, rpc, replace_after=3_600.0)  # only the base fee makes it stuck here
    arbiter = sender.key.address
    count_before = await rpc.transaction_count(arbiter, "latest")
    await asyncio.to_thread(devnet.rpc, "evm_setAutomine", False)
    try:
        await sender.step(pool)
        (first,) = await _versions(pool, task_id)
        assert (await _ruling(pool, task_id))["status"] == "sent"
        # The base fee jumps above what the ruling offers: it cannot enter a block.
        await asyncio.to_thread(devnet.rpc, "anvil_setNextBlockBaseFeePerGas", hex(int(first["max_fee_per_gas"]) * 4))
        await asyncio.to_thread(devnet.rpc, "evm_mine")
        assert await _receipt(devnet, first["tx_hash"]) is None
        head = await rpc.head()
        assert head.base_fee > int(first["max_fee_per_gas"])

        await sender.step(pool)
        versions = await _versions(pool, task_id)
        assert [v["version"] for v in versions] == [1, 2]
        second = versions[1]
        assert second["nonce"] == first["nonce"]
        assert is_valid_replacement(_fees(first), _fees(second))  # both fields +10 % at least
        assert int(second["max_fee_per_gas"]) >= head.base_fee
        assert int(second["max_fee_per_gas"]) <= sender.policy.fee_cap
        row = await _ruling(pool, task_id)
        assert (row["status"], row["tx_hash"], row["nonce"]) == ("sent", second["tx_hash"], first["nonce"])
        assert second["tx_hash"] in await _in_pool(devnet)

        await asyncio.to_thread(devnet.rpc, "evm_mine")
        row = await _step_until(pool, sender, task_id, "confirmed")
        assert (row["tx_hash"], row["nonce"]) == (second["tx_hash"], first["nonce"])
    finally:
        await asyncio.to_thread(devnet.rpc, "evm_setAutomine", True)
    await asyncio.to_thread(devnet.mine, 3)
    assert await _receipt(devnet, first["tx_hash"]) is None
    assert await rpc.transaction_count(arbiter, "latest") == count_before + 1
    assert await _resolved_events(devnet, task_id) == 1
    assert (await asyncio.to_thread(devnet.get_task, task_id)).status == TaskStatus.RESOLVED


async def test_a_ruling_waiting_too_long_is_replaced_in_the_pool(
    devnet: Devnet, pool: asyncpg.Pool, rpc: EthRpc
) -> None:
    """Mining paused: nothing lands; after `replace_after` the pool holds the bumped version only."""
    task_id = await asyncio.to_thread(disputed_task, devnet)
    await admit(pool, ruling_consumer(devnet), ruling_message(devnet, task_id, 10_000))
    sender = _sender(devnet, rpc, replace_after=0.01)
    await asyncio.to_thread(devnet.rpc, "evm_setAutomine", False)
    try:
        await _sender(devnet, rpc, replace_after=3_600.0).step(pool)  # v1 signed and broadcast
        (first,) = await _versions(pool, task_id)
        assert first["tx_hash"] in await _in_pool(devnet)
        await asyncio.sleep(0.05)
        await sender.step(pool)  # waited past replace_after, unmined: v2
        versions = await _versions(pool, task_id)
        assert len(versions) == 2 and {v["nonce"] for v in versions} == {first["nonce"]}
        assert is_valid_replacement(_fees(versions[0]), _fees(versions[1]))
        in_pool = await _in_pool(devnet)
        assert versions[1]["tx_hash"] in in_pool and first["tx_hash"] not in in_pool
        await asyncio.to_thread(devnet.rpc, "evm_mine")
        row = await _step_until(pool, sender, task_id, "confirmed")
    finally:
        await asyncio.to_thread(devnet.rpc, "evm_setAutomine", True)
    mined = [v["tx_hash"] for v in await _versions(pool, task_id) if await _receipt(devnet, v["tx_hash"])]
    assert mined == [row["tx_hash"]]
    assert await _resolved_events(devnet, task_id) == 1


class _CrashBeforeBroadcast(RulingSender):
    async def _broadcast(self, *_: object) -> None:
        raise SystemExit("crash between commit and broadcast")


async def test_a_receipt_for_an_older_version_counts(devnet: Devnet, pool: asyncpg.Pool, rpc: EthRpc) -> None:
    """v2 is recorded but never reaches the node (crash); v1 is mined: the ruling is confirmed
    with v1, not requeued as a lost nonce, and nothing else is sent."""
    task_id = await asyncio.to_thread(disputed_task, devnet)
    await admit(pool, ruling_consumer(devnet), ruling_message(devnet, task_id, 4_000))
    key = SecretKey.from_hex(devnet.arbiter.private_key)
    count_before = await rpc.transaction_count(key.address, "latest")
    await asyncio.to_thread(devnet.rpc, "evm_setAutomine", False)
    try:
        await _sender(devnet, rpc, replace_after=3_600.0).step(pool)
        crashing = _CrashBeforeBroadcast(rpc, key, devnet.chain_id, devnet.escrow_address, replace_after=0.01)
        await asyncio.sleep(0.05)
        with pytest.raises(SystemExit):
            await crashing.step(pool)
        first, second = await _versions(pool, task_id)
        assert (await _ruling(pool, task_id))["tx_hash"] == second["tx_hash"]
        assert await _in_pool(devnet) == {first["tx_hash"]}
        await asyncio.to_thread(devnet.rpc, "evm_mine")
    finally:
        await asyncio.to_thread(devnet.rpc, "evm_setAutomine", True)
    row = await _step_until(pool, _sender(devnet, rpc, replace_after=3_600.0), task_id, "confirmed")
    assert (row["tx_hash"], row["nonce"]) == (first["tx_hash"], first["nonce"])
    assert await rpc.transaction_count(key.address, "latest") == count_before + 1
    assert await _resolved_events(devnet, task_id) == 1


async def test_no_replacement_above_the_fee_cap(devnet: Devnet, pool: asyncpg.Pool, rpc: EthRpc) -> None:
    """The cap leaves no valid bump: the live version stays (re-broadcast), none is signed."""
    task_id = await asyncio.to_thread(disputed_task, devnet)
    await admit(pool, ruling_consumer(devnet), ruling_message(devnet, task_id, 5_000))
    base_fee = (await rpc.head()).base_fee
    policy = FeePolicy(fee_cap=base_fee * 2 + 10**9)  # room for the first price, not for +12.5 %
    sender = _sender(devnet, rpc, policy=policy, replace_after=0.01)
    await asyncio.to_thread(devnet.rpc, "evm_setAutomine", False)
    try:
        await sender.step(pool)
        (first,) = await _versions(pool, task_id)
        assert int(first["max_fee_per_gas"]) <= policy.fee_cap
        for _ in range(3):
            await asyncio.sleep(0.05)
            await sender.step(pool)
        assert [v["tx_hash"] for v in await _versions(pool, task_id)] == [first["tx_hash"]]
        assert first["tx_hash"] in await _in_pool(devnet)
        await asyncio.to_thread(devnet.rpc, "evm_mine")
        await _step_until(pool, sender, task_id, "confirmed")
    finally:
        await asyncio.to_thread(devnet.rpc, "evm_setAutomine", True)


async def _confirm(pool: asyncpg.Pool, sender: RulingSender, devnet: Devnet, task_id: int) -> asyncpg.Record:
    return await _step_until(pool, sender, task_id, "confirmed", mine=devnet)


async def test_a_reorg_under_a_confirmed_ruling_sends_it_again_with_the_same_nonce(
    devnet: Devnet, pool: asyncpg.Pool, rpc: EthRpc
) -> None:
    task_id = await asyncio.to_thread(disputed_task, devnet)
    await admit(pool, ruling_consumer(devnet), ruling_message(devnet, task_id, 6_000))
    sender = _sender(devnet, rpc, confirmations=2, finality_depth=6)
    arbiter = sender.key.address
    count_before = await rpc.transaction_count(arbiter, "latest")
    confirmed = await _confirm(pool, sender, devnet, task_id)
    assert confirmed["final_at"] is None and confirmed["block_hash"] is not None
    depth = await asyncio.to_thread(devnet.block_number) - int(confirmed["block_number"]) + 1
    assert depth >= 2
    await asyncio.to_thread(devnet.reorg, depth)  # the ruling's block and those above: replaced, empty
    assert (await asyncio.to_thread(devnet.get_task, task_id)).status == TaskStatus.DISPUTED
    assert await _receipt(devnet, confirmed["tx_hash"]) is None

    await sender.step(pool)  # noticed: pending again, the stored transaction re-broadcast (automine)
    row = await _ruling(pool, task_id)
    assert row["reorgs"] == 1
    again = await _confirm(pool, sender, devnet, task_id)
    assert (again["nonce"], again["tx_hash"]) == (confirmed["nonce"], confirmed["tx_hash"])
    assert again["block_hash"] != confirmed["block_hash"] and again["reorgs"] == 1
    assert (await asyncio.to_thread(devnet.get_task, task_id)).status == TaskStatus.RESOLVED
    assert await rpc.transaction_count(arbiter, "latest") == count_before + 1

    # Watched until final; from then on it is left alone.
    final = await _step_until(pool, sender, task_id, "confirmed", mine=devnet)
    for _ in range(10):
        if final["final_at"] is not None:
            break
        await asyncio.to_thread(devnet.mine)
        await sender.step(pool)
        final = await _ruling(pool, task_id)
    assert final["final_at"] is not None
    assert await asyncio.to_thread(devnet.block_number) - int(final["block_number"]) + 1 >= 6
    assert await sender.step(pool) == 0
    assert len(await _versions(pool, task_id)) == 1


async def test_a_reorg_then_the_nonce_taken_by_another_arbiter_transaction_resends_with_a_fresh_nonce(
    devnet: Devnet, pool: asyncpg.Pool, rpc: EthRpc
) -> None:
    task_id = await asyncio.to_thread(disputed_task, devnet)
    other = await asyncio.to_thread(disputed_task, devnet)
    await admit(pool, ruling_consumer(devnet), ruling_message(devnet, task_id, 3_000))
    sender = _sender(devnet, rpc, confirmations=2, finality_depth=8)
    confirmed = await _confirm(pool, sender, devnet, task_id)
    depth = await asyncio.to_thread(devnet.block_number) - int(confirmed["block_number"]) + 1
    await asyncio.to_thread(devnet.reorg, depth)
    # A person uses the arbiter key on the new branch: that transaction takes the ruling's nonce.
    await asyncio.to_thread(devnet.resolve_dispute, other, 5_000)
    await asyncio.to_thread(devnet.mine, 2)
    assert await rpc.transaction_count(sender.key.address, "latest") == int(confirmed["nonce"]) + 1

    row = await _confirm(pool, sender, devnet, task_id)
    assert row["nonce"] == int(confirmed["nonce"]) + 1 and row["tx_hash"] != confirmed["tx_hash"]
    versions = await _versions(pool, task_id)
    assert [v["nonce"] for v in versions] == [confirmed["nonce"], confirmed["nonce"] + 1]
    assert (await asyncio.to_thread(devnet.get_task, task_id)).status == TaskStatus.RESOLVED
    assert await _resolved_events(devnet, task_id) == 1


async def test_a_version_at_another_nonce_than_the_live_one_is_refused(
    devnet: Devnet, pool: asyncpg.Pool, rpc: EthRpc
) -> None:
    task_id = await asyncio.to_thread(disputed_task, devnet)
    await admit(pool, ruling_consumer(devnet), ruling_message(devnet, task_id, 1_000))
    await _confirm(pool, _sender(devnet, rpc), devnet, task_id)
    (version,) = await _versions(pool, task_id)
    sender, other = devnet.arbiter.address.lower(), int(version["nonce"]) + 1
    async with pool.acquire() as conn:
        # The ruling's versions live in the sender's tables: one at another nonce is refused,
        # and so is linking the ruling to another nonce.
        with pytest.raises(asyncpg.RaiseError, match="live nonce"):
            await conn.execute(
                "INSERT INTO settlement_tx_versions (tx_hash, chain_id, sender, nonce, version, kind, raw_tx,"
                " max_fee_per_gas, max_priority_fee_per_gas, gas_limit) VALUES ($1, $2, $3, $4, 1, 'ruling', $5,"
                " 1, 1, 1)", "0x" + "ab" * 32, version["chain_id"], sender, other, "0x00",
            )
        with pytest.raises(asyncpg.RaiseError, match="live nonce"):
            await conn.execute(
                "INSERT INTO settlement_ruling_slots (chain_id, sender, nonce, escrow, task_id)"
                " VALUES ($1, $2, $3, $4, $5)", version["chain_id"], sender, other, version["escrow"], task_id,
            )
        # settlement_ruling_txs, kept for the operators' queries, is a view: nothing is written there.
        with pytest.raises(asyncpg.PostgresError, match="cannot insert into view"):
            await conn.execute(
                "INSERT INTO settlement_ruling_txs (chain_id, escrow, task_id, nonce, version, tx_hash, raw_tx,"
                " gas_limit, max_fee_per_gas, max_priority_fee_per_gas) VALUES ($1, $2, $3, $4, 1, $5, $6, 1, 1, 1)",
                version["chain_id"], version["escrow"], version["task_id"], other, "0x" + "ab" * 32, "0x00",
            )


async def test_after_an_older_version_is_reorged_away_the_ruling_is_replaced_again_at_its_nonce(
    devnet: Devnet, pool: asyncpg.Pool, rpc: EthRpc
) -> None:
    """v1 mined while v2 was the live version; a reorg takes v1 away: the ruling is pending
    again at the same nonce, and bumping it once more (v3) still works."""
    task_id = await asyncio.to_thread(disputed_task, devnet)
    await admit(pool, ruling_consumer(devnet), ruling_message(devnet, task_id, 9_000))
    key = SecretKey.from_hex(devnet.arbiter.private_key)
    count_before = await rpc.transaction_count(key.address, "latest")
    await asyncio.to_thread(devnet.rpc, "evm_setAutomine", False)
    try:
        await _sender(devnet, rpc, replace_after=3_600.0).step(pool)
        await asyncio.sleep(0.05)
        with pytest.raises(SystemExit):
            await _CrashBeforeBroadcast(rpc, key, devnet.chain_id, devnet.escrow_address, replace_after=0.01).step(pool)
        await asyncio.to_thread(devnet.rpc, "evm_mine")
        first, second = await _versions(pool, task_id)
        confirmed = await _step_until(pool, _sender(devnet, rpc, replace_after=3_600.0), task_id, "confirmed")
        assert confirmed["tx_hash"] == first["tx_hash"]

        await asyncio.to_thread(devnet.reorg, await asyncio.to_thread(devnet.block_number)
                                - int(confirmed["block_number"]) + 1)
        waiting = _sender(devnet, rpc, replace_after=0.01)
        await waiting.step(pool)  # reorg noticed: pending again, the live version (v2) broadcast
        row = await _ruling(pool, task_id)
        assert (row["status"], row["reorgs"], row["nonce"]) == ("sent", 1, first["nonce"])
        assert second["tx_hash"] in await _in_pool(devnet)
        await asyncio.sleep(0.05)
        await waiting.step(pool)  # it waited: v3, same nonce
        versions = await _versions(pool, task_id)
        assert [v["version"] for v in versions] == [1, 2, 3] and {v["nonce"] for v in versions} == {first["nonce"]}
        assert is_valid_replacement(_fees(versions[1]), _fees(versions[2]))
        await asyncio.to_thread(devnet.rpc, "evm_mine")
        row = await _step_until(pool, _sender(devnet, rpc, replace_after=3_600.0), task_id, "confirmed")
    finally:
        await asyncio.to_thread(devnet.rpc, "evm_setAutomine", True)
    assert row["tx_hash"] == versions[2]["tx_hash"]
    assert await rpc.transaction_count(key.address, "latest") == count_before + 1
    assert await _resolved_events(devnet, task_id) == 1
    assert (await asyncio.to_thread(devnet.get_task, task_id)).status == TaskStatus.RESOLVED
