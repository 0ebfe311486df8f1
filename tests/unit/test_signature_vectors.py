"""Fixed EIP-712 test vectors: every signed message's digest is pinned three ways.

For each message type: the project's function, `eth_account`'s own typed-data encoding of a
typed-data document written out here in full (domain included: a changed name, version,
chain id or contract changes the digest), and a committed hex vector must all agree. Every
digest goes through `schemas.eip712`, so this is what catches a change of a domain or a type
string. Signatures are deterministic (RFC 6979), so they are pinned too.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from eth_account import Account
from eth_account.messages import _hash_eip191_message, encode_typed_data
from eth_utils.crypto import keccak

from schemas.eip712 import InvalidSignature, recover
from schemas.request_auth import (
    Deployment,
    UnsignedRequest,
    request_digest,
    service_digest,
    sign_request,
)
from schemas.task_terms import ReviewSubmitted
from schemas.verdict import Verdict, recover_signer, sign_verdict, verdict_digest
from verification.request_auth import RequestNotTrusted, authenticate

KEY = "0x" + "11" * 32
SIGNER = "0x19E7E376E7C213B7E7e7e46cc70A5dD086DAff2A"
ESCROW = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
DOMAIN_FIELDS = [
    {"name": "name", "type": "string"},
    {"name": "version", "type": "string"},
    {"name": "chainId", "type": "uint256"},
    {"name": "verifyingContract", "type": "address"},
]

REQUEST_DIGEST = "84f14c74e53e90ac806efb4b8fcfd94e1f4c510e7958cb164746b2a489efe3d3"
REQUEST_SIGNATURE = (
    "0x6d4110d00ad9aaac2ccbef8be0c773328143e55c2f0599baec9834b42021dc4a"
    "53a18c99b917facd1b90e1929395d05f90fd196c902557ad38a4fa7cb360845f1b"
)
SERVICE_DIGEST = "d78c2f0d4a5f499f647451d4549db35362e7757359af5584f354b85aa57410c9"
SERVICE_DIGEST_CHAIN_10 = "06a7fa371359c744c45fec05577bd84bd617570228e488fe95b8b0fbe0a57889"
VERDICT_DIGEST = "da3b4e3ae3dab291883758b80b4913f9a8abbec1cca3a0fc82362279576a2faa"
VERDICT_SIGNATURE = (
    "0x7beba4ab321c71c92da146bbeedf5b0b48cb26c3b404527828e29192ea26e708"
    "1f93c84b6a4ef3c5cf4114804c6ae3079d890a5bc4859f424e98272548e23f741c"
)
REVIEW_ID = f"review:31337:{ESCROW.lower()}:7:1:0x" + "ab" * 32


def eth_account_digest(document: dict[str, Any]) -> str:
    return bytes(_hash_eip191_message(encode_typed_data(full_message=document))).hex()


def typed(primary: str, members: str, domain: tuple[str, str, int, str], message: dict[str, Any]) -> dict[str, Any]:
    """A typed-data document written out from `primary(type name,...)`, by hand (never through
    `schemas.eip712`, which it checks)."""
    name, version, chain_id, contract = domain
    return {
        "types": {
            "EIP712Domain": DOMAIN_FIELDS,
            primary: [{"name": m.split(" ")[1], "type": m.split(" ")[0]} for m in members.split(",")],
        },
        "primaryType": primary,
        "domain": {"name": name, "version": version, "chainId": chain_id, "verifyingContract": contract},
        "message": message,
    }


def test_request_digest_and_signature_vector() -> None:
    """Request(...) under the escrowd-api v2 domain of chain 31337's escrow."""
    document = typed(
        "Request", "string method,string path,bytes32 bodyHash,address signer,string nonce,uint64 expiresAt",
        ("escrowd-api", "2", 31337, ESCROW),
        {"method": "POST", "path": "/v1/terms", "bodyHash": bytes(keccak(b'{"chainId":31337}')), "signer": SIGNER,
         "nonce": "nonce-0001", "expiresAt": 1767225600},
    )  # fmt: skip
    assert Account.from_key(KEY).address == SIGNER
    ours = request_digest(Deployment(31337, ESCROW), "POST", "/v1/terms", b'{"chainId":31337}', SIGNER, "nonce-0001", 1767225600)
    assert ours.hex() == eth_account_digest(document) == REQUEST_DIGEST
    headers = sign_request(KEY, UnsignedRequest("POST", "/v1/terms", b'{"chainId":31337}', deployment=Deployment(31337, ESCROW),
                           expires_at=1767225600, nonce="nonce-0001"))  # fmt: skip
    assert headers["X-Escrowd-Signature"] == REQUEST_SIGNATURE
    assert recover(ours, REQUEST_SIGNATURE) == SIGNER
    # Another chain or escrow is another domain: another digest.
    assert request_digest(Deployment(1, ESCROW), "POST", "/v1/terms", b'{"chainId":31337}', SIGNER, "nonce-0001", 1767225600) != ours
    other = Deployment(31337, "0x" + "22" * 20)
    assert request_digest(other, "POST", "/v1/terms", b'{"chainId":31337}', SIGNER, "nonce-0001", 1767225600) != ours


