"""The consumer's trust rule, pure: a relayed request verifies only as it was signed."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from eth_account import Account
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.request_auth import Deployment, UnsignedRequest, requester_proof, sign_request
from schemas.task_terms import ReviewSubmitted, VerifierFailed, VerifierVerdictReported
from verification.request_auth import (
    RequestNotTrusted,
    authenticate,
    request_id_for,
    service_proof,
)

ESCROW = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
POSTER_KEY = "0x" + "21" * 32
POSTER = Account.from_key(POSTER_KEY).address
SERVICE_KEY = "0x" + "5e" * 32
SERVICE = Account.from_key(SERVICE_KEY).address
EVIDENCE = "0x" + "ab" * 32
PATH = f"/v1/tasks/31337/{ESCROW}/7/review"


def signed_review(body: dict[str, Any] | None = None, *, path: str = PATH, deployment: Deployment | None = None) -> ReviewSubmitted:
    body = body or {"attempt": 1, "evidenceHash": EVIDENCE, "passed": False, "reasons": ["missing table"]}
    raw = json.dumps(body).encode()
    headers = sign_request(POSTER_KEY, UnsignedRequest("POST", path, raw, deployment=deployment or Deployment(31337, ESCROW), expires_at=2_000_000_000))
    proof = requester_proof("POST", path, raw, POSTER, headers["X-Escrowd-Nonce"], 2_000_000_000, headers["X-Escrowd-Signature"])
    return ReviewSubmitted(
        request_id=request_id_for("review", 31337, ESCROW, 7, 1, EVIDENCE), chain_id=31337, escrow_address=ESCROW,
        task_id=7, attempt=1, evidence_hash=EVIDENCE, actor=POSTER, requested_at=1, passed=False,
        reasons=["missing table"], requester=proof,
    )  # fmt: skip


TAMPERINGS: dict[str, Any] = {
    "passed": True,
    "reasons": ["something else"],
    "attempt": 2,
    "evidence_hash": "0x" + "cd" * 32,
    "actor": "0x" + "12" * 20,
    "task_id": 8,
    "chain_id": 1,
    "escrow_address": "0x" + "34" * 20,
    "request_id": "review:other",
}


def test_the_relayed_review_verifies() -> None:
    assert authenticate(signed_review(), frozenset()) == "requester"


@given(field=st.sampled_from(sorted(TAMPERINGS)))
@settings(max_examples=30, deadline=None)
def test_changing_any_field_of_a_relayed_review_is_refused(field: str) -> None:
    """Every field the consumer acts on is covered by the requester's signature."""
    tampered = signed_review().model_copy(update={field: TAMPERINGS[field]})
    with pytest.raises(RequestNotTrusted):
        authenticate(tampered, frozenset())


def test_a_proof_for_another_route_or_deployment_is_refused() -> None:
    other_route = signed_review(path=f"/v1/tasks/31337/{ESCROW}/7/finalize")
    with pytest.raises(RequestNotTrusted, match="is a finalize, not a review"):
        authenticate(other_route, frozenset())
    with pytest.raises(RequestNotTrusted, match="not the signer's"):
        authenticate(signed_review(deployment=Deployment(1, ESCROW)), frozenset())


def test_service_proofs_need_a_trusted_key_and_cover_the_whole_message() -> None:
    bare = signed_review().model_copy(update={"requester": None})
    vouched = bare.model_copy(update={"service": service_proof(bare, SERVICE_KEY)})
    assert authenticate(vouched, frozenset({SERVICE})) == "service"
    with pytest.raises(RequestNotTrusted, match="not a trusted API service key"):
        authenticate(vouched, frozenset())
    with pytest.raises(RequestNotTrusted, match="not the service key's"):
        authenticate(vouched.model_copy(update={"passed": True}), frozenset({SERVICE}))


