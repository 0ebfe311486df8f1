"""The verification key outside the process: `escrowd consume verification run` as a child
with `verification_signer` naming a key in the local KMS process or a remote JSON-RPC signer.

Verdicts and proofs are signed by that key (recovered here); the signer goes away mid-run:
the judgement is made, kept under its lease and nothing is recorded (no verdict by another
key, no zero score, nothing dead-lettered); the signer comes back and the kept judgement is
recorded once, without judging again. A signer holding another key stops the process at start.
"""

from __future__ import annotations

import json
import secrets

import pytest
from eth_account import Account

from escrowd.verification_load import Feed, LatencyVerifier, VerificationProcess
from runtime.services.localkms import LocalKms
from runtime.services.localsigner import RemoteSignerProcess
from schemas.verdict import SignedVerdict, recover_signer
from verification.proof import SignedProof, recover_proof_signer

from .conftest import until

pytestmark = pytest.mark.timeout(300)


def _local_signer(kind: str, key: str, address: str) -> tuple[LocalKms | RemoteSignerProcess, dict[str, object]]:
    if kind == "aws-kms":
        kms = LocalKms({"verification": key}).start()
        return kms, {"kind": kind, "kms_key_id": "verification", "kms_endpoint_url": kms.url, "address": address, "timeout": 2}
    remote = RemoteSignerProcess(key).start()
    return remote, {"kind": kind, "remote_url": remote.url, "address": address, "timeout": 2}


def _env(feed: Feed, spec: dict[str, object]) -> dict[str, str]:
    env = feed.env(
        ESCROWD_VERIFICATION_SIGNER=json.dumps(spec), AWS_ACCESS_KEY_ID="local", AWS_SECRET_ACCESS_KEY="local",
        ESCROWD_LOG_JSON="true",
    )
    del env["ESCROWD_VERIFICATION_SIGNING_KEY"]  # the key is the signer's alone
    return env


@pytest.mark.parametrize("kind", ["aws-kms", "remote"])
async def test_verdicts_signed_by_the_signer_and_an_outage_records_nothing_until_it_returns(
    feed: Feed, verifier: LatencyVerifier, kind: str
) -> None:
    key = "0x" + secrets.token_hex(32)
    address = Account.from_key(key).address
    local, spec = _local_signer(kind, key, address)
    process = VerificationProcess(_env(feed, spec)).start()
    try:
        await feed.task(1, verifier.url("v"))
        await feed.submit(1, 1, passed=True)

        async def judged(task: int) -> bool:
            return any(int(r["task_id"]) == task for r in await feed.results())

        await until(lambda: judged(1), "task 1's verdict", process)

        local.stop()  # the signer is gone: nothing may be signed by another key, or recorded
        await feed.task(2, verifier.url("v"))
        await feed.submit(2, 1, passed=True)

        async def waiting_for_signer() -> bool:
            return "verification_signer_unavailable" in process.output(200_000)

        await until(waiting_for_signer, "the judgement waiting for the signer", process)
        assert [s for s in verifier.started if s[1] == 2] == [("v", 2, 1)]  # judged, and kept
        assert not await judged(2)
        assert feed.conn is not None
        job = await feed.conn.fetchrow("SELECT state, claims FROM verification_jobs WHERE task_id = 2")
        assert job is not None and (job["state"], job["claims"]) == ("judging", 1)  # held, not failed
        assert process.running

        local.start()  # back, on the same port
        await until(lambda: judged(2), "task 2's verdict after the signer returned", process)

        rows = await feed.conn.fetch(
            "SELECT task_id, passed, score, signed_verdict, signed_proof FROM verification_results ORDER BY task_id"
        )
        assert [(int(r["task_id"]), r["passed"], r["score"]) for r in rows] == [(1, True, 100), (2, True, 100)]
        for row in rows:
            verdict = SignedVerdict.model_validate(row["signed_verdict"])
            proof = SignedProof.model_validate(row["signed_proof"])
            assert verdict.signer == proof.signer == address
            assert recover_signer(verdict) == address
            assert recover_proof_signer(proof) == address
        assert await feed.conn.fetchval("SELECT count(*) FROM outbox WHERE topic = $1", feed.verdicts) == 2
        assert not await feed.conn.fetchval("SELECT count(*) FROM outbox WHERE topic = $1", feed.dead_letters)
        assert [s for s in verifier.started if s[1] == 2] == [("v", 2, 1)]  # never judged a second time
    finally:
        process.cleanup()
        local.stop()


async def test_a_stop_while_the_signer_is_away_hands_the_judgement_back_unblamed(
    feed: Feed, verifier: LatencyVerifier
) -> None:
    """SIGTERM while a judgement waits for the signer: its lease is handed back (queued, claimable
    at once), not recorded as an error of ours (an error counts toward parking the job as
    failed, so a few restarts during a signer outage would have left the task for an operator)."""
    key = "0x" + secrets.token_hex(32)
    local, spec = _local_signer("remote", key, Account.from_key(key).address)
    process = VerificationProcess(_env(feed, spec)).start()
    try:
        await feed.task(1, verifier.url("v"))
        await feed.submit(1, 1, passed=True)

        async def judged() -> bool:
            return bool(await feed.results())

        await until(judged, "task 1's verdict", process)
        local.stop()
        await feed.task(2, verifier.url("v"))
        await feed.submit(2, 1, passed=True)

        async def waiting_for_signer() -> bool:
            return "verification_signer_unavailable" in process.output(200_000)

        await until(waiting_for_signer, "the judgement waiting for the signer", process)
        assert process.terminate() == 0
        assert feed.conn is not None
        job = await feed.conn.fetchrow(
            "SELECT state, errors, claim_token, not_before FROM verification_jobs WHERE task_id = 2"
        )
        assert job is not None
        assert (job["state"], job["errors"], job["claim_token"], job["not_before"]) == ("queued", 0, None, None)
        assert [int(r["task_id"]) for r in await feed.results()] == [1]
    finally:
        process.cleanup()
        local.stop()


async def test_a_signer_holding_another_key_stops_the_service_at_start(feed: Feed) -> None:
    key, other = "0x" + secrets.token_hex(32), "0x" + secrets.token_hex(32)
    local, spec = _local_signer("aws-kms", key, Account.from_key(other).address)
    process = VerificationProcess(_env(feed, spec)).start()
    try:

        async def exited() -> bool:
            return not process.running

        await until(exited, "the service refusing to start", process)
        assert process.terminate() not in (0, None)
        log = process.output(200_000)
        assert "not the configured" in log and "verification_service_started" not in log
        assert key not in log and key.removeprefix("0x") not in log
    finally:
        process.cleanup()
        local.stop()
