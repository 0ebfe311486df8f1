"""Private briefs: key-committing ciphertexts, wrapped keys bound to their task, published vectors;
ciphertext-only storage, readers only; private reasons off the topic."""

from __future__ import annotations

import json

import pytest
from eth_utils.crypto import keccak
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.db import connect
from schemas.task_terms import result_hash
from tests.verification.conftest import ESCROW, Api, IndexedChain, Who, drain, make_handler
from tests.verification.test_api import TASK, code, finalize_path, register
from verification.agents.briefs import (
    BriefError,
    KeyContext,
    b64,
    encryption_public_key,
    open_brief,
    seal_brief,
    unb64,
    unwrap_key,
    wrap_key,
)

from .helpers import context_for, enc_secret, register_executor, wrap_for
from .test_refusals import listing_path

BRIEF = "Secret brief: review the payments refactor at commit 9f1c and list every risk."


def test_wrap_and_open_round_trip_and_refuse_strangers_and_tampering() -> None:
    """The reader it is wrapped to opens it; another key, a flipped bit or a swapped key do not."""
    reader, other = b"\x11" * 32, b"\x22" * 32
    context = KeyContext(31337, ESCROW, "0x" + "ab" * 32, "0x" + "12" * 20)
    sealed = seal_brief(BRIEF)
    wrapped = wrap_key(sealed.key, encryption_public_key(reader), context)
    assert open_brief(sealed.ciphertext, unwrap_key(wrapped, reader, context)) == BRIEF
    assert BRIEF.encode() not in sealed.ciphertext
    with pytest.raises(BriefError):
        unwrap_key(wrapped, other, context)
    for index in (0, 5, 40, len(wrapped) - 1):  # version, ephemeral key, ciphertext, tag
        flipped = bytearray(wrapped)
        flipped[index] ^= 1
        with pytest.raises(BriefError):
            unwrap_key(bytes(flipped), reader, context)
    for index in (0, 3, 20, 60, len(sealed.ciphertext) - 1):  # version, nonce, commitment, body, tag
        tampered = bytearray(sealed.ciphertext)
        tampered[index] ^= 1
        with pytest.raises(BriefError):
            open_brief(bytes(tampered), sealed.key)
    with pytest.raises(BriefError):
        open_brief(sealed.ciphertext, seal_brief("x").key)
    assert seal_brief(BRIEF).ciphertext != sealed.ciphertext  # fresh key and nonce each time


# ---------------------------------------------------------------------------- GCM in the clear, for the attack


def _gf_mul(x: int, y: int) -> int:
    """Multiplication in GCM's GF(2^128) (NIST SP 800-38D, algorithm 1; bit 0 is the MSB)."""
    z, v = 0, x
    for i in range(127, -1, -1):
        if (y >> i) & 1:
            z ^= v
        v = (v >> 1) ^ (0xE1 << 120) if v & 1 else v >> 1
    return z


def _gf_pow(x: int, n: int) -> int:
    out = 1 << 127  # the field's 1
    while n:
        if n & 1:
            out = _gf_mul(out, x)
        x, n = _gf_mul(x, x), n >> 1
    return out


def _aes(key: bytes, block: bytes) -> bytes:
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    encryptor = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    return encryptor.update(block) + encryptor.finalize()


def _blocks(data: bytes) -> list[int]:
    padded = data + b"\x00" * (-len(data) % 16)
    return [int.from_bytes(padded[i : i + 16], "big") for i in range(0, len(padded), 16)]


def _ghash(h: int, aad: bytes, body: bytes) -> int:
    lengths = ((8 * len(aad)) << 64) | (8 * len(body))
    y = 0
    for block in [*_blocks(aad), *_blocks(body), lengths]:
        y = _gf_mul(y ^ block, h)
    return y


