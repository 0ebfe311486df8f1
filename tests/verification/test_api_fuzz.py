"""Property-based fuzzing of the API from its own OpenAPI document: no input gives a 5xx.

Requests are drawn from the schemas in `/openapi.json` (valid shapes, near misses and plain
garbage), for every operation, signed by a party of a seeded task or by a stranger, or not
signed at all. Every answer must be below 500, and every error must have the one error shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any
from urllib.parse import quote

import asyncpg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.web.auth import UnsignedRequest, sign_request
from schemas.task_terms import result_hash
from verification.proof import VERIFIER_VERSION, Proof, sign_proof

from .conftest import (
    CHAIN_ID,
    ESCROW,
    Api,
    IndexedChain,
    Who,
    api_settings,
    deployment_of,
    running_api,
)

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def from_schema(schema: dict[str, Any], components: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values for a JSON Schema of the OpenAPI document (close enough to valid to get past parsing)."""
    if depth > 6:
        return JSON
    if "$ref" in schema:
        return from_schema(components[schema["$ref"].split("/")[-1]], components, depth + 1)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([from_schema(s, components, depth + 1) for s in schema[key]])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "object" and "properties" in schema:
        props = {name: from_schema(s, components, depth + 1) for name, s in schema["properties"].items()}
        required = set(schema.get("required", []))
        return st.fixed_dictionaries(
            {k: v for k, v in props.items() if k in required}, optional={k: v for k, v in props.items() if k not in required}
        )
    if kind == "object":
        return st.dictionaries(st.text(max_size=8), JSON, max_size=3)
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {}), components, depth + 1), max_size=3)
    if kind == "string":
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True) | st.text(max_size=20)
        return st.text(max_size=30)
    if kind == "integer":
        low, high = schema.get("minimum", schema.get("exclusiveMinimum")), schema.get("maximum")
        return st.integers(min_value=low, max_value=high) | st.integers()
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False) | st.integers()
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return JSON


def operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """This service's operations (other packages' routers are tested by their owners)."""
    every = [(path, method.upper(), op) for path, item in spec["paths"].items() for method, op in item.items()]
    return [o for o in every if "verification" in o[2].get("tags", [])]


# Mostly the seeded tasks (to reach deep paths), sometimes anything.
PATH_VALUES = {
    "chain_id": st.sampled_from([CHAIN_ID] * 12 + [1, 0, -1, 2**63]),
    "escrow": st.sampled_from([ESCROW] * 12 + [ESCROW.lower(), "0x" + "0" * 40, "0x1234", "nothex"]),
    "task_id": st.sampled_from([7, 8] * 8 + [1, 0, -5, 2**256, 2**300]),
    "task_hash": st.sampled_from(["0x" + "ab" * 32, "0x" + "0" * 64, "0xzz"]),
    "address": st.sampled_from(["0x" + "1" * 40, "0x12"]),
}


def valid_body(path_template: str, signer: Who | None, poster: Who) -> dict[str, Any] | None:
    """A body that passes validation for the operation, to mix with generated fields."""
    if path_template == "/v1/terms":
        return {"chainId": CHAIN_ID, "escrow": ESCROW, "poster": (signer or poster).address,
                "instructionsDigest": "0x" + "cd" * 32}  # fmt: skip
    if path_template.endswith("/finalize"):
        return {"result": "result"}
    if path_template.endswith("/review"):
        return {"attempt": 1, "evidenceHash": result_hash("result"), "passed": False, "reasons": ["missing table"]}
    if path_template.endswith("/verifier-report"):
        return {"attempt": 1, "evidenceHash": result_hash("result"), "outcome": "error"}
    return None


