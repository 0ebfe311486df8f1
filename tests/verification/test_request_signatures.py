"""Signed requests against real `escrowd api serve` processes: bound to one deployment, one attempt, one use.

Reproduces issue 11's observations 6 (a refused signed review, replayed later, was accepted as
the rejection of an attempt its poster never saw) and 7 (one signed `POST /v1/terms` was
accepted by two deployments), then the replay rules across attempts, chains and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.services.ports import free_port, wait_for_port
from runtime.services.postgres import PostgresService
from runtime.web.auth import Deployment, UnsignedRequest, sign_request
from schemas.task_terms import result_hash
from tests.support.indexer_harness import escrowd_command

from .conftest import CHAIN_ID, ESCROW, Api, IndexedChain, Who

pytestmark = pytest.mark.timeout(180)

OTHER_ESCROW = "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512"
OTHER_CHAIN = 10_000
HOME = Deployment(CHAIN_ID, ESCROW)
TASK = 7


@contextlib.asynccontextmanager
async def second_database(admin: str) -> AsyncIterator[str]:
    """A fresh, migrated database beside the test's own: the second deployment's."""
    from urllib.parse import urlsplit, urlunsplit

    import asyncpg

    from runtime.db import migrate_url

    name = f"t_{secrets.token_hex(5)}"

    async def run(sql: str) -> None:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    await run(f'CREATE DATABASE "{name}"')
    parts = urlsplit(admin)
    url = urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))
    try:
        await migrate_url(url)
        yield url
    finally:
        await run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.asynccontextmanager
async def api_process(database_url: str, deployments: list[Deployment], **env: str) -> AsyncIterator[Api]:
    """`escrowd api serve` as a child process serving `deployments`, reached over HTTP."""
    port = free_port()
    values = {
        **os.environ,
        "ESCROWD_DATABASE_URL": database_url,
        "ESCROWD_API_PORT": str(port),
        "ESCROWD_DEPLOYMENTS": json.dumps([{"chain_id": d.chain_id, "escrow": d.escrow} for d in deployments]),
        "ESCROWD_EVIDENCE_WAIT_SECONDS": "0.3",
        "ESCROWD_FINALIZE_WAIT_SECONDS": "0.3",
        **env,
    }
    log = Path(tempfile.mkstemp(prefix="escrowd-api-", suffix=".log")[1])
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*escrowd_command(), "api", "serve", "--log-console"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=values,
        )  # fmt: skip
    try:
        await asyncio.to_thread(wait_for_port, port, timeout=60)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            yield Api(client)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        await asyncio.to_thread(log.unlink, missing_ok=True)


def code(response: Any) -> str:
    return str(response.json()["error"]["code"])


def terms_body(poster: Who, chain_id: int = CHAIN_ID, escrow: str = ESCROW, **extra: Any) -> dict[str, Any]:
    return {"chainId": chain_id, "escrow": escrow, "poster": poster.address, "instructionsDigest": "0x" + "ab" * 32, **extra}


def signed(who: Who, method: str, path: str, body: Any, deployment: Deployment, *, expires_in: int = 300) -> tuple[bytes, dict[str, str]]:
    """The exact bytes and headers of one signed request (to send, and to send again)."""
    raw = json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    headers.update(sign_request(who.key, UnsignedRequest(method, path, raw, deployment=deployment, expires_at=int(time.time()) + expires_in)))
    return raw, headers


async def send(api: Api, method: str, path: str, raw: bytes, headers: dict[str, str]) -> httpx.Response:
    response: httpx.Response = await api.client.request(method, path, content=raw, headers=headers)
    return response


def review_path(task_id: int = TASK, chain_id: int = CHAIN_ID, escrow: str = ESCROW) -> str:
    return f"/v1/tasks/{chain_id}/{escrow}/{task_id}/review"


def review_body(attempt: int, evidence: str, passed: bool = False) -> dict[str, Any]:
    return {"attempt": attempt, "evidenceHash": evidence, "passed": passed, "reasons": ["not what I asked for"]}


async def manual_task(api: Api, chain: IndexedChain, who: dict[str, Who], task_id: int = TASK) -> None:
    """Terms registered (manual), the task created and accepted on the indexed chain; nothing submitted."""
    response = await api.call("POST", "/v1/terms", terms_body(who["poster"], salt=f"t{task_id}"), as_=who["poster"])
    assert response.status_code == 201, response.text
    await chain.created(task_id, who["poster"].address, response.json()["taskHash"])
    await chain.accepted(task_id, who["agent"].address)


# ---------------------------------------------------------------------------- observation 7


async def test_one_signed_terms_request_is_valid_for_one_deployment_only(
    database_url: str, pg_service: PostgresService, who: dict[str, Who]
) -> None:
    """Two deployments (another escrow; the same escrow address on another chain): one signature, one deployment."""
    poster = who["poster"]
    body = terms_body(poster)
    raw, headers = signed(poster, "POST", "/v1/terms", body, HOME)
    other_escrow = Deployment(CHAIN_ID, OTHER_ESCROW)
    other_chain = Deployment(OTHER_CHAIN, ESCROW)
    async with (
        second_database(pg_service.admin_url) as other_db,
        api_process(database_url, [HOME]) as first,
        api_process(other_db, [other_escrow, other_chain]) as second,
    ):
        accepted = await send(first, "POST", "/v1/terms", raw, headers)
        assert accepted.status_code == 201, accepted.text
        # The same bytes to the other deployment: it does not serve what the request names.
        refused = await send(second, "POST", "/v1/terms", raw, headers)
        assert refused.status_code == 404 and code(refused) == "DEPLOYMENT_UNKNOWN", refused.text
        # Re-aimed at the deployments it serves, a signature made for the first one does not verify.
        for target in (other_escrow, other_chain):
            moved = json.dumps(terms_body(poster, target.chain_id, target.escrow)).encode()
            wrong_domain = sign_request(poster.key, UnsignedRequest("POST", "/v1/terms", moved, deployment=HOME, expires_at=int(time.time()) + 300))
            response = await send(second, "POST", "/v1/terms", moved, {"content-type": "application/json", **wrong_domain})
            assert response.status_code == 401 and code(response) == "SIGNATURE_INVALID", (target, response.text)
            right = await second.call("POST", "/v1/terms", terms_body(poster, target.chain_id, target.escrow), as_=poster)
            assert right.status_code == 201, right.text
    # The task routes name their deployment in the path; a signature for another domain fails there too.
    async with api_process(database_url, [HOME, other_chain]) as api:
        path = f"/v1/tasks/{OTHER_CHAIN}/{ESCROW}/{TASK}/results"
        wrong = sign_request(who["agent"].key, UnsignedRequest("GET", path, b"", deployment=HOME, expires_at=int(time.time()) + 300))
        response = await api.client.get(path, headers=wrong)
        assert response.status_code == 401 and code(response) == "SIGNATURE_INVALID"


# ---------------------------------------------------------------------------- observation 6


async def test_a_refused_signed_review_can_never_be_replayed(database_url: str, who: dict[str, Who]) -> None:
    """409 TASK_NOT_SUBMITTED spends the nonce: the same bytes after a submission are NONCE_REPLAYED."""
    chain = IndexedChain(database_url)
    poster = who["poster"]
    async with api_process(database_url, [HOME]) as api:
        await manual_task(api, chain, who)
        guess = result_hash("what the poster expected")
        raw, headers = signed(poster, "POST", review_path(), review_body(1, guess), HOME)
        refused = await send(api, "POST", review_path(), raw, headers)
        assert refused.status_code == 409 and code(refused) == "TASK_NOT_SUBMITTED", refused.text

        submitted = result_hash("what the agent delivered")
        await chain.submitted(TASK, who["agent"].address, 1, submitted)
        replayed = await send(api, "POST", review_path(), raw, headers)
        assert replayed.status_code == 409 and code(replayed) == "NONCE_REPLAYED", replayed.text
        # Re-signed (fresh nonce), the review still names evidence the poster never saw: refused.
        again = await api.call("POST", review_path(), review_body(1, guess), as_=poster)
        assert again.status_code == 409 and code(again) == "EVIDENCE_MISMATCH", again.text
        assert code(await api.call("POST", review_path(), review_body(2, submitted), as_=poster)) == "ATTEMPT_MISMATCH"
        # Every other refusal spends its nonce as well (403 here).
        raw, headers = signed(who["stranger"], "POST", review_path(), review_body(1, submitted), HOME)
        assert code(await send(api, "POST", review_path(), raw, headers)) == "NOT_POSTER"
        assert code(await send(api, "POST", review_path(), raw, headers)) == "NONCE_REPLAYED"
        # The review of what was really submitted is accepted, once.
        raw, headers = signed(poster, "POST", review_path(), review_body(1, submitted), HOME)
        accepted = await send(api, "POST", review_path(), raw, headers)
        assert accepted.status_code == 202 and accepted.json()["attempt"] == 1, accepted.text
        assert code(await send(api, "POST", review_path(), raw, headers)) == "NONCE_REPLAYED"


async def test_a_review_of_one_attempt_is_refused_for_the_next(database_url: str, who: dict[str, Who]) -> None:
    """Replay across attempts: attempt 1's rejection, re-sent after attempt 2, judges nothing."""
    chain = IndexedChain(database_url)
    poster, agent = who["poster"], who["agent"]
    async with api_process(database_url, [HOME]) as api:
        await manual_task(api, chain, who)
        first, second = result_hash("first delivery"), result_hash("second delivery")
        await chain.submitted(TASK, agent.address, 1, first)
        assert (await api.call("POST", review_path(), review_body(1, first), as_=poster)).status_code == 202
        await chain.judged(TASK, poster.address, agent.address, 1, first, False, 0)
        await chain.submitted(TASK, agent.address, 2, second)
        # The same decision, signed afresh, still names attempt 1.
        stale = await api.call("POST", review_path(), review_body(1, first), as_=poster)
        assert stale.status_code == 409 and code(stale) == "ATTEMPT_MISMATCH", stale.text
        # Attempt 2 with attempt 1's evidence is no better.
        assert code(await api.call("POST", review_path(), review_body(2, first), as_=poster)) == "EVIDENCE_MISMATCH"
        approved = await api.call("POST", review_path(), review_body(2, second, passed=True), as_=poster)
        assert approved.status_code == 202 and approved.json()["attempt"] == 2, approved.text


