"""The settlement relayer's SQL, in one place (tables in `schemas/migrations/005_settlement.sql`).

Every function takes a connection and runs inside the caller's transaction unless it says
otherwise; the callers decide the transaction boundaries, because they are the crash-safety
argument (see docs/relayer.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

import asyncpg

from chain import indexed
from chain.txs import SignedTx
from chain.txstore import (
    NewSlot,
    StoredSlot,
    insert_slots,
    signed_versions,
    slot_columns,
)
from chain.view import ChainEvent, fold_task
from runtime.db import columns
from schemas import jsoncodec
from schemas.verdict import Verdict

NOTIFY_CHANNEL = "escrowd_settlement"
ZERO_ADDRESS = "0x0000000000000000000000000000000000000000"


@dataclass(frozen=True)
class VerdictCall:
    """What a verdict asks of the escrow: `completeVerification`'s arguments, and where."""

    chain_id: int
    escrow: str
    task_id: int
    attempt: int
    evidence_hash: str
    passed: bool
    score: int


CALL_FIELDS = tuple(f.name for f in fields(VerdictCall))
"""`completeVerification`'s arguments, named as the signed verdict (`schemas.verdict.Verdict`) names them."""


def call_of(verdict: Verdict) -> dict[str, Any]:
    """The `VerdictCall` fields of a signed verdict, to build a row that carries them."""
    return {name: getattr(verdict, name) for name in CALL_FIELDS}


@dataclass(frozen=True)
class VerdictRow(VerdictCall):
    """An accepted verdict, as the sender needs it."""

    id: int
    received_at: datetime


@dataclass
class SlotRow(StoredSlot):
    """One nonce we hold, as stored, with the verdicts it carries."""

    verdict: VerdictRow | None = None
    items: list[VerdictRow] = field(default_factory=list)  # a batch slot's verdicts, in order


@dataclass(frozen=True)
class IndexedTask:
    """What the indexed events say about one task (for verdict checks)."""

    named_verifier: str | None
    latest_attempt: int
    latest_evidence_hash: str | None
    judged_attempts: frozenset[int]


# ---------------------------------------------------------------------------- indexed state


def fold_indexed_task(events: Sequence[ChainEvent]) -> IndexedTask | None:
    """What the verdict checks need of a task's indexed events: a projection of the one
    fold (`chain.view.fold_task`); None when there are none."""
    if not events:
        return None
    task = fold_task(events)
    latest = task.last_attempt
    return IndexedTask(
        named_verifier=task.verifier,
        latest_attempt=latest,
        latest_evidence_hash=task.attempts.get(latest),
        judged_attempts=task.judged_attempts,
    )


async def indexed_task(conn: asyncpg.Connection, chain_id: int, escrow: str, task_id: int) -> IndexedTask | None:
    """Fold the task's indexed TaskCreated / EvidenceSubmitted / VerificationCompleted events."""
    return fold_indexed_task(await indexed.settlement_events(conn, chain_id, escrow, task_id))


TaskKey = indexed.TaskRef
"""(chain id, lower-case escrow, task id)."""


async def indexed_tasks(conn: asyncpg.Connection, keys: Sequence[TaskKey]) -> dict[TaskKey, IndexedTask]:
    """`indexed_task` for many tasks in one statement; tasks with no indexed event are absent."""
    grouped = await indexed.settlement_events_of(conn, keys)
    return {key: task for key, events in grouped.items() if (task := fold_indexed_task(events)) is not None}


async def indexer_cursor_state(conn: asyncpg.Connection, chain_id: int) -> tuple[int | None, float | None]:
    """The indexer's cursor block for a chain and seconds since it moved (None before any)."""
    return await indexed.cursor_state(conn, chain_id)


# ---------------------------------------------------------------------------- bridge health


@dataclass(frozen=True)
class PublishedReport:
    """One chain's last health report from the relayer (`bridge_health`)."""

    chain_id: int
    report: str | None  # ChainHealth as JSON; None when larger than the reader's bound
    age_seconds: float  # by the database's clock; negative for a row stamped in the future
    stale_after: float


