"""The verification consumer on anvil + PostgreSQL + Kafka, through its real entry points.

Each test runs the real indexer, outbox publisher, the `IdempotentConsumer` with the
verification handler, the retry scheduler and the API (see `pipeline.py`).
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from escrowd.devnet import Devnet
from runtime.consumer import IdempotentConsumer
from runtime.eventlog import read_after
from runtime.kafka import cloudevent_headers, encode_headers, make_producer
from schemas.task_terms import result_hash
from schemas.verdict import recover_signer
from verification.consumer import VerificationHandler
from verification.signing import VerdictSigning

from .pipeline import SIGNER_ADDRESS, SIGNER_KEY, Pipeline, pipeline, wait_for

pytestmark = pytest.mark.timeout(180)

KEYWORD_CRITERIA = {"verificationMode": "auto", "verificationCriteria": {"contains_keywords": ["Paris"], "min_length": 20}}
GOOD = "The capital of France is Paris. It has been the capital for centuries and is its largest city."
BAD = ["The capital of France is Lyon, the old silk city on the Rhone.",
       "The capital of France is Marseille, on the Mediterranean coast.",
       "The capital of France is Nice, near Monaco and Italy."]  # fmt: skip


@pytest.fixture
async def run(devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str) -> AsyncIterator[Pipeline]:
    async with pipeline(devnet, database_url, kafka_bootstrap, topic_prefix) as p:
        yield p


def code(response: Any) -> str:
    return str(response.json()["error"]["code"])


async def test_auto_mode_fail_resubmit_pass_and_refusals(run: Pipeline) -> None:
    """Post, accept, submit, finalize: one signed verdict per attempt, with the full result; the
    chain closes the loop; a 4th result, a late result, another agent and a wrong hash are refused."""
    d = run.devnet
    poster, agent, other = d.posters[0], d.agents[0], d.agents[1]
    task = await run.post(poster, KEYWORD_CRITERIA, duration=3600)
    await run.chain(d.accept_task, task, sender=agent)

    await run.submit(task, agent, BAD[0])
    wrong_agent = await run.finalize(task, other, BAD[0])
    assert (wrong_agent.status_code, code(wrong_agent)) == (403, "NOT_TASK_AGENT")
    first = await run.finalize(task, agent, BAD[0])
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["status"] == "judged" and body["attempt"] == 1
    assert body["verificationResult"]["passed"] is False
    assert body["verificationResult"]["reasons"] == ["contains_keywords: 0%"]
    duplicate = await run.finalize(task, agent, BAD[0])  # a repeated finalize gets the same verdict
    assert duplicate.status_code == 200 and duplicate.json()["verificationResult"] == body["verificationResult"]

    await run.verdicts.wait(1)
    signed = run.verdicts.verdicts()[0]
    assert recover_signer(signed) == SIGNER_ADDRESS == signed.signer
    v = signed.verdict
    assert (v.chain_id, v.escrow, v.task_id, v.attempt, v.passed, v.mode) == (d.chain_id, d.escrow_address, task, 1, False, "auto")
    await run.settle(signed)  # the relayer's job: the chain records the fail
    row = await run.wait_result(task, 1)
    assert row["result"] == body["verificationResult"] and row["signed_verdict"]["signature"] == signed.signature

    async def settled() -> bool:
        r = await run.result_row(task, 1)
        return r is not None and r["settled_tx"] is not None

    await wait_for(settled, 30, "attempt 1 marked settled")

    evidence = await run.submit(task, agent, GOOD)
    mismatch = await run.finalize(task, agent, GOOD + " (edited)")
    assert (mismatch.status_code, code(mismatch)) == (409, "EVIDENCE_MISMATCH")
    second = await run.finalize(task, agent, GOOD)
    assert second.status_code == 200 and second.json()["verificationResult"]["passed"] is True
    assert second.json()["evidenceHash"] == evidence
    await run.verdicts.wait(2)
    assert [s.verdict.attempt for s in run.verdicts.verdicts()] == [1, 2]

    # A second task: three failed rounds, then a fourth result is refused; then one past its deadline.
    task2 = await run.post(poster, KEYWORD_CRITERIA, duration=3600)
    await run.chain(d.accept_task, task2, sender=agent)
    for attempt, result in enumerate(BAD, start=1):
        await run.submit(task2, agent, result)
        response = await run.finalize(task2, agent, result)
        assert response.status_code == 200 and response.json()["attempt"] == attempt
        await run.verdicts.wait(2 + attempt)
        await run.settle(run.verdicts.verdicts()[-1])
    await run.indexed()
    fourth = await run.finalize(task2, agent, GOOD)
    assert (fourth.status_code, code(fourth)) == (409, "MAX_ATTEMPTS_REACHED")

    task3 = await run.post(poster, KEYWORD_CRITERIA, duration=600)
    await run.chain(d.accept_task, task3, sender=agent)
    await run.submit(task3, agent, GOOD)
    await run.chain(d.increase_time, 601)
    await run.indexed()
    late = await run.finalize(task3, agent, GOOD)
    assert (late.status_code, code(late)) == (409, "DEADLINE_REACHED")
    assert len(run.verdicts.records) == 5  # nothing for the refused finalizes


async def test_redelivered_events_and_a_replaying_group_produce_no_second_verdict(run: Pipeline) -> None:
    """Events re-sent with their ids, and a brand-new consumer group reading every topic from the
    start, change nothing: still one verdict per attempt."""
    d = run.devnet
    task = await run.post(d.posters[0], KEYWORD_CRITERIA)
    await run.chain(d.accept_task, task, sender=d.agents[0])
    await run.submit(task, d.agents[0], GOOD)
    assert (await run.finalize(task, d.agents[0], GOOD)).status_code == 200
    await run.verdicts.wait(1)

    # Redeliver every event and request message as it was (same ids, same payloads): the
    # events as the publisher builds them from the indexer's log, the requests from the outbox.
    events = await read_after(run.conn, run.devnet.chain_id, 0, 100_000, line=None)
    requests = await run.conn.fetch(
        "SELECT topic, key, headers, payload FROM outbox WHERE topic = $1 ORDER BY seq", run.topics.requests
    )
    rows = [(run.topics.events, m.key, m.payload, m.headers) for m in events] + [
        (r["topic"], r["key"], r["payload"], encode_headers(dict(r["headers"]))) for r in requests
    ]
    assert len(rows) >= 4
    producer = make_producer(run.bootstrap)
    await producer.start()
    try:
        for topic, key, payload, headers in rows:
            await producer.send_and_wait(topic, payload, key=key, headers=headers)
    finally:
        await producer.stop()

    async def all_seen_twice() -> bool:
        duplicates = await run.conn.fetchval("SELECT count(*) FROM consumer_inbox WHERE consumer = $1", run.consumer.name)
        return bool(duplicates >= len(rows)) and run.consumer.processed >= len(rows)

    await wait_for(all_seen_twice, 30, "original messages processed")

    # A second group with its own inbox re-reads everything from offset 0.
    replay = IdempotentConsumer(
        name=f"{run.consumer.name}-replay", topics=[run.topics.events, run.topics.requests], bootstrap=run.bootstrap,
        database_url=run.database_url, dlq_topic=run.topics.dead_letters, session_timeout_ms=6000,
        handler=VerificationHandler(registry=run.registry, signing=VerdictSigning.from_key(SIGNER_KEY), topics=run.topics),
    )  # fmt: skip
    replay_task = asyncio.create_task(replay.run())
    try:
        async def replayed() -> bool:
            return replay.processed >= len(rows)

        await wait_for(replayed, 60, "replay group caught up")
    finally:
        replay.stop()
        await asyncio.wait_for(replay_task, 15)
    # Positive marker: everything handled has been published and read to the topic's end.
    assert len(await run.verdicts_drained()) == 1
    assert await run.conn.fetchval("SELECT count(*) FROM outbox WHERE topic = $1", run.topics.verdicts) == 1
    assert await run.conn.fetchval("SELECT count(*) FROM verification_results WHERE task_id = $1", task) == 1


async def test_manual_mode_review_reject_then_approve(run: Pipeline) -> None:
    """Finalize stores the result; the poster's reviews become signed verdicts, one per attempt."""
    d = run.devnet
    poster, agent = d.posters[1], d.agents[2]
    task = await run.post(poster, {"private": True})  # no mode: manual
    await run.chain(d.accept_task, task, sender=agent)
    await run.submit(task, agent, BAD[0])
    stored = await run.finalize(task, agent, BAD[0])
    assert stored.status_code == 202 and stored.json()["status"] == "awaiting_review"
    path = f"/v1/tasks/{d.chain_id}/{d.escrow_address}/{task}/review"
    first_review = {"attempt": 1, "evidenceHash": result_hash(BAD[0]), "passed": False, "reasons": ["Lyon is wrong"]}
    rejected = await run.api.call("POST", path, first_review, as_=run.who(poster))
    assert rejected.status_code == 202
    await run.verdicts.wait(1)
    first = run.verdicts.verdicts()[0]
    # A private task: the reasons stay off the verdicts topic (seed 000: they can quote the brief).
    assert (first.verdict.passed, first.verdict.score, first.verdict.mode, first.verdict.reasons) == (False, 0, "manual", [])
    await run.settle(first)
    await run.submit(task, agent, GOOD)
    await run.indexed()
    approved = await run.api.call("POST", path, {"attempt": 2, "evidenceHash": result_hash(GOOD), "passed": True}, as_=run.who(poster))
    assert approved.status_code == 202, approved.text
    await run.verdicts.wait(2)
    assert run.verdicts.verdicts()[1].verdict.passed is True
    results = await run.api.call("GET", f"/v1/tasks/{d.chain_id}/{d.escrow_address}/{task}/results")
    assert results.json()["results"] == [{"attempt": 1, "passed": False, "score": 0}, {"attempt": 2, "passed": True, "score": 100}]


