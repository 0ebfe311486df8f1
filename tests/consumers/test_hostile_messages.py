"""A real verification consumer process (`escrowd consume verification run`) under hostile messages.

Observation 2 of the trust-boundary issue: a deeply nested payload holding a 19+ digit
integer sent the decoder to the standard-library parser, which overflowed the C stack; the
process exited 139 at every restart and the partitions behind it never moved. Now every
hostile message is dead-lettered with its reason, the other partitions go on, and a killed
and restarted process neither crashes on the same messages nor dead-letters them twice.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from escrowd.devnet import anvil_key
from indexer.decode import DecodedLog
from indexer.store import event_message
from runtime.db import connect
from runtime.kafka import (
    TopicSpec,
    cloudevent_headers,
    encode_headers,
    ensure_topics,
)
from schemas.events import event_id
from tests.support.indexer_harness import wait_for
from tests.support.processes import consumer_process

ESCROW = "0x5FbDB2315678afecb367f032d93F642f64180aa3"

HOSTILE: list[tuple[str, bytes]] = [
    ("deep-long-int", b"[" * 100_000 + b"1234567890123456789012345" + b"]" * 100_000),
    ("deep-objects", b'{"a":' * 100_000 + b"1" + b"}" * 100_000),
    ("huge-number", b'{"chain_id": ' + b"9" * 5000 + b"}"),
    ("invalid-utf8", b'{"kind": "\xff\xfe"}'),
    ("lone-surrogate", b'{"kind": "\\ud800"}'),
    ("nul", b'{"kind": "finalize", "request_id": "a\\u0000b"}'),
    ("wrong-types", b'{"kind": "review", "chain_id": "31337", "passed": "yes"}'),
    ("unknown-fields", b'{"kind": "review", "admin": true}'),
    ("oversized", b'{"pad": "' + b"a" * (2 * 1024 * 1024) + b'"}'),
]


def _task_created(topic: str, block: int) -> tuple[str, bytes, bytes, list[tuple[str, bytes]]]:
    block_hash = "0x" + f"{block:064x}"
    event = DecodedLog(
        id=event_id(31337, block_hash, 0), chain_id=31337, escrow_address=ESCROW, block_number=block,
        block_hash=block_hash, block_timestamp=int(time.time()), tx_hash=block_hash, tx_index=0, log_index=0,
        event="TaskCreated", task_id=block, args={
            "taskId": block, "poster": ESCROW, "verifier": "0x" + "0" * 40, "token": "0x" + "0" * 40,
            "reward": 10**7, "deadline": int(time.time()) + 86_400, "taskHash": "0x" + "11" * 32, "status": 0,
        },
    )  # fmt: skip
    message = event_message(event, topic)
    return message.message_id, message.key or b"", message.payload, encode_headers(message.headers)


async def test_hostile_requests_are_dead_lettered_and_the_process_survives_restarts(
    database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Each hostile request becomes one dead letter with a reason; events on other partitions are handled."""
    group = f"{topic_prefix}verification"
    names = {
        "events_topic": f"{topic_prefix}events",
        "verification_requests_topic": f"{topic_prefix}requests",
        "verdicts_topic": f"{topic_prefix}verdicts",
        "dead_letter_topic": f"{topic_prefix}dlq",
    }
    await ensure_topics(
        kafka_bootstrap,
        [TopicSpec(names["events_topic"], 4), TopicSpec(names["verification_requests_topic"], 4),
         TopicSpec(names["verdicts_topic"], 4), TopicSpec(names["dead_letter_topic"], 1)],
    )  # fmt: skip
    env = {
        "ESCROWD_DATABASE_URL": database_url,
        "ESCROWD_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "ESCROWD_VERIFICATION_SIGNING_KEY": anvil_key(9)[1],
        "ESCROWD_VERIFICATION_GROUP": group,
        **{f"ESCROWD_{k.upper()}": v for k, v in names.items()},
    }
    conn = await connect(database_url)
    # Larger requests than the project's producers send: the oversized message must get through.
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, max_request_size=8 * 1024 * 1024)
    await producer.start()
    log = Path(tempfile.mkdtemp()) / "verification.log"
    try:
        for index, (name, payload) in enumerate(HOSTILE):
            headers = cloudevent_headers(
                id=f"hostile-{name}", source="attacker", type="io.escrowd.verification.finalize.v1", subject=None, time=None
            )
            await producer.send_and_wait(
                names["verification_requests_topic"], payload, partition=index % 2, headers=encode_headers(headers)
            )
        # Messages no one may lose: events on the other partitions (and topic).
        first = _task_created(names["events_topic"], 101)
        await producer.send_and_wait(names["events_topic"], first[2], key=first[1], partition=3, headers=first[3])

        async def inbox(message_id: str) -> bool:
            return bool(
                await conn.fetchval(
                    "SELECT 1 FROM consumer_inbox WHERE consumer = $1 AND message_id = $2", group, message_id
                )
            )

        async def all_dead() -> bool:
            count = await conn.fetchval("SELECT count(*) FROM dead_letters WHERE consumer = $1", group)
            return bool(count == len(HOSTILE))

        with consumer_process(["consume", "verification", "run"], env, log) as process:
            await wait_for(all_dead, timeout=180, what="every hostile request dead-lettered")
            await wait_for(lambda: inbox(first[0]), timeout=60, what="the event on another partition handled")
            assert process.alive(), log.read_text()
            reasons = {
                r["message_id"]: r["reason"]
                for r in await conn.fetch("SELECT message_id, reason FROM dead_letters WHERE consumer = $1", group)
            }
            assert "JSON_TOO_DEEP" in reasons["hostile-deep-long-int"]
            assert "JSON_TOO_DEEP" in reasons["hostile-deep-objects"]
            assert "JSON_INVALID" in reasons["hostile-invalid-utf8"]
            assert "JSON_INVALID" in reasons["hostile-lone-surrogate"]
            assert "JSON_INVALID" in reasons["hostile-nul"]
            assert "bytes; at most" in reasons["hostile-oversized"]
            assert all(reasons.values())

            async def on_dlq_topic() -> bool:
                sent = await conn.fetchval(
                    "SELECT count(*) FROM outbox WHERE topic = $1 AND published_at IS NOT NULL", names["dead_letter_topic"]
                )
                return bool(sent == len(HOSTILE))

            await wait_for(on_dlq_topic, timeout=120, interval=0.5, what="dead letters published to Kafka")
            process.process.kill()  # no goodbye: the restart must not stumble on anything left behind
            process.process.wait()

        second = _task_created(names["events_topic"], 102)
        await producer.send_and_wait(names["events_topic"], second[2], key=second[1], partition=2, headers=second[3])
        with consumer_process(["consume", "verification", "run"], env, log) as process:
            await wait_for(lambda: inbox(second[0]), timeout=180, what="a later event handled after the restart")
            assert process.alive(), log.read_text()
        assert await conn.fetchval("SELECT count(*) FROM dead_letters WHERE consumer = $1", group) == len(HOSTILE)
        assert "Segmentation" not in log.read_text()
    finally:
        await producer.stop()
        await conn.close()


