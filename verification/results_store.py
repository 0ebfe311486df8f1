"""The verification service's SQL, in one place: the consumer's state and effects, the API's reads.

Tables are those of `schemas/migrations/003_verification.sql`. The consumer is the only
writer of verdicts (`verification_results`), failures and its chain-event copy; the API
writes terms, nonces and request rows ('accepted') in the transaction that queues the
request's message. The API also reads the indexer's tables (the chain as indexed, chain
time) through `chain.indexed`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import asyncpg

from chain import indexed
from schemas.task_terms import TaskTerms
from verification.routing import (
    AttachReport,
    ChainEvent,
    FailureRecord,
    Judge,
    MarkSettled,
    RecordFailure,
    RecordResult,
    RemoveEvent,
    RequestRecord,
    RestoreResult,
    ResultRecord,
    RetractResult,
    SaveRequest,
    ScheduleRetry,
    SetRequestState,
    StoreEvent,
    TaskKey,
    TaskState,
    TermsView,
)


def _int(value: int | Decimal) -> int:
    return int(value)


# ---------------------------------------------------------------------------- terms


async def insert_terms(conn: asyncpg.Connection, task_hash: str, terms: TaskTerms) -> bool:
    """Store registered terms under their `task_hash`; False when these exact terms were registered before."""
    inserted = await conn.fetchval(
        "INSERT INTO task_terms (task_hash, chain_id, escrow_address, poster, verification_mode,"
        " verifier_address, private, terms, canonical) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
        " ON CONFLICT (task_hash) DO NOTHING RETURNING 1",
        task_hash, terms.chain_id, terms.escrow, terms.poster, terms.verification_mode, terms.verifier_address,
        terms.private, terms.canonical_dict(), terms.canonical(),
    )  # fmt: skip
    return inserted is not None


def _terms_view(row: asyncpg.Record) -> TermsView:
    terms: dict[str, Any] = row["terms"]
    return TermsView(
        task_hash=row["task_hash"],
        chain_id=row["chain_id"],
        escrow=row["escrow_address"],
        poster=row["poster"],
        mode=row["verification_mode"],
        verifier_address=row["verifier_address"],
        private=row["private"],
        criteria=terms.get("verificationCriteria"),
        verifier=terms.get("verifier"),
        instructions_digest=str(terms.get("instructionsDigest", "")),
    )


_TERMS_COLUMNS = "task_hash, chain_id, escrow_address, poster, verification_mode, verifier_address, private, terms"


async def load_terms(conn: asyncpg.Connection, task_hash: str) -> TermsView | None:
    """The terms registered under `task_hash`."""
    row = await conn.fetchrow(f"SELECT {_TERMS_COLUMNS} FROM task_terms WHERE task_hash = $1", task_hash.lower())
    return None if row is None else _terms_view(row)


async def load_terms_json(conn: asyncpg.Connection, task_hash: str) -> dict[str, Any] | None:
    """The stored terms document (canonical dict) under `task_hash`."""
    value = await conn.fetchval("SELECT terms FROM task_terms WHERE task_hash = $1", task_hash.lower())
    return None if value is None else dict(value)


# ---------------------------------------------------------------------------- chain views


async def indexed_events(conn: asyncpg.Connection, key: TaskKey) -> list[ChainEvent]:
    """The task's events as the indexer stored them (the API's view of the chain)."""
    return await indexed.task_events(conn, key)


async def chain_time(conn: asyncpg.Connection, chain_id: int) -> int | None:
    """The newest block time the indexer saw on the chain (None before it ran)."""
    return await indexed.chain_time(conn, chain_id)


# ---------------------------------------------------------------------------- the consumer's state


async def lock_task(conn: asyncpg.Connection, key: TaskKey) -> None:
    """Serialise work on one task across consumer members (held until the batch commits)."""
    await conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
        f"verification:{key.chain_id}:{key.escrow.lower()}:{key.task_id}",
    )


async def load_state(conn: asyncpg.Connection, key: TaskKey) -> TaskState:
    """Everything the consumer knows about one task."""
    args = (key.chain_id, key.escrow, key.task_id)
    event_rows = await conn.fetch(
        "SELECT event_id, block_number, log_index, tx_hash, event_name AS name, args FROM verification_chain_events"
        " WHERE chain_id = $1 AND escrow_address = $2 AND task_id = $3 AND NOT removed",
        *args,
    )
    state = TaskState(key=key, events=tuple(ChainEvent(**dict(r)) for r in event_rows))
    task_hash = state.chain.task_hash
    terms = await load_terms(conn, task_hash) if task_hash else None
    request_rows = await conn.fetch(
        "SELECT request_id, kind, attempt, evidence_hash, actor, payload, state, retry_count"
        " FROM verification_requests WHERE chain_id = $1 AND escrow_address = $2 AND task_id = $3",
        *args,
    )
    result_rows = await conn.fetch(
        "SELECT attempt, evidence_hash, source, passed, score, status, reported, request_id, settled_tx"
        " FROM verification_results WHERE chain_id = $1 AND escrow_address = $2 AND task_id = $3",
        *args,
    )
    failure_rows = await conn.fetch(
        "SELECT attempt, failures, never_judged FROM verifier_failures"
        " WHERE chain_id = $1 AND escrow_address = $2 AND task_id = $3",
        *args,
    )
    return dataclasses.replace(
        state,
        terms=terms,
        requests={r["request_id"]: RequestRecord(**dict(r)) for r in request_rows},
        results={r["attempt"]: ResultRecord(**dict(r)) for r in result_rows},
        failures={r["attempt"]: FailureRecord(r["failures"], r["never_judged"]) for r in failure_rows},
    )


# ---------------------------------------------------------------------------- effects


async def apply_effect(conn: asyncpg.Connection, key: TaskKey, effect: Any) -> None:
    """Apply one effect that needs no signing (RecordResult goes through `insert_result`)."""
    task = (key.chain_id, key.escrow, key.task_id)
    if isinstance(effect, StoreEvent):
        e = effect.event
        await conn.execute(
            "INSERT INTO verification_chain_events (event_id, chain_id, escrow_address, task_id, block_number,"
            " log_index, tx_hash, event_name, args) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
            " ON CONFLICT (event_id) DO UPDATE SET removed = false",
            e.event_id, *task, e.block_number, e.log_index, e.tx_hash, e.name, dict(e.args),
        )  # fmt: skip
    elif isinstance(effect, RemoveEvent):
        await conn.execute("UPDATE verification_chain_events SET removed = true WHERE event_id = $1", effect.event_id)
    elif isinstance(effect, SaveRequest):
        await save_request(conn, key, effect.request)
    elif isinstance(effect, SetRequestState):
        await conn.execute(
            "UPDATE verification_requests SET state = $2, reason = COALESCE($3, reason), updated_at = now()"
            " WHERE request_id = $1",
            effect.request_id, effect.state, effect.reason,
        )  # fmt: skip
    elif isinstance(effect, ScheduleRetry):
        await conn.execute(
            "UPDATE verification_requests SET state = 'waiting_retry', retry_count = $2, last_error = $3,"
            " next_retry_at = now() + make_interval(secs => $4), updated_at = now() WHERE request_id = $1",
            effect.request_id, effect.retry_count, effect.error, effect.delay_seconds,
        )  # fmt: skip
    elif isinstance(effect, AttachReport):
        await _update_result(conn, key, effect.attempt, "result = $5, reported = true, source = 'agent', request_id = $6",
                             dict(effect.verification_result), effect.request_id)  # fmt: skip
    elif isinstance(effect, RetractResult | RestoreResult):
        status = "retracted" if isinstance(effect, RetractResult) else "final"
        await _update_result(conn, key, effect.attempt, "status = $5", status)
    elif isinstance(effect, MarkSettled):
        await _update_result(conn, key, effect.attempt, "settled_tx = $5, settled_block = $6",
                             effect.tx_hash, effect.block_number)  # fmt: skip
    elif isinstance(effect, RecordFailure):
        await conn.execute(
            "INSERT INTO verifier_failures (chain_id, escrow_address, task_id, attempt, verifier, failures,"
            " never_judged, last_error) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
            " ON CONFLICT (chain_id, escrow_address, task_id, attempt) DO UPDATE SET failures = EXCLUDED.failures,"
            " never_judged = EXCLUDED.never_judged, last_error = EXCLUDED.last_error, updated_at = now()",
            *task, effect.attempt, effect.verifier, effect.failures, effect.never_judged, effect.error,
        )  # fmt: skip
    else:
        raise TypeError(f"apply_effect cannot apply {type(effect).__name__}")


async def _update_result(conn: asyncpg.Connection, key: TaskKey, attempt: int, assignments: str, *values: Any) -> None:
    """Set `assignments` (a constant SET list over $5, $6, ...) on one attempt's verdict row."""
    await conn.execute(
        f"UPDATE verification_results SET {assignments}, updated_at = now()"
        " WHERE chain_id = $1 AND escrow_address = $2 AND task_id = $3 AND attempt = $4",
        key.chain_id, key.escrow, key.task_id, attempt, *values,
    )  # fmt: skip


