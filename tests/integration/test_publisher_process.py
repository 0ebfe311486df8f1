"""`escrowd index publish`: the outbox publisher as a process of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from runtime.db import connect
from runtime.kafka import TopicSpec, cloudevent_headers, ensure_topics
from runtime.outbox import OutboxMessage, enqueue
from tests.support.indexer_harness import read_topic, wait_for


async def test_publisher_process_drains_the_outbox(database_url: str, kafka_bootstrap: str, topic_prefix: str) -> None:
    """Rows written to the outbox reach Kafka through the standalone publisher, then it stops on SIGTERM."""
    topic = f"{topic_prefix}out"
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 2)])
    conn = await connect(database_url)
    process = subprocess.Popen(
        [sys.executable, "-m", "escrowd.cli", "index", "publish"],
        env={**os.environ, "ESCROWD_DATABASE_URL": database_url, "ESCROWD_KAFKA_BOOTSTRAP": kafka_bootstrap},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        messages = [
            OutboxMessage(
                message_id=f"m{i}", topic=topic, key=f"k{i % 3}".encode(), payload=b'{"n": %d}' % i,
                headers=cloudevent_headers(id=f"m{i}", source="test", type="t", subject=None, time=None),
            )
            for i in range(50)
        ]
        async with conn.transaction():
            await enqueue(conn, messages)

        async def drained() -> bool:
            return await conn.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL") == 0

        await wait_for(drained, timeout=60, what="outbox drained")
        records = await read_topic(kafka_bootstrap, topic, timeout=20)
        assert sorted(r.id for r in records) == sorted(m.message_id for m in messages)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0  # generous (loaded CI): returns as soon as it exits
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        await conn.close()
