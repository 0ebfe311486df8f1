"""Attacks on the indexer's event log (the review of "one durable write per event").

Each test drives the real pieces (IndexerStore, OutboxPublisher, a publisher process
killed with SIGKILL) on real PostgreSQL and Kafka and pins one finding of the review.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

from indexer.store import IndexerStore
from runtime.db import connect
from schemas.events import retraction_id
from tests.integration.test_event_log import _DYING_PUBLISHER, _append, _block, _publish
from tests.support.indexer_harness import create_topic, read_topic


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
        # Cursor 10, line 5: nothing new is deep enough, but the retractions (and the rows
        # before them that were already sent) must go out.
        assert await _publish(database_url, kafka_bootstrap, conn) == 4
        assert await conn.fetchval("SELECT published_through FROM event_log_watermarks") == 6
    finally:
        await conn.close()
    ids = [r.id for r in await read_topic(kafka_bootstrap, topic)]
    assert ids[-2:] == [retraction_id(e.id) for e in reversed(gone)]
    assert ids[-4:-2] == [e.id for e in kept], "the re-sent rows keep their ids, in log order"


CHAIN = 31337
