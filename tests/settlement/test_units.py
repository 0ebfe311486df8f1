"""Unit tests of the relayer's pure core: fees, nonce reconciliation, verdict signing and
checks, transaction signing, keys, send-error classification and the health verdict."""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from eth_account import Account
from eth_account.messages import _hash_eip191_message, encode_typed_data
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from chain.fees import (
    GWEI,
    FeePolicy,
    Fees,
    bump,
    includable,
    is_valid_replacement,
    min_replacement,
    price,
)
from chain.keys import KeyLoadError, SecretKey, load_key, load_keystore, write_keystore
from chain.nonces import gaps_below, reconcile
from chain.txs import (
    DecodedError,
    complete_verification_data,
    decode_complete_verification,
    decode_revert,
    selector,
    sign_eip1559,
    signed_call,
)
from relayer.settlement.consumer import Accept, Reject, Wait, check_signature, decide
from relayer.settlement.health import key_match
from relayer.settlement.sender import classify_send_error, revert_outcome
from relayer.settlement.store import IndexedTask
from runtime.logging import redact
from schemas.verdict import (
    InvalidSignature,
    SignedVerdict,
    Verdict,
    recover_signer,
    sign_verdict,
    verdict_digest,
    verdict_headers,
    verdict_message_id,
    verdict_typed_data,
)

# anvil's public test keys (never used on a real network)
KEY_A = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d"
KEY_B = "0x5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a"
ESCROW = "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512"

POLICY = FeePolicy(fee_cap=200 * GWEI, max_priority_fee=5 * GWEI)

wei = st.integers(min_value=0, max_value=1000 * GWEI)


# ---------------------------------------------------------------------------- fees


@given(base=wei, tip=wei)
def test_price_stays_within_the_cap_and_orders_fields(base: int, tip: int) -> None:
    """A fresh price never exceeds the cap and its tip never exceeds its max fee."""
    fees = price(base, tip, POLICY)
    assert 0 < fees.max_fee_per_gas <= POLICY.fee_cap
    assert fees.max_priority_fee_per_gas <= fees.max_fee_per_gas
    assert fees.max_priority_fee_per_gas <= POLICY.max_priority_fee


def test_price_covers_twice_the_base_fee_plus_tip() -> None:
    """Headroom: 2x base fee + tip, tip clamped to the policy's range."""
    assert price(10 * GWEI, 2 * GWEI, POLICY) == Fees(22 * GWEI, 2 * GWEI)
    assert price(10 * GWEI, 99 * GWEI, POLICY) == Fees(25 * GWEI, 5 * GWEI)
    assert price(0, 0, POLICY) == Fees(1, 1)


@given(max_fee=st.integers(1, 150 * GWEI), tip_share=st.floats(0, 1), base=wei, tip=wei)
def test_bump_is_a_valid_replacement_or_none_at_the_cap(max_fee: int, tip_share: float, base: int, tip: int) -> None:
    """A bump satisfies the node's +10% rule on both fields, stays under the cap, or is None."""
    old = Fees(max_fee, int(max_fee * tip_share))
    new = bump(old, base, tip, POLICY)
    if new is None:
        assert min_replacement(old, POLICY.bump_bps).max_fee_per_gas > POLICY.fee_cap
        return
    assert is_valid_replacement(old, new)
    assert new.max_fee_per_gas <= POLICY.fee_cap
    assert new.max_priority_fee_per_gas <= new.max_fee_per_gas
    assert new.max_fee_per_gas * 10_000 >= old.max_fee_per_gas * (10_000 + POLICY.bump_bps)


def test_bump_follows_a_market_that_moved_more_than_the_bump() -> None:
    """When the base fee doubled, the replacement prices the new market, not just +12.5%."""
    old = price(10 * GWEI, GWEI, POLICY)
    new = bump(old, 40 * GWEI, GWEI, POLICY)
    assert new is not None and new.max_fee_per_gas == 81 * GWEI


def test_bump_refuses_to_cross_the_cap() -> None:
    """Near the cap there is no valid replacement: None, never a price above the cap."""
    old = Fees(190 * GWEI, GWEI)
    assert bump(old, 10 * GWEI, GWEI, POLICY) is None


