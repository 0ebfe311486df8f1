"""Retention under traffic: the pruner deletes inbox rows while a consumer runs, and nothing is lost or applied twice.

The case that matters is an old message delivered again after its inbox row was pruned
(a consumer whose offsets were lost replays its partitions from the start). What protects it
is the partition's floor (`consumer_inbox_floors`, `runtime/retention.py`): the pruner raises
it to the highest offset it deletes, and the consumer's inbox insert refuses an offset at or
below it. The handler here is deliberately not idempotent (a row per application), so a
second application would show.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from datetime import timedelta
from pathlib import Path

import asyncpg
from aiohttp import ClientSession
from aiokafka import AIOKafkaProducer

from escrowd.devnet import Devnet
from runtime.consumer import MESSAGES, IdempotentConsumer, InboundMessage
from runtime.db import connect
from runtime.kafka import TopicSpec, cloudevent_headers, encode_headers, ensure_topics
from runtime.outbox import OutboxMessage, enqueue
from runtime.retention import Pruner, RetentionConfig, inbox_cutoff
from tests.support.indexer_harness import IndexerProcess, chain_config, wait_for, write_config

TRAFFIC = 600
PARTITIONS = 2
FAST = RetentionConfig(
    broker_retention_hours=0.2 / 3600,  # 0.2 s: rows become prunable while traffic still flows
    inbox_margin_hours=0,
    settle_seconds=0.3,
    interval_seconds=0.2,
    batch_rows=50,
    pause_seconds=0,
)


async def _effect(conn: asyncpg.Connection, message: InboundMessage) -> None:
    await conn.execute("INSERT INTO retention_effects (message_id) VALUES ($1)", message.message_id)


def _consumer(name: str, topic: str, kafka_bootstrap: str, database_url: str) -> IdempotentConsumer:
    # Direct assignment keeps the offsets in PostgreSQL: deleting them replays the partitions
    # from offset 0, an old message's redelivery on demand.
    return IdempotentConsumer(
        name=name, topics=[topic], bootstrap=kafka_bootstrap, database_url=database_url, handler=_effect,
        assignment="direct", max_records=40, fetch_max_wait_ms=20,
    )  # fmt: skip


async def _produce(producer: AIOKafkaProducer, topic: str, ids: range) -> None:
    for i in ids:
        headers = cloudevent_headers(id=f"m-{i}", source="test", type="test.v1", subject=None, time=None)
        await producer.send(topic, f"{i}".encode(), key=f"k{i % 7}".encode(), headers=encode_headers(headers))
    await producer.flush()


async def _caught_up(conn: asyncpg.Connection, name: str, topic: str) -> bool:
    stored = await conn.fetchval(
        "SELECT coalesce(sum(next_offset), 0) FROM consumer_offsets WHERE consumer = $1 AND topic = $2", name, topic
    )
    total = await conn.fetchval("SELECT count(*) FROM retention_applied")
    return bool(stored >= total)


async def test_pruning_under_traffic_and_an_old_message_redelivered_after_its_row_was_pruned(
    database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Every message applied once while rows are pruned; a full replay of pruned offsets applies nothing."""
    topic, name = f"{topic_prefix}traffic", f"{topic_prefix}retention"
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, PARTITIONS)])
    conn = await connect(database_url)
    await conn.execute("CREATE TABLE retention_effects (n bigserial PRIMARY KEY, message_id text NOT NULL)")
    # How many messages went to the topic, to know when a replay has read everything.
    await conn.execute("CREATE TABLE retention_applied (i integer PRIMARY KEY)")
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=5)
    await producer.start()
    pruner = Pruner(database_url, FAST)
    pruning = asyncio.create_task(pruner.run())
    consumer = _consumer(name, topic, kafka_bootstrap, database_url)
    consuming = asyncio.create_task(consumer.run())
    try:
        # Traffic in waves while the pruner runs: rows of earlier waves are pruned under the later ones.
        for wave in range(0, TRAFFIC, 50):
            await _produce(producer, topic, range(wave, wave + 50))
            await conn.executemany("INSERT INTO retention_applied VALUES ($1)", [(i,) for i in range(wave, wave + 50)])
            await asyncio.sleep(0.15)
        await wait_for(
            lambda: conn.fetchval("SELECT count(*) = $1 FROM retention_effects", TRAFFIC), timeout=90,
            what="every message applied",
        )  # fmt: skip
        # Let the pruner delete (almost) every row: at most the last unsettled wave stays.
        await wait_for(
            lambda: conn.fetchval("SELECT count(*) < $1 FROM consumer_inbox WHERE consumer = $2", TRAFFIC // 4, name),
            timeout=60, what="inbox rows pruned",
        )  # fmt: skip
        pruned = TRAFFIC - await conn.fetchval("SELECT count(*) FROM consumer_inbox WHERE consumer = $1", name)
        floors = await conn.fetch(
            "SELECT partition, pruned_through FROM consumer_inbox_floors WHERE consumer = $1 AND topic = $2", name, topic
        )
        assert len(floors) == PARTITIONS and all(f["pruned_through"] >= 0 for f in floors)

        # The redelivery: the offsets are lost, the consumer reads every partition from offset 0
        # again, the pruned messages among them.
        consumer.stop()
        await asyncio.wait_for(consuming, 30)
        await conn.execute("DELETE FROM consumer_offsets WHERE consumer = $1", name)
        duplicates_before = MESSAGES.labels(name, "duplicate")._value.get()
        consumer = _consumer(name, topic, kafka_bootstrap, database_url)
        consuming = asyncio.create_task(consumer.run())
        await wait_for(lambda: _caught_up(conn, name, topic), timeout=90, what="replay read to the end")
        duplicates = MESSAGES.labels(name, "duplicate")._value.get() - duplicates_before
        assert duplicates == TRAFFIC, "every replayed message is a duplicate, pruned row or not"
        assert consumer.processed == 0
        assert pruned > TRAFFIC // 2

        # New traffic after the replay is applied: the floor never hides a new offset.
        await _produce(producer, topic, range(TRAFFIC, TRAFFIC + 40))
        await conn.executemany("INSERT INTO retention_applied VALUES ($1)", [(i,) for i in range(TRAFFIC, TRAFFIC + 40)])
        await wait_for(
            lambda: conn.fetchval("SELECT count(*) = $1 FROM retention_effects", TRAFFIC + 40), timeout=60,
            what="new messages applied",
        )  # fmt: skip
        rows = await conn.fetch("SELECT message_id, count(*) AS n FROM retention_effects GROUP BY message_id")
        assert {r["message_id"] for r in rows} == {f"m-{i}" for i in range(TRAFFIC + 40)}, "nothing lost"
        assert all(r["n"] == 1 for r in rows), "nothing applied twice"
    finally:
        consumer.stop()
        pruner.stop()
        for task in (consuming, pruning):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 30)
        await producer.stop()
        await conn.close()


