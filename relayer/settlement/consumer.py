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

`VerdictConsumer` adds a batch fast path to the shared runtime (see its docstring): the
ordinary verdicts of a fetch are applied with one statement per step (inbox rows, indexed
state, idempotency rows) instead of ~6 round trips each; anything unusual in the batch goes
through the runtime's per-message path, unchanged.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pydantic
import structlog
from aiokafka import ConsumerRecord, TopicPartition

from relayer.settlement import metrics, store
from relayer.settlement.store import IndexedTask, NewVerdict
from runtime.consumer import (
    INBOX_INSERT_MANY_SQL,
    MAX_MESSAGE_ID_CHARS,
    IdempotentConsumer,
    InboundMessage,
    PermanentError,
    Where,
)
from runtime.db import is_connection_error
from schemas.verdict import (
    InvalidSignature,
    SignedVerdict,
    Verdict,
    recover_signer,
    verdict_message_id,
)

log = structlog.get_logger(__name__)

MAX_ATTEMPTS = 3  # the escrow's MAX_SUBMISSIONS
# Messages parsed and signature-checked between two yields to the event loop (~0.1 ms each).
CHECK_SLICE = 10
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
        # Verdicts newly queued per chain in the consumer's open transaction: the consumer
        # wakes the senders with them once it committed (`take_queued`).
        self._queued: Counter[int] = Counter()

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
        await self.admit_many(conn, [(message_id_or(message.message_id, verdict), signed, message.value)])

    @staticmethod
    def parse(message: InboundMessage) -> SignedVerdict | None:
        """The message's verdict, or None when it is malformed (no metrics: the per-message
        path, which refuses it, counts it)."""
        try:
            return SignedVerdict.model_validate(message.json())
        except (PermanentError, pydantic.ValidationError):
            return None

    def signature_ok(self, signed: SignedVerdict) -> bool:
        """True when a trusted signer signed exactly this verdict."""
        return check_signature(signed, self._trusted) is None

    async def admit_many(
        self, conn: asyncpg.Connection, items: Sequence[tuple[str, SignedVerdict, bytes]]
    ) -> None:
        """Decide on correctly signed verdicts (message id, verdict, payload) and store the outcomes.

        The caller guarantees that no two items share a message id or an attempt. Two
        statements whatever the count (the indexed state of every task, then every
        idempotency row) plus one per refusal: the per-message path passes one item, the
        batch path a fetch's ordinary verdicts.
        """
        now = self._clock.now().astimezone()
        tasks = await store.indexed_tasks(
            conn, [(s.verdict.chain_id, s.verdict.escrow.lower(), s.verdict.task_id) for _, s, _ in items]
        )
        rows: list[NewVerdict] = []
        for message_id, signed, payload in items:
            verdict = signed.verdict
            task = tasks.get((verdict.chain_id, verdict.escrow.lower(), verdict.task_id))
            decision = decide(verdict, task, self._served, now=now, received_at=now, wait_limit=self._wait_limit)
            if isinstance(decision, Reject):
                bound = log.bind(
                    chain_id=verdict.chain_id, task_id=verdict.task_id, attempt=verdict.attempt, message_id=message_id
                )
                await self._reject(conn, message_id, payload, signed, decision, bound)
                continue
            status = "awaiting_evidence" if isinstance(decision, Wait) else "queued"
            if isinstance(decision, Accept) and decision.already_judged:
                status = "already_judged"
            row = NewVerdict(
                **store.call_of(verdict),
                message_id=message_id,
                signer=signed.signer,
                signed_verdict=signed.model_dump_json(),
                status=status,
                issued_at=verdict.issued_at,
                wait_until=now + self._wait_limit if status == "awaiting_evidence" else None,
            )
            rows.append(row)
        inserted = await store.insert_verdicts(conn, rows)
        # Counted once per outcome, and no logger bound per verdict: this loop runs for every
        # verdict of a burst, on the event loop the sender shares.
        counts: Counter[str] = Counter()
        for row in rows:
            where = {"chain_id": row.chain_id, "task_id": row.task_id, "attempt": row.attempt, "message_id": row.message_id}
            if row.key not in inserted:
                counts["duplicate"] += 1
                log.info("verdict_duplicate_attempt", **where)
                continue
            counts["awaiting_evidence" if row.status == "awaiting_evidence" else "accepted"] += 1
            log.info("verdict_accepted", **where, status=row.status, passed=row.passed, score=row.score)
        for outcome, count in counts.items():
            metrics.VERDICTS_RECEIVED.labels(outcome).inc(count)
        self._queued.update(row.chain_id for row in rows if row.key in inserted and row.status == "queued")

    def take_queued(self) -> dict[int, int]:
        """Verdicts queued per chain since the last call (a hint: a transaction rolled back
        after counting them makes it larger than what committed, never a reason to send)."""
        queued, self._queued = dict(self._queued), Counter()
        return queued

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


