"""Kafka plumbing shared by every service: producers, topic creation and CloudEvents headers.

Nothing here uses the idempotent producer or transactions (Tansu lacks both): delivery is
at-least-once from the outbox, and every message carries a deterministic `ce_id` that
consumers deduplicate on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

# The header and topic shapes are part of the shared contract (`schemas`); re-exported here
# so the Kafka plumbing keeps one import point.
from schemas.cloudevents import (
    CE_SPECVERSION,
    CONTENT_TYPE,
    MAX_HEADER_CHARS,
    TopicSpec,
    cloudevent_headers,
    decode_headers,
    encode_headers,
    iso_time,
)

__all__ = [
    "CE_SPECVERSION",
    "CONTENT_TYPE",
    "MAX_HEADER_CHARS",
    "TopicSpec",
    "cloudevent_headers",
    "decode_headers",
    "encode_headers",
    "ensure_topics",
    "iso_time",
    "make_producer",
    "start_producer",
]

def make_producer(bootstrap: str, *, client_id: str = "escrowd") -> AIOKafkaProducer:
    """A producer tuned for awaited batches: large batches, a short linger, acks from all."""
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        acks="all",
        enable_idempotence=False,
        max_batch_size=256 * 1024,
        linger_ms=1,
        request_timeout_ms=15000,
        retry_backoff_ms=100,
    )


async def start_producer(producer: AIOKafkaProducer) -> None:
    """Start `producer`; when the broker cannot be reached, close it before raising (no
    "Unclosed AIOKafkaProducer" noise after the one-line start-up error)."""
    try:
        await producer.start()
    except BaseException:
        with contextlib.suppress(Exception):
            await producer.stop()
        raise


async def ensure_topics(bootstrap: str, topics: Iterable[TopicSpec]) -> None:
    """Create the topics that do not exist yet (existing ones are left as they are)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = [t for t in topics if t.name not in existing]
        if not wanted:
            return
        new = []
        for spec in wanted:
            config = dict(spec.config)
            if spec.compacted:
                config.setdefault("cleanup.policy", "compact")
            new.append(NewTopic(spec.name, spec.partitions, 1, topic_configs=config or None))
        with contextlib.suppress(TopicAlreadyExistsError):
            await admin.create_topics(new)
    finally:
        await admin.close()