def test_service_digest_vector() -> None:
    """ServiceRequest(requestId, payloadHash) under the escrowd-api-service v1 domain."""
    document = typed(
        "ServiceRequest", "string requestId,bytes32 payloadHash", ("escrowd-api-service", "1", 31337, ESCROW),
        {"requestId": REVIEW_ID, "payloadHash": b"\xcd" * 32},
    )
    assert service_digest(Deployment(31337, ESCROW), REVIEW_ID, b"\xcd" * 32).hex() == eth_account_digest(document) == SERVICE_DIGEST
    # The chain id is the deployment's, not a constant: chain 10's digest is its own vector.
    document["domain"]["chainId"] = 10
    assert service_digest(Deployment(10, ESCROW), REVIEW_ID, b"\xcd" * 32).hex() == eth_account_digest(document) == SERVICE_DIGEST_CHAIN_10


def verdict() -> Verdict:
    return Verdict(chain_id=31337, escrow=ESCROW, task_id=7, attempt=1, evidence_hash="0x" + "ab" * 32,
                   passed=True, score=88, issued_at=datetime(2026, 1, 1, tzinfo=UTC))  # fmt: skip


def test_verdict_digest_vector() -> None:
    """The verdict digest equals eth_account's encoding of the full typed data and the vector."""
    document = typed(
        "Verdict", "uint256 chainId,address escrow,uint256 taskId,uint8 attempt,bytes32 evidenceHash,bool passed,uint8 score",
        ("escrowd-verdict", "1", 31337, ESCROW),
        {"chainId": 31337, "escrow": ESCROW, "taskId": 7, "attempt": 1, "evidenceHash": "0x" + "ab" * 32,
         "passed": True, "score": 88},
    )  # fmt: skip
    assert verdict_digest(verdict()).hex() == eth_account_digest(document) == VERDICT_DIGEST
    signed = sign_verdict(verdict(), KEY)
    assert signed.signature == VERDICT_SIGNATURE and recover_signer(signed) == SIGNER


def high_s_twin(signature: str) -> str:
    """The other valid encoding of a signature: s' = n - s with the recovery bit flipped (v 27 <-> 28)."""
    raw = bytes.fromhex(signature[2:])
    s = int.from_bytes(raw[32:64], "big")
    return "0x" + (raw[:32] + (N - s).to_bytes(32, "big") + bytes([55 - raw[64]])).hex()


def test_the_high_s_twin_of_a_request_signature_is_refused_by_the_high_s_rule() -> None:
    """The twin is a real signature of the same key (eth_account recovers it) that only the low-s rule refuses."""
    digest = bytes.fromhex(REQUEST_DIGEST)
    twin = high_s_twin(REQUEST_SIGNATURE)
    assert Account._recover_hash(digest, signature=bytes.fromhex(twin[2:])) == SIGNER
    with pytest.raises(InvalidSignature, match="not canonical"):
        recover(digest, twin)


def test_a_relayed_request_needs_a_proof() -> None:
    """Unit view of the consumer's rule: no proof, no trust (the integration test covers Kafka)."""
    message = ReviewSubmitted(
        request_id=REVIEW_ID, chain_id=31337, escrow_address=ESCROW, task_id=7, attempt=1,
        evidence_hash="0x" + "ab" * 32, actor=SIGNER, requested_at=0, passed=True,
    )  # fmt: skip
    with pytest.raises(RequestNotTrusted, match="unsigned request"):
        authenticate(message, frozenset())