def test_zero_tip_replacement_still_grows() -> None:
    """A replacement always differs from the original, even from a zero tip."""
    new = min_replacement(Fees(100, 0))
    assert new.max_priority_fee_per_gas == 1 and new.max_fee_per_gas == 110


def test_replacement_rule_matches_geths_floor_division() -> None:
    """+10% computed with floor, as geth does; +9% is refused."""
    old = Fees(1000, 100)
    assert is_valid_replacement(old, Fees(1100, 110))
    assert not is_valid_replacement(old, Fees(1090, 110))
    assert not is_valid_replacement(old, old)


def test_includable_compares_with_base_fee() -> None:
    """A transaction is includable only when its max fee reaches the base fee."""
    assert includable(Fees(10, 1), 10) and not includable(Fees(9, 1), 10)


def test_policy_rejects_a_bump_below_the_node_minimum() -> None:
    """A policy that would produce refused replacements is refused itself."""
    with pytest.raises(ValueError):
        FeePolicy(bump_bps=500)


# ---------------------------------------------------------------------------- nonces


@st.composite
def nonce_states(draw: st.DrawFn) -> tuple[int | None, int, int, set[int]]:
    latest = draw(st.integers(0, 50))
    local = draw(st.one_of(st.none(), st.integers(0, 60)))
    pending = draw(st.integers(0, 70))
    held = draw(st.sets(st.integers(0, 70), max_size=20))
    return local, latest, pending, held


@given(nonce_states())
def test_reconcile_never_drifts_and_covers_the_window(state: tuple[int | None, int, int, set[int]]) -> None:
    """The next nonce is never below the chain; every nonce in the window is resent or filled."""
    local, latest, pending, held = state
    plan = reconcile(local, latest, pending, held)
    assert plan.next_nonce >= max(latest, pending, local or 0)
    assert plan.next_nonce == max(latest, pending, latest if local is None else local)
    assert not set(plan.rebroadcast) & set(plan.fill)
    assert set(plan.rebroadcast) == {n for n in held if latest <= n < plan.next_nonce}
    window = set(range(latest, plan.next_nonce))
    assert set(plan.rebroadcast) | set(plan.fill) | set(range(max(latest, local or latest), plan.next_nonce)) >= window
    assert all(n < (latest if local is None else local) for n in plan.fill)
    assert set(plan.check_mined) == {n for n in held if n < latest}


def test_reconcile_after_a_crash_rebroadcasts_what_we_hold() -> None:
    """Signed and stored but never broadcast: resend, no fill, counter unchanged."""
    plan = reconcile(local_next=8, chain_latest=5, chain_pending=5, held={5, 6, 7})
    assert plan.next_nonce == 8 and plan.rebroadcast == (5, 6, 7) and plan.fill == ()


def test_reconcile_fills_a_gap_nobody_holds() -> None:
    """A nonce handed out with no transaction behind it is filled, or nothing above it mines."""
    plan = reconcile(local_next=8, chain_latest=5, chain_pending=5, held={5, 7})
    assert plan.fill == (6,) and plan.rebroadcast == (5, 7)


def test_reconcile_follows_a_chain_ahead_of_us() -> None:
    """The key was used elsewhere: jump forward, check our held nonces below the count."""
    plan = reconcile(local_next=3, chain_latest=10, chain_pending=12, held={3, 4})
    assert plan.next_nonce == 12 and plan.check_mined == (3, 4) and plan.fill == ()
    assert plan.foreign_pending == 9 and plan.drifted


def test_reconcile_first_start() -> None:
    """A new database starts at the chain's count."""
    plan = reconcile(local_next=None, chain_latest=4, chain_pending=4, held=set())
    assert plan.next_nonce == 4 and not plan.drifted


def test_gaps_below_a_pending_transaction() -> None:
    """Nonces between the mined count and our lowest pending one that nothing fills."""
    assert gaps_below(9, 5, {6, 9}) == (5, 7, 8)


