"""A real `escrowd api serve` process under hostile requests: 4xx with a code, never a crash.

Observations 1, 3, 4 and 5 of the trust-boundary issue, each driven through the real
process: a 100,000-deep body (was SIGSEGV), lone surrogate / NUL / 2**64 (were 500s), a
100 MB body (was read whole before the 401), string numbers and truthy strings (were
accepted). Then a hostile corpus, after which the process must still answer.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from runtime.services.postgres import PostgresService
from schemas.jsonbounds import MAX_DEPTH, SAFE_RECURSION_LIMIT
from schemas.request_auth import MAX_SIGNED_PATH_CHARS, Deployment, UnsignedRequest, sign_request
from tests.support.processes import TEST_CHAIN_ID, TEST_ESCROW, ServiceProcess, api_process, get

ESCROW = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
POSTER = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
TASK = f"/v1/tasks/31337/{ESCROW}/1"


def terms_body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "chainId": 31337,
        "escrow": ESCROW,
        "poster": POSTER,
        "instructionsDigest": "0x" + "ab" * 32,
        "verificationMode": "manual",
    }
    body.update(overrides)
    return body


@pytest.fixture(scope="module")
def module_database(pg_service: PostgresService) -> Iterator[str]:
    """One migrated database for the module's API process."""
    from tests.fixtures.services import fresh_database

    with fresh_database(pg_service) as url:
        yield url


@pytest.fixture(scope="module")
def api(module_database: str) -> Iterator[ServiceProcess]:
    """The real API process, shared by the module's tests (each must leave it alive)."""
    with api_process(module_database) as service:
        yield service


