"""Requests on Kafka are authenticated end to end (issue 11, observation 8).

The real stack (anvil, indexer, PostgreSQL, Kafka, the verification consumer, the API): forged
and unsigned review messages written straight to the requests topic produce no verdict and
are dead-lettered with the reason; the poster's real review, relayed by the API with its
signature, is judged; a message vouched for by a trusted API service key is judged too.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account

from escrowd.devnet import Devnet
from runtime.db import connect
from runtime.kafka import encode_headers, make_producer
from schemas import jsoncodec
from schemas.request_auth import Deployment, UnsignedRequest, requester_proof, sign_request
from schemas.task_terms import ReviewSubmitted, parse_request_message, result_hash
from tests.support.indexer_harness import escrowd_command
from verification.consumer import request_message
from verification.request_auth import (
    RequestNotTrusted,
    authenticate,
    request_id_for,
    resolved,
    service_problem,
    service_proof,
)

from .conftest import CHAIN_ID, ESCROW, IndexedChain, Who, api_settings, running_api
from .pipeline import Pipeline, pipeline

pytestmark = pytest.mark.timeout(240)

SERVICE_KEY = "0x" + "5e" * 32
SERVICE = Account.from_key(SERVICE_KEY).address
UNTRUSTED_KEY = "0x" + "6f" * 32
TASK = 7
FIRST = "The capital of France is Lyon, the old silk city on the Rhone."
SECOND = "The capital of France is Paris. It has been the capital for centuries and is its largest city."


@pytest.fixture
async def run(devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str) -> AsyncIterator[Pipeline]:
    async with pipeline(
        devnet, database_url, kafka_bootstrap, topic_prefix,
        trusted_api_signers=frozenset({SERVICE}), api_service_key=SERVICE_KEY,
    ) as p:  # fmt: skip
        yield p


def review(run: Pipeline, task: int, attempt: int, evidence: str, actor: str, passed: bool, reasons: list[str]) -> ReviewSubmitted:
    d = run.devnet
    return ReviewSubmitted(
        request_id=request_id_for("review", d.chain_id, d.escrow_address, task, attempt, evidence),
        chain_id=d.chain_id, escrow_address=d.escrow_address, task_id=task, attempt=attempt, evidence_hash=evidence,
        actor=actor, requested_at=int(time.time()), passed=passed, reasons=reasons,
    )  # fmt: skip


def signed_proof(who: Who, run: Pipeline, task: int, body: dict[str, Any], deployment: Deployment | None = None) -> Any:
    """The proof the API would relay for `who`'s signed review of `task` (signed for `deployment`)."""
    d = run.devnet
    path = f"/v1/tasks/{d.chain_id}/{d.escrow_address}/{task}/review"
    raw = json.dumps(body).encode()
    headers = sign_request(
        who.key, UnsignedRequest("POST", path, raw, deployment=deployment or Deployment(d.chain_id, d.escrow_address),
        expires_at=int(time.time()) + 300)
    )  # fmt: skip
    return requester_proof("POST", path, raw, headers["X-Escrowd-Signer"], headers["X-Escrowd-Nonce"],
                           int(headers["X-Escrowd-Expires-At"]), headers["X-Escrowd-Signature"])  # fmt: skip


async def write(run: Pipeline, messages: list[ReviewSubmitted]) -> None:
    """Straight to the requests topic, as anyone with write access to it could."""
    producer = make_producer(run.bootstrap)
    await producer.start()
    try:
        for message in messages:
            row = request_message(message, run.topics.requests)
            await producer.send_and_wait(row.topic, row.payload, key=row.key, headers=encode_headers(dict(row.headers)))
    finally:
        await producer.stop()


