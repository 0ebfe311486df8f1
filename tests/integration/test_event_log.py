"""The indexer's event log and its per-chain watermark, on real PostgreSQL and Kafka.

The events table is the log; the publisher keeps one watermark row per chain
(`published_through`, and `sending_through` recorded before each send). These tests pin
what that design must keep from the per-event outbox: a kill -9 between the send and the
watermark move loses nothing and re-sends under the same ids; a reorg while rows wait
retracts only what may have been sent; confirmations hold rows back; and the watermark
never passes a position whose transaction has not committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator

import asyncpg

from indexer.decode import DecodedLog
from indexer.reorg import BlockRef
from indexer.store import IndexerStore
from runtime.db import connect
from runtime.kafka import make_producer
from runtime.outbox import OutboxPublisher
from schemas.events import event_id, retraction_id
from tests.support.indexer_harness import create_topic, read_topic, wait_for

CHAIN = 31337
ESCROW = "0x" + "e" * 40


def _block(number: int, fork: str = "a") -> BlockRef:
    return BlockRef(number, f"0x{fork}{number:063x}", f"0x{fork}{number - 1:063x}", 1_000 + number)


def _events(block: BlockRef, count: int) -> list[DecodedLog]:
    return [
        DecodedLog(
            id=event_id(CHAIN, block.hash, i), chain_id=CHAIN, escrow_address=ESCROW,
            block_number=block.number, block_hash=block.hash, block_timestamp=block.timestamp,
            tx_hash="0x" + f"{i:064x}", tx_index=i, log_index=i, event="TaskAccepted",
            task_id=block.number * 1000 + i, args={"taskId": block.number * 1000 + i, "agent": "0x" + "a" * 40},
        )
        for i in range(count)
    ]


async def _append(
    store: IndexerStore, conn: asyncpg.Connection, block: BlockRef, count: int, confirmations: int = 0
) -> list[DecodedLog]:
    events = _events(block, count)
    await store.append(conn, events=events, blocks=[block], tip=block, confirmations=confirmations, head=None)
    return events


@contextlib.asynccontextmanager
async def _publisher(database_url: str, bootstrap: str, **kwargs: int) -> AsyncIterator[OutboxPublisher]:
    producer = make_producer(bootstrap, client_id="test-event-log")
    await producer.start()
    try:
        yield OutboxPublisher(database_url, producer, **kwargs)
    finally:
        await producer.stop()


async def _publish(database_url: str, bootstrap: str, conn: asyncpg.Connection) -> int:
    async with _publisher(database_url, bootstrap) as publisher:
        return await publisher.publish_logs(conn)


async def _states(conn: asyncpg.Connection) -> Counter[str]:
    rows = await conn.fetch("SELECT state FROM event_log_messages WHERE chain_id = $1", CHAIN)
    return Counter(r["state"] for r in rows)


_DYING_PUBLISHER = """
import asyncio, os, signal, sys

from runtime.db import connect
from runtime.kafka import make_producer
from runtime.outbox import OutboxPublisher


class DiesAfterTheAcks(OutboxPublisher):
    async def _complete_log(self, conn, chain_id, topic, messages, acks, started):
        await acks  # every message of the batch is on Kafka...
        os.kill(os.getpid(), signal.SIGKILL)  # ...and the watermark never moves


async def main() -> None:
    producer = make_producer(sys.argv[2])
    await producer.start()
    conn = await connect(sys.argv[1])
    await DiesAfterTheAcks(sys.argv[1], producer, batch_size=int(sys.argv[3])).publish_logs(conn)


