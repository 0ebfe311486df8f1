"""Reorgs on anvil: the database ends equal to the canonical chain and Kafka retracts the rest.

For each depth 1 … confirmations + 2 the last blocks are replaced (`anvil_reorg`) with other
transactions: one event disappears, one moves to another block (the same call re-signed with
the same nonce), one transaction is replaced by a different one with the same nonce, and a
new one appears. Events shallower than `confirmations` were never published, so only deeper
reorgs need retractions, and only they count as deep in the alert metric.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import asyncpg
import pytest
from structlog.testing import capture_logs

from escrowd.devnet import USDC, Actor, Devnet, text_hash
from indexer import metrics
from indexer.config import ChainConfig
from runtime.db import connect
from schemas.events import retraction_id
from tests.support.indexer_harness import (
    TopicRecord,
    assert_db_matches_chain,
    chain_config,
    create_topic,
    cursor_of,
    in_process_indexer,
    read_topic,
    sample_value,
    wait_for,
)

CONFIRMATIONS = 2


@dataclass(frozen=True)
class Region:
    """The blocks a reorg will replace, and what the test needs to rebuild them differently."""

    first_block: int
    tasks: list[int]
    moved_nonce: int
    replaced_nonce: int | None
    original_ids: set[str]


def _send_raw(devnet: Devnet, raw: str) -> int:
    """Send a signed transaction (automine: its own block); return the block number."""
    tx_hash = devnet.rpc("eth_sendRawTransaction", raw)
    receipt = devnet.wait_for_receipt(tx_hash)
    assert receipt["status"] == 1
    return int(receipt["blockNumber"])


def _nonce(devnet: Devnet, actor: Actor) -> int:
    return int(devnet.rpc("eth_getTransactionCount", actor.address, "pending"), 16)


def _deadline(devnet: Devnet) -> int:
    return devnet.now() + 30 * 86_400


def _build_region(devnet: Devnet, depth: int) -> Region:
    """Open tasks below the region, then `depth` blocks with one escrow transaction each."""
    tasks = [devnet.post_task(devnet.posters[i % len(devnet.posters)]) for i in range(5)]
    first_block = devnet.block_number() + 1
    agent0, agent1, agent2 = devnet.agents[0], devnet.agents[1], devnet.agents[2]
    poster0 = devnet.posters[0]
    moved_nonce = _nonce(devnet, agent0)
    replaced_nonce = _nonce(devnet, poster0)
    plan = [
        devnet.sign_escrow_call(agent0, "acceptTask", tasks[0], nonce=moved_nonce),  # moves
        devnet.sign_escrow_call(agent1, "acceptTask", tasks[1]),  # disappears
        devnet.sign_escrow_call(  # replaced by another call with the same nonce
            poster0,
            "createTask",
            text_hash("original"),
            5 * USDC,
            _deadline(devnet),
            nonce=replaced_nonce,
        ),
        devnet.sign_escrow_call(agent2, "acceptTask", tasks[2]),  # disappears
    ][:depth]
    for offset, raw in enumerate(plan):
        assert _send_raw(devnet, raw) == first_block + offset
    logs = devnet.rpc(
        "eth_getLogs",
        {"address": devnet.escrow_address, "fromBlock": hex(first_block), "toBlock": "latest"},
    )
    ids = {f"{devnet.chain_id}:{g['blockHash']}:{int(g['logIndex'], 16)}" for g in logs}
    assert len(ids) == depth
    return Region(first_block, tasks, moved_nonce, replaced_nonce if depth >= 3 else None, ids)


def _reorg(devnet: Devnet, depth: int, region: Region) -> None:
    """Replace the region: a new acceptance, the moved one later, a different createTask."""
    agent0, agent3, poster0 = devnet.agents[0], devnet.agents[3], devnet.posters[0]
    txs = [(devnet.sign_escrow_call(agent3, "acceptTask", region.tasks[3]), 0)]
    if region.replaced_nonce is not None:
        replacement = devnet.sign_escrow_call(
            poster0,
            "createTask",
            text_hash("replacement"),
            7 * USDC,
            _deadline(devnet),
            nonce=region.replaced_nonce,
        )
        txs.append((replacement, 1))
    moved = devnet.sign_escrow_call(agent0, "acceptTask", region.tasks[0], nonce=region.moved_nonce)
    if depth >= 2:
        txs.append((moved, depth - 1))
    devnet.reorg(depth, txs)
    if depth == 1:
        # No later block inside the region: the moved call lands in the next block instead.
        _send_raw(devnet, moved)


async def _published_ids(conn: asyncpg.Connection) -> set[str]:
    rows = await conn.fetch("SELECT message_id FROM event_log_messages WHERE state = 'published'")
    return {r["message_id"] for r in rows}


async def _settled(conn: asyncpg.Connection, devnet: Devnet) -> bool:
    """The cursor sits on the head and everything `CONFIRMATIONS` deep is published."""
    head = devnet.rpc("eth_getBlockByNumber", "latest", False)
    cursor = await cursor_of(conn, devnet.chain_id)
    if cursor != (int(head["number"], 16), head["hash"]):
        return False
    pending = await conn.fetchval(
        "SELECT count(*) FROM event_log_messages WHERE state <> 'published'"
        " AND (block_number IS NULL OR block_number <= $1)",
        cursor[0] - CONFIRMATIONS,
    )
    return bool(pending == 0)


def _check_kafka(
    records: list[TopicRecord], canonical: set[str], published_before: set[str]
) -> set[str]:
    """Kafka = every canonical event + what was published; a retraction for each lost one."""
    events = {r.id for r in records if not r.payload["removed"]}
    retractions = {r.id for r in records if r.payload["removed"]}
    gone = published_before - canonical
    assert events == canonical | gone
    assert retractions == {retraction_id(i) for i in gone}
    originals = {r.id: r for r in records if not r.payload["removed"]}
    for record in records:
        if record.payload["removed"]:
            original = originals[record.payload["id"]]
            assert record.id == retraction_id(original.id)
            assert record.key == original.key
            assert {k: v for k, v in record.payload.items() if k != "removed"} == {
                k: v for k, v in original.payload.items() if k != "removed"
            }
    return gone


def _chain(devnet: Devnet) -> ChainConfig:
    return ChainConfig(
        **chain_config(
            devnet,
            ws_url=devnet.ws_url,
            confirmations=CONFIRMATIONS,
            finality_depth=32,
            head_window=16,
        )
    )


@pytest.mark.parametrize("depth", list(range(1, CONFIRMATIONS + 3)))
async def test_reorg_of_the_last_blocks(
    depth: int, devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Depth 1 … confirmations+2: DB equals the new chain, lost published events are retracted."""
    topic = f"{topic_prefix}escrow.events.v1"
    await create_topic(kafka_bootstrap, topic)
    label = str(devnet.chain_id)
    reorgs_before = sample_value(metrics.REORGS, chain_id=label)
    deep_before = sample_value(metrics.DEEP_REORGS, chain_id=label)
    conn = await connect(database_url)
    try:
        async with in_process_indexer(
            _chain(devnet), database_url, kafka_bootstrap, topic
        ) as running:
            region = await asyncio.to_thread(_build_region, devnet, depth)
            await wait_for(
                lambda: _settled(conn, devnet), timeout=30, what="indexed before the reorg"
            )
            published_before = await _published_ids(conn)
            # Confirmation gating: only the region's blocks at least CONFIRMATIONS deep went out.
            assert len(region.original_ids & published_before) == max(0, depth - CONFIRMATIONS)

            await asyncio.to_thread(_reorg, devnet, depth, region)
            await asyncio.to_thread(devnet.mine, CONFIRMATIONS + 1)
            await wait_for(
                lambda: _settled(conn, devnet), timeout=30, what="indexed after the reorg"
            )
            running.check()

        logs = await assert_db_matches_chain(conn, devnet)
        canonical = {g.id for g in logs}
        assert not region.original_ids & canonical
        moved = await conn.fetchrow(
            "SELECT block_number FROM escrow_events WHERE event_name = 'TaskAccepted' AND task_id = $1",
            region.tasks[0],
        )
        assert moved is not None and moved["block_number"] == region.first_block + max(depth - 1, 1)
        if depth >= 2:
            assert not await conn.fetchval(
                "SELECT count(*) FROM escrow_events WHERE event_name = 'TaskAccepted' AND task_id = $1",
                region.tasks[1],
            )
        records = await read_topic(kafka_bootstrap, topic)
        gone = _check_kafka(records, canonical, published_before)
        assert len(gone) == max(0, depth - CONFIRMATIONS)
        assert sample_value(metrics.REORGS, chain_id=label) > reorgs_before
        deep = sample_value(metrics.DEEP_REORGS, chain_id=label) - deep_before
        assert deep == (1 if depth > CONFIRMATIONS else 0)
    finally:
        await conn.close()


