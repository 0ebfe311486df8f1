"""Committed windows published from memory, on real PostgreSQL and Kafka.

The indexer hands each window it committed to the publisher of its process
(`OutboxPublisher.committed`); the publisher sends it without reading the log back, and
reads the log only for what memory does not hold. These tests pin that the two paths send
the same messages and that memory never sends what the log no longer holds: a rollback
between the commit and the publish, confirmations, a backlog from before a restart, and an
event that comes back after A → B → A.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg
from prometheus_client import REGISTRY

from indexer.decode import DecodedLog
from indexer.reorg import BlockRef
from indexer.store import IndexerStore
from runtime.db import connect
from runtime.kafka import make_producer
from runtime.outbox import OutboxPublisher
from schemas.events import EscrowEventMessage, event_id, incarnation_id, retraction_id
from tests.support.indexer_harness import TopicRecord, create_topic, read_topic

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
            task_id=block.number * 1000 + i,
            args={"taskId": block.number * 1000 + i, "agent": "0x" + "a" * 40, "amount": 2**200 + i},
        )
        for i in range(count)
    ]


async def _commit(
    store: IndexerStore,
    conn: asyncpg.Connection,
    block: BlockRef,
    count: int,
    publisher: OutboxPublisher | None,
    *,
    confirmations: int = 0,
) -> list[DecodedLog]:
    """Append a block's events as the indexer does, handing the window over when `publisher`."""
    events = _events(block, count)
    last = await store.append(conn, events=events, blocks=[block], tip=block, confirmations=confirmations, head=None)
    if publisher is not None:
        publisher.committed(CHAIN, last, events)
    return events


@contextlib.asynccontextmanager
async def _publisher(database_url: str, bootstrap: str, **kwargs: int) -> AsyncIterator[OutboxPublisher]:
    producer = make_producer(bootstrap, client_id="test-event-log-memory")
    await producer.start()
    try:
        yield OutboxPublisher(database_url, producer, **kwargs)
    finally:
        await producer.stop()


def _batches(source: str) -> float:
    return REGISTRY.get_sample_value("escrowd_outbox_log_batches_total", {"source": source}) or 0.0


def _by_id(records: list[TopicRecord]) -> dict[str, TopicRecord]:
    return {r.id: r for r in records}