# ---------------------------------------------------------------------------- verdicts


def verdict(**changes: object) -> Verdict:
    fields: dict[str, object] = {
        "chain_id": 31337,
        "escrow": ESCROW,
        "task_id": 7,
        "attempt": 1,
        "evidence_hash": "0x" + "ab" * 32,
        "passed": True,
        "score": 88,
        "reasons": ["ok"],
        "issued_at": datetime(2026, 1, 1, tzinfo=UTC),
    }
    fields.update(changes)
    return Verdict(**fields)  # type: ignore[arg-type]


@given(
    task=st.integers(1, 2**256 - 1),
    attempt=st.integers(1, 255),
    passed=st.booleans(),
    score=st.integers(0, 100),
    chain=st.integers(1, 2**64),
    evidence=st.binary(min_size=32, max_size=32),
)
@settings(max_examples=60, deadline=None)
def test_digest_equals_the_generic_eip712_encoder(
    task: int, attempt: int, passed: bool, score: int, chain: int, evidence: bytes
) -> None:
    """The hand-rolled digest is exactly eth_account's EIP-712 hash of the typed data."""
    v = verdict(task_id=task, attempt=attempt, passed=passed, score=score, chain_id=chain, evidence_hash="0x" + evidence.hex())
    reference = _hash_eip191_message(encode_typed_data(full_message=verdict_typed_data(v)))
    assert verdict_digest(v) == reference


def test_sign_and_recover_round_trip() -> None:
    """The signer recovers, eth_account agrees, and JSON round-trips keep it valid."""
    signed = sign_verdict(verdict(), KEY_A)
    expected = Account.from_key(KEY_A).address
    assert signed.signer == expected == recover_signer(signed)
    assert Account._recover_hash(verdict_digest(signed.verdict), signature=bytes.fromhex(signed.signature[2:])) == expected
    again = SignedVerdict.model_validate_json(signed.model_dump_json())
    assert recover_signer(again) == expected


@given(field=st.sampled_from(["task_id", "attempt", "passed", "score", "evidence_hash", "chain_id", "escrow"]))
@settings(max_examples=20, deadline=None)
def test_changing_any_signed_field_changes_the_signer(field: str) -> None:
    """Each of the seven signed fields is covered by the signature."""
    signed = sign_verdict(verdict(), KEY_A)
    changed = {
        "task_id": 8,
        "attempt": 2,
        "passed": False,
        "score": 87,
        "evidence_hash": "0x" + "cd" * 32,
        "chain_id": 1,
        "escrow": "0x5FbDB2315678afecb367f032d93F642f64180aa3",
    }[field]
    tampered = signed.model_copy(update={"verdict": signed.verdict.model_copy(update={field: changed})})
    with contextlib.suppress(InvalidSignature):
        assert recover_signer(tampered) != signed.signer


def test_unsigned_fields_do_not_change_the_digest() -> None:
    """Reasons, mode and issue time travel unsigned."""
    assert verdict_digest(verdict()) == verdict_digest(verdict(reasons=["x", "y"], mode="manual", issued_at=datetime.now(UTC)))


def test_high_s_and_bad_v_are_refused() -> None:
    """A malleable twin (s -> n - s, v flipped 27 <-> 28) and an unknown v do not recover.

    The twin is the real other encoding of the same signature (eth_account recovers the same
    key from it), so only the high-s rule can refuse it.
    """
    signed = sign_verdict(verdict(), KEY_A)
    raw = bytes.fromhex(signed.signature[2:])
    n = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
    s = int.from_bytes(raw[32:64], "big")
    twin = raw[:32] + (n - s).to_bytes(32, "big") + bytes([55 - raw[64]])
    assert twin[64] in (27, 28)
    assert Account._recover_hash(verdict_digest(signed.verdict), signature=twin) == signed.signer
    with pytest.raises(InvalidSignature, match="not canonical"):
        recover_signer(signed.model_copy(update={"signature": "0x" + twin.hex()}))
    with pytest.raises(InvalidSignature):
        recover_signer(signed.model_copy(update={"signature": "0x" + (raw[:64] + bytes([29])).hex()}))


