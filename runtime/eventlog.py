"""The indexer's event log, published by position behind one watermark row per chain.

The indexer writes each event once: an `escrow_events` row carrying a per-chain position
(assigned under the chain's cursor row lock, so positions become visible in commit order).
A reorg appends explicit retraction rows (`escrow_event_retractions`) to the same log. This
module reads the log after a chain's watermark and turns rows into Kafka messages; the
`OutboxPublisher` sends them next to the generic outbox's rows.

The watermark row (`event_log_watermarks`) holds:

* `published_through`: every position up to it is on Kafka (moved after the acks);
* `sending_through`: the highest position whose send was attempted, committed *before*
  the send. A crash between the send and the watermark move re-sends the positions in
  between, under the same message ids (an id is a function of the row), and consumers
  deduplicate them; a reorg rollback retracts every removed row up to `sending_through`,
  since it may be on Kafka.

The publisher and a rollback both take the watermark row `FOR UPDATE`, so a batch is either
read before the rollback (and is behind `sending_through` when the rollback looks) or after
it (and does not contain the removed rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import asyncpg

from schemas import jsoncodec
from schemas.cloudevents import CE_SPECVERSION, CONTENT_TYPE, iso_time
from schemas.events import event_type, incarnation_id, message_key, retraction_id

_LOG_COLUMNS = (
    "event_id, escrow_address, block_number, block_hash, block_timestamp, tx_hash, tx_index,"
    " log_index, event_name, task_id, args::text AS args"
)

LOG_AFTER_SQL = f"""
SELECT * FROM (
    (SELECT position, {_LOG_COLUMNS}, NULL::text AS retracted_as
     FROM escrow_events WHERE chain_id = $1 AND position > $2 ORDER BY position LIMIT $3)
    UNION ALL
    (SELECT position, {_LOG_COLUMNS}, retracted_as
     FROM escrow_event_retractions WHERE chain_id = $1 AND position > $2 ORDER BY position LIMIT $3)
) log ORDER BY position LIMIT $3
"""
"""The next log rows of a chain after a position, events and retractions in log order."""

INCARNATIONS_SQL = "SELECT event_id, retractions FROM event_retractions WHERE event_id = ANY($1::text[])"

UNPUBLISHED_SQL = """
SELECT EXISTS (
    SELECT 1 FROM chain_cursor c LEFT JOIN event_log_watermarks w ON w.chain_id = c.chain_id
    WHERE (SELECT max(e.position) FROM escrow_events e WHERE e.chain_id = c.chain_id)
              > COALESCE(w.published_through, 0)
       OR (SELECT max(r.position) FROM escrow_event_retractions r WHERE r.chain_id = c.chain_id)
              > COALESCE(w.published_through, 0)
)
"""
"""Whether any chain's log holds a row past its watermark (held back or not).

Each chain's last position is one step down the (chain_id, position) index from its end;
an `EXISTS (... position > watermark)` was planned as a sequential scan of the whole log."""


@dataclass(slots=True)
class LogMessage:
    """One log row as a Kafka message (not frozen: a frozen dataclass's field-by-field
    `object.__setattr__` was a fifth of building it; nothing mutates it)."""

    position: int
    message_id: str
    key: bytes
    payload: bytes
    headers: list[tuple[str, bytes]]
    block_number: int | None
    """The event's block; None for a retraction (never held back by confirmations)."""


class LogEvent(Protocol):
    """An event as the indexer committed it (`indexer.decode.DecodedLog`): what the
    publisher builds a message from when it is handed a committed window in memory."""

    id: str
    chain_id: int
    escrow_address: str
    block_number: int
    block_hash: str
    block_timestamp: int
    tx_hash: str
    tx_index: int
    log_index: int
    event: str
    task_id: int | None
    args: dict[str, Any]
    args_json: str


def args_json(event: LogEvent) -> str:
    """The event's args as the JSON stored in `escrow_events.args` (encoded once, at decode)."""
    return event.args_json or jsoncodec.dumps_str(event.args)


