"""Seed 002's signed proof: every field is signed, the domain binds chain and escrow, `escrowd verify proof` checks it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account

from verification.proof import (
    VERIFIER_VERSION,
    Proof,
    SignedProof,
    check_proof,
    criteria_hash,
    sign_proof,
)

KEY = "0x" + "11" * 32
OTHER_KEY = "0x" + "22" * 32
SIGNER = Account.from_key(KEY).address
ESCROW = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
TERMS = {
    "verificationCriteria": {"type": "json"},
    "verifier": {"kind": "test_suite", "ref": "TEST_SUITE://V1", "config": {}},
}


def proof(**changes: Any) -> Proof:
    fields: dict[str, Any] = {
        "chain_id": 31337, "escrow": ESCROW, "task_id": 7, "attempt": 1,
        "agent": "0x82f3a1c9d04b7e5a68c21b9d30a7f4e5c8d6291a", "evidence_hash": "0x" + "ab" * 32,
        "criteria_hash": criteria_hash(TERMS["verificationCriteria"], TERMS["verifier"]),
        "passed": True, "score": 100, "public_tests": "12/12", "hidden_tests": "31/31", "resource_limits": "PASS",
        "verifier_id": "test_suite:TEST_SUITE://V1", "verifier_version": VERIFIER_VERSION,
    }  # fmt: skip
    fields.update(changes)
    return Proof(**fields)


TAMPERS = {
    "task_id": 8, "attempt": 2, "agent": "0x" + "cd" * 20, "evidence_hash": "0x" + "ef" * 32,
    "criteria_hash": "0x" + "00" * 32, "passed": False, "score": 99, "public_tests": "11/12",
    "hidden_tests": "30/31", "resource_limits": "FAIL", "verifier_id": "exact_match:x", "verifier_version": "0",
    "chain_id": 1, "escrow": "0x" + "ee" * 20,
}  # fmt: skip


def test_a_proof_checks_with_its_registered_signer() -> None:
    """The signed proof holds for the registered key, its chain, escrow, evidence and terms."""
    signed = sign_proof(proof(), KEY)
    assert check_proof(
        signed, [SIGNER], chain_id=31337, escrow=ESCROW, evidence_hash="0x" + "AB" * 32,
        criteria=criteria_hash(TERMS["verificationCriteria"], TERMS["verifier"]),
    ) == []  # fmt: skip


@pytest.mark.parametrize("field", sorted(TAMPERS))
def test_every_field_is_signed(field: str) -> None:
    """Changing any one field after signing breaks the signature."""
    signed = sign_proof(proof(), KEY)
    tampered = SignedProof(
        proof=proof(**{field: TAMPERS[field]}), signature=signed.signature, signer=signed.signer
    )
    assert "the signature does not match the proof and its claimed signer" in check_proof(
        tampered, [SIGNER]
    )


def test_unregistered_key_and_other_escrow_are_refused() -> None:
    """A valid signature by a key not registered, or a proof for another escrow or chain, is refused."""
    rogue = sign_proof(proof(), OTHER_KEY)
    assert check_proof(rogue, [SIGNER]) == ["the signer is not a registered verification key"]
    elsewhere = sign_proof(proof(escrow="0x" + "ee" * 20), KEY)
    problems = check_proof(elsewhere, [SIGNER], chain_id=31337, escrow=ESCROW)
    assert problems and "escrow" in problems[0]
    assert "chain" in check_proof(sign_proof(proof(chain_id=1), KEY), [SIGNER], chain_id=31337)[0]


def test_escrowd_verify_proof_cli(tmp_path: Path) -> None:
    """`escrowd verify proof` exits 0 for a good proof, 1 for a tampered one, and names the problem."""
    good = tmp_path / "proof.json"
    good.write_text(json.dumps(sign_proof(proof(), KEY).to_json_dict()))
    terms = tmp_path / "terms.json"
    terms.write_text(json.dumps(TERMS))
    base = [sys.executable, "-m", "escrowd.cli", "verify", "proof", "--signer", SIGNER, "--chain-id", "31337",
            "--escrow", ESCROW, "--terms", str(terms)]  # fmt: skip
    ok = subprocess.run([*base, str(good)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert json.loads(ok.stdout)["valid"] is True
    data = json.loads(good.read_text())
    data["proof"]["hiddenTests"] = "31/31 "
    bad = tmp_path / "tampered.json"
    bad.write_text(json.dumps(data))
    refused = subprocess.run([*base, str(bad)], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1
    assert (
        json.loads(refused.stdout)["problems"][0]
        == "the signature does not match the proof and its claimed signer"
    )
    other_terms = tmp_path / "other-terms.json"
    other_terms.write_text(
        json.dumps({**TERMS, "verifier": {"kind": "exact_match", "ref": "x", "config": {}}})
    )
    wrong = subprocess.run(
        [*base[:-1], str(other_terms), str(good)], capture_output=True, text=True, timeout=120
    )
    assert wrong.returncode == 1 and "criteria hash" in wrong.stdout


def test_escrowd_verify_proof_reruns_a_deterministic_verifier(tmp_path: Path) -> None:
    """A validly signed proof whose verdict the verifier does not reproduce is refused."""
    ref = {"kind": "exact_match", "ref": "answer", "config": {"expected": "42"}}
    (tmp_path / "verifier.json").write_text(json.dumps(ref))
    (tmp_path / "result.json").write_text(json.dumps({"output": "41"}))
    lying = sign_proof(proof(public_tests="", hidden_tests="", resource_limits="", verifier_id="exact_match:answer"), KEY)
    (tmp_path / "proof.json").write_text(json.dumps(lying.to_json_dict()))
    argv = [sys.executable, "-m", "escrowd.cli", "verify", "proof", str(tmp_path / "proof.json"), "--signer", SIGNER,
            "--verifier", str(tmp_path / "verifier.json"), "--result", str(tmp_path / "result.json")]  # fmt: skip
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert json.loads(refused.stdout)["problems"] == ["re-running the verifier gives passed=False, the proof says True"]
    (tmp_path / "result.json").write_text(json.dumps({"output": "42"}))
    accepted = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
