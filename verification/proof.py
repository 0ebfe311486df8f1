"""Checking seed 002's proof: against the registered keys, the chain, the escrow, the attempt's
evidence and the task's terms.

The proof's messages and signature (`Proof`, `SignedProof`, the `VerificationProof` typed
data under the `escrowd-proof` domain) are `schemas.proof`, re-exported here. What this
module adds is what a proof is measured against:

`criteriaHash` is keccak-256 of the canonical JSON (sorted keys, no spaces) of
`{"verificationCriteria": ..., "verifier": ...}` from the task's registered terms, so anyone
holding the terms can recompute it. `check_proof` is pure: the signature (in its one
canonical encoding), the signer among the registered keys, and (when given) the chain,
escrow, evidence and criteria hashes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from eth_utils.crypto import keccak

from schemas import eip712
from schemas.eip712 import checksum_address
from schemas.proof import (
    DOMAIN_NAME,
    DOMAIN_VERSION,
    ZERO_AGENT,
    Proof,
    SignedProof,
    proof_digest,
    recover_proof_signer,
    sign_proof,
    typed_data,
)

__all__ = [
    "DOMAIN_NAME",
    "DOMAIN_VERSION",
    "VERIFIER_VERSION",
    "ZERO_AGENT",
    "Proof",
    "SignedProof",
    "check_proof",
    "criteria_hash",
    "proof_digest",
    "proof_fields",
    "recover_proof_signer",
    "sign_proof",
    "typed_data",
]

VERIFIER_VERSION = "escrowd-verification/1+sandbox-bwrap/1"
"""The verifier version signed into every proof: changes when a verdict could change."""


def criteria_hash(criteria: Mapping[str, Any] | None, verifier: Mapping[str, Any] | None) -> str:
    """keccak-256 of the canonical JSON of the terms' criteria and verifier reference."""
    document = {"verificationCriteria": criteria, "verifier": verifier}
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "0x" + keccak(text=canonical).hex()


def check_proof(
    signed: SignedProof,
    registered: Iterable[str],
    *,
    chain_id: int | None = None,
    escrow: str | None = None,
    evidence_hash: str | None = None,
    criteria: str | None = None,
) -> list[str]:
    """Every reason the proof does not hold (empty when it does)."""
    problems: list[str] = []
    recovered: str | None
    try:
        recovered = eip712.recover(proof_digest(signed.proof), signed.signature)
    except eip712.InvalidSignature as exc:
        recovered = None
        problems.append(f"the signature is not usable: {exc}")
    if recovered is not None and recovered != signed.signer:
        problems.append("the signature does not match the proof and its claimed signer")
    keys = {checksum_address(k) for k in registered}
    if recovered is None or recovered not in keys:
        problems.append("the signer is not a registered verification key")
    p = signed.proof
    if chain_id is not None and p.chain_id != chain_id:
        problems.append(f"the proof is for chain {p.chain_id}, not {chain_id}")
    if escrow is not None and p.escrow != checksum_address(escrow):
        problems.append(f"the proof is for escrow {p.escrow}, not {checksum_address(escrow)}")
    if evidence_hash is not None and p.evidence_hash != evidence_hash.lower():
        problems.append("the evidence hash differs from the attempt's evidence on chain")
    if criteria is not None and p.criteria_hash != criteria.lower():
        problems.append("the criteria hash differs from the task's registered terms")
    return problems


def proof_fields(detail: Mapping[str, Any]) -> dict[str, str]:
    """The counts a verifier found (seed 002's `publicTests`, `hiddenTests`, `resourceLimits`)."""
    fields = {}
    for name in ("publicTests", "hiddenTests", "resourceLimits"):
        value = detail.get(name)
        if isinstance(value, str):
            fields[name] = value[:64]
    return fields