async def save_request(conn: asyncpg.Connection, key: TaskKey, request: RequestRecord) -> bool:
    """Insert a request row, or move the API's 'accepted' row to the request's state."""
    status: str = await conn.execute(
        "INSERT INTO verification_requests (request_id, kind, chain_id, escrow_address, task_id, attempt,"
        " evidence_hash, actor, payload, state) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
        " ON CONFLICT (request_id) DO UPDATE SET state = EXCLUDED.state, updated_at = now()"
        " WHERE verification_requests.state = 'accepted' AND EXCLUDED.state <> 'accepted'",
        request.request_id, request.kind, key.chain_id, key.escrow, key.task_id, request.attempt,
        request.evidence_hash, request.actor, dict(request.payload), request.state,
    )  # fmt: skip
    return status.endswith(" 1")


async def insert_result(
    conn: asyncpg.Connection,
    key: TaskKey,
    effect: RecordResult,
    *,
    agent: str | None,
    signed_verdict: dict[str, Any] | None,
    verdict_message_id: str | None,
    signed_proof: dict[str, Any] | None = None,
) -> bool:
    """Record an attempt's verdict; a retracted one may be replaced, a final one never."""
    status: str = await conn.execute(
        "INSERT INTO verification_results (chain_id, escrow_address, task_id, attempt, evidence_hash, agent,"
        " mode, source, passed, score, result, reported, request_id, verdict_message_id, signed_verdict, signed_proof)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)"
        " ON CONFLICT (chain_id, escrow_address, task_id, attempt) DO UPDATE SET"
        " evidence_hash = EXCLUDED.evidence_hash, agent = EXCLUDED.agent, source = EXCLUDED.source,"
        " passed = EXCLUDED.passed, score = EXCLUDED.score, result = EXCLUDED.result,"
        " reported = EXCLUDED.reported, request_id = EXCLUDED.request_id,"
        " verdict_message_id = EXCLUDED.verdict_message_id, signed_verdict = EXCLUDED.signed_verdict,"
        " signed_proof = EXCLUDED.signed_proof,"
        " status = 'final', settled_tx = NULL, settled_block = NULL, updated_at = now()"
        " WHERE verification_results.status = 'retracted'",
        key.chain_id, key.escrow, key.task_id, effect.attempt, effect.evidence_hash, agent, effect.mode,
        effect.source, effect.passed, effect.score, dict(effect.verification_result), effect.reported,
        effect.request_id, verdict_message_id, signed_verdict, signed_proof,
    )  # fmt: skip
    return status.endswith(" 1")


