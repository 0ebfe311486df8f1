"""The verification consumer: a consumer group over the indexed events and the API's requests.

Group `escrowd-verification`, topics `escrow.events.v1` and `escrow.verification-requests.v1`
(names from settings). It runs on the project's `IdempotentConsumer`: each message is applied
once (inbox row), in a savepoint, and its offsets are committed after the database commit.
For one message the handler:

1. parses it (a payload that is not an escrow event or a request is a `PermanentError`:
   the runtime dead-letters it with the reason); a finalize, review or verifier report must
   carry the requester's signed request or a trusted API service signature
   (`verification.request_auth`), else it is dead-lettered the same way;
2. takes the task's advisory lock, loads the task's state (`results_store.load_state`);
3. asks the pure `routing.decide` what to do, and applies each effect; a `Judge` effect is
   not run here: it becomes a job (`verification_jobs`, queued) committed with the message.
   The judging stage (`verification.judging_stage`) claims it, calls this handler's `judge`
   (the auto-check and the terms' registry verifier) outside any transaction, and commits
   the outcome through `conclude` (`routing.conclude`) under the task's lock: a signed
   verdict (`schemas.verdict`) queued on the verdicts topic through the outbox, or a retry
   later when a verifier could not answer.

A retry is a message too: `RetryScheduler` (run by the service next to the consumer) moves
due retries to the requests topic, so every judgement is decided in this handler, on the
task's own partition, under the task's lock.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg
import structlog
from eth_utils.crypto import keccak
from prometheus_client import Counter
from pydantic import ValidationError

from runtime.consumer import InboundMessage, PermanentError, RetryableError
from runtime.kafka import cloudevent_headers
from runtime.outbox import OutboxMessage, enqueue
from schemas import jsoncodec, topics
from schemas.events import EscrowEventMessage
from schemas.task_terms import (
    FinalizeRequested,
    RetryDue,
    ReviewSubmitted,
    VerifierFailed,
    VerifierRef,
    VerifierVerdictReported,
    parse_request_message,
    request_event_type,
)
from schemas.verdict import (
    SignedVerdict,
    Verdict,
    verdict_digest,
    verdict_headers,
    verdict_key,
    verdict_message_id,
    verdict_payload,
    verdict_typed_data,
)
from verification import results_store as store
from verification.auto_check import auto_check
from verification.proof import (
    VERIFIER_VERSION,
    ZERO_AGENT,
    Proof,
    SignedProof,
    criteria_hash,
    proof_digest,
    proof_fields,
    typed_data,
)
from verification.registry import VerificationError, VerifierRegistry, describe
from verification.request_auth import RequestNotTrusted, authenticate, resolved
from verification.routing import (
    ChainEvent,
    CouldNotJudge,
    EventObserved,
    EventRetracted,
    Judge,
    Judged,
    Message,
    RecordResult,
    RequestObserved,
    RequestRecord,
    RetryDueObserved,
    RetryPolicy,
    TaskKey,
    TaskState,
    apply,
    combine,
    conclude,
    decide,
)
from verification.signing import Document, VerdictSigning

log = structlog.get_logger(__name__)

CONSUMER_NAME = "escrowd-verification"
_TASK_EVENTS = frozenset(
    {
        "TaskCreated",
        "TaskCancelled",
        "TaskAccepted",
        "EvidenceSubmitted",
        "VerificationCompleted",
        "DisputeRaised",
        "DisputeResolved",
        "TaskRefunded",
        "TaskEscalated",
        "EscalationCollected",
    }
)

VERDICTS = Counter(
    "escrowd_verification_verdicts_total", "Verdicts recorded, by mode, source and result", ["mode", "source", "result"]
)
UNTRUSTED_REQUESTS = Counter(
    "escrowd_verification_untrusted_requests_total", "Request messages dead-lettered for want of a trusted signature"
)
JOBS_QUEUED = Counter("escrowd_verification_jobs_queued_total", "Judgements queued for the judging stage")
VERIFIER_ERRORS = Counter(
    "escrowd_verification_verifier_errors_total", "Registry verifiers that could not answer", ["kind"]
)


@dataclass(frozen=True)
class Topics:
    """The topics this consumer reads and writes (overridable, e.g. per test)."""

    events: str = topics.ESCROW_EVENTS
    requests: str = topics.VERIFICATION_REQUESTS
    verdicts: str = topics.VERDICTS
    dead_letters: str = topics.DEAD_LETTERS


@dataclass
class VerificationHandler:
    """The consumer's handler `(conn, message)`: parse, decide, apply."""

    registry: VerifierRegistry
    signing: VerdictSigning = field(repr=False)
    """The verification key (`verification.signing`): signs verdicts and proofs, ahead of the
    transaction when the key is held over the network."""
    topics: Topics = field(default_factory=Topics)
    retry_policy: RetryPolicy = field(default_factory=RetryPolicy)
    clock: Callable[[], float] = time.time
    trusted_api_signers: frozenset[str] = frozenset()
    """API service addresses whose signature vouches for a request (besides the requester's own)."""

    async def __call__(self, conn: asyncpg.Connection, message: InboundMessage) -> None:
        parsed = self.parse(message)
        if parsed is None:
            return
        key, routed = parsed
        try:
            await store.lock_task(conn, key)
        except asyncpg.exceptions.DeadlockDetectedError:
            # Two members locked tasks in opposite orders: the runtime retries the batch.
            raise RetryableError("deadlock while locking a task") from None
        state = await store.load_state(conn, key)
        for effect in decide(state, routed):
            state = await self._execute(conn, state, effect)

    # ------------------------------------------------------------------ parsing

    def parse(self, message: InboundMessage) -> tuple[TaskKey, Message] | None:
        """The task and the routed message, None when the message is not about a task."""
        data = message.json()
        if message.topic == self.topics.events:
            event = EscrowEventMessage.model_validate(data)
            if event.task_id is None or event.event not in _TASK_EVENTS:
                return None
            try:
                event.typed_args()
            except (ValueError, ValidationError) as exc:
                raise PermanentError(f"{event.event} args do not match the ABI: {exc}"[:300]) from None
            key = TaskKey(event.chain_id, event.escrow_address, event.task_id)
            if event.removed:
                return key, EventRetracted(event.id)
            return key, EventObserved(
                ChainEvent(
                    event_id=event.id,
                    block_number=event.block_number,
                    log_index=event.log_index,
                    tx_hash=event.tx_hash,
                    name=event.event,
                    args=event.args,
                )
            )
        if message.topic == self.topics.requests:
            request = parse_request_message(data)
            try:
                authenticate(request, self.trusted_api_signers)
                request = resolved(request)
            except RequestNotTrusted as exc:
                UNTRUSTED_REQUESTS.inc()
                raise PermanentError(f"request not trusted: {exc}"[:500]) from None
            key = TaskKey(request.chain_id, request.escrow_address, request.task_id)
            if isinstance(request, RetryDue):
                return key, RetryDueObserved(request.target_request_id, request.retry_count)
            return key, RequestObserved(_record(request))
        raise PermanentError(f"topic {message.topic} is not one this consumer reads")

    # ------------------------------------------------------------------ effects

    async def _execute(self, conn: asyncpg.Connection, state: TaskState, effect: Any) -> TaskState:
        if isinstance(effect, Judge):
            # Judging is slow (a sandbox, an endpoint, a model): it never runs in this
            # transaction. The job commits with the message; the judging stage does the rest.
            if await store.queue_job(conn, state.key, effect, judge_verifier(state)):
                JOBS_QUEUED.inc()
            return state
        if isinstance(effect, RecordResult):
            await self._record(conn, state, effect)
        else:
            await store.apply_effect(conn, state.key, effect)
        log.info(
            "verification_effect",
            effect=type(effect).__name__,
            chain_id=state.key.chain_id,
            task_id=state.key.task_id,
            attempt=getattr(effect, "attempt", None),
        )
        return apply(state, effect)

    async def conclude(
        self, conn: asyncpg.Connection, state: TaskState, effect: Judge, outcome: Judged | CouldNotJudge
    ) -> TaskState:
        """Apply a judgement's outcome (a signed verdict, or a retry later) and what follows from it."""
        for follow_up in conclude(state, effect, outcome, self.retry_policy):
            state = await self._execute(conn, state, follow_up)
        return state

    def documents(self, state: TaskState, effects: Sequence[Any]) -> list[Document]:
        """What the signed records among `effects` need signed (for `VerdictSigning.sign_ahead`)."""
        documents: list[Document] = []
        for effect in effects:
            if isinstance(effect, RecordResult) and effect.sign:
                verdict, proof = self._unsigned(state, effect)
                documents += _documents(verdict, proof)
        return documents

    def _unsigned(self, state: TaskState, effect: RecordResult) -> tuple[Verdict, Proof]:
        """The verdict and the proof a signed record carries, before their signatures."""
        key = state.key
        reasons = [str(r) for r in effect.verification_result.get("reasons", ())][:64]
        if state.terms is not None and state.terms.private:
            # Reasons can quote a private brief and result: the verdicts topic carries none.
            reasons = []
        verdict = Verdict(
            **dataclasses.asdict(key),
            attempt=effect.attempt,
            evidence_hash=effect.evidence_hash,
            passed=effect.passed,
            score=effect.score,
            reasons=reasons,
            verifier_kind=effect.verifier_kind[:128],
            mode=effect.mode,
            issued_at=datetime.fromtimestamp(self.clock(), tz=UTC),
        )
        return verdict, self._proof(state, effect)

    async def _record(self, conn: asyncpg.Connection, state: TaskState, effect: RecordResult) -> None:
        key = state.key
        signed_json: dict[str, Any] | None = None
        proof_json: dict[str, Any] | None = None
        message_id: str | None = None
        outbox: list[OutboxMessage] = []
        if effect.sign:
            verdict, proof = self._unsigned(state, effect)
            # Made ahead for a key held over the network (SignFirst when not: the transaction
            # rolls back and the signatures are made outside it).
            verdict_signature, proof_signature = await self.signing.signatures(_documents(verdict, proof))
            # Every field is canonical by construction: no re-validation on this hot path.
            signed = SignedVerdict.model_construct(
                verdict=verdict, signature=verdict_signature, signer=self.signing.address
            )
            signed_json = signed.model_dump(mode="json")
            proof_json = SignedProof(proof=proof, signature=proof_signature, signer=self.signing.address).to_json_dict()
            message_id = verdict_message_id(verdict)
            outbox.append(
                OutboxMessage(
                    message_id=message_id,
                    topic=self.topics.verdicts,
                    key=verdict_key(verdict),
                    payload=verdict_payload(signed),
                    headers=verdict_headers(signed),
                )
            )
        inserted = await store.insert_result(
            conn, key, effect, agent=state.chain.agent, signed_verdict=signed_json, verdict_message_id=message_id,
            signed_proof=proof_json,
        )
        if not inserted:
            # The attempt has a final verdict already: judged at most once, nothing is sent.
            log.warning("verdict_already_recorded", task_id=key.task_id, attempt=effect.attempt)
            return
        await enqueue(conn, outbox)
        VERDICTS.labels(effect.mode, effect.source, "passed" if effect.passed else "failed").inc()

    def _proof(self, state: TaskState, effect: RecordResult) -> Proof:
        """Seed 002's whole proof of this verdict (signed EIP-712, domain bound to chain and escrow)."""
        terms = state.terms
        return Proof(
            chain_id=state.key.chain_id,
            escrow=state.key.escrow,
            task_id=state.key.task_id,
            attempt=effect.attempt,
            agent=state.chain.agent or ZERO_AGENT,
            evidence_hash=effect.evidence_hash,
            criteria_hash=criteria_hash(
                terms.criteria if terms else None, terms.verifier if terms else None
            ),
            passed=effect.passed,
            score=effect.score,
            public_tests=effect.proof_fields.get("publicTests", ""),
            hidden_tests=effect.proof_fields.get("hiddenTests", ""),
            resource_limits=effect.proof_fields.get("resourceLimits", ""),
            verifier_id=effect.verifier_kind[:256],
            verifier_version=VERIFIER_VERSION,
        )

    # ------------------------------------------------------------------ judging

    async def judge(self, state: TaskState, effect: Judge) -> Judged | CouldNotJudge:
        """The auto-check, then the terms' registry verifier (only if the auto-check passed)."""
        terms = state.terms
        criteria = terms.criteria if terms is not None else None
        ref_data = terms.verifier if terms is not None else None
        ref = VerifierRef.model_validate(ref_data) if ref_data else None
        auto = auto_check(effect.result, criteria or {}) if criteria is not None or ref is None else None
        if auto is not None and (not auto.passed or ref is None):
            return Judged(auto, "auto-check")
        assert ref is not None
        name = describe(ref)
        task = verifier_task(state, effect, ref, terms.instructions_digest if terms else "")
        try:
            outcome = await self.registry.verify(ref, task, effect.result)
        except VerificationError as exc:
            VERIFIER_ERRORS.labels(ref.kind).inc()
            log.warning("verifier_could_not_answer", verifier=exc.verifier, reason=exc.reason, task_id=state.key.task_id)
            return CouldNotJudge(exc.verifier, exc.reason)
        # A rubric judge names the version it used (`rubric:owner/name@3`): the verdict records it.
        name = str(outcome.detail.get("resolvedAs") or name)
        result = combine(auto, name, outcome.reward, ref.pass_reward, outcome.reasons)
        kind = name if auto is None else f"auto-check+{name}"
        return Judged(result, kind, proof_fields(outcome.detail))


