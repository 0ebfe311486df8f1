"""Every escrow event type travels chain → indexer → PostgreSQL and Kafka, decoded and keyed."""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg

from escrowd.devnet import Devnet
from escrowd.scenarios import every_event_type
from indexer.config import ChainConfig
from indexer.service import ChainIndexer
from runtime.db import connect
from runtime.kafka import TopicSpec, ensure_topics, make_producer
from runtime.outbox import OutboxPublisher
from schemas.events import EscrowEventMessage, event_type
from tests.support.indexer_harness import read_topic, wait_for, wait_until_published


async def test_every_event_type_reaches_postgres_and_kafka(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Each event the contract emits is stored with its fields and published with key and headers."""
    every_event_type(devnet)
    chain_logs = list(devnet.logs())
    head = devnet.block_number()
    topic = f"{topic_prefix}escrow.events.v1"
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 2)])
    chain = ChainConfig(
        chain_id=devnet.chain_id, rpc_urls=[devnet.rpc_url], ws_url=devnet.ws_url,
        escrow_addresses=[devnet.escrow_address], confirmations=0, finality_depth=4,
        initial_range=3, poll_interval=0.1,
    )
    indexer = ChainIndexer(chain, database_url=database_url, topic=topic)
    producer = make_producer(kafka_bootstrap)
    await producer.start()
    publisher = OutboxPublisher(database_url, producer)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(indexer.run(stop)), asyncio.create_task(publisher.run())]
    conn: asyncpg.Connection = await connect(database_url)
    try:
        async def indexed() -> bool:
            return bool(await conn.fetchval(
                "SELECT block_number >= $1 FROM chain_cursor WHERE chain_id = $2", head, devnet.chain_id))

        await wait_for(indexed, timeout=30, what="indexer at the head")
        rows = await conn.fetch("SELECT * FROM escrow_events ORDER BY block_number, log_index")
        assert [(r["event_name"], r["block_number"], r["log_index"]) for r in rows] == [
            (e.name, e.block_number, e.log_index) for e in chain_logs
        ]
        for row, log in zip(rows, chain_logs, strict=True):
            assert dict(row["args"]) == {k: _normal(v) for k, v in log.args.items()}, log.name
            assert row["tx_hash"] == log.tx_hash

        # Published follows committed: read the topic once the log is drained, not before.
        await wait_until_published(database_url, devnet.chain_id, head)
        records = await read_topic(kafka_bootstrap, topic, timeout=30)
        assert len(records) == len(rows)
        by_id = {}
        for record in records:
            headers = record.headers
            message = EscrowEventMessage.model_validate(record.payload)
            message.typed_args()  # the args match the event's own schema
            assert headers["ce_id"] == message.id
            assert headers["ce_type"] == event_type(message.event)
            assert headers["ce_specversion"] == "1.0"
            assert headers["ce_source"] == f"escrowd/indexer/{devnet.chain_id}/{devnet.escrow_address}"
            assert "ce_time" in headers
            if message.task_id is not None:
                assert record.key == f"{devnet.chain_id}:{message.task_id}".encode()
                assert headers["ce_subject"] == str(message.task_id)
            assert message.removed is False
            by_id[message.id] = message
        assert set(by_id) == {r["event_id"] for r in rows}
        assert {m.event for m in by_id.values()} >= {
            "TaskCreated", "TaskCancelled", "TaskAccepted", "EvidenceSubmitted", "VerificationCompleted",
            "DisputeRaised", "DisputeResolved", "TaskRefunded", "TaskEscalated", "EscalationCollected",
            "MarketplaceVerifierChanged",
        }
    finally:
        stop.set()
        publisher.stop()
        for task in tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 10)
        await producer.stop()
        await conn.close()


def _normal(value: object) -> object:
    if isinstance(value, bytes):
        return "0x" + value.hex()
    return value