async def publish_health(
    conn: asyncpg.Connection, *, chain_id: int, relayer_address: str, report_json: str, stale_after: float
) -> None:
    """Replace the chain's published report (stamped with the database's clock)."""
    await conn.execute(
        "INSERT INTO bridge_health (chain_id, relayer_address, report, checked_at, stale_after_seconds)"
        " VALUES ($1, $2, $3::text::jsonb, now(), $4) ON CONFLICT (chain_id) DO UPDATE SET"
        " relayer_address = EXCLUDED.relayer_address, report = EXCLUDED.report,"
        " checked_at = EXCLUDED.checked_at, stale_after_seconds = EXCLUDED.stale_after_seconds",
        chain_id,
        relayer_address,
        report_json,
        stale_after,
    )


async def published_health(conn: asyncpg.Connection, *, max_bytes: int) -> list[PublishedReport]:
    """Every chain's published report with its age by the database's clock, by chain id.

    A report over `max_bytes` is not fetched (the API reads this table every second). The
    age is not clamped at 0: a row stamped in the future is the reader's to judge, since
    reading it as "0 s old" kept it fresh for as long as it was ahead."""
    rows = await conn.fetch(
        "SELECT chain_id, CASE WHEN octet_length(report::text) <= $1 THEN report::text END AS report,"
        " extract(epoch FROM clock_timestamp() - checked_at)::float8 AS age, stale_after_seconds"
        " FROM bridge_health ORDER BY chain_id",
        max_bytes,
    )
    return [
        PublishedReport(
            int(r["chain_id"]),
            None if r["report"] is None else str(r["report"]),
            float(r["age"]),
            float(r["stale_after_seconds"]),
        )
        for r in rows
    ]


# ---------------------------------------------------------------------------- verdicts in


@dataclass(frozen=True)
class NewVerdict(VerdictCall):
    """One idempotency row to insert (see `insert_verdicts`)."""

    message_id: str
    signer: str
    signed_verdict: str  # the SignedVerdict as JSON text (`model_dump_json`)
    status: str
    issued_at: datetime
    wait_until: datetime | None

    @property
    def key(self) -> tuple[int, str, int, int]:
        """The idempotency key: (chain id, lower-case escrow, task id, attempt)."""
        return (self.chain_id, self.escrow.lower(), self.task_id, self.attempt)


async def insert_verdicts(conn: asyncpg.Connection, rows: Sequence[NewVerdict]) -> set[tuple[int, str, int, int]]:
    """Insert idempotency rows in one statement; returns the keys inserted.

    A key already present is skipped (a duplicate attempt). The caller must not pass the
    same key twice. Each chain with a newly queued verdict gets one wake-up, delivered when
    the caller's transaction commits.
    """
    if not rows:
        return set()
    inserted = await conn.fetch(
        "INSERT INTO settlement_verdicts (chain_id, escrow, task_id, attempt, evidence_hash, passed, score,"
        " message_id, signer, signed_verdict, status, issued_at, wait_until)"
        " SELECT c, e, t, a, h, p, s, m, sg, sv::jsonb, st, ia, wu FROM unnest($1::bigint[], $2::text[],"
        " $3::numeric[], $4::smallint[], $5::text[], $6::boolean[], $7::smallint[], $8::text[], $9::text[],"
        " $10::text[], $11::text[], $12::timestamptz[], $13::timestamptz[])"
        " AS u(c, e, t, a, h, p, s, m, sg, sv, st, ia, wu)"
        " ON CONFLICT (chain_id, escrow, task_id, attempt) DO NOTHING"
        " RETURNING chain_id, escrow, task_id, attempt, status",
        [r.chain_id for r in rows],
        [r.escrow.lower() for r in rows],
        [r.task_id for r in rows],
        [r.attempt for r in rows],
        [r.evidence_hash.lower() for r in rows],
        [r.passed for r in rows],
        [r.score for r in rows],
        [r.message_id for r in rows],
        [r.signer for r in rows],
        [r.signed_verdict for r in rows],
        [r.status for r in rows],
        [r.issued_at for r in rows],
        [r.wait_until for r in rows],
    )
    for chain_id in sorted({int(r["chain_id"]) for r in inserted if r["status"] == "queued"}):
        await notify_sender(conn, chain_id)
    return {(int(r["chain_id"]), str(r["escrow"]), int(r["task_id"]), int(r["attempt"])) for r in inserted}