@pytest.mark.parametrize("service", ["lifecycle", "reputation"])
async def test_event_consumers_dead_letter_the_hostile_corpus(
    service: str, database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """`escrowd consume lifecycle|reputation`: the corpus on the events topic is dead-lettered; a real event is applied."""
    events = f"{topic_prefix}events"
    names = {
        "events_topic": events, "tasks_topic": f"{topic_prefix}tasks", "timers_topic": f"{topic_prefix}timers",
        "reputation_topic": f"{topic_prefix}reputation", "dead_letter_topic": f"{topic_prefix}dlq",
    }  # fmt: skip
    await ensure_topics(kafka_bootstrap, [TopicSpec(events, 4)] + [TopicSpec(t, 1) for t in list(names.values())[1:]])
    env = {
        "ESCROWD_DATABASE_URL": database_url,
        "ESCROWD_KAFKA_BOOTSTRAP": kafka_bootstrap,
        **{f"ESCROWD_{k.upper()}": v for k, v in names.items()},
    }
    conn = await connect(database_url)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, max_request_size=8 * 1024 * 1024)
    await producer.start()
    log = Path(tempfile.mkdtemp()) / f"{service}.log"
    ids = [f"hostile-{name}" for name, _ in HOSTILE]
    try:
        for index, (name, payload) in enumerate(HOSTILE):
            headers = cloudevent_headers(
                id=f"hostile-{name}", source="attacker", type="io.escrowd.escrow.TaskCreated.v1", subject="1", time=None
            )
            await producer.send_and_wait(events, payload, partition=index % 2, headers=encode_headers(headers))
        good = _task_created(events, 201)
        await producer.send_and_wait(events, good[2], key=good[1], partition=3, headers=good[3])

        async def all_dead() -> bool:
            count = await conn.fetchval("SELECT count(*) FROM dead_letters WHERE message_id = ANY($1::text[])", ids)
            return bool(count == len(HOSTILE))

        async def good_applied() -> bool:
            return bool(await conn.fetchval("SELECT 1 FROM consumer_inbox WHERE message_id = $1", good[0]))

        with consumer_process(["consume", service], env, log) as process:
            await wait_for(all_dead, timeout=180, what=f"{service}: every hostile event dead-lettered")
            await wait_for(good_applied, timeout=60, what=f"{service}: the real event applied")
            assert process.alive(), log.read_text()
            reasons = dict(await conn.fetch("SELECT message_id, reason FROM dead_letters"))
            assert "JSON_TOO_DEEP" in reasons["hostile-deep-long-int"]
            assert "JSON_INVALID" in reasons["hostile-lone-surrogate"]
            assert all(reasons.values())
        assert await conn.fetchval("SELECT count(*) FROM dead_letters WHERE message_id = ANY($1::text[])", ids) == len(HOSTILE)
    finally:
        await producer.stop()
        await conn.close()