def two_key_gcm(key1: bytes, key2: bytes, nonce: bytes, aad: bytes, blocks: int = 4) -> bytes:
    """A ciphertext ‖ tag that AES-GCM authenticates under both keys: the last block is solved for
    so that the two tags agree (the tag is linear in each ciphertext block)."""
    h1, h2 = (int.from_bytes(_aes(k, bytes(16)), "big") for k in (key1, key2))
    j0 = nonce + b"\x00\x00\x00\x01"
    s1, s2 = (int.from_bytes(_aes(k, j0), "big") for k in (key1, key2))
    body = bytearray(b"salamander block" * blocks)
    body[-16:] = bytes(16)
    # tag_i = s_i ^ ghash_i(body); the last block c enters ghash_i as c * h_i^2.
    rhs = s1 ^ s2 ^ _ghash(h1, aad, bytes(body)) ^ _ghash(h2, aad, bytes(body))
    coefficient = _gf_mul(h1, h1) ^ _gf_mul(h2, h2)
    last = _gf_mul(rhs, _gf_pow(coefficient, 2**128 - 2))
    body[-16:] = last.to_bytes(16, "big")
    tag = s1 ^ _ghash(h1, aad, bytes(body))
    assert tag == s2 ^ _ghash(h2, aad, bytes(body))
    return bytes(body) + tag.to_bytes(16, "big")


