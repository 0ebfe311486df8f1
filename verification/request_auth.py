"""Who may put a request on the verification requests topic: proofs checked by the consumer.

A finalize, review or verifier report reaches the verification consumer only through Kafka,
and anyone who can write that topic could forge one. So the consumer trusts a request
message only when it carries

* a `RequesterProof`: the actor's own signed HTTP request (EIP-712, `schemas.request_auth`),
  verified again here over the message's own deployment (chain id + escrow), and matching
  the message field by field (actor, task path, attempt, evidence hash, decision, result,
  request id); or
* a `ServiceProof`: a signature by an API service key this consumer is configured to trust
  over the whole message (its RFC 8785 canonical JSON without the service proof).

Anything else is refused with a reason (the consumer dead-letters it). The requester's
expiry is not checked here: the API checked it on receipt, a message may wait in Kafka
longer than a signature lives, and a replayed message carries the same deterministic
request id, so it deduplicates. `RetryDue` messages need no proof: they only re-run a
request already recorded (unknown or stale targets are ignored by the router).

Pure functions; `authenticate` raises `RequestNotTrusted` with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from eth_utils.crypto import keccak
from pydantic import ValidationError

from schemas import eip712, jsoncodec
from schemas.request_auth import (
    Deployment,
    RequesterProof,
    ServiceProof,
    service_digest,
)
from schemas.task_terms import (
    CanonicalJsonError,
    FinalizeRequest,
    FinalizeRequested,
    RetryDue,
    ReviewRequest,
    ReviewSubmitted,
    VerifierFailed,
    VerifierReportRequest,
    VerifierVerdictReported,
    canonical_json,
    result_hash,
)

RelayedRequest = FinalizeRequested | ReviewSubmitted | VerifierVerdictReported | VerifierFailed

_ROUTE = {"finalize": "finalize", "review": "review", "verifier_verdict": "verifier-report", "verifier_error": "verifier-report"}
_TASK_PATH = re.compile(r"^/v1/tasks/([0-9]{1,19})/(0x[0-9a-fA-F]{40})/([0-9]{1,78})/([a-z-]{1,20})$")


class RequestNotTrusted(ValueError):
    """The request message carries no proof this consumer accepts; the text says why."""


def request_id_for(
    kind: str, chain_id: int, escrow: str, task_id: int, attempt: int, evidence_hash: str, nonce: str = ""
) -> str:
    """The deterministic id of a relayed request (so a replayed message deduplicates)."""
    base = f"{chain_id}:{escrow.lower()}:{task_id}:{attempt}"
    if kind == "finalize":
        return f"finalize:{base}:{evidence_hash.lower()}"
    if kind == "review":
        return f"review:{base}:{evidence_hash.lower()}"
    if kind == "verifier_verdict":
        return f"verifier-verdict:{base}:{evidence_hash.lower()}"
    if kind == "verifier_error":
        return f"verifier-error:{base}:{nonce}"
    raise ValueError(f"no request id for kind {kind!r}")


def payload_hash(request: RelayedRequest) -> bytes:
    """keccak256 of the message's canonical JSON without its service proof."""
    return bytes(keccak(canonical_json(request.model_dump(mode="json", exclude={"service"})).encode("utf-8")))


def service_proof(request: RelayedRequest, private_key: str) -> ServiceProof:
    """The API service key's proof over one relayed request."""
    deployment = Deployment(request.chain_id, request.escrow_address)
    digest = service_digest(deployment, request.request_id, payload_hash(request))
    return ServiceProof(signer=eip712.signer_address(private_key), signature=eip712.sign(digest, private_key))


def authenticate(request: RelayedRequest | RetryDue, trusted_services: Collection[str]) -> str:
    """How the message is trusted (`requester` / `service` / `internal`); RequestNotTrusted if not."""
    if isinstance(request, RetryDue):
        return "internal"
    problems: list[str] = []
    if request.requester is not None:
        problem = requester_problem(request, request.requester)
        if problem is None:
            return "requester"
        problems.append(f"requester signature refused: {problem}")
    if request.service is not None:
        problem = service_problem(request, request.service, trusted_services)
        if problem is None:
            return "service"
        problems.append(f"service signature refused: {problem}")
    if not problems:
        raise RequestNotTrusted("unsigned request: neither the requester's signature nor a trusted service signature")
    raise RequestNotTrusted("; ".join(problems))


