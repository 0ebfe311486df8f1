"""A batch whose slow preparation fails is retried, never a crash of the consumer.

The verification consumer asks for its signatures outside the transaction (`PrepareFirst`);
a signer that fails once must cost a retry of the batch. The retry path once raised
`TypeError` (a union of classes combined with a tuple), so every `RetryableError` out of the
loop stopped the component instead of retrying it.
"""

from __future__ import annotations

import asyncio

import asyncpg
import orjson

from runtime.consumer import IdempotentConsumer, InboundMessage, PrepareFirst
from runtime.db import connect
from runtime.kafka import (
    TopicSpec,
    cloudevent_headers,
    encode_headers,
    ensure_topics,
    make_producer,
)


async def test_a_failed_preparation_is_retried_and_the_message_handled_once(
    database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    topic = f"{topic_prefix}prepare-retry"
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 1), TopicSpec(f"{topic}.dlq", 1)])
    conn = await connect(database_url)
    await conn.execute("CREATE TABLE IF NOT EXISTS prepare_seen (value text NOT NULL)")
    attempts: list[int] = []
    prepared = asyncio.Event()

    async def prepare() -> None:
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            raise RuntimeError("signer unreachable")  # our own fault, the first time only
        prepared.set()

    async def handler(db: asyncpg.Connection, message: InboundMessage) -> None:
        if not prepared.is_set():
            raise PrepareFirst("sign first", prepare)
        await db.execute("INSERT INTO prepare_seen VALUES ($1)", message.json()["value"])

    consumer = IdempotentConsumer(
        name="prepare-retry", topics=[topic], bootstrap=kafka_bootstrap, database_url=database_url,
        handler=handler, dlq_topic=f"{topic}.dlq",
        session_timeout_ms=3000,  # the retry leaves the group and joins again: the old member's session ends sooner
    )  # fmt: skip
    producer = make_producer(kafka_bootstrap)
    await producer.start()
    try:
        headers = cloudevent_headers(id="one", source="test", type="test.v1", subject=None, time=None)
        await producer.send_and_wait(topic, orjson.dumps({"value": "one"}), key=b"one", headers=encode_headers(headers))
        runner = asyncio.create_task(consumer.run())
        async with asyncio.timeout(120):
            while not await conn.fetchval("SELECT count(*) FROM prepare_seen"):
                assert not runner.done(), runner.exception()  # a crash ends the run: it must keep going
                await asyncio.sleep(0.2)
        consumer.stop()
        await asyncio.wait_for(runner, 60)
        assert attempts == [1, 2]
        assert await conn.fetchval("SELECT count(*) FROM prepare_seen") == 1
        assert consumer.processed == 1
    finally:
        await producer.stop()
        await conn.execute("DROP TABLE IF EXISTS prepare_seen")
        await conn.close()