async def test_signatures_expire_and_live_at_most_the_configured_time(database_url: str, who: dict[str, Who]) -> None:
    """Replay across time: a captured request is refused once its expiry passes; expiries far ahead are refused."""
    poster = who["poster"]
    async with api_process(database_url, [HOME], ESCROWD_SIGNATURE_MAX_TTL_SECONDS="60") as api:
        raw, headers = signed(poster, "POST", "/v1/terms", terms_body(poster), HOME, expires_in=2)
        assert (await send(api, "POST", "/v1/terms", raw, headers)).status_code == 201
        answers: set[str] = set()
        deadline = time.monotonic() + 60
        while "SIGNATURE_EXPIRED" not in answers and time.monotonic() < deadline:
            answers.add(code(await send(api, "POST", "/v1/terms", raw, headers)))
            await asyncio.sleep(0.2)
        # Before the expiry the nonce is remembered, after it the signature is dead: never accepted.
        assert answers <= {"NONCE_REPLAYED", "SIGNATURE_EXPIRED"} and "SIGNATURE_EXPIRED" in answers, answers
        far = await api.call("POST", "/v1/terms", terms_body(poster, salt="far"), as_=poster, expires_in=120)
        assert far.status_code == 401 and code(far) == "SIGNATURE_EXPIRY_TOO_FAR"
        assert (await api.call("POST", "/v1/terms", terms_body(poster, salt="near"), as_=poster, expires_in=50)).status_code == 201


