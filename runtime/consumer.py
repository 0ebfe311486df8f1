"""The runtime every Kafka consumer of this project shares: idempotent, durable-then-commit.

A consumer is a consumer group running a handler `(conn, message) -> None` that writes its
effects (and any outbox rows) with the given connection. For each batch fetched:

1. one PostgreSQL transaction; per message an inbox row `(consumer, ce_id)`: a row that
   already exists means the message was processed before, and it is skipped;
2. the handler runs in a savepoint; a permanent failure (bad payload, a rule refusal the
   message can never pass) rolls the savepoint back and records a dead letter, with the
   reason, in `dead_letters` and on the dead-letter topic (through the outbox);
3. the transaction commits, and only then are the offsets committed.

A crash anywhere replays from the last committed offset; the inbox turns the replay into
no-ops. A retryable failure (the database went away) aborts the batch, rewinds the
partitions to the batch start and tries again with backoff.

Poison pills: a message that kills the process (a segfault, the OOM killer) rather than
raising would kill it again at every restart, and the partitions behind it would never
move. So before its handler runs, each message is marked in flight in `consumer_in_flight`
(an insert on a second connection that commits at once); the next mark, the end of the
batch or a raised exception supersedes it. A process that starts and finds a
mark left by another run knows that run died inside that message's handler: when the
message comes round again it is dead-lettered with that reason instead of handled (after
`poison_after_deaths` such deaths, 1 by default: a poison message kills one process only).

Every message is bounded before its handler sees it: a payload above `max_message_bytes`,
a missing or malformed `ce_id` are dead-lettered; `json()` parses with
`schemas.jsonbounds` (size and nesting bounded before parsing).

`assignment="direct"` is for a consumer that is a single leader anyway (the settlement
relayer): instead of joining a consumer group it takes a PostgreSQL advisory lock named
after the consumer (a second process waits on it as a standby), assigns itself every
partition of its topics, and keeps its offsets in `consumer_offsets`, written in the same
transaction as the batch's effects. A restart after `kill -9` resumes at once from the last
commit: no group join, no session timeout to wait out.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import pydantic
import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError
from prometheus_client import Counter, Gauge

from runtime import health
from runtime.db import connect, is_connection_error
from runtime.kafka import cloudevent_headers, decode_headers
from runtime.outbox import OutboxMessage, enqueue
from schemas import jsonbounds

log = structlog.get_logger(__name__)

DEFAULT_DLQ_TOPIC = "escrow.dlq.v1"

MESSAGES = Counter(
    "escrowd_consumer_messages_total",
    "Messages handled by a consumer, by outcome (processed, duplicate, dead_lettered)",
    ["consumer", "outcome"],
)
CONSUMER_LAG = Gauge(
    "escrowd_consumer_lag_messages", "Messages behind the partition end", ["consumer", "topic", "partition"]
)
RETRIES = Counter("escrowd_consumer_retries_total", "Batches retried after a transient failure", ["consumer"])

MAX_MESSAGE_ID_CHARS = 512
"""Longest `ce_id` accepted: it is a key of the inbox."""

BATCH_MARK = -1
"""The `deaths` of the mark a batch hook runs under (it names the batch's first message): a run
that died there died somewhere in the batch, or in another task while the hook awaited, not
necessarily in that message. The next run goes message by message from there, charging that
message no death; only deaths under a message's own mark count towards `poison_after_deaths`."""

DLQ_PAYLOAD_MAX_BYTES = 900 * 1024
"""Largest payload copied onto the dead-letter topic: a producer refuses requests above 1 MiB,
and one unsendable row would hold up the whole outbox. Larger payloads stay in `dead_letters`."""


INBOX_INSERT_SQL = (
    'INSERT INTO consumer_inbox (consumer, message_id, topic, partition, "offset")'
    " SELECT $1, $2, $3, $4, $5 WHERE NOT EXISTS (SELECT 1 FROM consumer_inbox_floors f"
    " WHERE f.consumer = $1 AND f.topic = $3 AND f.partition = $4 AND f.pruned_through >= $5)"
    " ON CONFLICT DO NOTHING RETURNING 1"
)
"""The inbox row of one message, or nothing for a duplicate: its id was seen, or its offset is at
or below its partition's pruning floor (handled before its row was pruned; `runtime.retention`)."""

INBOX_INSERT_MANY_SQL = (
    'INSERT INTO consumer_inbox (consumer, message_id, topic, partition, "offset")'
    " SELECT $1, m.id, m.topic, m.partition, m.off"
    " FROM unnest($2::text[], $3::text[], $4::integer[], $5::bigint[]) AS m(id, topic, partition, off)"
    " WHERE NOT EXISTS (SELECT 1 FROM consumer_inbox_floors f"
    " WHERE f.consumer = $1 AND f.topic = m.topic AND f.partition = m.partition AND f.pruned_through >= m.off)"
    " ON CONFLICT DO NOTHING RETURNING message_id"
)
"""`INBOX_INSERT_SQL` for many messages at once (ids, topics, partitions, offsets): the new ids."""


# Conflicts between concurrent transactions: the batch is retried from its first message.
_TRANSIENT_SQL = (asyncpg.exceptions.SerializationError, asyncpg.exceptions.DeadlockDetectedError)


class PermanentError(Exception):
    """The message can never be processed: send it to the dead-letter topic with this reason."""


class RetryableError(Exception):
    """A transient failure: the batch is retried from its first message."""


class PrepareFirst(RetryableError):
    """The batch needs slow work done outside its transaction (a signature from a key held
    over the network): the consumer rolls the batch back, awaits `prepare()` with no
    transaction open, then applies the batch again. A `prepare()` that fails is a
    `RetryableError`: the batch is retried later, never dead-lettered."""

    def __init__(self, reason: str, prepare: Callable[[], Awaitable[None]]) -> None:
        super().__init__(reason)
        self.prepare = prepare


MAX_PREPARES = 8
"""Rounds of `PrepareFirst` one batch may ask for before it is retried from the broker."""


@dataclass(frozen=True)
class InboundMessage:
    """One Kafka record as the handlers see it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    headers: dict[str, str]
    value: bytes
    timestamp_ms: int

    @property
    def message_id(self) -> str | None:
        """The CloudEvents id (`ce_id`), the deduplication key."""
        return self.headers.get("ce_id")

    @property
    def delivered_id(self) -> str:
        """The id this message was delivered under: what a handler names its outputs after, so
        that an event back after a reorg (`<id>#1`) publishes under new ids. The runtime hands
        a handler no message without one."""
        if not self.message_id:
            raise PermanentError("message has no ce_id")
        return self.message_id

    @property
    def type(self) -> str | None:
        """The CloudEvents type (`ce_type`)."""
        return self.headers.get("ce_type")

    def json(self) -> Any:
        """The payload parsed as bounded JSON, or a PermanentError naming why it is refused."""
        try:
            return jsonbounds.loads(self.value)
        except jsonbounds.JsonRefused as exc:
            raise PermanentError(f"payload is not JSON ({exc.code}): {exc}") from None


Handler = Callable[[asyncpg.Connection, InboundMessage], Awaitable[None]]
IdleHook = Callable[[asyncpg.Connection, frozenset[TopicPartition]], Awaitable[None]]
"""Called when every assigned partition is caught up, with the assignment (at most once a second)."""


def from_record(record: ConsumerRecord[bytes, bytes]) -> InboundMessage:
    """The consumer's view of one Kafka record."""
    return InboundMessage(
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=record.key,
        headers=decode_headers(record.headers),
        value=record.value or b"",
        timestamp_ms=record.timestamp,
    )


Where = tuple[str, int, int]
"""(topic, partition, offset): one message's place."""


class IdempotentConsumer:
    """A consumer group member that applies each message's effects exactly once.

    Subclasses that can apply many ordinary messages with one statement per step set
    `applies_batches` and override :meth:`handle_batch`; everything else (bounds, the
    inbox, poison-pill marks, offsets, the commit) stays here.
    """

    applies_batches = False

    def __init__(
        self,
        *,
        name: str,
        topics: Sequence[str],
        bootstrap: str,
        database_url: str,
        handler: Handler,
        dlq_topic: str = DEFAULT_DLQ_TOPIC,
        max_records: int = 500,
        session_timeout_ms: int = 10000,
        on_idle: IdleHook | None = None,
        idle_interval: float = 1.0,
        max_message_bytes: int = jsonbounds.DEFAULT_MAX_BYTES,
        poison_after_deaths: int = 1,
        assignment: str = "group",
        fetch_max_wait_ms: int = 500,
    ) -> None:
        if assignment not in ("group", "direct"):
            raise ValueError(f"assignment must be 'group' or 'direct', not {assignment!r}")
        self.name = name
        self._topics = list(topics)
        self._bootstrap = bootstrap
        self._database_url = database_url
        self._handler = handler
        self._dlq_topic = dlq_topic
        self._max_records = max_records
        self._session_timeout_ms = session_timeout_ms
        self._on_idle = on_idle
        self._idle_interval = idle_interval
        self._max_message_bytes = max_message_bytes
        self._poison_after_deaths = max(1, poison_after_deaths)
        self._direct = assignment == "direct"
        # How long a fetch may wait to fill: aiokafka's default is 500 ms, and a broker may
        # hold an idle fetch that long, which a latency-bound consumer pays per batch.
        self._fetch_max_wait_ms = fetch_max_wait_ms
        self._stopping = asyncio.Event()
        self.processed = 0
        # Every series exists from the start, at 0: error panels and rate() alerts read 0,
        # not "No data", before the first failure.
        for outcome in ("processed", "duplicate", "dead_lettered"):
            MESSAGES.labels(name, outcome)
        RETRIES.labels(name)
        # Identifies this process's marks: a mark of another run means that run died in a handler.
        self._run_id = f"{os.getpid()}:{secrets.token_hex(8)}"
        self._marks: asyncpg.Connection | None = None
        # (topic, partition) -> (offset, deaths recorded before, run) of marks left by dead runs.
        self._suspects: dict[tuple[str, int], tuple[int, int, str]] | None = None

    def stop(self) -> None:
        """Ask `run` to return after the batch in flight."""
        self._stopping.set()

    def _make_consumer(self) -> AIOKafkaConsumer:
        if self._direct:
            # No group: partitions are assigned by `_assign`, offsets live in PostgreSQL.
            return AIOKafkaConsumer(
                bootstrap_servers=self._bootstrap,
                group_id=None,
                client_id=self.name,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                metadata_max_age_ms=5000,
                fetch_max_wait_ms=self._fetch_max_wait_ms,
            )
        return AIOKafkaConsumer(
            *self._topics,
            bootstrap_servers=self._bootstrap,
            group_id=self.name,
            client_id=self.name,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=self._session_timeout_ms,
            heartbeat_interval_ms=max(300, self._session_timeout_ms // 5),
            max_poll_interval_ms=300000,
            metadata_max_age_ms=5000,
            fetch_max_wait_ms=self._fetch_max_wait_ms,
        )

    async def run(self) -> None:
        """Consume until stopped; reconnect on database or broker failures."""
        bound = log.bind(consumer=self.name)
        outcome = "cancelled"
        try:
            with structlog.contextvars.bound_contextvars(consumer=self.name):
                await self._run(bound)
            outcome = "drained"
        finally:
            # A run that ends on its own (drained, or cancelled with its batch handed back and
            # rolled back) died in no handler: its marks must accuse no message. Only a
            # process that is killed leaves them for the next run's poison check.
            await self._release_marks()
            health.mark(self.name, False)
            bound.info("consumer_stopped", processed=self.processed, outcome=outcome)

    async def _run(self, bound: Any) -> None:
        while not self._stopping.is_set():
            consumer = self._make_consumer()
            conn: asyncpg.Connection | None = None
            try:
                conn = await connect(self._database_url)
                await self._open_marks()
                if not await self._unless_stopped(consumer.start()):
                    return  # stopped while joining its group: nothing was consumed, nothing to drain
                if self._direct:
                    await self._lead(conn)
                    await self._assign(consumer, conn)
                health.mark(self.name, True)
                bound.info("consumer_started", topics=self._topics)
                await self._loop(consumer, conn)
            except Exception as exc:
                if not (is_connection_error(exc) or isinstance(exc, (KafkaError, RetryableError, *_TRANSIENT_SQL))):
                    raise
                RETRIES.labels(self.name).inc()
                health.mark(self.name, False)
                bound.warning("consumer_retry", error=repr(exc))
                await asyncio.sleep(0.5)
            finally:
                for c in (conn, self._marks):
                    if c is not None:
                        with contextlib.suppress(Exception):
                            await c.close(timeout=2)
                self._marks = None
                with contextlib.suppress(Exception):
                    await consumer.stop()  # leaves the group: a restart joins at once

    async def _unless_stopped(self, step: Awaitable[None]) -> bool:
        """Await a start-up step unless `stop()` comes first, then cancel it (False): a group
        join waits out a killed member's session, and a drain must not wait with it."""
        task = asyncio.ensure_future(step)
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()  # cancelled ourselves: the step goes too
            raise
        finally:
            stopping.cancel()
        if task.done():
            task.result()
            return True
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        return False

    async def _release_marks(self) -> None:
        """Delete this run's in-flight marks (on a connection of its own: the marks' one may be mid-query)."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(10):
                conn = await connect(self._database_url)
                try:
                    await conn.execute(
                        "DELETE FROM consumer_in_flight WHERE consumer = $1 AND run_id = $2", self.name, self._run_id
                    )
                finally:
                    await conn.close(timeout=2)

    async def _open_marks(self) -> None:
        """The connection in-flight marks are written on; at the first start, the marks left by dead runs."""
        marks = await connect(self._database_url)
        # A mark must survive our process, not the database server: no need to wait for the disk.
        await marks.execute("SET synchronous_commit = off")
        if self._suspects is None:
            latest = await marks.fetch(
                'SELECT DISTINCT ON (run_id) run_id, seq, topic, partition, "offset", deaths'
                " FROM consumer_in_flight WHERE consumer = $1 AND run_id <> $2 ORDER BY run_id, seq DESC",
                self.name,
                self._run_id,
            )
            # Direct mode: a mark below the partition's committed offset is stale (its message
            # was applied since, by a later run, while another dead run's mark on the same
            # partition was the suspect). Kept, it would never come round and every later run
            # would go message by message for ever, where every kill charges a death.
            committed = (
                {
                    (r["topic"], r["partition"]): r["next_offset"]
                    for r in await marks.fetch(
                        "SELECT topic, partition, next_offset FROM consumer_offsets WHERE consumer = $1",
                        self.name,
                    )
                }
                if self._direct
                else {}
            )
            self._suspects = {}
            for row in latest:
                stale = row["offset"] is not None and row["offset"] < committed.get((row["topic"], row["partition"]), 0)
                if row["offset"] is None or stale:  # between handlers, or past: nothing to suspect
                    await marks.execute(
                        "DELETE FROM consumer_in_flight WHERE consumer = $1 AND run_id = $2 AND seq <= $3",
                        self.name,
                        row["run_id"],
                        row["seq"],
                    )
                else:
                    self._suspects[(row["topic"], row["partition"])] = (row["offset"], row["deaths"], row["run_id"])
            if self._suspects:
                log.warning("consumer_found_poison_marks", consumer=self.name, count=len(self._suspects))
        self._marks = marks

    async def _mark(self, message: InboundMessage, deaths: int = 0) -> None:
        """Record `message` as in its handler, committed at once (one insert: no row is updated).

        `deaths`: how many runs already died in this message's handler (`BATCH_MARK`: the
        mark of a batch hook, naming its first message). The newest row of a run says what it
        was doing; an older one is superseded.
        """
        if self._marks is None:
            return
        await self._marks.execute(
            'INSERT INTO consumer_in_flight (consumer, run_id, topic, partition, "offset", deaths)'
            " VALUES ($1, $2, $3, $4, $5, $6)",
            self.name,
            self._run_id,
            message.topic,
            message.partition,
            message.offset,
            deaths,
        )

    async def _clear_mark(self) -> None:
        """Record that no handler of this run is running, and drop the run's older marks."""
        if self._marks is None:
            return
        # Best effort: a mark left behind by a failed clear only matters if this run dies.
        with contextlib.suppress(Exception):
            await self._marks.execute(
                "WITH now_idle AS (INSERT INTO consumer_in_flight (consumer, run_id) VALUES ($1, $2) RETURNING seq)"
                " DELETE FROM consumer_in_flight WHERE consumer = $1 AND run_id = $2"
                " AND seq < (SELECT seq FROM now_idle)",
                self.name,
                self._run_id,
            )

    async def _forget_run(self, run_id: str) -> None:
        if self._marks is not None:
            await self._marks.execute(
                "DELETE FROM consumer_in_flight WHERE consumer = $1 AND run_id = $2", self.name, run_id
            )

    def _deaths_in(self, message: InboundMessage) -> tuple[int, str | None]:
        """How many earlier runs died inside this message's handler (0: none), and the last one."""
        if not self._suspects:
            return 0, None
        suspect = self._suspects.get((message.topic, message.partition))
        if suspect is None or suspect[0] != message.offset:
            return 0, None
        del self._suspects[(message.topic, message.partition)]
        return (0 if suspect[1] == BATCH_MARK else suspect[1] + 1), suspect[2]

    async def _lead(self, conn: asyncpg.Connection) -> None:
        # Held for the life of this connection: a crashed leader's lock goes with its socket.
        key = ("runtime.consumer", self.name)
        if not await conn.fetchval("SELECT pg_try_advisory_lock(hashtext($1), hashtext($2))", *key):
            log.warning("consumer_standby", consumer=self.name, reason="another process holds this consumer")
            await conn.execute("SELECT pg_advisory_lock(hashtext($1), hashtext($2))", *key)

    async def _assign(self, consumer: AIOKafkaConsumer, conn: asyncpg.Connection) -> bool:
        """Assign every partition of the topics, each at its stored offset; True if it changed."""
        await consumer.topics()  # fresh metadata
        wanted = {
            TopicPartition(topic, p) for topic in self._topics for p in consumer.partitions_for_topic(topic) or ()
        }
        if not wanted or wanted == consumer.assignment():
            return False
        stored = {
            (r["topic"], r["partition"]): r["next_offset"]
            for r in await conn.fetch(
                "SELECT topic, partition, next_offset FROM consumer_offsets WHERE consumer = $1 AND topic = ANY($2)",
                self.name,
                self._topics,
            )
        }
        consumer.assign(sorted(wanted))
        for tp in wanted:
            offset = stored.get((tp.topic, tp.partition))
            if offset is not None:
                consumer.seek(tp, offset)
        # Partitions without a stored offset start at the beginning (auto_offset_reset): a
        # replay the inbox turns into no-ops.
        return True

    async def _loop(self, consumer: AIOKafkaConsumer, conn: asyncpg.Connection) -> None:
        last_idle = 0.0
        last_assign = asyncio.get_running_loop().time()
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            if self._direct and (not consumer.assignment() or loop.time() - last_assign >= 5.0):
                last_assign = loop.time()
                await self._assign(consumer, conn)  # the topic appeared, or partitions were added
            if self._direct and not consumer.assignment():
                await asyncio.sleep(0.2)  # the topic has no partitions yet
                continue
            batches = await consumer.getmany(timeout_ms=200, max_records=self._max_records)
            if not batches:
                assignment = frozenset(consumer.assignment())
                if self._on_idle is not None and assignment and loop.time() - last_idle >= self._idle_interval:
                    last_idle = loop.time()
                    async with conn.transaction():
                        await self._on_idle(conn, assignment)
                continue
            await self._process_prepared(conn, batches)
            if not self._direct:
                await consumer.commit({tp: records[-1].offset + 1 for tp, records in batches.items()})
            for tp in batches:
                highwater = consumer.highwater(tp)
                if highwater is not None:
                    position = await consumer.position(tp)
                    CONSUMER_LAG.labels(self.name, tp.topic, str(tp.partition)).set(
                        max(0, highwater - position)
                    )

    async def _process_prepared(
        self,
        conn: asyncpg.Connection,
        batches: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]],
    ) -> None:
        """`_process`, with the slow work a handler asks for (`PrepareFirst`) done between two
        tries, outside the transaction."""
        for _ in range(MAX_PREPARES):
            try:
                await self._process(conn, batches)
                return
            except PrepareFirst as exc:
                try:
                    await exc.prepare()
                except Exception as failure:
                    raise RetryableError(f"preparing the batch failed: {_reason(failure)}") from None
        raise RetryableError(f"the batch asked to prepare {MAX_PREPARES} times")

    async def _process(
        self,
        conn: asyncpg.Connection,
        batches: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]],
    ) -> None:
        async with conn.transaction():
            messages = [from_record(record) for records in batches.values() for record in records]
            done: Mapping[Where, str] = {}
            # While a dead run's mark is unresolved, message by message: their marks find the
            # message that kills. Otherwise one mark (the batch's first message, `BATCH_MARK`:
            # a death under it charges that message nothing) covers the batch hook, before it
            # parses any payload.
            if self.applies_batches and len(messages) > 1 and not self._suspects:
                await self._mark(messages[0], BATCH_MARK)
                done = await self.handle_batch(conn, messages)
                for outcome in done.values():
                    MESSAGES.labels(self.name, outcome).inc()
                self.processed += sum(1 for outcome in done.values() if outcome == "processed")
            for message in messages:
                if (message.topic, message.partition, message.offset) not in done:
                    await self.handle_one(conn, message)
            if self._direct:
                # The offsets commit with the effects: exactly the messages applied are skipped
                # on restart (the inbox still guards a replay across a change of mode).
                await conn.executemany(
                    "INSERT INTO consumer_offsets (consumer, topic, partition, next_offset) VALUES ($1, $2, $3, $4)"
                    " ON CONFLICT (consumer, topic, partition)"
                    " DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = now()",
                    [(self.name, tp.topic, tp.partition, records[-1].offset + 1) for tp, records in batches.items()],
                )
            await self._clear_mark()  # before the commit: a death from here on accuses no message

    async def handle_batch(self, conn: asyncpg.Connection, messages: Sequence[InboundMessage]) -> Mapping[Where, str]:
        """Apply the ordinary messages of a batch at once, inside the caller's transaction.

        Returns the outcome ("processed" or "duplicate") of each message it applied; the
        others then go through :meth:`handle_one`, in order. It must leave no effect of a
        message it does not report (run in a savepoint, return {} on any failure but the
        connection's), and report only messages whose effects cannot depend on the ones it
        leaves out. Called only when `applies_batches` is set.
        """
        return {}

    async def handle_one(self, conn: asyncpg.Connection, message: InboundMessage) -> str:
        """Apply one message inside the caller's transaction; return the outcome."""
        message_id = message.message_id
        if not message_id:
            await self._dead_letter(conn, message, "missing ce_id header")
            return "dead_lettered"
        if len(message_id) > MAX_MESSAGE_ID_CHARS:
            await self._dead_letter(conn, message, f"ce_id longer than {MAX_MESSAGE_ID_CHARS} characters")
            return "dead_lettered"
        if len(message.value) > self._max_message_bytes:
            reason = f"payload of {len(message.value)} bytes; at most {self._max_message_bytes}"
            await self._dead_letter(conn, message, reason)
            return "dead_lettered"
        deaths, dead_run = self._deaths_in(message)
        if dead_run is not None and deaths >= self._poison_after_deaths:
            reason = f"poison: the consumer process died while handling this message ({deaths}x); not handled again"
            log.error("message_killed_consumer", consumer=self.name, message_id=message_id, offset=message.offset)
            await self._dead_letter(conn, message, reason)
            await self._forget_run(dead_run)
            return "dead_lettered"
        if dead_run is not None:
            log.warning("message_retried_after_death", consumer=self.name, message_id=message_id, deaths=deaths)
        with structlog.contextvars.bound_contextvars(
            message_id=message_id, topic=message.topic, partition=message.partition, offset=message.offset
        ):
            return await self._handle_new(conn, message, message_id, deaths, dead_run)

    async def _handle_new(
        self, conn: asyncpg.Connection, message: InboundMessage, message_id: str, deaths: int, dead_run: str | None
    ) -> str:
        inserted = await conn.fetchval(
            INBOX_INSERT_SQL, self.name, message_id, message.topic, message.partition, message.offset
        )
        if inserted is None:
            MESSAGES.labels(self.name, "duplicate").inc()
            return "duplicate"
        await self._mark(message, deaths)
        if dead_run is not None:
            await self._forget_run(dead_run)  # our own mark now carries the count
        try:
            async with conn.transaction():
                await self._handler(conn, message)
        except (RetryableError, *_TRANSIENT_SQL):
            await self._clear_mark()
            raise
        except BaseException as exc:
            # Raised, not died: this message did not kill the process.
            await self._clear_mark()
            if not isinstance(exc, Exception) or is_connection_error(exc):
                raise
            reason = _reason(exc)
            log.warning("message_dead_lettered", consumer=self.name, message_id=message_id, reason=reason)
            await self._dead_letter(conn, message, reason)
            return "dead_lettered"
        # No clear here: the next mark, or the clear at the end of the batch, supersedes this one.
        MESSAGES.labels(self.name, "processed").inc()
        self.processed += 1
        return "processed"


    async def _dead_letter(self, conn: asyncpg.Connection, message: InboundMessage, reason: str) -> None:
        MESSAGES.labels(self.name, "dead_lettered").inc()
        await conn.execute(
            "INSERT INTO dead_letters (consumer, topic, partition, \"offset\", message_id, reason, payload)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
            self.name,
            message.topic,
            message.partition,
            message.offset,
            message.message_id,
            reason,
            message.value,
        )
        dlq_id = f"{self.name}:{message.topic}:{message.partition}:{message.offset}"
        headers = {
            **{k: v for k, v in message.headers.items() if not k.startswith("ce_")},
            **cloudevent_headers(
                id=dlq_id,
                source=f"runtime/consumer/{self.name}",
                type="io.escrowd.deadletter.v1",
                subject=message.message_id,
                time=None,
            ),
            "dlq_reason": reason,
            "dlq_consumer": self.name,
            "dlq_topic": message.topic,
            "dlq_partition": str(message.partition),
            "dlq_offset": str(message.offset),
        }
        payload, key = message.value, message.key
        if len(payload) > DLQ_PAYLOAD_MAX_BYTES:
            headers["dlq_payload_omitted"] = f"{len(payload)} bytes, kept in dead_letters"
            payload = b""
        if key is not None and len(key) > 1024:
            key = None  # a key only picks the partition; a huge one would make the row unsendable
        await enqueue(
            conn,
            [OutboxMessage(message_id=dlq_id, topic=self._dlq_topic, key=key, payload=payload, headers=headers)],
        )


def _reason(exc: BaseException) -> str:
    # NUL cannot be stored in PostgreSQL text: a reason quoting the payload must not hold one.
    return _reason_text(exc).replace("\x00", "\ufffd")[:500]


def _reason_text(exc: BaseException) -> str:
    if isinstance(exc, pydantic.ValidationError):
        errors = exc.errors()
        if not errors:
            return "invalid payload"
        where = ".".join(str(p) for p in errors[0]["loc"])
        return f"invalid payload: {where}: {errors[0]['msg']}"
    if isinstance(exc, PermanentError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
