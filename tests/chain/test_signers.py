"""Every signer kind against eth_account's recovery: the keystore in process, the aws-kms
adapter through boto3 against the local KMS process, the remote adapter against a JSON-RPC
signer process; random transactions and typed data, the high-s case forced, outages and a
signer that answers for another key."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chain.fees import Fees
from chain.keys import SecretKey
from chain.signers import (
    SIGNER_UP,
    KeystoreSigner,
    Signer,
    SignerError,
    SignerSpec,
    open_signer,
    parse_der_signature,
    with_recovery_id,
)
from chain.txs import UnsignedTx, signature_of
from runtime.services.localkms import LocalKms, der_signature
from runtime.services.localsigner import RemoteSignerProcess
from schemas import eip712

KEY = "0x" + "4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318"
ADDRESS = Account.from_key(KEY).address
MAIL = eip712.Struct.parse("Mail(address to,uint256 amount,bytes32 ref,string note,bool urgent)")

addresses = st.binary(min_size=20, max_size=20).map(lambda b: eip712.checksum_address("0x" + b.hex()))
transactions = st.builds(
    lambda chain_id, nonce, to, data, gas, tip, extra, value: UnsignedTx(
        chain_id=chain_id, nonce=nonce, to=to, data=data, gas_limit=gas,
        fees=Fees(max_fee_per_gas=tip + extra, max_priority_fee_per_gas=tip), value=value,
    ),
    st.integers(1, 2**32), st.integers(0, 2**40), addresses, st.binary(max_size=300), st.integers(21_000, 30_000_000),
    st.integers(0, 10**12), st.integers(0, 10**12), st.integers(0, 10**24),
)
mails = st.builds(
    lambda chain_id, contract, to, amount, ref, note, urgent: (
        eip712.domain("escrowd test", "1", chain_id, contract),
        {"to": to, "amount": amount, "ref": "0x" + ref.hex(), "note": note, "urgent": urgent},
    ),
    st.integers(1, 2**32), addresses, addresses, st.integers(0, 2**256 - 1), st.binary(min_size=32, max_size=32),
    st.text(max_size=40), st.booleans(),
)
BATCH = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(autouse=True)
def _aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    # boto3 signs every request; the local KMS ignores the (dummy) credentials.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "local")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "local")


@pytest.fixture(scope="module")
def kms() -> Iterator[LocalKms]:
    local = LocalKms({"relayer": KEY}).start()
    yield local
    local.stop()


@pytest.fixture(scope="module")
def kms_high_s() -> Iterator[LocalKms]:
    local = LocalKms({"relayer": KEY}, high_s=True).start()
    yield local
    local.stop()


@pytest.fixture(scope="module")
def remote() -> Iterator[RemoteSignerProcess]:
    process = RemoteSignerProcess(KEY).start()
    yield process
    process.stop()


def kms_spec(local: LocalKms, key_id: str = "relayer") -> SignerSpec:
    return SignerSpec(kind="aws-kms", kms_key_id=key_id, kms_endpoint_url=local.url, timeout=3.0)


def _keystore() -> SecretKey:
    return SecretKey.from_hex(KEY)


async def _sign_all(spec: SignerSpec, txs: list[UnsignedTx], messages: list[Any]) -> tuple[list[bytes], list[str]]:
    signer = await open_signer(spec, "test", _keystore)
    try:
        assert signer.address == ADDRESS
        raws = [(await signer.sign_transaction(tx)).raw for tx in txs]
        sigs = [await signer.sign_typed_data(eip712.typed_data(d, MAIL, m), eip712.digest(d, MAIL, m)) for d, m in messages]
    finally:
        await signer.aclose()
    return raws, sigs


def _check(txs: list[UnsignedTx], messages: list[Any], raws: list[bytes], sigs: list[str]) -> None:
    for tx, raw in zip(txs, raws, strict=True):
        assert Account.recover_transaction(raw) == ADDRESS
        # Byte for byte what eth_account signs: RFC 6979 gives both the same signature.
        assert raw == bytes(Account.sign_transaction(_as_dict(tx), KEY).raw_transaction)
    for (domain, message), sig in zip(messages, sigs, strict=True):
        document = eip712.typed_data(domain, MAIL, message)
        assert Account.recover_message(encode_typed_data(full_message=document), signature=sig) == ADDRESS
        assert eip712.recover(eip712.digest(domain, MAIL, message), sig) == ADDRESS  # canonical: low s, v 27/28


def _check_recovery(txs: list[UnsignedTx], messages: list[Any], raws: list[bytes], sigs: list[str]) -> None:
    """KMS signatures are not deterministic: recovery, the canonical form and the fields."""
    for tx, raw in zip(txs, raws, strict=True):
        assert Account.recover_transaction(raw) == ADDRESS
        y, r, s = signature_of(raw)
        assert s <= eip712.HALF_N
        assert tx.assemble(y, r, s).raw == raw  # our fields, exactly
    for (domain, message), sig in zip(messages, sigs, strict=True):
        assert eip712.recover(eip712.digest(domain, MAIL, message), sig) == ADDRESS
        document = eip712.typed_data(domain, MAIL, message)
        assert Account.recover_message(encode_typed_data(full_message=document), signature=sig) == ADDRESS


def _as_dict(tx: UnsignedTx) -> dict[str, Any]:
    return {"type": 2, "chainId": tx.chain_id, "nonce": tx.nonce, "to": tx.to, "value": tx.value, "gas": tx.gas_limit,
            "maxFeePerGas": tx.fees.max_fee_per_gas, "maxPriorityFeePerGas": tx.fees.max_priority_fee_per_gas,
            "data": tx.data, "accessList": []}


@BATCH
@given(st.lists(transactions, min_size=100, max_size=100), st.lists(mails, min_size=100, max_size=100))
def test_keystore_signer_matches_eth_account(txs: list[UnsignedTx], messages: list[Any]) -> None:
    _check(txs, messages, *asyncio.run(_sign_all(SignerSpec(), txs, messages)))


@BATCH
@given(st.lists(transactions, min_size=100, max_size=100), st.lists(mails, min_size=50, max_size=50))
def test_kms_signer_recovers_to_its_key(kms: LocalKms, txs: list[UnsignedTx], messages: list[Any]) -> None:
    _check_recovery(txs, messages, *asyncio.run(_sign_all(kms_spec(kms), txs, messages)))


@BATCH
@given(st.lists(transactions, min_size=50, max_size=50), st.lists(mails, min_size=50, max_size=50))
def test_kms_high_s_is_normalised(kms_high_s: LocalKms, txs: list[UnsignedTx], messages: list[Any]) -> None:
    # Every signature from this KMS has s in the high half: each must come out low, with the
    # parity flipped, and still recover (eth_account refuses a high s in a transaction).
    _check_recovery(txs, messages, *asyncio.run(_sign_all(kms_spec(kms_high_s), txs, messages)))


@BATCH
@given(st.lists(transactions, min_size=50, max_size=50), st.lists(mails, min_size=50, max_size=50))
def test_remote_signer_matches_eth_account(remote: RemoteSignerProcess, txs: list[UnsignedTx], messages: list[Any]) -> None:
    spec = SignerSpec(kind="remote", remote_url=remote.url, address=ADDRESS, timeout=3.0)
    _check(txs, messages, *asyncio.run(_sign_all(spec, txs, messages)))


def test_der_parsing_is_strict_and_high_s_folds() -> None:
    digest = bytes(range(32))
    y, r, s = SecretKey.from_hex(KEY).sign_digest(digest)
    high = eip712.SECP256K1_N - s
    assert parse_der_signature(der_signature(r, high)) == (r, high)
    assert with_recovery_id(digest, r, high, ADDRESS) == (y, r, s)
    der = der_signature(r, s)
    for bad in (der + b"\x00", der[:-1], b"\x31" + der[1:], der[:2] + b"\x02\x21\x00\x01" + der[6:]):
        with pytest.raises(SignerError):
            parse_der_signature(bad)
    with pytest.raises(SignerError):
        with_recovery_id(digest, r, s, eip712.checksum_address("0x" + "11" * 20))


async def test_kms_outage_fails_closed_and_recovers() -> None:
    local = LocalKms({"relayer": KEY}).start()
    tx = UnsignedTx(chain_id=1, nonce=0, to=ADDRESS, data=b"", gas_limit=21_000, fees=Fees(10, 1))
    signer: Signer = await open_signer(kms_spec(local), "outage", _keystore)
    try:
        assert Account.recover_transaction((await signer.sign_transaction(tx)).raw) == ADDRESS
        local.stop()
        with pytest.raises(SignerError) as refused:
            await signer.sign_transaction(tx)
        assert KEY[2:] not in str(refused.value)
        assert SIGNER_UP.labels("outage", "aws-kms")._value.get() == 0
        local.start()
        assert Account.recover_transaction((await signer.sign_transaction(tx)).raw) == ADDRESS
        assert SIGNER_UP.labels("outage", "aws-kms")._value.get() == 1
    finally:
        await signer.aclose()
        local.stop()


async def test_kms_unknown_key_and_expected_address(kms: LocalKms) -> None:
    with pytest.raises(SignerError, match="NotFoundException"):
        await open_signer(kms_spec(kms, "no-such-key"), "test", _keystore)
    other = eip712.checksum_address("0x" + "22" * 20)
    spec = SignerSpec(kind="aws-kms", kms_key_id="relayer", kms_endpoint_url=kms.url, address=other, timeout=3.0)
    with pytest.raises(SignerError, match="not the configured"):
        await open_signer(spec, "test", _keystore)


async def test_remote_signer_for_another_key_is_refused() -> None:
    process = RemoteSignerProcess(KEY, mode="wrong-key").start()
    try:
        signer = await open_signer(SignerSpec(kind="remote", remote_url=process.url, address=ADDRESS), "test", _keystore)
        tx = UnsignedTx(chain_id=1, nonce=0, to=ADDRESS, data=b"", gas_limit=21_000, fees=Fees(10, 1))
        with pytest.raises(SignerError, match="not over our transaction"):
            await signer.sign_transaction(tx)
        domain, message = eip712.domain("d", "1", 1, ADDRESS), {"to": ADDRESS, "amount": 1, "ref": "0x" + "00" * 32,
                                                                 "note": "", "urgent": False}
        with pytest.raises(SignerError, match="does not recover"):
            await signer.sign_typed_data(eip712.typed_data(domain, MAIL, message), eip712.digest(domain, MAIL, message))
        await signer.aclose()
    finally:
        process.stop()


async def test_remote_high_s_and_outage() -> None:
    process = RemoteSignerProcess(KEY, mode="high-s").start()
    try:
        signer = await open_signer(SignerSpec(kind="remote", remote_url=process.url, address=ADDRESS, timeout=2.0),
                                   "remote-outage", _keystore)
        domain, message = eip712.domain("d", "1", 5, ADDRESS), {"to": ADDRESS, "amount": 7, "ref": "0x" + "01" * 32,
                                                                 "note": "x", "urgent": True}
        digest = eip712.digest(domain, MAIL, message)
        sig = await signer.sign_typed_data(eip712.typed_data(domain, MAIL, message), digest)
        assert eip712.recover(digest, sig) == ADDRESS  # folded to the canonical low s
        process.stop()
        with pytest.raises(SignerError):
            await signer.sign_typed_data(eip712.typed_data(domain, MAIL, message), digest)
        assert SIGNER_UP.labels("remote-outage", "remote")._value.get() == 0
        await signer.aclose()
    finally:
        process.stop()


def test_keystore_signer_repr_hides_the_key() -> None:
    signer = KeystoreSigner(SecretKey.from_hex(KEY))
    assert KEY[2:] not in repr(signer) and ADDRESS in repr(signer)


async def test_remote_signer_deep_reply_is_a_signer_error() -> None:
    """A reply nested 100,000 deep (200 KB, under the size bound) is a refusal, never a
    RecursionError (or a crashed process) that the callers' fail-closed handling does not expect."""
    process = RemoteSignerProcess(KEY, mode="deep-reply").start()
    try:
        signer = await open_signer(SignerSpec(kind="remote", remote_url=process.url, address=ADDRESS), "test", _keystore)
        tx = UnsignedTx(chain_id=1, nonce=0, to=ADDRESS, data=b"", gas_limit=21_000, fees=Fees(10, 1))
        with pytest.raises(SignerError, match="not JSON"):
            await signer.sign_transaction(tx)
        domain, message = eip712.domain("d", "1", 1, ADDRESS), {"to": ADDRESS, "amount": 1, "ref": "0x" + "00" * 32,
                                                                 "note": "", "urgent": False}
        with pytest.raises(SignerError, match="not JSON"):
            await signer.sign_typed_data(eip712.typed_data(domain, MAIL, message), eip712.digest(domain, MAIL, message))
        await signer.aclose()
    finally:
        process.stop()