async def test_agent_mode_records_the_verifiers_chain_verdict_and_counts_failures(run: Pipeline) -> None:
    """The named verifier's on-chain verdict is recorded; its report only if it matches; failures count."""
    d = run.devnet
    poster, agent, verifier = d.posters[2], d.agents[3], d.verifier_agents[0]
    terms = {"verificationMode": "agent", "verificationCriteria": {"acceptance": "Names the capital correctly."}}
    task = await run.post(poster, terms, verifier=verifier)
    await run.chain(d.accept_task, task, sender=agent)
    evidence = await run.submit(task, agent, GOOD)
    stored = await run.finalize(task, agent, GOOD)
    assert stored.status_code == 202 and stored.json()["status"] == "awaiting_verifier"
    report_path = f"/v1/tasks/{d.chain_id}/{d.escrow_address}/{task}/verifier-report"
    for _ in range(2):
        failed = await run.api.call("POST", report_path, {"attempt": 1, "evidenceHash": evidence, "outcome": "error",
                                                           "error": "model timeout"}, as_=run.who(verifier))  # fmt: skip
        assert failed.status_code == 202

    async def two_failures() -> bool:
        return bool(await run.conn.fetchval("SELECT failures FROM verifier_failures WHERE task_id = $1", task) == 2)

    await wait_for(two_failures, 30, "two failures counted")
    report = {"attempt": 1, "evidenceHash": evidence, "outcome": "verdict", "passed": True, "score": 88, "reasons": ["Paris is right"]}
    reported = await run.api.call("POST", report_path, report, as_=run.who(verifier))
    assert reported.status_code == 202
    await run.consumed(reported.json()["requestId"])  # the consumer has handled the report
    assert await run.result_row(task, 1) is None  # reported, but not on chain yet: not recorded
    await run.chain(d.complete_verification, task, 1, bytes.fromhex(evidence[2:]), True, 88, sender=verifier)
    row = await run.wait_result(task, 1, reported=True)
    assert (row["source"], row["passed"], row["score"], row["result"]["reasons"]) == ("agent", True, 88, ["Paris is right"])
    assert row["signed_verdict"] is None and run.verdicts.records == []  # the verifier signed on chain itself

    # Another task whose verifier never manages: after 5 failed tries it is delivered but never judged.
    task2 = await run.post(poster, terms, verifier=verifier)
    await run.chain(d.accept_task, task2, sender=agent)
    evidence2 = await run.submit(task2, agent, GOOD)
    await run.indexed()
    path2 = f"/v1/tasks/{d.chain_id}/{d.escrow_address}/{task2}/verifier-report"
    for _ in range(5):
        response = await run.api.call("POST", path2, {"attempt": 1, "evidenceHash": evidence2, "outcome": "error"}, as_=run.who(verifier))
        assert response.status_code == 202

    async def never_judged() -> bool:
        return bool(await run.conn.fetchval("SELECT never_judged FROM verifier_failures WHERE task_id = $1", task2))

    await wait_for(never_judged, 30, "never judged after 5 failures")
    view = await run.api.call("GET", f"/v1/tasks/{d.chain_id}/{d.escrow_address}/{task2}/results", as_=run.who(agent))
    assert view.json()["results"] == [{"attempt": 1, "status": "never_judged", "evidenceHash": evidence2}]


