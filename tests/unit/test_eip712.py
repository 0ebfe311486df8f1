"""The one EIP-712 module against eth_account: random structs, every signed struct, the committed vectors.

eth_account is the oracle: its `encode_typed_data` over a typed-data document written here
from the same types and values (never through `schemas.eip712`), its `sign_message` and its
`recover_message`. Our `recover` accepts only the one canonical encoding of a signature;
eth_account accepts the others too, which is how these tests show they are real.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from eth_account import Account
from eth_account.messages import _hash_eip191_message, encode_typed_data
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import eip712, panels, proof, request_auth, vectors, verdict

N = eip712.SECP256K1_N
DOMAIN_FIELDS = [
    {"name": "name", "type": "string"},
    {"name": "version", "type": "string"},
    {"name": "chainId", "type": "uint256"},
    {"name": "verifyingContract", "type": "address"},
]

keys = st.integers(min_value=1, max_value=N - 1).map(lambda k: "0x" + k.to_bytes(32, "big").hex())
addresses = st.binary(min_size=20, max_size=20).map(lambda b: "0x" + b.hex())
texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
digests = st.binary(min_size=32, max_size=32)
domains = st.builds(
    eip712.Domain, name=texts, version=texts, chain_id=st.integers(1, 2**256 - 1), verifying_contract=addresses
)


def oracle_digest(document: dict[str, Any]) -> bytes:
    return bytes(_hash_eip191_message(encode_typed_data(full_message=document)))


def oracle_document(domain: eip712.Domain, name: str, members: list[tuple[str, str]], message: dict[str, Any]) -> dict[str, Any]:
    """The typed-data document written out independently of `schemas.eip712.typed_data`."""
    return {
        "types": {"EIP712Domain": DOMAIN_FIELDS, name: [{"name": m, "type": t} for m, t in members]},
        "primaryType": name,
        "domain": {
            "name": domain.name, "version": domain.version, "chainId": domain.chain_id,
            "verifyingContract": domain.verifying_contract,
        },
        "message": message,
    }  # fmt: skip


# ---------------------------------------------------------------------------- random structs


def _value(kind: str) -> st.SearchStrategy[Any]:
    if kind.startswith("uint"):
        return st.integers(0, 2 ** int(kind[4:]) - 1)
    if kind == "address":
        return addresses
    if kind == "bool":
        return st.booleans()
    if kind == "string":
        return texts
    if kind == "bytes":
        return st.binary(max_size=80)
    return st.binary(min_size=int(kind[5:]), max_size=int(kind[5:]))


member_types = st.sampled_from(
    ["uint8", "uint16", "uint32", "uint64", "uint128", "uint256", "address", "bool", "string", "bytes",
     "bytes1", "bytes4", "bytes20", "bytes31", "bytes32"]
)  # fmt: skip
identifiers = st.from_regex(r"[a-z][A-Za-z0-9]{0,11}", fullmatch=True)


@st.composite
def structs(draw: st.DrawFn) -> tuple[str, list[tuple[str, str]], dict[str, Any]]:
    name = draw(st.from_regex(r"[A-Z][A-Za-z0-9]{0,11}", fullmatch=True).filter(lambda n: n != "EIP712Domain"))
    names = draw(st.lists(identifiers, min_size=1, max_size=8, unique=True))
    members = [(m, draw(member_types)) for m in names]
    message = {m: draw(_value(t)) for m, t in members}
    return name, members, message


@given(domain=domains, struct=structs(), key=keys)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_structs_hash_sign_and_recover_as_eth_account_does(
    domain: eip712.Domain, struct: tuple[str, list[tuple[str, str]], dict[str, Any]], key: str
) -> None:
    name, members, message = struct
    parsed = eip712.Struct.parse(f"{name}({','.join(f'{t} {m}' for m, t in members)})")
    assert parsed == eip712.Struct(name, tuple(members))
    document = oracle_document(domain, name, members, message)
    ours = eip712.digest(domain, parsed, message)
    assert ours == oracle_digest(document)
    # Our JSON document (bytes as hex) means the same thing to eth_account.
    assert oracle_digest(json.loads(json.dumps(eip712.typed_data(domain, parsed, message)))) == ours
    signature = eip712.sign(ours, key)
    wallet = Account.sign_message(encode_typed_data(full_message=document), key)
    assert signature == "0x" + bytes(wallet.signature).hex()
    assert eip712.recover(ours, signature) == Account.from_key(key).address == eip712.signer_address(key)


@given(digest=digests, key=keys)
@settings(max_examples=200, deadline=None)
def test_a_signature_has_exactly_one_accepted_encoding(digest: bytes, key: str) -> None:
    """The v = 0/1 form and the high-s twin recover the same key in eth_account; we refuse both."""
    signature = eip712.sign(digest, key)
    raw = bytes.fromhex(signature[2:])
    assert raw[64] in (27, 28) and int.from_bytes(raw[32:64], "big") <= N // 2
    address = Account.from_key(key).address
    bare_v = raw[:64] + bytes([raw[64] - 27])
    s = int.from_bytes(raw[32:64], "big")
    twin = raw[:32] + (N - s).to_bytes(32, "big") + bytes([55 - raw[64]])
    for other in (bare_v, twin):
        assert Account._recover_hash(digest, signature=other) == address
    with pytest.raises(eip712.InvalidSignature, match="v must be 27 or 28"):
        eip712.recover(digest, "0x" + bare_v.hex())
    with pytest.raises(eip712.InvalidSignature, match="not canonical"):
        eip712.recover(digest, "0x" + twin.hex())
    assert eip712.recover(digest, signature.upper().replace("0X", "0x")) == address


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("uint8", 256), ("uint8", -1), ("uint8", True), ("uint256", 2**256), ("uint64", 1.0), ("uint64", "1"),
        ("bool", 1), ("bool", "true"), ("address", "0x" + "00" * 19), ("address", b"\x00" * 20),
        ("bytes32", "0x" + "00" * 31), ("bytes32", b"\x00" * 33), ("bytes32", "0x" + "0" * 63), ("bytes4", "0xzz000000"),
        ("string", b"text"), ("string", "\ud800"), ("bytes", "text"), ("bytes", "0x123"),
    ],
)  # fmt: skip
def test_values_are_strict(kind: str, value: Any) -> None:
    """A value outside its type's range or form is refused, never coerced."""
    struct = eip712.Struct("Thing", (("x", kind),))
    domain = eip712.Domain("n", "1", 1, "0x" + "11" * 20)
    with pytest.raises(ValueError, match=r"^Thing\.x "):
        eip712.digest(domain, struct, {"x": value})