def test_verdict_validation() -> None:
    """Scores above 100, naive times, bad hashes and addresses are refused by the schema."""
    with pytest.raises(ValidationError):
        verdict(score=101)
    with pytest.raises(ValidationError):
        verdict(issued_at=datetime(2026, 1, 1))
    with pytest.raises(ValidationError):
        verdict(evidence_hash="0x1234")
    with pytest.raises(ValidationError):
        verdict(escrow="0x1234")
    with pytest.raises(ValidationError):
        Verdict.model_validate({**verdict().model_dump(), "unexpected": 1})


def test_message_id_is_per_attempt() -> None:
    """Deterministic per (chain, escrow, task, attempt), whatever the outcome."""
    a, b = verdict(passed=True), verdict(passed=False, score=1)
    assert verdict_message_id(a) == verdict_message_id(b) == f"verdict:31337:{ESCROW.lower()}:7:1"
    assert verdict_message_id(verdict(attempt=2)) != verdict_message_id(a)
    headers = verdict_headers(sign_verdict(a, KEY_A))
    assert headers["ce_id"] == verdict_message_id(a) and headers["ce_type"] == "io.escrowd.verdict.v1"


TRUSTED = frozenset({Account.from_key(KEY_A).address})


def test_signature_checks() -> None:
    """Trusted signer passes; untrusted, mismatched and invalid are refused with their reason."""
    good = sign_verdict(verdict(), KEY_A)
    assert check_signature(good, TRUSTED) is None
    other = sign_verdict(verdict(), KEY_B)
    assert check_signature(other, TRUSTED) == Reject("untrusted_signer", check_signature(other, TRUSTED).detail)  # type: ignore[union-attr]
    lying = other.model_copy(update={"signer": good.signer})
    refusal = check_signature(lying, TRUSTED)
    assert refusal is not None and refusal.reason == "signer_mismatch"
    broken = good.model_copy(update={"signature": "0x" + "00" * 65})
    refusal = check_signature(broken, TRUSTED)
    assert refusal is not None and refusal.reason == "bad_signature"


NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
SERVED = {31337: frozenset({ESCROW.lower()})}
WAIT = timedelta(minutes=10)


def task(attempt: int = 1, evidence: str = "0x" + "ab" * 32, verifier: str | None = None, judged: frozenset[int] = frozenset()) -> IndexedTask:
    return IndexedTask(named_verifier=verifier, latest_attempt=attempt, latest_evidence_hash=evidence, judged_attempts=judged)


@pytest.mark.parametrize(
    ("v", "t", "received", "expected"),
    [
        (verdict(), task(), NOW, Accept()),
        (verdict(), task(judged=frozenset({1})), NOW, Accept(already_judged=True)),
        (verdict(chain_id=1), task(), NOW, "unknown_escrow"),
        (verdict(escrow="0x5FbDB2315678afecb367f032d93F642f64180aa3"), task(), NOW, "unknown_escrow"),
        (verdict(attempt=4), task(), NOW, "attempt_out_of_range"),
        (verdict(), None, NOW, Wait("task_not_indexed")),
        (verdict(), None, NOW - WAIT, "attempt_not_indexed"),
        (verdict(), task(verifier="0x5FbDB2315678afecb367f032d93F642f64180aa3"), NOW, "named_verifier_task"),
        (verdict(attempt=1), task(attempt=2), NOW, "stale_attempt"),
        (verdict(attempt=2), task(attempt=1), NOW, Wait("attempt_not_indexed")),
        (verdict(attempt=2), task(attempt=1), NOW - WAIT, "attempt_not_indexed"),
        (verdict(), task(evidence="0x" + "cd" * 32), NOW, "evidence_mismatch"),
    ],
)
def test_decide(v: Verdict, t: IndexedTask | None, received: datetime, expected: object) -> None:
    """Every case of the verdict check, against the indexed state."""
    outcome = decide(v, t, SERVED, now=NOW, received_at=received, wait_limit=WAIT)
    if isinstance(expected, str):
        assert isinstance(outcome, Reject) and outcome.reason == expected
    else:
        assert outcome == expected


