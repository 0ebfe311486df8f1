"""Check Kafka records against the committed AsyncAPI document (schemas/asyncapi.yaml).

Each record must be on a channel of the document, carry a `ce_type` that channel declares, and
have headers and a body valid against that message's schemas (JSON Schema draft 7, relative
`$ref`s resolved from the document's folder, as the AsyncAPI parser resolves them).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft7Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from schemas.asyncapi import ASYNCAPI_FILE

BASE = ASYNCAPI_FILE.parent


def _retrieve(uri: str) -> Resource[Any]:
    path = Path(uri.removeprefix("file://"))
    if BASE not in path.parents:
        raise LookupError(f"reference outside the schemas folder: {uri}")
    return Resource.from_contents(json.loads(path.read_text(encoding="utf-8")), default_specification=DRAFT7)


@cache
def _document() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(ASYNCAPI_FILE.read_text(encoding="utf-8"))
    return loaded


@cache
def _registry() -> Registry[Any]:
    return Registry(retrieve=_retrieve)  # type: ignore[call-arg]


def _resolve(ref: str) -> dict[str, Any]:
    node: Any = _document()
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    assert isinstance(node, dict)
    return node


@cache
def messages_by_topic() -> dict[str, dict[str, dict[str, Any]]]:
    """topic → ce_type → the message object of the document."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for channel in _document()["channels"].values():
        types: dict[str, dict[str, Any]] = {}
        for ref in channel["messages"].values():
            message = _resolve(ref["$ref"])
            ce_type = message["headers"]["schema"]["properties"]["ce_type"]["const"]
            types[ce_type] = message
        out[channel["address"]] = types
    return out


def _validator(schema: dict[str, Any]) -> Draft7Validator:
    # The document's own URI as the base, so `jsonschema/X.json` resolves beside it (in draft 7
    # the siblings of a `$ref` are ignored, `$id` included: hence the `allOf`).
    return Draft7Validator({"$id": ASYNCAPI_FILE.as_uri(), "allOf": [schema]}, registry=_registry())


def problems(topic: str, headers: dict[str, str], payload: Any) -> list[str]:
    """What is wrong with one record against the document (empty when it conforms)."""
    declared = messages_by_topic().get(topic)
    if declared is None:
        return [f"{topic}: not a channel of the document"]
    ce_type = headers.get("ce_type", "")
    message = declared.get(ce_type)
    if message is None:
        return [f"{topic}: ce_type {ce_type!r} is not declared for this channel"]
    found = [
        f"{topic} {ce_type} headers: {error.message}"
        for error in _validator(message["headers"]["schema"]).iter_errors(headers)
    ]
    found += [
        f"{topic} {ce_type} {headers.get('ce_id')}: {'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in _validator(message["payload"]["schema"]).iter_errors(payload)
    ]
    return found