async def insert_rejection(
    conn: asyncpg.Connection,
    *,
    dedup_key: str,
    message_id: str | None,
    reason: str,
    detail: str | None,
    payload: bytes | None,
    chain_id: int | None = None,
    escrow: str | None = None,
    task_id: int | None = None,
    attempt: int | None = None,
    signer: str | None = None,
) -> bool:
    """Record a refused verdict; False when this exact refusal was recorded before."""
    value = await conn.fetchval(
        "INSERT INTO settlement_rejections (dedup_key, message_id, reason, detail, payload, chain_id,"
        " escrow, task_id, attempt, signer) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
        " ON CONFLICT (dedup_key) DO NOTHING RETURNING 1",
        dedup_key,
        message_id,
        reason,
        detail,
        payload,
        chain_id,
        escrow.lower() if escrow else None,
        task_id,
        attempt,
        signer,
    )
    return value is not None


async def release_inbox(conn: asyncpg.Connection, consumer: str, message_id: str) -> None:
    """Forget that `message_id` was processed, so a correctly signed copy can still pass.

    Used only for signature refusals: a verdict re-issued after its signer was registered
    carries the same message id and must not be taken for a duplicate.
    """
    await conn.execute(
        "DELETE FROM consumer_inbox WHERE consumer = $1 AND message_id = $2", consumer, message_id
    )


async def notify_sender(conn: asyncpg.Connection, chain_id: int) -> None:
    """Wake the sender of a chain once the caller's transaction commits."""
    await conn.execute("SELECT pg_notify($1, $2)", NOTIFY_CHANNEL, str(chain_id))


@dataclass(frozen=True)
class WaitingVerdict:
    """A verdict whose attempt was not indexed when it arrived."""

    id: int
    chain_id: int
    escrow: str
    task_id: int
    attempt: int
    evidence_hash: str
    message_id: str
    signer: str
    received_at: datetime
    signed_verdict: dict[str, Any]


async def waiting_verdicts(conn: asyncpg.Connection, limit: int = 1000) -> list[WaitingVerdict]:
    """Verdicts waiting for their attempt to be indexed, oldest first."""
    rows = await conn.fetch(
        "SELECT id, chain_id, escrow, task_id, attempt, evidence_hash, message_id, signer, received_at,"
        " signed_verdict FROM settlement_verdicts WHERE status = 'awaiting_evidence' ORDER BY id LIMIT $1",
        limit,
    )
    return [
        WaitingVerdict(**{**r, "task_id": int(r["task_id"])})  # the columns are the fields; task_id is numeric
        for r in rows
    ]


async def promote_waiting(conn: asyncpg.Connection, verdict_id: int, status: str) -> None:
    """A waiting verdict's attempt is indexed: queue it (or record it as already judged)."""
    await conn.execute(
        "UPDATE settlement_verdicts SET status = $2, wait_until = NULL, updated_at = now()"
        " WHERE id = $1 AND status = 'awaiting_evidence'",
        verdict_id,
        status,
    )


async def drop_waiting(conn: asyncpg.Connection, verdict_id: int) -> None:
    """Remove a waiting verdict that turned out wrong (its rejection is recorded separately)."""
    await conn.execute(
        "DELETE FROM settlement_verdicts WHERE id = $1 AND status = 'awaiting_evidence'", verdict_id
    )


# ---------------------------------------------------------------------------- sender: verdicts


def _verdict_row(r: asyncpg.Record, prefix: str = "") -> VerdictRow:
    return VerdictRow(
        id=r[f"{prefix}id"],
        chain_id=r[f"{prefix}chain_id"],
        escrow=r[f"{prefix}escrow"],
        task_id=int(r[f"{prefix}task_id"]),
        attempt=r[f"{prefix}attempt"],
        evidence_hash=r[f"{prefix}evidence_hash"],
        passed=r[f"{prefix}passed"],
        score=r[f"{prefix}score"],
        received_at=r[f"{prefix}received_at"],
    )


