"""Dispute panel messages (seed 003): verifiers, rounds, attestations, consensus, rulings,
calibration and the fee ledger. See docs/panels.md for the rules behind the numbers.

Values in [0, 1] travel as integers in parts per million (`*_ppm`), shares in basis points,
fees in integer token units: every number is exact.

Two signed structures, EIP-712 (`schemas.eip712`) with the domain of `schemas.verdict` but
their own name:

    EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)
      name = "escrowd-panel", version = "1", verifyingContract = the escrow
    Attestation(uint256 chainId,address escrow,uint256 taskId,uint8 round,uint8 attempt,
                bytes32 evidenceHash,address verifier,uint32 quality,uint32 confidence)
    Ruling(uint256 chainId,address escrow,uint256 taskId,uint8 round,uint16 agentShareBps)

An attestation is signed by the verifier's own key; a ruling by the panel service's key and
checked by the settlement relayer before it sends `resolveDispute` from the arbiter key.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from schemas import eip712
from schemas.eip712 import checksum_address

PANEL_DOMAIN_NAME = "escrowd-panel"
PANEL_DOMAIN_VERSION = "1"
PPM = 1_000_000
BPS = 10_000

ROUND_EVENT_TYPE = "io.escrowd.panel.round.v1"
ATTESTATION_EVENT_TYPE = "io.escrowd.panel.attestation.v1"
CONSENSUS_EVENT_TYPE = "io.escrowd.panel.consensus.v1"
RULING_EVENT_TYPE = "io.escrowd.panel.ruling.v1"
CALIBRATION_EVENT_TYPE = "io.escrowd.panel.calibration.v1"
FEE_EVENT_TYPE = "io.escrowd.panel.fee.v1"

ATTESTATION_TYPE = (
    "Attestation(uint256 chainId,address escrow,uint256 taskId,uint8 round,uint8 attempt,"
    "bytes32 evidenceHash,address verifier,uint32 quality,uint32 confidence)"
)
RULING_TYPE = "Ruling(uint256 chainId,address escrow,uint256 taskId,uint8 round,uint16 agentShareBps)"
ATTESTATION_STRUCT = eip712.Struct.parse(ATTESTATION_TYPE)
RULING_STRUCT = eip712.Struct.parse(RULING_TYPE)

Address = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{40}$")]
Signature = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{130}$")]
Ppm = Annotated[int, Field(ge=0, le=PPM, strict=True)]
Bps = Annotated[int, Field(ge=0, le=BPS, strict=True)]
# Chain and task ids are uint256 on chain; in JSON they are kept to integers every JSON
# reader holds exactly (2^53 - 1): escrow task ids are a counter, chain ids are small.
JSON_SAFE_MAX = 2**53 - 1
ChainId = Annotated[int, Field(gt=0, le=JSON_SAFE_MAX, strict=True)]
TaskId = Annotated[int, Field(ge=1, le=JSON_SAFE_MAX, strict=True)]
RoundNo = Annotated[int, Field(ge=1, le=2, strict=True, description="1 = first panel, 2 = rerun")]
OperatorId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")]
Attempt = Annotated[int, Field(ge=1, le=255, strict=True, description="The attempt judged (uint8 on chain)")]
Hash32 = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{64}$")]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


def _integral(value: Any) -> Any:
    """JSON has one number type: `24.0` is the integer 24 (strings and bools stay refused)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def integral_fields(data: Any, names: tuple[str, ...], lists: tuple[str, ...] = ()) -> Any:
    """`data` with the integral floats of `names` (and of the lists `lists`) made integers.

    The integer fields are strict (no `"24"`, no `true`, no `24.5`); this is the one
    conversion JSON itself implies, so a client that writes `24.0` is not refused.
    """
    if not isinstance(data, dict):
        return data
    fixed = {n: _integral(data[n]) for n in names if isinstance(data.get(n), float)}
    fixed |= {n: [_integral(v) for v in data[n]] for n in lists if isinstance(data.get(n), list)}
    return {**data, **fixed} if fixed else data


