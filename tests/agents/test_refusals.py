"""Every agent-review refusal of seed 000 at its step: terms registration, listing, finalize, report."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from eth_utils.crypto import keccak

from runtime.db import connect
from schemas.task_terms import result_hash
from tests.verification.conftest import CHAIN_ID, ESCROW, Api, IndexedChain, Who
from tests.verification.test_api import TASK, code, finalize_path, register, terms_body
from verification.agents.briefs import b64, seal_brief

from .helpers import register_executor, wrap_for


def listing_path(task_id: int = TASK) -> str:
    return f"/v1/tasks/{CHAIN_ID}/{ESCROW}/{task_id}/listing"


def agent_terms(who: dict[str, Who], **extra: Any) -> dict[str, Any]:
    return {"verificationMode": "agent", "verifierAddress": who["verifier"].address, **extra}


async def listed_ids(api: Api) -> list[int]:
    return [item["taskId"] for item in (await api.call("GET", f"/v1/listings?chain={CHAIN_ID}")).json()["listings"]]


async def test_a_hosted_verifier_that_has_not_opted_in_is_refused_at_terms(api: Api, who: dict[str, Who]) -> None:
    """409 VERIFIER_NOT_OPTED_IN before anything is funded; an unregistered address may be named."""
    assert (await api.call("POST", "/v1/terms", terms_body(who["poster"], **agent_terms(who)), as_=who["poster"])).status_code == 201
    await register_executor(api, who["verifier"], opt_in=False)
    refused = await api.call("POST", "/v1/terms", terms_body(who["poster"], salt="2", **agent_terms(who)), as_=who["poster"])
    assert refused.status_code == 409 and code(refused) == "VERIFIER_NOT_OPTED_IN"
    await register_executor(api, who["verifier"], roles=("worker",), opt_in=True)
    refused = await api.call("POST", "/v1/terms", terms_body(who["poster"], salt="3", **agent_terms(who)), as_=who["poster"])
    assert code(refused) == "VERIFIER_NOT_OPTED_IN"  # opted in, but not a verifier
    await register_executor(api, who["verifier"], opt_in=True)
    assert (await api.call("POST", "/v1/terms", terms_body(who["poster"], salt="4", **agent_terms(who)), as_=who["poster"])).status_code == 201


async def test_listing_makes_a_task_visible_and_only_the_poster_lists(api: Api, chain: IndexedChain, who: dict[str, Who]) -> None:
    """Unlisted tasks are not shown; listing is the poster's signed step; listing twice answers 200."""
    digest = await register(api, who["poster"])
    assert code(await api.call("POST", listing_path(), as_=who["poster"])) == "TASK_NOT_FOUND"
    await chain.created(TASK, who["poster"].address, digest)
    assert await listed_ids(api) == []
    assert code(await api.call("POST", listing_path(), as_=who["stranger"])) == "NOT_POSTER"
    assert (await api.call("POST", listing_path())).status_code == 401
    first = await api.call("POST", listing_path(), as_=who["poster"])
    assert first.status_code == 201 and first.json()["taskHash"] == digest
    assert (await api.call("POST", listing_path(), as_=who["poster"])).status_code == 200
    assert await listed_ids(api) == [TASK]


async def test_a_verifier_other_than_the_one_on_chain_is_refused_at_listing(api: Api, chain: IndexedChain, who: dict[str, Who]) -> None:
    """createTaskWithVerifier named someone else (or nobody): 409 VERIFIER_MISMATCH, nothing listed."""
    digest = await register(api, who["poster"], **agent_terms(who))
    await chain.created(TASK, who["poster"].address, digest, verifier=who["stranger"].address)
    await chain.created(TASK + 1, who["poster"].address, digest)  # plain createTask
    for task_id in (TASK, TASK + 1):
        refused = await api.call("POST", listing_path(task_id), as_=who["poster"])
        assert refused.status_code == 409 and code(refused) == "VERIFIER_MISMATCH"
    manual = await register(api, who["poster"], salt="m")
    await chain.created(TASK + 2, who["poster"].address, manual, verifier=who["verifier"].address)
    assert code(await api.call("POST", listing_path(TASK + 2), as_=who["poster"])) == "VERIFIER_MISMATCH"
    assert await listed_ids(api) == []


