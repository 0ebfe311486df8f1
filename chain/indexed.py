"""Reading the indexer's tables (`escrow_events`, `chain_cursor`, `chain_blocks`): every SQL
statement the services run over them lives here.

The indexer writes these tables (`indexer/store.py`) and the event log's publisher reads
them by position (`runtime/eventlog.py`, a floor below); every other reader (verification
and the API, the lifecycle clock, the settlement relayer, the application's displays) goes
through this module, so a change of the indexer's schema has one place to follow. Queries
that join a service's own tables take the fragments below (`LATEST_STATUS_SQL`,
`CREATED_TASK_HASH_SQL`, `TASK_TIME_SQL`), so the indexer's side of the join is written
here too. Events come back as `chain.view.ChainEvent`, ready for the one fold.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from chain.view import ChainEvent, TaskKey
from runtime.db import columns

TaskRef = tuple[int, str, int]
"""(chain id, lower-case escrow, task id)."""

SETTLEMENT_EVENTS = ("TaskCreated", "EvidenceSubmitted", "VerificationCompleted")
"""The events the settlement relayer's verdict checks read."""

# Only the fields the settlement checks read, typed in SQL: no JSON decoding of whole `args`
# for the hundreds of tasks a batch of verdicts touches.
_SETTLEMENT_FIELDS = (
    "e.event_id, e.block_number, e.log_index, e.tx_hash, e.event_name,"
    " e.args->>'verifier' AS verifier, (e.args->>'attempt')::int AS attempt,"
    " e.args->>'evidenceHash' AS evidence_hash, (e.args->>'passed')::boolean AS passed,"
    " (e.args->>'score')::int AS score, (e.args->>'status')::int AS status"
)

LATEST_STATUS_SQL = (
    "(SELECT (e.args->>'status')::int FROM escrow_events e"
    " WHERE e.chain_id = {chain} AND e.task_id = {task} AND lower(e.escrow_address) = lower({escrow})"
    " AND e.args ? 'status' ORDER BY e.block_number DESC, e.log_index DESC LIMIT 1)"
)
"""A scalar subquery: the status of a task's newest indexed event that reports one."""

CREATED_TASK_HASH_SQL = (
    "(SELECT e.args->>'taskHash' AS task_hash FROM escrow_events e"
    " WHERE e.chain_id = {chain} AND e.task_id = {task} AND e.event_name = 'TaskCreated'"
    " AND lower(e.escrow_address) = lower({escrow}) LIMIT 1)"
)
"""A row subquery (for a LATERAL join): the `taskHash` of a task's indexed `TaskCreated`."""

TASK_TIME_SQL = (
    "SELECT b.timestamp FROM chain_cursor c"
    " JOIN chain_blocks b ON b.chain_id = c.chain_id AND b.block_number <= c.block_number - c.confirmations"
    " AND b.block_number < COALESCE((SELECT min(e.block_number) FROM escrow_events e"
    "   WHERE e.chain_id = {chain} AND e.task_id = {task} AND lower(e.escrow_address) = {escrow}"
    "   AND e.block_number <= c.block_number - c.confirmations"
    "   AND NOT {applied}),"
    "   9223372036854775807)"
    " WHERE c.chain_id = {chain} ORDER BY b.block_number DESC LIMIT 1"
)
"""The newest kept block time at or below the confirmation line and below the first of
the task's indexed events `{applied}` (a predicate over `e`) does not hold: the lifecycle
clock (`lifecycle/clock.py`)."""


def _event(row: asyncpg.Record, args: dict[str, Any]) -> ChainEvent:
    return ChainEvent(
        event_id=row["event_id"],
        block_number=int(row["block_number"]),
        log_index=int(row["log_index"]),
        tx_hash=row["tx_hash"],
        name=row["event_name"],
        args=args,
    )


def _settlement_event(row: asyncpg.Record) -> ChainEvent:
    args = {
        "verifier": row["verifier"],
        "attempt": row["attempt"],
        "evidenceHash": row["evidence_hash"],
        "passed": row["passed"],
        "score": row["score"],
        "status": row["status"],
    }
    return _event(row, {k: v for k, v in args.items() if v is not None})


async def task_events(conn: asyncpg.Connection, key: TaskKey) -> list[ChainEvent]:
    """A task's indexed events in chain order, with their whole `args`."""
    rows = await conn.fetch(
        "SELECT event_id, block_number, log_index, tx_hash, event_name, args FROM escrow_events"
        " WHERE chain_id = $1 AND task_id = $2 AND lower(escrow_address) = lower($3)"
        " ORDER BY block_number, log_index",
        key.chain_id,
        key.task_id,
        key.escrow,
    )
    return [_event(r, r["args"]) for r in rows]