class RoundReason(StrEnum):
    """Why a task went to a panel."""

    DISPUTE = "dispute"
    REVIEW_SAMPLE = "review_sample"


class RoundStatus(StrEnum):
    """A round's life: open (attesting) → closed (ruling, rerun or inconclusive)."""

    OPEN = "open"
    CLOSED = "closed"


class RoundOutcome(StrEnum):
    """What a closed round led to (mirrors `panels.rules.Outcome`)."""

    RULING = "ruling"
    RERUN = "rerun"
    INCONCLUSIVE = "inconclusive"
    POOL_TOO_SMALL = "pool_too_small"
    RETRACTED = "retracted"
    SUPERSEDED = "superseded"


class SubjectKind(StrEnum):
    """Whose calibration moved."""

    VERIFIER = "verifier"
    POSTER = "poster"


class ChainListed(BaseModel):
    """A registration naming the chains it serves: `chains` holds JSON integers (no `"1"`, no
    `true`; `1.0` is JSON's integer 1)."""

    @model_validator(mode="before")
    @classmethod
    def _json_integers(cls, data: Any) -> Any:
        return integral_fields(data, (), ("chains",))


class VerifierRegistration(ChainListed):
    """A verifier joining the pool (signed by its own key through the API)."""

    model_config = _FROZEN

    address: Address
    operator: OperatorId
    chains: list[ChainId] = Field(min_length=1, max_length=64)

    @field_validator("address")
    @classmethod
    def _checksum(cls, value: str) -> str:
        return checksum_address(value)


class PanelRound(BaseModel):
    """One round of one task: who was drawn, when attestations are due, how it closed.

    Published on `escrow.panel-rounds.v1` when drawn and again when closed (same key).
    """

    model_config = _FROZEN

    round_id: str = Field(max_length=200, description="<chain>:<escrow>:<task>:<reason>:<round>")
    chain_id: ChainId
    escrow: Address
    task_id: TaskId
    round: RoundNo
    reason: RoundReason
    verifiers: list[Address] = Field(max_length=16, description="Empty when the pool was too small")
    drawn_at: datetime
    deadline: datetime
    status: RoundStatus
    outcome: RoundOutcome | None = None


class Attestation(BaseModel):
    """What a verifier signs: its quality and confidence for one round of one task, bound to
    the attempt it judged and that attempt's on-chain evidence hash (what it was shown)."""

    model_config = _FROZEN

    chain_id: ChainId
    escrow: Address
    task_id: TaskId
    round: RoundNo
    attempt: Attempt
    evidence_hash: Hash32
    verifier: Address
    quality_ppm: Ppm
    confidence_ppm: Ppm

    @model_validator(mode="before")
    @classmethod
    def _json_integers(cls, data: Any) -> Any:
        return integral_fields(data, ("chain_id", "task_id", "round", "attempt", "quality_ppm", "confidence_ppm"))

    @field_validator("escrow", "verifier")
    @classmethod
    def _checksum(cls, value: str) -> str:
        return checksum_address(value)

    @field_validator("evidence_hash")
    @classmethod
    def _lower_hash(cls, value: str) -> str:
        return value.lower()


class SignedAttestation(BaseModel):
    """An attestation and the verifier's EIP-712 signature (65 bytes r || s || v)."""

    model_config = _FROZEN

    attestation: Attestation
    signature: Signature


class ConsensusRecord(BaseModel):
    """A closed round's consensus: published on `escrow.panel-consensus.v1`."""

    model_config = _FROZEN

    round_id: str = Field(max_length=200)
    chain_id: ChainId
    escrow: Address
    task_id: TaskId
    round: RoundNo
    outcome: RoundOutcome
    consensus_ppm: Ppm | None
    spread_ppm: Ppm | None
    weighted: list[Address] = Field(max_length=16)
    timed_out: list[Address] = Field(default_factory=list, max_length=16)
    schema_ok: bool
    schema_violations: list[Annotated[str, StringConstraints(max_length=300)]] = Field(
        default_factory=list, max_length=10
    )
    band: Literal["reject", "revision", "accept"] | None
    agent_share_bps: Bps | None