async def test_a_verifier_off_the_task_chain_is_refused_at_listing_not_before(api: Api, chain: IndexedChain, who: dict[str, Who]) -> None:
    """Terms pass (it opted in); listing after funding is 409 VERIFIER_CHAIN_UNSUPPORTED."""
    await register_executor(api, who["verifier"], chains=(8453,))
    digest = await register(api, who["poster"], **agent_terms(who))
    await chain.created(TASK, who["poster"].address, digest, verifier=who["verifier"].address)
    refused = await api.call("POST", listing_path(), as_=who["poster"])
    assert refused.status_code == 409 and code(refused) == "VERIFIER_CHAIN_UNSUPPORTED"
    await register_executor(api, who["verifier"], chains=(8453, CHAIN_ID))
    assert (await api.call("POST", listing_path(), as_=who["poster"])).status_code == 201


async def test_a_private_brief_not_wrapped_to_the_verifier_is_refused_at_listing(api: Api, chain: IndexedChain, who: dict[str, Who]) -> None:
    """400 VERIFIER_NOT_WRAPPED until the brief's key is wrapped to the verifier too."""
    verifier = await register_executor(api, who["verifier"])
    worker = await register_executor(api, who["agent"], roles=("worker",))
    sealed = seal_brief("Review the refactor plan; list every risk.")
    digest = await register(api, who["poster"], private=True, instructionsDigest=sealed.digest, **agent_terms(who))
    await chain.created(TASK, who["poster"].address, digest, verifier=who["verifier"].address)
    assert code(await api.call("POST", listing_path(), as_=who["poster"])) == "BRIEF_REQUIRED"
    to_agent = {who["agent"].address: wrap_for(sealed.key, worker["encryptionPublicKey"], digest, who["agent"].address)}
    stored = await api.call("PUT", f"/v1/briefs/{digest}", {"ciphertext": b64(sealed.ciphertext), "wrappedKeys": to_agent}, as_=who["poster"])
    assert stored.status_code == 200, stored.text
    refused = await api.call("POST", listing_path(), as_=who["poster"])
    assert refused.status_code == 400 and code(refused) == "VERIFIER_NOT_WRAPPED"
    to_verifier = {who["verifier"].address: wrap_for(sealed.key, verifier["encryptionPublicKey"], digest, who["verifier"].address)}
    added = await api.call("PUT", f"/v1/briefs/{digest}", {"ciphertext": b64(sealed.ciphertext), "wrappedKeys": to_verifier}, as_=who["poster"])
    assert sorted(added.json()["readers"]) == sorted([who["agent"].address.lower(), who["verifier"].address.lower()])
    assert (await api.call("POST", listing_path(), as_=who["poster"])).status_code == 201


async def test_is_verifier_and_self_verification_as_before(api: Api, chain: IndexedChain, who: dict[str, Who]) -> None:
    """The verifier cannot do the work (403 IS_VERIFIER at finalize); the agent never judges itself (409 SELF_VERIFICATION)."""
    poster_self = await api.call("POST", "/v1/terms", terms_body(who["poster"], verificationMode="agent", verifierAddress=who["poster"].address), as_=who["poster"])
    assert poster_self.status_code == 409 and code(poster_self) == "SELF_VERIFICATION"
    digest = await register(api, who["poster"], **agent_terms(who))
    await chain.created(TASK, who["poster"].address, digest, verifier=who["verifier"].address)
    await chain.accepted(TASK, who["agent"].address)
    await chain.submitted(TASK, who["agent"].address, 1, result_hash("work"))
    finalize = await api.call("POST", finalize_path(), {"result": "work"}, as_=who["verifier"])
    assert finalize.status_code == 403 and code(finalize) == "IS_VERIFIER"
    report = {"attempt": 1, "evidenceHash": result_hash("work"), "outcome": "verdict", "passed": True, "score": 100}
    own = await api.call("POST", f"/v1/tasks/{CHAIN_ID}/{ESCROW}/{TASK}/verifier-report", report, as_=who["agent"])
    assert own.status_code == 409 and code(own) == "SELF_VERIFICATION"