def judge_verifier(state: TaskState) -> str:
    """The verifier a task's judgement waits on (`describe` of its terms' verifier): the key of
    the judging stage's per-verifier concurrency limit."""
    ref_data = state.terms.verifier if state.terms is not None else None
    if not ref_data:
        return "auto-check"
    try:
        return describe(VerifierRef.model_validate(ref_data))
    except ValidationError:
        return "unknown"


def verifier_task(state: TaskState, effect: Judge, ref: VerifierRef, digest: str) -> dict[str, Any]:
    """The `task` a registry verifier receives: the terms' verifier config plus the task's identity."""
    return {
        **ref.config,
        "chainId": state.key.chain_id,
        "escrow": state.key.escrow,
        "taskId": state.key.task_id,
        "attempt": effect.attempt,
        "evidenceHash": effect.evidence_hash,
        "instructionsDigest": digest,
    }


def _documents(verdict: Verdict, proof: Proof) -> list[Document]:
    """The verdict's and the proof's EIP-712 messages, in that order."""
    return [
        Document(verdict_digest(verdict), functools.partial(verdict_typed_data, verdict)),
        Document(proof_digest(proof), functools.partial(typed_data, proof)),
    ]


def _record(
    request: FinalizeRequested | ReviewSubmitted | VerifierVerdictReported | VerifierFailed,
) -> RequestRecord:
    payload: Mapping[str, Any] = request.model_dump(
        mode="json", exclude={
            "request_id", "chain_id", "escrow_address", "task_id", "attempt", "evidence_hash", "actor",
            "requester", "service", "result_in_proof",
        },
    )
    return RequestRecord(
        request_id=request.request_id,
        kind=request.kind,
        attempt=request.attempt,
        evidence_hash=request.evidence_hash.lower(),
        actor=request.actor,
        payload=payload,
    )


def request_message(
    request: FinalizeRequested | ReviewSubmitted | VerifierVerdictReported | VerifierFailed | RetryDue,
    topic: str,
) -> OutboxMessage:
    """The outbox row carrying a request to the consumer (keyed like the task's events).

    Its message id (the consumer's inbox key) is the request id plus a digest of the whole
    payload, proofs included: a forged message that reuses a predictable request id can
    never make the consumer skip the genuine message as a duplicate of itself.
    """
    payload = jsoncodec.dumps(request.model_dump(mode="json"))
    message_id = f"{request.request_id}#{bytes(keccak(payload)).hex()[:32]}"
    return OutboxMessage(
        message_id=message_id,
        topic=topic,
        key=f"{request.chain_id}:{request.task_id}".encode(),
        payload=payload,
        headers=cloudevent_headers(
            id=message_id,
            source=f"escrowd/verification-api/{request.chain_id}/{request.escrow_address}",
            type=request_event_type(request.kind),
            subject=str(request.task_id),
            time=datetime.fromtimestamp(request.requested_at, tz=UTC).isoformat().replace("+00:00", "Z"),
        ),
    )
