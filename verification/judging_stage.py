"""The judging stage: judgements made outside every transaction, many tasks at once.

The verification consumer never judges in its transaction: a `Judge` effect commits with the
message as a row of `verification_jobs` (state `queued`, see `results_store.queue_job`). This
pool works through those rows:

1. **claim** (one short transaction, `FOR UPDATE SKIP LOCKED`): the oldest claimable jobs
   get a lease (`judging`, `lease_until`, a claim token of their own). A job is claimable
   when no earlier job of its task is still open (a task's later request waits for its
   earlier one), and a verifier gets at most `per_verifier` jobs of this pool at once (a
   slow verifier fills its own share, never the others');
2. **judge** with no transaction and no lock open: the task's state is read in a read-only
   snapshot, `routing.judgement_wanted` says whether the judgement is still asked for, then
   the handler's `judge` runs (sandbox, endpoint, model), its lease renewed meanwhile; the
   verdict and proof it leads to are signed here too (`verification.signing`: a key held
   over the network is never asked inside a transaction; while its signer is down the
   judgement waits, leased, and nothing is recorded);
3. **commit** (one short transaction): the task's lock, the job row locked only if this
   claim still holds it, the state read again, and, when the same judgement is still
   wanted, the handler's `conclude`: the verdict, proof and outbox rows exactly as an inline
   judgement wrote them. Otherwise the job is dropped and nothing is recorded.

A judge that raises an unexpected error (anything but a verifier's "could not answer",
which `conclude` turns into a scheduled retry: a bug, the database refusing the commit) is our
fault, never the agent's: the job is queued again after a backoff (`error_backoff_seconds`,
doubling), and after `max_errors` it is parked as `failed`, with no verdict, no zero and no
FAIL; the `escrowd_verification_jobs_failed` gauge and its alert ask an operator to fix the
cause and queue it again (docs/operations.md).

A process killed mid-judgement leaves its jobs under a lease; when the lease expires another
claim (this process restarted, or another member) takes them again and judges afresh. The
claim token makes the first judge's late commit a no-op, and `verification_results` keeps one
final verdict per attempt: judged once in effect, never lost.

On stop the pool claims no more and lets the judgements in flight commit; cancelled (the
drain was cut short), it hands their leases back (`queued` again) on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections import Counter as Tally
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import structlog
from prometheus_client import Counter, Gauge

from chain.signers import SignerError
from runtime.aio import wait_event
from runtime.consumer import MAX_PREPARES, PrepareFirst
from runtime.db import connect, create_pool, is_connection_error
from runtime.errors import safe_message
from verification import results_store as store
from verification.consumer import VerificationHandler
from verification.routing import CouldNotJudge, Judge, Judged, TaskKey, conclude, judgement_wanted

log = structlog.get_logger(__name__)

QUEUE_DEPTH = Gauge("escrowd_verification_jobs_open", "Judging jobs queued or being judged (all processes)")
IN_FLIGHT = Gauge("escrowd_verification_judging_in_flight", "Judgements this process is making now")
LEASE_EXPIRIES = Counter(
    "escrowd_verification_lease_expiries_total", "Jobs claimed again after their judge's lease expired"
)
JOBS = Counter("escrowd_verification_jobs_total", "Jobs this process closed, by outcome", ["outcome"])
FAILED = Gauge("escrowd_verification_jobs_failed", "Judging jobs parked as failed after repeated errors (all processes)")
JOB_OUTCOMES = ("concluded", "dropped", "lost_lease", "released", "errored", "failed")
SIGNER_WAITS = Counter(
    "escrowd_verification_signer_waits_total",
    "Judgements whose signatures waited for the verification key's signer to answer",
)


def metrics_at_start() -> None:
    """Every judging series at 0 (see `runtime.metrics`)."""
    from runtime.metrics import at_zero

    QUEUE_DEPTH.set(0)
    FAILED.set(0)
    IN_FLIGHT.set(0)
    LEASE_EXPIRIES.inc(0)
    SIGNER_WAITS.inc(0)
    at_zero(JOBS, JOB_OUTCOMES)


@dataclass(frozen=True)
class JudgingLimits:
    """How much the pool judges at once, and how long a claim lasts."""

    concurrency: int = 64
    per_verifier: int = 32
    lease_seconds: float = 90.0
    poll_seconds: float = 1.0
    max_errors: int = 5
    error_backoff_seconds: float = 5.0
    error_backoff_max_seconds: float = 300.0

    def error_delay(self, errors: int) -> float:
        """Seconds before a job is claimed again after its `errors`-th unexpected error."""
        return min(self.error_backoff_max_seconds, self.error_backoff_seconds * 2.0 ** max(0, errors - 1))


class JudgingPool:
    """Claims judging jobs, judges them concurrently, commits each outcome (module docstring)."""

    def __init__(self, database_url: str, handler: VerificationHandler, limits: JudgingLimits | None = None) -> None:
        self._database_url = database_url
        self._handler = handler
        self._limits = limits or JudgingLimits()
        if min(self._limits.per_verifier, self._limits.concurrency, self._limits.max_errors) < 1:
            raise ValueError("judging concurrency, per-verifier limit and error budget must be at least 1")
        self._token_prefix = f"{os.getpid()}:{secrets.token_hex(6)}:"
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._running: dict[str, tuple[str, asyncio.Task[None]]] = {}  # claim token -> (verifier, task)
        # Claims whose outcome is not committed yet: what a drain cut short hands back.
        self._held: set[str] = set()
        self.concluded = 0

    def stop(self) -> None:
        """Claim no more; `run` returns once the judgements in flight have committed."""
        self._stopping.set()
        self._wake.set()

    async def run(self) -> None:
        """Claim and judge until stopped; reconnect after database failures."""
        try:
            while not self._stopping.is_set():
                try:
                    await self._run()
                except Exception as exc:
                    if not is_connection_error(exc):
                        raise
                    log.warning("judging_reconnect", error=type(exc).__name__)
                    await asyncio.sleep(0.5)
            await self._finish_in_flight()
        finally:
            await self._release_in_flight()

    async def run_once(self) -> int:
        """Judge every job claimable now, and those they make claimable, then return how many
        outcomes were committed (jobs another process holds are left to it). It renews no
        lease: for judgements shorter than the lease (tests, one-off runs)."""
        before = self.concluded
        pool = await create_pool(self._database_url, min_size=1, max_size=max(2, min(16, self._limits.concurrency)))
        claims = await connect(self._database_url)
        try:
            while rows := await self._claim(claims, self._limits.concurrency):
                for row in rows:
                    self._start(pool, row)
                await self._settle_tasks()
        finally:
            await self._release_in_flight()
            await claims.close(timeout=2)
            await pool.close()
        return self.concluded - before

    async def _run(self) -> None:
        pool = await create_pool(self._database_url, min_size=1, max_size=max(2, min(16, self._limits.concurrency)))
        claims = await connect(self._database_url)
        await claims.add_listener(store.JOBS_CHANNEL, self._notified)
        loop = asyncio.get_running_loop()
        renew_every = self._limits.lease_seconds / 3
        renewed = loop.time()
        counted = -1.0
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                free = self._limits.concurrency - len(self._running)
                if free > 0:
                    for row in await self._claim(claims, free):
                        self._start(pool, row)
                if loop.time() - renewed >= renew_every and self._running:
                    await store.renew_leases(claims, list(self._running), self._limits.lease_seconds)
                    renewed = loop.time()
                if loop.time() - counted >= self._limits.poll_seconds:
                    # Once a poll interval, not at every wake-up: a count is a scan of the open jobs.
                    QUEUE_DEPTH.set(await store.open_jobs(claims))
                    FAILED.set(await store.failed_jobs(claims))
                    counted = loop.time()
                await wait_event(self._wake, min(self._limits.poll_seconds, renew_every))
        finally:
            with contextlib.suppress(Exception):
                await claims.close(timeout=2)
            if self._stopping.is_set():
                await self._finish_in_flight()
            else:
                await self._release_in_flight()  # cancelled, or the database went away
            with contextlib.suppress(Exception):
                await pool.close()

    def _notified(self, *_: Any) -> None:
        self._wake.set()

    async def _claim(self, conn: asyncpg.Connection, free: int) -> list[asyncpg.Record]:
        busy = Tally(verifier for verifier, _task in self._running.values())
        async with conn.transaction():
            rows = await store.claim_jobs(
                conn, self._token_prefix, limit=free, per_verifier=self._limits.per_verifier, busy=busy,
                lease_seconds=self._limits.lease_seconds,
            )  # fmt: skip
        for row in rows:
            if row["expired"]:
                LEASE_EXPIRIES.inc()
                log.warning("judging_lease_expired", request_id=row["request_id"], claims=row["claims"])
        return rows

    def _start(self, pool: asyncpg.Pool, row: asyncpg.Record) -> None:
        token = str(row["claim_token"])
        task = asyncio.create_task(self._judge(pool, row), name=f"judge-{row['seq']}")
        self._running[token] = (str(row["verifier"]), task)
        self._held.add(token)
        IN_FLIGHT.set(len(self._running))

        def done(_: asyncio.Task[None]) -> None:
            self._running.pop(token, None)
            IN_FLIGHT.set(len(self._running))
            self._wake.set()  # a slot is free, and the task's next job may be claimable

        task.add_done_callback(done)

    async def _judge(self, pool: asyncpg.Pool, row: asyncpg.Record) -> None:
        key = TaskKey(int(row["chain_id"]), str(row["escrow_address"]), int(row["task_id"]))
        seq, token = int(row["seq"]), str(row["claim_token"])
        request_id, retry_count = str(row["request_id"]), int(row["retry_count"])
        bound = log.bind(task_id=key.task_id, request_id=request_id, attempt=row["attempt"])
        try:
            async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
                state = await store.load_state(conn, key)
            judge = judgement_wanted(state, request_id, retry_count)
            outcome: Judged | CouldNotJudge | None = None
            if judge is not None:
                outcome = await self._handler.judge(state, judge)  # no transaction, no lock
                # The verdict's signatures too, before the commit's transaction opens.
                effects = conclude(state, judge, outcome, self._handler.retry_policy)
                documents = self._handler.documents(state, effects)
                await self._signed(lambda: self._handler.signing.sign_ahead(documents))
            for _ in range(MAX_PREPARES):
                try:
                    async with pool.acquire() as conn, conn.transaction():
                        result = await self._commit(conn, key, seq, token, request_id, retry_count, judge, outcome)
                    break
                except PrepareFirst as exc:
                    # The task changed since judging: its record needs other signatures.
                    await self._signed(exc.prepare)
            else:
                raise RuntimeError(f"the commit asked for signatures {MAX_PREPARES} times")
            self._held.discard(token)
            JOBS.labels(result).inc()
            bound.info("judging_job_closed", outcome=result)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, SignerError) and self._stopping.is_set():
                # Stopped while waiting for the signer (`_signed`): no error of the job. Its
                # claim stays held, and `run` hands the lease back on the way out.
                bound.info("judging_job_handed_back", reason="stopping while the signer is away")
                return
            error = f"{type(exc).__name__}: {safe_message(exc)}"[:300]
            bound.error("judging_job_failed", error_type=type(exc).__name__, error=error)
            await self._record_error(pool, row, error)

    async def _record_error(self, pool: asyncpg.Pool, row: asyncpg.Record, error: str) -> None:
        """Queue the job again after its backoff, or park it as failed; if even that cannot be
        written (the database is away), the lease stays and its expiry brings the job back."""
        token, errors = str(row["claim_token"]), int(row["errors"]) + 1
        try:
            async with pool.acquire() as conn:
                state = await store.fail_job(
                    conn, int(row["seq"]), token, max_errors=self._limits.max_errors,
                    delay_seconds=self._limits.error_delay(errors), error=error,
                )  # fmt: skip
        except Exception as exc:
            log.warning("judging_error_not_recorded", error_type=type(exc).__name__)
            return
        self._held.discard(token)
        if state is None:
            JOBS.labels("lost_lease").inc()
            return
        JOBS.labels("failed" if state == "failed" else "errored").inc()
        if state == "failed":
            log.error("judging_job_parked", request_id=row["request_id"], errors=errors, error=error)

    async def _signed(self, sign: Callable[[], Awaitable[None]]) -> None:
        """Sign, waiting out a signer outage: the judgement is kept (its lease renewed meanwhile),
        nothing is signed by another key, nothing recorded until the key answers. Stopping
        ends the wait; the lease is handed back and the job judged again later."""
        delay = 1.0
        while True:
            try:
                await sign()
                return
            except SignerError as exc:
                SIGNER_WAITS.inc()
                log.warning("verification_signer_unavailable", error=safe_message(exc)[:300], retry_in=delay)
                if self._stopping.is_set():
                    raise
                await wait_event(self._stopping, delay)
                delay = min(delay * 2, 30.0)

    async def _commit(
        self,
        conn: asyncpg.Connection,
        key: TaskKey,
        seq: int,
        token: str,
        request_id: str,
        retry_count: int,
        judged: Judge | None,
        outcome: Judged | CouldNotJudge | None,
    ) -> str:
        await store.lock_task(conn, key)
        if not await store.hold_job(conn, seq, token):
            return "lost_lease"  # our lease expired and another claim took the job: its judge decides
        state = await store.load_state(conn, key)
        judge = judgement_wanted(state, request_id, retry_count)
        if judge is None or judged is None or outcome is None or (judge.attempt, judge.evidence_hash) != (
            judged.attempt,
            judged.evidence_hash,
        ):
            await store.finish_job(conn, seq, "dropped", "the judgement is no longer wanted")
            return "dropped"
        await self._handler.conclude(conn, state, judge, outcome)
        await store.finish_job(conn, seq, "done", type(outcome).__name__)
        self.concluded += 1
        return "concluded"

    async def _finish_in_flight(self) -> None:
        """Let the judgements in flight run to their commit (the drain)."""
        await self._settle_tasks()

    async def _settle_tasks(self) -> None:
        tasks = [task for _verifier, task in list(self._running.values())]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _release_in_flight(self) -> None:
        """Cancelled mid-judgement: hand the leases back so another claim need not wait them out."""
        tasks = [task for _verifier, task in list(self._running.values())]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        tokens = list(self._held)
        self._held.clear()
        if not tokens:
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(10):
                conn = await connect(self._database_url)
                try:
                    released = await store.release_jobs(conn, tokens)
                finally:
                    await conn.close(timeout=2)
                JOBS.labels("released").inc(released)
                log.info("judging_leases_released", count=released)