def test_members_are_exactly_the_declared_ones() -> None:
    struct = eip712.Struct.parse("Thing(uint8 a,bool b)")
    domain = eip712.Domain("n", "1", 1, "0x" + "11" * 20)
    with pytest.raises(ValueError, match=r"Thing\.b is missing"):
        eip712.digest(domain, struct, {"a": 1})
    with pytest.raises(ValueError, match="no member 'c'"):
        eip712.digest(domain, struct, {"a": 1, "b": True, "c": 2})
    with pytest.raises(ValueError, match=r"Thing\.b is missing"):
        eip712.digest(domain, struct, {"a": 1, "c": 2})


@pytest.mark.parametrize(
    "text",
    ["Thing()", "Thing(uint7 a)", "Thing(uint264 a)", "Thing(bytes33 a)", "Thing(int8 a)", "Thing(Other a)",
     "Thing(uint8 a,uint8 a)", "EIP712Domain(string name)", "Thing(uint8 a, bool b)", "Thing(uint8[] a)"],
)  # fmt: skip
def test_only_atomic_well_formed_types_are_declared(text: str) -> None:
    with pytest.raises(ValueError):
        eip712.Struct.parse(text)


@pytest.mark.parametrize("chain_id", [0, -1, 2**256, True])
def test_a_domain_is_bound_to_a_real_chain_id(chain_id: int) -> None:
    with pytest.raises(ValueError, match="chainId"):
        eip712.Domain("n", "1", chain_id, "0x" + "11" * 20)


