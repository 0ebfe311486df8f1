"""Findings of the review of the ruling path (docs/panels.md, "Review"), on anvil and PostgreSQL.

- A ruling whose transaction was mined but reverted was recorded as a final outcome at once
  and never watched: a reorg that took that transaction away left the arbiter key with a
  nonce gap (every later ruling stuck behind it, never mined) or, when the competing
  transaction did not come back either, a dispute the ruling never resolved. A mined outcome
  is now watched to the finality depth like a confirmed one, and sent again when it vanishes.
- An RPC reply of the wrong shape (a node lying or broken) raised TypeError/ValueError out of
  `RulingSender.run`: the sending task died while the process and its `/readyz` stayed up, so
  no ruling was sent again until someone restarted it. The replies are now parsed strictly
  and a failed pass marks the sender not ready and is retried.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web

from chain.eth_rpc import EthRpc
from chain.fees import Fees
from chain.keys import SecretKey
from chain.txs import sign_eip1559
from escrowd.devnet import Devnet
from relayer.settlement.rulings import RULINGS, SENDER_PART, RulingSender, resolve_dispute_data
from runtime import health
from schemas.task_state import TaskStatus
from tests.panels.rulings_support import admit, disputed_task, ruling_consumer, ruling_message


async def _ruling(pool: asyncpg.Pool, task_id: int) -> asyncpg.Record:
    async with pool.acquire() as conn:
        row = await conn.fetchrow("SELECT * FROM settlement_rulings WHERE task_id = $1", task_id)
    assert row is not None
    return row


async def _receipt(devnet: Devnet, tx_hash: str) -> dict[str, Any] | None:
    result = await asyncio.to_thread(devnet.rpc, "eth_getTransactionReceipt", tx_hash)
    return None if result is None else dict(result)


async def test_a_reorg_under_a_reverted_ruling_sends_it_again_and_leaves_no_nonce_gap(
    devnet: Devnet, pool: asyncpg.Pool, rpc: EthRpc
) -> None:
    """A person resolves task A with the arbiter key (nonce n) in the block where the relayer's
    ruling for A (nonce n+1) lands and reverts. A reorg re-mines the person's transaction only:
    the ruling's nonce n+1 is free again. The ruling must be sent again (it reverts again and
    fills n+1), so the next ruling, for task B at n+2, is mined."""
    task_a = await asyncio.to_thread(disputed_task, devnet)
    task_b = await asyncio.to_thread(disputed_task, devnet)
    await admit(pool, ruling_consumer(devnet), ruling_message(devnet, task_a, 7_000))
    key = SecretKey.from_hex(devnet.arbiter.private_key)
    sender = RulingSender(rpc, key, devnet.chain_id, devnet.escrow_address, replace_after=3_600.0)
    n = await rpc.transaction_count(key.address, "latest")
    base_fee = (await rpc.head()).base_fee
    manual = sign_eip1559(key, chain_id=devnet.chain_id, nonce=n, to=devnet.escrow_address,
                          data=resolve_dispute_data(task_a, 2_000), gas_limit=300_000,
                          fees=Fees(base_fee * 4 + 10**9, 10**9))
    await asyncio.to_thread(devnet.rpc, "evm_setAutomine", False)
    try:
        await asyncio.to_thread(devnet.rpc, "eth_sendRawTransaction", manual.raw_hex)
        await sender.step(pool)  # the preflight sees A still disputed: signed at n+1
        sent = await _ruling(pool, task_a)
        assert (sent["status"], sent["nonce"]) == ("sent", n + 1)
        await asyncio.to_thread(devnet.rpc, "evm_mine")
    finally:
        await asyncio.to_thread(devnet.rpc, "evm_setAutomine", True)
    mined = await _receipt(devnet, sent["tx_hash"])
    assert mined is not None and int(str(mined["status"]), 16) == 0  # reverted: A was resolved first
    await sender.step(pool)
    assert (await _ruling(pool, task_a))["status"] == "already_resolved"

    # The block is replaced by one holding the person's transaction only.
    await asyncio.to_thread(devnet.reorg, 1, [(manual.raw_hex, 0)])
    assert await _receipt(devnet, sent["tx_hash"]) is None
    assert await rpc.transaction_count(key.address, "latest") == n + 1

    await admit(pool, ruling_consumer(devnet), ruling_message(devnet, task_b, 4_000, offset=1))
    for _ in range(30):  # bounded by passes: each pass sends, re-broadcasts or records
        await sender.step(pool)
        statuses = {(await _ruling(pool, t))["status"] for t in (task_a, task_b)}
        if statuses == {"already_resolved", "confirmed"}:
            break
        await asyncio.to_thread(devnet.mine)
    row_b = await _ruling(pool, task_b)
    assert (row_b["status"], row_b["nonce"]) == ("confirmed", n + 2)
    assert (await asyncio.to_thread(devnet.get_task, task_b)).status == TaskStatus.RESOLVED
    row_a = await _ruling(pool, task_a)
    assert row_a["status"] == "already_resolved" and row_a["reorgs"] == 1
    again = await _receipt(devnet, sent["tx_hash"])
    assert again is not None and int(str(again["status"]), 16) == 0  # n+1 filled by the same transaction
    assert await rpc.transaction_count(key.address, "latest") == n + 3

    # Watched until final like a confirmed ruling; from then on left alone, and frozen.
    watcher = RulingSender(rpc, key, devnet.chain_id, devnet.escrow_address, finality_depth=3)
    for _ in range(10):
        if (await _ruling(pool, task_a))["final_at"] is not None:
            break
        await asyncio.to_thread(devnet.mine)
        await watcher.step(pool)
    final = await _ruling(pool, task_a)
    assert final["status"] == "already_resolved" and final["final_at"] is not None
    assert await watcher.step(pool) == 0
    async with pool.acquire() as conn:
        with pytest.raises(asyncpg.RaiseError, match="final"):
            await conn.execute("UPDATE settlement_rulings SET status = 'sent', final_at = NULL WHERE task_id = $1",
                               task_a)
        # No new version for a ruling that is not being sent; the signed ones are kept as
        # signed (the ruling's versions are in the sender's tables, linked to it by nonce).
        with pytest.raises(asyncpg.RaiseError, match="live nonce while it is sent"):
            await conn.execute(
                "INSERT INTO settlement_tx_versions (tx_hash, chain_id, sender, nonce, version, kind, raw_tx,"
                " max_fee_per_gas, max_priority_fee_per_gas, gas_limit) SELECT $2, l.chain_id, l.sender, l.nonce, 9,"
                " 'ruling', r.raw_tx, 1, 1, 1 FROM settlement_rulings r JOIN settlement_ruling_slots l"
                " ON l.chain_id = r.chain_id AND l.escrow = r.escrow AND l.task_id = r.task_id AND l.nonce = r.nonce"
                " WHERE r.task_id = $1", task_a, "0x" + "cd" * 32)
        ours = ("(chain_id, sender, nonce) IN (SELECT chain_id, sender, nonce FROM settlement_ruling_slots"
                " WHERE task_id = $1)")
        for statement in (f"UPDATE settlement_tx_versions SET max_fee_per_gas = 0, max_priority_fee_per_gas = 0"
                          f" WHERE {ours}", f"DELETE FROM settlement_tx_versions WHERE {ours}",
                          "UPDATE settlement_ruling_slots SET task_id = task_id + 1 WHERE task_id = $1",
                          "DELETE FROM settlement_ruling_slots WHERE task_id = $1"):
            with pytest.raises(asyncpg.RaiseError, match="append-only"):
                await conn.execute(statement, task_a)


async def test_a_ruling_never_moves_to_a_nonce_nothing_of_it_was_signed_at(
    devnet: Devnet, pool: asyncpg.Pool, rpc: EthRpc
) -> None:
    task_id = await asyncio.to_thread(disputed_task, devnet)
    await admit(pool, ruling_consumer(devnet), ruling_message(devnet, task_id, 2_500))
    key = SecretKey.from_hex(devnet.arbiter.private_key)
    sender = RulingSender(rpc, key, devnet.chain_id, devnet.escrow_address, replace_after=3_600.0)
    await asyncio.to_thread(devnet.rpc, "evm_setAutomine", False)
    try:
        await sender.step(pool)
        sent = await _ruling(pool, task_id)
        assert sent["status"] == "sent"
        async with pool.acquire() as conn:
            with pytest.raises(asyncpg.RaiseError, match="no stored version"):
                await conn.execute("UPDATE settlement_rulings SET nonce = nonce + 1 WHERE task_id = $1", task_id)
            # Queued again (nonce NULL) is how a ruling gives its nonce up: allowed.
            await conn.execute("UPDATE settlement_rulings SET status = 'queued', nonce = NULL, raw_tx = NULL,"
                               " tx_hash = NULL WHERE task_id = $1", task_id)
    finally:
        await asyncio.to_thread(devnet.rpc, "evm_setAutomine", True)
    assert (await _ruling(pool, task_id))["nonce"] is None


class _LyingNode:
    """A JSON-RPC front of anvil that answers `method` with `lie(result)` while `lying` is set."""

    def __init__(self, upstream: str, method: str, lie: Callable[[Any], Any]) -> None:
        self.upstream, self.method, self.lie = upstream, method, lie
        self.lying = True
        self.lies = 0
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        assert self._session is not None
        async with self._session.post(self.upstream, data=body,
                                      headers={"Content-Type": "application/json"}) as upstream:
            reply = await upstream.json(content_type=None)
        sent = json.loads(body)
        # Single requests and batches alike (the sender reads receipts and counts in batches).
        if isinstance(sent, list) and isinstance(reply, list):
            by_id = {r.get("id"): r for r in sent if isinstance(r, dict)}
            pairs = [(by_id.get(a.get("id")) if isinstance(a, dict) else None, a) for a in reply]
        else:
            pairs = [(sent, reply)]
        for request, answer in pairs:
            if self.lying and isinstance(request, dict) and request.get("method") == self.method \
                    and isinstance(answer, dict) and "result" in answer:
                answer["result"] = self.lie(answer["result"])
                self.lies += 1
        return web.json_response(reply)

    async def __aenter__(self) -> _LyingNode:
        self._session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_post("/", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None and self._session is not None
        await self._runner.cleanup()
        await self._session.close()


def _failed_passes() -> float:
    return sum(RULINGS.labels(outcome)._value.get() for outcome in ("bad_reply", "step_crashed"))


def _number_as_int(receipt: Any) -> Any:
    if isinstance(receipt, dict) and receipt.get("blockNumber") is not None:
        return {**receipt, "blockNumber": int(receipt["blockNumber"], 16)}  # a JSON number, not a quantity
    return receipt


@pytest.mark.parametrize(("method", "lie"), [
    ("eth_getTransactionReceipt", _number_as_int),
    ("eth_getTransactionCount", lambda _: "0x" + "f" * 40),  # a pending count past any real nonce
    ("eth_getBlockByNumber", lambda _: ["not", "a", "block"]),
])
async def test_a_node_lying_in_its_replies_cannot_stop_the_ruling_sender(
    devnet: Devnet, pool: asyncpg.Pool, method: str, lie: Callable[[Any], Any]
) -> None:
    """While the node lies the sender is not ready and signs nothing at a bogus nonce; the
    process keeps running, and once the node answers properly the ruling lands once."""
    task_id = await asyncio.to_thread(disputed_task, devnet)
    await admit(pool, ruling_consumer(devnet), ruling_message(devnet, task_id, 6_500))
    key = SecretKey.from_hex(devnet.arbiter.private_key)
    count_before = await asyncio.to_thread(devnet.rpc, "eth_getTransactionCount", key.address, "latest")
    async with _LyingNode(devnet.rpc_url, method, lie) as node:
        rpc = EthRpc([node.url], chain_id=devnet.chain_id, attempts=1)
        sender = RulingSender(rpc, key, devnet.chain_id, devnet.escrow_address)
        stop = asyncio.Event()
        failures_before = _failed_passes()
        health.mark(SENDER_PART, True)
        running = asyncio.create_task(sender.serve(pool, stop, interval=0.02))
        try:
            # Waits end on what they wait for; the deadlines only stop a broken run, and are
            # generous because a loaded machine may take long to make the sender's passes.
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if node.lies >= 3 or running.done():
                    break
                await asyncio.sleep(0.02)
            assert node.lies >= 3
            assert not running.done(), running.exception() if running.done() else None
            assert health.readiness()[1][SENDER_PART] is False
            assert _failed_passes() > failures_before  # what EscrowdRulingSenderFailing alerts on
            async with pool.acquire() as conn:
                nonces = await conn.fetch("SELECT nonce FROM settlement_ruling_txs WHERE task_id = $1", task_id)
            assert all(int(r["nonce"]) < 2**32 for r in nonces)

            node.lying = False
            # Confirmed, then ready again: the pass that records the confirmation marks the
            # sender ready when it ends, a moment after the row changed.
            deadline = time.monotonic() + 120
            while not running.done() and time.monotonic() < deadline:
                row = await _ruling(pool, task_id)
                if row["status"] == "confirmed" and health.readiness()[1][SENDER_PART] is True:
                    break
                await asyncio.sleep(0.02)
            assert not running.done()
            assert row["status"] == "confirmed"
            assert health.readiness()[1][SENDER_PART] is True
        finally:
            stop.set()
            await asyncio.wait_for(running, 30)
            await rpc.close()
    assert (await asyncio.to_thread(devnet.get_task, task_id)).status == TaskStatus.RESOLVED
    count = await asyncio.to_thread(devnet.rpc, "eth_getTransactionCount", key.address, "latest")
    assert int(count, 16) == int(count_before, 16) + 1


def test_the_public_test_addresses_are_the_devnet_mnemonic_accounts() -> None:
    from escrowd.devnet import anvil_key
    from relayer.settlement.rulings import PUBLIC_TEST_ADDRESSES, public_test_key_refused

    assert {anvil_key(i)[0].lower() for i in range(20)} == PUBLIC_TEST_ADDRESSES
    assert public_test_key_refused(anvil_key(8)[0], 1) and not public_test_key_refused(anvil_key(8)[0], 31337)
    assert not public_test_key_refused(SecretKey.from_hex("0x" + "7b" * 32).address, 1)


async def test_a_ruling_the_node_refuses_is_counted_and_lands_once_the_cause_is_gone(
    devnet: Devnet, pool: asyncpg.Pool, rpc: EthRpc
) -> None:
    """An arbiter without gas money: the node refuses every version ("insufficient funds").
    That used to be an info line only, so nothing alerted until the bumps reached the fee
    cap, and then the alert named the wrong cause. It is now counted (`broadcast_refused`,
    alert EscrowdRulingBroadcastRefused); a node that already has the transaction is not."""
    task_id = await asyncio.to_thread(disputed_task, devnet)
    await admit(pool, ruling_consumer(devnet), ruling_message(devnet, task_id, 8_000))
    key = SecretKey.from_hex(devnet.arbiter.private_key)
    sender = RulingSender(rpc, key, devnet.chain_id, devnet.escrow_address, replace_after=3_600.0)
    balance = await asyncio.to_thread(devnet.rpc, "eth_getBalance", key.address, "latest")
    refused = RULINGS.labels("broadcast_refused")
    before = refused._value.get()
    await asyncio.to_thread(devnet.rpc, "anvil_setBalance", key.address, "0x0")
    try:
        await sender.step(pool)
        await sender.step(pool)
        row = await _ruling(pool, task_id)
        assert row["status"] == "sent" and await _receipt(devnet, row["tx_hash"]) is None
        assert refused._value.get() >= before + 2
    finally:
        await asyncio.to_thread(devnet.rpc, "anvil_setBalance", key.address, balance)
    for _ in range(10):
        await sender.step(pool)
        if (await _ruling(pool, task_id))["status"] == "confirmed":
            break
    assert (await _ruling(pool, task_id))["status"] == "confirmed"
    counted = refused._value.get()
    await sender.step(pool)  # watched until final: the node has it already, which is not a refusal
    assert refused._value.get() == counted
    assert (await asyncio.to_thread(devnet.get_task, task_id)).status == TaskStatus.RESOLVED
