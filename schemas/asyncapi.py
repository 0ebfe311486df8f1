"""The AsyncAPI 3.0 document of every topic, generated from the channel catalog and the models.

`escrowd schemas export` writes it to `schemas/asyncapi.yaml` beside the JSON Schema files
it points to (`schemas/jsonschema/`, by relative `$ref`, so each schema is defined once); a
test fails when the committed file is stale, and the suite validates it with the AsyncAPI
reference parser. Pure: builds a mapping, renders YAML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from schemas.channels import CHANNELS, Channel, Message
from schemas.cloudevents import CE_SPECVERSION, CONTENT_TYPE
from schemas.topics import ESCROW_EVENTS, ESCROW_EVENTS_FINALIZED, all_topics

ASYNCAPI_FILE = Path(__file__).parent / "asyncapi.yaml"
KAFKA_BINDING_VERSION = "0.5.0"
SCHEMA_FORMAT = "application/schema+json;version=draft-07"

GUARANTEES = """\
Records are CloudEvents 1.0 in Kafka binary mode: the attributes travel as `ce_*` headers and the
record value is the JSON body described here. What every topic guarantees:

- **Order per key.** Each topic's key (a task, an agent, an account) picks the partition, so one
  key's records arrive in the order they were published. Nothing is ordered across keys.
- **At least once.** A record may arrive more than once (a publisher that crashed between send and
  record, a consumer group rebalance). `ce_id` is deterministic: the same fact always carries the
  same id, so deduplicate on `ce_id`.
- **Retractions.** On `escrow.events.v1` a reorg that removed an event is published as the same
  event with `removed: true` under `<event id>:removed`; an event that comes back is published
  again under `<event id>#<n>`. Derived topics publish their new whole state instead.
- **Compacted topics** (`escrow.tasks.v1`, `escrow.reputation.v1`, `escrow.panel-calibration.v1`)
  hold at least the newest record of every key: the newest record of a key is its state.
- **Sequence.** Every record but the escrow events carries `ce_sequence` (the CloudEvents
  `sequence` extension): a send retried after a broker failure can put an older record of a key
  after a newer one, so a view of a key's whole state keeps the record with the highest sequence.
- **Versions.** A topic's name ends in its major version. Within `v1` fields may be added and
  new `ce_type`s may appear; no field is removed, renamed or retyped. An incompatible change is a
  new topic (`v2`), published beside `v1` for a migration period.

See docs/subscribing.md for the rules a subscriber follows.
"""


_SEQUENCE_HEADER = {
    "type": "string", "pattern": "^[0-9]{20}$",
    "description": (
        "CloudEvents `sequence` extension: the publisher's order, 20 digits (text order is number"
        " order). Of two records of one key, the higher sequence was computed later, whatever their"
        " offsets: a view of the key's whole state keeps the highest"
    ),
}
EVENT_LOG_TOPICS = frozenset({ESCROW_EVENTS, ESCROW_EVENTS_FINALIZED})
"""Published from the indexer's event log, in chain order (no `ce_sequence`); every other topic
is published from the outbox, with one."""


def _headers(ce_type: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "ce_specversion": {"type": "string", "const": CE_SPECVERSION},
        "ce_id": {"type": "string", "description": "Deterministic id of the fact: deduplicate on it"},
        "ce_source": {"type": "string", "description": "The publishing service (and chain and escrow for indexed events)"},
        "ce_type": {"type": "string", "const": ce_type},
        "ce_subject": {"type": "string", "description": "What the record is about (task id, agent, original id)"},
        "ce_time": {"type": "string", "format": "date-time", "description": "Chain time of indexed events (block time)"},
        "content-type": {"type": "string", "const": CONTENT_TYPE},
    }
    properties.update(extra or {})
    return {
        "type": "object",
        "required": ["ce_specversion", "ce_id", "ce_source", "ce_type", "content-type"],
        "properties": properties,
    }


_DLQ_HEADERS = {
    name: {"type": "string", "description": description}
    for name, description in (
        ("dlq_reason", "Why the consumer refused the record"),
        ("dlq_consumer", "The consumer group that refused it"),
        ("dlq_topic", "The topic it came from"),
        ("dlq_partition", "Its partition there"),
        ("dlq_offset", "Its offset there"),
        ("dlq_payload_omitted", "Present when the body was too large to copy (it is kept in the database)"),
    )
}


def _schema_ref(name: str) -> dict[str, Any]:
    return {"$ref": f"jsonschema/{name}.json"}


def _payload(channel: Channel, message: Message) -> dict[str, Any]:
    if channel.topic == "escrow.events.v1":
        schema: dict[str, Any] = {
            "allOf": [
                _schema_ref("EscrowEventMessage"),
                {
                    "type": "object",
                    "properties": {"event": {"const": message.name}, "args": _schema_ref(message.schema)},
                },
            ]
        }
    elif message.schema:
        schema = _schema_ref(message.schema)
    else:
        schema = {"description": "The refused record's body, unchanged (any bytes)"}
    return {"schemaFormat": SCHEMA_FORMAT, "schema": schema}


def channel_id(topic: str) -> str:
    """The channel's id in the document: the topic name without dots and dashes, camel case."""
    words = topic.removesuffix(".v1").replace("-", ".").split(".")
    return words[0] + "".join(w.capitalize() for w in words[1:])