def test_keys_are_checked_and_never_echoed() -> None:
    for bad in ("0x" + "00" * 32, "0x" + N.to_bytes(32, "big").hex(), "0x" + "ab" * 31, "0xnothex-secret"):
        with pytest.raises(ValueError) as info:
            eip712.sign(b"\x00" * 32, bad)
        assert bad.removeprefix("0x") not in str(info.value)


# ---------------------------------------------------------------------------- every signed struct

bytes32 = st.binary(min_size=32, max_size=32).map(lambda b: "0x" + b.hex())
chain_ids = st.integers(1, 2**53 - 1)


@given(
    chain_id=st.integers(1, 2**256 - 1), escrow=addresses, task_id=st.integers(1, 2**256 - 1),
    attempt=st.integers(1, 255), evidence=bytes32, passed=st.booleans(), score=st.integers(0, 100), key=keys,
)  # fmt: skip
@settings(max_examples=100, deadline=None)
def test_verdicts_against_eth_account(
    chain_id: int, escrow: str, task_id: int, attempt: int, evidence: str, passed: bool, score: int, key: str
) -> None:
    v = verdict.Verdict(chain_id=chain_id, escrow=escrow, task_id=task_id, attempt=attempt, evidence_hash=evidence,
                        passed=passed, score=score, issued_at=datetime(2026, 1, 1, tzinfo=UTC))  # fmt: skip
    members = [("chainId", "uint256"), ("escrow", "address"), ("taskId", "uint256"), ("attempt", "uint8"),
               ("evidenceHash", "bytes32"), ("passed", "bool"), ("score", "uint8")]  # fmt: skip
    message = {"chainId": chain_id, "escrow": escrow, "taskId": task_id, "attempt": attempt, "evidenceHash": evidence,
               "passed": passed, "score": score}  # fmt: skip
    domain = eip712.Domain("escrowd-verdict", "1", chain_id, escrow)
    document = oracle_document(domain, "Verdict", members, message)
    assert verdict.verdict_digest(v) == oracle_digest(document)
    signed = verdict.sign_verdict(v, key)
    assert signed.signature == "0x" + bytes(Account.sign_message(encode_typed_data(full_message=document), key).signature).hex()
    assert verdict.recover_signer(signed) == signed.signer == Account.from_key(key).address


@given(
    chain_id=st.integers(1, 2**256 - 1), escrow=addresses, task_id=st.integers(1, 2**256 - 1), attempt=st.integers(1, 255),
    agent=addresses, evidence=bytes32, criteria=bytes32, passed=st.booleans(), score=st.integers(0, 100),
    counts=st.lists(st.text(max_size=64).filter(lambda t: "\x00" not in t), min_size=3, max_size=3),
    verifier_id=st.text(max_size=256), key=keys,
)  # fmt: skip
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_proofs_against_eth_account(
    chain_id: int, escrow: str, task_id: int, attempt: int, agent: str, evidence: str, criteria: str,
    passed: bool, score: int, counts: list[str], verifier_id: str, key: str,
) -> None:  # fmt: skip
    p = proof.Proof(
        chain_id=chain_id, escrow=escrow, task_id=task_id, attempt=attempt, agent=agent, evidence_hash=evidence,
        criteria_hash=criteria, passed=passed, score=score, public_tests=counts[0], hidden_tests=counts[1],
        resource_limits=counts[2], verifier_id=verifier_id, verifier_version="v/1",
    )  # fmt: skip
    members = [("taskId", "uint256"), ("attempt", "uint8"), ("agent", "address"), ("evidenceHash", "bytes32"),
               ("criteriaHash", "bytes32"), ("passed", "bool"), ("score", "uint8"), ("publicTests", "string"),
               ("hiddenTests", "string"), ("resourceLimits", "string"), ("verifierId", "string"),
               ("verifierVersion", "string")]  # fmt: skip
    message = {"taskId": task_id, "attempt": attempt, "agent": agent, "evidenceHash": evidence, "criteriaHash": criteria,
               "passed": passed, "score": score, "publicTests": counts[0], "hiddenTests": counts[1],
               "resourceLimits": counts[2], "verifierId": verifier_id, "verifierVersion": "v/1"}  # fmt: skip
    document = oracle_document(eip712.Domain("escrowd-proof", "1", chain_id, escrow), "VerificationProof", members, message)
    assert proof.proof_digest(p) == oracle_digest(document)
    signed = proof.sign_proof(p, key)
    assert signed.signature == "0x" + bytes(Account.sign_message(encode_typed_data(full_message=document), key).signature).hex()
    assert proof.recover_proof_signer(signed) == Account.from_key(key).address