@pytest.fixture
async def flaky_endpoint() -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """An endpoint verifier that fails (503, then `{}`) until told to answer."""
    state: dict[str, Any] = {"mode": "down", "calls": 0}

    async def score(request: web.Request) -> web.Response:
        state["calls"] += 1
        if state["mode"] == "down":
            return web.json_response({"error": "busy"}, status=503)
        if state["mode"] == "empty":
            return web.json_response({})
        return web.json_response({"reward": 1.0})

    app = web.Application()
    app.router.add_post("/score", score)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/score", state
    finally:
        await runner.cleanup()


async def test_a_verifier_that_cannot_answer_is_retried_never_scored_zero(
    run: Pipeline, flaky_endpoint: tuple[str, dict[str, Any]]
) -> None:
    """Endpoint down, then answering `{}`: retries, no verdict; once it answers, one verdict. A plugin
    that fails to import: retrying, no verdict."""
    url, endpoint = flaky_endpoint
    d = run.devnet
    agent = d.agents[0]
    terms = {"verificationMode": "auto", "verifier": {"kind": "endpoint", "ref": url}}
    task = await run.post(d.posters[0], terms)
    await run.chain(d.accept_task, task, sender=agent)
    await run.submit(task, agent, GOOD)
    response = await run.finalize(task, agent, GOOD)
    assert response.status_code == 202 and response.json()["status"] == "retrying"

    async def retried(n: int) -> bool:
        return bool(endpoint["calls"] >= n)

    await wait_for(lambda: retried(2), 30, "two tries on the endpoint")
    endpoint["mode"] = "empty"
    calls = endpoint["calls"]
    await wait_for(lambda: retried(calls + 1), 30, "a try answered with {}")

    async def third_try_recorded() -> bool:
        # The endpoint counts a call before the consumer's transaction records its outcome.
        row = await run.conn.fetchrow("SELECT retry_count FROM verification_requests WHERE kind = 'finalize' AND task_id = $1", task)
        return row is not None and row["retry_count"] >= 3

    await wait_for(third_try_recorded, 30, "the third failed try recorded")
    row = await run.conn.fetchrow("SELECT state, retry_count, last_error FROM verification_requests WHERE kind = 'finalize' AND task_id = $1", task)
    assert row["state"] in ("waiting_retry", "retry_queued", "pending") and row["retry_count"] >= 3
    assert "no reward field" in row["last_error"] or "HTTP 503" in row["last_error"]
    assert run.verdicts.records == [] and await run.result_row(task, 1) is None
    endpoint["mode"] = "up"
    result = await run.wait_result(task, 1)
    assert (result["passed"], result["score"]) == (True, 100)
    await run.verdicts.wait(1)

    plugin_task = await run.post(d.posters[0], {"verificationMode": "auto", "verifier": {"kind": "plugin", "ref": "tests.verification.plugins.broken:score"}})
    await run.chain(d.accept_task, plugin_task, sender=agent)
    await run.submit(plugin_task, agent, GOOD)
    response = await run.finalize(plugin_task, agent, GOOD)
    assert response.status_code == 202 and response.json()["status"] == "retrying"
    row = await run.conn.fetchrow("SELECT last_error FROM verification_requests WHERE kind = 'finalize' AND task_id = $1", plugin_task)
    assert "plugin:tests.verification.plugins.broken:score" in row["last_error"] and "import failed" in row["last_error"]
    assert len(run.verdicts.records) == 1 and await run.result_row(plugin_task, 1) is None


