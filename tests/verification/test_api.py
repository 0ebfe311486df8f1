"""The verification API on the real app and a real PostgreSQL: every refusal, auth, visibility."""

from __future__ import annotations

import secrets
import time
from typing import Any

import pytest

from runtime.web.auth import Deployment, UnsignedRequest, sign_request
from schemas.task_terms import result_hash

from .conftest import CHAIN_ID, ESCROW, Api, IndexedChain, Who, drain, make_handler

DIGEST = "0x" + "ab" * 32
TASK = 7
HOME = Deployment(CHAIN_ID, ESCROW)


def terms_body(poster: Who, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"chainId": CHAIN_ID, "escrow": ESCROW, "poster": poster.address, "instructionsDigest": DIGEST}
    body.update(extra)
    return body


async def register(api: Api, poster: Who, **extra: Any) -> str:
    response = await api.call("POST", "/v1/terms", terms_body(poster, **extra), as_=poster)
    assert response.status_code in (200, 201), response.text
    return str(response.json()["taskHash"])


def code(response: Any) -> str:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return str(body["error"]["code"])


def finalize_path(task_id: int = TASK) -> str:
    return f"/v1/tasks/{CHAIN_ID}/{ESCROW}/{task_id}/finalize"


async def setup_task(
    api: Api, chain: IndexedChain, who: dict[str, Who], *, task_id: int = TASK, submit: str | None = "result one", **terms: Any
) -> str:
    """Register terms, then index TaskCreated, TaskAccepted and (optionally) the first submission."""
    task_hash = await register(api, who["poster"], **terms)
    verifier = terms.get("verifierAddress")
    await chain.created(task_id, who["poster"].address, task_hash, **({"verifier": verifier} if verifier else {}))
    await chain.accepted(task_id, who["agent"].address)
    if submit is not None:
        await chain.submitted(task_id, who["agent"].address, 1, result_hash(submit))
    return task_hash


AUTO: dict[str, Any] = {"verificationMode": "auto", "verificationCriteria": {"min_length": 5}}


# ---------------------------------------------------------------------------- terms


async def test_register_defaults_to_manual_and_returns_the_canonical_hash(api: Api, who: dict[str, Who]) -> None:
    """No mode means manual; the hash is keccak of the canonical text returned with it."""
    from eth_utils.crypto import keccak

    response = await api.call("POST", "/v1/terms", terms_body(who["poster"]), as_=who["poster"])
    assert response.status_code == 201
    body = response.json()
    assert body["terms"]["verificationMode"] == "manual"
    assert body["taskHash"] == "0x" + keccak(body["canonical"].encode()).hex()
    again = await api.call("POST", "/v1/terms", terms_body(who["poster"]), as_=who["poster"])
    assert again.status_code == 200 and again.json()["taskHash"] == body["taskHash"]


async def test_oracle_mode_is_refused(api: Api, who: dict[str, Who]) -> None:
    """`oracle` is 400 VERIFICATION_MODE_UNSUPPORTED."""
    response = await api.call("POST", "/v1/terms", terms_body(who["poster"], verificationMode="oracle"), as_=who["poster"])
    assert response.status_code == 400 and code(response) == "VERIFICATION_MODE_UNSUPPORTED"


@pytest.mark.parametrize(
    "criteria", [None, {}, {"forbidden_phrases": ["lorem ipsum"]}], ids=["absent", "empty", "forbidden-only"]
)
async def test_auto_without_a_real_check_is_refused(api: Api, who: dict[str, Who], criteria: Any) -> None:
    """Auto needs one real check: 400 AUTO_CRITERIA_REQUIRED."""
    extra: dict[str, Any] = {"verificationMode": "auto"}
    if criteria is not None:
        extra["verificationCriteria"] = criteria
    response = await api.call("POST", "/v1/terms", terms_body(who["poster"], **extra), as_=who["poster"])
    assert response.status_code == 400 and code(response) == "AUTO_CRITERIA_REQUIRED"