@given(
    chain_id=chain_ids, escrow=addresses, task_id=chain_ids, rnd=st.integers(1, 2), quality=st.integers(0, 10**6),
    confidence=st.integers(0, 10**6), share=st.integers(0, 10_000), key=keys, attempt=st.integers(1, 3),
    evidence=st.binary(min_size=32, max_size=32).map(lambda b: "0x" + b.hex()),
)  # fmt: skip
@settings(max_examples=100, deadline=None)
def test_panel_attestations_and_rulings_against_eth_account(
    chain_id: int, escrow: str, task_id: int, rnd: int, quality: int, confidence: int, share: int, key: str,
    attempt: int, evidence: str,
) -> None:
    verifier_address = Account.from_key(key).address
    a = panels.Attestation(chain_id=chain_id, escrow=escrow, task_id=task_id, round=rnd, attempt=attempt,
                           evidence_hash=evidence, verifier=verifier_address,
                           quality_ppm=quality, confidence_ppm=confidence)  # fmt: skip
    domain = eip712.Domain("escrowd-panel", "1", chain_id, escrow)
    document = oracle_document(
        domain, "Attestation",
        [("chainId", "uint256"), ("escrow", "address"), ("taskId", "uint256"), ("round", "uint8"),
         ("attempt", "uint8"), ("evidenceHash", "bytes32"),
         ("verifier", "address"), ("quality", "uint32"), ("confidence", "uint32")],
        {"chainId": chain_id, "escrow": escrow, "taskId": task_id, "round": rnd, "attempt": attempt,
         "evidenceHash": evidence, "verifier": verifier_address, "quality": quality, "confidence": confidence},
    )  # fmt: skip
    assert panels.attestation_digest(a) == oracle_digest(document)
    signed = panels.sign_attestation(a, key)
    assert panels.attestation_signer(signed) == verifier_address
    r = panels.Ruling(chain_id=chain_id, escrow=escrow, task_id=task_id, round=rnd, agent_share_bps=share)
    document = oracle_document(
        domain, "Ruling",
        [("chainId", "uint256"), ("escrow", "address"), ("taskId", "uint256"), ("round", "uint8"), ("agentShareBps", "uint16")],
        {"chainId": chain_id, "escrow": escrow, "taskId": task_id, "round": rnd, "agentShareBps": share},
    )  # fmt: skip
    assert panels.ruling_digest(r) == oracle_digest(document)
    ruled = panels.sign_ruling(r, key)
    assert ruled.signature == "0x" + bytes(Account.sign_message(encode_typed_data(full_message=document), key).signature).hex()
    assert panels.ruling_signer(ruled) == ruled.signer == verifier_address