async def test_forged_and_unsigned_requests_are_dead_lettered_and_real_ones_judged(run: Pipeline) -> None:
    d = run.devnet
    poster, agent, stranger = d.posters[0], d.agents[0], d.agents[3]
    task = await run.post(poster, {"verificationMode": "manual"})
    await run.chain(d.accept_task, task, sender=agent)
    evidence = await run.submit(task, agent, FIRST)
    await run.indexed()

    approve = {"attempt": 1, "evidenceHash": evidence, "passed": True, "reasons": []}
    reject = {"attempt": 1, "evidenceHash": evidence, "passed": False, "reasons": ["Lyon is wrong"]}
    unsigned = review(run, task, 1, evidence, poster.address, True, [])
    impostor = signed_proof(run.who(stranger), run, task, approve).model_copy(update={"signer": poster.address})
    tampered = signed_proof(run.who(poster), run, task, reject)  # the poster rejected; the message says approved
    other_chain = signed_proof(run.who(poster), run, task, approve, Deployment(d.chain_id + 1, d.escrow_address))
    untrusted = service_proof(unsigned, UNTRUSTED_KEY)
    honest = signed_proof(run.who(poster), run, task, approve)
    moved_expiry = honest.model_copy(update={"expires_at": honest.expires_at + 3600})  # a relay giving it longer life
    raw_signature = bytes.fromhex(honest.signature[2:])
    bare_v = honest.model_copy(update={"signature": "0x" + (raw_signature[:64] + bytes([raw_signature[64] - 27])).hex()})
    forged = [
        (unsigned, "unsigned request"),
        (unsigned.model_copy(update={"requester": impostor}), "not the signer's over this request"),
        (unsigned.model_copy(update={"requester": tampered}), "decision is not the signed one"),
        (unsigned.model_copy(update={"requester": other_chain}), "not the signer's over this request"),
        (unsigned.model_copy(update={"service": untrusted}), "is not a trusted API service key"),
        (unsigned.model_copy(update={"requester": moved_expiry}), "not the signer's over this request"),
        (unsigned.model_copy(update={"requester": bare_v}), "v must be 27 or 28"),
    ]
    await write(run, [m for m, _ in forged])
    await run.dead_letters.wait(len(forged), timeout=60)
    reasons = [h["dlq_reason"] for h in run.dead_letters.headers()]
    for (_, expected), reason in zip(forged, reasons, strict=True):
        assert reason.startswith("request not trusted:") and expected in reason, reasons
    # Same key, same partition, in order: every forged message has been handled, and none judged.
    assert run.verdicts.records == [] and await run.result_row(task, 1) is None

    # The poster's own review through the API: relayed with its signature (and the service's), judged.
    path = f"/v1/tasks/{d.chain_id}/{d.escrow_address}/{task}/review"
    response = await run.api.call("POST", path, reject, as_=run.who(poster))
    assert response.status_code == 202, response.text
    await run.verdicts.wait(1, timeout=60)
    (verdict,) = run.verdicts.verdicts()
    assert (verdict.verdict.attempt, verdict.verdict.passed, verdict.verdict.reasons) == (1, False, ["Lyon is wrong"])
    payload = await run.conn.fetchval(
        "SELECT payload FROM outbox WHERE topic = $1 AND message_id LIKE $2", run.topics.requests,
        response.json()["requestId"] + "#%",
    )
    relayed = parse_request_message(jsoncodec.loads(bytes(payload)))
    assert relayed.requester is not None and relayed.service is not None
    assert authenticate(relayed, frozenset()) == "requester"  # no service trust needed
    # The service signature covers the whole message, the requester's proof included.
    assert service_problem(relayed, relayed.service, frozenset({SERVICE})) is None
    assert service_problem(relayed.model_copy(update={"requester": None}), relayed.service, frozenset({SERVICE})) is not None

    # A message vouched for by the trusted API service key alone is judged too.
    await run.settle(verdict)
    second = await run.submit(task, agent, SECOND)
    await run.indexed()
    vouched = review(run, task, 2, second, poster.address, True, [])
    await write(run, [vouched.model_copy(update={"service": service_proof(vouched, SERVICE_KEY)})])
    await run.verdicts.wait(2, timeout=60)
    assert run.verdicts.verdicts()[1].verdict.passed is True and run.verdicts.verdicts()[1].verdict.attempt == 2
    assert len(run.dead_letters.records) == len(forged)
    assert run.verdicts.verdicts()[1].verdict.evidence_hash == result_hash(SECOND)


def test_the_verdict_key_can_never_vouch_for_requests() -> None:
    """The service refuses to start when its verdict-signing key is also a trusted API signer."""
    from verification.service import (
        SigningKeyError,
        VerificationSettings,
        build_consumer,
        build_handler,
    )

    verdict_key = "0x" + "7a" * 32
    settings = VerificationSettings(
        database_url="postgresql://unused/x", kafka_bootstrap="unused:9092",
        trusted_api_signers=[Account.from_key(verdict_key).address.lower(), SERVICE],
    )  # fmt: skip
    with pytest.raises(SigningKeyError, match="must not hold the verdict-signing key"):
        build_consumer(settings, build_handler(settings, signing_key=verdict_key))
    allowed = settings.model_copy(update={"trusted_api_signers": [SERVICE]})
    assert build_consumer(allowed, build_handler(allowed, signing_key=verdict_key)) is not None
    with pytest.raises(ValueError, match="not an address"):
        VerificationSettings(database_url="postgresql://unused/x", kafka_bootstrap="unused:9092", trusted_api_signers=["nope"])