@given(attempt=st.integers(1, 3), latest=st.integers(0, 3), same_hash=st.booleans(), waited=st.booleans())
def test_decide_accepts_only_the_current_attempt_with_its_evidence(attempt: int, latest: int, same_hash: bool, waited: bool) -> None:
    """Accept iff the verdict names the latest indexed attempt and its evidence hash."""
    indexed = task(attempt=latest, evidence="0x" + ("ab" if same_hash else "cd") * 32)
    outcome = decide(verdict(attempt=attempt), indexed, SERVED, now=NOW, received_at=NOW - (WAIT if waited else timedelta()), wait_limit=WAIT)
    assert isinstance(outcome, Accept) == (attempt == latest and same_hash)
    if isinstance(outcome, Wait):
        assert attempt > latest and not waited


# ---------------------------------------------------------------------------- transactions


def test_hand_signed_transaction_equals_eth_account() -> None:
    """The fast EIP-1559 signer produces eth_account's exact bytes and hash."""
    key = SecretKey.from_hex(KEY_A)
    data = complete_verification_data(5, 1, "0x" + "cd" * 32, True, 77)
    ours = sign_eip1559(key, chain_id=31337, nonce=3, to=ESCROW, data=data, gas_limit=300_000, fees=Fees(2 * GWEI, GWEI))
    ref = Account.sign_transaction(
        {"chainId": 31337, "nonce": 3, "to": ESCROW, "data": data, "gas": 300_000, "maxFeePerGas": 2 * GWEI,
         "maxPriorityFeePerGas": GWEI, "type": 2, "value": 0},
        KEY_A,
    )  # fmt: skip
    assert ours.raw == bytes(ref.raw_transaction)
    assert ours.tx_hash == "0x" + bytes(ref.hash).hex()
    assert decode_complete_verification(data) == (5, 1, "0x" + "cd" * 32, True, 77)
    assert decode_complete_verification(b"\x00" * 164) is None


_rlp_items = st.recursive(
    st.integers(min_value=0, max_value=2**256 - 1) | st.binary(max_size=300),
    lambda children: st.lists(children, max_size=6),
    max_leaves=20,
)


@given(_rlp_items)
@settings(max_examples=300, deadline=None)
def test_hand_rolled_rlp_equals_pyrlp(item: object) -> None:
    """The signer's RLP encoder gives pyrlp's bytes for integers, byte strings and lists."""
    import rlp

    from chain.txs import _rlp

    assert _rlp(item) == rlp.encode(item)  # type: ignore[arg-type]


@given(
    nonce=st.integers(min_value=0, max_value=2**64 - 1),
    tip=st.integers(min_value=0, max_value=10**12),
    extra=st.integers(min_value=0, max_value=10**12),
    data=st.binary(max_size=200),
)
@settings(max_examples=40, deadline=None)
def test_hand_signed_transactions_equal_eth_account_for_any_fields(nonce: int, tip: int, extra: int, data: bytes) -> None:
    """Across nonces, fees (zero included) and calldata sizes, same bytes as eth_account."""
    key = SecretKey.from_hex(KEY_A)
    ours = sign_eip1559(key, chain_id=1, nonce=nonce, to=ESCROW, data=data, gas_limit=21_000, fees=Fees(tip + extra, tip))
    ref = Account.sign_transaction(
        {"chainId": 1, "nonce": nonce, "to": ESCROW, "data": data, "gas": 21_000, "maxFeePerGas": tip + extra,
         "maxPriorityFeePerGas": tip, "type": 2, "value": 0},
        KEY_A,
    )  # fmt: skip
    assert ours.raw == bytes(ref.raw_transaction)