@given(
    chain_id=st.integers(1, 2**256 - 1), escrow=addresses, method=st.sampled_from(["GET", "POST", "put"]),
    path=st.text(max_size=60).filter(lambda t: "\x00" not in t), body=st.binary(max_size=200),
    nonce=st.from_regex(r"[A-Za-z0-9_-]{8,100}", fullmatch=True), expires_at=st.integers(0, 2**64 - 1),
    request_id=st.text(max_size=80), payload=st.binary(min_size=32, max_size=32), key=keys,
)  # fmt: skip
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_request_and_service_signatures_against_eth_account(
    chain_id: int, escrow: str, method: str, path: str, body: bytes, nonce: str, expires_at: int,
    request_id: str, payload: bytes, key: str,
) -> None:  # fmt: skip
    from eth_utils.crypto import keccak

    deployment = request_auth.Deployment(chain_id, escrow)
    signer = Account.from_key(key).address
    members = [("method", "string"), ("path", "string"), ("bodyHash", "bytes32"), ("signer", "address"),
               ("nonce", "string"), ("expiresAt", "uint64")]  # fmt: skip
    message = {"method": method.upper(), "path": path, "bodyHash": bytes(keccak(body)), "signer": signer, "nonce": nonce,
               "expiresAt": expires_at}  # fmt: skip
    document = oracle_document(eip712.Domain("escrowd-api", "2", chain_id, escrow), "Request", members, message)
    digest = request_auth.request_digest(deployment, method, path, body, signer, nonce, expires_at)
    assert digest == oracle_digest(document)
    headers = request_auth.sign_request(key, request_auth.UnsignedRequest(method, path, body, deployment=deployment, expires_at=expires_at, nonce=nonce))
    assert headers["X-Escrowd-Signature"] == "0x" + bytes(Account.sign_message(encode_typed_data(full_message=document), key).signature).hex()
    assert headers["X-Escrowd-Signer"] == signer
    service = oracle_document(
        eip712.Domain("escrowd-api-service", "1", chain_id, escrow), "ServiceRequest",
        [("requestId", "string"), ("payloadHash", "bytes32")], {"requestId": request_id, "payloadHash": payload},
    )  # fmt: skip
    assert request_auth.service_digest(deployment, request_id, payload) == oracle_digest(service)


# ---------------------------------------------------------------------------- the committed vectors


def test_the_committed_vectors_are_current() -> None:
    """`escrowd schemas export` rewrites schemas/vectors/eip712.json: a change of any signed byte shows here."""
    assert vectors.VECTORS_FILE.read_text(encoding="utf-8") == vectors.render()


def test_every_committed_vector_holds_for_eth_account() -> None:
    """The file itself, read as another client reads it, checked by eth_account alone."""
    document = json.loads(vectors.VECTORS_FILE.read_text(encoding="utf-8"))
    key, signer = document["testKey"], document["signer"]
    assert Account.from_key(key).address == signer
    assert {v["name"] for v in document["vectors"]} == {
        "Verdict", "VerificationProof", "Attestation", "Ruling", "Request", "ServiceRequest"
    }  # fmt: skip
    for vector in document["vectors"]:
        typed = vector["typedData"]
        signable = encode_typed_data(full_message=typed)
        assert "0x" + bytes(_hash_eip191_message(signable)).hex() == vector["digest"], vector["name"]
        assert "0x" + bytes(signable.header).hex() == vector["domainSeparator"], vector["name"]
        assert "0x" + bytes(signable.body).hex() == vector["structHash"], vector["name"]
        primary = typed["primaryType"]
        members = ",".join(f"{m['type']} {m['name']}" for m in typed["types"][primary])
        assert vector["encodeType"] == f"{primary}({members})"
        from eth_utils.crypto import keccak

        assert vector["typeHash"] == "0x" + bytes(keccak(text=vector["encodeType"])).hex()
        assert "0x" + bytes(Account.sign_message(signable, key).signature).hex() == vector["signature"], vector["name"]
        assert Account.recover_message(signable, signature=vector["signature"]) == signer
        assert eip712.recover(bytes.fromhex(vector["digest"][2:]), vector["signature"]) == signer
    refused = document["refused"]
    digest = bytes.fromhex(refused["digest"][2:])
    assert len(refused["signatures"]) == 7
    for case in refused["signatures"]:
        with pytest.raises(eip712.InvalidSignature):
            eip712.recover(digest, case["signature"])


def test_the_vectors_cover_the_domains_the_services_sign_under() -> None:
    """Each vector's domain is the one its module signs under (name, version, chain, escrow)."""
    document = {v["name"]: v["typedData"]["domain"] for v in vectors.vectors()["vectors"]}
    assert {name: (d["name"], d["version"]) for name, d in document.items()} == {
        "Verdict": ("escrowd-verdict", "1"), "VerificationProof": ("escrowd-proof", "1"),
        "Attestation": ("escrowd-panel", "1"), "Ruling": ("escrowd-panel", "1"),
        "Request": ("escrowd-api", "2"), "ServiceRequest": ("escrowd-api-service", "1"),
    }  # fmt: skip
