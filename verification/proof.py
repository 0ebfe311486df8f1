"""Seed 002's proof: the whole verification result, signed as EIP-712 typed data, checkable offline.

A proof names one attempt and everything the verifier found:

    {taskId, passed, score, publicTests, hiddenTests, resourceLimits,
     verifierId, verifierVersion, agent, evidenceHash, criteriaHash, attempt}

signed by the verification service's key as typed data whose domain is bound to the chain
and the escrow (`verifyingContract`), so a proof for one escrow never checks for another:

    EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)
      name = "escrowd-proof", version = "1"
    VerificationProof(uint256 taskId,uint8 attempt,address agent,bytes32 evidenceHash,
      bytes32 criteriaHash,bool passed,uint8 score,string publicTests,string hiddenTests,
      string resourceLimits,string verifierId,string verifierVersion)

`criteriaHash` is keccak-256 of the canonical JSON (sorted keys, no spaces) of
`{"verificationCriteria": ..., "verifier": ...}` from the task's registered terms, so anyone
holding the terms can recompute it. `check_proof` is pure: the signature, the signer among
the registered keys, and (when given) the chain, escrow, evidence and criteria hashes.
This typed data is separate from the request-signature domain of the API and from the
settlement `Verdict` (`schemas.verdict`), which it does not replace.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_utils.crypto import keccak
from pydantic import BaseModel, ConfigDict, Field, field_validator

from schemas.verdict import checksum_address

DOMAIN_NAME = "escrowd-proof"
DOMAIN_VERSION = "1"
VERIFIER_VERSION = "escrowd-verification/1+sandbox-bwrap/1"
"""The verifier version signed into every proof: changes when a verdict could change."""

_FIELDS = [
    {"name": "taskId", "type": "uint256"},
    {"name": "attempt", "type": "uint8"},
    {"name": "agent", "type": "address"},
    {"name": "evidenceHash", "type": "bytes32"},
    {"name": "criteriaHash", "type": "bytes32"},
    {"name": "passed", "type": "bool"},
    {"name": "score", "type": "uint8"},
    {"name": "publicTests", "type": "string"},
    {"name": "hiddenTests", "type": "string"},
    {"name": "resourceLimits", "type": "string"},
    {"name": "verifierId", "type": "string"},
    {"name": "verifierVersion", "type": "string"},
]
_BYTES32 = r"^0x[0-9a-f]{64}$"
ZERO_AGENT = "0x0000000000000000000000000000000000000000"


class Proof(BaseModel):
    """The signed fields, with the chain and escrow of the signing domain."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    chain_id: int = Field(gt=0, alias="chainId")
    escrow: str
    task_id: int = Field(ge=1, alias="taskId")
    attempt: int = Field(ge=1, le=255)
    agent: str
    evidence_hash: str = Field(pattern=_BYTES32, alias="evidenceHash")
    criteria_hash: str = Field(pattern=_BYTES32, alias="criteriaHash")
    passed: bool
    score: int = Field(ge=0, le=100)
    public_tests: str = Field(default="", max_length=64, alias="publicTests")
    hidden_tests: str = Field(default="", max_length=64, alias="hiddenTests")
    resource_limits: str = Field(default="", max_length=64, alias="resourceLimits")
    verifier_id: str = Field(max_length=256, alias="verifierId")
    verifier_version: str = Field(max_length=128, alias="verifierVersion")

    @field_validator("escrow", "agent")
    @classmethod
    def _address(cls, value: str) -> str:
        return checksum_address(value)

    @field_validator("evidence_hash", "criteria_hash", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value


class SignedProof(BaseModel):
    """A proof with its signature and the address that claims to have signed it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    proof: Proof
    signature: str = Field(pattern=r"^0x[0-9a-fA-F]{130}$")
    signer: str

    @field_validator("signer")
    @classmethod
    def _signer(cls, value: str) -> str:
        return checksum_address(value)

    def to_json_dict(self) -> dict[str, Any]:
        """JSON with the seed's field names."""
        return self.model_dump(mode="json", by_alias=True)


def criteria_hash(criteria: Mapping[str, Any] | None, verifier: Mapping[str, Any] | None) -> str:
    """keccak-256 of the canonical JSON of the terms' criteria and verifier reference."""
    document = {"verificationCriteria": criteria, "verifier": verifier}
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "0x" + keccak(text=canonical).hex()


def typed_data(proof: Proof) -> dict[str, Any]:
    """The full EIP-712 message (domain bound to the chain and escrow)."""
    return {
        "types": {
            "EIP712Domain": [
                {"name": "name", "type": "string"},
                {"name": "version", "type": "string"},
                {"name": "chainId", "type": "uint256"},
                {"name": "verifyingContract", "type": "address"},
            ],
            "VerificationProof": _FIELDS,
        },
        "primaryType": "VerificationProof",
        "domain": {
            "name": DOMAIN_NAME,
            "version": DOMAIN_VERSION,
            "chainId": proof.chain_id,
            "verifyingContract": proof.escrow,
        },
        "message": {
            "taskId": proof.task_id,
            "attempt": proof.attempt,
            "agent": proof.agent,
            "evidenceHash": proof.evidence_hash,
            "criteriaHash": proof.criteria_hash,
            "passed": proof.passed,
            "score": proof.score,
            "publicTests": proof.public_tests,
            "hiddenTests": proof.hidden_tests,
            "resourceLimits": proof.resource_limits,
            "verifierId": proof.verifier_id,
            "verifierVersion": proof.verifier_version,
        },
    }


def sign_proof(proof: Proof, private_key: str) -> SignedProof:
    """Sign `proof` with the verification service's key."""
    signed = Account.sign_message(encode_typed_data(full_message=typed_data(proof)), private_key)
    signature = "0x" + bytes(signed.signature).hex()
    return SignedProof(
        proof=proof, signature=signature, signer=Account.from_key(private_key).address
    )


def recover_proof_signer(signed: SignedProof) -> str | None:
    """The address that signed the proof's typed data, None when no key recovers."""
    try:
        return str(
            Account.recover_message(
                encode_typed_data(full_message=typed_data(signed.proof)), signature=signed.signature
            )
        )
    except Exception:
        return None


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
    recovered = recover_proof_signer(signed)
    if recovered is None or recovered != signed.signer:
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
