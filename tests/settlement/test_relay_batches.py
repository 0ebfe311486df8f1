"""The relayer packing verdicts into `completeVerificationBatch` (`relayer_settle_batch_size`).

- a packed round is simulated as it is signed: each batch once, and no packed verdict on its
  own (each single send once);
- a refused item in a mined batch (the task was disputed between the preflight and the
  block) is recorded like a refused single send, and every other verdict is confirmed;
- a stuck batch is replaced with a fee bump (same items), and only one version lands;
- a reorg removing a confirmed batch puts its items back to `sent`; the batch is resent and
  every item confirmed again, each attempt judged once;
- a key rotation mined just before a batch: its items leave it and are queued again behind
  the closed gate, then sent once the key matches again;
- a batch's nonce taken by another transaction: the slot is lost, its items queued again and
  sent under a new nonce;
- kill -9 at every crash point and at random instants with packing on: every attempt judged
  exactly once on chain, no relayer transaction reverted, no nonce gap, every verdict in
  exactly one live slot.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from eth_abi.abi import decode as abi_decode

from chain.txs import decode_complete_verification, selector
from escrowd.devnet import Devnet
from relayer.settlement.crash import POINTS
from tests.settlement.conftest import (
    Relay,
    RelayerRun,
    fetch,
    fetchval,
    on_chain,
    publish,
    settings_from_env,
    verdict_events,
    verdict_statuses,
    wait_until,
)
from tests.settlement.test_relay_crash import (
    kill9,
    progress,
    relayer_transactions,
    spawn,
    wait_exit,
)
from tests.support.rpc_proxy import RpcFaultProxy

BY_EIGHT = {"relayer_settle_batch_size": 8, "relayer_settle_batch_min": 2}


def _attempts_of(tx: dict) -> list[tuple[int, int]]:
    """(task, attempt) of each verdict a relayer transaction carries (single or batch)."""
    data = bytes.fromhex(tx["input"][2:])
    single = decode_complete_verification(data)
    if single is not None:
        return [(single[0], single[1])]
    assert data[:4] == selector("completeVerificationBatch"), tx["hash"]
    (items,) = abi_decode(["(uint256,uint8,bytes32,bool,uint8)[]"], data[4:])
    return [(int(t), int(a)) for t, a, *_ in items]


@pytest.mark.timeout(180)
async def test_a_packed_round_simulates_each_batch_once_and_no_packed_verdict_alone(
    relay: Relay, devnet: Devnet, database_url: str,
) -> None:
    """The relayer reads the chain through a proxy that counts `eth_call`s by selector: a
    verdict packed in a batch is simulated only inside its batch (issue 26: the per-verdict
    simulation of packed rounds was the relayer's extra load on the node)."""
    items = await relay.submitted(24)
    env = relay.env(**BY_EIGHT)
    with RpcFaultProxy(devnet.rpc_url) as proxy:
        (chain,) = json.loads(env["ESCROWD_CHAINS"])
        env["ESCROWD_CHAINS"] = json.dumps([{**chain, "rpc_urls": [proxy.url], "ws_url": proxy.ws_url}])
        run = RelayerRun(settings_from_env(env))
        await run.start()
        try:
            await relay.send_verdicts(env, items)

            async def confirmed() -> bool:
                run.check_alive()
                statuses = await verdict_statuses(database_url)
                return len(statuses) == len(items) and set(statuses.values()) == {"confirmed"}

            await wait_until(confirmed, timeout=90, what="every verdict confirmed")
        finally:
            await run.stop()
    kinds = Counter(r["kind"] for r in await fetch(database_url, "SELECT kind FROM settlement_transactions"))
    assert kinds["batch"] >= 1
    assert await fetchval(database_url, "SELECT count(*) FROM settlement_batch_items") + kinds["verdict"] == len(items)
    single = proxy.stats.eth_calls["0x" + selector("completeVerification").hex()]
    packed = proxy.stats.eth_calls["0x" + selector("completeVerificationBatch").hex()]
    assert single == kinds["verdict"]  # each single send simulated once, no packed verdict alone
    assert packed >= kinds["batch"]  # each batch simulated (once, unless a node reply was lost)
    events = await on_chain(verdict_events, devnet)
    assert events == {(i.task_id, 1): 1 for i in items}


@pytest.mark.timeout(180)
async def test_a_refused_item_is_recorded_and_the_others_confirmed(
    relay: Relay, devnet: Devnet, database_url: str,
) -> None:
    items = await relay.submitted(20)
    run, env = await relay.start(**BY_EIGHT)
    disputed = items[3]
    try:
        await on_chain(devnet.rpc, "evm_setAutomine", False)
        await relay.send_verdicts(env, items)

        await wait_until(lambda: relay.all_sent(run, items), timeout=60, what="every verdict signed and in the pool")
        # The poster disputes one task with a higher tip: it is mined before the batches.
        await relay.dispute_ahead(disputed.task_id, devnet.posters[3 % len(devnet.posters)])

        async def settled() -> bool:
            run.check_alive()
            await on_chain(devnet.mine)
            statuses = await verdict_statuses(database_url)
            return statuses.get(disputed.task_id) == "reverted" and sum(v == "confirmed" for v in statuses.values()) == 19

        await wait_until(settled, timeout=60, what="19 confirmed, the disputed one refused")
        row = (await fetch(database_url, "SELECT error, error_args FROM settlement_verdicts WHERE task_id = $1", disputed.task_id))[0]
        assert row["error"] == "WrongStatus" and json.loads(row["error_args"]) == [5]
        events = await on_chain(verdict_events, devnet)
        assert events == {(i.task_id, 1): 1 for i in items if i is not disputed}
        kinds = Counter(r["kind"] for r in await fetch(database_url, "SELECT kind FROM settlement_transactions"))
        assert kinds["batch"] >= 1
        packed = await fetchval(database_url, "SELECT count(*) FROM settlement_batch_items")
        assert packed + kinds["verdict"] == len(items)
        assert await fetchval(database_url, "SELECT count(*) FROM settlement_transactions WHERE state <> 'confirmed'") == 0
    finally:
        await on_chain(devnet.rpc, "evm_setAutomine", True)
        await run.stop()


PACKED = {"relayer_settle_batch_size": 4, "relayer_settle_batch_min": 2}


async def _batch_nonces(database_url: str) -> list[int]:
    return [r["nonce"] for r in await fetch(database_url, "SELECT nonce FROM settlement_transactions WHERE kind = 'batch'")]


@pytest.mark.timeout(180)
async def test_a_stuck_batch_is_replaced_and_only_one_version_lands(
    relay: Relay, devnet: Devnet, database_url: str,
) -> None:
    items = await relay.submitted(4)
    run, env = await relay.start(relayer_replace_after_seconds=1, **PACKED)
    try:
        await on_chain(devnet.rpc, "evm_setAutomine", False)
        await relay.send_verdicts(env, items)

        async def replaced() -> bool:
            run.check_alive()
            return bool(
                await fetchval(
                    database_url,
                    "SELECT count(*) FROM settlement_tx_versions WHERE kind = 'batch' AND version >= 1",
                )
            )

        await wait_until(replaced, timeout=60, what="a batch replaced")
        versions = await fetch(
            database_url,
            "SELECT tx_hash, nonce, version, max_fee_per_gas FROM settlement_tx_versions WHERE kind = 'batch'"
            " ORDER BY nonce, version",
        )
        nonce = next(v["nonce"] for v in versions if v["version"] >= 1)
        same = [v for v in versions if v["nonce"] == nonce]
        assert same[1]["max_fee_per_gas"] * 100 >= same[0]["max_fee_per_gas"] * 110
        raws = {
            v["tx_hash"]: await on_chain(devnet.rpc, "eth_getTransactionByHash", v["tx_hash"]) for v in same[:2]
        }
        inputs = {tx["input"] for tx in raws.values() if tx is not None}
        assert len(inputs) <= 1, "a replacement carries the same items"
        await on_chain(devnet.rpc, "evm_setAutomine", True)
        await on_chain(devnet.mine)

        async def confirmed() -> bool:
            run.check_alive()
            await on_chain(devnet.mine)
            statuses = await verdict_statuses(database_url)
            return len(statuses) == len(items) and set(statuses.values()) == {"confirmed"}

        await wait_until(confirmed, timeout=60, what="every verdict confirmed")
        landed = [v for v in same if await on_chain(devnet.rpc, "eth_getTransactionReceipt", v["tx_hash"])]
        assert len(landed) == 1
        assert await on_chain(verdict_events, devnet) == {(i.task_id, 1): 1 for i in items}
    finally:
        await on_chain(devnet.rpc, "evm_setAutomine", True)
        await run.stop()


@pytest.mark.timeout(180)
async def test_a_reorg_under_a_confirmed_batch_resends_it(
    relay: Relay, devnet: Devnet, database_url: str,
) -> None:
    items = await relay.submitted(4)
    run, env = await relay.start(confirmations=2, **PACKED)
    try:
        await relay.send_verdicts(env, items)

        async def confirmed() -> bool:
            run.check_alive()
            await on_chain(devnet.mine)
            statuses = await verdict_statuses(database_url)
            return len(statuses) == len(items) and set(statuses.values()) == {"confirmed"}

        await wait_until(confirmed, timeout=60, what="first confirmation")
        assert await _batch_nonces(database_url), "the verdicts went out packed"
        first_block = await fetchval(database_url, "SELECT min(block_number) FROM settlement_verdicts")
        depth = (await on_chain(devnet.block_number)) - first_block + 1
        # Mining paused across the reorg and the check: the relayer may resend the moment it
        # sees the new heads, and with automine its resend was mined before the check ran.
        await on_chain(devnet.rpc, "evm_setAutomine", False)
        try:
            await on_chain(devnet.reorg, depth)  # every verdict transaction is gone
            assert not any([await on_chain(devnet.is_judged, i.task_id, 1) for i in items])
        finally:
            await on_chain(devnet.rpc, "evm_setAutomine", True)

        async def resent() -> bool:
            run.check_alive()
            await on_chain(devnet.mine)
            rows = await fetch(database_url, "SELECT status, reorgs FROM settlement_verdicts")
            return all(r["status"] == "confirmed" and r["reorgs"] >= 1 for r in rows)

        await wait_until(resent, timeout=60, what="the batch resent after the reorg")
        assert await on_chain(verdict_events, devnet) == {(i.task_id, 1): 1 for i in items}
        total = await fetchval(database_url, "SELECT count(*) FROM settlement_transactions")
        assert total == await fetchval(database_url, "SELECT next_nonce FROM settlement_nonces")
    finally:
        await run.stop()


async def _all_sent(run: RelayerRun, database_url: str, count: int) -> None:
    async def sent() -> bool:
        run.check_alive()
        statuses = await verdict_statuses(database_url)
        return len(statuses) == count and set(statuses.values()) == {"sent"}

    await wait_until(sent, timeout=60, what="every verdict signed and in the pool")


async def _all_confirmed(run: RelayerRun, devnet: Devnet, database_url: str, count: int, timeout: float = 60) -> None:
    async def confirmed() -> bool:
        run.check_alive()
        await on_chain(devnet.mine)
        statuses = await verdict_statuses(database_url)
        return len(statuses) == count and set(statuses.values()) == {"confirmed"}

    await wait_until(confirmed, timeout=timeout, what="every verdict confirmed")


def _urgent(devnet: Devnet, sender: str, to: str, data: str, nonce: int | None = None) -> None:
    """Send a transaction that outbids the relayer's in the pool (mined first, or replacing)."""
    tx = {
        "from": sender,
        "to": to,
        "data": data,
        "gas": hex(300_000),
        "maxPriorityFeePerGas": hex(200 * 10**9),
        "maxFeePerGas": hex(400 * 10**9),
    }
    if nonce is not None:
        tx["nonce"] = hex(nonce)
    devnet.rpc("eth_sendTransaction", tx)


@pytest.mark.timeout(180)
async def test_a_key_rotation_racing_a_batch_queues_its_items_again(
    relay: Relay, devnet: Devnet, database_url: str,
) -> None:
    items = await relay.submitted(4)
    run, env = await relay.start(**PACKED)
    try:
        await on_chain(devnet.rpc, "evm_setAutomine", False)
        await relay.send_verdicts(env, items)
        await _all_sent(run, database_url, len(items))
        first_batches = await _batch_nonces(database_url)
        assert first_batches
        rotate = devnet._codec.encode_call("setMarketplaceVerifier", [devnet.spare[2].address])
        await on_chain(_urgent, devnet, devnet.owner.address, devnet.escrow_address, rotate)
        await on_chain(devnet.rpc, "evm_mine")
        await on_chain(devnet.rpc, "evm_setAutomine", True)

        async def requeued() -> bool:
            run.check_alive()
            statuses = await verdict_statuses(database_url)
            return set(statuses.values()) == {"queued"}

        await wait_until(requeued, timeout=60, what="items queued again behind the closed gate")
        assert not run.relayer.gates[devnet.chain_id].is_open
        left = await fetchval(
            database_url, "SELECT count(*) FROM settlement_batch_items WHERE nonce = ANY($1::bigint[])", first_batches
        )
        assert left == 0, "refused items left their batch"
        assert not any([await on_chain(devnet.is_judged, i.task_id, 1) for i in items])
        await on_chain(devnet.set_marketplace_verifier, devnet.marketplace_verifier)
        await _all_confirmed(run, devnet, database_url, len(items))
        assert await on_chain(verdict_events, devnet) == {(i.task_id, 1): 1 for i in items}
    finally:
        await on_chain(devnet.rpc, "evm_setAutomine", True)
        await run.stop()


@pytest.mark.timeout(180)
async def test_a_batch_nonce_taken_by_another_transaction_is_sent_again(
    relay: Relay, devnet: Devnet, database_url: str,
) -> None:
    items = await relay.submitted(4)
    run, env = await relay.start(**PACKED)
    relayer = devnet.marketplace_verifier.address
    try:
        await on_chain(devnet.rpc, "evm_setAutomine", False)
        await relay.send_verdicts(env, items)
        await _all_sent(run, database_url, len(items))
        (nonce, *_) = sorted(await _batch_nonces(database_url))
        # Someone else with the relayer's key (an operator's wallet) takes that nonce.
        await on_chain(_urgent, devnet, relayer, relayer, "0x", nonce)
        await on_chain(devnet.rpc, "evm_mine")
        await on_chain(devnet.rpc, "evm_setAutomine", True)
        await _all_confirmed(run, devnet, database_url, len(items))
        state = await fetchval(database_url, "SELECT state FROM settlement_transactions WHERE nonce = $1", nonce)
        assert state == "lost"
        assert await on_chain(verdict_events, devnet) == {(i.task_id, 1): 1 for i in items}
        latest = int(await on_chain(devnet.rpc, "eth_getTransactionCount", relayer, "latest"), 16)
        assert latest == await fetchval(database_url, "SELECT next_nonce FROM settlement_nonces")
    finally:
        await on_chain(devnet.rpc, "evm_setAutomine", True)
        await run.stop()


@pytest.mark.timeout(600)
async def test_kill_nine_with_packing_keeps_exactly_once(
    relay: Relay, devnet: Devnet, database_url: str, tmp_path: Path
) -> None:
    rng = random.Random(7)
    items = await relay.submitted(120, prefix="pack", timeout=120)
    signed = relay.signed(items)
    env = relay.env(
        relayer_batch_size=24,
        relayer_settle_batch_size=6,
        relayer_settle_batch_min=2,
        relayer_broadcast_concurrency=4,
        relayer_replace_after_seconds=2,
    )
    topic = env["ESCROWD_VERDICTS_TOPIC"]
    log_file = tmp_path / "relayer.log"
    first_block = (await on_chain(devnet.block_number)) + 1
    await publish(relay.kafka_bootstrap, topic, signed[:60])
    schedule = [("point", p) for p in POINTS] + [("external", "")] * 5
    rng.shuffle(schedule)
    kills: Counter[str] = Counter()
    for index, (kind, point) in enumerate(schedule):
        if index == 2:
            await publish(relay.kafka_bootstrap, topic, signed[60:])
        run_env = dict(env)
        if kind == "point":
            run_env["ESCROWD_RELAYER_FAULT_INJECTION"] = f"{point}:1"
        start = await progress(database_url)
        proc = spawn(run_env, log_file)
        try:
            if kind == "point":
                if await wait_exit(proc, 25):
                    assert proc.returncode == -signal.SIGKILL, f"relayer exited with {proc.returncode}: see {log_file}"
                    kills[f"point:{point}"] += 1
                else:
                    kill9(proc)
                    kills["external"] += 1
            else:
                target = start + rng.randint(1, 4)
                deadline = time.monotonic() + 25
                while time.monotonic() < deadline and proc.poll() is None and await progress(database_url) < target:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
                await asyncio.sleep(rng.random() * 0.2)
                assert proc.poll() is None, f"relayer died on its own ({proc.returncode}): see {log_file}"
                kill9(proc)
                kills["external"] += 1
        finally:
            if proc.poll() is None:
                kill9(proc)

    proc = spawn(env, log_file)
    try:

        async def all_confirmed() -> bool:
            assert proc.poll() is None, f"relayer exited with {proc.returncode}: see {log_file}"
            statuses = await verdict_statuses(database_url)
            return len(statuses) == len(items) and set(statuses.values()) == {"confirmed"}

        await wait_until(all_confirmed, timeout=120, interval=0.2, what="every verdict confirmed")
        proc.send_signal(signal.SIGTERM)
        assert await wait_exit(proc, 15), "relayer did not stop on SIGTERM"
    finally:
        if proc.poll() is None:
            kill9(proc)

    relayer = devnet.marketplace_verifier.address
    # Every attempt judged exactly once on chain.
    events = await on_chain(verdict_events, devnet)
    assert events == {(i.task_id, 1): 1 for i in items}
    # No relayer transaction reverted; a verdict carried by several transactions (a batch
    # resent after a crash is the same bytes) settled once: the escrow refuses a second.
    txs = await on_chain(relayer_transactions, devnet, relayer, first_block)
    carried: Counter[tuple[int, int]] = Counter()
    for tx in txs:
        assert tx["status"] == 1, f"reverted relayer tx {tx['hash']}"
        if tx["to"].lower() == relayer.lower():
            continue  # a filler
        carried.update(_attempts_of(tx))
    assert set(carried) == {(i.task_id, 1) for i in items}
    assert sum(1 for tx in txs if _is_batch(tx)) >= 1
    # No nonce gap, no drift.
    latest = int(await on_chain(devnet.rpc, "eth_getTransactionCount", relayer, "latest"), 16)
    pending = int(await on_chain(devnet.rpc, "eth_getTransactionCount", relayer, "pending"), 16)
    assert latest == pending == await fetchval(database_url, "SELECT next_nonce FROM settlement_nonces") == len(txs)
    # Every verdict in exactly one live slot (its own, or as an item of a batch).
    live = await fetch(
        database_url,
        "SELECT verdict_id, count(*) AS n FROM ("
        " SELECT verdict_id FROM settlement_transactions WHERE kind = 'verdict' AND state <> 'lost'"
        " UNION ALL SELECT b.verdict_id FROM settlement_batch_items b JOIN settlement_transactions t"
        "   USING (chain_id, sender, nonce) WHERE t.kind = 'batch' AND t.state <> 'lost') s"
        " GROUP BY verdict_id",
    )
    assert len(live) == len(items) and all(r["n"] == 1 for r in live)
    text = log_file.read_text(errors="replace").lower()
    assert devnet.marketplace_verifier.private_key.lower().removeprefix("0x") not in text
    assert sum(kills.values()) == len(schedule)


def _is_batch(tx: dict) -> bool:
    return tx["input"].startswith("0x" + selector("completeVerificationBatch").hex())
