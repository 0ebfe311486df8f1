"""The indexer's SQL: cursor, block hashes, events and their outbox rows, and rollbacks.

Every write here runs in one transaction with the cursor move, so the database always
holds exactly the events of the blocks up to the cursor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from indexer.decode import DecodedLog
from indexer.reorg import BlockRef
from runtime.kafka import cloudevent_headers, iso_time
from runtime.outbox import NOTIFY_CHANNEL, OUTBOX_COLUMNS, SENDING_LOCK, OutboxMessage
from schemas import jsoncodec
from schemas.events import event_type, incarnation_id, message_key, retraction_id

EVENT_COLUMNS = (
    "event_id",
    "chain_id",
    "escrow_address",
    "block_number",
    "block_hash",
    "block_timestamp",
    "tx_hash",
    "tx_index",
    "log_index",
    "event_name",
    "task_id",
    "args",
)


@dataclass(frozen=True)
class Cursor:
    """The last block whose events are stored."""

    number: int
    hash: str


def event_payload(event: DecodedLog, *, removed: bool = False) -> bytes:
    """The JSON body of an `EscrowEventMessage` (built directly: this is the hot path)."""
    return jsoncodec.dumps(
        {
            "id": event.id,
            "chain_id": event.chain_id,
            "escrow_address": event.escrow_address,
            "block_number": event.block_number,
            "block_hash": event.block_hash,
            "block_timestamp": event.block_timestamp,
            "tx_hash": event.tx_hash,
            "tx_index": event.tx_index,
            "log_index": event.log_index,
            "event": event.event,
            "task_id": event.task_id,
            "args": event.args,
            "removed": removed,
        }
    )


def event_message(
    event: DecodedLog, topic: str, *, removed: bool = False, message_id: str | None = None
) -> OutboxMessage:
    """The outbox row publishing `event` (or, with `removed`, retracting message `message_id`)."""
    published_as = message_id or event.id
    message_id = retraction_id(published_as) if removed else published_as
    headers = cloudevent_headers(
        id=message_id,
        source=f"escrowd/indexer/{event.chain_id}/{event.escrow_address}",
        type=event_type(event.event),
        subject=str(event.task_id) if event.task_id is not None else None,
        time=iso_time(event.block_timestamp),
    )
    return OutboxMessage(
        message_id=message_id,
        topic=topic,
        key=message_key(event.chain_id, event.task_id, event.escrow_address),
        payload=event_payload(event, removed=removed),
        headers=headers,
        chain_id=event.chain_id,
        # Retractions are not held back: the consumers must hear of them at once.
        block_number=None if removed else event.block_number,
        event_id=event.id,
    )


def _args_json(args: dict[str, object]) -> str:
    return jsoncodec.dumps_str(args)


class IndexerStore:
    """SQL of one chain's indexer."""

    def __init__(self, chain_id: int, topic: str, *, keep_blocks: int = 512) -> None:
        self.chain_id = chain_id
        self.topic = topic
        self.keep_blocks = keep_blocks

    async def load_cursor(self, conn: asyncpg.Connection) -> Cursor | None:
        """The stored cursor, or None before the first batch."""
        row = await conn.fetchrow(
            "SELECT block_number, block_hash FROM chain_cursor WHERE chain_id = $1", self.chain_id
        )
        return None if row is None else Cursor(row["block_number"], row["block_hash"])

    async def stored_hashes(self, conn: asyncpg.Connection, below_or_at: int, limit: int) -> dict[int, str]:
        """Stored block hashes at or below a height, newest first, at most `limit`."""
        rows = await conn.fetch(
            "SELECT block_number, block_hash FROM chain_blocks WHERE chain_id = $1 AND block_number <= $2"
            " ORDER BY block_number DESC LIMIT $3",
            self.chain_id,
            below_or_at,
            limit,
        )
        return {row["block_number"]: row["block_hash"] for row in rows}

    async def append(
        self,
        conn: asyncpg.Connection,
        *,
        events: Sequence[DecodedLog],
        blocks: Sequence[BlockRef],
        tip: BlockRef,
        confirmations: int,
        head: BlockRef | None,
    ) -> None:
        """Store a window: its events, their outbox rows, its block hashes, and the new cursor."""
        async with conn.transaction():
            if events:
                await conn.copy_records_to_table(
                    "escrow_events",
                    columns=EVENT_COLUMNS,
                    records=[
                        (
                            e.id,
                            e.chain_id,
                            e.escrow_address,
                            e.block_number,
                            e.block_hash,
                            e.block_timestamp,
                            e.tx_hash,
                            e.tx_index,
                            e.log_index,
                            e.event,
                            e.task_id,
                            _args_json(e.args),
                        )
                        for e in events
                    ],
                )
                returns = await self._returns(conn, events)
                await conn.copy_records_to_table(
                    "outbox",
                    columns=OUTBOX_COLUMNS,
                    records=[
                        event_message(e, self.topic, message_id=incarnation_id(e.id, returns.get(e.id, 0))).as_record()
                        for e in events
                    ],
                )
            if blocks:
                await conn.copy_records_to_table(
                    "chain_blocks",
                    columns=("chain_id", "block_number", "block_hash", "parent_hash", "timestamp"),
                    records=[(self.chain_id, b.number, b.hash, b.parent_hash, b.timestamp) for b in blocks],
                )
            head_number = head.number if head is not None else tip.number
            head_timestamp = head.timestamp if head is not None else tip.timestamp
            await conn.execute(
                "INSERT INTO chain_cursor (chain_id, block_number, block_hash, confirmations, head_number,"
                " head_timestamp, updated_at) VALUES ($1, $2, $3, $4, $5, $6, now())"
                " ON CONFLICT (chain_id) DO UPDATE SET block_number = EXCLUDED.block_number,"
                " block_hash = EXCLUDED.block_hash, confirmations = EXCLUDED.confirmations,"
                " head_number = EXCLUDED.head_number, head_timestamp = EXCLUDED.head_timestamp,"
                " updated_at = now()",
                self.chain_id,
                tip.number,
                tip.hash,
                confirmations,
                max(head_number, tip.number),
                head_timestamp,
            )
            if tip.number % 64 == 0 or len(blocks) > 64:
                await conn.execute(
                    "DELETE FROM chain_blocks WHERE chain_id = $1 AND block_number < $2",
                    self.chain_id,
                    tip.number - self.keep_blocks,
                )
            await conn.execute(f"NOTIFY {NOTIFY_CHANNEL}")

    async def _returns(self, conn: asyncpg.Connection, events: Sequence[DecodedLog]) -> dict[str, int]:
        """How many times each event was retracted before (non-zero only after A → B → A reorgs)."""
        rows = await conn.fetch(
            "SELECT event_id, retractions FROM event_retractions WHERE event_id = ANY($1::text[])",
            [e.id for e in events],
        )
        return {row["event_id"]: row["retractions"] for row in rows}

    async def rollback_to(self, conn: asyncpg.Connection, ancestor: BlockRef) -> tuple[int, int]:
        """Forget everything past `ancestor`; retract what was published.

        Returns (events removed, retractions queued).
        """
        async with conn.transaction():
            # Wait for a publisher batch in flight: its rows count as published once marked.
            # Without this, rows being sent looked unpublished and were deleted unretracted.
            await conn.execute("SELECT pg_advisory_xact_lock($1)", SENDING_LOCK)
            rows = await conn.fetch(
                "SELECT e.event_id, e.chain_id, e.escrow_address, e.block_number, e.block_hash,"
                " e.block_timestamp, e.tx_hash, e.tx_index, e.log_index, e.event_name, e.task_id, e.args,"
                " (SELECT o.message_id FROM outbox o WHERE o.event_id = e.event_id AND o.topic = $3"
                "  AND (o.published_at IS NOT NULL OR o.send_attempts > 0)"
                "  AND o.message_id NOT LIKE '%:removed'"
                "  ORDER BY o.seq DESC LIMIT 1) AS published_as"
                " FROM escrow_events e WHERE e.chain_id = $1 AND e.block_number > $2"
                " ORDER BY e.block_number DESC, e.log_index DESC",
                self.chain_id,
                ancestor.number,
                self.topic,
            )
            retractions = [
                event_message(
                    _row_to_event(row), self.topic, removed=True, message_id=row["published_as"]
                ).as_record()
                for row in rows
                if row["published_as"] is not None
            ]
            removed_ids = [row["event_id"] for row in rows]
            if removed_ids:
                # Unpublished rows of removed events vanish. A row whose send was attempted
                # but never marked (the publisher died before the ack was recorded) may have
                # reached Kafka: it is retracted above, and must not be sent late either.
                await conn.execute(
                    "DELETE FROM outbox WHERE event_id = ANY($1::text[]) AND published_at IS NULL"
                    " AND topic = $2",
                    removed_ids,
                    self.topic,
                )
                await conn.execute(
                    "DELETE FROM escrow_events WHERE chain_id = $1 AND block_number > $2",
                    self.chain_id,
                    ancestor.number,
                )
            if removed_ids:
                # Counted per removal (published or not): a comeback needs an id never used.
                await conn.execute(
                    "INSERT INTO event_retractions (event_id, retractions) SELECT unnest($1::text[]), 1"
                    " ON CONFLICT (event_id) DO UPDATE SET retractions = event_retractions.retractions + 1",
                    removed_ids,
                )
            if retractions:
                await conn.executemany(
                    "INSERT INTO outbox (message_id, topic, key, headers, payload, chain_id, block_number,"
                    " event_id) VALUES ($1, $2, $3, $4::text::jsonb, $5, $6, $7, $8)"
                    " ON CONFLICT (topic, message_id) DO NOTHING",
                    retractions,
                )
            await conn.execute(
                "DELETE FROM chain_blocks WHERE chain_id = $1 AND block_number > $2",
                self.chain_id,
                ancestor.number,
            )
            await conn.execute(
                "UPDATE chain_cursor SET block_number = $2, block_hash = $3, updated_at = now()"
                " WHERE chain_id = $1",
                self.chain_id,
                ancestor.number,
                ancestor.hash,
            )
            await conn.execute(f"NOTIFY {NOTIFY_CHANNEL}")
        return len(rows), len(retractions)

    async def block(self, conn: asyncpg.Connection, number: int) -> BlockRef | None:
        """A stored block."""
        row = await conn.fetchrow(
            "SELECT block_number, block_hash, parent_hash, timestamp FROM chain_blocks"
            " WHERE chain_id = $1 AND block_number = $2",
            self.chain_id,
            number,
        )
        if row is None:
            return None
        return BlockRef(row["block_number"], row["block_hash"], row["parent_hash"], row["timestamp"])


def _row_to_event(row: asyncpg.Record) -> DecodedLog:
    return DecodedLog(
        id=row["event_id"],
        chain_id=row["chain_id"],
        escrow_address=row["escrow_address"],
        block_number=row["block_number"],
        block_hash=row["block_hash"],
        block_timestamp=row["block_timestamp"],
        tx_hash=row["tx_hash"],
        tx_index=row["tx_index"],
        log_index=row["log_index"],
        event=row["event_name"],
        task_id=int(row["task_id"]) if row["task_id"] is not None else None,
        args=row["args"],
    )