async def test_poison_messages_go_to_the_dead_letter_topic_with_the_reason(run: Pipeline) -> None:
    """Not JSON, a request of the wrong shape, an event whose args do not fit the ABI: dead letters."""
    producer = make_producer(run.bootstrap)
    await producer.start()
    poison = [
        (run.topics.requests, b"{not json", "payload is not JSON"),
        (run.topics.requests, json.dumps({"kind": "finalize", "request_id": "x"}).encode(), "invalid payload"),
        (run.topics.events, json.dumps({
            "id": "31337:0xbad:0", "chain_id": 31337, "escrow_address": run.devnet.escrow_address, "block_number": 1,
            "block_hash": "0xbad", "block_timestamp": 1, "tx_hash": "0x1", "tx_index": 0, "log_index": 0,
            "event": "EvidenceSubmitted", "task_id": 1, "args": {"taskId": 1}, "removed": False,
        }).encode(), "args do not match the ABI"),
    ]  # fmt: skip
    try:
        for topic, payload, _ in poison:
            headers = cloudevent_headers(id=f"poison-{secrets.token_hex(4)}", source="test", type="test", subject=None, time=None)
            await producer.send_and_wait(topic, payload, key=b"31337:1", headers=encode_headers(headers))
    finally:
        await producer.stop()
    await run.dead_letters.wait(3, timeout=45)
    reasons = sorted(h["dlq_reason"] for h in run.dead_letters.headers())
    for (_, _, expected), reason in zip(sorted(poison, key=lambda p: p[2]), sorted(reasons), strict=True):
        assert expected in reason, reasons
    assert {r.value for r in run.dead_letters.records} == {p[1] for p in poison}
    assert await run.conn.fetchval("SELECT count(*) FROM dead_letters WHERE consumer = $1", run.consumer.name) == 3


