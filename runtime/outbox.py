"""The transactional outbox: rows written with the effects that caused them, drained to Kafka.

Writers call `enqueue` inside the transaction that makes their effect durable. One
`OutboxPublisher` per database (an advisory lock elects it) sends pending rows in `seq`
order, awaits every send of a batch, then marks the batch published. A crash between the
send and the mark republishes the batch: consumers deduplicate on `ce_id`, so the effect is
exactly once. Rows that carry a chain block wait until that block is `confirmations` deep
(the depth is the one the indexer stored on its cursor row).

The same publisher drains the indexer's event log (`runtime.eventlog`): each chain's
`escrow_events` rows by position, behind one watermark row per chain instead of an outbox
row per event.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import orjson
import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner, murmur2
from prometheus_client import Counter, Gauge, Histogram

from runtime.aio import wait_event
from runtime.db import is_connection_error
from runtime.eventlog import (
    INCARNATIONS_SQL,
    UNPUBLISHED_SQL,
    LogEvent,
    LogMessage,
    MessageBuilder,
    read_after,
)
from schemas import jsoncodec

log = structlog.get_logger(__name__)

NOTIFY_CHANNEL = "escrowd_outbox"
_PUBLISHER_LOCK = 0x6F757462  # "outb"

OUTBOX_PUBLISHED = Counter(
    "escrowd_outbox_published_total", "Outbox messages sent to Kafka and marked published", ["topic"]
)
OUTBOX_PENDING = Gauge("escrowd_outbox_pending", "Outbox rows not yet published")
OUTBOX_OLDEST_AGE = Gauge(
    "escrowd_outbox_oldest_age_seconds", "Age of the oldest unpublished outbox row"
)
PUBLISHED_BLOCK = Gauge(
    "escrowd_indexer_published_block", "Highest block whose events were published", ["chain_id"]
)
OUTBOX_SEND_ERRORS = Counter("escrowd_outbox_send_errors_total", "Failed outbox batch sends")
LOG_BATCHES = Counter(
    "escrowd_outbox_log_batches_total",
    "Event-log batches published, by where they were read: the windows the indexer handed"
    " over in memory, or the database (after a restart, or behind)",
    ["source"],
)
OUTBOX_BATCH_SECONDS = Histogram(
    "escrowd_outbox_batch_seconds",
    "Time to send and mark one outbox batch",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)


_Item = tuple[str, bytes | None, bytes, list[tuple[str, bytes]]]
"""One message to send: topic, key, payload, encoded headers."""

_MEMORY_CHECK_SQL = """
SELECT c.block_number - c.confirmations AS line,
       EXISTS (SELECT 1 FROM escrow_events e WHERE e.chain_id = $1 AND e.position = $2 AND e.event_id = $3) AS present,
       EXISTS (SELECT 1 FROM event_retractions) AS returns
FROM chain_cursor c WHERE c.chain_id = $1
"""
"""Under the watermark lock, for a batch taken from memory: the confirmation line, whether
the batch's last event is still in the log (a rollback deletes a tail, and block numbers
never decrease along the log, so if the last is there every earlier one is), and whether
any event ever came back after a reorg (only then are incarnations looked up)."""


@dataclass(slots=True)
class _Window:
    """Events the indexer committed at positions `first`, `first + 1`, ... (in order)."""

    first: int
    events: Sequence[LogEvent]

    @property
    def last(self) -> int:
        return self.first + len(self.events) - 1


@dataclass(slots=True)
class _Committed:
    """One chain's committed windows not yet published, oldest first."""

    windows: deque[_Window] = field(default_factory=deque)
    count: int = 0

    def drop_through(self, position: int) -> None:
        """Forget the windows wholly at or before `position` (published, or read from the database)."""
        windows = self.windows
        while windows and windows[0].last <= position:
            self.count -= len(windows.popleft().events)


@dataclass(frozen=True)
class OutboxMessage:
    """One message to publish."""

    message_id: str
    topic: str
    key: bytes | None
    payload: bytes
    headers: dict[str, str]
    chain_id: int | None = None
    block_number: int | None = None
    event_id: str | None = None

    def as_record(self) -> tuple[Any, ...]:
        """Column values in `OUTBOX_COLUMNS` order (for COPY)."""
        return (
            self.message_id,
            self.topic,
            self.key,
            jsoncodec.dumps_str(self.headers),
            self.payload,
            self.chain_id,
            self.block_number,
            self.event_id,
        )


