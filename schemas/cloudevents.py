"""CloudEvents 1.0 binary-mode headers and topic shapes: the wire contract, no I/O.

Every producer and consumer builds and reads Kafka headers through these helpers; the Kafka
client code that sends them lives in `runtime.kafka`.
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
