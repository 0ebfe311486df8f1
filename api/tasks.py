"""Routes of the verification service: terms, finalize, review, verifier reports, results.

Every write is signed by the acting address for the deployment it acts on
(`runtime.web.auth`) and answered with either a result or one `{"error": {code, message}}`.
The nonce is spent as soon as the signature verifies, whatever the outcome; a write then
stores its request row and queues its message (to the verification consumer, through the
outbox, carrying the signed request so the consumer can verify it again) in one
transaction. The chain as this API sees it is the indexer's `escrow_events`; chain time
is the indexer's newest block time (the wall clock until the indexer has run).

The decisions are pure functions (`finalize_check`, `review_check`, `report_check`,
`visibility`); the routes only load, decide and store.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import asyncpg
from eth_utils.address import is_address, to_checksum_address
from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from api.settings import ApiSettings
from runtime.outbox import enqueue
from runtime.web.auth import Caller, Signed, authenticate, has_auth
from runtime.web.errors import ApiProblem, error_responses
from runtime.web.params import AddressPath, ChainPath, EscrowPath, TaskPath
from schemas.task_state import MAX_SUBMISSIONS
from schemas.task_terms import (
    MAX_RESULT_BYTES,
    SUPPORTED_MODES,
    CanonicalJsonError,
    Execution,
    ExecutionsPage,
    FinalizeRequest,
    FinalizeRequested,
    FinalizeResponse,
    PublicTerms,
    PublicVerifierRef,
    RegisterTermsRequest,
    RegisterTermsResponse,
    RequestAccepted,
    ResultView,
    ReviewRequest,
    ReviewSubmitted,
    TaskResults,
    TaskTerms,
    VerifierFailed,
    VerifierReportRequest,
    VerifierVerdictReported,
    result_hash,
    result_size,
    task_hash,
)
from schemas.verification import VerificationResult
from verification import results_store as store
from verification.agents.checks import check_named_verifier
from verification.consumer import request_message
from verification.criteria_validation import validate_criteria
from verification.registry import VerifierConfigError, VerifierRegistry
from verification.request_auth import RelayedRequest, request_id_for, service_proof
from verification.routing import (
    ChainTask,
    RequestRecord,
    TaskKey,
    TermsView,
    fold_chain,
    terms_problem,
)

router = APIRouter(prefix="/v1", tags=["verification"])

_ERRORS = error_responses(
    (400, "Refused: the request breaks a rule (see `error.code`)"),
    (401, "Missing, invalid or expired signature"),
    (403, "The signer may not do this"),
    (404, "Unknown task or terms"),
    (409, "Conflicts with the task's state (see `error.code`)"),
    (413, "The result is too large"),
    (422, "The body does not fit the schema"),
    (503, "The API is configured with no deployment to serve (`NO_DEPLOYMENT`)"),
)
_POLL_SECONDS = 0.2



@dataclass(frozen=True)
class Ctx:
    """What a route needs, from the app's state."""

    settings: ApiSettings
    pool: asyncpg.Pool
    clock: Callable[[], float]
    registry: VerifierRegistry


def _ctx(request: Request) -> Ctx:
    state = request.app.state
    return Ctx(settings=state.settings, pool=state.pool, clock=state.clock, registry=state.registry)


def _relayed(ctx: Ctx, caller: Caller, message: RelayedRequest) -> RelayedRequest:
    """The message with the caller's signed request, and the API's service proof when keyed."""
    update: dict[str, Any] = {"requester": caller.proof}
    if isinstance(message, FinalizeRequested):
        update |= {"result": None, "result_in_proof": True}  # the signed body holds it
    message = message.model_copy(update=update)
    key = ctx.settings.api_service_key
    if key is not None:
        message = message.model_copy(update={"service": service_proof(message, key.get_secret_value())})
    return message


def _key(chain_id: int, escrow: str, task_id: int) -> TaskKey:
    return TaskKey(chain_id, str(to_checksum_address(escrow)), task_id)


async def _optional_caller(request: Request, chain_id: int | None = None, escrow: str | None = None) -> Caller | None:
    if not has_auth(request):
        return None
    return await authenticate(request, chain_id, escrow)