async def test_a_registry_verifier_counts_as_a_real_check(api: Api, who: dict[str, Who]) -> None:
    """Auto with only a registry verifier is accepted; a verifier off the allow-list is not."""
    ok = terms_body(who["poster"], verificationMode="auto", verifier={"kind": "exact_match", "ref": "v1", "config": {"expected": "42"}})
    assert (await api.call("POST", "/v1/terms", ok, as_=who["poster"])).status_code == 201
    bad = terms_body(who["poster"], verificationMode="auto", verifier={"kind": "plugin", "ref": "os:system"})
    response = await api.call("POST", "/v1/terms", bad, as_=who["poster"])
    assert response.status_code == 400 and code(response) == "VERIFIER_CONFIG_INVALID"


@pytest.mark.parametrize(
    ("schema", "accepted"),
    [
        ({"$defs": {"a": {"type": "integer"}}, "properties": {"n": {"$ref": "#/$defs/a"}}}, True),
        ({"$defs": {"a": {"$anchor": "num", "type": "integer"}}, "items": {"$ref": "#num"}}, True),
        ({"$ref": "#/$defs/gone"}, False),
        ({"properties": {"n": {"$ref": "#nowhere"}}}, False),
        ({"$ref": "https://schemas.example/output.json"}, False),  # never fetched: it can never resolve
        # A property named like a data keyword is a schema all the same, and evaluated.
        ({"properties": {"const": {"$ref": "#/$defs/gone"}}}, False),
        ({"properties": {"enum": {"items": {"$ref": "#nowhere"}}}}, False),
        ({"$dynamicRef": "#nowhere"}, False),
        # A keyword no evaluation reads holds data, whatever its keys.
        ({"x-example": {"$ref": "#/$defs/gone"}, "type": "object"}, True),
        # A reference back to itself on the same output recurses until RecursionError at every
        # evaluation; one that descends into the output (a tree) ends with it.
        ({"$ref": "#"}, False),
        ({"$defs": {"a": {"anyOf": [{"type": "string"}, {"$ref": "#"}]}}, "allOf": [{"$ref": "#/$defs/a"}]}, False),
        ({"$defs": {"node": {"type": "object", "properties": {"children": {"items": {"$ref": "#/$defs/node"}}}}},
          "$ref": "#/$defs/node"}, True),
    ],
    ids=["pointer", "anchor", "pointer-to-nothing", "unknown-anchor", "remote", "property-named-const",
         "property-named-enum", "dynamic-ref", "unknown-keyword", "ref-to-itself", "ref-cycle", "tree"],
)
async def test_a_schema_whose_references_do_not_resolve_is_refused(
    api: Api, who: dict[str, Who], schema: dict[str, Any], accepted: bool
) -> None:
    """A schema_validation verifier's schema must resolve every `$ref` within itself: one that
    does not passes the schema check but raises at every evaluation, so the job would be
    retried until an operator is paged, for the poster's mistake."""
    verifier = {"kind": "schema_validation", "ref": "out", "config": {"schema": schema}}
    body = terms_body(who["poster"], verificationMode="auto", verifier=verifier)
    response = await api.call("POST", "/v1/terms", body, as_=who["poster"])
    if accepted:
        assert response.status_code == 201, response.text
    else:
        assert response.status_code == 400 and code(response) == "VERIFIER_CONFIG_INVALID", response.text
        assert "$ref" in response.json()["error"]["message"]


async def test_many_unresolvable_references_are_refused_naming_the_first(api: Api, who: dict[str, Who]) -> None:
    """Thousands of references that do not resolve (a body well under the size limit) are one
    refusal naming the first. (The check crawls the schema once: a lookup that misses in an
    uncrawled registry crawls it again, which made this body take minutes on the API's event
    loop; see `unresolvable_refs`.)"""
    schema = {"anyOf": [{"$ref": f"r{i}"} for i in range(3000)]}
    verifier = {"kind": "schema_validation", "ref": "out", "config": {"schema": schema}}
    body = terms_body(who["poster"], verificationMode="auto", verifier=verifier)
    response = await api.call("POST", "/v1/terms", body, as_=who["poster"])
    assert response.status_code == 400 and code(response) == "VERIFIER_CONFIG_INVALID", response.text
    assert "'r0'" in response.json()["error"]["message"]