async def queued_verdicts(conn: asyncpg.Connection, chain_id: int, limit: int) -> list[VerdictRow]:
    """Verdicts ready to send on a chain, oldest first."""
    rows = await conn.fetch(
        "SELECT id, chain_id, escrow, task_id, attempt, evidence_hash, passed, score, received_at"
        " FROM settlement_verdicts WHERE chain_id = $1 AND status = 'queued' ORDER BY id LIMIT $2",
        chain_id,
        limit,
    )
    return [_verdict_row(r) for r in rows]


async def set_verdict_outcome(
    conn: asyncpg.Connection,
    verdict_id: int,
    status: str,
    *,
    error: str | None = None,
    error_args: Sequence[Any] | None = None,
    only_if_sent: bool = False,
) -> None:
    """Final (or re-queued) status of a verdict, with the escrow's error when refused.

    `only_if_sent`: leave it alone unless it is `sent` (a batch's refusals read again after a
    restart must not overwrite what happened since)."""
    await conn.execute(
        "UPDATE settlement_verdicts SET status = $2, error = $3, error_args = $4::text::jsonb,"
        " updated_at = now() WHERE id = $1" + (" AND status = 'sent'" if only_if_sent else ""),
        verdict_id,
        status,
        error,
        None if error_args is None else jsoncodec.dumps_str([_jsonable(a) for a in error_args]),
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if isinstance(value, int | str | bool) or value is None:
        return value
    return str(value)


# ---------------------------------------------------------------------------- sender: nonces


# ---------------------------------------------------------------------------- sender: slots


async def record_new_slots(
    conn: asyncpg.Connection,
    chain_id: int,
    sender: str,
    slots: Sequence[tuple[SignedTx, int | None, str]],
    counter: int,
    batch_items: Sequence[tuple[int, Sequence[int]]] = (),
) -> None:
    """Store signed transactions (tx, verdict id or None, kind), mark verdicts sent, move the counter.

    `batch_items`: (nonce, verdict ids in calldata order) of each 'batch' slot among them.
    """
    address = sender.lower()
    # One statement per table (unnest), not one per row, and the last three as one statement
    # (data-modifying CTEs): a round of hundreds of verdicts is stored in three round trips.
    # The batch items' statement-level trigger (one live slot per verdict) fires at the end
    # of that statement, as it did at the end of the items' own; a refusal aborts it all.
    await insert_slots(conn, chain_id, sender, [NewSlot(tx, kind, verdict_id) for tx, verdict_id, kind in slots])
    verdict_ids = [verdict_id for _, verdict_id, kind in slots if verdict_id is not None and kind == "verdict"]
    items = [(nonce, position, v) for nonce, ids in batch_items for position, v in enumerate(ids)]
    verdict_ids += [v for _, _, v in items]
    await conn.execute(
        "WITH items AS ("
        "  INSERT INTO settlement_batch_items (chain_id, sender, nonce, position, verdict_id)"
        "  SELECT $1, $2, n, p, v FROM unnest($3::bigint[], $4::integer[], $5::bigint[]) AS u(n, p, v)"
        "), sent AS ("
        "  UPDATE settlement_verdicts SET status = 'sent', sent_at = now(), updated_at = now()"
        "  WHERE id = ANY($6::bigint[])"
        ")"
        " INSERT INTO settlement_nonces (chain_id, address, next_nonce) VALUES ($1, $2, $7)"
        " ON CONFLICT (chain_id, address) DO UPDATE SET"
        " next_nonce = GREATEST(settlement_nonces.next_nonce, EXCLUDED.next_nonce), updated_at = now()",
        chain_id,
        address,
        [n for n, _, _ in items],
        [p for _, p, _ in items],
        [v for _, _, v in items],
        verdict_ids,
        counter,
    )


async def confirm_verdicts(
    conn: asyncpg.Connection, rows: Sequence[tuple[int, str, int, str]]
) -> None:
    """(verdict id, tx hash, block number, block hash): the verdict is on chain, deep enough."""
    if not rows:
        return
    await conn.execute(
        "UPDATE settlement_verdicts v SET status = 'confirmed', tx_hash = u.h, block_number = u.bn,"
        " block_hash = u.bh, confirmed_at = now(), error = NULL, error_args = NULL, updated_at = now()"
        " FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[]) AS u(id, h, bn, bh)"
        " WHERE v.id = u.id",
        *columns(rows, 4),
    )


async def reorged_verdicts(conn: asyncpg.Connection, verdict_ids: Sequence[int]) -> None:
    """A reorg removed these verdicts' transactions: back to sent, counted."""
    await conn.execute(
        "UPDATE settlement_verdicts SET status = 'sent', tx_hash = NULL, block_number = NULL,"
        " block_hash = NULL, confirmed_at = NULL, reorgs = reorgs + 1, updated_at = now()"
        " WHERE id = ANY($1::bigint[])",
        list(verdict_ids),
    )


async def requeue_verdict(conn: asyncpg.Connection, verdict_id: int, reason: str, *, only_if_sent: bool = False) -> None:
    """The verdict's nonce went elsewhere (or it reverted for a reason that may pass): queue it."""
    await conn.execute(
        "UPDATE settlement_verdicts SET status = 'queued', error = $2, updated_at = now() WHERE id = $1"
        + (" AND status = 'sent'" if only_if_sent else ""),
        verdict_id,
        reason,
    )


async def remove_batch_item(conn: asyncpg.Connection, chain_id: int, sender: str, nonce: int, verdict_id: int) -> None:
    """A batch did not settle this item and it is queued again: it is no longer the slot's."""
    await conn.execute(
        "DELETE FROM settlement_batch_items WHERE chain_id = $1 AND sender = $2 AND nonce = $3 AND verdict_id = $4",
        chain_id,
        sender.lower(),
        nonce,
        verdict_id,
    )


async def open_slots(conn: asyncpg.Connection, chain_id: int, sender: str, watch_from_block: int) -> list[SlotRow]:
    """Slots still pending or mined, and confirmed ones still inside the reorg watch window."""
    rows = await conn.fetch(
        "SELECT t.nonce, t.kind, t.state, t.verdict_id, t.to_address, t.calldata, t.mined_hash, t.block_number,"
        " t.block_hash, t.receipt_status, v.id AS v_id, v.chain_id AS v_chain_id, v.escrow AS v_escrow, v.task_id AS v_task_id,"
        " v.attempt AS v_attempt, v.evidence_hash AS v_evidence_hash, v.passed AS v_passed,"
        " v.score AS v_score, v.received_at AS v_received_at"
        " FROM settlement_transactions t LEFT JOIN settlement_verdicts v ON v.id = t.verdict_id"
        " WHERE t.chain_id = $1 AND t.sender = $2"
        "   AND (t.state IN ('pending', 'mined') OR (t.state = 'confirmed' AND t.block_number >= $3))"
        " ORDER BY t.nonce",
        chain_id,
        sender.lower(),
        watch_from_block,
    )
    slots = {
        r["nonce"]: SlotRow(verdict=_verdict_row(r, "v_") if r["v_id"] is not None else None, **slot_columns(r))
        for r in rows
    }
    if not slots:
        return []
    batch_nonces = [n for n, slot in slots.items() if slot.kind == "batch"]
    if batch_nonces:
        for r in await conn.fetch(
            "SELECT b.nonce, v.id, v.chain_id, v.escrow, v.task_id, v.attempt, v.evidence_hash, v.passed,"
            " v.score, v.received_at FROM settlement_batch_items b JOIN settlement_verdicts v ON v.id = b.verdict_id"
            " WHERE b.chain_id = $1 AND b.sender = $2 AND b.nonce = ANY($3::bigint[]) ORDER BY b.nonce, b.position",
            chain_id,
            sender.lower(),
            batch_nonces,
        ):
            slots[r["nonce"]].items.append(_verdict_row(r))
    for nonce, version in await signed_versions(conn, chain_id, sender, list(slots)):
        slots[nonce].versions.append(version)
    return list(slots.values())
