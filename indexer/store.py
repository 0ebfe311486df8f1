"""The indexer's SQL: cursor, block hashes, the event log, and rollbacks.

Every write here runs in one transaction with the cursor move, so the database always
holds exactly the events of the blocks up to the cursor. The events table is the log the
publisher reads (`runtime.eventlog`): each row gets the chain's next position from the
counter on the cursor row, which the transaction locks first and holds until it commits,
so positions become visible in commit order and the publisher's watermark can never pass
a position whose transaction has not committed. A reorg deletes the rows past the common
ancestor and appends a retraction row for each one that may have been sent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg
import structlog

from indexer.decode import DecodedLog
from indexer.reorg import BlockRef
from runtime.eventlog import args_json
from runtime.finalstream import FINALITY_VIOLATIONS
from runtime.kafka import cloudevent_headers, iso_time
from runtime.outbox import NOTIFY_CHANNEL, OutboxMessage
from schemas import jsoncodec
from schemas.events import event_type, incarnation_id, message_key, retraction_id

log = structlog.get_logger(__name__)

T = TypeVar("T")


async def _copy_at_positions(
    conn: asyncpg.Connection, table: str, columns: Sequence[str], items: Sequence[T], last: int,
    record: Callable[[T, int], tuple[Any, ...]],
) -> None:
    """COPY `items` into `table`, each at its event-log position: the cursor row handed out the
    positions up to `last`, one per item, in order."""
    first = last - len(items) + 1
    await conn.copy_records_to_table(table, columns=columns, records=[record(x, first + i) for i, x in enumerate(items)])


class CursorMoved(Exception):
    """A window's write found the stored cursor at or past its tip: another writer moved it."""


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
    "position",
)

