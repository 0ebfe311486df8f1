"""CloudEvents 1.0 binary-mode headers and topic shapes: the wire contract, no I/O.

Every producer and consumer builds and reads Kafka headers through these helpers; the Kafka
client code that sends them lives in `escrowd.kafka`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

CE_SPECVERSION = "1.0"
CONTENT_TYPE = "application/json"


@dataclass(frozen=True)
class TopicSpec:
    """A topic this project writes to."""

    name: str
    partitions: int = 4
    compacted: bool = False
    config: dict[str, str] = field(default_factory=dict)


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


def decode_headers(headers: Sequence[tuple[str, bytes]] | None) -> dict[str, str]:
    """Str mapping from a Kafka header list; undecodable values are replaced, not fatal."""
    return {k: v.decode("utf-8", "replace") for k, v in (headers or ())}
