"""Requests on Kafka are authenticated end to end (issue 11, observation 8).

The real stack (anvil, indexer, PostgreSQL, Kafka, the verification consumer, the API): forged
and unsigned review messages written straight to the requests topic produce no verdict and
are dead-lettered with the reason; the poster's real review, relayed by the API with its
signature, is judged; a message vouched for by a trusted API service key is judged too.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from eth_account import Account

from escrowd.devnet import Devnet
from escrowd.kafka import encode_headers, make_producer
from relayer.verification.consumer import request_message
from relayer.verification.request_auth import (
    authenticate,
    request_id_for,
    service_problem,
    service_proof,
)
from schemas import jsoncodec
from schemas.request_auth import Deployment, requester_proof, sign_request
from schemas.task_terms import ReviewSubmitted, parse_request_message, result_hash

from .conftest import Who
from .pipeline import Pipeline, pipeline

pytestmark = pytest.mark.timeout(240)

SERVICE_KEY = "0x" + "5e" * 32
SERVICE = Account.from_key(SERVICE_KEY).address
UNTRUSTED_KEY = "0x" + "6f" * 32
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
        who.key, "POST", path, raw, deployment=deployment or Deployment(d.chain_id, d.escrow_address),
        expires_at=int(time.time()) + 300,
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
    forged = [
        (unsigned, "unsigned request"),
        (unsigned.model_copy(update={"requester": impostor}), "not the signer's over this request"),
        (unsigned.model_copy(update={"requester": tampered}), "decision is not the signed one"),
        (unsigned.model_copy(update={"requester": other_chain}), "not the signer's over this request"),
        (unsigned.model_copy(update={"service": untrusted}), "is not a trusted API service key"),
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
    from relayer.verification.service import SigningKeyError, VerificationSettings, build_consumer

    verdict_key = "0x" + "7a" * 32
    settings = VerificationSettings(
        database_url="postgresql://unused/x", kafka_bootstrap="unused:9092",
        trusted_api_signers=[Account.from_key(verdict_key).address.lower(), SERVICE],
    )  # fmt: skip
    with pytest.raises(SigningKeyError, match="must not hold the verdict-signing key"):
        build_consumer(settings, signing_key=verdict_key)
    assert build_consumer(settings.model_copy(update={"trusted_api_signers": [SERVICE]}), signing_key=verdict_key) is not None
    with pytest.raises(ValueError, match="not an address"):
        VerificationSettings(database_url="postgresql://unused/x", kafka_bootstrap="unused:9092", trusted_api_signers=["nope"])