_TAIL_BATCH = 1024


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
    ) -> int:
        """Store a window: its events (the log rows), its block hashes, and the new cursor.

        The cursor row is written first: its `log_position` counter hands this window's
        events their positions, and its row lock keeps the next window's positions until
        this one has committed. Returns the last position handed out: the events are at the
        positions up to it, in order.
        """
        head_number = head.number if head is not None else tip.number
        head_timestamp = head.timestamp if head is not None else tip.timestamp
        async with conn.transaction():
            last = await conn.fetchval(
                "INSERT INTO chain_cursor (chain_id, block_number, block_hash, confirmations, head_number,"
                " head_timestamp, log_position, topic, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now())"
                " ON CONFLICT (chain_id) DO UPDATE SET block_number = EXCLUDED.block_number,"
                " block_hash = EXCLUDED.block_hash, confirmations = EXCLUDED.confirmations,"
                " head_number = EXCLUDED.head_number, head_timestamp = EXCLUDED.head_timestamp,"
                " log_position = chain_cursor.log_position + EXCLUDED.log_position, topic = EXCLUDED.topic,"
                " updated_at = now()"
                # Only forward (a reorg goes back through `rollback_to`), or the same block again
                # with nothing new: a second indexer writing this chain by mistake is refused
                # here, before any of its rows, instead of moving the cursor back.
                " WHERE chain_cursor.block_number < EXCLUDED.block_number"
                " OR (chain_cursor.block_number = EXCLUDED.block_number"
                " AND chain_cursor.block_hash = EXCLUDED.block_hash AND EXCLUDED.log_position = 0)"
                " RETURNING log_position",
                self.chain_id,
                tip.number,
                tip.hash,
                confirmations,
                max(head_number, tip.number),
                head_timestamp,
                len(events),
                self.topic,
            )
            if last is None:
                raise CursorMoved(
                    f"chain {self.chain_id}: the stored cursor is not below block {tip.number} any more;"
                    " another indexer is writing this chain"
                )
            if events:
                await _copy_at_positions(conn, "escrow_events", EVENT_COLUMNS, events, last, lambda e, position: (
                    e.id, e.chain_id, e.escrow_address, e.block_number, e.block_hash, e.block_timestamp, e.tx_hash,
                    e.tx_index, e.log_index, e.event, e.task_id, args_json(e), position,
                ))  # fmt: skip
            if blocks:
                await conn.copy_records_to_table(
                    "chain_blocks",
                    columns=("chain_id", "block_number", "block_hash", "parent_hash", "timestamp"),
                    records=[(self.chain_id, b.number, b.hash, b.parent_hash, b.timestamp) for b in blocks],
                )
            if tip.number % 64 == 0 or len(blocks) > 64:
                await conn.execute(
                    "DELETE FROM chain_blocks WHERE chain_id = $1 AND block_number < $2",
                    self.chain_id,
                    tip.number - self.keep_blocks,
                )
            # Also without events: a deeper cursor may release rows held back by confirmations.
            await conn.execute(f"NOTIFY {NOTIFY_CHANNEL}")
        return int(last)

    async def _tail(self, conn: asyncpg.Connection, above_block: int) -> list[asyncpg.Record]:
        """The log's events of blocks above `above_block`, newest first.

        Block numbers never decrease along the log (windows are appended in block order and a
        rollback deletes a whole tail), so they are its last rows: read backwards by position.
        """
        found: list[asyncpg.Record] = []
        before = 2**63 - 1
        while True:
            rows = await conn.fetch(
                "SELECT e.position, e.event_id, e.chain_id, e.escrow_address, e.block_number, e.block_hash,"
                " e.block_timestamp, e.tx_hash, e.tx_index, e.log_index, e.event_name, e.task_id, e.args"
                " FROM escrow_events e WHERE e.chain_id = $1 AND e.position < $2"
                " ORDER BY e.position DESC LIMIT $3",
                self.chain_id,
                before,
                _TAIL_BATCH,
            )
            for row in rows:
                if row["block_number"] <= above_block:
                    return found
                found.append(row)
            if len(rows) < _TAIL_BATCH:
                return found
            before = rows[-1]["position"]

    async def rollback_to(self, conn: asyncpg.Connection, ancestor: BlockRef) -> tuple[int, int]:
        """Forget everything past `ancestor`; retract what may have been published.

        Returns (events removed, retractions queued).
        """
        async with conn.transaction():
            # The publisher's row: locked, a batch is either wholly read and marked as being
            # sent before this (then it is behind `sending_through` and retracted below) or
            # read after this commits (then it no longer holds the removed rows).
            await conn.execute(
                "INSERT INTO event_log_watermarks (chain_id) VALUES ($1) ON CONFLICT DO NOTHING", self.chain_id
            )
            sending = await conn.fetchval(
                "SELECT sending_through FROM event_log_watermarks WHERE chain_id = $1 FOR UPDATE", self.chain_id
            )
            rows = await self._tail(conn, ancestor.number)
            removed_ids = [row["event_id"] for row in rows]
            final = await conn.fetchval("SELECT finalized_through FROM chain_cursor WHERE chain_id = $1", self.chain_id)
            if final is not None and (violations := sum(1 for row in rows if row["block_number"] <= final)):
                # The chain took back blocks it had called finalized: the finalized-only stream
                # has carried these events, and no retraction of them ever reaches it.
                FINALITY_VIOLATIONS.inc(violations)
                log.error("finality_violated", chain_id=self.chain_id, ancestor=ancestor.number,
                          finalized_through=final, events=violations)  # fmt: skip
            # Rows up to `sending_through` may be on Kafka (sent, or sent and the publisher died
            # before moving its watermark): each gets a retraction; the rest vanish unseen.
            maybe_sent = [row for row in rows if row["position"] <= sending]
            incarnations = await self._returns(conn, [row["event_id"] for row in maybe_sent])
            if removed_ids:
                await conn.execute(
                    "DELETE FROM escrow_events WHERE chain_id = $1 AND position >= $2 AND block_number > $3",
                    self.chain_id,
                    min(row["position"] for row in rows),
                    ancestor.number,
                )
                # Counted per removal (published or not): a comeback needs an id never used.
                await conn.execute(
                    "INSERT INTO event_retractions (event_id, retractions) SELECT unnest($1::text[]), 1"
                    " ON CONFLICT (event_id) DO UPDATE SET retractions = event_retractions.retractions + 1",
                    removed_ids,
                )
            await conn.execute(
                "DELETE FROM chain_blocks WHERE chain_id = $1 AND block_number > $2",
                self.chain_id,
                ancestor.number,
            )
            last = await conn.fetchval(
                "UPDATE chain_cursor SET block_number = $2, block_hash = $3, log_position = log_position + $4,"
                " updated_at = now() WHERE chain_id = $1 RETURNING log_position",
                self.chain_id,
                ancestor.number,
                ancestor.hash,
                len(maybe_sent),
            )
            if maybe_sent:
                names = ("escrow_address", "block_number", "block_hash", "block_timestamp", "tx_hash", "tx_index",
                         "log_index", "event_name", "task_id", "args")  # fmt: skip
                await _copy_at_positions(conn, "escrow_event_retractions", _RETRACTION_COLUMNS, maybe_sent, last,
                                         lambda row, position: (
                    self.chain_id, position, incarnation_id(row["event_id"], incarnations.get(row["event_id"], 0)),
                    row["event_id"], *(row[name] for name in names),
                ))  # fmt: skip
            await conn.execute(f"NOTIFY {NOTIFY_CHANNEL}")
        return len(rows), len(maybe_sent)

    async def _returns(self, conn: asyncpg.Connection, ids: Sequence[str]) -> dict[str, int]:
        """How many times each event was retracted before (non-zero only after A → B → A reorgs)."""
        if not ids:
            return {}
        rows = await conn.fetch(
            "SELECT event_id, retractions FROM event_retractions WHERE event_id = ANY($1::text[])", list(ids)
        )
        return {row["event_id"]: row["retractions"] for row in rows}

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


# A retraction row: where it stands in the log, the id it retracts, then the event's own columns.
_RETRACTION_COLUMNS = (
    "chain_id",
    "position",
    "retracted_as",
    *(c for c in EVENT_COLUMNS if c not in ("chain_id", "position")),
)
