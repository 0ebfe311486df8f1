"""The ruling path of the relayer on anvil and PostgreSQL: a trusted signed ruling becomes
`resolveDispute` from the arbiter key, exactly once, fail-closed when the escrow's arbiter
is not our key, re-broadcast after a crash between commit and broadcast."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from chain.eth_rpc import EthRpc
from chain.keys import SecretKey
from escrowd.devnet import Devnet
from relayer.settlement.rulings import RulingSender
from schemas.task_state import TaskStatus
from tests.panels.rulings_support import (
    OTHER_KEY,
    admit,
    disputed_task,
    ruling_consumer,
    ruling_message,
    until_status,
)
from tests.support.rpc_proxy import Faults, RpcFaultProxy


async def test_a_trusted_ruling_resolves_the_dispute_once(devnet: Devnet, pool: asyncpg.Pool) -> None:
    task_id = await asyncio.to_thread(disputed_task, devnet)
    consumer = ruling_consumer(devnet)
    agent_before = (await asyncio.to_thread(devnet.balances_of, [devnet.agents[0]]))[0]
    assert await admit(pool, consumer, ruling_message(devnet, task_id, 6_500)) == "processed"
    # A second ruling for the same task (another message) is recorded nowhere new.
    assert await admit(pool, consumer, ruling_message(devnet, task_id, 100, offset=1)) == "processed"
    rpc = EthRpc([devnet.rpc_url], chain_id=devnet.chain_id)
    try:
        sender = RulingSender(rpc, SecretKey.from_hex(devnet.arbiter.private_key), devnet.chain_id,
                              devnet.escrow_address)
        row = await until_status(pool, sender, task_id, "confirmed")
        assert row["agent_share_bps"] == 6_500 and sender.arbiter_matches is True
        view = await asyncio.to_thread(devnet.get_task, task_id)
        assert view.status == TaskStatus.RESOLVED
        assert (await asyncio.to_thread(devnet.balances_of, [devnet.agents[0]]))[0] > agent_before
        # Nothing is sent twice: further passes change nothing, one transaction from the arbiter.
        await sender.step(pool)
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT count(*) FROM settlement_rulings WHERE tx_hash IS NOT NULL") == 1
    finally:
        await rpc.close()


async def test_untrusted_signer_is_dead_lettered(devnet: Devnet, pool: asyncpg.Pool) -> None:
    consumer = ruling_consumer(devnet)
    assert await admit(pool, consumer, ruling_message(devnet, 1, 5_000, key=OTHER_KEY)) == "dead_lettered"
    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM settlement_rulings") == 0
        reason = await conn.fetchval("SELECT reason FROM dead_letters")
    assert "trusted" in reason


async def test_fail_closed_when_our_key_is_not_the_arbiter(devnet: Devnet, pool: asyncpg.Pool) -> None:
    task_id = await asyncio.to_thread(disputed_task, devnet)
    await admit(pool, ruling_consumer(devnet), ruling_message(devnet, task_id, 10_000))
    rpc = EthRpc([devnet.rpc_url], chain_id=devnet.chain_id)
    try:
        sender = RulingSender(rpc, SecretKey.from_hex(devnet.owner.private_key), devnet.chain_id,
                              devnet.escrow_address)
        await sender.step(pool)
        assert sender.arbiter_matches is False
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT status FROM settlement_rulings WHERE task_id = $1", task_id) == "queued"
        assert (await asyncio.to_thread(devnet.get_task, task_id)).status == TaskStatus.DISPUTED
        # The arbiter is handed to our key: the gate opens and the ruling lands.
        await asyncio.to_thread(devnet.set_arbiter, devnet.owner.address)
        await until_status(pool, sender, task_id, "confirmed")
        assert (await asyncio.to_thread(devnet.get_task, task_id)).status == TaskStatus.RESOLVED
    finally:
        await rpc.close()


class _CrashBeforeBroadcast(RulingSender):
    async def _broadcast(self, *_: object) -> None:
        raise SystemExit("crash between commit and broadcast")


async def test_crash_between_commit_and_broadcast_resends_the_stored_transaction(
    devnet: Devnet, pool: asyncpg.Pool
) -> None:
    task_id = await asyncio.to_thread(disputed_task, devnet)
    await admit(pool, ruling_consumer(devnet), ruling_message(devnet, task_id, 0))
    rpc = EthRpc([devnet.rpc_url], chain_id=devnet.chain_id)
    try:
        key = SecretKey.from_hex(devnet.arbiter.private_key)
        crashing = _CrashBeforeBroadcast(rpc, key, devnet.chain_id, devnet.escrow_address)
        with pytest.raises(SystemExit):
            await crashing.step(pool)
        async with pool.acquire() as conn:
            stored = await conn.fetchrow("SELECT * FROM settlement_rulings WHERE task_id = $1", task_id)
        assert stored["status"] == "sent"
        restarted = RulingSender(rpc, key, devnet.chain_id, devnet.escrow_address)
        row = await until_status(pool, restarted, task_id, "confirmed")
        assert (row["tx_hash"], row["nonce"]) == (stored["tx_hash"], stored["nonce"])
        assert (await asyncio.to_thread(devnet.get_task, task_id)).status == TaskStatus.RESOLVED
    finally:
        await rpc.close()


async def test_a_task_resolved_meanwhile_is_recorded_not_sent(devnet: Devnet, pool: asyncpg.Pool) -> None:
    task_id = await asyncio.to_thread(disputed_task, devnet)
    await asyncio.to_thread(devnet.resolve_dispute, task_id, 5_000)
    await admit(pool, ruling_consumer(devnet), ruling_message(devnet, task_id, 10_000))
    rpc = EthRpc([devnet.rpc_url], chain_id=devnet.chain_id)
    try:
        sender = RulingSender(rpc, SecretKey.from_hex(devnet.arbiter.private_key), devnet.chain_id,
                              devnet.escrow_address)
        row = await until_status(pool, sender, task_id, "already_resolved")
        assert row["nonce"] is None
    finally:
        await rpc.close()


async def test_health_bridge_reports_whether_the_arbiter_key_matches(devnet: Devnet, database_url: str) -> None:
    import httpx

    from api.app import create_app
    from api.settings import ApiSettings
    from relayer.settlement.config import ChainSettings
    from relayer.settlement.health import BridgeHealthChecker, publish_report
    from runtime.db import create_pool

    # The relayer's monitor publishes its report; the API adds the arbiter's check to it.
    chain = ChainSettings(chain_id=devnet.chain_id, rpc_urls=[devnet.rpc_url], escrow_addresses=[devnet.escrow_address])
    pool = await create_pool(database_url)
    rpc = EthRpc([devnet.rpc_url], chain_id=devnet.chain_id)
    try:
        checker = BridgeHealthChecker(
            chains=[chain], rpcs={devnet.chain_id: rpc}, pool=pool, relayer_address=devnet.marketplace_verifier.address
        )
        await publish_report(pool, await checker.check(), stale_after=3600)
    finally:
        await rpc.close()
        await pool.close()
    settings = ApiSettings(
        database_url=database_url,
        bridge_arbiter_address=devnet.arbiter.address,
        bridge_chains=[{"chain_id": devnet.chain_id, "rpc_urls": [devnet.rpc_url],
                        "escrow_addresses": [devnet.escrow_address]}],
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            arbiter = (await client.get("/health/bridge")).json()["chains"][0]["arbiter"]
            assert arbiter["arbiterMatches"] is True
            assert arbiter["arbiter"].lower() == devnet.arbiter.address.lower()
            await asyncio.to_thread(devnet.set_arbiter, devnet.spare[0].address)
            deadline = time.monotonic() + 60
            while (await client.get("/health/bridge")).json()["chains"][0]["arbiter"]["arbiterMatches"]:
                assert time.monotonic() < deadline, "arbiterMatches never turned false after the rotation"
                await asyncio.sleep(0.3)


async def test_a_nonce_taken_by_another_arbiter_transaction_requeues_the_ruling(
    devnet: Devnet, pool: asyncpg.Pool
) -> None:
    task_id = await asyncio.to_thread(disputed_task, devnet)
    other = await asyncio.to_thread(disputed_task, devnet)
    await admit(pool, ruling_consumer(devnet), ruling_message(devnet, task_id, 2_500))
    rpc = EthRpc([devnet.rpc_url], chain_id=devnet.chain_id)
    try:
        key = SecretKey.from_hex(devnet.arbiter.private_key)
        with pytest.raises(SystemExit):
            await _CrashBeforeBroadcast(rpc, key, devnet.chain_id, devnet.escrow_address).step(pool)
        async with pool.acquire() as conn:
            stored = await conn.fetchrow("SELECT * FROM settlement_rulings WHERE task_id = $1", task_id)
        # A person uses the arbiter key meanwhile: its transaction takes our stored nonce.
        await asyncio.to_thread(devnet.resolve_dispute, other, 5_000)
        assert await rpc.transaction_count(key.address, "latest") > stored["nonce"]
        row = await until_status(pool, RulingSender(rpc, key, devnet.chain_id, devnet.escrow_address), task_id,
                           "confirmed")
        assert row["nonce"] != stored["nonce"] and row["tx_hash"] != stored["tx_hash"]
        view = await asyncio.to_thread(devnet.get_task, task_id)
        assert view.status == TaskStatus.RESOLVED
    finally:
        await rpc.close()


async def test_a_mined_ruling_whose_receipt_lags_the_count_is_confirmed_not_requeued(
    devnet: Devnet, pool: asyncpg.Pool
) -> None:
    """The node's count has passed the ruling's nonce (our own transaction took it) but the
    receipt is not there yet: one look is not enough to call the nonce taken by someone else.
    `escrowd run --tasks 1000` saw exactly this: rulings queued again after their own
    transaction was mined, then recorded `already_resolved`."""
    task_id = await asyncio.to_thread(disputed_task, devnet)
    await admit(pool, ruling_consumer(devnet), ruling_message(devnet, task_id, 3_300))
    key = SecretKey.from_hex(devnet.arbiter.private_key)
    count_before = await asyncio.to_thread(devnet.rpc, "eth_getTransactionCount", key.address, "latest")
    with RpcFaultProxy(devnet.rpc_url, Faults(receipt_lag=1)) as proxy:
        rpc = EthRpc([proxy.url], chain_id=devnet.chain_id)
        try:
            sender = RulingSender(rpc, key, devnet.chain_id, devnet.escrow_address)
            row = await until_status(pool, sender, task_id, "confirmed")
        finally:
            await rpc.close()
    assert proxy.stats.injected["receipt_lag"] >= 1  # the lag really happened
    async with pool.acquire() as conn:
        versions = await conn.fetch("SELECT nonce, tx_hash FROM settlement_ruling_txs WHERE task_id = $1", task_id)
    # Sent once, at one nonce; confirmed with that transaction, never queued again.
    assert [(v["nonce"], v["tx_hash"]) for v in versions] == [(row["nonce"], row["tx_hash"])]
    assert row["agent_share_bps"] == 3_300
    count_after = await asyncio.to_thread(devnet.rpc, "eth_getTransactionCount", key.address, "latest")
    assert int(count_after, 16) == int(count_before, 16) + 1
    assert (await asyncio.to_thread(devnet.get_task, task_id)).status == TaskStatus.RESOLVED


async def test_rulings_whose_own_transactions_were_mined_are_never_judged_lost(
    devnet: Devnet, pool: asyncpg.Pool
) -> None:
    """The failure `escrowd run --tasks 1000 --exit` had: rulings queued again (then recorded
    `already_resolved`) after their own transactions were mined, while the node's receipts
    lagged its count. Through the sender as the relay runs it (`serve`), several rulings in
    flight at once behind a node that answers every receipt late: each is confirmed with the
    one transaction it was signed with, no nonce of the arbiter key is lost, nothing is sent
    twice."""
    from relayer.settlement.rulings import RULINGS

    tasks = [await asyncio.to_thread(disputed_task, devnet) for _ in range(4)]
    consumer = ruling_consumer(devnet)
    for i, task_id in enumerate(tasks):
        await admit(pool, consumer, ruling_message(devnet, task_id, 1_000 + i, offset=i))
    key = SecretKey.from_hex(devnet.arbiter.private_key)
    count_before = await asyncio.to_thread(devnet.rpc, "eth_getTransactionCount", key.address, "latest")
    lost_before = RULINGS.labels("nonce_lost")._value.get()
    stop = asyncio.Event()
    with RpcFaultProxy(devnet.rpc_url, Faults(receipt_lag=1)) as proxy:
        rpc = EthRpc([proxy.url], chain_id=devnet.chain_id)
        sender = RulingSender(rpc, key, devnet.chain_id, devnet.escrow_address)
        running = asyncio.create_task(sender.serve(pool, stop, 0.05))
        try:
            deadline = time.monotonic() + 120  # stops a broken run only; the wait ends on the rows
            while True:
                async with pool.acquire() as conn:
                    statuses = [r["status"] for r in await conn.fetch(
                        "SELECT status FROM settlement_rulings WHERE task_id = ANY($1::numeric[])", tasks)]
                if statuses == ["confirmed"] * len(tasks) or running.done():
                    break
                assert time.monotonic() < deadline, statuses
                await asyncio.sleep(0.05)
            assert not running.done(), running.exception() if running.done() else None
        finally:
            stop.set()
            await asyncio.wait_for(running, 30)
            await rpc.close()
    assert proxy.stats.injected["receipt_lag"] >= len(tasks)  # every receipt came late
    assert RULINGS.labels("nonce_lost")._value.get() == lost_before
    async with pool.acquire() as conn:
        rows = await conn.fetch("SELECT * FROM settlement_rulings WHERE task_id = ANY($1::numeric[])", tasks)
        versions = await conn.fetch(
            "SELECT task_id, nonce, tx_hash FROM settlement_ruling_txs WHERE task_id = ANY($1::numeric[])", tasks)
        states = await conn.fetch(
            "SELECT state, receipt_status FROM settlement_transactions WHERE sender = $1", key.address.lower())
    # One version per ruling, the one confirmed; every slot of the key confirmed, none lost.
    assert sorted((int(v["task_id"]), v["nonce"], v["tx_hash"]) for v in versions) == sorted(
        (int(r["task_id"]), r["nonce"], r["tx_hash"]) for r in rows)
    assert {(s["state"], s["receipt_status"]) for s in states} == {("confirmed", 1)}
    count_after = await asyncio.to_thread(devnet.rpc, "eth_getTransactionCount", key.address, "latest")
    assert int(count_after, 16) == int(count_before, 16) + len(tasks)
    for task_id in tasks:
        assert (await asyncio.to_thread(devnet.get_task, task_id)).status == TaskStatus.RESOLVED


async def test_a_ruling_sent_before_migration_230_is_adopted_and_followed_not_signed_again(
    devnet: Devnet, pool: asyncpg.Pool
) -> None:
    """A ruling `sent` by the old ruling path: its version is only in the table of 110/120
    (kept as `settlement_ruling_txs_before_230`). The sender moves it into its own tables at
    start-up and follows it: the stored transaction is the one that lands, nothing else is
    signed, and the view shows it once with its old version number."""
    from chain.fees import Fees
    from chain.txs import sign_eip1559
    from relayer.settlement.rulings import resolve_dispute_data

    task_id = await asyncio.to_thread(disputed_task, devnet)
    await admit(pool, ruling_consumer(devnet), ruling_message(devnet, task_id, 4_200))
    key = SecretKey.from_hex(devnet.arbiter.private_key)
    rpc = EthRpc([devnet.rpc_url], chain_id=devnet.chain_id)
    try:
        nonce = await rpc.transaction_count(key.address, "latest")
        base_fee = (await rpc.head()).base_fee
        old = sign_eip1559(key, chain_id=devnet.chain_id, nonce=nonce, to=devnet.escrow_address,
                           data=resolve_dispute_data(task_id, 4_200), gas_limit=300_000,
                           fees=Fees(base_fee * 4 + 10**9, 10**9))
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "UPDATE settlement_rulings SET status = 'sent', nonce = $2, raw_tx = $3, tx_hash = $4,"
                " sent_at = now(), broadcast_at = now() WHERE task_id = $1", task_id, nonce, old.raw_hex, old.tx_hash)
            # The old table takes no new rows any more: written as the old path did, the
            # trigger that freezes it set aside for this one statement.
            await conn.execute("ALTER TABLE settlement_ruling_txs_before_230 DISABLE TRIGGER USER")
            await conn.execute(
                "INSERT INTO settlement_ruling_txs_before_230 (chain_id, escrow, task_id, nonce, version, tx_hash,"
                " raw_tx, gas_limit, max_fee_per_gas, max_priority_fee_per_gas) SELECT chain_id, escrow, task_id,"
                " nonce, 1, tx_hash, raw_tx, 300000, $2, $3 FROM settlement_rulings WHERE task_id = $1",
                task_id, old.fees.max_fee_per_gas, old.fees.max_priority_fee_per_gas)
            await conn.execute("ALTER TABLE settlement_ruling_txs_before_230 ENABLE TRIGGER USER")
        sender = RulingSender(rpc, key, devnet.chain_id, devnet.escrow_address)
        row = await until_status(pool, sender, task_id, "confirmed")
        assert (row["nonce"], row["tx_hash"]) == (nonce, old.tx_hash)
        async with pool.acquire() as conn:
            versions = await conn.fetch("SELECT nonce, version, tx_hash FROM settlement_ruling_txs WHERE task_id = $1",
                                        task_id)
            slot = await conn.fetchrow(
                "SELECT t.kind, t.state FROM settlement_ruling_slots l JOIN settlement_transactions t"
                " USING (chain_id, sender, nonce) WHERE l.task_id = $1", task_id)
            with pytest.raises(asyncpg.RaiseError, match="append-only"):
                await conn.execute("DELETE FROM settlement_ruling_txs_before_230 WHERE task_id = $1", task_id)
        assert [(v["nonce"], v["version"], v["tx_hash"]) for v in versions] == [(nonce, 1, old.tx_hash)]
        assert (slot["kind"], slot["state"]) == ("ruling", "confirmed")
        assert await rpc.transaction_count(key.address, "latest") == nonce + 1
        assert (await asyncio.to_thread(devnet.get_task, task_id)).status == TaskStatus.RESOLVED
    finally:
        await rpc.close()