def post(api: ServiceProcess, path: str, content: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    sent = {"content-type": "application/json", **(headers or {})}
    return httpx.post(api.url + path, content=content, headers=sent, timeout=60)


def assert_alive(api: ServiceProcess) -> None:
    """The process is running and answers a request."""
    assert api.alive(), api.log()
    status, _ = get(api.url + "/v1/terms/0x" + "00" * 32)
    assert status == 404


def code_of(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


# ---------------------------------------------------------------------------- observation 1


@pytest.mark.parametrize("opener,closer", [(b"[", b"]"), (b'{"a":', b"}")])
def test_a_100000_deep_body_is_refused_before_parsing(api: ServiceProcess, opener: bytes, closer: bytes) -> None:
    """A 100,000-deep array or object (unsigned) is 400 JSON_TOO_DEEP; the process lives."""
    deep = opener * 100_000 + b"1" + closer * 100_000
    for path in ("/v1/terms", f"{TASK}/finalize", f"{TASK}/review"):
        response = post(api, path, deep)
        assert response.status_code == 400, response.text
        assert code_of(response) == "JSON_TOO_DEEP"
    assert_alive(api)


def test_deep_body_with_a_long_integer_takes_no_other_parser_path(api: ServiceProcess) -> None:
    """A 19+ digit integer (the exact, standard-library path) changes nothing: still refused."""
    deep = b"[" * 50_000 + b"12345678901234567890123" + b"]" * 50_000
    response = post(api, "/v1/terms", deep)
    assert response.status_code == 400
    assert code_of(response) == "JSON_TOO_DEEP"
    # Exactly MAX_DEPTH levels (the object is one) passes the guard: the unsigned request is then 401.
    at_limit = b"[" * (MAX_DEPTH - 1) + b"12345678901234567890123" + b"]" * (MAX_DEPTH - 1)
    response = post(api, f"{TASK}/finalize", b'{"result":' + at_limit + b"}")
    assert response.status_code == 401, response.text
    assert code_of(response) == "AUTH_REQUIRED"
    assert_alive(api)


def test_every_entry_point_starts_with_a_safe_recursion_limit() -> None:
    """After the CLI's start-up and every service import (py_ecc among them), the limit is Python's default."""
    script = (
        "import sys\n"
        "from escrowd.cli import settle_recursion_limit\n"
        "settle_recursion_limit()\n"
        "import api.app, verification.service, relayer.settlement.service\n"
        "import lifecycle.consumer, lifecycle.reputation.consumer, indexer.service, escrowd.run\n"
        "import py_ecc\n"
        "print(sys.getrecursionlimit())\n"
    )
    raised = subprocess.run(
        [sys.executable, "-c", "import sys, py_ecc; print(sys.getrecursionlimit())"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert int(raised.stdout) > SAFE_RECURSION_LIMIT  # the hazard is real without the guard
    settled = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert int(settled.stdout) == SAFE_RECURSION_LIMIT


def test_the_api_process_serves_with_the_safe_limit(api: ServiceProcess) -> None:
    """The real `escrowd api serve` reports the limit in force once everything is imported."""
    starting = [json.loads(line) for line in api.log().splitlines() if '"api_starting"' in line]
    assert starting and starting[0]["recursion_limit"] == SAFE_RECURSION_LIMIT


# ---------------------------------------------------------------------------- observation 4


def _raw_request(api: ServiceProcess, head: bytes, body_size: int) -> tuple[bytes, int]:
    """Send `head`, then stream up to `body_size` zero bytes; return the answer and bytes sent."""
    port = int(api.url.rsplit(":", 1)[1])
    sent = 0
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head)
        sock.setblocking(False)
        chunk = b"0" * 65536
        deadline = time.monotonic() + 120
        while sent < body_size and time.monotonic() < deadline:
            try:
                data = sock.recv(65536)
                if not data:
                    break  # the server closed the connection
                answer += data
            except BlockingIOError:
                pass
            except OSError:
                break
            try:
                sent += sock.send(chunk[: body_size - sent])
            except BlockingIOError:
                time.sleep(0.01)
            except OSError:
                break  # reset / broken pipe: the server stopped reading
        sock.setblocking(True)
        sock.settimeout(10)
        with_rest = answer
        try:
            while b"\r\n\r\n" not in with_rest:
                data = sock.recv(65536)
                if not data:
                    break
                with_rest += data
        except OSError:
            pass
        return with_rest, sent


def test_a_100mb_unsigned_body_is_413_before_it_is_read(api: ServiceProcess) -> None:
    """Content-Length 100 MB: 413 BODY_TOO_LARGE; the server stops reading; its memory stays flat."""
    size = 100 * 1024 * 1024
    rss_before = api.rss_bytes()
    head = (
        f"POST /v1/terms HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n\r\n"
    ).encode()
    answer, sent = _raw_request(api, head, size)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"BODY_TOO_LARGE" in answer
    assert sent < size // 2, f"the server consumed {sent} of {size} bytes"
    assert api.rss_bytes() - rss_before < 50 * 1024 * 1024
    assert_alive(api)


def test_a_chunked_body_is_cut_off_once_past_the_limit(api: ServiceProcess) -> None:
    """No Content-Length: the body is counted while it streams in and refused past 1 MiB."""
    head = b"POST /v1/terms HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    size = 64 * 1024 * 1024
    port = int(api.url.rsplit(":", 1)[1])
    piece = b"10000\r\n" + b"0" * 0x10000 + b"\r\n"
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head)
        try:
            while sent < size:
                sock.sendall(piece)
                sent += 0x10000
        except OSError:
            pass
        sock.settimeout(10)
        answer = b""
        try:
            while b"\r\n\r\n" not in answer:
                data = sock.recv(65536)
                if not data:
                    break
                answer += data
        except OSError:
            pass
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert sent < size
    assert_alive(api)


# ---------------------------------------------------------------------------- observations 3 and 5


def test_observation_3_inputs_are_precise_4xx(api: ServiceProcess) -> None:
    """Lone surrogate in a finalize result, NUL in salt, chainId 2**64 on GET state: 4xx with a code."""
    surrogate = post(api, f"{TASK}/finalize", b'{"result": {"output": "\\ud800"}}')
    assert surrogate.status_code == 400
    assert code_of(surrogate) == "JSON_INVALID"
    assert "surrogate" in surrogate.json()["error"]["message"]
    nul = post(api, "/v1/terms", json.dumps(terms_body(salt="a\u0000b")).encode())
    assert nul.status_code == 400
    assert code_of(nul) == "JSON_INVALID"
    huge = httpx.get(f"{api.url}/v1/tasks/{2**64}/{ESCROW}/1/state", timeout=30)
    assert huge.status_code == 422
    assert code_of(huge) == "INVALID_REQUEST"
    huge_task = httpx.get(f"{api.url}/v1/tasks/31337/{ESCROW}/{2**256}/state", timeout=30)
    assert huge_task.status_code == 422
    assert_alive(api)


@pytest.mark.parametrize(
    "path,body,field",
    [
        ("/v1/terms", terms_body(chainId="31337"), "chainId"),
        ("/v1/terms", terms_body(private="yes"), "private"),
        ("/v1/terms", terms_body(private=1), "private"),
        ("/v1/terms", terms_body(chainId=31337.5), "chainId"),
        ("/v1/terms", terms_body(chainId=True), "chainId"),
        (f"{TASK}/review", {"attempt": 1, "evidenceHash": "0x" + "00" * 32, "passed": "yes"}, "passed"),
        (f"{TASK}/review", {"attempt": 1, "evidenceHash": "0x" + "00" * 32, "passed": 1}, "passed"),
        (f"{TASK}/verifier-report", {"attempt": "1", "evidenceHash": "0x" + "00" * 32, "outcome": "error"}, "attempt"),
    ],
)
def test_types_are_strict(api: ServiceProcess, path: str, body: dict[str, Any], field: str) -> None:
    """No string → number, no truthy strings or numbers → bool: 422 naming the field (before any signature check).

    (`31337.0` is the integer 31337: JSON has one number type.)
    """
    response = post(api, path, json.dumps(body).encode())
    assert response.status_code == 422, response.text
    assert code_of(response) == "INVALID_REQUEST"
    assert field in response.json()["error"]["message"]


def test_405_names_the_allowed_methods(api: ServiceProcess) -> None:
    """A wrong method is 405 with `Allow`, in the error shape."""
    response = httpx.delete(api.url + "/v1/terms", timeout=30)
    assert response.status_code == 405
    assert "POST" in response.headers["allow"]
    assert code_of(response) == "METHOD_NOT_ALLOWED"


def test_a_non_json_body_is_415(api: ServiceProcess) -> None:
    """Bodies are JSON: another media type is refused with its own code."""
    response = post(api, "/v1/terms", b"chainId=1", headers={"content-type": "application/x-www-form-urlencoded"})
    assert response.status_code == 415
    assert code_of(response) == "UNSUPPORTED_MEDIA_TYPE"


def test_openapi_lists_every_status_the_routes_return(api: ServiceProcess) -> None:
    """Each operation documents the refusals the guard and the validation can give."""
    spec = httpx.get(api.url + "/openapi.json", timeout=30).json()
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            statuses = set(operation["responses"])
            assert "422" in statuses, (method, path)
            if method == "post":
                assert {"400", "413", "415", "422"} <= statuses, (method, path, statuses)
            error = operation["responses"]["422"]["content"]["application/json"]["schema"]
            assert error["$ref"].endswith("/ApiError"), (method, path, error)


# ---------------------------------------------------------------------------- hostile corpus


def _corpus() -> list[tuple[str, str, bytes]]:
    deep_mixed = b'{"a":[' * 40_000 + b"0" + b"]}" * 40_000
    return [
        ("deep arrays", "/v1/terms", b"[" * 200_000),
        ("deep objects", "/v1/terms", b'{"a":' * 200_000),
        ("deep mixed", f"{TASK}/finalize", deep_mixed),
        ("deep inside strings is fine but unterminated", "/v1/terms", b'{"a":"' + b"[" * 100_000),
        ("huge integer", f"{TASK}/finalize", b'{"result": ' + b"9" * 5000 + b"}"),
        ("huge float", f"{TASK}/finalize", b'{"result": 1e999999}'),
        ("NaN", f"{TASK}/finalize", b'{"result": NaN}'),
        ("invalid UTF-8", "/v1/terms", b'{"salt": "\xff\xfe"}'),
        ("encoded surrogate", "/v1/terms", b'{"salt": "\xed\xa0\x80"}'),
        ("lone low surrogate", f"{TASK}/finalize", b'{"result": "\\udc00"}'),
        ("lone surrogate key", f"{TASK}/finalize", b'{"result": {"\\ud800": 1}}'),
        ("NUL in a key", f"{TASK}/finalize", b'{"result": {"a\\u0000": 1}}'),
        ("not JSON", f"{TASK}/review", b"{passed: true"),
        ("empty object", f"{TASK}/review", b"{}"),
        ("wrong top-level type", f"{TASK}/review", b"[true]"),
        ("wrong type", f"{TASK}/review", b'{"passed": null}'),
        ("unknown field", f"{TASK}/review", b'{"passed": true, "admin": true}'),
        ("unknown field in terms", "/v1/terms", json.dumps(terms_body(extra=1)).encode()),
        ("2 MB body", "/v1/terms", b'{"salt": "' + b"a" * 2_000_000 + b'"}'),
        ("huge chain id", "/v1/terms", json.dumps(terms_body(chainId=2**64)).encode()),
        ("many reasons", f"{TASK}/review", json.dumps({"passed": True, "reasons": ["x"] * 10_000}).encode()),
    ]


@pytest.mark.parametrize("name,path,body", _corpus(), ids=[c[0] for c in _corpus()])
def test_hostile_corpus_gets_4xx_and_the_process_stays_responsive(
    api: ServiceProcess, name: str, path: str, body: bytes
) -> None:
    """Each hostile body is a 4xx in the error shape; the process answers afterwards."""
    response = post(api, path, body)
    assert 400 <= response.status_code < 500, (name, response.status_code, response.text[:300])
    assert code_of(response)
    assert_alive(api)


def test_an_integral_float_is_an_integer(api: ServiceProcess) -> None:
    """`"chainId": 31337.0` passes validation (the unsigned request then stops at the signature)."""
    response = post(api, "/v1/terms", json.dumps(terms_body(chainId=31337.0)).encode())
    assert response.status_code == 401
    assert code_of(response) == "AUTH_REQUIRED"


def test_a_signed_path_too_long_for_a_proof_is_400_not_500(api: ServiceProcess) -> None:
    """A validly signed request whose path and query exceed what a proof may carry (found by
    the signed fuzz: a 2 KiB+ query string made the proof's validation raise, a 500)."""
    path = "/v1/verifiers/me/queue?limit=5&pad=" + "x" * MAX_SIGNED_PATH_CHARS
    request = UnsignedRequest(
        "GET", path, deployment=Deployment(chain_id=TEST_CHAIN_ID, escrow=TEST_ESCROW),
        expires_at=int(time.time()) + 60,
    )  # fmt: skip
    response = httpx.get(api.url + path, headers=sign_request("0x" + "4f" * 32, request), timeout=30)
    assert response.status_code == 400, response.text
    assert code_of(response) == "PATH_TOO_LONG"
    assert_alive(api)