async def test_an_outbox_row_that_may_be_sent_again_keeps_the_inbox_rows_of_its_copies(database_url: str) -> None:
    """A row tried but not marked published may reach Kafka again under a new offset: inbox rows since stay."""
    conn = await connect(database_url)
    try:
        pruner = Pruner(database_url, FAST.model_copy(update={"settle_seconds": 0}))
        async with conn.transaction():
            await enqueue(conn, [OutboxMessage(message_id="resend-me", topic="t", key=None, payload=b"{}", headers={})])
        await conn.execute("UPDATE outbox SET send_attempts = 1, created_at = now() - interval '1 hour'")
        rows = [("c", f"old-{i}", "t", 0, i, timedelta(hours=2)) for i in range(3)]
        rows += [("c", f"since-{i}", "t", 0, 10 + i, timedelta(minutes=30)) for i in range(3)]
        await conn.executemany(
            'INSERT INTO consumer_inbox (consumer, message_id, topic, partition, "offset", processed_at)'
            " VALUES ($1, $2, $3, $4, $5, now() - $6::interval)",
            rows,
        )
        for _ in range(3):  # raise, settle, delete
            await pruner.cycle(conn)
        left = {r["message_id"] for r in await conn.fetch("SELECT message_id FROM consumer_inbox")}
        assert left == {f"since-{i}" for i in range(3)}, "rows processed before the row was created may go"

        await conn.execute("UPDATE outbox SET published_at = now()")
        for _ in range(3):
            await pruner.cycle(conn)
        assert await conn.fetchval("SELECT count(*) FROM consumer_inbox") == 0
        floor = await conn.fetchval("SELECT pruned_through FROM consumer_inbox_floors WHERE consumer = 'c'")
        assert floor == 12
    finally:
        await conn.close()


async def test_published_outbox_rows_and_resolved_dead_letters_go_after_their_age(database_url: str) -> None:
    """Unpublished rows and unresolved dead letters stay whatever their age; the others go after theirs."""
    conn = await connect(database_url)
    try:
        config = RetentionConfig(outbox_keep_hours=1, dead_letters_keep_days=1, batch_rows=2)
        async with conn.transaction():
            await enqueue(
                conn,
                [OutboxMessage(message_id=f"o{i}", topic="t", key=None, payload=b"{}", headers={}) for i in range(5)],
            )
        await conn.execute("UPDATE outbox SET published_at = now() - interval '2 hours' WHERE message_id IN ('o0','o1','o2')")
        await conn.execute("UPDATE outbox SET published_at = now() WHERE message_id = 'o3'")
        await conn.execute(
            'INSERT INTO dead_letters (consumer, topic, partition, "offset", reason, resolved_at)'
            " VALUES ('c', 't', 0, 1, 'x', now() - interval '2 days'), ('c', 't', 0, 2, 'x', NULL),"
            " ('c', 't', 0, 3, 'x', now())"
        )
        result = await Pruner(database_url, config).cycle(conn)
        assert result.deleted == {"consumer_inbox": 0, "outbox": 3, "dead_letters": 1, "verification_jobs": 0}
        assert {r[0] for r in await conn.fetch("SELECT message_id FROM outbox")} == {"o3", "o4"}
        assert {r[0] for r in await conn.fetch('SELECT "offset" FROM dead_letters')} == {2, 3}
    finally:
        await conn.close()