async def test_a_retracted_submission_is_not_judged(run: Pipeline, flaky_endpoint: tuple[str, dict[str, Any]]) -> None:
    """A reorg removes the submission while its verifier is down: when the verifier is back, nothing is judged."""
    url, endpoint = flaky_endpoint
    d = run.devnet
    agent = d.agents[1]
    task = await run.post(d.posters[1], {"verificationMode": "auto", "verifier": {"kind": "endpoint", "ref": url}})
    await run.chain(d.accept_task, task, sender=agent)
    await run.submit(task, agent, GOOD)
    response = await run.finalize(task, agent, GOOD)
    assert response.status_code == 202 and response.json()["status"] == "retrying"
    await run.chain(d.reorg, 1)  # the submission's block is replaced by an empty one

    async def retracted() -> bool:
        return bool(await run.conn.fetchval(
            "SELECT removed FROM verification_chain_events WHERE task_id = $1 AND event_name = 'EvidenceSubmitted'", task
        ))

    await wait_for(retracted, 30, "the submission retracted")
    endpoint["mode"] = "up"
    calls = endpoint["calls"]

    async def finalize_state() -> tuple[str, str] | None:
        row = await run.conn.fetchrow(
            "SELECT request_id, state FROM verification_requests WHERE task_id = $1 AND kind = 'finalize'", task
        )
        return None if row is None else (row["request_id"], row["state"])

    async def no_retry_left() -> bool:
        found = await finalize_state()
        # 'waiting_retry' / 'retry_queued': a retry is still to come. Any other state is
        # reached only by handling the retry (or settling the request); from it no retry is
        # scheduled again, and 'pending' waits for a submission that no longer exists.
        return found is not None and found[1] not in ("waiting_retry", "retry_queued")

    # Positive markers: the request left its retry states, and every retry queued for it
    # has been handled by the consumer.
    await wait_for(no_retry_left, 30, "the retry of the finalize request handled")
    found = await finalize_state()
    assert found is not None
    queued = await run.conn.fetch(
        "SELECT message_id FROM outbox WHERE topic = $1 AND message_id LIKE $2", run.topics.requests, f"retry:{found[0]}:%"
    )
    for row in queued:
        await run.consumed(row["message_id"])
    assert endpoint["calls"] == calls  # nothing left to judge: the verifier is not even asked
    assert await run.result_row(task, 1) is None and run.verdicts.records == []