async def signed_proof(conn: asyncpg.Connection, key: TaskKey, attempt: int | None) -> dict[str, Any] | None:
    """The signed proof of one attempt's final verdict (the latest judged attempt when None)."""
    value = await conn.fetchval(
        "SELECT signed_proof FROM verification_results WHERE chain_id = $1 AND escrow_address = $2"
        " AND task_id = $3 AND status = 'final' AND signed_proof IS NOT NULL AND ($4::int IS NULL OR attempt = $4)"
        " ORDER BY attempt DESC LIMIT 1",
        key.chain_id, key.escrow, key.task_id, attempt,
    )  # fmt: skip
    return None if value is None else dict(value)


# ---------------------------------------------------------------------------- retries


async def claim_due_retries(conn: asyncpg.Connection, limit: int = 100) -> list[asyncpg.Record]:
    """Finalize requests whose retry is due, marked 'retry_queued' (call inside a transaction)."""
    rows: list[asyncpg.Record] = await conn.fetch(
        "UPDATE verification_requests SET state = 'retry_queued', updated_at = now() WHERE request_id IN ("
        " SELECT request_id FROM verification_requests WHERE state = 'waiting_retry' AND next_retry_at <= now()"
        " ORDER BY next_retry_at LIMIT $1 FOR UPDATE SKIP LOCKED)"
        " RETURNING request_id, chain_id, escrow_address, task_id, attempt, evidence_hash, actor, retry_count",
        limit,
    )
    return rows


