"""Versioned rubrics through the API, and the rubric judge inside the verification consumer."""

from __future__ import annotations

from typing import Any

from runtime.db import connect
from schemas.task_terms import result_hash
from tests.verification.conftest import Api, IndexedChain, Who, drain, make_handler
from tests.verification.test_api import TASK, code, finalize_path, setup_task
from verification.agents.rubrics import PgRubricSource, RubricJudge, parse_ref
from verification.registry import VerifierRegistry

from .conftest import ModelEndpoint


async def publish(api: Api, who: Who, name: str, body: str, owner: str = "alice") -> Any:
    return await api.call("POST", "/v1/rubrics", {"owner": owner, "name": name, "body": body}, as_=who)


async def test_rubrics_are_versioned_listed_and_owned(api: Api, who: dict[str, Who]) -> None:
    """Each new text is the next version; the same text again is not; the owner name is the first publisher's."""
    first = await publish(api, who["poster"], "risks", 'Names "latency".')
    assert first.status_code == 201 and first.json()["ref"] == "alice/risks@1"
    second = await publish(api, who["poster"], "risks", 'Names "latency" and "fraud".')
    assert second.status_code == 201 and second.json()["version"] == 2
    again = await publish(api, who["poster"], "risks", 'Names "latency" and "fraud".')
    assert again.status_code == 200 and again.json()["version"] == 2
    taken = await publish(api, who["stranger"], "risks", "Anything")
    assert taken.status_code == 403 and code(taken) == "RUBRIC_OWNER_TAKEN"
    unsigned = await api.call("POST", "/v1/rubrics", {"owner": "bob", "name": "x", "body": "y"})
    assert unsigned.status_code == 401
    listed = (await api.call("GET", "/v1/rubrics?owner=alice")).json()["rubrics"]
    assert [r["ref"] for r in listed] == ["alice/risks@2"]
    versions = (await api.call("GET", "/v1/rubrics/alice/risks")).json()
    assert versions == {"owner": "alice", "name": "risks", "latest": 2, "versions": [1, 2]}
    one = (await api.call("GET", "/v1/rubrics/alice/risks/1")).json()
    assert one["body"] == 'Names "latency".'
    assert (await api.call("GET", "/v1/rubrics/alice/risks/latest")).json()["version"] == 2
    assert code(await api.call("GET", "/v1/rubrics/alice/risks/9")) == "RUBRIC_NOT_FOUND"


def test_rubric_references() -> None:
    """owner/name, owner/name@version; nothing else."""
    assert parse_ref("alice/risks") is not None and parse_ref("alice/risks").version is None  # type: ignore[union-attr]
    assert parse_ref("alice/risks@12").version == 12  # type: ignore[union-attr]
    for bad in ("alice", "alice/risks@0", "alice/risks@x", "a/b/c", "../x/y", "alice/../etc"):
        assert parse_ref(bad) is None, bad


def judged_registry(database_url: str, endpoint: ModelEndpoint) -> VerifierRegistry:
    return VerifierRegistry(
        allowed_endpoint_hosts=["127.0.0.1"],
        rubric_judge=RubricJudge(PgRubricSource(database_url), endpoint.client(attempts=1)),
    )


async def verdict_row(database_url: str) -> Any:
    conn = await connect(database_url)
    try:
        return await conn.fetchrow("SELECT * FROM verification_results WHERE task_id = $1", TASK)
    finally:
        await conn.close()


async def test_the_judge_scores_against_the_latest_version_and_the_verdict_names_it(
    api: Api, chain: IndexedChain, who: dict[str, Who], database_url: str, model_endpoint: ModelEndpoint
) -> None:
    """A bare name judges with the latest version; the judge sees prompt, flattened trajectory and reference."""
    await publish(api, who["poster"], "risks", 'Names "latency".')
    await publish(api, who["poster"], "risks", 'Names "latency" and "fraud".')
    answer = [{"role": "assistant", "content": "Risks: latency spikes."}, {"content": "Also fraud."}]
    verifier = {"kind": "rubric", "ref": "alice/risks", "config": {"prompt": "List the risks", "reference": "latency, fraud"}, "passReward": 0.5}
    await setup_task(api, chain, who, submit=None, verificationMode="auto", verifier=verifier)
    await chain.submitted(TASK, who["agent"].address, 1, result_hash(answer))
    assert (await api.call("POST", finalize_path(), {"result": answer}, as_=who["agent"])).status_code == 202
    registry = judged_registry(database_url, model_endpoint)
    try:
        await drain(database_url, make_handler(registry=registry))
    finally:
        await registry.close()
    row = await verdict_row(database_url)
    assert row is not None and row["passed"] is True and row["score"] == 100
    assert [b["name"] for b in row["result"]["breakdown"]] == ["verifier:rubric:alice/risks@2"]
    import json

    data = json.loads(model_endpoint.stub.requests[0]["messages"][1]["content"].partition("<<<DATA>>>")[2])
    sent = {
        "rubric": 'Names "latency" and "fraud".',
        "prompt": "List the risks",
        "trajectory": "Risks: latency spikes.\nAlso fraud.",
        "reference": "latency, fraud",
    }
    lengths = {f"{name}Chars": len(text) for name, text in sent.items()}
    assert data == {**sent, **lengths, **{f"{name}Truncated": False for name in sent}}


async def test_a_pinned_version_and_a_model_fault_never_scores_zero(
    api: Api, chain: IndexedChain, who: dict[str, Who], database_url: str, model_endpoint: ModelEndpoint
) -> None:
    """`@1` judges with version 1; a malformed answer, then a 500, leave the attempt unjudged and retrying."""
    await publish(api, who["poster"], "risks", 'Names "latency".')
    await publish(api, who["poster"], "risks", 'Names "latency" and "fraud".')
    verifier = {"kind": "rubric", "ref": "alice/risks@1", "passReward": 1.0}
    await setup_task(api, chain, who, submit=None, verificationMode="auto", verifier=verifier)
    answer = "latency is the only risk"
    await chain.submitted(TASK, who["agent"].address, 1, result_hash(answer))
    await api.call("POST", finalize_path(), {"result": answer}, as_=who["agent"])
    model_endpoint.stub.script("malformed")
    registry = judged_registry(database_url, model_endpoint)
    try:
        await drain(database_url, make_handler(registry=registry))
        assert await verdict_row(database_url) is None
        conn = await connect(database_url)
        try:
            state = await conn.fetchval("SELECT state FROM verification_requests WHERE kind = 'finalize'")
        finally:
            await conn.close()
        assert state in ("waiting_retry", "retry_queued")
    finally:
        await registry.close()
    assert len(model_endpoint.stub.requests) == 1
    body = model_endpoint.stub.requests[0]["messages"][1]["content"]
    assert 'Names \\"latency\\".' in body and "fraud" not in body
