"""The committed EIP-712 vectors (`schemas/vectors/eip712.json`) other clients implement against.

One vector per signed struct of the project (verdict, proof, panel attestation and ruling,
API request, API service proof): the full typed-data document, the encoded type, the type
hash, the domain separator, the struct hash, the digest and the signature of the published
test key; then the encodings of a valid signature that every checker must refuse (the
bare recovery id as `v`, the high-s twin, zero or out-of-range `r` and `s`). `escrowd
schemas export` writes the file; a test fails when it is stale, and another checks every
vector against eth_account.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from schemas import eip712, panels, proof, request_auth, verdict

VECTORS_FILE = Path(__file__).parent / "vectors" / "eip712.json"
TEST_KEY = "0x" + "11" * 32
"""A published test key (never use it for anything else)."""
ESCROW = "0x5FbDB2315678afecb367f032d93F642f64180aa3"


def _vector(name: str, domain: eip712.Domain, struct: eip712.Struct, message: dict[str, Any]) -> dict[str, Any]:
    digest = eip712.digest(domain, struct, message)
    return {
        "name": name,
        "typedData": eip712.typed_data(domain, struct, message),
        "encodeType": struct.encode_type,
        "typeHash": "0x" + struct.typehash.hex(),
        "domainSeparator": "0x" + domain.separator.hex(),
        "structHash": "0x" + struct.hash(message).hex(),
        "digest": "0x" + digest.hex(),
        "signature": eip712.sign(digest, TEST_KEY),
    }


def _refused(digest: bytes) -> list[dict[str, str]]:
    """Other encodings of one valid signature, and malformed ones: every one must be refused."""
    raw = bytes.fromhex(eip712.sign(digest, TEST_KEY)[2:])
    r, s, v = raw[:32], int.from_bytes(raw[32:64], "big"), raw[64]
    n = eip712.SECP256K1_N

    def hex_of(data: bytes) -> str:
        return "0x" + data.hex()

    return [
        {"case": "v as the bare recovery id (0/1)", "signature": hex_of(raw[:64] + bytes([v - 27]))},
        {"case": "high-s twin (s' = n - s, v flipped)", "signature": hex_of(r + (n - s).to_bytes(32, "big") + bytes([55 - v]))},
        {"case": "v = 29", "signature": hex_of(raw[:64] + bytes([29]))},
        {"case": "r = 0", "signature": hex_of(bytes(32) + raw[32:])},
        {"case": "s = 0", "signature": hex_of(r + bytes(32) + bytes([v]))},
        {"case": "r = n", "signature": hex_of(n.to_bytes(32, "big") + raw[32:])},
        {"case": "64 bytes (no v)", "signature": hex_of(raw[:64])},
    ]


def vectors() -> dict[str, Any]:
    """The whole vector document."""
    issued = datetime(2026, 1, 1, tzinfo=UTC)
    v = verdict.Verdict(
        chain_id=31337, escrow=ESCROW, task_id=2**200 + 7, attempt=3, evidence_hash="0x" + "ab" * 32,
        passed=False, score=41, issued_at=issued,
    )  # fmt: skip
    p = proof.Proof(
        chain_id=8453, escrow=ESCROW, task_id=12, attempt=1, agent="0x" + "a1" * 20,
        evidence_hash="0x" + "0e" * 32, criteria_hash="0x" + "c0" * 32, passed=True, score=100,
        public_tests="12/12", hidden_tests="", resource_limits="ok: 300 ms, 64 MiB",
        verifier_id="test_suite:tests/ü", verifier_version="escrowd-verification/1+sandbox-bwrap/1",
    )  # fmt: skip
    a = panels.Attestation(
        chain_id=10, escrow=ESCROW, task_id=9, round=2, attempt=2, evidence_hash="0x" + "5e" * 32,
        verifier=eip712.signer_address(TEST_KEY),
        quality_ppm=812_345, confidence_ppm=1_000_000,
    )  # fmt: skip
    ruling = panels.Ruling(chain_id=1, escrow=ESCROW, task_id=9, round=1, agent_share_bps=6_667)
    # Each vector on another chain, so none passes with a chain id written in as a constant.
    deployment = request_auth.Deployment(137, ESCROW)
    body = b'{"attempt":1,"evidenceHash":"0x' + b"ab" * 32 + b'","passed":true}'
    request = request_auth.request_message(
        "post", f"/v1/tasks/137/{ESCROW}/7/review?x=1", body, eip712.signer_address(TEST_KEY),
        "nonce_-0001", 1_767_225_600,
    )  # fmt: skip
    service = {"requestId": f"review:10:{ESCROW.lower()}:7:1:0x" + "ab" * 32, "payloadHash": b"\xcd" * 32}
    items = [
        _vector("Verdict", verdict.verdict_domain(v.chain_id, v.escrow), verdict.VERDICT_STRUCT, verdict.verdict_message(v)),
        _vector("VerificationProof", proof.proof_domain(p.chain_id, p.escrow), proof.PROOF_STRUCT, proof.proof_message(p)),
        _vector("Attestation", panels.panel_domain(a.chain_id, a.escrow), panels.ATTESTATION_STRUCT, panels.attestation_message(a)),
        _vector("Ruling", panels.panel_domain(ruling.chain_id, ruling.escrow), panels.RULING_STRUCT, panels.ruling_message(ruling)),
        _vector("Request", request_auth.request_domain(deployment), request_auth.REQUEST_STRUCT, request),
        _vector("ServiceRequest", request_auth.service_domain(request_auth.Deployment(10, ESCROW)), request_auth.SERVICE_STRUCT, service),
    ]
    first = bytes.fromhex(items[0]["digest"][2:])
    return {
        "description": (
            "EIP-712 vectors of every escrowd signature. digest = keccak256(0x1901 || domainSeparator ||"
            " structHash); signature = r || s || v, 65 bytes, v in {27, 28}, 0 < r < n, 0 < s <= n/2"
            " (one accepted encoding). Signatures are RFC 6979 deterministic under testKey."
        ),
        "testKey": TEST_KEY,
        "signer": eip712.signer_address(TEST_KEY),
        "vectors": items,
        "refused": {"digest": "0x" + first.hex(), "signatures": _refused(first)},
    }


def render() -> str:
    """The file's text, stable across runs."""
    return json.dumps(vectors(), indent=2, ensure_ascii=False) + "\n"


def export() -> Path:
    """Write the vector file; return its path."""
    VECTORS_FILE.parent.mkdir(parents=True, exist_ok=True)
    VECTORS_FILE.write_text(render(), encoding="utf-8")
    return VECTORS_FILE