def document() -> dict[str, Any]:
    """The whole AsyncAPI 3.0 document."""
    specs = {spec.name: spec for spec in all_topics()}
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for entry in CHANNELS:
        spec = specs[entry.topic]
        cid = channel_id(entry.topic)
        refs: dict[str, Any] = {}
        for message in entry.messages:
            mid = f"{cid}.{message.name}"
            extra = dict(_DLQ_HEADERS) if entry.topic == "escrow.dlq.v1" else {}
            if entry.topic not in EVENT_LOG_TOPICS:
                extra["ce_sequence"] = _SEQUENCE_HEADER
            messages[mid] = {
                "name": message.name,
                "title": message.ce_type,
                "summary": message.summary,
                "contentType": CONTENT_TYPE,
                "headers": {"schemaFormat": SCHEMA_FORMAT, "schema": _headers(message.ce_type, extra)},
                "payload": _payload(entry, message),
                "bindings": {
                    "kafka": {
                        "key": {"type": "string", "description": entry.key},
                        "bindingVersion": KAFKA_BINDING_VERSION,
                    }
                },
            }
            refs[message.name] = {"$ref": f"#/components/messages/{mid}"}
        channels[cid] = {
            "address": entry.topic,
            "summary": entry.summary,
            **({"description": entry.description} if entry.description else {}),
            "messages": refs,
            "bindings": {
                "kafka": {
                    "topic": entry.topic,
                    "partitions": spec.partitions,
                    "topicConfiguration": {"cleanup.policy": ["compact" if spec.compacted else "delete"]},
                    "bindingVersion": KAFKA_BINDING_VERSION,
                }
            },
        }
        operations[f"publish.{cid}"] = {
            "action": "send",
            "channel": {"$ref": f"#/channels/{cid}"},
            "summary": f"Published by {entry.publisher}",
            "messages": [{"$ref": f"#/channels/{cid}/messages/{name}"} for name in refs],
        }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "escrowd event API",
            "version": "1.0.0",
            "description": GUARANTEES,
            "license": {"name": "Apache-2.0"},
        },
        "defaultContentType": CONTENT_TYPE,
        "servers": {
            "kafka": {
                "host": "{bootstrap}",
                "protocol": "kafka",
                "description": "The marketplace's Kafka cluster",
                "variables": {"bootstrap": {"default": "localhost:9092", "description": "host:port of a broker"}},
            }
        },
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, so the prose reads as written."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render() -> str:
    """The document as YAML, stable across runs."""
    header = "# Generated by `escrowd schemas export` from schemas/channels.py and the models; do not edit.\n"
    body = yaml.dump(document(), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
    return header + body