# ---------------------------------------------------------------------------- judging jobs

JOBS_CHANNEL = "verification_jobs"
"""NOTIFY channel: a job was queued (delivered when the queuing transaction commits)."""

_OPEN_JOB = "state IN ('queued', 'judging')"


async def queue_job(conn: asyncpg.Connection, key: TaskKey, judge: Judge, verifier: str) -> bool:
    """Record a judgement to make as a claimable job; False when this request's try has one open or done."""
    inserted = await conn.fetchval(
        "INSERT INTO verification_jobs (request_id, retry_count, chain_id, escrow_address, task_id, attempt,"
        " evidence_hash, verifier) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
        # A dropped job is wanted again (a reorg took the submission away and brought it back).
        " ON CONFLICT (request_id, retry_count) DO UPDATE SET state = 'queued', outcome = NULL, updated_at = now()"
        " WHERE verification_jobs.state = 'dropped' RETURNING 1",
        judge.request_id, judge.retry_count, key.chain_id, key.escrow, key.task_id, judge.attempt,
        judge.evidence_hash, verifier[:300],
    )  # fmt: skip
    if inserted is None:
        return False
    await conn.execute("SELECT pg_notify($1, '')", JOBS_CHANNEL)
    return True


async def claim_jobs(
    conn: asyncpg.Connection,
    token_prefix: str,
    *,
    limit: int,
    per_verifier: int,
    busy: Mapping[str, int],
    lease_seconds: float,
) -> list[asyncpg.Record]:
    """Claim up to `limit` jobs, oldest first, each under a fresh lease (state 'judging').

    A job is claimable when it is queued, or judging under a lease that has expired (its
    judge died), and no earlier job of its task is still open: a task's requests are judged
    in the order they were decided. No verifier gets more than `per_verifier` jobs of this
    claimer at once (`busy`: how many it judges already); the others stay for later or for
    another process. Rows another claimer holds are skipped, never waited for.
    """
    saturated = [v for v, n in busy.items() if n >= per_verifier]
    rows: list[asyncpg.Record] = await conn.fetch(
        "WITH candidates AS ("
        " SELECT q.seq, q.verifier, q.state AS was FROM verification_jobs q"
        " WHERE (q.state = 'queued' OR (q.state = 'judging' AND q.lease_until < now()))"
        " AND (q.not_before IS NULL OR q.not_before <= now())"
        " AND q.verifier <> ALL($3::text[])"
        " AND NOT EXISTS (SELECT 1 FROM verification_jobs e WHERE e.chain_id = q.chain_id"
        "  AND e.escrow_address = q.escrow_address AND e.task_id = q.task_id AND e.seq < q.seq"
        "  AND e.state IN ('queued', 'judging'))"
        " ORDER BY q.seq LIMIT $2 * 4 FOR UPDATE OF q SKIP LOCKED"
        "), ranked AS ("
        " SELECT c.seq, c.was, row_number() OVER (PARTITION BY c.verifier ORDER BY c.seq)"
        "  + COALESCE(b.busy, 0) AS n FROM candidates c"
        " LEFT JOIN unnest($4::text[], $5::int[]) AS b(verifier, busy) ON b.verifier = c.verifier"
        "), chosen AS (SELECT seq, was FROM ranked WHERE n <= $6 ORDER BY seq LIMIT $2)"
        " UPDATE verification_jobs j SET state = 'judging', claim_token = $1 || j.seq::text || ':' || j.claims,"
        " lease_until = now() + make_interval(secs => $7), claims = j.claims + 1,"
        " expiries = j.expiries + (chosen.was = 'judging')::int, updated_at = now()"
        " FROM chosen WHERE j.seq = chosen.seq"
        " RETURNING j.seq, j.request_id, j.retry_count, j.chain_id, j.escrow_address, j.task_id, j.attempt,"
        " j.evidence_hash, j.verifier, j.claim_token, j.claims, j.errors, chosen.was = 'judging' AS expired",
        token_prefix, limit, saturated, list(busy), list(busy.values()), per_verifier, lease_seconds,
    )  # fmt: skip
    return sorted(rows, key=lambda r: r["seq"])