async def test_nested_quantifier_regex_is_refused(api: Api, who: dict[str, Who]) -> None:
    """`(a+)+` is 400 REGEX_PATTERN_UNUSABLE."""
    body = terms_body(who["poster"], verificationMode="auto", verificationCriteria={"regex_pattern": "(a+)+$"})
    response = await api.call("POST", "/v1/terms", body, as_=who["poster"])
    assert response.status_code == 400 and code(response) == "REGEX_PATTERN_UNUSABLE"


async def test_poster_naming_itself_verifier_is_refused(api: Api, who: dict[str, Who]) -> None:
    """A named verifier equal to the poster is 409 SELF_VERIFICATION."""
    body = terms_body(who["poster"], verificationMode="agent", verifierAddress=who["poster"].address)
    response = await api.call("POST", "/v1/terms", body, as_=who["poster"])
    assert response.status_code == 409 and code(response) == "SELF_VERIFICATION"


async def test_terms_are_registered_by_their_poster_only(api: Api, who: dict[str, Who]) -> None:
    """Someone else signing the poster's terms is 403 NOT_POSTER."""
    response = await api.call("POST", "/v1/terms", terms_body(who["poster"]), as_=who["stranger"])
    assert response.status_code == 403 and code(response) == "NOT_POSTER"


async def test_public_terms_hide_the_expected_answer(api: Api, who: dict[str, Who]) -> None:
    """GET /v1/terms shows the criteria but not `expected_answer`, nor a verifier's config."""
    task_hash = await register(
        api, who["poster"], verificationMode="auto", verificationCriteria={"expected_answer": "Paris"},
        verifier={"kind": "exact_match", "ref": "v1", "config": {"expected": "Paris"}},
    )  # fmt: skip
    body = (await api.call("GET", f"/v1/terms/{task_hash}")).json()
    assert body["verificationCriteria"] == {"has_expected_answer": True}
    assert body["verifier"] == {"kind": "exact_match", "ref": "v1"}
    assert "Paris" not in str(body)
    missing = await api.call("GET", "/v1/terms/0x" + "0" * 64)
    assert missing.status_code == 404 and code(missing) == "TERMS_NOT_FOUND"


# ---------------------------------------------------------------------------- signatures


async def test_missing_bad_tampered_and_expired_signatures_are_refused(api: Api, who: dict[str, Who]) -> None:
    """401 for no headers, another key, a changed body, an expired or too distant expiry."""
    body = terms_body(who["poster"])
    assert code(await api.call("POST", "/v1/terms", body)) == "AUTH_REQUIRED"
    import json

    raw = json.dumps(body).encode()
    forged = sign_request(who["stranger"].key, UnsignedRequest("POST", "/v1/terms", raw, deployment=HOME, expires_at=int(time.time()) + 60))
    forged["X-Escrowd-Signer"] = who["poster"].address
    response = await api.call("POST", "/v1/terms", body, headers=forged)
    assert response.status_code == 401 and code(response) == "SIGNATURE_INVALID"
    signed_for_other_body = sign_request(
        who["poster"].key, UnsignedRequest("POST", "/v1/terms", json.dumps(terms_body(who["poster"], private=True)).encode(),
        deployment=HOME, expires_at=int(time.time()) + 60)
    )  # fmt: skip
    response = await api.call("POST", "/v1/terms", body, headers=signed_for_other_body)
    assert response.status_code == 401 and code(response) == "SIGNATURE_INVALID"
    assert code(await api.call("POST", "/v1/terms", body, as_=who["poster"], expires_in=-1)) == "SIGNATURE_EXPIRED"
    assert code(await api.call("POST", "/v1/terms", body, as_=who["poster"], expires_in=10**6)) == "SIGNATURE_EXPIRY_TOO_FAR"


async def test_a_replayed_nonce_is_refused(api: Api, who: dict[str, Who]) -> None:
    """The same nonce twice: the second is 409 NONCE_REPLAYED, even with a fresh signature."""
    nonce = secrets.token_hex(8)
    first = await api.call("POST", "/v1/terms", terms_body(who["poster"]), as_=who["poster"], nonce=nonce)
    assert first.status_code == 201
    replay = await api.call("POST", "/v1/terms", terms_body(who["poster"], salt="other"), as_=who["poster"], nonce=nonce)
    assert replay.status_code == 409 and code(replay) == "NONCE_REPLAYED"
    # The refused request changed nothing: its terms were not registered.
    salted = await api.call("POST", "/v1/terms", terms_body(who["poster"], salt="other"), as_=who["poster"])
    assert salted.status_code == 201