async def test_a_test_suite_verdict_comes_with_a_signed_proof_anyone_can_check(run: Pipeline, tmp_path: Any) -> None:
    """Code judged in the sandbox: the whole seed-002 proof is stored, served by GET .../proof, and
    `escrowd verify proof` accepts it for this escrow and refuses it for another escrow."""
    import subprocess
    import sys

    from verification import results_store as store

    d = run.devnet
    agent = d.agents[0]
    suite = {
        "kind": "test_suite", "ref": "TEST_SUITE://V1",
        "config": {"publicTests": [{"args": [1, 2], "expected": 3}], "hiddenTests": [{"args": [20, 22], "expected": 42}],
                   "timeLimitMs": 2000, "memoryMb": 128},
    }  # fmt: skip
    task = await run.post(d.posters[0], {"verificationMode": "auto", "verifier": suite})
    await run.chain(d.accept_task, task, sender=agent)
    solution = "import heapq\ndef solve(a, b):\n    return a + b\n"
    evidence = await run.submit(task, agent, solution)
    response = await run.finalize(task, agent, solution)
    assert response.status_code == 200, response.text
    row = await run.wait_result(task, 1, timeout=90)
    assert row["passed"] is True
    served = await run.api.call("GET", f"/v1/tasks/{d.chain_id}/{d.escrow_address}/{task}/proof")
    assert served.status_code == 200, served.text
    proof = served.json()
    assert proof["signer"] == SIGNER_ADDRESS
    assert {k: proof["proof"][k] for k in ("taskId", "attempt", "passed", "score", "publicTests", "hiddenTests", "resourceLimits")} == {
        "taskId": task, "attempt": 1, "passed": True, "score": 100,
        "publicTests": "1/1", "hiddenTests": "1/1", "resourceLimits": "PASS",
    }  # fmt: skip
    assert proof["proof"]["agent"] == agent.address and proof["proof"]["evidenceHash"] == evidence.lower()
    assert proof["proof"]["verifierId"] == "test_suite:TEST_SUITE://V1"
    task_hash = await run.conn.fetchval(
        "SELECT args->>'taskHash' FROM escrow_events WHERE task_id = $1 AND event_name = 'TaskCreated'", task
    )
    terms = await store.load_terms_json(run.conn, task_hash)
    assert terms is not None
    (tmp_path / "proof.json").write_text(json.dumps(proof))
    (tmp_path / "terms.json").write_text(json.dumps(terms))
    base = [sys.executable, "-m", "escrowd.cli", "verify", "proof", str(tmp_path / "proof.json"),
            "--signer", SIGNER_ADDRESS, "--chain-id", str(d.chain_id), "--evidence-hash", evidence,
            "--terms", str(tmp_path / "terms.json")]  # fmt: skip
    ok = await asyncio.to_thread(
        subprocess.run, [*base, "--escrow", d.escrow_address], capture_output=True, text=True, timeout=120
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    other = await asyncio.to_thread(
        subprocess.run, [*base, "--escrow", "0x" + "ee" * 20], capture_output=True, text=True, timeout=120
    )
    assert other.returncode == 1 and "escrow" in json.loads(other.stdout)["problems"][0]
    missing = await run.api.call("GET", f"/v1/tasks/{d.chain_id}/{d.escrow_address}/{task}/proof?attempt=2")
    assert missing.status_code == 404