async def test_listing_rechecks_the_named_verifier(api: Api, chain: IndexedChain, who: dict[str, Who], database_url: str) -> None:
    """Opted in when the terms were registered; at listing it has since opted out, become a worker only, or
    not been seen for a year: refused each time (the terms check alone listed all three)."""
    await register_executor(api, who["verifier"])
    digest = await register(api, who["poster"], **agent_terms(who))
    await chain.created(TASK, who["poster"].address, digest, verifier=who["verifier"].address)

    await register_executor(api, who["verifier"], opt_in=False)
    refused = await api.call("POST", listing_path(), as_=who["poster"])
    assert refused.status_code == 409 and code(refused) == "VERIFIER_NOT_OPTED_IN"
    await register_executor(api, who["verifier"], roles=("worker",))
    assert code(await api.call("POST", listing_path(), as_=who["poster"])) == "VERIFIER_NOT_OPTED_IN"

    await register_executor(api, who["verifier"])
    conn = await connect(database_url)
    try:
        await conn.execute(
            "UPDATE executors SET last_seen = now() - interval '365 days' WHERE address = $1", who["verifier"].address.lower()
        )
        stale = await api.call("POST", listing_path(), as_=who["poster"])
        assert stale.status_code == 409 and code(stale) == "VERIFIER_NOT_RUNNING"
        assert await listed_ids(api) == []
        assert (await api.call("POST", "/v1/executors/me/heartbeat", as_=who["verifier"])).status_code == 204
    finally:
        await conn.close()
    assert (await api.call("POST", listing_path(), as_=who["poster"])).status_code == 201
    assert await listed_ids(api) == [TASK]


JUNK_KEY = b64(b"\x02" + b"\xff" * 81)  # the right length and version, but no point of the curve


async def test_a_junk_wrapped_key_is_refused_on_upload_and_at_listing(
    api: Api, chain: IndexedChain, who: dict[str, Who], database_url: str
) -> None:
    """Junk bytes, a format-1 key or a format-1 ciphertext are refused on upload (400 BRIEF_INVALID); a junk
    key stored before the check is refused at listing (400 VERIFIER_KEY_MALFORMED) until it is replaced."""
    verifier = await register_executor(api, who["verifier"])
    sealed = seal_brief("Review the refactor plan; list every risk.")
    digest = await register(api, who["poster"], private=True, instructionsDigest=sealed.digest, **agent_terms(who))
    await chain.created(TASK, who["poster"].address, digest, verifier=who["verifier"].address)
    good = wrap_for(sealed.key, verifier["encryptionPublicKey"], digest, who["verifier"].address)
    format_one = b64(b"\x01" + b64_bytes(good)[1:] + b"\x00" * 12)  # format 1 was 94 bytes with a nonce
    for junk in (JUNK_KEY, format_one, b64(b"\x00" * 82), "not base64!"):
        body = {"ciphertext": b64(sealed.ciphertext), "wrappedKeys": {who["verifier"].address: junk}}
        refused = await api.call("PUT", f"/v1/briefs/{digest}", body, as_=who["poster"])
        assert refused.status_code == 400 and code(refused) == "BRIEF_INVALID", junk
    old_format = bytes([1]) + sealed.ciphertext[1:]
    other = await register(api, who["poster"], private=True, instructionsDigest="0x" + keccak(old_format).hex(), salt="v1", **agent_terms(who))
    refused = await api.call("PUT", f"/v1/briefs/{other}", {"ciphertext": b64(old_format)}, as_=who["poster"])
    assert refused.status_code == 400 and code(refused) == "BRIEF_INVALID"

    stored = await api.call("PUT", f"/v1/briefs/{digest}", {"ciphertext": b64(sealed.ciphertext)}, as_=who["poster"])
    assert stored.status_code == 200, stored.text
    conn = await connect(database_url)
    try:  # a key stored by an earlier version, which checked only its length
        await conn.execute("INSERT INTO brief_keys (task_hash, recipient, wrapped) VALUES ($1, $2, $3)", digest, who["verifier"].address.lower(), JUNK_KEY)
        with pytest.raises(asyncpg.CheckViolationError):  # 180_brief_format.sql: not even that length
            await conn.execute("INSERT INTO brief_keys (task_hash, recipient, wrapped) VALUES ($1, $2, 'AAAA')", digest, who["agent"].address.lower())
        with pytest.raises(asyncpg.CheckViolationError):  # nor a format-1 ciphertext
            await conn.execute("INSERT INTO task_briefs (task_hash, private, ciphertext) VALUES ($1, true, $2)", "0x" + "99" * 32, old_format)
    finally:
        await conn.close()
    refused = await api.call("POST", listing_path(), as_=who["poster"])
    assert refused.status_code == 400 and code(refused) == "VERIFIER_KEY_MALFORMED"
    body = {"ciphertext": b64(sealed.ciphertext), "wrappedKeys": {who["verifier"].address: good}}
    assert (await api.call("PUT", f"/v1/briefs/{digest}", body, as_=who["poster"])).status_code == 200
    assert (await api.call("POST", listing_path(), as_=who["poster"])).status_code == 201


def b64_bytes(text: str) -> bytes:
    import base64

    return base64.b64decode(text)
