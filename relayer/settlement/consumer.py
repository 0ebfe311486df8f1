"""The verdict consumer: signed verdicts in, idempotency rows out (the sender does the rest).

Runs on the shared `IdempotentConsumer` (inbox, savepoint, dead letters, offsets after the
commit). For each message:

1. parse the `SignedVerdict` (a malformed body is a dead letter);
2. `check_signature`: recover the signer; refuse a bad signature, a signer that is not
   the one claimed, or one that is not a registered verification service;
3. `decide` (pure) against the indexed state re-read from `escrow_events`: the verdict
   must name the task's current attempt and its evidence hash. An attempt not indexed yet
   waits (`awaiting_evidence`) rather than being refused, up to a limit;
4. insert the idempotency row, UNIQUE per (chain, escrow, task, attempt), before anything
   is signed; a second verdict for the same attempt finds the row and is a duplicate.

Refusals are recorded in `settlement_rejections` and counted; they are never sent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg
import pydantic
import structlog

from relayer.settlement import metrics, store
from relayer.settlement.store import IndexedTask
from runtime.consumer import InboundMessage, PermanentError
from schemas.verdict import (
    InvalidSignature,
    SignedVerdict,
    Verdict,
    recover_signer,
    verdict_message_id,
)

log = structlog.get_logger(__name__)

MAX_ATTEMPTS = 3  # the escrow's MAX_SUBMISSIONS
SIGNATURE_REASONS = frozenset({"bad_signature", "signer_mismatch", "untrusted_signer"})


@dataclass(frozen=True)
class Accept:
    """Send it (or, when the chain already judged the attempt, record that and do not)."""

    already_judged: bool = False


@dataclass(frozen=True)
class Wait:
    """The attempt is not indexed yet: keep the verdict and look again later."""

    reason: str


@dataclass(frozen=True)
class Reject:
    """Never send it."""

    reason: str
    detail: str


Decision = Accept | Wait | Reject


def check_signature(signed: SignedVerdict, trusted: frozenset[str]) -> Reject | None:
    """None when a registered verification service signed exactly this verdict."""
    try:
        recovered = recover_signer(signed)
    except InvalidSignature as exc:
        return Reject("bad_signature", str(exc))
    if recovered != signed.signer:
        return Reject("signer_mismatch", f"signature recovers {recovered}, claims {signed.signer}")
    if recovered not in trusted:
        return Reject("untrusted_signer", f"{recovered} is not a registered verification service")
    return None


def decide(
    verdict: Verdict,
    task: IndexedTask | None,
    served: Mapping[int, frozenset[str]],
    *,
    now: datetime,
    received_at: datetime,
    wait_limit: timedelta,
) -> Decision:
    """Check a correctly signed verdict against the indexed state of its task.

    Cases, in order: escrow not served by this relayer; attempt outside 1..3; task or
    attempt not indexed yet (wait, until `wait_limit` after `received_at`); task judged by
    a named verifier agent (it sends its own verdict); attempt older than the task's
    latest (stale); evidence hash different from the indexed one; attempt already judged
    per the index (recorded, not sent); otherwise accept.
    """
    escrows = served.get(verdict.chain_id)
    if escrows is None or verdict.escrow.lower() not in escrows:
        return Reject("unknown_escrow", f"chain {verdict.chain_id} escrow {verdict.escrow} is not served here")
    if not 1 <= verdict.attempt <= MAX_ATTEMPTS:
        return Reject("attempt_out_of_range", f"attempt {verdict.attempt} is outside 1..{MAX_ATTEMPTS}")
    expired = now - received_at >= wait_limit
    if task is None or task.latest_attempt == 0:
        if expired:
            return Reject("attempt_not_indexed", f"task {verdict.task_id} has no indexed evidence")
        return Wait("task_not_indexed")
    if task.named_verifier is not None:
        return Reject(
            "named_verifier_task", f"task {verdict.task_id} is judged by {task.named_verifier}"
        )
    if verdict.attempt < task.latest_attempt:
        return Reject(
            "stale_attempt",
            f"verdict names attempt {verdict.attempt}, the task is at attempt {task.latest_attempt}",
        )
    if verdict.attempt > task.latest_attempt:
        if expired:
            return Reject(
                "attempt_not_indexed",
                f"attempt {verdict.attempt} never indexed (task at {task.latest_attempt})",
            )
        return Wait("attempt_not_indexed")
    if verdict.evidence_hash != task.latest_evidence_hash:
        return Reject(
            "evidence_mismatch",
            f"verdict evidence {verdict.evidence_hash} != indexed {task.latest_evidence_hash}",
        )
    return Accept(already_judged=verdict.attempt in task.judged_attempts)


def _dedup_key(message_id: str | None, payload: bytes, reason: str) -> str:
    digest = hashlib.sha256(payload).hexdigest()[:32]
    return f"{message_id or '-'}:{reason}:{digest}"


class VerdictHandler:
    """The `IdempotentConsumer` handler of the relayer."""

    def __init__(
        self,
        *,
        consumer_name: str,
        trusted_signers: frozenset[str],
        served: Mapping[int, frozenset[str]],
        wait_limit: timedelta,
        clock: type[datetime] = datetime,
    ) -> None:
        self._consumer = consumer_name
        self._trusted = trusted_signers
        self._served = {chain: frozenset(e.lower() for e in escrows) for chain, escrows in served.items()}
        self._wait_limit = wait_limit
        self._clock = clock

    async def __call__(self, conn: asyncpg.Connection, message: InboundMessage) -> None:
        try:
            signed = SignedVerdict.model_validate(message.json())  # bounded JSON first
        except PermanentError:
            metrics.VERDICTS_RECEIVED.labels("rejected").inc()
            metrics.VERDICT_REJECTIONS.labels("malformed").inc()
            raise
        except pydantic.ValidationError as exc:
            metrics.VERDICTS_RECEIVED.labels("rejected").inc()
            metrics.VERDICT_REJECTIONS.labels("malformed").inc()
            raise PermanentError(f"malformed verdict: {exc.error_count()} error(s)") from None
        verdict = signed.verdict
        bound = log.bind(
            chain_id=verdict.chain_id, task_id=verdict.task_id, attempt=verdict.attempt, message_id=message.message_id
        )
        refusal = check_signature(signed, self._trusted)
        if refusal is not None:
            metrics.SIGNATURE_REJECTIONS.labels(refusal.reason).inc()
            await self._reject(conn, message.message_id, message.value, signed, refusal, bound)
            if message.message_id:
                # A copy signed by a key registered later must not count as a duplicate.
                await store.release_inbox(conn, self._consumer, message.message_id)
            return
        await self.admit(conn, signed, message.message_id, message.value, bound)

    async def admit(
        self,
        conn: asyncpg.Connection,
        signed: SignedVerdict,
        message_id: str | None,
        payload: bytes,
        bound: structlog.typing.FilteringBoundLogger,
    ) -> None:
        """Decide on a correctly signed verdict and store the outcome."""
        verdict = signed.verdict
        now = self._clock.now().astimezone()
        task = await store.indexed_task(conn, verdict.chain_id, verdict.escrow, verdict.task_id)
        decision = decide(
            verdict, task, self._served, now=now, received_at=now, wait_limit=self._wait_limit
        )
        if isinstance(decision, Reject):
            await self._reject(conn, message_id_or(message_id, verdict), payload, signed, decision, bound)
            return
        status = "awaiting_evidence" if isinstance(decision, Wait) else "queued"
        if isinstance(decision, Accept) and decision.already_judged:
            status = "already_judged"
        inserted = await store.insert_verdict(
            conn,
            chain_id=verdict.chain_id,
            escrow=verdict.escrow,
            task_id=verdict.task_id,
            attempt=verdict.attempt,
            evidence_hash=verdict.evidence_hash,
            passed=verdict.passed,
            score=verdict.score,
            message_id=message_id or verdict_message_id(verdict),
            signer=signed.signer,
            signed_verdict=signed.model_dump(mode="json"),
            status=status,
            issued_at=verdict.issued_at,
            wait_until=now + self._wait_limit if status == "awaiting_evidence" else None,
        )
        if inserted is None:
            metrics.VERDICTS_RECEIVED.labels("duplicate").inc()
            bound.info("verdict_duplicate_attempt")
            return
        outcome = "awaiting_evidence" if status == "awaiting_evidence" else "accepted"
        metrics.VERDICTS_RECEIVED.labels(outcome).inc()
        bound.info("verdict_accepted", status=status, passed=verdict.passed, score=verdict.score)

    async def _reject(
        self,
        conn: asyncpg.Connection,
        message_id: str | None,
        body: bytes,
        signed: SignedVerdict,
        refusal: Reject,
        bound: structlog.typing.FilteringBoundLogger,
    ) -> None:
        verdict = signed.verdict
        metrics.VERDICTS_RECEIVED.labels("rejected").inc()
        metrics.VERDICT_REJECTIONS.labels(refusal.reason).inc()
        await store.insert_rejection(
            conn,
            dedup_key=_dedup_key(message_id, body, refusal.reason),
            message_id=message_id,
            reason=refusal.reason,
            detail=refusal.detail,
            payload=body,
            chain_id=verdict.chain_id,
            escrow=verdict.escrow,
            task_id=verdict.task_id,
            attempt=verdict.attempt,
            signer=signed.signer,
        )
        bound.warning("verdict_rejected", reason=refusal.reason, detail=refusal.detail)

    async def admit_waiting(self, conn: asyncpg.Connection) -> int:
        """Look again at verdicts waiting for their attempt; return how many left the wait."""
        moved = 0
        now = self._clock.now().astimezone()
        for waiting in await store.waiting_verdicts(conn):
            signed = SignedVerdict.model_validate(waiting.signed_verdict)
            task = await store.indexed_task(conn, waiting.chain_id, waiting.escrow, waiting.task_id)
            decision = decide(
                signed.verdict,
                task,
                self._served,
                now=now,
                received_at=waiting.received_at,
                wait_limit=self._wait_limit,
            )
            bound = log.bind(chain_id=waiting.chain_id, task_id=waiting.task_id, attempt=waiting.attempt)
            if isinstance(decision, Wait):
                continue
            moved += 1
            async with conn.transaction():
                if isinstance(decision, Reject):
                    await store.drop_waiting(conn, waiting.id)
                    body = signed.model_dump_json().encode()
                    await self._reject(conn, waiting.message_id, body, signed, decision, bound)
                    continue
                status = "already_judged" if decision.already_judged else "queued"
                await store.promote_waiting(conn, waiting.id, status)
                if status == "queued":
                    await store.notify_sender(conn, waiting.chain_id)
                bound.info("verdict_evidence_indexed", status=status)
        return moved


def message_id_or(message_id: str | None, verdict: Verdict) -> str:
    """The message id, or the verdict's deterministic id when the message had none."""
    return message_id or verdict_message_id(verdict)