# ---------------------------------------------------------------------------- finalize


async def test_finalize_refusals(api: Api, chain: IndexedChain, who: dict[str, Who]) -> None:
    """Wrong agent, verifier key, hash mismatch, unknown task, missing terms: each its own code."""
    await setup_task(api, chain, who, **AUTO)
    cases = [
        (who["agent2"], "result one", TASK, 403, "NOT_TASK_AGENT"),
        (who["marketplace"], "result one", TASK, 403, "IS_VERIFIER"),
        (who["agent"], "another result", TASK, 409, "EVIDENCE_MISMATCH"),
        (who["agent"], "result one", 999, 404, "TASK_NOT_FOUND"),
    ]
    for actor, result, task_id, status, expected in cases:
        response = await api.call("POST", finalize_path(task_id), {"result": result}, as_=actor)
        assert (response.status_code, code(response)) == (status, expected), (actor.name, response.text)
    await chain.created(8, who["poster"].address, "0x" + "cd" * 32)
    await chain.accepted(8, who["agent"].address)
    await chain.submitted(8, who["agent"].address, 1, result_hash("x"))
    response = await api.call("POST", finalize_path(8), {"result": "x"}, as_=who["agent"])
    assert (response.status_code, code(response)) == (409, "TERMS_NOT_REGISTERED")


async def test_named_verifier_cannot_finalize(api: Api, chain: IndexedChain, who: dict[str, Who]) -> None:
    """The named verifier of an agent-review task is 403 IS_VERIFIER."""
    await setup_task(api, chain, who, verificationMode="agent", verifierAddress=who["verifier"].address)
    response = await api.call("POST", finalize_path(), {"result": "result one"}, as_=who["verifier"])
    assert response.status_code == 403 and code(response) == "IS_VERIFIER"


async def test_fourth_result_and_late_finalize_are_refused(api: Api, chain: IndexedChain, who: dict[str, Who]) -> None:
    """After 3 submissions a new result is MAX_ATTEMPTS_REACHED; past the deadline DEADLINE_REACHED."""
    task_hash = await register(api, who["poster"], **AUTO)
    await chain.created(TASK, who["poster"].address, task_hash, deadline=chain.now + 1000)
    await chain.accepted(TASK, who["agent"].address)
    for attempt in (1, 2, 3):
        await chain.submitted(TASK, who["agent"].address, attempt, result_hash(f"try {attempt}"))
        await chain.judged(TASK, who["marketplace"].address, who["agent"].address, attempt, result_hash(f"try {attempt}"), False, 0)
    response = await api.call("POST", finalize_path(), {"result": "try 4"}, as_=who["agent"])
    assert response.status_code == 409 and code(response) == "MAX_ATTEMPTS_REACHED"

    task_hash = await register(api, who["poster"], **AUTO, salt="late")
    await chain.created(9, who["poster"].address, task_hash, deadline=chain.now + 1000)
    await chain.accepted(9, who["agent"].address)
    await chain.submitted(9, who["agent"].address, 1, result_hash("on time"))
    await chain.advance(1000)
    for result in ("on time", "new result"):
        response = await api.call("POST", finalize_path(9), {"result": result}, as_=who["agent"])
        assert response.status_code == 409 and code(response) == "DEADLINE_REACHED", result


