"""One agent's reputations, computed by two consumer-group members at once, end on the topic in order.

An agent's verdicts come from different tasks, so from different partitions of the events
topic and from different members of the reputation group, each in a transaction of its own.
`escrow.reputation.v1` is compacted and keyed by agent: a subscriber keeps the newest record
per agent, so the agent's records must reach the topic in the order their states were
committed, each state the fold of every verdict committed before it, whatever the publisher
was doing meanwhile (a broker slow to take a batch, as in an outage).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaTimeoutError

from indexer.store import event_message
from lifecycle.reputation.consumer import ReputationHandler, outcome_of
from lifecycle.reputation.rules import fold
from runtime.consumer import InboundMessage
from runtime.db import connect
from runtime.kafka import TopicSpec, ensure_topics
from runtime.outbox import OutboxPublisher
from schemas import jsoncodec
from schemas.events import EscrowEventMessage
from tests.support.escrow_logs import verification_completed
from tests.support.indexer_harness import read_topic, wait_for

pytestmark = pytest.mark.timeout(120)

AGENT = "0x976e00000000000000000000000000000000a9e1"
OTHER = "0x5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"


def verdict(block: int, agent: str, passed: bool, events_topic: str) -> InboundMessage:
    """Task `block`'s VerificationCompleted as the reputation consumer receives it."""
    log = verification_completed(block, agent, passed)
    row = event_message(log, events_topic)
    return InboundMessage(
        topic=events_topic, partition=block % 2, offset=block, key=row.key, headers=dict(row.headers),
        value=row.payload, timestamp_ms=0,
    )  # fmt: skip