@dataclass(frozen=True)
class TaskCall:
    """A route's view of one task: the app's context, the task's key, and its caller on demand.

    The caller is authenticated only when a route asks, after FastAPI has validated the body:
    a malformed body is 422 before any signature check and spends no nonce."""

    ctx: Ctx
    key: TaskKey
    request: Request

    async def caller(self) -> Caller:
        """The signer of the request for the task's deployment (its nonce spent)."""
        return await authenticate(self.request, self.key.chain_id, self.key.escrow)

    async def optional_caller(self) -> Caller | None:
        """The signer when the request is signed; None when anonymous."""
        return await _optional_caller(self.request, self.key.chain_id, self.key.escrow)

    def request_fields(self, caller: Caller, kind: str, attempt: int, evidence: str, nonce: str = "") -> dict[str, Any]:
        """The fields every request message carries, its deterministic id among them."""
        key = self.key
        return {
            "request_id": request_id_for(kind, key.chain_id, key.escrow, key.task_id, attempt, evidence, nonce),
            "chain_id": key.chain_id,
            "escrow_address": key.escrow,
            "task_id": key.task_id,
            "attempt": attempt,
            "evidence_hash": evidence,
            "actor": caller.address,
            "requested_at": int(self.ctx.clock()),
        }

    async def store_request(
        self, conn: asyncpg.Connection, caller: Caller, message: RelayedRequest, payload: dict[str, Any]
    ) -> bool:
        """Store the request row and queue its message in one transaction; False for a duplicate."""
        relayed = _relayed(self.ctx, caller, message)
        record = RequestRecord(
            message.request_id, message.kind, message.attempt, message.evidence_hash, caller.address, payload
        )
        async with conn.transaction():
            new = await store.insert_api_request(conn, self.key, record)
            if new:
                await enqueue(conn, [request_message(relayed, self.ctx.settings.verification_requests_topic)])
        return new


async def _task_call(chain_id: ChainPath, escrow: EscrowPath, task_id: TaskPath, request: Request) -> TaskCall:
    return TaskCall(_ctx(request), _key(chain_id, escrow, task_id), request)


TaskRoute = Annotated[TaskCall, Depends(_task_call)]
"""The route parameter giving a `/tasks/{chain_id}/{escrow}/{task_id}` route its `TaskCall`."""