def test_openapi_fuzz_finds_no_5xx(database_url: str, who: dict[str, Who]) -> None:
    """Hundreds of generated requests across every operation: never a 5xx, always the error shape."""
    loop = asyncio.new_event_loop()
    stack = contextlib.AsyncExitStack()
    try:
        api: Api = loop.run_until_complete(
            stack.enter_async_context(running_api(api_settings(database_url, evidence_wait_seconds=0)))
        )
        loop.run_until_complete(_seed(api, database_url, who))
        spec = loop.run_until_complete(api.call("GET", "/openapi.json")).json()
        components = spec.get("components", {}).get("schemas", {})
        ops = operations(spec)
        assert len(ops) == 9  # the verification router, /v1/deployments included
        seen: set[tuple[str, int]] = set()
        actors = [who["poster"], who["agent"], who["verifier"], who["stranger"]]

        @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        @given(data=st.data())
        def check(data: st.DataObject) -> None:
            path_template, method, op = data.draw(st.sampled_from(ops))
            path = path_template
            for param in op.get("parameters", []):
                if param["in"] == "path":
                    value = data.draw(PATH_VALUES.get(param["name"], st.text(min_size=1, max_size=10)))
                    path = path.replace("{" + param["name"] + "}", quote(str(value), safe=""))
            signer = data.draw(st.sampled_from([None, *actors, who["agent"], who["poster"]]))
            body: Any = None
            if "requestBody" in op:
                schema = op["requestBody"]["content"]["application/json"]["schema"]
                body = data.draw(from_schema(schema, components) | JSON)
                base = valid_body(path_template, signer, who["poster"])
                if base is not None and isinstance(body, dict) and data.draw(st.booleans()):
                    body = {**body, **base} if data.draw(st.booleans()) else {**base, **body}
            raw = b"" if body is None else json.dumps(body).encode()
            headers = {"content-type": "application/json"} if body is not None else {}
            if signer is not None:
                headers.update(
                    sign_request(
                        signer.key, UnsignedRequest(method, path, raw, deployment=deployment_of(path, body), expires_at=int(time.time()) + 120)
                    )
                )
                if data.draw(st.integers(0, 9)) == 0:
                    headers["X-Escrowd-Signature"] = data.draw(st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=20))
            response = loop.run_until_complete(api.client.request(method, path, content=raw or None, headers=headers))
            seen.add((path_template, response.status_code))
            assert response.status_code < 500, (method, path, body, response.text)
            if response.status_code >= 400:
                error = response.json()["error"]
                assert set(error) == {"code", "message"} and error["code"].isupper()

        check()
        # The generated requests got through to the service's logic, not only to its validation.
        assert len({template for template, status in seen if status < 300}) >= 4, sorted(seen)
        assert len({status for _, status in seen}) >= 7, sorted(seen)
    finally:
        loop.run_until_complete(stack.aclose())
        loop.close()


async def _seed(api: Api, database_url: str, who: dict[str, Who]) -> None:
    """A manual task and an auto task, indexed and submitted, so signed requests reach deep paths."""
    chain = IndexedChain(database_url)
    for task_id, extra in ((7, {}), (8, {"verificationMode": "auto", "verificationCriteria": {"min_length": 5}})):
        body = {"chainId": CHAIN_ID, "escrow": ESCROW, "poster": who["poster"].address,
                "instructionsDigest": "0x" + "ab" * 32, "salt": str(task_id), **extra}  # fmt: skip
        response = await api.call("POST", "/v1/terms", body, as_=who["poster"])
        assert response.status_code == 201
        await chain.created(task_id, who["poster"].address, response.json()["taskHash"])
        await chain.accepted(task_id, who["agent"].address)
        await chain.submitted(task_id, who["agent"].address, 1, result_hash("result"))
    # A signed proof for task 7 (on an attempt the chain does not hold, so no other route's
    # behaviour changes): GET .../proof reaches the stored proof, not only the 404.
    proof = Proof(
        chain_id=CHAIN_ID, escrow=ESCROW, task_id=7, attempt=3, agent=who["agent"].address,
        evidence_hash="0x" + "ee" * 32, criteria_hash="0x" + "00" * 32, passed=True, score=100,
        verifier_id="auto-check", verifier_version=VERIFIER_VERSION,
    )  # fmt: skip
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "INSERT INTO verification_results (chain_id, escrow_address, task_id, attempt, evidence_hash, mode, source,"
            " passed, score, result, signed_proof) VALUES ($1, $2, 7, 3, $3, 'auto', 'auto', true, 100, $4::jsonb, $5::jsonb)",
            CHAIN_ID, ESCROW, "0x" + "ee" * 32,
            json.dumps({"passed": True, "score": 100, "reasons": ["All verification criteria met"]}),
            json.dumps(sign_proof(proof, "0x" + "11" * 32).to_json_dict()),
        )  # fmt: skip
    finally:
        await conn.close()