async def test_reorg_while_the_indexer_is_stopped(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """A reorg that happened while the indexer was down is found and repaired at start-up."""
    depth = CONFIRMATIONS + 2
    topic = f"{topic_prefix}escrow.events.v1"
    await create_topic(kafka_bootstrap, topic)
    conn = await connect(database_url)
    try:
        async with in_process_indexer(_chain(devnet), database_url, kafka_bootstrap, topic):
            region = await asyncio.to_thread(_build_region, devnet, depth)
            await wait_for(
                lambda: _settled(conn, devnet), timeout=30, what="indexed before the reorg"
            )
        published_before = await _published_ids(conn)
        assert region.original_ids & published_before

        # Down: the chain reorganises and grows; the stored cursor now names a stale block.
        await asyncio.to_thread(_reorg, devnet, depth, region)
        stale = await cursor_of(conn, devnet.chain_id)
        assert stale is not None
        head = await asyncio.to_thread(devnet.rpc, "eth_getBlockByNumber", hex(stale[0]), False)
        assert head["hash"] != stale[1]

        with capture_logs() as logs:
            async with in_process_indexer(
                _chain(devnet), database_url, kafka_bootstrap, topic
            ) as running:
                await asyncio.to_thread(devnet.mine, CONFIRMATIONS + 1)
                await wait_for(
                    lambda: _settled(conn, devnet), timeout=30, what="indexed after restart"
                )
                running.check()
        names = [entry["event"] for entry in logs]
        assert "reorg_detected_at_startup" in names
        assert names.index("reorg_detected_at_startup") < names.index("indexer_started")

        chain_logs = await assert_db_matches_chain(conn, devnet)
        records = await read_topic(kafka_bootstrap, topic)
        gone = _check_kafka(records, {g.id for g in chain_logs}, published_before)
        assert len(gone) == depth - CONFIRMATIONS
    finally:
        await conn.close()


def _reorg_race_round(devnet: Devnet, delay: float) -> None:
    """A block with one event, then — `delay` later — that block replaced by another event."""
    p0, p1 = devnet.posters[0], devnet.posters[1]
    original = devnet.sign_escrow_call(
        p0, "createTask", text_hash("race"), 1, _deadline(devnet), nonce=_nonce(devnet, p0)
    )
    devnet.rpc("eth_sendRawTransaction", original)
    time.sleep(delay)
    other = devnet.sign_escrow_call(
        p1, "createTask", text_hash("other"), 2, _deadline(devnet), nonce=_nonce(devnet, p1)
    )
    devnet.reorg(1, [(other, 0)])


async def test_reorgs_racing_the_publisher(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """confirmations 0, tip replaced while its event is being published: never a phantom."""
    topic = f"{topic_prefix}escrow.events.v1"
    await create_topic(kafka_bootstrap, topic)
    rng = random.Random()
    chain = ChainConfig(
        **chain_config(devnet, ws_url=devnet.ws_url, confirmations=0, finality_depth=32)
    )
    conn = await connect(database_url)
    try:
        async with in_process_indexer(chain, database_url, kafka_bootstrap, topic) as running:
            for _ in range(25):
                await asyncio.to_thread(_reorg_race_round, devnet, rng.uniform(0.0, 0.02))
                await asyncio.sleep(rng.uniform(0.0, 0.02))
            await asyncio.to_thread(devnet.mine, 1)
            await wait_for(lambda: _settled(conn, devnet), timeout=30, what="settled")
            running.check()
        logs = await assert_db_matches_chain(conn, devnet)
    finally:
        await conn.close()
    canonical = {g.id for g in logs}
    records = await read_topic(kafka_bootstrap, topic)
    events = {r.id for r in records if not r.payload["removed"]}
    retracted = {r.payload["id"] for r in records if r.payload["removed"]}
    assert canonical <= events
    assert events - canonical == retracted, "a published event vanished without a retraction"
    assert retracted, "no reorg hit a published event: the race was not exercised"