def split_fetch(
    batches: Mapping[TopicPartition, list[ConsumerRecord[bytes, bytes]]], size: int
) -> list[dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]]:
    """A fetch cut into consecutive pieces of `size` records at most, in the fetch's order
    (partition by partition, each partition's records in offset order)."""
    chunks: list[dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]] = []
    current: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]] = {}
    room = size
    for tp, records in batches.items():
        start = 0
        while start < len(records):
            piece = records[start : start + room]
            current[tp] = piece
            start += len(piece)
            room -= len(piece)
            if room == 0:
                chunks.append(current)
                current, room = {}, size
    if current:
        chunks.append(current)
    return chunks


def message_id_or(message_id: str | None, verdict: Verdict) -> str:
    """The message id, or the verdict's deterministic id when the message had none."""
    return message_id or verdict_message_id(verdict)


class VerdictConsumer(IdempotentConsumer):
    """The shared `IdempotentConsumer` with a batch fast path for the relayer's verdicts.

    Per message, the runtime makes about six round trips (inbox row, in-flight mark,
    savepoint, indexed-state read, idempotency row, release): at a burst of verdicts they
    were most of the relayer's time. Here `handle_batch` (the runtime's hook) applies every
    *ordinary* message of a fetched batch at once, inside the runtime's own transaction (so
    the offsets, the in-flight marks, the end-of-batch clear and the commit are the runtime's):

    1. the runtime marks the batch's first message in flight before the hook parses anything;
    2. a message is ordinary when it passes the runtime's bounds (id, size), parses, is
       correctly signed by a trusted signer, and neither its message id nor its attempt
       appeared earlier in the batch; the rest go, in order, through the runtime's
       per-message path, after the ordinary ones (which is equivalent: no earlier message
       shares a key with an ordinary one);
    3. one statement inserts the inbox rows (those already present are duplicates), one
       reads the indexed state of every task, one inserts the idempotency rows.

    All of it runs in a savepoint: a statement that fails for any reason other than the
    connection rolls the fast path back, and the whole batch goes through the per-message
    path (which isolates the culprit as before). Poison pills: if the process dies inside a
    fast batch, the mark names the batch's first message; after a restart, while a dead
    run's mark is unresolved, batches take the per-message path, whose marks find the
    message that kills (`poison_after_deaths` counts as before).
    """

    applies_batches = True

    def __init__(
        self,
        *,
        handler: VerdictHandler,
        fetch_max_wait_ms: int = 20,
        commit_chunk: int | None = None,
        on_queued: Callable[[int, int], None] | None = None,
        **kwargs: Any,
    ) -> None:
        # A 20 ms fetch wait: measured on Tansu, ~50 ms between a publish and its delivery at
        # aiokafka's default (500 ms), ~7 ms at 20 ms.
        super().__init__(handler=handler, fetch_max_wait_ms=fetch_max_wait_ms, **kwargs)
        self._verdicts = handler
        # Each consumer transaction costs ~8 round trips whatever its size, and each commit
        # wakes the sender: a whole fetch per commit (None) sends a burst as one round
        # (docs/performance.md, "Relayer: one round per fetch").
        self._commit_chunk = commit_chunk
        self._on_queued = on_queued

    async def _process_prepared(
        self,
        conn: asyncpg.Connection,
        batches: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]],
    ) -> None:
        """A fetch applied in one transaction, or in consecutive ones of `commit_chunk` verdicts at most.

        Each chunk is a whole runtime transaction (inbox rows, idempotency rows, offsets in
        direct mode, the senders' wake-up on commit: `on_queued`, then the database's
        notification). Small chunks let the sender start on a burst's first verdicts while
        the rest are checked; whole fetches (the default) send it in one round. A death
        between chunks resumes after the last committed one (direct mode) or replays the
        committed ones as duplicates (group mode: the broker's offsets are committed after
        the whole fetch)."""
        chunks = [batches] if self._commit_chunk is None else split_fetch(batches, max(1, self._commit_chunk))
        for chunk in chunks:
            self._verdicts.take_queued()  # what a failed chunk counted before
            await super()._process_prepared(conn, chunk)
            if self._on_queued is not None:
                # Committed: the senders of this process look now, without waiting for the
                # database's notification (which still wakes a sender in another process).
                for chain_id, count in self._verdicts.take_queued().items():
                    self._on_queued(chain_id, count)

    async def _ordinary(self, messages: Sequence[InboundMessage]) -> list[tuple[InboundMessage, SignedVerdict]]:
        seen_ids: set[str] = set()
        seen_attempts: set[tuple[int, str, int, int]] = set()
        ordinary: list[tuple[InboundMessage, SignedVerdict]] = []
        for position, message in enumerate(messages):
            if position and position % CHECK_SLICE == 0:
                # The checks are CPU on the event loop the senders share: let their
                # receipts, broadcasts and head updates run between slices.
                await asyncio.sleep(0)
            message_id = message.message_id
            fresh_id = bool(message_id) and message_id not in seen_ids
            if message_id:
                seen_ids.add(message_id)
            if not fresh_id or len(message_id or "") > MAX_MESSAGE_ID_CHARS:
                continue
            if len(message.value) > self._max_message_bytes:
                continue
            signed = self._verdicts.parse(message)
            if signed is None:
                continue
            v = signed.verdict
            attempt = (v.chain_id, v.escrow.lower(), v.task_id, v.attempt)
            fresh_attempt = attempt not in seen_attempts
            seen_attempts.add(attempt)
            if fresh_attempt and self._verdicts.signature_ok(signed):
                ordinary.append((message, signed))
        return ordinary

    async def handle_batch(self, conn: asyncpg.Connection, messages: Sequence[InboundMessage]) -> Mapping[Where, str]:
        """The ordinary verdicts of a fetch, one statement per step (see the class)."""
        ordinary = await self._ordinary(messages)
        if not ordinary:
            return {}
        done: dict[Where, str] = {}
        try:
            async with conn.transaction():
                new_ids = {
                    r["message_id"]
                    for r in await conn.fetch(
                        INBOX_INSERT_MANY_SQL,
                        self.name,
                        [m.message_id for m, _ in ordinary],
                        [m.topic for m, _ in ordinary],
                        [m.partition for m, _ in ordinary],
                        [m.offset for m, _ in ordinary],
                    )
                }
                items = []
                for message, signed in ordinary:
                    where = (message.topic, message.partition, message.offset)
                    if message.message_id in new_ids:
                        items.append((str(message.message_id), signed, message.value))
                        done[where] = "processed"
                    else:
                        done[where] = "duplicate"
                await self._verdicts.admit_many(conn, items)
        except Exception as exc:
            if is_connection_error(exc):
                raise
            # Anything else: the savepoint is gone; every message takes the per-message path.
            log.warning("verdict_batch_fallback", consumer=self.name, error=type(exc).__name__)
            return {}
        return done
