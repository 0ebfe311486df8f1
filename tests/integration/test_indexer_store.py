"""The indexer's SQL on a real PostgreSQL: rollbacks, retractions, and events that come back."""

from __future__ import annotations

import asyncpg
import pytest

from indexer.decode import DecodedLog
from indexer.reorg import BlockRef
from indexer.store import CursorMoved, IndexerStore
from runtime.db import connect
from runtime.eventlog import read_after
from schemas.events import event_id

CHAIN = 31337


async def _mark_sending(conn: asyncpg.Connection) -> list[str]:
    """What the publisher does before a send: read the log past the watermark, record the attempt."""
    after = await conn.fetchval(
        "SELECT COALESCE((SELECT published_through FROM event_log_watermarks WHERE chain_id = $1), 0)", CHAIN
    )
    line = await conn.fetchval("SELECT block_number - confirmations FROM chain_cursor WHERE chain_id = $1", CHAIN)
    messages = await read_after(conn, CHAIN, after, 10_000, line=line)
    if messages:
        await conn.execute(
            "INSERT INTO event_log_watermarks (chain_id, sending_through) VALUES ($1, $2)"
            " ON CONFLICT (chain_id) DO UPDATE SET sending_through = EXCLUDED.sending_through",
            CHAIN,
            messages[-1].position,
        )
    return [m.message_id for m in messages]


async def _publish(conn: asyncpg.Connection) -> list[str]:
    """What the publisher does around a send: mark the attempt, then (acked) move the watermark."""
    ids = await _mark_sending(conn)
    await conn.execute(
        "UPDATE event_log_watermarks SET published_through = sending_through WHERE chain_id = $1", CHAIN
    )
    return ids


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
        ids = await _publish(conn)
        removed, retracted = await store.rollback_to(conn, base)
        assert (removed, retracted) == (1, 1)
        ids += await _publish(conn)
        await store.append(conn, events=[event], blocks=[a1], tip=a1, confirmations=0, head=None)
        ids += await _mark_sending(conn)
        assert ids == [event.id, f"{event.id}:removed", f"{event.id}#1"]
        await _publish(conn)
        await store.rollback_to(conn, base)
        ids += await _publish(conn)
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
        assert await _publish(conn) == []  # held back: neither block is two deep
        removed, retracted = await store.rollback_to(conn, base)
        assert (removed, retracted) == (2, 0)
        assert await conn.fetchval("SELECT count(*) FROM event_log_messages") == 0
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
        assert await _mark_sending(conn) == [event.id]  # what the publisher does before sending
        removed, retracted = await store.rollback_to(conn, base)
        assert (removed, retracted) == (1, 1)
        ids = await _publish(conn)
        assert ids == [f"{event.id}:removed"], "the unmarked original is not sent late; its retraction is"
    finally:
        await conn.close()


async def test_a_second_writer_on_the_chain_is_refused_before_any_row(database_url: str) -> None:
    """Two indexers on one chain by mistake: the one behind cannot move the cursor back, nor
    store a window again; it is told so (and reloads), and the log keeps one copy of each event."""
    ahead, behind = IndexerStore(CHAIN, "events"), IndexerStore(CHAIN, "events")
    first, second = await connect(database_url), await connect(database_url)
    try:
        base, a1, a2 = _block(1), _block(2), _block(3)
        await ahead.append(first, events=[], blocks=[base], tip=base, confirmations=0, head=None)
        await ahead.append(first, events=[_event(a1, 0, 7)], blocks=[a1], tip=a1, confirmations=0, head=None)
        await ahead.append(first, events=[_event(a2, 0, 8)], blocks=[a2], tip=a2, confirmations=0, head=None)
        # The process behind still believes the cursor is at block 1 (or 2).
        with pytest.raises(CursorMoved, match="another indexer"):
            await behind.append(second, events=[_event(a1, 0, 7)], blocks=[a1], tip=a1, confirmations=0, head=None)
        with pytest.raises(CursorMoved):
            await behind.append(second, events=[_event(a2, 0, 8)], blocks=[a2], tip=a2, confirmations=0, head=None)
        with pytest.raises(CursorMoved):  # the same height on another fork is a reorg, not a write
            await behind.append(second, events=[], blocks=[_block(3, "b")], tip=_block(3, "b"), confirmations=0, head=None)
        # The same block again with nothing new is harmless (and allowed).
        await ahead.append(first, events=[], blocks=[], tip=a2, confirmations=0, head=None)
        cursor = await ahead.load_cursor(first)
        assert cursor is not None and (cursor.number, cursor.hash) == (a2.number, a2.hash)
        rows = await first.fetch("SELECT event_id, position FROM escrow_events ORDER BY position")
        assert [r["event_id"] for r in rows] == [_event(a1, 0, 7).id, _event(a2, 0, 8).id]
        assert [r["position"] for r in rows] == [1, 2]
    finally:
        await first.close()
        await second.close()