OUTBOX_COLUMNS = (
    "message_id",
    "topic",
    "key",
    "headers",
    "payload",
    "chain_id",
    "block_number",
    "event_id",
)


async def enqueue(conn: asyncpg.Connection, messages: list[OutboxMessage], *, notify: bool = True) -> None:
    """Insert outbox rows inside the caller's transaction (a duplicate message id is ignored)."""
    if not messages:
        return
    await conn.executemany(
        "INSERT INTO outbox (message_id, topic, key, headers, payload, chain_id, block_number, event_id)"
        " VALUES ($1, $2, $3, $4::text::jsonb, $5, $6, $7, $8) ON CONFLICT (topic, message_id) DO NOTHING",
        [m.as_record() for m in messages],
    )
    if notify:
        await conn.execute(f"NOTIFY {NOTIFY_CHANNEL}")


async def copy_into_outbox(conn: asyncpg.Connection, messages: list[OutboxMessage]) -> None:
    """Bulk-insert outbox rows with COPY (the ids must be new)."""
    if not messages:
        return
    await conn.copy_records_to_table(
        "outbox", records=[m.as_record() for m in messages], columns=OUTBOX_COLUMNS
    )
    await conn.execute(f"NOTIFY {NOTIFY_CHANNEL}")


_PENDING_SQL = """
WITH pending AS (
    SELECT o.seq
    FROM outbox o
    LEFT JOIN chain_cursor c ON c.chain_id = o.chain_id
    WHERE o.published_at IS NULL
      AND (o.block_number IS NULL OR o.block_number <= c.block_number - c.confirmations)
    ORDER BY o.seq
    LIMIT $1 + cardinality($2::bigint[])
), picked AS (
    SELECT seq FROM pending EXCEPT SELECT unnest($2::bigint[])
    ORDER BY seq
    LIMIT $1
)
UPDATE outbox o SET send_attempts = o.send_attempts + 1
FROM picked WHERE o.seq = picked.seq
RETURNING o.seq, o.topic, o.key, o.headers::text AS headers, o.payload, o.chain_id, o.block_number
"""
"""Pick the next rows, the lowest publishable seqs but those sent and not yet marked ($2),
and record, before anything is sent, that a send is being attempted: a reorg rollback
retracts such rows even when the publisher died before marking them.

Never a cursor past the last batch: a row whose transaction was still open when a batch of
higher seqs was read is the lowest pending row once it commits, and goes out in the next
batch, ahead of every row committed after it. A writer whose rows of one key must keep
their order takes a lock on the key before it enqueues them (the reputation consumer, per
agent): their seqs are then in commit order, and so is the topic."""


