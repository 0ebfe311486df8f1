"""Attacks on the indexer's event log (the review of "one durable write per event").

Each test drives the real pieces (IndexerStore, OutboxPublisher, a publisher process
killed with SIGKILL) on real PostgreSQL and Kafka and pins one finding of the review.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from escrowd.devnet import Devnet, deploy_devnet
from indexer.config import ChainConfig
from indexer.reorg import BlockRef
from indexer.store import IndexerStore
from runtime.db import connect
from runtime.outbox import unpublished
from runtime.services.anvil import AnvilProcess
from schemas.events import retraction_id
from tests.integration.test_event_log import _DYING_PUBLISHER, _append, _block, _publish
from tests.support.indexer_harness import (
    assert_db_matches_chain,
    chain_config,
    create_topic,
    generate_task_events,
    in_process_indexer,
    read_topic,
    wait_for_cursor,
)
from tests.support.rpc_proxy import Faults, RpcFaultProxy


async def test_a_retraction_is_not_held_back_behind_rows_that_may_already_be_on_kafka(
    database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """confirmations 5, blocks 10 and 11 deep enough and sent; the publisher dies before its
    watermark moves; a reorg to block 10 retracts block 11's events. The retraction sits
    behind block 10's events, which the lower cursor (line 5) holds back again although they
    are behind `sending_through` (maybe on Kafka already). The retraction must go out now,
    not once the chain has grown five more blocks: consumers act on a vanished event meanwhile."""
    topic = f"{topic_prefix}escrow.events.v1"
    await create_topic(kafka_bootstrap, topic, partitions=1)
    store = IndexerStore(CHAIN, topic)
    conn = await connect(database_url)
    try:
        kept = await _append(store, conn, _block(10), 2, confirmations=5)
        gone = await _append(store, conn, _block(11), 2, confirmations=5)
        tip = _block(20)
        await store.append(conn, events=[], blocks=[tip], tip=tip, confirmations=5, head=None)
        child = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", _DYING_PUBLISHER, database_url, kafka_bootstrap, "4"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert child.returncode == -signal.SIGKILL, child.stderr
        mark = await conn.fetchrow("SELECT published_through, sending_through FROM event_log_watermarks")
        assert mark is not None and (mark["published_through"], mark["sending_through"]) == (0, 4)

        assert await store.rollback_to(conn, _block(10)) == (2, 2)
        assert await unpublished(conn)
        # Cursor 10, line 5: nothing new is deep enough, but the retractions (and the rows
        # before them that were already sent) must go out.
        assert await _publish(database_url, kafka_bootstrap, conn) == 4
        assert await conn.fetchval("SELECT published_through FROM event_log_watermarks") == 6
        assert not await unpublished(conn)
    finally:
        await conn.close()
    ids = [r.id for r in await read_topic(kafka_bootstrap, topic)]
    assert ids[-2:] == [retraction_id(e.id) for e in reversed(gone)]
    assert ids[-4:-2] == [e.id for e in kept], "the re-sent rows keep their ids, in log order"


CHAIN = 31337


@pytest.fixture
def devnet() -> Iterator[Devnet]:
    with AnvilProcess(extra_args=("--gas-limit", "1000000000")) as anvil:
        yield deploy_devnet(anvil.rpc_url, ws_url=anvil.ws_url)


async def test_logs_out_of_order_from_the_provider_still_make_a_log_in_block_order(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """A provider answering `eth_getLogs` newest first: the log must still be in block order
    (the reorg rollback reads its tail backwards and stops at the first row at or below the
    ancestor; the confirmation hold-back stops at the first row above the line). Out of
    order, a rollback left events of orphaned blocks in the table, never retracted."""
    await asyncio.to_thread(generate_task_events, devnet, 120, per_block=10)
    topic = f"{topic_prefix}escrow.events.v1"
    await create_topic(kafka_bootstrap, topic)
    with RpcFaultProxy(devnet.rpc_url, Faults(reverse_logs=True)) as proxy:
        chain = ChainConfig(
            **chain_config(devnet, rpc_urls=[proxy.url], finality_depth=4, initial_range=64, max_range=64)
        )
        async with in_process_indexer(chain, database_url, kafka_bootstrap, topic, publish=False) as running:
            await wait_for_cursor(database_url, devnet.chain_id, devnet.block_number(), timeout=120)
            running.check()
        assert proxy.stats.injected["reversed_logs"] >= 1
    conn = await connect(database_url)
    try:
        await assert_db_matches_chain(conn, devnet, to_block=devnet.block_number())
        rows = await conn.fetch(
            "SELECT block_number, log_index FROM escrow_events WHERE chain_id = $1 ORDER BY position",
            devnet.chain_id,
        )
        coordinates = [(r["block_number"], r["log_index"]) for r in rows]
        assert coordinates == sorted(coordinates), "the log is in chain order"
        blocks = sorted({b for b, _ in coordinates})
        ancestor_number = blocks[len(blocks) // 2]
        store = IndexerStore(devnet.chain_id, topic)
        ancestor = BlockRef.from_header(devnet.rpc("eth_getBlockByNumber", hex(ancestor_number), False))
        removed, _ = await store.rollback_to(conn, ancestor)
        assert removed == sum(1 for b, _ in coordinates if b > ancestor_number)
        left = await conn.fetchval(
            "SELECT count(*) FROM escrow_events WHERE chain_id = $1 AND block_number > $2",
            devnet.chain_id,
            ancestor_number,
        )
        assert left == 0, "a rollback leaves no event of an orphaned block"
    finally:
        await conn.close()