def test_a_ciphertext_built_to_open_under_two_keys_opens_under_one_only() -> None:
    """The two-key attack: AES-GCM alone accepts the crafted ciphertext under both keys; the key
    commitment in the digest lets exactly one of them open the brief."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from verification.agents.briefs import VERSION, content_keys

    key_worker, key_verifier = b"\x01" * 32, b"\x02" * 32
    (enc_worker, commit_worker), (enc_verifier, _) = content_keys(key_worker), content_keys(key_verifier)
    nonce = b"\x09" * 12
    header = bytes([VERSION]) + nonce + commit_worker
    body = two_key_gcm(enc_worker, enc_verifier, nonce, header)
    # The attack is real: plain AES-GCM (what format 1 relied on) opens it under both keys, to two plaintexts.
    seen_by_worker = AESGCM(enc_worker).decrypt(nonce, body, header)
    seen_by_verifier = AESGCM(enc_verifier).decrypt(nonce, body, header)
    assert seen_by_worker != seen_by_verifier
    crafted = header + body
    with pytest.raises(BriefError, match="commits to"):
        open_brief(crafted, key_verifier)  # the verifier's key is not the one the digest commits to
    with pytest.raises(BriefError):
        open_brief(crafted, key_worker)  # committed, but the crafted plaintext is not a brief (not UTF-8)
    # And with a honest brief: the commitment of one key, whatever the other key is, decides.
    sealed = seal_brief(BRIEF, key_worker, nonce=nonce)
    assert sealed.ciphertext[: len(header)] == header and open_brief(sealed.ciphertext, key_worker) == BRIEF
    with pytest.raises(BriefError, match="commits to"):
        open_brief(sealed.ciphertext, key_verifier)


@settings(max_examples=30, deadline=None)
@given(first=st.binary(min_size=32, max_size=32), second=st.binary(min_size=32, max_size=32))
def test_distinct_content_keys_commit_differently(first: bytes, second: bytes) -> None:
    from verification.agents.briefs import content_keys

    assert (content_keys(first)[1] == content_keys(second)[1]) is (first == second)


def test_a_wrapped_key_opens_only_for_its_task_and_reader() -> None:
    """A key wrapped for reader A on task X opens for nothing else: not task Y, another escrow or chain, another reader."""
    reader = b"\x11" * 32
    x = KeyContext(31337, ESCROW, "0x" + "aa" * 32, "0x" + "12" * 20)
    wrapped = wrap_key(b"\x05" * 32, encryption_public_key(reader), x)
    assert unwrap_key(wrapped, reader, x) == b"\x05" * 32
    others = [
        KeyContext(31337, ESCROW, "0x" + "bb" * 32, x.recipient),
        KeyContext(31337, "0x" + "77" * 20, x.task_hash, x.recipient),
        KeyContext(8453, ESCROW, x.task_hash, x.recipient),
        KeyContext(31337, ESCROW, x.task_hash, "0x" + "34" * 20),
    ]
    for context in others:
        with pytest.raises(BriefError, match="for this task"):
            unwrap_key(wrapped, reader, context)


def test_the_published_vectors_verify() -> None:
    """schemas/vectors/briefs-v2.json is what the code builds, and every vector opens from its file values alone."""
    from .brief_vectors import VECTORS, build_vectors

    published = json.loads(VECTORS.read_text(encoding="utf-8"))
    assert published == build_vectors()
    assert len(published["content"]) == len(published["wrappedKeys"]) >= 3
    for vector in published["content"]:
        ciphertext = bytes.fromhex(vector["ciphertext"])
        key = bytes.fromhex(vector["contentKey"])
        assert open_brief(ciphertext, key) == vector["brief"]
        assert "0x" + keccak(ciphertext).hex() == vector["instructionsDigest"]
        assert ciphertext[13:45].hex() == vector["commitment"]
    for vector in published["wrappedKeys"]:
        c = vector["context"]
        context = KeyContext(c["chainId"], c["escrow"], c["taskHash"], c["recipient"])
        assert context.encode().hex() == vector["contextBytes"]
        secret = bytes.fromhex(vector["recipientSecret"])
        assert encryption_public_key(secret) == vector["recipientPublicKey"]
        assert unwrap_key(bytes.fromhex(vector["wrappedKey"]), secret, context).hex() == vector["contentKey"]
        with pytest.raises(BriefError):
            unwrap_key(bytes.fromhex(vector["wrappedKey"]), secret, KeyContext(c["chainId"] + 1, c["escrow"], c["taskHash"], c["recipient"]))


async def test_a_private_brief_is_readable_only_by_its_readers(
    api: Api, chain: IndexedChain, who: dict[str, Who], database_url: str
) -> None:
    """The API stores ciphertext and wrapped keys; anonymous, strangers and the unwrapped get nothing readable."""
    worker = await register_executor(api, who["agent"], roles=("worker",))
    verifier = await register_executor(api, who["verifier"])
    sealed = seal_brief(BRIEF)
    digest = await register(
        api, who["poster"], private=True, instructionsDigest=sealed.digest, verificationMode="agent",
        verifierAddress=who["verifier"].address,
    )  # fmt: skip
    keys = {
        who["agent"].address: wrap_for(sealed.key, worker["encryptionPublicKey"], digest, who["agent"].address),
        who["verifier"].address: wrap_for(sealed.key, verifier["encryptionPublicKey"], digest, who["verifier"].address),
    }
    wrong = seal_brief(BRIEF)  # another ciphertext: not what the terms commit to
    mismatch = await api.call("PUT", f"/v1/briefs/{digest}", {"ciphertext": b64(wrong.ciphertext)}, as_=who["poster"])
    assert mismatch.status_code == 400 and code(mismatch) == "BRIEF_DIGEST_MISMATCH"
    clear = await api.call("PUT", f"/v1/briefs/{digest}", {"brief": BRIEF}, as_=who["poster"])
    assert clear.status_code == 400 and code(clear) == "BRIEF_NOT_ENCRYPTED"
    body = {"ciphertext": b64(sealed.ciphertext), "wrappedKeys": keys}
    assert code(await api.call("PUT", f"/v1/briefs/{digest}", body, as_=who["stranger"])) == "NOT_POSTER"
    assert (await api.call("PUT", f"/v1/briefs/{digest}", body, as_=who["poster"])).status_code == 200

    await chain.created(TASK, who["poster"].address, digest, verifier=who["verifier"].address)
    assert code(await api.call("GET", f"/v1/briefs/{digest}", as_=who["agent"])) == "TASK_NOT_LISTED"
    assert (await api.call("POST", listing_path(), as_=who["poster"])).status_code == 201

    responses = [
        await api.call("GET", f"/v1/briefs/{digest}"),
        await api.call("GET", f"/v1/briefs/{digest}", as_=who["stranger"]),
        await api.call("GET", f"/v1/terms/{digest}"),
        await api.call("GET", "/v1/listings"),
    ]
    assert [r.status_code for r in responses] == [401, 403, 200, 200]
    for response in responses:
        assert "Secret brief" not in response.text

    for reader in ("agent", "verifier"):
        got = (await api.call("GET", f"/v1/briefs/{digest}", as_=who[reader])).json()
        key = unwrap_key(unb64(got["wrappedKey"], 200), enc_secret(who[reader]), context_for(digest, who[reader].address))
        assert open_brief(unb64(got["ciphertext"], 10**6), key) == BRIEF
        assert got["wrappedKey"] == keys[who[reader].address]

    conn = await connect(database_url)
    try:
        stored = [bytes(r["ciphertext"]) for r in await conn.fetch("SELECT ciphertext FROM task_briefs")]
        stored += [r["wrapped"].encode() for r in await conn.fetch("SELECT wrapped FROM brief_keys")]
        stored += [str(r["brief"]).encode() for r in await conn.fetch("SELECT brief FROM task_briefs")]
    finally:
        await conn.close()
    assert stored and all(b"Secret brief" not in blob for blob in stored)


async def test_a_public_brief_is_served_in_clear_once_listed(api: Api, chain: IndexedChain, who: dict[str, Who]) -> None:
    """Public tasks unchanged: the brief hashes to instructionsDigest and anyone reads it after listing."""
    from eth_utils.crypto import keccak

    text = "Public brief: summarise the attached article."
    digest = await register(api, who["poster"], instructionsDigest="0x" + keccak(text.encode()).hex())
    assert (await api.call("PUT", f"/v1/briefs/{digest}", {"brief": text}, as_=who["poster"])).status_code == 200
    await chain.created(TASK, who["poster"].address, digest)
    assert code(await api.call("GET", f"/v1/briefs/{digest}")) == "TASK_NOT_LISTED"
    assert (await api.call("GET", f"/v1/briefs/{digest}", as_=who["poster"])).json()["brief"] == text
    await api.call("POST", listing_path(), as_=who["poster"])
    assert (await api.call("GET", f"/v1/briefs/{digest}")).json() == {"taskHash": digest, "private": False, "brief": text}


async def test_a_private_tasks_reasons_never_reach_the_verdicts_topic(
    api: Api, chain: IndexedChain, who: dict[str, Who], database_url: str
) -> None:
    """The signed verdict on the topic carries no reasons for a private task; the parties still read them."""
    secret = "Quote of the private result that must stay private"
    digest = await register(api, who["poster"], private=True, verificationMode="auto", verificationCriteria={"contains_keywords": ["Zanzibar"], "min_length": 5})
    await chain.created(TASK, who["poster"].address, digest)
    await chain.accepted(TASK, who["agent"].address)
    await chain.submitted(TASK, who["agent"].address, 1, result_hash(secret))
    await api.call("POST", finalize_path(), {"result": secret}, as_=who["agent"])
    await drain(database_url, make_handler())
    conn = await connect(database_url)
    try:
        payloads = [json.loads(bytes(r["payload"])) for r in await conn.fetch("SELECT payload FROM outbox WHERE topic = 'escrow.verdicts.v1'")]
    finally:
        await conn.close()
    assert len(payloads) == 1 and payloads[0]["verdict"]["passed"] is False and payloads[0]["verdict"]["reasons"] == []
    assert secret not in json.dumps(payloads)
    full = (await api.call("GET", f"/v1/tasks/31337/{chain.escrow}/{TASK}/results", as_=who["agent"])).json()
    assert full["results"][0]["verificationResult"]["reasons"]