asyncio.run(main())
"""


async def test_kill_9_between_send_and_watermark_loses_nothing_and_resends_the_same_ids(
    database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """SIGKILL after Kafka acked a batch, before the watermark moved: the restart re-sends
    exactly that batch, under the same message ids and bytes; nothing is lost."""
    topic = f"{topic_prefix}escrow.events.v1"
    await create_topic(kafka_bootstrap, topic)
    store = IndexerStore(CHAIN, topic)
    conn = await connect(database_url)
    try:
        events = await _append(store, conn, _block(1), 30) + await _append(store, conn, _block(2), 30)
        child = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", _DYING_PUBLISHER, database_url, kafka_bootstrap, "25"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert child.returncode == -signal.SIGKILL, child.stderr
        # The attempts were recorded before the sends (the second batch is read and sent
        # while the first one's acks are awaited); the watermark did not move.
        mark = await conn.fetchrow("SELECT published_through, sending_through FROM event_log_watermarks")
        assert mark is not None and (mark["published_through"], mark["sending_through"]) == (0, 50)
        assert await _states(conn) == Counter({"sending": 50, "pending": 10})
        first_life = await read_topic(kafka_bootstrap, topic)
        assert 25 <= len(first_life) <= 50
        assert {r.id for r in first_life} >= {e.id for e in events[:25]}
        assert {r.id for r in first_life} <= {e.id for e in events[:50]}

        assert await _publish(database_url, kafka_bootstrap, conn) == 60
        assert await _states(conn) == Counter({"published": 60})
    finally:
        await conn.close()
    records = await read_topic(kafka_bootstrap, topic)
    counts = Counter(r.id for r in records)
    assert set(counts) == {e.id for e in events}, "no event lost, no other id"
    resent = {i for i, n in counts.items() if n > 1}
    assert resent == {r.id for r in first_life}, "exactly what the killed publisher sent went out twice"
    assert all(n == 2 for i, n in counts.items() if i in resent)
    assert all(r.payload["id"] == r.id and r.payload["removed"] is False for r in records)
    payloads: dict[str, list[dict[str, object]]] = {}
    for r in records:
        payloads.setdefault(r.id, []).append(r.payload)
    assert all(len({repr(p) for p in ps}) == 1 for ps in payloads.values()), "a duplicate is the same message"


async def test_reorg_while_rows_wait_retracts_only_what_went_out(
    database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Block 2 published, block 3 still waiting: a reorg to block 1 retracts block 2's
    events and drops block 3's unseen; the new fork's events follow, all in log order."""
    topic = f"{topic_prefix}escrow.events.v1"
    await create_topic(kafka_bootstrap, topic, partitions=1)
    store = IndexerStore(CHAIN, topic)
    conn = await connect(database_url)
    try:
        base = _block(1)
        await store.append(conn, events=[], blocks=[base], tip=base, confirmations=0, head=None)
        published = await _append(store, conn, _block(2), 3)
        assert await _publish(database_url, kafka_bootstrap, conn) == 3
        waiting = await _append(store, conn, _block(3), 4)
        assert await _states(conn) == Counter({"published": 3, "pending": 4})

        removed, retracted = await store.rollback_to(conn, base)
        assert (removed, retracted) == (7, 3)
        fork = await _append(store, conn, _block(2, fork="b"), 2)
        assert await _publish(database_url, kafka_bootstrap, conn) == 3 + 2
    finally:
        await conn.close()
    ids = [r.id for r in await read_topic(kafka_bootstrap, topic)]
    # One partition: Kafka's order is the log's order.
    assert ids == (
        [e.id for e in published]
        + [retraction_id(e.id) for e in reversed(published)]
        + [e.id for e in fork]
    )
    assert not {e.id for e in waiting} & set(ids)


async def test_confirmations_hold_rows_back_and_the_watermark_waits(
    database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """confirmations 2: only blocks two deep below the cursor go out; a deeper cursor releases more."""
    topic = f"{topic_prefix}escrow.events.v1"
    await create_topic(kafka_bootstrap, topic)
    store = IndexerStore(CHAIN, topic)
    conn = await connect(database_url)
    try:
        by_block = {n: await _append(store, conn, _block(n), 5, confirmations=2) for n in range(1, 5)}
        # Cursor 4, line 2: blocks 1 and 2.
        assert await _publish(database_url, kafka_bootstrap, conn) == 10
        watermark = await conn.fetchval("SELECT published_through FROM event_log_watermarks")
        assert watermark == 10
        assert await _states(conn) == Counter({"published": 10, "pending": 10})
        assert await _publish(database_url, kafka_bootstrap, conn) == 0  # nothing new is deep enough
        assert await conn.fetchval("SELECT published_through FROM event_log_watermarks") == 10
        # A block without events moves the cursor (and the line) by one: block 3 goes out.
        empty = _block(5)
        await store.append(conn, events=[], blocks=[empty], tip=empty, confirmations=2, head=None)
        assert await _publish(database_url, kafka_bootstrap, conn) == 5
        assert await _states(conn) == Counter({"published": 15, "pending": 5})
    finally:
        await conn.close()
    ids = {r.id for r in await read_topic(kafka_bootstrap, topic)}
    assert ids == {e.id for n in (1, 2, 3) for e in by_block[n]}


async def test_the_watermark_never_passes_an_uncommitted_position(
    database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """A writer holds positions in an open transaction; a second writer of the chain waits
    for it (positions are handed out in commit order), and the publisher publishes neither
    until they commit; then both, in position order."""
    topic = f"{topic_prefix}escrow.events.v1"
    await create_topic(kafka_bootstrap, topic, partitions=1)
    store = IndexerStore(CHAIN, topic)
    conn, first_writer, second_writer = [await connect(database_url) for _ in range(3)]
    try:
        committed = await _append(store, conn, _block(1), 2)
        assert await _publish(database_url, kafka_bootstrap, conn) == 2

        tx = first_writer.transaction()
        await tx.start()
        held = await _append(store, first_writer, _block(2), 3)  # positions 3..5, not committed
        later = asyncio.create_task(_append(store, second_writer, _block(3), 2))

        async def second_waits_on_the_first() -> bool:
            return bool(
                await conn.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
                    second_writer.get_server_pid(),
                )
            )

        await wait_for(second_waits_on_the_first, timeout=30, what="the second writer waiting for the counter")
        assert await _publish(database_url, kafka_bootstrap, conn) == 0
        assert await conn.fetchval("SELECT published_through FROM event_log_watermarks") == 2
        assert not later.done()

        await tx.commit()
        fresh = await later
        assert await _publish(database_url, kafka_bootstrap, conn) == 5
        positions = [
            r["position"]
            for r in await conn.fetch("SELECT position FROM escrow_events WHERE chain_id = $1 ORDER BY position", CHAIN)
        ]
        assert positions == [1, 2, 3, 4, 5, 6, 7]
    finally:
        for c in (conn, first_writer, second_writer):
            await c.close()
    ids = [r.id for r in await read_topic(kafka_bootstrap, topic)]
    assert ids == [e.id for e in committed + held + fresh]