async def test_finalize_is_accepted_once_and_queued(api: Api, chain: IndexedChain, who: dict[str, Who], database_url: str) -> None:
    """A valid finalize is queued once (202 while unjudged); a repeat adds no second message."""
    await setup_task(api, chain, who, **AUTO)
    first = await api.call("POST", finalize_path(), {"result": "result one"}, as_=who["agent"])
    assert first.status_code == 202 and first.json()["status"] == "pending" and first.json()["attempt"] == 1
    again = await api.call("POST", finalize_path(), {"result": "result one"}, as_=who["agent"])
    assert again.status_code == 202

    from runtime.db import connect

    conn = await connect(database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM outbox WHERE message_id LIKE 'finalize:%'") == 1
    finally:
        await conn.close()


async def test_finalize_returns_the_verdict_once_judged(api: Api, chain: IndexedChain, who: dict[str, Who], database_url: str) -> None:
    """After the consumer judged the attempt, finalize answers 200 with the full verificationResult."""
    await setup_task(api, chain, who, verificationMode="auto", verificationCriteria={"contains_keywords": ["Paris"], "min_length": 10})
    answer = "The capital of France is Paris, and it has been for a very long time indeed."
    await chain.submitted(TASK, who["agent"].address, 2, result_hash(answer))  # attempt 2 of the same task
    assert (await api.call("POST", finalize_path(), {"result": answer}, as_=who["agent"])).status_code == 202
    await drain(database_url, make_handler())
    response = await api.call("POST", finalize_path(), {"result": answer}, as_=who["agent"])
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "judged" and body["attempt"] == 2
    assert set(body["verificationResult"]) == {"passed", "score", "reasons", "breakdown", "errors"}


# ---------------------------------------------------------------------------- review and reports


def review_body(passed: bool, reasons: list[str] | None = None, *, attempt: int = 1, evidence: str = "result one") -> dict[str, Any]:
    """A review naming the attempt and the evidence hash (of the text `evidence`) it judges."""
    return {"attempt": attempt, "evidenceHash": result_hash(evidence), "passed": passed, "reasons": reasons or []}


def review_path(task_id: int = TASK) -> str:
    return f"/v1/tasks/{CHAIN_ID}/{ESCROW}/{task_id}/review"


async def test_review_rules(api: Api, chain: IndexedChain, who: dict[str, Who]) -> None:
    """Only the poster, only manual tasks, only while submitted; one decision per attempt."""
    await setup_task(api, chain, who)  # manual by default
    assert code(await api.call("POST", review_path(), review_body(True), as_=who["stranger"])) == "NOT_POSTER"
    too_many = await api.call("POST", review_path(), review_body(False, ["r"] * 21), as_=who["poster"])
    assert too_many.status_code == 422
    first = await api.call("POST", review_path(), review_body(False, ["table missing"]), as_=who["poster"])
    assert first.status_code == 202 and first.json()["status"] == "accepted"
    same = await api.call("POST", review_path(), review_body(False, ["table missing"]), as_=who["poster"])
    assert same.status_code == 200 and same.json()["status"] == "duplicate"
    other = await api.call("POST", review_path(), review_body(True), as_=who["poster"])
    assert other.status_code == 409 and code(other) == "ALREADY_REVIEWED"

    await setup_task(api, chain, who, task_id=8, **AUTO, salt="auto")
    assert code(await api.call("POST", review_path(8), review_body(True), as_=who["poster"])) == "NOT_MANUAL_TASK"
    await setup_task(api, chain, who, task_id=9, submit=None, salt="unsubmitted")
    assert code(await api.call("POST", review_path(9), review_body(True), as_=who["poster"])) == "TASK_NOT_SUBMITTED"


async def test_verifier_report_rules(api: Api, chain: IndexedChain, who: dict[str, Who]) -> None:
    """The agent reporting on its own work is SELF_VERIFICATION; others NOT_TASK_VERIFIER."""
    await setup_task(api, chain, who, verificationMode="agent", verifierAddress=who["verifier"].address)
    path = f"/v1/tasks/{CHAIN_ID}/{ESCROW}/{TASK}/verifier-report"
    report = {"attempt": 1, "evidenceHash": result_hash("result one"), "outcome": "verdict", "passed": True, "score": 90}
    assert code(await api.call("POST", path, report, as_=who["agent"])) == "SELF_VERIFICATION"
    assert code(await api.call("POST", path, report, as_=who["stranger"])) == "NOT_TASK_VERIFIER"
    wrong = dict(report, evidenceHash="0x" + "11" * 32)
    assert code(await api.call("POST", path, wrong, as_=who["verifier"])) == "EVIDENCE_MISMATCH"
    assert (await api.call("POST", path, report, as_=who["verifier"])).status_code == 202
    await setup_task(api, chain, who, task_id=8, salt="manual")
    manual_path = f"/v1/tasks/{CHAIN_ID}/{ESCROW}/8/verifier-report"
    assert code(await api.call("POST", manual_path, report, as_=who["verifier"])) == "NOT_AGENT_TASK"


# ---------------------------------------------------------------------------- visibility


async def _judge_by_review(api: Api, chain: IndexedChain, who: dict[str, Who], database_url: str, *, private: bool) -> None:
    await setup_task(api, chain, who, private=private, salt=f"private={private}")
    assert (await api.call("POST", finalize_path(), {"result": "result one"}, as_=who["agent"])).status_code == 202
    assert (await api.call("POST", review_path(), review_body(False, ["brief quoted here"]), as_=who["poster"])).status_code == 202
    await drain(database_url, make_handler())


async def test_private_results_show_only_passed_and_score_to_others(
    api: Api, chain: IndexedChain, who: dict[str, Who], database_url: str
) -> None:
    """A private task: poster and agent see the full result; anyone else only passed and score."""
    await _judge_by_review(api, chain, who, database_url, private=True)
    path = f"/v1/tasks/{CHAIN_ID}/{ESCROW}/{TASK}/results"
    for reader in (None, who["stranger"]):
        body = (await api.call("GET", path, as_=reader)).json()
        assert body["visibility"] == "summary"
        assert body["results"] == [{"attempt": 1, "passed": False, "score": 0}]
        assert "brief quoted here" not in str(body)
    for reader in (who["poster"], who["agent"]):
        body = (await api.call("GET", path, as_=reader)).json()
        assert body["visibility"] == "full"
        assert body["results"][0]["verificationResult"]["reasons"] == ["brief quoted here"]
    executions = f"/v1/agents/{who['agent'].address}/executions"
    anonymous = (await api.call("GET", executions)).json()["executions"]
    assert [e["result"] for e in anonymous] == [{"attempt": 1, "passed": False, "score": 0}]
    own = (await api.call("GET", executions, as_=who["agent"])).json()["executions"]
    assert own[0]["result"]["verificationResult"]["reasons"] == ["brief quoted here"]
    stranger = (await api.call("GET", executions, as_=who["stranger"])).json()["executions"]
    assert "brief quoted here" not in str(stranger)


async def test_public_results_are_full_for_everyone(api: Api, chain: IndexedChain, who: dict[str, Who], database_url: str) -> None:
    """A public task's result is readable in full without a signature."""
    await _judge_by_review(api, chain, who, database_url, private=False)
    body = (await api.call("GET", f"/v1/tasks/{CHAIN_ID}/{ESCROW}/{TASK}/results")).json()
    assert body["visibility"] == "full"
    assert body["results"][0]["verificationResult"]["reasons"] == ["brief quoted here"]
    assert body["results"][0]["source"] == "manual"


async def test_a_bad_signature_on_a_read_is_refused_not_downgraded(api: Api, chain: IndexedChain, who: dict[str, Who]) -> None:
    """A read with broken auth headers is 401, not silently anonymous."""
    response = await api.call("GET", f"/v1/tasks/{CHAIN_ID}/{ESCROW}/{TASK}/results", headers={"X-Escrowd-Signer": who["poster"].address})
    assert response.status_code == 401 and code(response) == "AUTH_REQUIRED"


async def test_openapi_is_published(api: Api) -> None:
    """/openapi.json lists every route of the service."""
    paths = (await api.call("GET", "/openapi.json")).json()["paths"]
    assert {
        "/v1/terms", "/v1/terms/{task_hash}", "/v1/tasks/{chain_id}/{escrow}/{task_id}/finalize",
        "/v1/tasks/{chain_id}/{escrow}/{task_id}/review", "/v1/tasks/{chain_id}/{escrow}/{task_id}/verifier-report",
        "/v1/tasks/{chain_id}/{escrow}/{task_id}/results", "/v1/agents/{address}/executions",
        "/v1/tasks/{chain_id}/{escrow}/{task_id}/proof",
    } <= set(paths)  # fmt: skip
