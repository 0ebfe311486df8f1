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


N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
PROOF_DIGEST = "090ff851fcf2d9f6c821d45710bed570a5408b3c0eecd6d91c736a9af27a68c6"
PROOF_SIGNATURE = (
    "0x44531cf20849d2fd5188179c3f411669ea86b90f6034ec8f37797cde035ead1d"
    "51327523d8c0d558f86aaa9360a51e052402d5187354281079519d3da5b001cd1c"
)
CRITERIA_HASH = "0xb23ad1d21064cca4cee95169c7be508ac404323c5035d78581d615ce29234631"


def other_encodings(signature: str) -> dict[str, str]:
    """The two other byte strings eth_account accepts for one signature: v as 0/1, and the high-s twin."""
    raw = bytes.fromhex(signature[2:])
    s = int.from_bytes(raw[32:64], "big")
    return {
        "v must be 27 or 28": "0x" + (raw[:64] + bytes([raw[64] - 27])).hex(),
        "not canonical": "0x" + (raw[:32] + (N - s).to_bytes(32, "big") + bytes([55 - raw[64]])).hex(),
    }


def verify_proof(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "escrowd.cli", "verify", "proof", str(path), "--signer", SIGNER, *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_escrowd_verify_proof_refuses_every_other_encoding_of_a_valid_signature(tmp_path: Path) -> None:
    """A proof has one signature: the v = 0/1 form and the high-s twin (both recover the signer in
    eth_account, and were accepted) are refused by `escrowd verify proof`, saying why."""
    from eth_account.messages import encode_typed_data

    from verification.proof import typed_data

    signed = sign_proof(proof(), KEY)
    for reason, encoding in other_encodings(signed.signature).items():
        assert Account.recover_message(encode_typed_data(full_message=typed_data(signed.proof)), signature=encoding) == SIGNER
        path = tmp_path / "proof.json"
        path.write_text(json.dumps({**signed.to_json_dict(), "signature": encoding}))
        refused = verify_proof(path)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        problems = json.loads(refused.stdout)["problems"]
        assert problems[0].startswith("the signature is not usable: ") and reason in problems[0], problems
        assert problems[1] == "the signer is not a registered verification key"


def test_escrowd_verify_proof_refuses_a_proof_of_other_evidence(tmp_path: Path) -> None:
    """A validly signed proof checked against the attempt's evidence hash on chain: equal in any hex case, else refused."""
    path = tmp_path / "proof.json"
    path.write_text(json.dumps(sign_proof(proof(), KEY).to_json_dict()))
    same = verify_proof(path, "--evidence-hash", "0x" + "AB" * 32)
    assert same.returncode == 0, same.stdout + same.stderr
    other = verify_proof(path, "--evidence-hash", "0x" + "ab" * 31 + "ac")
    assert other.returncode == 1, other.stdout + other.stderr
    assert json.loads(other.stdout)["problems"] == ["the evidence hash differs from the attempt's evidence on chain"]


def test_the_proof_digest_and_signature_vector() -> None:
    """The proof's signed bytes, pinned (a changed domain, field, order or encoding changes them)."""
    from verification.proof import proof_digest

    p = proof()
    assert proof_digest(p).hex() == PROOF_DIGEST
    assert sign_proof(p, KEY).signature == PROOF_SIGNATURE


def test_the_criteria_hash_vector_is_independent_of_key_order() -> None:
    """keccak-256 of `{"verificationCriteria", "verifier"}` with keys sorted at every level, no spaces, UTF-8."""
    criteria = {"type": "json", "schema": {"required": ["é"], "type": "object"}}
    verifier = {"ref": "TEST_SUITE://V1", "kind": "test_suite", "config": {"b": 1, "a": [2, 1]}}
    reordered = ({"schema": {"type": "object", "required": ["é"]}, "type": "json"},
                 {"config": {"a": [2, 1], "b": 1}, "kind": "test_suite", "ref": "TEST_SUITE://V1"})  # fmt: skip
    canonical = (
        '{"verificationCriteria":{"schema":{"required":["é"],"type":"object"},"type":"json"},'
        '"verifier":{"config":{"a":[2,1],"b":1},"kind":"test_suite","ref":"TEST_SUITE://V1"}}'
    )
    from eth_utils.crypto import keccak

    assert criteria_hash(criteria, verifier) == criteria_hash(*reordered) == "0x" + keccak(canonical.encode()).hex()
    assert criteria_hash(criteria, verifier) == CRITERIA_HASH
    assert criteria_hash(None, None) == "0x" + keccak(b'{"verificationCriteria":null,"verifier":null}').hex()
    # Numbers are written as Python writes them (`1.0` stays `1.0`, unlike RFC 8785's `1`):
    # what every proof signed so far holds, so a client must do the same.
    with_float = {"kind": "exact_match", "ref": "x", "config": {}, "passReward": 1.0}
    assert criteria_hash(None, with_float) == "0x" + keccak(
        b'{"verificationCriteria":null,"verifier":{"config":{},"kind":"exact_match","passReward":1.0,"ref":"x"}}'
    ).hex()
    # Array order is content, not layout.
    assert criteria_hash(criteria, {**verifier, "config": {"b": 1, "a": [1, 2]}}) != CRITERIA_HASH
