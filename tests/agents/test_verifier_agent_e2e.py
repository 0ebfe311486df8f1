"""`escrowd verifier-agent` as a real process on the real stack (anvil, indexer, PostgreSQL, Kafka,
verification consumer, the API over HTTP) against the local model endpoint: a private task end to end,
model faults that never become verdicts, the 5-try limit, and a slow model answer that holds up
no other task's verdict."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import uvicorn

from api.app import create_app
from escrowd.devnet import Actor, Devnet
from runtime.eventlog import read_after
from runtime.services.ports import free_port
from schemas.task_terms import result_hash
from tests.verification.conftest import api_settings
from tests.verification.pipeline import Pipeline, pipeline, wait_for
from verification.agents.briefs import KeyContext, b64, open_brief, seal_brief, unb64, unwrap_key
from verification.agents.stub_model import StubModel, start_stub

from .helpers import enc_secret, entry, wrap_for

pytestmark = pytest.mark.timeout(300)

SECRET_BRIEF = "CONFIDENTIAL brief 7b1e: name the capital of France and say why it matters."
ACCEPTANCE = 'The answer names "Paris".'
GOOD = "The capital of France is Paris, its political and cultural centre."


@pytest.fixture
async def run(devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str) -> AsyncIterator[Pipeline]:
    async with pipeline(devnet, database_url, kafka_bootstrap, topic_prefix) as p:
        yield p


@contextlib.asynccontextmanager
async def http_api(run: Pipeline) -> AsyncIterator[str]:
    """The API served over real HTTP (the verifier agent is another process)."""
    settings = api_settings(
        run.database_url, verification_requests_topic=run.topics.requests,
        deployments=[{"chain_id": run.devnet.chain_id, "escrow": run.devnet.escrow_address}],
    )  # fmt: skip
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_config=None, access_log=False))
    task = asyncio.create_task(server.serve())
    try:
        await wait_for(lambda: asyncio.sleep(0, result=server.started), 30, "API listening")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


@contextlib.asynccontextmanager
async def verifier_process(
    api_url: str, devnet: Devnet, verifier: Actor, model_url: str, log: Path, database_url: str,
    **overrides: str,
) -> AsyncIterator[subprocess.Popen[bytes]]:
    """`escrowd verifier-agent` as a process; `overrides`: environment variables set on top."""
    env = {
        **os.environ,
        "ESCROWD_VERIFIER_DATABASE_URL": database_url,
        "ESCROWD_VERIFIER_API_URL": api_url,
        "ESCROWD_VERIFIER_RPC_URL": devnet.rpc_url,
        "ESCROWD_VERIFIER_CHAIN_ID": str(devnet.chain_id),
        "ESCROWD_VERIFIER_ESCROW_ADDRESS": devnet.escrow_address,
        "ESCROWD_VERIFIER_WALLET_KEY": verifier.private_key,
        "ESCROWD_VERIFIER_POLL_SECONDS": "0.3",
        "ESCROWD_MODEL_URL": model_url,
        "ESCROWD_MODEL_NAME": "stub-judge",
        "ESCROWD_MODEL_TIMEOUT_SECONDS": "1",
        "ESCROWD_MODEL_ATTEMPTS": "1",
        **overrides,
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "escrowd.cli", "verifier-agent", "--no-log-json"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def model_saw(stub: StubModel, text: str) -> int:
    """How many model requests carried `text` in their data."""
    count = 0
    for request in stub.requests:
        user = request["messages"][-1]["content"]
        data = json.loads(user.partition("<<<DATA>>>")[2])
        count += any(text in str(value) for value in data.values())
    return count


async def post_private(run: Pipeline, poster: Actor, agent: Actor, verifier: Actor, verifier_key: str, salt: str) -> tuple[int, str]:
    """Seal the brief, register private agent-review terms, post with the verifier, store the brief, list."""
    d = run.devnet
    sealed = seal_brief(SECRET_BRIEF)
    body = {
        "chainId": d.chain_id, "escrow": d.escrow_address, "poster": poster.address, "instructionsDigest": sealed.digest,
        "verificationMode": "agent", "verifierAddress": verifier.address, "private": True, "salt": salt,
        "verificationCriteria": {"acceptance": ACCEPTANCE},
    }  # fmt: skip
    registered = await run.api.call("POST", "/v1/terms", body, as_=run.who(poster))
    assert registered.status_code == 201, registered.text
    digest = registered.json()["taskHash"]
    task = int(await run.chain(d.post_task, poster, verifier=verifier, task_hash=bytes.fromhex(digest[2:])))
    keys = {
        agent.address: wrap_for(sealed.key, entry(run.who(agent))["encryptionPublicKey"], digest, agent.address, escrow=d.escrow_address),
        verifier.address: wrap_for(sealed.key, verifier_key, digest, verifier.address, escrow=d.escrow_address),
    }
    stored = await run.api.call("PUT", f"/v1/briefs/{digest}", {"ciphertext": b64(sealed.ciphertext), "wrappedKeys": keys}, as_=run.who(poster))
    assert stored.status_code == 200, stored.text
    await run.indexed()
    listed = await run.api.call("POST", f"/v1/tasks/{d.chain_id}/{d.escrow_address}/{task}/listing", as_=run.who(poster))
    assert listed.status_code == 201, listed.text
    return task, digest


async def deliver(run: Pipeline, task: int, agent: Actor, result: str) -> str:
    d = run.devnet
    await run.chain(d.accept_task, task, sender=agent)
    evidence = await run.submit(task, agent, result)
    response = await run.finalize(task, agent, result)
    assert response.status_code == 202 and response.json()["status"] == "awaiting_verifier", response.text
    return evidence


async def test_private_task_judged_by_the_verifier_agent_process(run: Pipeline, tmp_path: Path) -> None:
    d = run.devnet
    poster, agent, verifier = d.posters[0], d.agents[0], d.verifier_agents[0]
    stub = StubModel(slow_seconds=3.0)
    runner, model_url = await start_stub(stub)
    try:
        async with http_api(run) as api_url, verifier_process(
            api_url, d, verifier, model_url, tmp_path / "verifier.log", run.database_url
        ) as proc:
            # The agent registers as a worker; the verifier agent registers itself and shows up as qualifying.
            assert (await run.api.call("PUT", "/v1/executors/me", entry(run.who(agent), roles=("worker",)), as_=run.who(agent))).status_code == 201

            async def verifier_listed() -> bool:
                found = (await run.api.call("GET", f"/v1/executors?role=verifier&chain={d.chain_id}")).json()["executors"]
                return any(e["address"] == verifier.address for e in found)

            await wait_for(verifier_listed, 60, "the verifier agent registered")
            assert proc.poll() is None
            found = (await run.api.call("GET", f"/v1/executors?role=verifier&chain={d.chain_id}")).json()["executors"]
            verifier_key = next(e["encryptionPublicKey"] for e in found if e["address"] == verifier.address)

            # 1. A private task, judged end to end; faults first: malformed, 500, timeout never become verdicts.
            stub.script("malformed", "error_500", "slow")
            task, digest = await post_private(run, poster, agent, verifier, verifier_key, "one")
            got = (await run.api.call("GET", f"/v1/briefs/{digest}", as_=run.who(agent))).json()
            context = KeyContext(d.chain_id, d.escrow_address, digest, agent.address)
            assert open_brief(unb64(got["ciphertext"], 10**6), unwrap_key(unb64(got["wrappedKey"], 200), enc_secret(run.who(agent)), context)) == SECRET_BRIEF
            evidence = await deliver(run, task, agent, GOOD)
            row = await run.wait_result(task, 1, timeout=120, reported=True)
            assert (row["source"], row["passed"], row["score"]) == ("agent", True, 100)
            assert row["result"]["reasons"] == ["Every acceptance term is addressed"]
            failures = await run.conn.fetchval("SELECT failures FROM verifier_failures WHERE task_id = $1", task)
            assert failures == 3  # three faults counted, none judged
            completed = await run.conn.fetch(
                "SELECT args FROM escrow_events WHERE task_id = $1 AND event_name = 'VerificationCompleted'", task
            )
            assert len(completed) == 1  # one verdict on chain, the pass, from the verifier's own wallet
            args = completed[0]["args"]
            assert str(args["verifier"]).lower() == verifier.address.lower() and args["passed"] is True
            assert str(args["evidenceHash"]).lower() == evidence
            assert model_saw(stub, SECRET_BRIEF) == 4 and model_saw(stub, ACCEPTANCE) == 4  # it decrypted the brief

            # Unreadable to others: anonymous and strangers get no brief; no topic carries it.
            assert (await run.api.call("GET", f"/v1/briefs/{digest}")).status_code == 401
            assert (await run.api.call("GET", f"/v1/briefs/{digest}", as_=run.who(d.agents[1]))).status_code == 403
            for path in (f"/v1/terms/{digest}", "/v1/listings", f"/v1/tasks/{d.chain_id}/{d.escrow_address}/{task}/results"):
                response = await run.api.call("GET", path)
                assert response.status_code == 200 and "CONFIDENTIAL" not in response.text
            # Every message published: outbox rows, and the chain events of the indexer's log.
            payloads = [bytes(p["payload"]) for p in await run.conn.fetch("SELECT payload FROM outbox")]
            payloads += [m.payload for m in await read_after(run.conn, d.chain_id, 0, 100_000, line=None)]
            assert payloads and all(b"CONFIDENTIAL" not in p for p in payloads)

            # 2. Five failed tries: delivered but never judged, and the agent stops asking.
            stub.script("malformed", "malformed", "malformed", "malformed", "malformed")
            doomed, _ = await post_private(run, poster, d.agents[1], verifier, verifier_key, "two")
            doomed_result = "Answer of the doomed task: Paris."
            await deliver(run, doomed, d.agents[1], doomed_result)

            async def never_judged() -> bool:
                return bool(await run.conn.fetchval("SELECT never_judged FROM verifier_failures WHERE task_id = $1", doomed))

            await wait_for(never_judged, 120, "never judged after 5 failed tries")
            view = await run.api.call("GET", f"/v1/tasks/{d.chain_id}/{d.escrow_address}/{doomed}/results", as_=run.who(d.agents[1]))
            assert view.json()["results"][0]["status"] == "never_judged"

            # A later task is judged: the agent polled again since, and never asked about the doomed one.
            later, _ = await post_private(run, poster, d.agents[2], verifier, verifier_key, "three")
            await deliver(run, later, d.agents[2], "Paris, of course.")
            later_row = await run.wait_result(later, 1, timeout=120, reported=True)
            assert later_row["passed"] is True
            assert model_saw(stub, doomed_result) == 5
            assert await run.conn.fetchval(
                "SELECT count(*) FROM escrow_events WHERE task_id = $1 AND event_name = 'VerificationCompleted'", doomed
            ) == 0
            assert proc.poll() is None
    finally:
        await runner.cleanup()
    assert result_hash(GOOD) == evidence




async def test_a_slow_model_answer_holds_up_no_other_tasks_verdict(run: Pipeline, tmp_path: Path) -> None:
    d = run.devnet
    poster, verifier = d.posters[0], d.verifier_agents[0]
    slow_agent, fast_agent = d.agents[0], d.agents[1]
    stub = StubModel()
    runner, model_url = await start_stub(stub)
    count_before = int(await run.chain(d.rpc, "eth_getTransactionCount", verifier.address, "latest"), 16)
    try:
        async with http_api(run) as api_url, verifier_process(
            api_url, d, verifier, model_url, tmp_path / "verifier.log", run.database_url,
            ESCROWD_MODEL_TIMEOUT_SECONDS="280", ESCROWD_VERIFIER_JUDGE_CONCURRENCY="4",
        ) as proc:  # fmt: skip
            for worker in (slow_agent, fast_agent):
                registered = await run.api.call("PUT", "/v1/executors/me", entry(run.who(worker), roles=("worker",)), as_=run.who(worker))
                assert registered.status_code == 201, registered.text

            async def verifier_key() -> str | None:
                found = (await run.api.call("GET", f"/v1/executors?role=verifier&chain={d.chain_id}")).json()["executors"]
                return next((e["encryptionPublicKey"] for e in found if e["address"] == verifier.address), None)

            async def verifier_listed() -> bool:
                return await verifier_key() is not None

            await wait_for(verifier_listed, 60, "the verifier agent registered")
            key = await verifier_key()
            assert key is not None

            # The first task's model call is answered only when the test says so.
            stub.script("held")
            slow, _ = await post_private(run, poster, slow_agent, verifier, key, "slow")
            await deliver(run, slow, slow_agent, GOOD)
            await wait_for(lambda: asyncio.sleep(0, result=stub.holding == 1), 120, "the slow task's model call open")

            # A task delivered while that call is open is judged, confirmed and reported meanwhile.
            fast, _ = await post_private(run, poster, fast_agent, verifier, key, "fast")
            await deliver(run, fast, fast_agent, "Paris.")
            fast_row = await run.wait_result(fast, 1, timeout=120, reported=True)
            assert fast_row["passed"] is True
            assert stub.holding == 1  # the slow judgement is still waiting on its model
            assert await run.conn.fetchval(
                "SELECT count(*) FROM escrow_events WHERE task_id = $1 AND event_name = 'VerificationCompleted'", slow
            ) == 0

            stub.release.set()
            slow_row = await run.wait_result(slow, 1, timeout=120, reported=True)
            assert slow_row["passed"] is True
            assert proc.poll() is None
    finally:
        stub.release.set()
        await runner.cleanup()
    # Each verdict landed once, the fast one first, from the verifier's wallet at consecutive nonces.
    events = await run.conn.fetch(
        "SELECT task_id, block_number, args FROM escrow_events WHERE event_name = 'VerificationCompleted'"
        " AND task_id = ANY($1::bigint[]) ORDER BY block_number, log_index", [slow, fast])
    assert [int(e["task_id"]) for e in events] == [fast, slow]
    assert all(str(e["args"]["verifier"]).lower() == verifier.address.lower() for e in events)
    sent = await run.conn.fetch(
        "SELECT nonce, kind, state FROM settlement_transactions WHERE sender = $1 AND nonce >= $2 ORDER BY nonce",
        verifier.address.lower(), count_before)
    assert [(s["nonce"], s["kind"], s["state"]) for s in sent] == [
        (count_before, "call", "confirmed"), (count_before + 1, "call", "confirmed")]
    count_after = int(await run.chain(d.rpc, "eth_getTransactionCount", verifier.address, "latest"), 16)
    assert count_after == count_before + 2  # one transaction per verdict, nothing else
    assert len(stub.requests) == 2  # each task asked about once
