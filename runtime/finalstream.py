"""The finalized-only stream: each chain's event log published again, to a topic of its own, once final.

Subscribers that never want to see a retraction read this topic instead of the events topic
(docs/subscribing.md). The messages are the events topic's, byte for byte (same ids, keys,
headers, bodies), and only events: an event reaches this stream once its block is at or
below the chain's finalized line (`chain_cursor.finalized_through`, written by the indexer
from the node's `finalized` tag, or the head minus `fallback_confirmations` where the node
has none), so a reorg never removes one, and the retractions of the events topic are skipped
(an event a reorg removed was never final, so it was never sent here). A chain that breaks
its own finality (a reorg below `finalized_through`; with `fallback_confirmations`, one deeper
than them) is the exception: the indexer counts every such event in
`escrowd_finality_violations_total` and logs `finality_violated`, and an alert asks an
operator to tell the stream's subscribers (docs/operations.md, "Finality violations").

Exactly once in effect, as the events topic: one publisher per database (an advisory lock),
a watermark row per (chain, topic) with `sending_through` committed before the send and
`published_through` moved after the acks; a crash between the two re-sends under the same ids.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import structlog
from prometheus_client import Counter, Gauge

from runtime.aio import wait_event
from runtime.eventlog import MessageBuilder, read_after
from runtime.leader import run_as_leader
from runtime.outbox import OutboxPublisher

log = structlog.get_logger(__name__)

_STREAM_LOCK = 0x66696E6C  # "finl"

FINAL_PUBLISHED = Counter(
    "escrowd_finalized_stream_published_total", "Events published to the finalized-only stream", ["topic"]
)
FINAL_BLOCK = Gauge(
    "escrowd_finalized_stream_line", "The finalized line the finalized-only stream publishes up to", ["chain_id"]
)

FINALITY_VIOLATIONS = Counter(
    "escrowd_finality_violations_total",
    "Events a reorg removed from blocks at or below the chain's finalized line (counted by the indexer)",
)
"""The finalized-only stream published those events and drops their retractions (they are
below its line): its subscribers keep events that no longer exist. At 0 from start."""

_CHAINS_SQL = """
SELECT c.chain_id, c.log_position, w.published_through FROM chain_cursor c
LEFT JOIN event_log_stream_watermarks w ON w.chain_id = c.chain_id AND w.topic = $1
WHERE c.topic IS NOT NULL AND c.finalized_through IS NOT NULL
"""


class FinalizedStream:
    """Publishes every chain's final events to `topic` (see the module)."""

    def __init__(
        self,
        database_url: str,
        publisher: OutboxPublisher,
        topic: str,
        *,
        interval: float = 0.2,
        batch_size: int = 500,
    ) -> None:
        self._url = database_url
        self._publisher = publisher
        self.topic = topic
        FINAL_PUBLISHED.labels(topic)  # at 0 from start: the first message moves the rate
        self._interval = interval
        self._batch_size = batch_size
        self._builder = MessageBuilder()
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        """Ask `run` to return after the batch in flight."""
        self._stopping.set()

    async def run(self) -> None:
        """Lead (or wait as a standby) and publish until stopped."""
        await run_as_leader(self._url, _STREAM_LOCK, self._stopping, self._publish, name="finalized_stream")

    async def _publish(self, conn: asyncpg.Connection) -> None:
        while not self._stopping.is_set():
            if not await self.publish_once(conn):
                await wait_event(self._stopping, self._interval)

    async def publish_once(self, conn: asyncpg.Connection) -> int:
        """One batch per chain with final events past its watermark; how many were sent."""
        total = 0
        for chain in await conn.fetch(_CHAINS_SQL, self.topic):
            if chain["published_through"] is None:
                await conn.execute(
                    "INSERT INTO event_log_stream_watermarks (chain_id, topic) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                    chain["chain_id"],
                    self.topic,
                )
            elif chain["log_position"] <= chain["published_through"]:
                continue
            total += await self._publish_chain(conn, chain["chain_id"])
        return total

    async def _publish_chain(self, conn: asyncpg.Connection, chain_id: int) -> int:
        async with conn.transaction():
            mark = await conn.fetchrow(
                "SELECT published_through FROM event_log_stream_watermarks WHERE chain_id = $1 AND topic = $2"
                " FOR UPDATE",
                chain_id,
                self.topic,
            )
            line = await conn.fetchval(
                "SELECT least(block_number, finalized_through) FROM chain_cursor WHERE chain_id = $1", chain_id
            )
            if mark is None or line is None:
                return 0
            FINAL_BLOCK.labels(str(chain_id)).set(line)
            # Every row is held back above the line (sent_through 0): retractions pass the
            # line, and are dropped below.
            messages = await read_after(
                conn, chain_id, mark["published_through"], self._batch_size, line=line, builder=self._builder
            )
            if not messages:
                return 0
            through = messages[-1].position
            await conn.execute(
                "UPDATE event_log_stream_watermarks SET sending_through = GREATEST(sending_through, $3),"
                " updated_at = now() WHERE chain_id = $1 AND topic = $2",
                chain_id,
                self.topic,
                through,
            )
        events = [m for m in messages if m.block_number is not None]
        if events:
            acks: asyncio.Future[Any] = await self._publisher.send(
                [(self.topic, m.key, m.payload, m.headers) for m in events]
            )
            await acks
        await conn.execute(
            "UPDATE event_log_stream_watermarks SET published_through = GREATEST(published_through, $3),"
            " updated_at = now() WHERE chain_id = $1 AND topic = $2",
            chain_id,
            self.topic,
            through,
        )
        FINAL_PUBLISHED.labels(self.topic).inc(len(events))
        return len(events)
