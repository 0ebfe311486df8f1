"""Poison pills: a message that kills the consumer process is dead-lettered after one restart.

The consumer runs as its own process on the shared runtime (`runtime.consumer`); its handler
segfaults on one message. The first process dies with SIGSEGV; the restarted one finds the
in-flight mark, dead-letters that message with the reason, and handles every other message
(the ones behind it on its partition, and those on the other partition) exactly once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from runtime.db import connect
from runtime.kafka import (
    TopicSpec,
    cloudevent_headers,
    encode_headers,
    ensure_topics,
    make_producer,
)
from tests.support.indexer_harness import wait_for


def _start(
    database_url: str, bootstrap: str, topic: str, group: str, log: Path, deaths: int = 1
) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.support.crashing_consumer", database_url, bootstrap, topic, group, str(deaths)],
            env=dict(os.environ), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


async def test_a_message_that_kills_the_process_kills_it_once(
    database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """SIGSEGV in the handler: the restart dead-letters the message and every other one is handled once."""
    topic = f"{topic_prefix}poison"
    group = f"{topic_prefix}poison-group"
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 2), TopicSpec(f"{topic}.dlq", 1)])
    conn = await connect(database_url)
    await conn.execute("CREATE TABLE poison_seen (value text NOT NULL)")
    producer = make_producer(kafka_bootstrap)
    await producer.start()

    async def send(partition: int, ce_id: str, payload: dict[str, object]) -> None:
        headers = cloudevent_headers(id=ce_id, source="test", type="test.v1", subject=None, time=None)
        await producer.send_and_wait(
            topic, orjson.dumps(payload), key=ce_id.encode(), partition=partition, headers=encode_headers(headers)
        )

    log = Path(tempfile.mkdtemp()) / "consumer.log"
    process: subprocess.Popen[bytes] | None = None
    try:
        await send(0, "a", {"value": "a"})
        await send(0, "pill", {"crash": True})
        await send(0, "b", {"value": "b"})
        await send(1, "c", {"value": "c"})
        await send(1, "d", {"value": "d"})

        process = _start(database_url, kafka_bootstrap, topic, group, log)
        deadline = time.monotonic() + 120
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert process.returncode == -signal.SIGSEGV, log.read_text()
        mark = await conn.fetchrow(
            'SELECT topic, partition, "offset" FROM consumer_in_flight WHERE consumer = $1 ORDER BY seq DESC LIMIT 1',
            group,
        )
        assert mark is not None and tuple(mark) == (topic, 0, 1)  # the pill, recorded before its handler ran

        process = _start(database_url, kafka_bootstrap, topic, group, log)

        async def all_handled() -> bool:
            seen = await conn.fetchval("SELECT count(*) FROM poison_seen")
            dead = await conn.fetchval("SELECT count(*) FROM dead_letters WHERE consumer = $1", group)
            return bool(seen == 4 and dead == 1)

        await wait_for(all_handled, timeout=120, what="restart dead-letters the pill and handles the rest")
        assert process.poll() is None, log.read_text()
        dead = await conn.fetchrow("SELECT partition, \"offset\", message_id, reason FROM dead_letters WHERE consumer = $1", group)
        assert (dead["partition"], dead["offset"], dead["message_id"]) == (0, 1, "pill")
        assert "died while handling this message (1x)" in dead["reason"]
        assert await conn.fetchval("SELECT count(*) FROM outbox WHERE topic = $1", f"{topic}.dlq") == 1

        # Consumption goes on, on both partitions, with no second dead letter.
        await send(1, "e", {"value": "e"})
        await send(0, "f", {"value": "f"})

        async def later_handled() -> bool:
            return bool(await conn.fetchval("SELECT count(*) FROM poison_seen") == 6)

        await wait_for(later_handled, timeout=120, what="later messages handled")
        values = sorted(r["value"] for r in await conn.fetch("SELECT value FROM poison_seen"))
        assert values == ["a", "b", "c", "d", "e", "f"]
        assert await conn.fetchval("SELECT count(*) FROM dead_letters WHERE consumer = $1", group) == 1
        assert process.poll() is None
    finally:
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait()
        await producer.stop()
        await conn.close()


async def test_a_raising_handler_leaves_no_mark(database_url: str, kafka_bootstrap: str, topic_prefix: str) -> None:
    """A handler that raises (a bad payload) is dead-lettered by the runtime and clears its mark."""
    topic = f"{topic_prefix}raise"
    group = f"{topic_prefix}raise-group"
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 1), TopicSpec(f"{topic}.dlq", 1)])
    conn = await connect(database_url)
    await conn.execute("CREATE TABLE poison_seen (value text NOT NULL)")
    producer = make_producer(kafka_bootstrap)
    await producer.start()
    log = Path(tempfile.mkdtemp()) / "consumer.log"
    process = _start(database_url, kafka_bootstrap, topic, group, log)
    try:
        for ce_id, payload in (("x", b'{"no value": 1}'), ("y", b'{"value": "y"}'), ("z", b"[" * 5000)):
            headers = cloudevent_headers(id=ce_id, source="test", type="test.v1", subject=None, time=None)
            await producer.send_and_wait(topic, payload, partition=0, headers=encode_headers(headers))

        async def done() -> bool:
            seen = await conn.fetchval("SELECT count(*) FROM poison_seen")
            dead = await conn.fetchval("SELECT count(*) FROM dead_letters WHERE consumer = $1", group)
            return bool(seen == 1 and dead == 2)

        await wait_for(done, timeout=120, what="one handled, two dead-lettered")
        reasons = {r["message_id"]: r["reason"] for r in await conn.fetch("SELECT message_id, reason FROM dead_letters")}
        assert reasons["x"].startswith("KeyError")
        assert "JSON_TOO_DEEP" in reasons["z"]
        marks = await conn.fetch('SELECT "offset" FROM consumer_in_flight WHERE consumer = $1', group)
        assert marks and all(m["offset"] is None for m in marks)
        assert process.poll() is None, log.read_text()
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait()
        await producer.stop()
        await conn.close()


async def test_a_consumer_that_allows_two_deaths_retries_once(
    database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """With `poison_after_deaths=2` the pill is handled once more after the first death, then dead-lettered."""
    topic = f"{topic_prefix}poison2"
    group = f"{topic_prefix}poison2-group"
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 1), TopicSpec(f"{topic}.dlq", 1)])
    conn = await connect(database_url)
    await conn.execute("CREATE TABLE poison_seen (value text NOT NULL)")
    producer = make_producer(kafka_bootstrap)
    await producer.start()
    log = Path(tempfile.mkdtemp()) / "consumer.log"
    process: subprocess.Popen[bytes] | None = None
    try:
        for ce_id, payload in (("pill", {"crash": True}), ("after", {"value": "after"})):
            headers = cloudevent_headers(id=ce_id, source="test", type="test.v1", subject=None, time=None)
            await producer.send_and_wait(topic, orjson.dumps(payload), partition=0, headers=encode_headers(headers))
        for _ in range(2):  # dies in the pill's handler twice
            process = _start(database_url, kafka_bootstrap, topic, group, log, deaths=2)
            deadline = time.monotonic() + 120
            while process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert process.returncode == -signal.SIGSEGV, log.read_text()
        process = _start(database_url, kafka_bootstrap, topic, group, log, deaths=2)

        async def done() -> bool:
            seen = await conn.fetchval("SELECT count(*) FROM poison_seen")
            dead = await conn.fetchval("SELECT count(*) FROM dead_letters WHERE consumer = $1", group)
            return bool(seen == 1 and dead == 1)

        await wait_for(done, timeout=120, what="third run dead-letters the pill")
        reason = await conn.fetchval("SELECT reason FROM dead_letters WHERE consumer = $1", group)
        assert "died while handling this message (2x)" in reason
        assert process.poll() is None
    finally:
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait()
        await producer.stop()
        await conn.close()