async def renew_leases(conn: asyncpg.Connection, tokens: Sequence[str], lease_seconds: float) -> int:
    """Extend the leases this claimer still holds; how many it holds."""
    status: str = await conn.execute(
        "UPDATE verification_jobs SET lease_until = now() + make_interval(secs => $2)"
        " WHERE claim_token = ANY($1::text[]) AND state = 'judging'",
        list(tokens), lease_seconds,
    )  # fmt: skip
    return int(status.split()[-1])


async def release_jobs(conn: asyncpg.Connection, tokens: Sequence[str]) -> int:
    """Hand claimed jobs back (queued again, claimable at once): a drain cut short."""
    status: str = await conn.execute(
        "UPDATE verification_jobs SET state = 'queued', claim_token = NULL, lease_until = NULL, updated_at = now()"
        " WHERE claim_token = ANY($1::text[]) AND state = 'judging'",
        list(tokens),
    )  # fmt: skip
    return int(status.split()[-1])


async def hold_job(conn: asyncpg.Connection, seq: int, token: str) -> bool:
    """Lock the job if this claim still holds it (call inside the commit's transaction)."""
    held = await conn.fetchval(
        "SELECT 1 FROM verification_jobs WHERE seq = $1 AND claim_token = $2 AND state = 'judging' FOR UPDATE",
        seq, token,
    )  # fmt: skip
    return held is not None


async def finish_job(conn: asyncpg.Connection, seq: int, state: str, outcome: str) -> None:
    """Close a job ('done': its outcome is committed; 'dropped': no longer wanted)."""
    await conn.execute(
        "UPDATE verification_jobs SET state = $2, outcome = $3, claim_token = NULL, lease_until = NULL,"
        " updated_at = now() WHERE seq = $1",
        seq, state, outcome[:300],
    )  # fmt: skip


async def fail_job(
    conn: asyncpg.Connection, seq: int, token: str, *, max_errors: int, delay_seconds: float, error: str
) -> str | None:
    """Record an unexpected error of a claimed job: queued again after `delay_seconds`, or
    `failed` once it has `max_errors`; its request's `last_error` says so. The state it is left
    in, or None when this claim no longer holds the job."""
    async with conn.transaction():
        row = await conn.fetchrow(
            "UPDATE verification_jobs SET errors = errors + 1,"
            " state = CASE WHEN errors + 1 >= $3 THEN 'failed' ELSE 'queued' END,"
            " not_before = now() + make_interval(secs => $4), claim_token = NULL, lease_until = NULL,"
            " outcome = $5, updated_at = now() WHERE seq = $1 AND claim_token = $2 AND state = 'judging'"
            " RETURNING state, request_id",
            seq, token, max_errors, delay_seconds, error[:300],
        )  # fmt: skip
        if row is None:
            return None
        await conn.execute(
            "UPDATE verification_requests SET last_error = $2, updated_at = now() WHERE request_id = $1",
            row["request_id"], f"judging failed on our side: {error}"[:500],
        )  # fmt: skip
        return str(row["state"])


async def failed_jobs(conn: asyncpg.Connection) -> int:
    """How many jobs are parked as failed (an operator's to look at)."""
    return int(await conn.fetchval("SELECT count(*) FROM verification_jobs WHERE state = 'failed'"))


async def open_jobs(conn: asyncpg.Connection) -> int:
    """How many jobs wait or are being judged (the queue depth)."""
    return int(await conn.fetchval(f"SELECT count(*) FROM verification_jobs WHERE {_OPEN_JOB}"))


# ---------------------------------------------------------------------------- the API's reads and writes


async def insert_api_request(
    conn: asyncpg.Connection, key: TaskKey, request: RequestRecord
) -> bool:
    """The API's row for a request it accepted; False when the same request exists."""
    inserted = await conn.fetchval(
        "INSERT INTO verification_requests (request_id, kind, chain_id, escrow_address, task_id, attempt,"
        " evidence_hash, actor, payload, state) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'accepted')"
        " ON CONFLICT (request_id) DO NOTHING RETURNING 1",
        request.request_id, request.kind, key.chain_id, key.escrow, key.task_id, request.attempt,
        request.evidence_hash, request.actor, dict(request.payload),
    )  # fmt: skip
    return inserted is not None


