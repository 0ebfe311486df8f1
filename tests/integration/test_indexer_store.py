"""The indexer's SQL on a real PostgreSQL: rollbacks, retractions, and events that come back."""

from __future__ import annotations

from indexer.decode import DecodedLog
from indexer.reorg import BlockRef
from indexer.store import IndexerStore
from runtime.db import connect
from schemas.events import event_id

CHAIN = 31337


def _block(number: int, fork: str = "a") -> BlockRef:
    return BlockRef(number, f"0x{fork}{number:063x}", f"0x{fork}{number - 1:063x}", 1_000 + number)


def _event(block: BlockRef, log_index: int, task_id: int) -> DecodedLog:
    return DecodedLog(
        id=event_id(CHAIN, block.hash, log_index), chain_id=CHAIN, escrow_address="0x" + "e" * 40,
        block_number=block.number, block_hash=block.hash, block_timestamp=block.timestamp,
        tx_hash="0x" + "1" * 64, tx_index=0, log_index=log_index, event="TaskAccepted", task_id=task_id,
        args={"taskId": task_id, "agent": "0x" + "a" * 40, "status": 1},
    )


async def test_event_back_after_reorg_a_b_a_gets_a_new_message_id(database_url: str) -> None:
    """Published, retracted by a reorg, then canonical again: three distinct message ids, in order."""
    store = IndexerStore(CHAIN, "events")
    conn = await connect(database_url)
    try:
        base, a1 = _block(1), _block(2)
        await store.append(conn, events=[], blocks=[base], tip=base, confirmations=0, head=None)
        event = _event(a1, 0, 7)
        await store.append(conn, events=[event], blocks=[a1], tip=a1, confirmations=0, head=None)
        await conn.execute("UPDATE outbox SET published_at = now()")
        removed, retracted = await store.rollback_to(conn, base)
        assert (removed, retracted) == (1, 1)
        await conn.execute("UPDATE outbox SET published_at = now()")
        await store.append(conn, events=[event], blocks=[a1], tip=a1, confirmations=0, head=None)
        ids = [r["message_id"] for r in await conn.fetch("SELECT message_id FROM outbox ORDER BY seq")]
        assert ids == [event.id, f"{event.id}:removed", f"{event.id}#1"]
        await conn.execute("UPDATE outbox SET published_at = now()")
        await store.rollback_to(conn, base)
        ids = [r["message_id"] for r in await conn.fetch("SELECT message_id FROM outbox ORDER BY seq")]
        assert ids[-1] == f"{event.id}#1:removed"
        assert await conn.fetchval("SELECT count(*) FROM escrow_events") == 0
    finally:
        await conn.close()


async def test_unpublished_events_vanish_without_retraction(database_url: str) -> None:
    """Rows nobody saw (held back by confirmations) are deleted, not retracted."""
    store = IndexerStore(CHAIN, "events")
    conn = await connect(database_url)
    try:
        base, a1, a2 = _block(1), _block(2), _block(3)
        await store.append(conn, events=[], blocks=[base], tip=base, confirmations=2, head=None)
        await store.append(
            conn, events=[_event(a1, 0, 1), _event(a2, 0, 2)], blocks=[a1, a2], tip=a2, confirmations=2, head=None
        )
        removed, retracted = await store.rollback_to(conn, base)
        assert (removed, retracted) == (2, 0)
        assert await conn.fetchval("SELECT count(*) FROM outbox") == 0
        assert await conn.fetchval("SELECT block_number FROM chain_cursor WHERE chain_id = $1", CHAIN) == 1
        assert await conn.fetchval("SELECT count(*) FROM chain_blocks WHERE block_number > 1") == 0
    finally:
        await conn.close()


async def test_row_sent_but_never_marked_is_retracted(database_url: str) -> None:
    """The publisher died between Kafka's ack and marking the row: a reorg still retracts it."""
    store = IndexerStore(CHAIN, "events")
    conn = await connect(database_url)
    try:
        base, a1 = _block(1), _block(2)
        await store.append(conn, events=[], blocks=[base], tip=base, confirmations=0, head=None)
        event = _event(a1, 0, 9)
        await store.append(conn, events=[event], blocks=[a1], tip=a1, confirmations=0, head=None)
        await conn.execute("UPDATE outbox SET send_attempts = 1")  # what the publisher does before sending
        removed, retracted = await store.rollback_to(conn, base)
        assert (removed, retracted) == (1, 1)
        ids = [r["message_id"] for r in await conn.fetch("SELECT message_id FROM outbox ORDER BY seq")]
        assert ids == [f"{event.id}:removed"], "the unmarked original is not sent late; its retraction is"
    finally:
        await conn.close()