class FaultyBroker(AIOKafkaProducer):
    """A real producer with a fault at its first batch. `hold`: the broker is slow to take it
    (as during an outage): `waiting` is set once the publisher is held there, `gate` lets it go
    on. `lose`: the broker never takes it (its request timed out) while the next batch goes
    through, as aiokafka's does once the broker is back."""

    def __init__(self, fault: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fault = fault
        self.waiting = asyncio.Event()
        self.gate = asyncio.Event()

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> Any:
        if self.fault == "lose" and not self.waiting.is_set():
            self.waiting.set()
            lost: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            lost.set_exception(KafkaTimeoutError("the broker did not take the batch in time"))
            return lost
        if self.fault == "hold" and not self.gate.is_set():
            self.waiting.set()
            await self.gate.wait()
        return await super().send_batch(batch, topic, partition=partition)


async def reputation_topic(
    bootstrap: str, prefix: str, partitions: int, fault: str
) -> tuple[str, ReputationHandler, str, FaultyBroker]:
    """The reputation topic, its handler, the events topic's name and a started faulty producer."""
    topic = f"{prefix}reputation"
    await ensure_topics(bootstrap, [TopicSpec(topic, partitions, compacted=True)])
    producer = FaultyBroker(fault, bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, linger_ms=1)
    await producer.start()
    return topic, ReputationHandler(topic=topic), f"{prefix}escrow.events.v1", producer


async def handle(conn: asyncpg.Connection, handler: ReputationHandler, message: InboundMessage) -> None:
    """What a member does with one message: the handler in a savepoint of its batch transaction."""
    async with conn.transaction():
        await handler(conn, message)


async def waits_on_a_lock(conn: asyncpg.Connection, pid: int) -> bool:
    return bool(await conn.fetchval(
        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid))  # fmt: skip


async def held_as_published(conn: asyncpg.Connection) -> tuple[int, int, int, int]:
    row = await conn.fetchrow(
        "SELECT score, dispute_count, passes, failures FROM agent_reputation WHERE agent = $1", AGENT
    )
    assert row is not None
    return (row["score"], row["dispute_count"], row["passes"], row["failures"])


async def test_two_members_fold_every_verdict_of_the_agent_committed_before_them(
    database_url: str, topic_prefix: str
) -> None:
    """Member A's pass is uncommitted when member B takes the agent's next verdict: B waits
    for it and folds it, instead of storing (and publishing) a fold that leaves it out."""
    handler = ReputationHandler(topic=f"{topic_prefix}reputation")
    events = f"{topic_prefix}escrow.events.v1"
    first, second = verdict(201, AGENT, True, events), verdict(202, AGENT, False, events)
    a, b, check = await connect(database_url), await connect(database_url), await connect(database_url)
    try:
        batch_a = a.transaction()
        await batch_a.start()
        await handle(a, handler, first)

        async def member_b() -> None:
            async with b.transaction():
                await handle(b, handler, second)

        task = asyncio.create_task(member_b())
        pid_b = b.get_server_pid()
        await wait_for(lambda: waits_on_a_lock(check, pid_b), timeout=20, what="member B waiting on member A")
        await batch_a.commit()
        await asyncio.wait_for(task, 20)

        want = fold(AGENT, [outcome_of(EscrowEventMessage.model_validate(m.json())) for m in (first, second)])
        assert (want.passes, want.failures) == (1, 1)
        assert await held_as_published(check) == (want.score, want.dispute_count, want.passes, want.failures)
        published = [
            jsoncodec.loads(r["payload"])
            for r in await check.fetch("SELECT payload FROM outbox WHERE key = $1 ORDER BY seq", AGENT.encode())
        ]
        assert published[-1] == want.model_dump(mode="json")
    finally:
        for conn in (a, b, check):
            with contextlib.suppress(Exception):
                await conn.close()


async def test_an_agents_reputations_reach_the_topic_in_the_order_they_were_committed(
    database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """The publisher reads a batch while member A's reputation row is still uncommitted (its
    seq lower than a committed row of another agent); the broker is slow to take that batch;
    meanwhile A commits and member B commits the agent's next reputation. The older record
    must still reach the topic first: the last record of the agent is the state we hold."""
    topic, handler, events, producer = await reputation_topic(kafka_bootstrap, topic_prefix, 2, "hold")
    a, b, other, pub = [await connect(database_url) for _ in range(4)]
    publishing: asyncio.Task[int] | None = None
    try:
        batch_a = a.transaction()
        await batch_a.start()
        await handle(a, handler, verdict(301, AGENT, True, events))  # the agent's row: seq 1, uncommitted
        async with other.transaction():
            await handle(other, handler, verdict(302, OTHER, True, events))  # another agent's: seq 2, committed

        publisher = OutboxPublisher(database_url, producer, batch_size=100)
        publishing = asyncio.create_task(publisher.publish_cycle(pub))
        await asyncio.wait_for(producer.waiting.wait(), 20)  # the first batch read, held at the broker
        await batch_a.commit()
        async with b.transaction():
            await handle(b, handler, verdict(303, AGENT, False, events))  # the agent's next: seq 3
        producer.gate.set()
        await asyncio.wait_for(publishing, 30)
        while await publisher.publish_cycle(pub):
            pass
        assert await pub.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL") == 0

        records = [r for r in await read_topic(kafka_bootstrap, topic) if r.key == AGENT.encode()]
        committed = [
            r["message_id"]
            for r in await pub.fetch("SELECT message_id FROM outbox WHERE key = $1 ORDER BY seq", AGENT.encode())
        ]
        assert [r.id for r in records] == committed
        last = records[-1].payload
        assert (last["score"], last["dispute_count"], last["passes"], last["failures"]) == await held_as_published(pub)
    finally:
        if publishing is not None and not publishing.done():
            publishing.cancel()
        producer.gate.set()
        for conn in (a, b, other, pub):
            with contextlib.suppress(Exception):
                await conn.close()
        await producer.stop()


async def test_a_batch_retried_after_a_later_one_went_through_keeps_the_sequence(
    database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Offsets can put an agent's older reputation after its newer one (and the newer one's
    second copy is a redelivery a subscriber drops as seen); `ce_sequence`, the outbox row's
    seq, still orders them, so "keep the highest sequence" ends on the state we hold."""
    topic, handler, events, producer = await reputation_topic(kafka_bootstrap, topic_prefix, 1, "lose")
    conn, pub = await connect(database_url), await connect(database_url)
    try:
        await handle(conn, handler, verdict(401, AGENT, True, events))
        await handle(conn, handler, verdict(402, AGENT, False, events))
        rows = await pub.fetch("SELECT seq, message_id FROM outbox WHERE key = $1 ORDER BY seq", AGENT.encode())
        assert len(rows) == 2
        publisher = OutboxPublisher(database_url, producer, batch_size=1)
        with pytest.raises(KafkaTimeoutError):
            await publisher.publish_cycle(pub)  # the first batch failed; the second one was sent
        while await publisher.publish_cycle(pub):
            pass
        assert await pub.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL") == 0

        records = [r for r in await read_topic(kafka_bootstrap, topic) if r.key == AGENT.encode()]
        older, newer = rows[0]["message_id"], rows[1]["message_id"]
        ids = [r.id for r in records]
        assert ids[:3] == [newer, older, newer]  # the reorder: offsets alone end on `older` once seen-dedup drops the copy
        for record in records:
            assert record.headers["ce_sequence"] == f"{next(r['seq'] for r in rows if r['message_id'] == record.id):020d}"
        seen: set[str] = set()
        by_offset: dict[str, Any] = {}
        for record in records:  # newest by offset, deduplicated on ce_id: stale
            if record.id not in seen:
                seen.add(record.id)
                by_offset = record.payload
        assert by_offset["failures"] == 0
        highest = max(records, key=lambda r: r.headers["ce_sequence"]).payload
        held = await held_as_published(pub)
        assert (highest["score"], highest["dispute_count"], highest["passes"], highest["failures"]) == held
        assert held[3] == 1
    finally:
        for c in (conn, pub):
            with contextlib.suppress(Exception):
                await c.close()
        await producer.stop()