async def request_row(conn: asyncpg.Connection, request_id: str) -> asyncpg.Record | None:
    """One request with its state."""
    return await conn.fetchrow(
        "SELECT request_id, kind, attempt, evidence_hash, actor, payload, state, reason, retry_count, last_error"
        " FROM verification_requests WHERE request_id = $1",
        request_id,
    )


async def task_requests(conn: asyncpg.Connection, key: TaskKey) -> list[asyncpg.Record]:
    """Every request of a task."""
    rows: list[asyncpg.Record] = await conn.fetch(
        "SELECT request_id, kind, attempt, evidence_hash, actor, state, reason, retry_count"
        " FROM verification_requests WHERE chain_id = $1 AND escrow_address = $2 AND task_id = $3"
        " ORDER BY attempt, created_at",
        key.chain_id, key.escrow, key.task_id,
    )  # fmt: skip
    return rows


_RESULT_COLUMNS = (
    "r.chain_id, r.escrow_address, r.task_id, r.attempt, r.evidence_hash, r.agent, r.mode, r.source,"
    " r.passed, r.score, r.result, r.status, r.settled_tx"
)


async def task_results(conn: asyncpg.Connection, key: TaskKey) -> list[asyncpg.Record]:
    """The recorded verdicts of a task (retracted ones included, flagged)."""
    rows: list[asyncpg.Record] = await conn.fetch(
        f"SELECT {_RESULT_COLUMNS} FROM verification_results r"
        " WHERE r.chain_id = $1 AND r.escrow_address = $2 AND r.task_id = $3 ORDER BY r.attempt",
        key.chain_id, key.escrow, key.task_id,
    )  # fmt: skip
    return rows


async def result_for(conn: asyncpg.Connection, key: TaskKey, attempt: int) -> asyncpg.Record | None:
    """The verdict of one attempt."""
    return await conn.fetchrow(
        f"SELECT {_RESULT_COLUMNS} FROM verification_results r WHERE r.chain_id = $1 AND r.escrow_address = $2"
        " AND r.task_id = $3 AND r.attempt = $4",
        key.chain_id, key.escrow, key.task_id, attempt,
    )  # fmt: skip


async def task_failures(conn: asyncpg.Connection, key: TaskKey) -> dict[int, asyncpg.Record]:
    """The verifier failures of a task, per attempt."""
    rows = await conn.fetch(
        "SELECT attempt, failures, never_judged FROM verifier_failures"
        " WHERE chain_id = $1 AND escrow_address = $2 AND task_id = $3",
        key.chain_id, key.escrow, key.task_id,
    )  # fmt: skip
    return {r["attempt"]: r for r in rows}


async def agent_executions(conn: asyncpg.Connection, agent: str, limit: int) -> list[asyncpg.Record]:
    """An agent's finalized attempts, newest first, with their verdict (if any) and terms."""
    rows: list[asyncpg.Record] = await conn.fetch(
        "SELECT q.chain_id, q.escrow_address, q.task_id, q.attempt, q.evidence_hash, q.state AS request_state,"
        " r.passed, r.score, r.result, r.source, r.status, r.settled_tx,"
        " COALESCE(t.private, false) AS private, t.verification_mode"
        " FROM verification_requests q"
        " LEFT JOIN verification_results r ON r.chain_id = q.chain_id AND r.escrow_address = q.escrow_address"
        "  AND r.task_id = q.task_id AND r.attempt = q.attempt AND r.evidence_hash = q.evidence_hash"
        " LEFT JOIN LATERAL "
        + indexed.CREATED_TASK_HASH_SQL.format(chain="q.chain_id", task="q.task_id", escrow="q.escrow_address")
        + " c ON true"
        " LEFT JOIN task_terms t ON t.task_hash = lower(c.task_hash)"
        " WHERE q.kind = 'finalize' AND lower(q.actor) = lower($1)"
        " ORDER BY q.created_at DESC LIMIT $2",
        agent,
        limit,
    )
    return rows


def task_ids(rows: Sequence[asyncpg.Record]) -> list[int]:
    """Task ids of rows as ints (numeric columns come back as Decimal)."""
    return [_int(r["task_id"]) for r in rows]