async def test_remote_signer_answers_concurrent_requests(remote: RemoteSignerProcess) -> None:
    """The verification consumer signs a batch's verdicts at once: each reply is matched to the
    id of its own request. A shared counter read after the await refused every reply but the
    last as 'not a JSON-RPC reply' (seen in a whole run with the remote signer)."""
    signer = await open_signer(SignerSpec(kind="remote", remote_url=remote.url, address=ADDRESS), "test", _keystore)
    try:
        domain = eip712.domain("d", "1", 1, ADDRESS)
        messages = [{"to": ADDRESS, "amount": i, "ref": "0x" + "00" * 32, "note": "", "urgent": False} for i in range(16)]
        sigs = await asyncio.gather(*(
            signer.sign_typed_data(eip712.typed_data(domain, MAIL, m), eip712.digest(domain, MAIL, m)) for m in messages
        ))
        for message, sig in zip(messages, sigs, strict=True):
            assert eip712.recover(eip712.digest(domain, MAIL, message), sig) == ADDRESS
    finally:
        await signer.aclose()


async def test_remote_signer_reads_a_reply_that_arrives_in_pieces(remote: RemoteSignerProcess) -> None:
    """A transaction with long calldata (a packed batch of verdicts) comes back as a reply of
    many TCP segments: the whole body is read, not the first piece that arrived."""
    signer = await open_signer(SignerSpec(kind="remote", remote_url=remote.url, address=ADDRESS), "test", _keystore)
    try:
        data = bytes(range(256)) * 80  # 20 KB of calldata: a reply of about 120 KB (the raw transaction, and its fields again)
        tx = UnsignedTx(chain_id=1, nonce=7, to=ADDRESS, data=data, gas_limit=3_000_000, fees=Fees(10, 1))
        signed = await signer.sign_transaction(tx)
        assert Account.recover_transaction(signed.raw_hex) == ADDRESS
    finally:
        await signer.aclose()