# ---------------------------------------------------------------------------- a real consumer process


class ConsumerProcess:
    """`escrowd consume verification run` as a child process (its own outbox publisher included)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = {**os.environ, **env}
        self.log = Path(tempfile.mkstemp(prefix="escrowd-verification-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*escrowd_command(), "consume", "verification", "run", "--log-console"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=self.env,
            )  # fmt: skip

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.log.unlink(missing_ok=True)

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")[-3000:]


async def wait_until(predicate: Any, what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s")
        await asyncio.sleep(0.2)


async def test_a_consumer_process_dead_letters_forged_requests_across_a_kill(
    database_url: str, kafka_bootstrap: str, topic_prefix: str, who: dict[str, Who]
) -> None:
    """A real consumer process: forged reviews on the topic are dead-lettered, never judged, and stay so after kill -9."""
    t = {
        "events": f"{topic_prefix}escrow.events.v1", "requests": f"{topic_prefix}escrow.verification-requests.v1",
        "verdicts": f"{topic_prefix}escrow.verdicts.v1", "dlq": f"{topic_prefix}escrow.dlq.v1",
    }  # fmt: skip
    group = f"{topic_prefix}verification"
    consumer = ConsumerProcess({
        "ESCROWD_DATABASE_URL": database_url, "ESCROWD_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "ESCROWD_VERIFICATION_GROUP": group, "ESCROWD_EVENTS_TOPIC": t["events"],
        "ESCROWD_VERIFICATION_REQUESTS_TOPIC": t["requests"], "ESCROWD_VERDICTS_TOPIC": t["verdicts"],
        "ESCROWD_DEAD_LETTER_TOPIC": t["dlq"], "ESCROWD_TOPIC_PARTITIONS": "2",
        "ESCROWD_VERIFICATION_SIGNING_KEY": "0x" + "3c" * 32, "ESCROWD_TRUSTED_API_SIGNERS": json.dumps([SERVICE]),
    })  # fmt: skip
    poster, agent, stranger = who["poster"], who["agent"], who["stranger"]
    chain = IndexedChain(database_url, topic=t["events"])
    settings = api_settings(database_url, verification_requests_topic=t["requests"])
    conn = await connect(database_url)
    consumer.start()
    try:
        async with running_api(settings) as api:
            registered = await api.call("POST", "/v1/terms", {
                "chainId": CHAIN_ID, "escrow": ESCROW, "poster": poster.address, "instructionsDigest": "0x" + "ab" * 32,
            }, as_=poster)  # fmt: skip
            assert registered.status_code == 201, registered.text
            await chain.created(TASK, poster.address, registered.json()["taskHash"])
            await chain.accepted(TASK, agent.address)
            evidence = result_hash("the delivered work")
            await chain.submitted(TASK, agent.address, 1, evidence)
            path = f"/v1/tasks/{CHAIN_ID}/{ESCROW}/{TASK}/review"
            approve = {"attempt": 1, "evidenceHash": evidence, "passed": True, "reasons": []}
            base = ReviewSubmitted(
                request_id=request_id_for("review", CHAIN_ID, ESCROW, TASK, 1, evidence), chain_id=CHAIN_ID,
                escrow_address=ESCROW, task_id=TASK, attempt=1, evidence_hash=evidence, actor=poster.address,
                requested_at=int(time.time()), passed=True,
            )  # fmt: skip
            raw = json.dumps(approve).encode()
            stolen = sign_request(stranger.key, UnsignedRequest("POST", path, raw, deployment=Deployment(CHAIN_ID, ESCROW),
                                  expires_at=int(time.time()) + 300))  # fmt: skip
            impostor = requester_proof("POST", path, raw, poster.address, stolen["X-Escrowd-Nonce"],
                                       int(stolen["X-Escrowd-Expires-At"]), stolen["X-Escrowd-Signature"])  # fmt: skip
            forged = [base, base.model_copy(update={"requester": impostor}),
                      base.model_copy(update={"service": service_proof(base, UNTRUSTED_KEY)})]  # fmt: skip
            producer = make_producer(kafka_bootstrap)
            await producer.start()
            try:
                for message in forged:
                    row = request_message(message, t["requests"])
                    await producer.send_and_wait(row.topic, row.payload, key=row.key, headers=encode_headers(dict(row.headers)))
            finally:
                await producer.stop()

            async def dead() -> bool:
                return int(await conn.fetchval("SELECT count(*) FROM dead_letters WHERE consumer = $1", group)) >= len(forged)

            await wait_until(dead, "three dead letters")
            reasons = [r["reason"] for r in await conn.fetch("SELECT reason FROM dead_letters WHERE consumer = $1 ORDER BY id", group)]
            assert all(r.startswith("request not trusted:") for r in reasons), reasons
            assert "unsigned request" in reasons[0] and "not the signer's" in reasons[1] and "not a trusted API service key" in reasons[2]
            assert await conn.fetchval("SELECT count(*) FROM verification_results WHERE task_id = $1", TASK) == 0

            consumer.kill9()
            consumer.start()
            # The poster's own review, relayed by the API, is judged by the restarted process.
            reject = {"attempt": 1, "evidenceHash": evidence, "passed": False, "reasons": ["not what I asked for"]}
            assert (await api.call("POST", path, reject, as_=poster)).status_code == 202

            async def judged() -> bool:
                return await conn.fetchval("SELECT count(*) FROM verification_results WHERE task_id = $1", TASK) == 1

            await wait_until(judged, "the real review judged")
            row = await conn.fetchrow("SELECT passed, source FROM verification_results WHERE task_id = $1", TASK)
            assert row is not None and row["passed"] is False, dict(row or {})
            assert await conn.fetchval("SELECT count(*) FROM dead_letters WHERE consumer = $1", group) == len(forged)
    except BaseException:
        print(consumer.output())
        raise
    finally:
        consumer.stop()
        await conn.close()


async def test_a_relayed_finalize_carries_its_result_once(api: Any, chain: IndexedChain, who: dict[str, Who], database_url: str) -> None:
    """The result travels inside the agent's signed body only: a large result does not double the message."""
    poster, agent = who["poster"], who["agent"]
    registered = await api.call("POST", "/v1/terms", {
        "chainId": CHAIN_ID, "escrow": ESCROW, "poster": poster.address, "instructionsDigest": "0x" + "ab" * 32,
    }, as_=poster)  # fmt: skip
    await chain.created(TASK, poster.address, registered.json()["taskHash"])
    await chain.accepted(TASK, agent.address)
    result = {"output": "x" * 400_000}
    await chain.submitted(TASK, agent.address, 1, result_hash(result))
    response = await api.call("POST", f"/v1/tasks/{CHAIN_ID}/{ESCROW}/{TASK}/finalize", {"result": result}, as_=agent)
    assert response.status_code == 202, response.text
    conn = await connect(database_url)
    try:
        payload = bytes(await conn.fetchval("SELECT payload FROM outbox WHERE message_id LIKE 'finalize:%'"))
    finally:
        await conn.close()
    assert len(payload) < 1.4 * 400_000  # once, base64-encoded; twice would be over 930 kB
    message = parse_request_message(jsoncodec.loads(payload))
    assert message.result_in_proof and message.result is None  # type: ignore[union-attr]
    assert authenticate(message, frozenset()) == "requester"
    assert resolved(message).result == result  # type: ignore[union-attr]
    # A relayed finalize whose result was swapped for another is refused.
    swapped = message.model_copy(update={"result_in_proof": False, "result": {"output": "other"}})
    with pytest.raises(RequestNotTrusted, match="result is not the signed one"):
        authenticate(swapped, frozenset())


def test_a_bad_api_service_key_stops_the_api_without_showing_it(database_url: str) -> None:
    """A service key that is no key is refused at start-up, and the error does not carry it."""
    from pydantic import SecretStr

    from api.app import create_app

    bad = "0x" + "ff" * 32  # above the curve order: not a private key
    with pytest.raises(ValueError, match="api_service_key is not a valid") as caught:
        create_app(api_settings(database_url, api_service_key=SecretStr(bad)))
    assert "ff" * 8 not in str(caught.value)