def test_batch_calldata_and_refusals_round_trip() -> None:
    """`completeVerificationBatch` calldata is the ABI encoding of the items; its return value
    decodes to one refusal (or None) per item."""
    from eth_abi.abi import decode, encode
    from eth_utils.crypto import keccak

    from chain.txs import (
        complete_verification_batch_data,
        decode_batch_refusals,
        selector,
    )

    items = [(7, 1, "0x" + "ab" * 32, True, 90), (2**200, 3, "0x" + "00" * 32, False, 0)]
    data = complete_verification_batch_data(items)
    assert data[:4] == selector("completeVerificationBatch")
    assert data[:4] == keccak(text="completeVerificationBatch((uint256,uint8,bytes32,bool,uint8)[])")[:4]
    (decoded,) = decode(["(uint256,uint8,bytes32,bool,uint8)[]"], data[4:])
    assert [(t, a, "0x" + e.hex(), p, s) for t, a, e, p, s in decoded] == items
    already = keccak(text="AlreadyJudged(uint8)")[:4] + encode(["uint8"], [1])
    refusals = decode_batch_refusals(encode(["bytes[]"], [[b"", already]]))
    assert refusals[0] is None
    assert refusals[1] is not None and (refusals[1].name, refusals[1].args) == ("AlreadyJudged", (1,))


def test_escrow_errors_decode_by_name() -> None:
    """Custom errors decode to their names and arguments; unknown data is kept."""
    from eth_abi.abi import encode

    data = selector_of_error("WrongAttempt(uint8,uint8)") + encode(["uint8", "uint8"], [2, 1])
    assert decode_revert(data) == DecodedError("WrongAttempt", (2, 1))
    assert decode_revert(selector_of_error("NotVerifier()")).name == "NotVerifier"
    assert decode_revert(b"").name == "Reverted"
    assert decode_revert(b"\x12\x34\x56\x78").name == "Unknown"
    assert revert_outcome(DecodedError("AlreadyJudged", (1,))) == "already_judged"
    assert revert_outcome(DecodedError("NotVerifier")) == "key_refused"
    assert revert_outcome(DecodedError("EvidenceMismatch")) == "reverted"
    assert len(selector("completeVerification")) == 4


def selector_of_error(signature: str) -> bytes:
    from eth_utils.crypto import keccak

    return keccak(text=signature)[:4]


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("transaction already imported", "known"),
        ("already known", "known"),
        ("nonce too low", "nonce_too_low"),
        ("nonce too high", "nonce_too_high"),
        ("replacement transaction underpriced", "underpriced"),
        ("max fee per gas less than block base fee", "below_base_fee"),
        ("insufficient funds for gas * price + value", "insufficient_funds"),
        ("intrinsic gas too low", "refused"),
    ],
)
def test_send_errors_are_classified(message: str, kind: str) -> None:
    """Node refusals (anvil and geth wording) map to what the sender does next."""
    assert classify_send_error(message) == kind


# ---------------------------------------------------------------------------- keys


def test_secret_key_never_shows_itself() -> None:
    """repr, str, format and pickling never reveal the key; logs redact it."""
    import copy
    import pickle

    key = SecretKey.from_hex(KEY_A)
    for text in (repr(key), str(key), f"{key}", f"{key!r}", f"{[key]}"):
        assert KEY_A[2:] not in text.lower() and key.address in text
    with pytest.raises(TypeError):
        pickle.dumps(key)
    with pytest.raises(TypeError):
        copy.deepcopy(key)
    assert KEY_A[2:] not in redact(f"oops {KEY_A} {KEY_A[2:].upper()}").lower()


def test_keystore_round_trip_and_wrong_password(tmp_path: Path) -> None:
    """A keystore written with a password opens with it; a wrong one fails without secrets."""
    path = tmp_path / "key.json"
    key = SecretKey.from_hex(KEY_A)
    write_keystore(key, path, "correct horse battery", kdf="pbkdf2", iterations=1000)
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_keystore(path, "correct horse battery").address == key.address
    password_file = tmp_path / "password"
    password_file.write_text("correct horse battery\n")
    assert load_key(keystore=path, password_file=password_file).address == key.address
    with pytest.raises(KeyLoadError) as err:
        load_keystore(path, "wrong password here")
    assert "wrong password" in str(err.value) and "wrong password here" not in str(err.value)
    assert KEY_A[2:] not in str(err.value)


