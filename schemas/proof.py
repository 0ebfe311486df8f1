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

The message models and the signature live here with the other signed structs (one encoder,
`schemas.eip712`); what a proof is checked against (the registered keys, the chain, the
criteria hash of the terms) is `verification.proof`. This typed data is separate from the
request-signature domain of the API and from the settlement `Verdict` (`schemas.verdict`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from schemas import eip712
from schemas.eip712 import checksum_address

DOMAIN_NAME = "escrowd-proof"
DOMAIN_VERSION = "1"
PROOF_STRUCT = eip712.Struct.parse(
    "VerificationProof(uint256 taskId,uint8 attempt,address agent,bytes32 evidenceHash,"
    "bytes32 criteriaHash,bool passed,uint8 score,string publicTests,string hiddenTests,"
    "string resourceLimits,string verifierId,string verifierVersion)"
)
_BYTES32 = r"^0x[0-9a-f]{64}$"
UINT256_MAX = 2**256 - 1
ZERO_AGENT = "0x0000000000000000000000000000000000000000"


class Proof(BaseModel):
    """The signed fields, with the chain and escrow of the signing domain."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    chain_id: int = Field(gt=0, le=UINT256_MAX, alias="chainId")
    escrow: str
    task_id: int = Field(ge=1, le=UINT256_MAX, alias="taskId")
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
    signature: str = Field(pattern=r"^0x[0-9a-fA-F]{130}$", description="65 bytes r || s || v (v 27/28, low s)")
    signer: str

    @field_validator("signer")
    @classmethod
    def _signer(cls, value: str) -> str:
        return checksum_address(value)

    def to_json_dict(self) -> dict[str, Any]:
        """JSON with the seed's field names."""
        return self.model_dump(mode="json", by_alias=True)


PROOFS: eip712.Signing[Proof] = eip712.Signing(DOMAIN_NAME, DOMAIN_VERSION, PROOF_STRUCT)
"""How proofs are signed: the domain of (chain id, escrow), the signed fields, the digest."""
proof_domain, proof_message, proof_digest, typed_data = PROOFS.domain, PROOFS.message, PROOFS.digest, PROOFS.typed_data


def sign_proof(proof: Proof, private_key: str) -> SignedProof:
    """Sign `proof` with the verification service's key."""
    signature = eip712.sign(proof_digest(proof), private_key)
    return SignedProof(proof=proof, signature=signature, signer=eip712.signer_address(private_key))


def recover_proof_signer(signed: SignedProof) -> str | None:
    """The address that signed the proof's typed data; None unless the signature is canonical
    (v 27/28, low s) and recovers a key."""
    try:
        return eip712.recover(proof_digest(signed.proof), signed.signature)
    except eip712.InvalidSignature:
        return None