def _same(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and a.lower() == b.lower()


# ---------------------------------------------------------------------------- pure decisions


@dataclass(frozen=True)
class Refusal:
    """A refusal; `wait` when indexing may still turn it into an acceptance."""

    status: int
    code: str
    message: str
    wait: bool = False

    def problem(self) -> ApiProblem:
        return ApiProblem(self.status, self.code, self.message)


@dataclass(frozen=True)
class FinalizeOk:
    """The finalize names this attempt."""

    attempt: int


def finalize_check(
    chain: ChainTask,
    terms_issue: str | None,
    terms_registered: bool,
    signer: str,
    evidence_hash: str,
    chain_now: int,
    marketplace_verifier: str | None,
) -> FinalizeOk | Refusal:
    """May `signer` finalize a result hashing to `evidence_hash` now?"""
    if chain.task_hash is None:
        return Refusal(404, "TASK_NOT_FOUND", "the task is not indexed (yet)", wait=True)
    if _same(signer, chain.verifier) or _same(signer, marketplace_verifier):
        return Refusal(403, "IS_VERIFIER", "the task's verifier cannot also do the work")
    if chain.agent is None:
        return Refusal(409, "TASK_NOT_ACCEPTED", "no agent holds the task (yet)", wait=True)
    if not _same(signer, chain.agent):
        return Refusal(403, "NOT_TASK_AGENT", "only the agent holding the task can finalize")
    if not terms_registered:
        return Refusal(409, "TERMS_NOT_REGISTERED", "no terms are registered for the task's taskHash")
    if terms_issue is not None:
        return Refusal(409, "TERMS_MISMATCH", f"the registered terms do not govern this task: {terms_issue}")
    attempt = next((a for a, h in chain.attempts.items() if h == evidence_hash), None)
    deadline_passed = chain.deadline is not None and chain_now >= chain.deadline
    if attempt is None:
        if len(chain.attempts) >= MAX_SUBMISSIONS:
            return Refusal(409, "MAX_ATTEMPTS_REACHED", f"all {MAX_SUBMISSIONS} submissions are used; this result is none of them")
        if deadline_passed:
            return Refusal(409, "DEADLINE_REACHED", "the task's deadline has passed")
        current = chain.attempts.get(chain.current_attempt)
        expected = f"the evidence of attempt {chain.current_attempt} is {current}" if current else "no evidence is submitted"
        return Refusal(
            409, "EVIDENCE_MISMATCH", f"the result hashes to {evidence_hash}, but {expected}", wait=True
        )
    if attempt != chain.current_attempt:
        return Refusal(409, "ATTEMPT_SUPERSEDED", f"attempt {attempt} was followed by a later submission")
    if attempt in chain.verdicts:
        return Refusal(409, "ATTEMPT_ALREADY_JUDGED", f"attempt {attempt} already has its verdict on chain")
    if not chain.submitted:
        return Refusal(409, "TASK_NOT_SUBMITTED", "the task is no longer waiting for a verdict")
    if deadline_passed:
        return Refusal(409, "DEADLINE_REACHED", "the task's deadline has passed")
    return FinalizeOk(attempt)


def _terms_refusal(chain: ChainTask, mode: str | None, terms_issue: str | None, wanted: str, by: str) -> Refusal | None:
    """Why a request for a `wanted`-mode task cannot be taken now: no task, no terms, or others."""
    if chain.task_hash is None:
        return Refusal(404, "TASK_NOT_FOUND", "the task is not indexed (yet)")
    if mode is None:
        return Refusal(409, "TERMS_NOT_REGISTERED", "no terms are registered for the task's taskHash")
    if terms_issue is not None:
        return Refusal(409, "TERMS_MISMATCH", f"the registered terms do not govern this task: {terms_issue}")
    if mode != wanted:
        return Refusal(409, f"NOT_{wanted.upper()}_TASK", f"this task is verified in {mode} mode, not by {by}")
    return None


def review_check(
    chain: ChainTask, mode: str | None, terms_issue: str | None, signer: str, attempt: int, evidence_hash: str
) -> FinalizeOk | Refusal:
    """May `signer` review now, and is the attempt it names (with its evidence) the current one?"""
    refused = _terms_refusal(chain, mode, terms_issue, "manual", "the poster")
    if refused is not None:
        return refused
    if not _same(signer, chain.poster):
        return Refusal(403, "NOT_POSTER", "only the poster reviews the task")
    if not chain.submitted or chain.current_attempt in chain.verdicts:
        return Refusal(409, "TASK_NOT_SUBMITTED", "the task is not waiting for a review")
    if attempt != chain.current_attempt:
        return Refusal(409, "ATTEMPT_MISMATCH", f"the review names attempt {attempt}; the current attempt is {chain.current_attempt}")
    if chain.attempts.get(attempt) != evidence_hash:
        return Refusal(409, "EVIDENCE_MISMATCH", f"attempt {attempt} on chain does not have evidence hash {evidence_hash}")
    return FinalizeOk(chain.current_attempt)


def report_check(
    chain: ChainTask, mode: str | None, terms_issue: str | None, signer: str, attempt: int, evidence_hash: str
) -> FinalizeOk | Refusal:
    """May `signer` report on `attempt` of the task as its verifier?"""
    refused = _terms_refusal(chain, mode, terms_issue, "agent", "a verifier agent")
    if refused is not None:
        return refused
    if _same(signer, chain.agent):
        return Refusal(409, "SELF_VERIFICATION", "an agent never judges its own work")
    if not _same(signer, chain.verifier):
        return Refusal(403, "NOT_TASK_VERIFIER", "only the task's named verifier reports on it")
    if chain.attempts.get(attempt) != evidence_hash:
        return Refusal(409, "EVIDENCE_MISMATCH", f"attempt {attempt} on chain does not have this evidence hash")
    return FinalizeOk(attempt)


def visibility(private: bool, caller: str | None, parties: tuple[str | None, ...]) -> Literal["full", "summary"]:
    """Everyone sees a public task's results; a private task's only its parties see in full."""
    if not private:
        return "full"
    return "full" if caller is not None and any(_same(caller, p) for p in parties) else "summary"


def result_view(row: Any, view: Literal["full", "summary"]) -> ResultView:
    """A recorded verdict as the reader may see it."""
    if view == "summary":
        return ResultView(attempt=row["attempt"], passed=row["passed"], score=row["score"])
    return ResultView(
        attempt=row["attempt"],
        passed=row["passed"],
        score=row["score"],
        status="judged",
        evidence_hash=row["evidence_hash"],
        source=row["source"],
        verification_result=VerificationResult.model_validate(row["result"]),
        settled_tx=row["settled_tx"],
    )


# ---------------------------------------------------------------------------- terms


@router.post(
    "/terms",
    status_code=201,
    response_model=RegisterTermsResponse,
    responses={200: {"model": RegisterTermsResponse, "description": "Already registered"}, **_ERRORS},
    summary="Register a task's off-chain terms; returns the taskHash to post on chain",
)
async def register_terms(
    body: RegisterTermsRequest,
    request: Request,
    response: Response,
    _signed: Signed,
) -> RegisterTermsResponse:
    """Signed by the poster named in the terms."""
    ctx = _ctx(request)
    caller = await authenticate(request, body.chain_id, body.escrow)
    if not _same(caller.address, body.poster):
        raise ApiProblem(403, "NOT_POSTER", "the terms must be registered by the poster they name")
    mode = body.verification_mode if body.verification_mode is not None else "manual"
    if mode not in SUPPORTED_MODES:
        raise ApiProblem(400, "VERIFICATION_MODE_UNSUPPORTED", f"verificationMode {mode!r} is not supported; use auto, manual or agent")
    if mode == "agent" and body.verifier_address is None:
        raise ApiProblem(400, "VERIFIER_REQUIRED", "agent mode needs verifierAddress")
    if mode != "agent" and body.verifier_address is not None:
        raise ApiProblem(400, "VERIFIER_NOT_ALLOWED", "verifierAddress is for agent mode only")
    if body.verifier_address is not None and _same(body.verifier_address, body.poster):
        raise ApiProblem(409, "SELF_VERIFICATION", "the poster cannot name itself as the verifier")
    if body.verifier is not None:
        if mode != "auto":
            raise ApiProblem(400, "VERIFIER_REF_NOT_ALLOWED", "a registry verifier runs in auto mode only")
        try:
            ctx.registry.check(body.verifier)
        except VerifierConfigError as exc:
            raise ApiProblem(400, "VERIFIER_CONFIG_INVALID", str(exc)) from None
    warnings: list[str] = []
    criteria: dict[str, Any] | None = None
    if body.verification_criteria is not None or mode == "auto":
        # A registry verifier is a real check of its own: the criteria may then be absent.
        check_mode = "manual" if body.verifier is not None else mode
        verdict = validate_criteria(body.verification_criteria, check_mode)
        if not verdict.ok:
            raise ApiProblem(400, verdict.code or "VERIFICATION_CRITERIA_INVALID", "; ".join(verdict.errors)[:1000] or "criteria refused")
        warnings = list(verdict.warnings)
        if body.verification_criteria is not None and verdict.criteria is not None:
            criteria = verdict.criteria.model_dump(mode="json", exclude_none=True)
    terms = TaskTerms.model_validate(
        {
            "chainId": body.chain_id,
            "escrow": body.escrow,
            "poster": body.poster,
            "instructionsDigest": body.instructions_digest,
            "verificationMode": mode,
            "verificationCriteria": criteria,
            "verifierAddress": body.verifier_address,
            "verifier": body.verifier.model_dump(by_alias=True) if body.verifier is not None else None,
            "private": body.private,
            "salt": body.salt,
        }
    )
    digest = task_hash(terms)
    async with ctx.pool.acquire() as conn, conn.transaction():
        if terms.verifier_address is not None:
            await check_named_verifier(conn, terms.verifier_address)  # 409 VERIFIER_NOT_OPTED_IN
        new = await store.insert_terms(conn, digest, terms)
    if not new:
        response.status_code = 200
    return RegisterTermsResponse(task_hash=digest, canonical=terms.canonical(), terms=terms, warnings=warnings)


class DeploymentView(BaseModel):
    """One deployment this API serves: the EIP-712 domain of its signed requests."""

    model_config = ConfigDict(frozen=True)
    chain_id: int = Field(serialization_alias="chainId")
    escrow: str


@router.get(
    "/deployments",
    response_model=list[DeploymentView],
    response_model_by_alias=True,
    summary="The deployments this API serves; requests that name none act on the first",
)
async def deployments(request: Request) -> list[DeploymentView]:
    served = _ctx(request).settings.served_deployments()
    return [DeploymentView(chain_id=d.chain_id, escrow=d.escrow) for d in served]


@router.get(
    "/terms/{task_hash}",
    response_model=PublicTerms,
    responses=_ERRORS,
    summary="The public part of registered terms (expected answers and verifier configs stay hidden)",
)
async def get_terms(
    task_hash_value: Annotated[str, Path(alias="task_hash", pattern=r"^0x[0-9a-fA-F]{64}$")],
    request: Request,
) -> PublicTerms:
    ctx = _ctx(request)
    async with ctx.pool.acquire() as conn:
        terms = await store.load_terms_json(conn, task_hash_value)
    if terms is None:
        raise ApiProblem(404, "TERMS_NOT_FOUND", "no terms are registered under this taskHash")
    criteria = terms.get("verificationCriteria")
    if isinstance(criteria, dict) and "expected_answer" in criteria:
        criteria = {k: v for k, v in criteria.items() if k != "expected_answer"} | {"has_expected_answer": True}
    ref = terms.get("verifier")
    return PublicTerms(
        task_hash=task_hash_value.lower(),
        chain_id=terms["chainId"],
        escrow=terms["escrow"],
        poster=terms["poster"],
        verification_mode=terms["verificationMode"],
        verification_criteria=criteria,
        verifier_address=terms.get("verifierAddress"),
        verifier=PublicVerifierRef(kind=ref["kind"], ref=ref["ref"]) if isinstance(ref, dict) else None,
        private=bool(terms.get("private")),
    )


# ---------------------------------------------------------------------------- finalize


async def _chain_and_terms(conn: asyncpg.Connection, key: TaskKey) -> tuple[ChainTask, TermsView | None]:
    chain = fold_chain(await store.indexed_events(conn, key))
    terms = await store.load_terms(conn, chain.task_hash) if chain.task_hash else None
    return chain, terms


async def _chain_now(conn: asyncpg.Connection, key: TaskKey, ctx: Ctx) -> int:
    indexed = await store.chain_time(conn, key.chain_id)
    return indexed if indexed is not None else int(ctx.clock())


def _status_of(mode: str, request_row: Any, failures: Any) -> Literal["pending", "retrying", "awaiting_review", "awaiting_verifier", "never_judged"]:
    if mode == "manual":
        return "awaiting_review"
    if mode == "agent":
        return "never_judged" if failures is not None and failures["never_judged"] else "awaiting_verifier"
    if request_row is not None and request_row["state"] in ("waiting_retry", "retry_queued"):
        return "retrying"
    return "pending"


@router.post(
    "/tasks/{chain_id}/{escrow}/{task_id}/finalize",
    response_model=FinalizeResponse,
    responses={202: {"model": FinalizeResponse, "description": "Accepted, verdict pending"}, **_ERRORS},
    summary="The agent delivers the result of its current on-chain attempt (runs the check in auto mode)",
)
async def finalize(call: TaskRoute, body: FinalizeRequest, response: Response, _signed: Signed) -> FinalizeResponse:
    """Signed by the agent holding the task. 200 with the verdict when judged in time, else 202."""
    ctx, key = call.ctx, call.key
    caller = await call.caller()
    try:
        size = result_size(body.result)
        evidence = result_hash(body.result)
    except CanonicalJsonError as exc:
        raise ApiProblem(400, "RESULT_INVALID", str(exc)) from None
    if size > MAX_RESULT_BYTES:
        raise ApiProblem(413, "RESULT_TOO_LARGE", f"the result is {size} bytes; at most {MAX_RESULT_BYTES}")
    give_up = time.monotonic() + ctx.settings.evidence_wait_seconds
    while True:
        async with ctx.pool.acquire() as conn:
            chain, terms = await _chain_and_terms(conn, key)
            now = await _chain_now(conn, key, ctx)
        decision = finalize_check(
            chain,
            terms_problem(key, chain, terms) if terms is not None else None,
            terms is not None,
            caller.address,
            evidence,
            now,
            ctx.settings.marketplace_verifier_address,
        )
        if isinstance(decision, FinalizeOk):
            break
        if not decision.wait or time.monotonic() >= give_up:
            async with ctx.pool.acquire() as conn:
                earlier = await _judged_duplicate(conn, key, chain, evidence)
            if earlier is not None:
                response.status_code = 200
                return _finalize_response(key, earlier["attempt"], evidence, "judged", earlier)
            raise decision.problem()
        await asyncio.sleep(_POLL_SECONDS)
    assert terms is not None
    attempt = decision.attempt
    message = FinalizeRequested(result=body.result, **call.request_fields(caller, "finalize", attempt, evidence))
    request_id = message.request_id
    async with ctx.pool.acquire() as conn:
        await call.store_request(conn, caller, message, {"result": body.result})
    wait_until = time.monotonic() + (ctx.settings.finalize_wait_seconds if terms.mode == "auto" else 0)
    while True:
        async with ctx.pool.acquire() as conn:
            row = await store.result_for(conn, key, attempt)
            if row is not None and row["status"] == "final" and row["evidence_hash"] == evidence:
                response.status_code = 200
                return _finalize_response(key, attempt, evidence, "judged", row)
            state_row = await store.request_row(conn, request_id)
            # A verifier that could not answer will be retried later: no point holding the client.
            retrying = state_row is not None and state_row["state"] in ("waiting_retry", "retry_queued")
            if retrying or time.monotonic() >= wait_until:
                failures = (await store.task_failures(conn, key)).get(attempt)
                response.status_code = 202
                return _finalize_response(key, attempt, evidence, _status_of(terms.mode, state_row, failures), None)
        await asyncio.sleep(_POLL_SECONDS)


async def _judged_duplicate(conn: asyncpg.Connection, key: TaskKey, chain: ChainTask, evidence: str) -> Any:
    """The recorded verdict of the attempt with this evidence: a repeated finalize gets it back."""
    attempt = next((a for a, h in chain.attempts.items() if h == evidence), None)
    if attempt is None:
        return None
    row = await store.result_for(conn, key, attempt)
    if row is None or row["status"] != "final" or row["evidence_hash"] != evidence:
        return None
    return row


def _finalize_response(key: TaskKey, attempt: int, evidence: str, status: Any, row: Any) -> FinalizeResponse:
    return FinalizeResponse(
        chain_id=key.chain_id,
        escrow=key.escrow,
        task_id=key.task_id,
        attempt=attempt,
        evidence_hash=evidence,
        status=status,
        verification_result=VerificationResult.model_validate(row["result"]) if row is not None else None,
    )


# ---------------------------------------------------------------------------- review and verifier reports


@router.post(
    "/tasks/{chain_id}/{escrow}/{task_id}/review",
    status_code=202,
    response_model=RequestAccepted,
    responses={200: {"model": RequestAccepted, "description": "The same review again"}, **_ERRORS},
    summary="The poster approves or rejects the current attempt of a manual task",
)
async def review(call: TaskRoute, body: ReviewRequest, response: Response, _signed: Signed) -> RequestAccepted:
    """Signed by the poster; names the attempt and evidence hash it judges; up to 20 reasons."""
    ctx, key = call.ctx, call.key
    caller = await call.caller()
    async with ctx.pool.acquire() as conn:
        chain, terms = await _chain_and_terms(conn, key)
        issue = terms_problem(key, chain, terms) if terms is not None else None
        decision = review_check(
            chain, terms.mode if terms else None, issue, caller.address, body.attempt, body.evidence_hash.lower()
        )
        if isinstance(decision, Refusal):
            raise decision.problem()
        attempt = decision.attempt
        evidence = chain.attempts[attempt]
        existing_result = await store.result_for(conn, key, attempt)
        if existing_result is not None and existing_result["status"] == "final":
            raise ApiProblem(409, "ALREADY_REVIEWED", f"attempt {attempt} is already judged")
        fields = call.request_fields(caller, "review", attempt, evidence)
        request_id = fields["request_id"]
        payload: dict[str, Any] = {"passed": body.passed, "reasons": list(body.reasons)}
        earlier = await store.request_row(conn, request_id)
        if earlier is not None:
            same = earlier["payload"].get("passed") == body.passed and list(earlier["payload"].get("reasons") or []) == list(body.reasons)
            if not same:
                raise ApiProblem(409, "ALREADY_REVIEWED", f"attempt {attempt} was already reviewed differently")
            response.status_code = 200
            return RequestAccepted(request_id=request_id, attempt=attempt, evidence_hash=evidence, status="duplicate")
        message = ReviewSubmitted(passed=body.passed, reasons=list(body.reasons), **fields)
        await call.store_request(conn, caller, message, payload)
    return RequestAccepted(request_id=request_id, attempt=attempt, evidence_hash=evidence, status="accepted")


@router.post(
    "/tasks/{chain_id}/{escrow}/{task_id}/verifier-report",
    status_code=202,
    response_model=RequestAccepted,
    responses=_ERRORS,
    summary="The named verifier reports its on-chain verdict (with reasons) or a failed try",
)
async def verifier_report(call: TaskRoute, body: VerifierReportRequest, _signed: Signed) -> RequestAccepted:
    """Signed by the verifier agent; a verdict is recorded once it matches the chain."""
    ctx, key = call.ctx, call.key
    caller = await call.caller()
    evidence = body.evidence_hash.lower()
    if body.outcome == "verdict" and (body.passed is None or body.score is None):
        raise ApiProblem(400, "REPORT_INVALID", "a verdict report needs passed and score")
    async with ctx.pool.acquire() as conn:
        chain, terms = await _chain_and_terms(conn, key)
        issue = terms_problem(key, chain, terms) if terms is not None else None
        decision = report_check(chain, terms.mode if terms else None, issue, caller.address, body.attempt, evidence)
        if isinstance(decision, Refusal):
            raise decision.problem()
        message: VerifierVerdictReported | VerifierFailed
        if body.outcome == "verdict":
            assert body.passed is not None and body.score is not None
            fields = call.request_fields(caller, "verifier_verdict", body.attempt, evidence)
            message = VerifierVerdictReported(passed=body.passed, score=body.score, reasons=list(body.reasons), **fields)
            payload: dict[str, Any] = {"passed": body.passed, "score": body.score, "reasons": list(body.reasons)}
        else:
            fields = call.request_fields(caller, "verifier_error", body.attempt, evidence, caller.nonce)
            message = VerifierFailed(error=body.error or "", **fields)
            payload = {"error": body.error or ""}
        new = await call.store_request(conn, caller, message, payload)
    return RequestAccepted(
        request_id=message.request_id, attempt=body.attempt, evidence_hash=evidence, status="accepted" if new else "duplicate"
    )


# ---------------------------------------------------------------------------- reads


@router.get(
    "/tasks/{chain_id}/{escrow}/{task_id}/results",
    response_model=TaskResults,
    response_model_exclude_none=True,
    responses=_ERRORS,
    summary="Every attempt's verdict; on a private task only its parties see more than passed and score",
)
async def task_results(call: TaskRoute, _signed: Signed) -> TaskResults:
    """Anonymous, or signed by a party of the task (poster, agent, verifier) to see a private task in full."""
    ctx, key = call.ctx, call.key
    caller = await call.optional_caller()
    async with ctx.pool.acquire() as conn:
        chain, terms = await _chain_and_terms(conn, key)
        rows = await store.task_results(conn, key)
        requests = await store.task_requests(conn, key)
        failures = await store.task_failures(conn, key)
    if chain.task_hash is None and not rows:
        raise ApiProblem(404, "TASK_NOT_FOUND", "the task is not indexed (yet)")
    private = bool(terms.private) if terms is not None else False
    view = visibility(private, caller.address if caller else None, (chain.poster, chain.agent, chain.verifier))
    results = [result_view(r, view) for r in rows if r["status"] == "final"]
    judged = {r.attempt for r in results}
    mode = terms.mode if terms is not None else None
    if view == "full" and mode is not None:
        for attempt in sorted(chain.attempts):
            if attempt in judged or attempt < chain.current_attempt or not chain.submitted:
                continue
            finalize_row = next((q for q in requests if q["kind"] == "finalize" and q["attempt"] == attempt), None)
            if mode == "auto" and finalize_row is None:
                continue  # not finalized: the check has not run and will not until it is
            results.append(
                ResultView(attempt=attempt, status=_status_of(mode, finalize_row, failures.get(attempt)), evidence_hash=chain.attempts[attempt])
            )
    return TaskResults(
        chain_id=key.chain_id,
        escrow=key.escrow,
        task_id=key.task_id,
        verification_mode=mode,
        private=private,
        visibility=view,
        results=results,
    )


@router.get(
    "/tasks/{chain_id}/{escrow}/{task_id}/proof",
    responses=_ERRORS,
    summary="Seed 002's signed proof of an attempt's verdict (the latest judged attempt by default)",
)
async def task_proof(
    call: TaskRoute, attempt: Annotated[int | None, Query(ge=1, le=255)] = None
) -> dict[str, Any]:
    """The signed proof JSON; check it offline with `escrowd verify proof FILE`."""
    async with call.ctx.pool.acquire() as conn:
        proof = await store.signed_proof(conn, call.key, attempt)
    if proof is None:
        raise ApiProblem(404, "PROOF_NOT_FOUND", "no signed proof for this task (or attempt) yet")
    return proof


@router.get(
    "/agents/{address}/executions",
    response_model=ExecutionsPage,
    response_model_exclude_none=True,
    responses=_ERRORS,
    summary="An agent's finalized attempts with their verdicts (full for the agent itself)",
)
async def executions(
    address: AddressPath,
    request: Request,
    _signed: Signed,
    limit: Annotated[int | None, Query(ge=1, le=10_000)] = None,
) -> ExecutionsPage:
    """Anonymous callers see private tasks' executions as passed and score only."""
    ctx = _ctx(request)
    caller = await _optional_caller(request)
    agent = str(to_checksum_address(address)) if is_address(address) else address
    count = min(limit or ctx.settings.executions_limit, ctx.settings.executions_limit)
    async with ctx.pool.acquire() as conn:
        rows = await store.agent_executions(conn, agent, count)
    items: list[Execution] = []
    for row in rows:
        private = bool(row["private"])
        view = visibility(private, caller.address if caller else None, (agent,))
        if row["passed"] is not None and row["status"] == "final":
            result = result_view(row, view)
        elif view == "full":
            state = row["request_state"]
            status: Any = "retrying" if state in ("waiting_retry", "retry_queued") else (
                "pending" if row["verification_mode"] == "auto" else
                "awaiting_review" if row["verification_mode"] == "manual" else "awaiting_verifier"
            )  # fmt: skip
            result = ResultView(attempt=row["attempt"], status=status, evidence_hash=row["evidence_hash"])
        else:
            result = ResultView(attempt=row["attempt"])
        items.append(
            Execution(
                chain_id=row["chain_id"],
                escrow=row["escrow_address"],
                task_id=int(row["task_id"]),
                private=private,
                visibility=view,
                result=result,
            )
        )
    return ExecutionsPage(agent=agent, executions=items)


__all__ = ["finalize_check", "report_check", "review_check", "router", "visibility"]