def test_the_inbox_cutoff_is_the_broker_retention_plus_margin_and_never_past_a_resendable_row() -> None:
    from datetime import UTC, datetime

    now = datetime(2026, 1, 10, tzinfo=UTC)
    config = RetentionConfig(broker_retention_hours=168, inbox_margin_hours=24)
    assert inbox_cutoff(now, config, None) == now - timedelta(days=8)
    older = now - timedelta(days=9)
    assert inbox_cutoff(now, config, older) == older
    assert inbox_cutoff(now, config, now - timedelta(days=1)) == now - timedelta(days=8)


async def test_the_indexer_process_runs_the_pruner_and_exports_table_sizes(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """`escrowd index run`: an old published outbox row is pruned, and the sizes are on /metrics."""
    conn = await connect(database_url)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = write_config(
        tmp_path / "indexer.yaml", database_url=database_url, kafka_bootstrap=kafka_bootstrap,
        topic=f"{topic_prefix}events", chains=[chain_config(devnet)], metrics_port=port,
        retention={"outbox_keep_hours": 1, "interval_seconds": 0.2},
    )  # fmt: skip
    async with conn.transaction():
        await enqueue(conn, [OutboxMessage(message_id=f"o{i}", topic="t", key=None, payload=b"{}", headers={})
                             for i in range(2)])  # fmt: skip
    await conn.execute("UPDATE outbox SET published_at = now() - interval '2 hours' WHERE message_id = 'o0'")
    await conn.execute("UPDATE outbox SET published_at = now() WHERE message_id = 'o1'")
    process = IndexerProcess(config).start()
    try:
        async def pruned() -> bool:
            assert process.running, process.output()
            return bool(await conn.fetchval("SELECT array_agg(message_id) = '{o1}' FROM outbox"))

        await wait_for(pruned, timeout=60, what="the old published row pruned")

        async def exported() -> str | None:
            with contextlib.suppress(OSError):
                async with ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as reply:
                    text = await reply.text()
                    # A cycle is counted once it has set the sizes, after its deletes.
                    done = re.search(r'escrowd_retention_cycles_total\{outcome="ok"\} [1-9]', text)
                    return text if done and 'deleted_rows_total{table="outbox"} 1.0' in text else None
            return None

        await wait_for(exported, timeout=30, what="the pruner's metrics")
        text = await exported() or ""
        assert re.search(r'escrowd_table_bytes\{table="outbox"\} [1-9]', text), "a real size, not the 0 of start"
        assert 'escrowd_table_bytes{table="consumer_inbox"}' in text
        assert 'escrowd_retention_overdue_seconds{table="outbox"} 0.0' in text
    finally:
        process.cleanup()
        await conn.close()


async def test_escrowd_run_wires_the_pruner_in(devnet: Devnet, database_url: str, kafka_bootstrap: str) -> None:
    """`escrowd run` (one process) has a retention component: run alone, it prunes an old published outbox row."""
    from escrowd import pipeline_parts
    from escrowd.pipeline_config import PipelineConfig
    from runtime.db import migrate_url

    await migrate_url(database_url)
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    config = PipelineConfig(database_url, kafka_bootstrap, devnet, api_port=ports[0], metrics_port=ports[1])
    parts = await pipeline_parts.components(config, asyncio.Event())
    retention = next(part for part in parts if part.name == "retention")
    conn = await connect(database_url)
    try:
        async with conn.transaction():
            await enqueue(conn, [OutboxMessage(message_id=f"p{i}", topic="t", key=None, payload=b"{}", headers={})
                                 for i in range(2)])  # fmt: skip
        await conn.execute("UPDATE outbox SET published_at = now() - interval '2 days' WHERE message_id = 'p0'")
        await conn.execute("UPDATE outbox SET published_at = now() WHERE message_id = 'p1'")
        running: asyncio.Future[None] = asyncio.ensure_future(retention.run())
        try:
            await wait_for(
                lambda: conn.fetchval("SELECT array_agg(message_id) = '{p1}' FROM outbox"), timeout=60,
                what="the old published row pruned by the pipeline's pruner",
            )  # fmt: skip
        finally:
            assert retention.stop is not None
            retention.stop()
            await asyncio.wait_for(running, 30)
    finally:
        await conn.close()