class OutboxPublisher:
    """Drains the outbox to Kafka. Run one per database; extra instances wait as standbys."""

    def __init__(
        self,
        database_url: str,
        producer: AIOKafkaProducer,
        *,
        batch_size: int = 2000,
        idle_poll_seconds: float = 0.25,
        batches_per_cycle: int = 16,
        memory_batch_size: int = 10_000,
        memory_limit: int = 40_000,
    ) -> None:
        self._database_url = database_url
        self._producer = producer
        self._batch_size = batch_size
        # A batch from memory costs one lock, one check and one watermark move whatever its
        # size, and its messages are built without a read: take up to a whole committed
        # window (the indexer's `commit_rows`) at once. The database path keeps `batch_size`.
        self._memory_batch_size = memory_batch_size
        self._idle_poll_seconds = idle_poll_seconds
        self._batches_per_cycle = batches_per_cycle
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._partitioner = KeyPartitioner()
        self._header_values: dict[str, bytes] = {}
        self._builder = MessageBuilder()
        # Committed windows handed over by the indexer in this process (`committed`), per
        # chain, at most `memory_limit` events; none kept while `run` waits for the lock (a
        # standby) or has returned.
        self._memory_limit = memory_limit
        self._committed: dict[int, _Committed] = {}
        self._standby = False

    def committed(self, chain_id: int, last: int, events: Sequence[LogEvent]) -> None:
        """The indexer committed `events` at the log positions up to `last`: publish them
        from memory instead of reading them back (`_publish_log` checks, under the watermark
        lock, that they are still in the log). Called only after the commit."""
        if events and not self._standby:
            held = self._committed.setdefault(chain_id, _Committed())
            held.windows.append(_Window(last - len(events) + 1, events))
            held.count += len(events)
            # Behind (or a standby's backlog): keep the newest; the rest is read from the log.
            while held.count > self._memory_limit and len(held.windows) > 1:
                held.count -= len(held.windows.popleft().events)
        self._wake.set()

    def _from_memory(self, chain_id: int, after: int) -> list[tuple[int, LogEvent]]:
        """The next batch after position `after` from the committed windows in memory, or
        [] when memory does not hold the very next position (a restart, a rollback's hole or
        retractions, or windows dropped while behind: the database has them)."""
        held = self._committed.get(chain_id)
        if held is None:
            return []
        held.drop_through(after)
        batch: list[tuple[int, LogEvent]] = []
        position = after + 1
        for window in held.windows:
            if window.first > position or window.last < position:
                break  # not contiguous: what lies between is only in the database
            size = self._memory_batch_size
            take = window.events[position - window.first : position - window.first + size - len(batch)]
            batch.extend(zip(range(position, position + len(take)), take, strict=True))
            position += len(take)
            if len(batch) >= size:
                break
        return batch

    def stop(self) -> None:
        """Ask `run` to return after the batch in flight."""
        self._stopping.set()
        self._wake.set()

    async def run(self) -> None:
        """Publish until stopped, reconnecting to the database and the broker as needed."""
        from runtime.db import connect

        while not self._stopping.is_set():
            conn: asyncpg.Connection | None = None
            self._standby = True
            try:
                conn = await connect(self._database_url)
                await conn.execute("SELECT pg_advisory_lock($1)", _PUBLISHER_LOCK)
                await conn.add_listener(NOTIFY_CHANNEL, self._on_notify)
                log.info("outbox_publisher_started")
                self._standby = False
                await self._drain_forever(conn)
            except Exception as exc:
                if not (is_connection_error(exc) or _is_kafka_error(exc)):
                    raise
                OUTBOX_SEND_ERRORS.inc()
                log.warning("outbox_publisher_retry", error=repr(exc))
                await asyncio.sleep(0.5)
            finally:
                # Whatever was handed over is in the log: the next instance reads it there.
                self._standby = True
                self._committed.clear()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=2)

    def _on_notify(self, *_: object) -> None:
        self._wake.set()

    async def _drain_forever(self, conn: asyncpg.Connection) -> None:
        last_gauge = 0.0
        while not self._stopping.is_set():
            sent = await self.publish_cycle(conn)
            now = time.monotonic()
            if now - last_gauge > 1.0:
                await self._update_gauges(conn)
                last_gauge = now
            if sent == 0:
                self._wake.clear()
                await wait_event(self._wake, self._idle_poll_seconds)

    async def publish_batch(self, conn: asyncpg.Connection) -> int:
        """Send one batch of publishable rows, await every ack, mark them; return how many."""
        return await self.publish_cycle(conn, max_batches=1)

    async def publish_cycle(self, conn: asyncpg.Connection, *, max_batches: int | None = None) -> int:
        """Send batches back to back; the acks and marking of one overlap the next's send.

        Outbox rows go out in `seq` order (one producer keeps per-partition order), each
        batch the lowest pending rows but those already in flight (`_PENDING_SQL`): a row
        whose transaction committed late goes out in the next batch, ahead of every row
        committed after it, and so does a row released by confirmations. Then each chain's
        event log, past its watermark (`publish_logs`). (Outbox rows are never deleted unsent: the reorg rollback that did
        works on the event log, under the watermark row's lock.)
        """
        limit = max_batches or self._batches_per_cycle
        total = await self._publish_outbox(conn, limit)
        return total + await self.publish_logs(conn, max_batches=limit)

    async def _publish_outbox(self, conn: asyncpg.Connection, limit: int) -> int:
        in_flight: deque[tuple[list[asyncpg.Record], asyncio.Future[Any], float]] = deque()
        total = 0
        try:
            for _ in range(limit):
                sending = [row["seq"] for batch, _, _ in in_flight for row in batch]
                rows = sorted(await conn.fetch(_PENDING_SQL, self._batch_size, sending), key=lambda r: r["seq"])
                if not rows:
                    break
                started = time.perf_counter()
                in_flight.append((rows, await self._send([_outbox_item(self, r) for r in rows]), started))
                if len(in_flight) > 1:
                    total += await self._complete(conn, *in_flight.popleft())
            while in_flight:
                total += await self._complete(conn, *in_flight.popleft())
        finally:
            for _, acks, _ in in_flight:  # after a failure: collect, never leave them unawaited
                with contextlib.suppress(BaseException):
                    await acks
        return total

    def _headers(self, raw: str) -> list[tuple[str, bytes]]:
        # Most header values (spec version, source, type, content type) repeat from row to
        # row: each distinct value is encoded once (the cache is cleared when it grows).
        cache = self._header_values
        if len(cache) > 4096:
            cache.clear()
        out = []
        for name, value in orjson.loads(raw).items():
            encoded = cache.get(value)
            if encoded is None:
                encoded = cache[value] = value.encode()
            out.append((name, encoded))
        return out

    async def send(self, items: list[_Item]) -> asyncio.Future[Any]:
        """Queue messages as the publisher does (`_send`), for another stream of the same log."""
        return await self._send(items)

    async def _send(self, items: list[_Item]) -> asyncio.Future[Any]:
        return await send_batches(self._producer, items, self._partitioner)

    # -- the indexer's event logs -------------------------------------------------------

    async def publish_logs(self, conn: asyncpg.Connection, *, max_batches: int | None = None) -> int:
        """Publish every chain's event log past its watermark; return how many messages."""
        chains = await conn.fetch(
            "SELECT c.chain_id, c.topic, c.log_position, w.published_through FROM chain_cursor c"
            " LEFT JOIN event_log_watermarks w ON w.chain_id = c.chain_id WHERE c.topic IS NOT NULL"
        )
        total = 0
        for chain in chains:
            if chain["published_through"] is None:
                await conn.execute(
                    "INSERT INTO event_log_watermarks (chain_id) VALUES ($1) ON CONFLICT DO NOTHING", chain["chain_id"]
                )
            elif chain["log_position"] <= chain["published_through"]:
                continue
            total += await self._publish_log(
                conn, chain["chain_id"], chain["topic"], max_batches or self._batches_per_cycle
            )
        return total

    async def _publish_log(self, conn: asyncpg.Connection, chain_id: int, topic: str, limit: int) -> int:
        """Batches of one chain's log: mark `sending_through`, send, await, move `published_through`.

        The acks and watermark move of one batch overlap the next batch's send; the watermark
        only moves forward, batch after batch, in log order.
        """
        in_flight: deque[tuple[list[LogMessage], asyncio.Future[Any], float]] = deque()
        total = 0
        after: int | None = None
        try:
            for _ in range(limit):
                started = time.perf_counter()
                async with conn.transaction():
                    # The rollback of a reorg takes the same row lock: a batch is read and marked
                    # as being sent either wholly before a rollback or wholly after it.
                    mark = await conn.fetchrow(
                        "SELECT published_through, sending_through FROM event_log_watermarks"
                        " WHERE chain_id = $1 FOR UPDATE",
                        chain_id,
                    )
                    published = mark["published_through"] if mark is not None else None
                    if published is None:
                        break
                    if after is None:
                        after = published
                    sent_through = mark["sending_through"]
                    messages = await self._read_memory(conn, chain_id, after, sent_through)
                    if messages is None:
                        # Read once the lock is held: after a rollback, its cursor (and line).
                        line = await conn.fetchval(
                            "SELECT block_number - confirmations FROM chain_cursor WHERE chain_id = $1", chain_id
                        )
                        if line is None:
                            break
                        messages = await read_after(
                            conn, chain_id, after, self._batch_size, line=line, sent_through=sent_through,
                            builder=self._builder,
                        )  # fmt: skip
                        if messages:
                            LOG_BATCHES.labels("database").inc()
                    if not messages:
                        break
                    after = messages[-1].position
                    await conn.execute(
                        "UPDATE event_log_watermarks SET sending_through = GREATEST(sending_through, $2),"
                        " updated_at = now() WHERE chain_id = $1",
                        chain_id,
                        after,
                    )
                acks = await self._send([(topic, m.key, m.payload, m.headers) for m in messages])
                in_flight.append((messages, acks, started))
                if len(in_flight) > 1:
                    total += await self._complete_log(conn, chain_id, topic, *in_flight.popleft())
            while in_flight:
                total += await self._complete_log(conn, chain_id, topic, *in_flight.popleft())
        finally:
            for _, acks, _ in in_flight:  # after a failure: collect, never leave them unawaited
                with contextlib.suppress(BaseException):
                    await acks
        return total

    async def _read_memory(
        self, conn: asyncpg.Connection, chain_id: int, after: int, sent_through: int
    ) -> list[LogMessage] | None:
        """The next batch from the committed windows in memory (under the watermark lock),
        or None when it must be read from the database.

        Memory serves only the very next position and only when nothing after `after` may
        be on Kafka already (`sending_through` not past it: after a failed send the database
        path's rule for such rows applies). The line cuts the batch as `read_after` does.
        """
        if sent_through > after:
            return None
        batch = self._from_memory(chain_id, after)
        if not batch:
            return None
        last_position, last_event = batch[-1]
        check = await conn.fetchrow(_MEMORY_CHECK_SQL, chain_id, last_position, last_event.id)
        if check is None or not check["present"]:
            # A rollback took these rows back (they were never sent): the log has what follows.
            self._committed.pop(chain_id, None)
            return None
        line = check["line"]
        for i, (_, event) in enumerate(batch):
            if event.block_number > line:
                batch = batch[:i]
                break
        if not batch:
            return []
        incarnations: dict[str, int] = {}
        if check["returns"]:
            rows = await conn.fetch(INCARNATIONS_SQL, [event.id for _, event in batch])
            incarnations = {row["event_id"]: row["retractions"] for row in rows}
        build = self._builder.build_event
        LOG_BATCHES.labels("memory").inc()
        return [build(position, event, incarnations.get(event.id, 0)) for position, event in batch]

    async def _complete_log(
        self,
        conn: asyncpg.Connection,
        chain_id: int,
        topic: str,
        messages: list[LogMessage],
        acks: asyncio.Future[Any],
        started: float,
    ) -> int:
        await acks
        await conn.execute(
            "UPDATE event_log_watermarks SET published_through = GREATEST(published_through, $2),"
            " updated_at = now() WHERE chain_id = $1",
            chain_id,
            messages[-1].position,
        )
        held = self._committed.get(chain_id)
        if held is not None:
            held.drop_through(messages[-1].position)
        OUTBOX_PUBLISHED.labels(topic).inc(len(messages))
        blocks = [m.block_number for m in messages if m.block_number is not None]
        if blocks:
            PUBLISHED_BLOCK.labels(str(chain_id)).set(max(blocks))
        OUTBOX_BATCH_SECONDS.observe(time.perf_counter() - started)
        return len(messages)

    async def _complete(
        self, conn: asyncpg.Connection, rows: list[asyncpg.Record], acks: asyncio.Future[Any], started: float
    ) -> int:
        await acks
        await conn.execute(
            "UPDATE outbox SET published_at = now() WHERE seq = ANY($1::bigint[])",
            [row["seq"] for row in rows],
        )
        per_topic: dict[str, int] = {}
        published_blocks: dict[int, int] = {}
        for row in rows:
            per_topic[row["topic"]] = per_topic.get(row["topic"], 0) + 1
            if row["chain_id"] is not None and row["block_number"] is not None:
                published_blocks[row["chain_id"]] = max(
                    published_blocks.get(row["chain_id"], -1), row["block_number"]
                )
        for topic, count in per_topic.items():
            OUTBOX_PUBLISHED.labels(topic).inc(count)
        for chain_id, block in published_blocks.items():
            PUBLISHED_BLOCK.labels(str(chain_id)).set(block)
        OUTBOX_BATCH_SECONDS.observe(time.perf_counter() - started)
        return len(rows)

    async def _update_gauges(self, conn: asyncpg.Connection) -> None:
        row = await conn.fetchrow(
            "SELECT count(*) AS pending, extract(epoch FROM now() - min(created_at)) AS age"
            " FROM outbox WHERE published_at IS NULL"
        )
        logs = await conn.fetchrow(
            "SELECT COALESCE(sum(n), 0) AS pending, extract(epoch FROM now() - min(oldest)) AS age FROM ("
            " SELECT (SELECT count(*) FROM escrow_events e WHERE e.chain_id = w.chain_id"
            "   AND e.position > w.published_through) AS n,"
            " (SELECT e.indexed_at FROM escrow_events e WHERE e.chain_id = w.chain_id"
            "   AND e.position > w.published_through ORDER BY e.position LIMIT 1) AS oldest"
            " FROM event_log_watermarks w) p"
        )
        if row is not None and logs is not None:
            OUTBOX_PENDING.set(row["pending"] + logs["pending"])
            OUTBOX_OLDEST_AGE.set(max(float(row["age"] or 0.0), float(logs["age"] or 0.0)))