class Ruling(BaseModel):
    """The split a panel decided, for `resolveDispute(taskId, agentShareBps)`."""

    model_config = _FROZEN

    chain_id: ChainId
    escrow: Address
    task_id: TaskId
    round: RoundNo
    agent_share_bps: Bps

    @field_validator("escrow")
    @classmethod
    def _checksum(cls, value: str) -> str:
        return checksum_address(value)


class SignedRuling(BaseModel):
    """A ruling with the panel service's signature and claimed signer."""

    model_config = _FROZEN

    ruling: Ruling
    signature: Signature
    signer: Address


class CalibrationUpdate(BaseModel):
    """A verifier's or poster's calibration after a round.

    Compacted topic `escrow.panel-calibration.v1`, key `<kind>:<address lower case>`.
    """

    model_config = _FROZEN

    kind: SubjectKind
    subject: Address
    calibration_ppm: Ppm
    previous_ppm: Ppm
    round_id: str = Field(max_length=200)
    rounds: int = Field(ge=0, description="Rounds that moved this calibration so far")


class FeeLedgerEntry(BaseModel):
    """One movement of the off-chain fee ledger; the entries of a round sum to zero."""

    model_config = _FROZEN

    entry_id: str = Field(max_length=260, description="<round id>:<account>")
    round_id: str = Field(max_length=200)
    chain_id: ChainId
    account: Address
    role: Literal["verifier", "poster", "agent"]
    delta_units: int = Field(strict=True, description="Token units; positive earns, negative pays")
    reason: Literal["attestation_fee", "panel_fee"]


# ---------------------------------------------------------------------------- EIP-712


ATTESTATIONS: eip712.Signing[Attestation] = eip712.Signing(
    PANEL_DOMAIN_NAME, PANEL_DOMAIN_VERSION, ATTESTATION_STRUCT, {"quality": "quality_ppm", "confidence": "confidence_ppm"}
)
"""How a verifier's wallet signs an attestation (the members `quality`, `confidence` are its ppm fields)."""
RULINGS: eip712.Signing[Ruling] = eip712.Signing(PANEL_DOMAIN_NAME, PANEL_DOMAIN_VERSION, RULING_STRUCT)
"""How the panel service signs a ruling for the relayer."""
panel_domain = RULINGS.domain
attestation_message, attestation_digest = ATTESTATIONS.message, ATTESTATIONS.digest
ruling_message, ruling_digest = RULINGS.message, RULINGS.digest
attestation_typed_data, ruling_typed_data = ATTESTATIONS.typed_data, RULINGS.typed_data


def sign_attestation(a: Attestation, private_key: bytes | str) -> SignedAttestation:
    """Sign an attestation with the verifier's key; refuses a key that is not the verifier's."""
    if eip712.signer_address(private_key) != a.verifier:
        raise ValueError("the key does not belong to the attestation's verifier")
    return SignedAttestation(attestation=a, signature=eip712.sign(attestation_digest(a), private_key))


def attestation_signer(signed: SignedAttestation) -> str:
    """The address that signed the attestation (compare with `attestation.verifier`)."""
    return eip712.recover(attestation_digest(signed.attestation), signed.signature)


def sign_ruling(r: Ruling, private_key: bytes | str) -> SignedRuling:
    """Sign a ruling with the panel service's key."""
    signature = eip712.sign(ruling_digest(r), private_key)
    return SignedRuling(ruling=r, signature=signature, signer=eip712.signer_address(private_key))


def ruling_signer(signed: SignedRuling) -> str:
    """The address that signed the ruling (the relayer compares it with its trusted keys)."""
    return eip712.recover(ruling_digest(signed.ruling), signed.signature)


def ruling_message_id(r: Ruling) -> str:
    """One ruling per task and round: re-issuing it deduplicates."""
    return f"ruling:{r.chain_id}:{r.escrow.lower()}:{r.task_id}:{r.round}"