class MessageBuilder:
    """Builds messages from log rows.

    The CloudEvents headers that depend only on the row's shape (spec version, source, type,
    content type) are encoded once per (escrow, event) and reused; `ce_time` once per block
    time. Only the id, the subject and the body are built per row.
    """

    def __init__(self) -> None:
        self._shapes: dict[tuple[int, str, str], tuple[tuple[str, bytes], ...]] = {}
        self._times: dict[int, tuple[str, bytes]] = {}

    def _shape(self, chain_id: int, escrow: str, event_name: str) -> tuple[tuple[str, bytes], ...]:
        key = (chain_id, escrow, event_name)
        shape = self._shapes.get(key)
        if shape is None:
            if len(self._shapes) > 4096:
                self._shapes.clear()
            shape = self._shapes[key] = (
                ("ce_source", f"escrowd/indexer/{chain_id}/{escrow}".encode()),
                ("ce_type", event_type(event_name).encode()),
                ("content-type", CONTENT_TYPE.encode()),
            )
        return shape

    def _time(self, timestamp: int) -> tuple[str, bytes]:
        header = self._times.get(timestamp)
        if header is None:
            if len(self._times) > 4096:
                self._times.clear()
            header = self._times[timestamp] = ("ce_time", iso_time(timestamp).encode())
        return header

    def build(self, chain_id: int, row: asyncpg.Record, incarnation: int) -> LogMessage:
        """The message of one log row (`incarnation`: the event's retractions so far)."""
        retracted_as = row["retracted_as"]
        removed = retracted_as is not None
        message_id = retraction_id(retracted_as) if removed else incarnation_id(row["event_id"], incarnation)
        task_id = int(row["task_id"]) if row["task_id"] is not None else None
        escrow = row["escrow_address"]
        event_name = row["event_name"]
        timestamp = row["block_timestamp"]
        fields = {
            "id": row["event_id"],
            "chain_id": chain_id,
            "escrow_address": escrow,
            "block_number": row["block_number"],
            "block_hash": row["block_hash"],
            "block_timestamp": timestamp,
            "tx_hash": row["tx_hash"],
            "tx_index": row["tx_index"],
            "log_index": row["log_index"],
            "event": event_name,
            "task_id": task_id,
            "removed": removed,
        }
        # The args are spliced in as PostgreSQL returns them: no parse and re-encode per row.
        payload = b"%s,\"args\":%s}" % (jsoncodec.dumps(fields)[:-1], row["args"].encode())
        source, type_, content_type = self._shape(chain_id, escrow, event_name)
        headers = [_SPECVERSION, ("ce_id", message_id.encode()), source, type_, content_type]
        if task_id is not None:
            headers.append(("ce_subject", b"%d" % task_id))
        headers.append(self._time(timestamp))
        return LogMessage(
            position=row["position"],
            message_id=message_id,
            key=message_key(chain_id, task_id, escrow),
            payload=payload,
            headers=headers,
            block_number=None if removed else row["block_number"],
        )


    def build_event(self, position: int, event: LogEvent, incarnation: int) -> LogMessage:
        """The message of a committed event handed over in memory: the same id, key, headers
        and body as `build` makes of its row (the args as encoded for the row, not as
        PostgreSQL prints them back: the same JSON value)."""
        message_id = incarnation_id(event.id, incarnation)
        task_id = event.task_id
        escrow = event.escrow_address
        timestamp = event.block_timestamp
        chain_id = event.chain_id
        fields = {
            "id": event.id,
            "chain_id": chain_id,
            "escrow_address": escrow,
            "block_number": event.block_number,
            "block_hash": event.block_hash,
            "block_timestamp": timestamp,
            "tx_hash": event.tx_hash,
            "tx_index": event.tx_index,
            "log_index": event.log_index,
            "event": event.event,
            "task_id": task_id,
            "removed": False,
        }
        payload = b"%s,\"args\":%s}" % (jsoncodec.dumps(fields)[:-1], args_json(event).encode())
        source, type_, content_type = self._shape(chain_id, escrow, event.event)
        headers = [_SPECVERSION, ("ce_id", message_id.encode()), source, type_, content_type]
        if task_id is not None:
            headers.append(("ce_subject", b"%d" % task_id))
        headers.append(self._time(timestamp))
        return LogMessage(
            position=position,
            message_id=message_id,
            key=message_key(chain_id, task_id, escrow),
            payload=payload,
            headers=headers,
            block_number=event.block_number,
        )


_SPECVERSION = ("ce_specversion", CE_SPECVERSION.encode())


async def read_after(
    conn: asyncpg.Connection,
    chain_id: int,
    after: int,
    limit: int,
    *,
    line: int | None,
    sent_through: int = 0,
    builder: MessageBuilder | None = None,
) -> list[LogMessage]:
    """The publishable messages of a chain's log after position `after`, in log order.

    `line` is the confirmation line (cursor minus confirmations): the batch stops before the
    first event of a block above it, so the watermark never passes a held-back row (block
    numbers never decrease along the log). None: no hold-back.

    Rows up to `sent_through` (the watermark's `sending_through`) are never held back: they
    may be on Kafka already (a publisher died before moving `published_through`), and a
    reorg that lowered the line since may have put its retractions right behind them.
    Holding them again would hold those retractions until the chain grows `confirmations`
    blocks past the reorg, while consumers act on events that no longer exist.
    """
    rows = await conn.fetch(LOG_AFTER_SQL, chain_id, after, limit)
    if line is not None:
        for i, row in enumerate(rows):
            if row["retracted_as"] is None and row["position"] > sent_through and row["block_number"] > line:
                rows = rows[:i]
                break
    if not rows:
        return []
    # Only events that came back after a reorg have a count; one indexed look-up per batch.
    returned = await conn.fetch(INCARNATIONS_SQL, [r["event_id"] for r in rows if r["retracted_as"] is None])
    incarnations = {r["event_id"]: r["retractions"] for r in returned}
    build = (builder or MessageBuilder()).build
    return [build(chain_id, row, incarnations.get(row["event_id"], 0)) for row in rows]