def test_verifier_reports_are_bound_to_their_outcome() -> None:
    """A signed error report cannot be turned into a verdict, and the error id carries the nonce."""
    path = f"/v1/tasks/31337/{ESCROW}/7/verifier-report"
    body = {"attempt": 1, "evidenceHash": EVIDENCE, "outcome": "error", "error": "model down"}
    raw = json.dumps(body).encode()
    headers = sign_request(POSTER_KEY, UnsignedRequest("POST", path, raw, deployment=Deployment(31337, ESCROW), expires_at=2_000_000_000, nonce="n-00000001"))
    proof = requester_proof("POST", path, raw, POSTER, "n-00000001", 2_000_000_000, headers["X-Escrowd-Signature"])
    common: dict[str, Any] = {
        "chain_id": 31337, "escrow_address": ESCROW, "task_id": 7, "attempt": 1, "evidence_hash": EVIDENCE,
        "actor": POSTER, "requested_at": 1, "requester": proof,
    }  # fmt: skip
    failed = VerifierFailed(request_id=request_id_for("verifier_error", 31337, ESCROW, 7, 1, EVIDENCE, "n-00000001"), error="model down", **common)
    assert authenticate(failed, frozenset()) == "requester"
    verdict = VerifierVerdictReported(
        request_id=request_id_for("verifier_verdict", 31337, ESCROW, 7, 1, EVIDENCE), passed=True, score=90, **common
    )
    with pytest.raises(RequestNotTrusted, match="verdict is not the signed one"):
        authenticate(verdict, frozenset())


def test_the_relayed_expiry_is_signed() -> None:
    """`RequesterProof.digest` covers `expires_at`: a relay that moves the expiry breaks the signature."""
    honest = signed_review()
    assert honest.requester is not None
    for expires_at in (honest.requester.expires_at + 1, honest.requester.expires_at - 1, 0, 2**64 - 1):
        moved = honest.model_copy(update={"requester": honest.requester.model_copy(update={"expires_at": expires_at})})
        with pytest.raises(RequestNotTrusted, match="not the signer's over this request"):
            authenticate(moved, frozenset())


@pytest.mark.parametrize("field", ["nonce", "body", "signature"])
def test_every_other_field_of_the_relayed_proof_is_signed(field: str) -> None:
    honest = signed_review()
    assert honest.requester is not None
    raw = honest.requester.raw_body()
    changed = {
        "nonce": "another-nonce",
        "body": base64.b64encode(raw.replace(b'"passed": false', b'"passed":false')).decode(),
        "signature": honest.requester.signature[:-2] + ("1c" if honest.requester.signature.endswith("1b") else "1b"),
    }[field]
    tampered = honest.model_copy(update={"requester": honest.requester.model_copy(update={field: changed})})
    with pytest.raises(RequestNotTrusted):
        authenticate(tampered, frozenset())


def test_the_bare_v_form_of_a_relayed_signature_is_refused() -> None:
    honest = signed_review()
    assert honest.requester is not None
    raw = bytes.fromhex(honest.requester.signature[2:])
    bare = "0x" + (raw[:64] + bytes([raw[64] - 27])).hex()
    with pytest.raises(RequestNotTrusted, match="v must be 27 or 28"):
        authenticate(honest.model_copy(update={"requester": honest.requester.model_copy(update={"signature": bare})}), frozenset())


def test_a_service_proof_is_bound_to_its_chain() -> None:
    """The service key's signature over this very message, but under another chain's domain, is refused."""
    from schemas.eip712 import sign
    from schemas.request_auth import ServiceProof, service_digest
    from verification.request_auth import payload_hash

    bare = signed_review().model_copy(update={"requester": None})
    for chain_id in (1, 31338):
        digest = service_digest(Deployment(chain_id, ESCROW), bare.request_id, payload_hash(bare))
        elsewhere = bare.model_copy(update={"service": ServiceProof(signer=SERVICE, signature=sign(digest, SERVICE_KEY))})
        with pytest.raises(RequestNotTrusted, match="not the service key's over this message"):
            authenticate(elsewhere, frozenset({SERVICE}))
    assert authenticate(bare.model_copy(update={"service": service_proof(bare, SERVICE_KEY)}), frozenset({SERVICE})) == "service"