def resolved(request: RelayedRequest | RetryDue) -> RelayedRequest | RetryDue:
    """The request with a finalize's result taken from its signed body (`result_in_proof`).

    Call after `authenticate`; RequestNotTrusted when the body that should hold the result
    is missing or unreadable.
    """
    if not isinstance(request, FinalizeRequested) or not request.result_in_proof:
        return request
    if request.requester is None:
        raise RequestNotTrusted("result_in_proof without the requester's signed body")
    try:
        final = FinalizeRequest.model_validate(jsoncodec.loads(request.requester.raw_body()))
    except (ValueError, ValidationError):
        raise RequestNotTrusted("the signed body holding the result does not parse") from None
    if result_hash(final.result) != request.evidence_hash.lower():
        raise RequestNotTrusted("the signed result does not hash to the message's evidence hash")
    return request.model_copy(update={"result": final.result, "result_in_proof": False})


def service_problem(request: RelayedRequest, proof: ServiceProof, trusted: Collection[str]) -> str | None:
    """Why the service proof is not acceptable, or None."""
    if proof.signer.lower() not in {t.lower() for t in trusted}:
        return f"{proof.signer} is not a trusted API service key"
    digest = service_digest(Deployment(request.chain_id, request.escrow_address), request.request_id, payload_hash(request))
    try:
        recovered = eip712.recover(digest, proof.signature)
    except eip712.InvalidSignature as exc:
        return str(exc)
    if recovered.lower() != proof.signer.lower():
        return "the signature is not the service key's over this message"
    return None


def requester_problem(request: RelayedRequest, proof: RequesterProof) -> str | None:
    """Why the relayed signed request does not prove this message, or None."""
    if proof.signer.lower() != request.actor.lower():
        return "the signer is not the message's actor"
    if proof.method != "POST":
        return "the signed request is not a POST"
    match = _TASK_PATH.match(proof.path)
    if match is None:
        return "the signed path is not a task route"
    chain, escrow, task, route = match.groups()
    if (int(chain), escrow.lower(), int(task)) != (request.chain_id, request.escrow_address.lower(), request.task_id):
        return "the signed path names another task"
    if route != _ROUTE[request.kind]:
        return f"the signed request is a {route}, not a {request.kind}"
    try:
        digest = proof.digest(Deployment(request.chain_id, request.escrow_address))
        recovered = eip712.recover(digest, proof.signature)
    except eip712.InvalidSignature as exc:
        return str(exc)
    except ValueError:
        return "the relayed body is not base64"
    if recovered.lower() != proof.signer.lower():
        return "the signature is not the signer's over this request to this deployment"
    try:
        body = jsoncodec.loads(proof.raw_body())
    except ValueError:
        return "the signed body is not JSON"
    if not isinstance(body, dict):
        return "the signed body is not a JSON object"
    problem = _body_problem(request, body)
    if problem is not None:
        return problem
    expected = request_id_for(
        request.kind, request.chain_id, request.escrow_address, request.task_id, request.attempt,
        request.evidence_hash, proof.nonce,
    )  # fmt: skip
    if request.request_id != expected:
        return "the request id does not follow from the signed request"
    return None


def _body_problem(request: RelayedRequest, body: dict[str, Any]) -> str | None:
    """Compare the message with the signed body, parsed by the API's own request models."""
    try:
        if isinstance(request, FinalizeRequested):
            final = FinalizeRequest.model_validate(body)
            if request.result_in_proof:
                if request.result is not None:
                    return "a message with result_in_proof carries a result of its own"
                same = result_hash(final.result) == request.evidence_hash.lower()
                return None if same else "the signed result does not hash to the message's evidence hash"
            same = canonical_json(final.result) == canonical_json(request.result)
            return None if same else "the message's result is not the signed one"
        if isinstance(request, ReviewSubmitted):
            review = ReviewRequest.model_validate(body)
            signed: tuple[Any, ...] = (review.attempt, review.evidence_hash.lower(), review.passed, list(review.reasons))
            if signed != (request.attempt, request.evidence_hash.lower(), request.passed, list(request.reasons)):
                return "the message's attempt, evidence hash or decision is not the signed one"
            return None
        report = VerifierReportRequest.model_validate(body)
    except (ValidationError, CanonicalJsonError) as exc:
        return f"the signed body does not parse: {type(exc).__name__}"
    if (report.attempt, report.evidence_hash.lower()) != (request.attempt, request.evidence_hash.lower()):
        return "the signed report names another attempt or evidence hash"
    if isinstance(request, VerifierVerdictReported):
        signed = (report.outcome, report.passed, report.score, list(report.reasons))
        if signed != ("verdict", request.passed, request.score, list(request.reasons)):
            return "the message's verdict is not the signed one"
        return None
    if report.outcome != "error" or (report.error or "") != request.error:
        return "the message's failure report is not the signed one"
    return None