class KeyPartitioner:
    """The default partitioner, with each key's murmur2 hash computed once.

    The producers of this project use the default partitioner: keyed rows land where a plain
    `send` would put them, so a key's order holds across every writer. A task's events share
    a key and murmur2 runs in Python, so each key's hash is kept (the cache is cleared when it
    grows); the partition is picked from it exactly as `DefaultPartitioner` does. Keyless
    messages go where the default puts them (a random partition).
    """

    def __init__(self, limit: int = 65_536) -> None:
        self._default = DefaultPartitioner()
        self._hashes: dict[bytes, int] = {}
        self._limit = limit

    def __call__(self, key: bytes | None, partitions: list[int], available: list[int]) -> int:
        """The partition of `key` among `partitions` (as `DefaultPartitioner`)."""
        if key is None:
            return int(self._default(key, partitions, available))
        hashed = self._hashes.get(key)
        if hashed is None:
            if len(self._hashes) >= self._limit:
                self._hashes.clear()
            hashed = self._hashes[key] = murmur2(key) & 0x7FFFFFFF
        return partitions[hashed % len(partitions)]


async def send_batches(
    producer: AIOKafkaProducer, items: Sequence[_Item], partitioner: KeyPartitioner
) -> asyncio.Future[Any]:
    """Queue messages as one record batch per partition (in the given order within each);
    the returned future completes when every batch is acknowledged."""
    partitions: dict[str, list[int]] = {}
    by_partition: dict[tuple[str, int], list[_Item]] = {}
    for item in items:
        topic = item[0]
        known = partitions.get(topic)
        if known is None:
            known = partitions[topic] = sorted(await producer.partitions_for(topic))
        partition = partitioner(item[1], known, known)
        by_partition.setdefault((topic, partition), []).append(item)
    futures: list[asyncio.Future[Any]] = []
    for (topic, partition), part in by_partition.items():
        batch = producer.create_batch()
        for _, key, payload, headers in part:
            if batch.append(key=key, value=payload, timestamp=None, headers=headers) is None:
                futures.append(await producer.send_batch(batch, topic, partition=partition))
                batch = producer.create_batch()
                if batch.append(key=key, value=payload, timestamp=None, headers=headers) is None:
                    raise ValueError(f"a message of {len(payload)} bytes is larger than the producer's batch size")
        futures.append(await producer.send_batch(batch, topic, partition=partition))
    return asyncio.gather(*futures)


def sequence_header(seq: int) -> tuple[str, bytes]:
    """The CloudEvents `sequence` extension of an outbox row: its `seq`, zero-padded to 20
    digits so that text order is number order.

    A failed send retried after a later batch went through puts an older record of a key
    after a newer one (and a redelivered newer one is then dropped as seen): subscribers of
    a key's whole state keep the record with the highest sequence, whatever the offsets."""
    return ("ce_sequence", f"{seq:020d}".encode())


def _outbox_item(publisher: OutboxPublisher, row: asyncpg.Record) -> _Item:
    return (row["topic"], row["key"], row["payload"], [*publisher._headers(row["headers"]), sequence_header(row["seq"])])


async def unpublished(conn: asyncpg.Connection) -> bool:
    """Whether anything waits to be published: an outbox row or an event-log row."""
    if await conn.fetchval("SELECT EXISTS (SELECT 1 FROM outbox WHERE published_at IS NULL)"):
        return True
    return bool(await conn.fetchval(UNPUBLISHED_SQL))


def _is_kafka_error(exc: BaseException) -> bool:
    from aiokafka.errors import KafkaError

    return isinstance(exc, KafkaError)
