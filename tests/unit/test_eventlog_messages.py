"""A log row becomes the same message the per-event outbox row used to carry.

`runtime.eventlog.MessageBuilder` builds an event's message from its `escrow_events` row
(the args spliced in as PostgreSQL's `jsonb` text); it must agree with
`indexer.store.event_message` on the id, key, headers and body, and validate as an
`EscrowEventMessage`, for events, retractions and comebacks after A → B → A.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from indexer.decode import DecodedLog
from indexer.store import event_message
from runtime.eventlog import MessageBuilder
from schemas.events import EscrowEventMessage, event_id, incarnation_id

BLOCK_HASH = "0x" + "ab" * 32


def _event(task_id: int | None, args: dict[str, Any]) -> DecodedLog:
    return DecodedLog(
        id=event_id(5, BLOCK_HASH, 3), chain_id=5, escrow_address="0x" + "e" * 40, block_number=77,
        block_hash=BLOCK_HASH, block_timestamp=1_700_000_000, tx_hash="0x" + "cd" * 32, tx_index=1,
        log_index=3, event="TaskCreated", task_id=task_id, args=args,
    )  # fmt: skip


def _row(event: DecodedLog, *, retracted_as: str | None = None) -> dict[str, Any]:
    # As PostgreSQL returns `args::text` for jsonb: spaces after ':' and ','.
    return {
        "position": 12,
        "event_id": event.id,
        "escrow_address": event.escrow_address,
        "block_number": event.block_number,
        "block_hash": event.block_hash,
        "block_timestamp": event.block_timestamp,
        "tx_hash": event.tx_hash,
        "tx_index": event.tx_index,
        "log_index": event.log_index,
        "event_name": event.event,
        "task_id": event.task_id,
        "args": json.dumps(event.args, separators=(", ", ": ")),
        "retracted_as": retracted_as,
    }


def _same(built: Any, expected: Any) -> None:
    assert built.message_id == expected.message_id
    assert built.key == expected.key
    assert {k: v.decode() for k, v in built.headers} == expected.headers
    assert json.loads(built.payload) == json.loads(expected.payload)
    EscrowEventMessage.model_validate_json(built.payload)


@settings(max_examples=50, deadline=None)
@given(
    task_id=st.one_of(st.none(), st.integers(min_value=0, max_value=2**256 - 1)),
    amount=st.integers(min_value=0, max_value=2**256 - 1),
    incarnation=st.integers(min_value=0, max_value=3),
)
def test_an_event_row_is_the_outbox_message(task_id: int | None, amount: int, incarnation: int) -> None:
    event = _event(task_id, {"taskId": task_id or 0, "amount": amount, "poster": "0x" + "a" * 40})
    built = MessageBuilder().build(5, _row(event), incarnation)
    _same(built, event_message(event, "t", message_id=incarnation_id(event.id, incarnation)))
    assert built.position == 12 and built.block_number == 77


@pytest.mark.parametrize("incarnation", [0, 2])
def test_a_retraction_row_retracts_the_published_message(incarnation: int) -> None:
    event = _event(9, {"taskId": 9, "amount": 1})
    published_as = incarnation_id(event.id, incarnation)
    built = MessageBuilder().build(5, _row(event, retracted_as=published_as), 0)
    _same(built, event_message(event, "t", removed=True, message_id=published_as))
    assert built.block_number is None, "retractions are never held back"
    assert json.loads(built.payload)["removed"] is True
