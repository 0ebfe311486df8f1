"""`escrowd index`: every configured chain, the outbox publisher and the metrics endpoint."""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from indexer import metrics
from indexer.config import IndexerSettings
from indexer.service import ChainIndexer
from runtime.db import migrate_url
from runtime.finalstream import FinalizedStream
from runtime.health import mark, start_server
from runtime.kafka import ensure_topics, make_producer, start_producer
from runtime.outbox import OutboxPublisher
from runtime.retention import Pruner
from schemas.topics import all_topics

log = structlog.get_logger(__name__)


async def run_indexer(settings: IndexerSettings, stop: asyncio.Event | None = None) -> None:
    """Run until `stop` (the service shell sets it on SIGTERM/SIGINT): index every chain and publish the outbox."""
    stop = stop or asyncio.Event()
    await migrate_url(settings.database_url)
    topics = list(all_topics(settings.topic_partitions))
    if settings.events_topic not in {t.name for t in topics}:
        from runtime.kafka import TopicSpec

        topics.append(TopicSpec(settings.events_topic, settings.topic_partitions))
    if settings.finalized_topic is not None and settings.finalized_topic not in {t.name for t in topics}:
        from runtime.kafka import TopicSpec

        topics.append(TopicSpec(settings.finalized_topic, settings.topic_partitions))
    await ensure_topics(settings.kafka_bootstrap, topics)
    if settings.metrics_port is not None:
        start_server(settings.metrics_port)
    metrics.at_start({chain.chain_id: len(chain.rpc_urls) for chain in settings.chains})
    producer = None
    publisher = None
    final_stream = None
    if settings.run_publisher:
        producer = make_producer(settings.kafka_bootstrap, client_id="escrowd-indexer")
        await start_producer(producer)
        publisher = OutboxPublisher(settings.database_url, producer)
    indexers = [
        ChainIndexer(
            chain,
            database_url=settings.database_url,
            topic=settings.events_topic,
            finalized_stream=settings.finalized_topic is not None,
            # The publisher in this process takes each committed window from memory.
            on_commit=publisher.committed if publisher is not None else None,
        )
        for chain in settings.chains
    ]
    for ix in indexers:
        metrics.RANGE_SIZE.labels(ix.chain_label).set(ix.sizer.size)  # moves only when the sizer adapts
    tasks = [asyncio.create_task(ix.run(stop), name=f"index-{ix.chain.chain_id}") for ix in indexers]
    if publisher is not None:
        tasks.append(asyncio.create_task(publisher.run(), name="outbox-publisher"))
        if settings.finalized_topic is not None:
            final_stream = FinalizedStream(settings.database_url, publisher, settings.finalized_topic)
            tasks.append(asyncio.create_task(final_stream.run(), name="finalized-stream"))
    pruner = None
    if settings.retention.enabled:
        pruner = Pruner(settings.database_url, settings.retention)
        tasks.append(asyncio.create_task(pruner.run(), name="retention"))
    stopper = asyncio.create_task(stop.wait())
    mark("indexer", True)
    log.info(
        "indexer_ready",
        chains=[chain.chain_id for chain in settings.chains],
        topic=settings.events_topic,
        publisher=settings.run_publisher,
        retention=settings.retention.enabled,
        finalized_topic=settings.finalized_topic,
        metrics_port=settings.metrics_port,
    )
    try:
        done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopper and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        stop.set()
        if publisher is not None:
            publisher.stop()
        if final_stream is not None:
            final_stream.stop()
        if pruner is not None:
            pruner.stop()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 10)
        stopper.cancel()
        if producer is not None:
            await producer.stop()
        mark("indexer", False)
        log.info("indexer_stopped")
