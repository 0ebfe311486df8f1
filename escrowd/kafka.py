"""Kafka plumbing shared by every service: producers, topic creation and CloudEvents headers.

Nothing here uses the idempotent producer or transactions (Tansu lacks both): delivery is
at-least-once from the outbox, and every message carries a deterministic `ce_id` that
consumers deduplicate on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

CE_SPECVERSION = "1.0"
CONTENT_TYPE = "application/json"


@dataclass(frozen=True)
class TopicSpec:
    """A topic this project writes to."""

    name: str
    partitions: int = 4
    compacted: bool = False
    config: dict[str, str] = field(default_factory=dict)


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


def iso_time(unix_seconds: int | float) -> str:
    """RFC 3339 time for `ce_time`."""
    return datetime.fromtimestamp(unix_seconds, tz=UTC).isoformat().replace("+00:00", "Z")


def cloudevent_headers(
    *, id: str, source: str, type: str, subject: str | None, time: str | None
) -> dict[str, str]:
    """The binary-mode CloudEvents 1.0 attributes as Kafka headers (`ce_` prefix)."""
    headers = {
        "ce_specversion": CE_SPECVERSION,
        "ce_id": id,
        "ce_source": source,
        "ce_type": type,
        "content-type": CONTENT_TYPE,
    }
    if subject is not None:
        headers["ce_subject"] = subject
    if time is not None:
        headers["ce_time"] = time
    return headers


def encode_headers(headers: dict[str, str]) -> list[tuple[str, bytes]]:
    """Kafka header list from a str mapping."""
    return [(k, v.encode()) for k, v in headers.items()]


MAX_HEADER_CHARS = 4096
"""Longest header name or value kept; longer ones are cut (a `ce_id` that long is refused anyway)."""


def decode_headers(headers: Sequence[tuple[str, bytes | None]] | None) -> dict[str, str]:
    """Str mapping from a Kafka header list; never raises, whatever the bytes.

    Undecodable bytes become U+FFFD, and so does NUL (PostgreSQL text cannot hold it); a
    null value is the empty string; values are cut at `MAX_HEADER_CHARS`.
    """
    decoded: dict[str, str] = {}
    for key, value in headers or ():
        name = str(key).replace("\x00", "\ufffd")[:MAX_HEADER_CHARS]
        text = value.decode("utf-8", "replace") if isinstance(value, bytes | bytearray) else ""
        decoded[name] = text.replace("\x00", "\ufffd")[:MAX_HEADER_CHARS]
    return decoded
