"""Private briefs: ECIES-wrapped AES-GCM keys, ciphertext-only storage, readers only; private reasons off the topic."""

from __future__ import annotations

import json

import pytest

from runtime.db import connect
from schemas.task_terms import result_hash
from tests.verification.conftest import Api, IndexedChain, Who, drain, make_handler
from tests.verification.test_api import TASK, code, finalize_path, register
from verification.agents.briefs import (
    BriefError,
    b64,
    open_brief,
    seal_brief,
    unb64,
    unwrap_key,
    wrap_key,
)

from .helpers import enc_secret, register_executor
from .test_refusals import listing_path

BRIEF = "Secret brief: review the payments refactor at commit 9f1c and list every risk."


def test_wrap_and_open_round_trip_and_refuse_strangers_and_tampering() -> None:
    """The reader it is wrapped to opens it; another key, a flipped bit or a swapped key do not."""
    from verification.agents.briefs import encryption_public_key

    reader, other = b"\x11" * 32, b"\x22" * 32
    sealed = seal_brief(BRIEF)
    wrapped = wrap_key(sealed.key, encryption_public_key(reader))
    assert open_brief(sealed.ciphertext, unwrap_key(wrapped, reader)) == BRIEF
    assert BRIEF.encode() not in sealed.ciphertext
    with pytest.raises(BriefError):
        unwrap_key(wrapped, other)
    tampered = bytearray(sealed.ciphertext)
    tampered[20] ^= 1
    with pytest.raises(BriefError):
        open_brief(bytes(tampered), sealed.key)
    with pytest.raises(BriefError):
        open_brief(sealed.ciphertext, seal_brief("x").key)
    assert seal_brief(BRIEF).ciphertext != sealed.ciphertext  # fresh key and nonce each time


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
        who["agent"].address: b64(wrap_key(sealed.key, worker["encryptionPublicKey"])),
        who["verifier"].address: b64(wrap_key(sealed.key, verifier["encryptionPublicKey"])),
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
        key = unwrap_key(unb64(got["wrappedKey"], 200), enc_secret(who[reader]))
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