def test_key_sources_are_exclusive_and_validated(tmp_path: Path) -> None:
    """One source only; garbage keys fail with a message that does not echo them."""
    with pytest.raises(KeyLoadError):
        load_key()
    with pytest.raises(KeyLoadError):
        load_key(raw_key=KEY_A, keystore=tmp_path / "k.json")
    with pytest.raises(KeyLoadError) as err:
        load_key(raw_key="0xnothex-secret-material")
    assert "secret-material" not in str(err.value)
    with pytest.raises(KeyLoadError):
        SecretKey(b"\x00" * 32)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"not": "a keystore"}))
    with pytest.raises(KeyLoadError):
        load_keystore(bad, "pw-long-enough")


# ---------------------------------------------------------------------------- health


def test_key_match() -> None:
    """Matches only when every escrow names the relayer; unknown reads as no."""
    me = Account.from_key(KEY_A).address
    other = Account.from_key(KEY_B).address
    assert key_match([me, me.lower()], me) == (True, None)
    matches, reason = key_match([me, other], me)
    assert not matches and reason is not None and other in reason
    assert key_match([None], me)[0] is False
    assert key_match([], me)[0] is False


# ---------------------------------------------------------------------------- settings


def test_settings_from_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Env with comma-separated signers and the indexer's chain shape; the environment wins over the file."""
    from relayer.settlement.config import RelayerSettings

    signer = Account.from_key(KEY_B).address
    chains = [{"chain_id": 31337, "rpc_urls": ["http://127.0.0.1:8545"], "escrow_addresses": [ESCROW.lower()],
               "start_block": 5, "max_range": 100}]  # fmt: skip
    monkeypatch.setenv("ESCROWD_DATABASE_URL", "postgresql://x@127.0.0.1/db")
    monkeypatch.setenv("ESCROWD_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    monkeypatch.setenv("ESCROWD_CHAINS", json.dumps(chains))
    monkeypatch.setenv("ESCROWD_RELAYER_KEY", KEY_A)
    monkeypatch.setenv("ESCROWD_RELAYER_TRUSTED_SIGNERS", f"{signer.lower()}, {Account.from_key(KEY_A).address}")
    monkeypatch.setenv("ESCROWD_RELAYER_POLL_INTERVAL", "2.5")
    monkeypatch.delenv("ESCROWD_CONFIG", raising=False)
    settings = RelayerSettings.load()
    assert settings.relayer_trusted_signers[0] == signer
    assert settings.chains[0].escrow_addresses == [ESCROW] and settings.chains[0].depth == 1
    assert settings.relayer_poll_interval == 2.5
    assert KEY_A[2:] not in repr(settings)
    config = tmp_path / "relayer.yaml"
    config.write_text("relayer_poll_interval: 0.75\nrelayer_fee_cap_wei: 1000000000\n")
    from_file = RelayerSettings.load(config)
    assert from_file.relayer_poll_interval == 2.5 and from_file.fee_policy().fee_cap == GWEI
    monkeypatch.setenv("ESCROWD_RELAYER_KEYSTORE", str(tmp_path / "k.json"))
    with pytest.raises(ValidationError):
        RelayerSettings.load()


@settings(max_examples=200, deadline=None)
@given(
    nonce=st.integers(0, 2**64 - 1),
    gas=st.integers(21_000, 30_000_000),
    data=st.binary(max_size=4096),
    to=st.binary(min_size=20, max_size=20),
)
def test_a_signed_transaction_gives_back_its_call(nonce: int, gas: int, data: bytes, to: bytes) -> None:
    """`signed_call` reads (to, calldata) back from our signed bytes: a replacement re-signs
    exactly what the nonce first carried."""
    key = SecretKey.from_hex("0x" + "42" * 32)
    tx = sign_eip1559(key, chain_id=31337, nonce=nonce, to="0x" + to.hex(), data=data, gas_limit=gas, fees=Fees(3 * GWEI, GWEI))
    assert signed_call(tx.raw) == ("0x" + to.hex(), data)
    with pytest.raises(ValueError):
        signed_call(b"\x01" + tx.raw[1:])
