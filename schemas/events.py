"""Escrow event messages: the payload of every record on `escrow.events.v1`.

Records are CloudEvents 1.0 in binary mode: the attributes travel as Kafka headers
(`ce_id` = the event id, `ce_type` = `io.escrowd.escrow.<Event>.v1`, `ce_source` =
`escrowd/indexer/<chain id>/<escrow address>`, `ce_subject` = the task id, `ce_time` = the
block time) and this model is the JSON body. The key is `<chain id>:<task id>` so that one
task's events stay in order on one partition.

The per-event `args` models are built from the contract ABI, the one source of truth for
field names and types: `uint*` become integers, `address` a checksummed hex string,
`bytes32` a 0x-prefixed hex string, `bool` a boolean.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from schemas.abi import escrow_events

EVENT_TYPE_PREFIX = "io.escrowd.escrow."
EVENT_TYPE_SUFFIX = ".v1"


def event_type(event_name: str) -> str:
    """The CloudEvents type of an escrow event."""
    return f"{EVENT_TYPE_PREFIX}{event_name}{EVENT_TYPE_SUFFIX}"


def event_id(chain_id: int, block_hash: str, log_index: int) -> str:
    """The deterministic id of an event: unique per chain, block and log position."""
    return f"{chain_id}:{block_hash}:{log_index}"


def retraction_id(original_id: str) -> str:
    """The message id of the retraction of message `original_id` (sent when a reorg removed it)."""
    return f"{original_id}:removed"


def incarnation_id(event_id_: str, incarnation: int) -> str:
    """The message id of an event published again after a reorg undid its retraction.

    A reorg A → B → A brings back the very same event (same block hash, same log index);
    consumers saw its first message and its retraction already, so the comeback needs a
    new message id: `<event id>#<n>` for the n-th return (the first publication is plain).
    """
    return event_id_ if incarnation == 0 else f"{event_id_}#{incarnation}"


def message_key(chain_id: int, task_id: int | None, escrow_address: str) -> bytes:
    """Kafka key: chain and task, so a task's events share a partition and keep their order."""
    if task_id is None:
        return f"{chain_id}:escrow:{escrow_address.lower()}".encode()
    return f"{chain_id}:{task_id}".encode()


_PY_TYPES: dict[str, Any] = {"address": str, "bool": bool, "bytes32": str, "string": str}


def _python_type(solidity_type: str) -> Any:
    if solidity_type.startswith(("uint", "int")):
        return int
    return _PY_TYPES.get(solidity_type, Any)


@functools.cache
def event_args_models() -> dict[str, type[BaseModel]]:
    """One pydantic model per escrow event, for its decoded `args`."""
    models: dict[str, type[BaseModel]] = {}
    for entry in escrow_events():
        fields: dict[str, Any] = {
            inp["name"]: (_python_type(inp["type"]), Field(description=f"{inp['type']}"))
            for inp in entry["inputs"]
        }
        models[entry["name"]] = create_model(
            f"{entry['name']}Args", __config__=ConfigDict(extra="forbid", frozen=True), **fields
        )
    return models


def event_names() -> tuple[str, ...]:
    """Names of every event the escrow emits."""
    return tuple(event_args_models())


class EscrowEventMessage(BaseModel):
    """One escrow event as indexed from the chain, or its retraction (`removed: true`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(description="Deterministic event id: <chain id>:<block hash>:<log index>")
    chain_id: int
    escrow_address: str
    block_number: int
    block_hash: str
    block_timestamp: int = Field(description="Block time, unix seconds (chain time, not wall time)")
    tx_hash: str
    tx_index: int
    log_index: int
    event: str = Field(description="Event name as in the contract ABI")
    task_id: int | None = Field(description="The task the event is about; null for escrow-wide events")
    args: dict[str, Any] = Field(description="Decoded event fields, named as in the ABI")
    removed: bool = Field(default=False, description="True when a reorg removed this event")

    def typed_args(self) -> BaseModel:
        """`args` validated against the event's own model (raises on a mismatch)."""
        model = event_args_models().get(self.event)
        if model is None:
            raise ValueError(f"unknown escrow event {self.event!r}")
        return model.model_validate(self.args)