async def settlement_events(conn: asyncpg.Connection, chain_id: int, escrow: str, task_id: int) -> list[ChainEvent]:
    """A task's `SETTLEMENT_EVENTS` in chain order, with the fields the verdict checks read."""
    rows = await conn.fetch(
        f"SELECT {_SETTLEMENT_FIELDS} FROM escrow_events e"
        " WHERE e.chain_id = $1 AND e.task_id = $2 AND lower(e.escrow_address) = $3"
        "   AND e.event_name = ANY($4::text[])"
        " ORDER BY e.block_number, e.log_index",
        chain_id,
        task_id,
        escrow.lower(),
        list(SETTLEMENT_EVENTS),
    )
    return [_settlement_event(r) for r in rows]


async def settlement_events_of(conn: asyncpg.Connection, keys: Sequence[TaskRef]) -> dict[TaskRef, list[ChainEvent]]:
    """`settlement_events` of many tasks in one statement; tasks with none are absent."""
    unique = sorted(set(keys))
    if not unique:
        return {}
    rows = await conn.fetch(
        # LATERAL with an ORDER BY inside (which keeps the planner from flattening it): one
        # probe of the task index per key, whatever the planner believes of the table (a fresh
        # table without statistics drew a scan and a sort of the whole table, 9-12 ms a burst).
        f"SELECT k.chain_id AS key_chain, k.escrow AS key_escrow, k.task_id AS key_task, {_SETTLEMENT_FIELDS}"
        " FROM unnest($1::bigint[], $2::text[], $3::numeric[]) AS k(chain_id, escrow, task_id)"
        " CROSS JOIN LATERAL (SELECT * FROM escrow_events x WHERE x.chain_id = k.chain_id AND x.task_id = k.task_id"
        "   AND lower(x.escrow_address) = k.escrow AND x.event_name = ANY($4::text[])"
        "   ORDER BY x.block_number, x.log_index) AS e"
        " ORDER BY e.block_number, e.log_index",
        *columns(unique, 3),
        list(SETTLEMENT_EVENTS),
    )
    grouped: dict[TaskRef, list[ChainEvent]] = {}
    for r in rows:
        key = (int(r["key_chain"]), str(r["key_escrow"]), int(r["key_task"]))
        grouped.setdefault(key, []).append(_settlement_event(r))
    return grouped


async def cursor_state(conn: asyncpg.Connection, chain_id: int) -> tuple[int | None, float | None]:
    """The indexer's cursor block and the seconds since it last moved, by the database's
    clock (None, None before it stored anything). Negative when the stamp is ahead of the
    clock (it stepped back): not clamped to 0, which read as "moved just now" for as long."""
    row = await conn.fetchrow(
        "SELECT block_number, extract(epoch FROM now() - updated_at)::float8 AS age"
        " FROM chain_cursor WHERE chain_id = $1",
        chain_id,
    )
    if row is None:
        return None, None
    return int(row["block_number"]), float(row["age"])


async def chain_time(conn: asyncpg.Connection, chain_id: int) -> int | None:
    """The newest block time the indexer saw on the chain (None before it ran)."""
    value = await conn.fetchval(
        "SELECT GREATEST(c.head_timestamp, COALESCE((SELECT max(block_timestamp) FROM escrow_events"
        " WHERE chain_id = $1), 0)) FROM chain_cursor c WHERE c.chain_id = $1",
        chain_id,
    )
    return None if value is None else int(value)


async def progress(conn: asyncpg.Connection) -> dict[str, int]:
    """Indexing progress over every chain: events stored, verdict events among them, the
    highest cursor block (-1 before any) and the largest head-minus-cursor lag."""
    row = await conn.fetchrow(
        "SELECT (SELECT count(*) FROM escrow_events) AS events,"
        " (SELECT coalesce(max(head_number - block_number), 0) FROM chain_cursor) AS lag,"
        " (SELECT coalesce(max(block_number), -1) FROM chain_cursor) AS indexed_block,"
        " (SELECT count(*) FROM escrow_events WHERE event_name = 'VerificationCompleted') AS verdicts"
    )
    assert row is not None
    return {key: int(value) for key, value in dict(row).items()}


async def highest_cursor(conn: asyncpg.Connection) -> int:
    """The highest cursor block over every chain (-1 before the indexer stored anything)."""
    return int(await conn.fetchval("SELECT coalesce(max(block_number), -1) FROM chain_cursor"))


async def positions(conn: asyncpg.Connection) -> set[tuple[int, int]]:
    """(block number, log index) of every stored event."""
    rows = await conn.fetch("SELECT block_number, log_index FROM escrow_events")
    return {(int(r["block_number"]), int(r["log_index"])) for r in rows}


async def task_events_not(conn: asyncpg.Connection, applied: str) -> int:
    """How many stored task events the predicate `applied` (SQL over `e`, the event row) does
    not hold for: how far a consumer is behind the index."""
    return int(
        await conn.fetchval(f"SELECT count(*) FROM escrow_events e WHERE e.task_id IS NOT NULL AND NOT {applied}")
    )