async def test_a_committed_window_goes_out_from_memory_as_the_log_would_send_it(
    database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """The same events, once handed over in memory and once read from the log (two chains'
    worth of topics): the same ids, keys, headers and bodies; memory never read the log."""
    memory_topic, log_topic = f"{topic_prefix}memory.v1", f"{topic_prefix}log.v1"
    for topic in (memory_topic, log_topic):
        await create_topic(kafka_bootstrap, topic, partitions=1)
    conn = await connect(database_url)
    try:
        async with _publisher(database_url, kafka_bootstrap, batch_size=7, memory_batch_size=7) as publisher:
            store = IndexerStore(CHAIN, memory_topic)
            memory, database = _batches("memory"), _batches("database")
            events = await _commit(store, conn, _block(1), 10, publisher)
            events += await _commit(store, conn, _block(2), 10, publisher)
            assert await publisher.publish_logs(conn) == 20
            assert _batches("memory") - memory == 3 and _batches("database") == database, "20 in batches of 7"
            # The same rows again, read back from the log: a fresh database state for the chain.
            await conn.execute("DELETE FROM escrow_events WHERE chain_id = $1", CHAIN)
            await conn.execute("DELETE FROM event_log_watermarks WHERE chain_id = $1", CHAIN)
            await conn.execute("DELETE FROM chain_blocks WHERE chain_id = $1", CHAIN)
            await conn.execute("DELETE FROM chain_cursor WHERE chain_id = $1", CHAIN)
            store = IndexerStore(CHAIN, log_topic)
            await _commit(store, conn, _block(1), 10, None)
            await _commit(store, conn, _block(2), 10, None)
            assert await publisher.publish_logs(conn) == 20
            assert _batches("database") - database == 3
    finally:
        await conn.close()
    from_memory = await read_topic(kafka_bootstrap, memory_topic)
    from_log = await read_topic(kafka_bootstrap, log_topic)
    assert [r.id for r in from_memory] == [e.id for e in events] == [r.id for r in from_log]
    for a, b in zip(from_memory, from_log, strict=True):
        assert (a.key, a.headers, a.payload) == (b.key, b.headers, b.payload)
        assert a.payload["args"]["amount"] > 2**64, "uint256 arguments stay exact"
        EscrowEventMessage.model_validate(a.payload)


async def test_a_rollback_between_commit_and_publish_never_sends_the_removed_window(
    database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Block 2 published from memory; block 3 committed and handed over, then a reorg to
    block 1 before the publisher ran: block 3 never goes out, block 2 is retracted, the new
    fork follows, all in log order (as `test_reorg_while_rows_wait_retracts_only_what_went_out`)."""
    topic = f"{topic_prefix}escrow.events.v1"
    await create_topic(kafka_bootstrap, topic, partitions=1)
    store = IndexerStore(CHAIN, topic)
    conn = await connect(database_url)
    try:
        async with _publisher(database_url, kafka_bootstrap) as publisher:
            base = _block(1)
            await store.append(conn, events=[], blocks=[base], tip=base, confirmations=0, head=None)
            published = await _commit(store, conn, _block(2), 3, publisher)
            assert await publisher.publish_logs(conn) == 3
            waiting = await _commit(store, conn, _block(3), 4, publisher)
            assert await store.rollback_to(conn, base) == (7, 3)
            fork = await _commit(store, conn, _block(2, fork="b"), 2, publisher)
            assert await publisher.publish_logs(conn) == 3 + 2
            # Then memory serves again: the next window follows the log's last position.
            memory = _batches("memory")
            more = await _commit(store, conn, _block(3, fork="b"), 2, publisher)
            assert await publisher.publish_logs(conn) == 2
            assert _batches("memory") - memory == 1
    finally:
        await conn.close()
    ids = [r.id for r in await read_topic(kafka_bootstrap, topic)]
    assert ids == (
        [e.id for e in published]
        + [retraction_id(e.id) for e in reversed(published)]
        + [e.id for e in fork + more]
    )
    assert not {e.id for e in waiting} & set(ids)


async def test_confirmations_hold_a_window_in_memory_until_it_is_deep_enough(
    database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """confirmations 2: handed-over blocks go out only once two deep below the cursor."""
    topic = f"{topic_prefix}escrow.events.v1"
    await create_topic(kafka_bootstrap, topic)
    store = IndexerStore(CHAIN, topic)
    conn = await connect(database_url)
    try:
        async with _publisher(database_url, kafka_bootstrap) as publisher:
            by_block = {n: await _commit(store, conn, _block(n), 5, publisher, confirmations=2) for n in range(1, 5)}
            assert await publisher.publish_logs(conn) == 10  # cursor 4, line 2
            assert await publisher.publish_logs(conn) == 0
            assert await conn.fetchval("SELECT published_through FROM event_log_watermarks") == 10
            empty = _block(5)
            await store.append(conn, events=[], blocks=[empty], tip=empty, confirmations=2, head=None)
            database = _batches("database")
            assert await publisher.publish_logs(conn) == 5
            assert _batches("database") == database, "block 3 came from memory"
    finally:
        await conn.close()
    ids = {r.id for r in await read_topic(kafka_bootstrap, topic)}
    assert ids == {e.id for n in (1, 2, 3) for e in by_block[n]}


async def test_a_backlog_from_before_a_restart_is_read_from_the_log_then_memory_takes_over(
    database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Rows committed while no publisher ran (a restart) are read from the log; windows
    handed over meanwhile wait behind them; every event goes out once, in log order."""
    topic = f"{topic_prefix}escrow.events.v1"
    await create_topic(kafka_bootstrap, topic, partitions=1)
    store = IndexerStore(CHAIN, topic)
    conn = await connect(database_url)
    try:
        backlog = await _commit(store, conn, _block(1), 6, None) + await _commit(store, conn, _block(2), 6, None)
        async with _publisher(database_url, kafka_bootstrap, batch_size=5, memory_batch_size=5) as publisher:
            live = await _commit(store, conn, _block(3), 6, publisher)
            memory, database = _batches("memory"), _batches("database")
            assert await publisher.publish_logs(conn) == 18
            assert _batches("database") - database >= 3, "the backlog, and the batch that runs into block 3"
            assert _batches("memory") - memory >= 1
    finally:
        await conn.close()
    ids = [r.id for r in await read_topic(kafka_bootstrap, topic)]
    assert ids == [e.id for e in backlog + live]


async def test_an_event_back_after_a_reorg_goes_out_from_memory_under_its_new_id(
    database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """A → B → A: the event of block 2a, published, retracted, and committed again, goes out
    from memory as `<id>#1`, the id the log would give it."""
    topic = f"{topic_prefix}escrow.events.v1"
    await create_topic(kafka_bootstrap, topic, partitions=1)
    store = IndexerStore(CHAIN, topic)
    conn = await connect(database_url)
    try:
        async with _publisher(database_url, kafka_bootstrap) as publisher:
            base = _block(1)
            await store.append(conn, events=[], blocks=[base], tip=base, confirmations=0, head=None)
            first = await _commit(store, conn, _block(2), 1, publisher)
            assert await publisher.publish_logs(conn) == 1
            await store.rollback_to(conn, base)
            await _commit(store, conn, _block(2, fork="b"), 1, publisher)
            assert await publisher.publish_logs(conn) == 2
            await store.rollback_to(conn, base)
            assert await publisher.publish_logs(conn) == 1  # the retraction of 2b
            memory = _batches("memory")
            again = await _commit(store, conn, _block(2), 1, publisher)
            assert await publisher.publish_logs(conn) == 1
            assert _batches("memory") - memory == 1
    finally:
        await conn.close()
    records = _by_id(await read_topic(kafka_bootstrap, topic))
    assert again[0].id == first[0].id
    assert incarnation_id(first[0].id, 1) in records, "the comeback has a new id"


async def test_a_whole_committed_window_goes_out_as_one_batch_from_memory(
    database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """A batch from memory takes up to `memory_batch_size` events (a whole window: one lock,
    one check, one watermark move), while the log is read back in `batch_size` pieces."""
    topic = f"{topic_prefix}escrow.events.v1"
    await create_topic(kafka_bootstrap, topic, partitions=1)
    store = IndexerStore(CHAIN, topic)
    conn = await connect(database_url)
    try:
        backlog = await _commit(store, conn, _block(1), 12, None)
        async with _publisher(database_url, kafka_bootstrap, batch_size=5, memory_batch_size=25) as publisher:
            memory, database = _batches("memory"), _batches("database")
            assert await publisher.publish_logs(conn) == 12
            assert _batches("database") - database == 3, "the log in pieces of 5"
            window = await _commit(store, conn, _block(2), 20, publisher)
            window += await _commit(store, conn, _block(3), 20, publisher)
            assert await publisher.publish_logs(conn) == 40
            assert _batches("memory") - memory == 2, "40 events handed over: two batches of at most 25"
            assert _batches("database") - database == 3, "nothing of the windows read back"
    finally:
        await conn.close()
    ids = [r.id for r in await read_topic(kafka_bootstrap, topic)]
    assert ids == [e.id for e in backlog + window]
