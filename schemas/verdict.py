"""Signed verdicts: what the verification service issues and the settlement relayer sends.

A `Verdict` names exactly one on-chain attempt: (chain, escrow, task, attempt, evidence
hash) plus the outcome (passed, score). The verification service signs those seven fields
as EIP-712 typed data with its own key (seed 002: "a signed result that settlement can
trust"); the relayer recovers the signer and accepts only registered keys. `reasons`,
`verifier_kind`, `mode` and `issued_at` travel with the verdict for people and dashboards
but are not signed: nothing on chain depends on them.

Typed data (domain fixed per chain and escrow):

    EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)
      name = "escrowd-verdict", version = "1", verifyingContract = the escrow
    Verdict(uint256 chainId,address escrow,uint256 taskId,uint8 attempt,
            bytes32 evidenceHash,bool passed,uint8 score)

The struct, the digest, signing and recovery are `schemas.eip712`'s (one encoder, one
canonical signature encoding: v 27/28, low s); the vectors are in
`schemas/vectors/eip712.json`.

On Kafka (`escrow.verdicts.v1`) a verdict is a `SignedVerdict` JSON body with CloudEvents
headers from `verdict_headers`: `ce_id` = `verdict_message_id` (one per attempt, so a
re-issued verdict for the same attempt deduplicates), key = `<chain id>:<task id>`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from schemas import eip712
from schemas.eip712 import InvalidSignature as InvalidSignature
from schemas.eip712 import checksum_address as checksum_address

DOMAIN_NAME = "escrowd-verdict"
DOMAIN_VERSION = "1"
VERDICT_EVENT_TYPE = "io.escrowd.verdict.v1"
MAX_SCORE = 100
UINT256_MAX = 2**256 - 1

VERDICT_STRUCT = eip712.Struct.parse(
    "Verdict(uint256 chainId,address escrow,uint256 taskId,uint8 attempt,"
    "bytes32 evidenceHash,bool passed,uint8 score)"
)



def _lower_hex(pattern: str, what: str) -> AfterValidator:
    """A validator: the value matches `pattern` (else "must be 0x followed by `what`"), lowercased."""
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.match(value):
            raise ValueError(f"must be 0x followed by {what}")
        return value.lower()

    return AfterValidator(check)


Bytes32Hex = Annotated[str, _lower_hex(r"^0x[0-9a-fA-F]{64}$", "64 hex digits")]
SignatureHex = Annotated[str, _lower_hex(r"^0x[0-9a-fA-F]{130}$", "130 hex digits (65 bytes)")]
ChecksumAddress = Annotated[str, AfterValidator(checksum_address)]

Mode = Literal["auto", "manual", "agent"]


class Verdict(BaseModel):
    """The outcome of verifying one attempt of one task."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    chain_id: int = Field(gt=0, le=UINT256_MAX, description="EIP-155 chain id of the escrow")
    escrow: ChecksumAddress = Field(description="Escrow contract address (checksummed)")
    task_id: int = Field(ge=1, le=UINT256_MAX, description="Task id on the escrow")
    attempt: int = Field(ge=1, le=255, description="Attempt judged (1, 2 or 3 on the escrow)")
    evidence_hash: Bytes32Hex = Field(description="The attempt's on-chain evidence hash, 0x + 64 hex")
    passed: bool
    score: int = Field(ge=0, le=MAX_SCORE, description="0–100, as sent on chain")
    reasons: list[str] = Field(default_factory=list, max_length=64, description="Why (unsigned)")
    verifier_kind: str = Field(
        default="auto-check", max_length=128, description="Which verifier judged (unsigned)"
    )
    mode: Mode = Field(default="auto", description="Verification mode of the task (unsigned)")
    issued_at: datetime = Field(description="When the verification service issued it (unsigned)")

    @field_validator("issued_at")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            raise ValueError("must carry a time zone")
        return value.astimezone(UTC)


class SignedVerdict(BaseModel):
    """A verdict with the verification service's EIP-712 signature and claimed signer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    verdict: Verdict
    signature: SignatureHex = Field(description="65 bytes r || s || v (v = 27 or 28), 0x hex")
    signer: ChecksumAddress = Field(description="Address the issuer claims signed it (checked on recovery)")


VERDICTS: eip712.Signing[Verdict] = eip712.Signing(DOMAIN_NAME, DOMAIN_VERSION, VERDICT_STRUCT)
"""How verdicts are signed: the domain of (chain id, escrow), the seven signed fields, the digest."""
verdict_domain, verdict_message = VERDICTS.domain, VERDICTS.message
verdict_digest, verdict_typed_data = VERDICTS.digest, VERDICTS.typed_data


def sign_verdict(verdict: Verdict, private_key: bytes | str) -> SignedVerdict:
    """Sign `verdict` with a 32-byte secp256k1 key (bytes or 0x hex)."""
    signature = eip712.sign(verdict_digest(verdict), private_key)
    # Every field is canonical by construction: skip re-validation on this hot path.
    return SignedVerdict.model_construct(
        verdict=verdict, signature=signature, signer=eip712.signer_address(private_key)
    )


def recover_signer(signed: SignedVerdict) -> str:
    """The address whose key produced `signed.signature` over the verdict's digest.

    InvalidSignature unless the signature is in its one canonical encoding (v 27/28, low s,
    `schemas.eip712.recover`) and recovers a key. Does not compare with `signed.signer`:
    the caller decides what a mismatch means.
    """
    return eip712.recover(verdict_digest(signed.verdict), signed.signature)


def verdict_message_id(verdict: Verdict) -> str:
    """Deterministic message id: one per (chain, escrow, task, attempt)."""
    return f"verdict:{verdict.chain_id}:{verdict.escrow.lower()}:{verdict.task_id}:{verdict.attempt}"


def verdict_key(verdict: Verdict) -> bytes:
    """Kafka key `<chain id>:<task id>`: a task's verdicts share its events' partition."""
    return f"{verdict.chain_id}:{verdict.task_id}".encode()


def verdict_headers(signed: SignedVerdict) -> dict[str, str]:
    """CloudEvents 1.0 binary-mode headers for a signed verdict on `escrow.verdicts.v1`."""
    from schemas.cloudevents import cloudevent_headers

    v = signed.verdict
    return cloudevent_headers(
        id=verdict_message_id(v),
        source=f"escrowd/verification/{v.chain_id}/{v.escrow}",
        type=VERDICT_EVENT_TYPE,
        subject=str(v.task_id),
        time=v.issued_at.isoformat().replace("+00:00", "Z"),
    )


def verdict_payload(signed: SignedVerdict) -> bytes:
    """The JSON body of a signed verdict message."""
    return signed.model_dump_json().encode()
