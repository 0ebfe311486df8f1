"""Panel messages: EIP-712 digests agree with eth-account, signatures bind chain and escrow."""

from __future__ import annotations

import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data
from pydantic import ValidationError

from schemas import eip712, panels
from schemas.verdict import InvalidSignature

KEY = "0x" + "11" * 32
OTHER_KEY = "0x" + "22" * 32
VERIFIER = Account.from_key(KEY).address
ESCROW = "0x" + "e3" * 20


def _attestation(**changes: object) -> panels.Attestation:
    fields: dict[str, object] = {
        "chain_id": 31337, "escrow": ESCROW, "task_id": 7, "round": 1, "attempt": 2,
        "evidence_hash": "0x" + "ab" * 32, "verifier": VERIFIER,
        "quality_ppm": 812_345, "confidence_ppm": 900_000,
    }
    fields.update(changes)
    return panels.Attestation.model_validate(fields)


def test_digests_match_the_generic_typed_data_encoder() -> None:
    a = _attestation()
    assert panels.attestation_digest(a) == _hash(panels.attestation_typed_data(a))
    r = panels.Ruling(chain_id=31337, escrow=ESCROW, task_id=7, round=2, agent_share_bps=6_543)
    assert panels.ruling_digest(r) == _hash(panels.ruling_typed_data(r))


def test_attestation_digest_pinned_vector() -> None:
    """The attestation's type string and one digest as literals (also checked against
    eth_account above): a client implementing the struct can test against them."""
    assert panels.ATTESTATION_TYPE == (
        "Attestation(uint256 chainId,address escrow,uint256 taskId,uint8 round,uint8 attempt,"
        "bytes32 evidenceHash,address verifier,uint32 quality,uint32 confidence)")
    assert panels.attestation_digest(_attestation()).hex() == (
        "11594954de2ffd05f8cb608baa8a7a303574e31dd1efd40908437e1a1766721f")


def _hash(typed: dict[str, object]) -> bytes:
    from eth_utils.crypto import keccak

    signable = encode_typed_data(full_message=typed)
    return bytes(keccak(b"\x19" + signable.version + signable.header + signable.body))


def test_signature_recovers_the_verifier_and_a_wallet_signature_verifies() -> None:
    a = _attestation()
    signed = panels.sign_attestation(a, KEY)
    assert panels.attestation_signer(signed) == VERIFIER
    wallet = Account.sign_message(encode_typed_data(full_message=panels.attestation_typed_data(a)), KEY)
    assert eip712.recover(panels.attestation_digest(a), "0x" + bytes(wallet.signature).hex()) == VERIFIER
    with pytest.raises(ValueError, match="verifier"):
        panels.sign_attestation(a, OTHER_KEY)


@pytest.mark.parametrize("change", [{"chain_id": 1}, {"escrow": "0x" + "e4" * 20}, {"round": 2},
                                    {"quality_ppm": 812_346}, {"task_id": 8}, {"attempt": 1},
                                    {"evidence_hash": "0x" + "ac" * 32}])
def test_a_signature_does_not_carry_over_to_another_chain_escrow_round_attempt_evidence_or_score(change: dict[str, object]) -> None:
    signed = panels.sign_attestation(_attestation(), KEY)
    moved = panels.SignedAttestation(attestation=_attestation(**change), signature=signed.signature)
    assert panels.attestation_signer(moved) != VERIFIER


def test_ruling_sign_and_recover() -> None:
    r = panels.Ruling(chain_id=31337, escrow=ESCROW, task_id=7, round=1, agent_share_bps=10_000)
    signed = panels.sign_ruling(r, KEY)
    assert signed.signer == VERIFIER == panels.ruling_signer(signed)
    assert panels.ruling_message_id(r) == f"ruling:31337:{ESCROW}:7:1"


def test_hostile_values_are_refused() -> None:
    for change in ({"quality_ppm": 1_000_001}, {"confidence_ppm": -1}, {"round": 3}, {"attempt": 0},
                   {"attempt": 256}, {"evidence_hash": "0x" + "ab" * 31}, {"evidence_hash": None},
                   {"quality_ppm": 0.5}, {"quality_ppm": True}, {"extra": 1}):
        with pytest.raises(ValidationError):
            _attestation(**change)
    high_s = "0x" + "01" * 32 + "ff" * 32 + "1b"
    with pytest.raises(InvalidSignature):
        eip712.recover(b"\x00" * 32, high_s)