# ---------------------------------------------------------------------------- boundaries, as literals

NOW = 1_767_225_600  # 2026-01-01T00:00:00Z, the API's clock in the tests below


@contextlib.asynccontextmanager
async def api_at(database_url: str, now: int, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The real app, in process, whose clock stands still at `now`."""
    from api.app import create_app

    from .conftest import api_settings

    app = create_app(api_settings(database_url, **overrides), clock=lambda: float(now))
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        yield client


async def test_expiry_at_exactly_now_and_the_ttl_bound_are_exact(database_url: str, who: dict[str, Who]) -> None:
    """Refused at `expires_at == now` (and before), accepted one second later; accepted at exactly
    `now + max_ttl`, refused one second beyond it."""
    poster = who["poster"]
    answers: dict[int, tuple[int, str]] = {}
    async with api_at(database_url, NOW, signature_max_ttl_seconds=60) as client:
        for expires_at in (1_767_225_599, 1_767_225_600, 1_767_225_601, 1_767_225_660, 1_767_225_661):
            raw = json.dumps(terms_body(poster, salt=f"e{expires_at}")).encode()
            headers = {"content-type": "application/json"}
            headers.update(sign_request(poster.key, UnsignedRequest("POST", "/v1/terms", raw, deployment=HOME, expires_at=expires_at)))
            response = await client.post("/v1/terms", content=raw, headers=headers)
            answers[expires_at] = (response.status_code, response.json()["error"]["code"] if response.status_code >= 400 else "")
    assert answers == {
        1_767_225_599: (401, "SIGNATURE_EXPIRED"),
        1_767_225_600: (401, "SIGNATURE_EXPIRED"),
        1_767_225_601: (201, ""),
        1_767_225_660: (201, ""),
        1_767_225_661: (401, "SIGNATURE_EXPIRY_TOO_FAR"),
    }


async def test_a_request_signature_has_one_accepted_encoding(database_url: str, who: dict[str, Who]) -> None:
    """The v = 0/1 form and the high-s twin of a valid request signature are 401 (and spend no nonce);
    the signature itself is then accepted with the same nonce."""
    from eth_account import Account

    from schemas.request_auth import request_digest

    poster = who["poster"]
    n = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
    raw = json.dumps(terms_body(poster, salt="encodings")).encode()
    headers = {"content-type": "application/json"}
    headers.update(sign_request(poster.key, UnsignedRequest("POST", "/v1/terms", raw, deployment=HOME, expires_at=NOW + 60, nonce="enc-0001")))
    signature = bytes.fromhex(headers["X-Escrowd-Signature"][2:])
    s = int.from_bytes(signature[32:64], "big")
    others = {
        "v must be 27 or 28": signature[:64] + bytes([signature[64] - 27]),
        "not canonical": signature[:32] + (n - s).to_bytes(32, "big") + bytes([55 - signature[64]]),
    }
    digest = request_digest(HOME, "POST", "/v1/terms", raw, poster.address, "enc-0001", NOW + 60)
    async with api_at(database_url, NOW) as client:
        for reason, other in others.items():
            assert Account._recover_hash(digest, signature=other) == poster.address  # a real signature elsewhere
            refused = await client.post("/v1/terms", content=raw, headers={**headers, "X-Escrowd-Signature": "0x" + other.hex()})
            assert refused.status_code == 401 and code(refused) == "SIGNATURE_INVALID", refused.text
            assert reason in refused.json()["error"]["message"]
        accepted = await client.post("/v1/terms", content=raw, headers=headers)
        assert accepted.status_code == 201, accepted.text
