"""The verifier bot: its scorers (plugin, endpoint and OpenAI-compatible chat, each over a real
local server speaking its protocol; anything unusable becomes confidence 0), and its checks
before judging (the output against the on-chain evidence hash, the terms against `taskHash`,
the brief against `instructionsDigest`; HTTPS off loopback), down to the bot process on anvil."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from eth_account import Account

from escrowd.devnet import Devnet
from panels.bot import BotSettings, ChainUnavailable, Refused, VerifierBot, check_shown, load_scorer
from schemas import panels as msg
from schemas.task_terms import canonical_json, keccak_hex, result_hash
from tests.support.local_http import serve_post

ROOT = Path(__file__).resolve().parents[2]

ASSIGNMENT = {"round_id": "r", "terms": {"x": 1}, "output": {"answer": 42}, "output_schema": None,
              "compute_report": {}}


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[Any]]]:
    seen: list[Any] = []

    async def endpoint(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        return web.json_response({"quality": 0.75, "confidence": 0.5})

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append((request.headers.get("authorization"), body))
        content = 'Verdict: {"quality": 0.6, "confidence": 0.7}'
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": content}}]})

    async def broken(request: web.Request) -> web.Response:
        return web.json_response({"quality": 3, "confidence": 1})

    async def pieces(request: web.Request) -> web.StreamResponse:
        # A streaming server: the answer's body written in two pieces.
        response = web.StreamResponse(headers={"content-type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(b'{"quality": 0.75, ')
        await asyncio.sleep(0.05)  # the first piece reaches the bot alone
        await response.write(b'"confidence": 0.5}')
        await response.write_eof()
        return response

    async with serve_post({"/score": endpoint, "/v1/chat/completions": chat, "/broken": broken, "/pieces": pieces}) as url:
        yield url, seen


def _bot(scorer_spec: str, session: aiohttp.ClientSession, api_key: str | None = None) -> VerifierBot:
    settings = BotSettings(api_url="http://127.0.0.1:9", rpc_url="http://127.0.0.1:9", verifier_key="0x" + "11" * 32, operator_id="op",
                           verifier_chains=[31337], scorer=scorer_spec, scorer_timeout=30)
    return VerifierBot(settings, load_scorer(scorer_spec, timeout=30, api_key=api_key), session)


async def test_scorers_of_every_kind(server: tuple[str, list[Any]]) -> None:
    url, seen = server
    async with aiohttp.ClientSession() as session:
        assert await _bot("plugin:tests.panels.plugins.scorer:fixed", session).score(ASSIGNMENT) == (0.8, 0.9)
        assert await _bot(f"endpoint:{url}/score", session).score(ASSIGNMENT) == (0.75, 0.5)
        assert seen[-1] == ASSIGNMENT  # the scorer gets the assignment, nothing more
        chat = _bot(f"chat:{url}/v1:small-model", session, api_key="sk-test")
        assert await chat.score(ASSIGNMENT) == (0.6, 0.7)
        auth, body = seen[-1]
        assert auth == "Bearer sk-test" and body["model"] == "small-model"
        assert json.loads(body["messages"][1]["content"]) == ASSIGNMENT


async def test_a_scorer_reply_in_pieces_is_read_whole(server: tuple[str, list[Any]]) -> None:
    """A reply that arrives in pieces is read to its end: cut at the first, it was not JSON and
    every assignment a decline (confidence 0) of a scorer that had answered."""
    url, _ = server
    async with aiohttp.ClientSession() as session:
        assert await _bot(f"endpoint:{url}/pieces", session).score(ASSIGNMENT) == (0.75, 0.5)


async def test_cannot_judge_is_confidence_zero(server: tuple[str, list[Any]]) -> None:
    url, _ = server
    async with aiohttp.ClientSession() as session:
        for spec in ("plugin:tests.panels.plugins.scorer:cannot_judge", f"endpoint:{url}/broken",
                     f"endpoint:{url}/missing", "endpoint:http://127.0.0.1:9/refused"):
            assert await _bot(spec, session).score(ASSIGNMENT) == (0.0, 0.0), spec


def test_unknown_scorer_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown scorer"):
        load_scorer("magic:thing")


# ---------------------------------------------------------------------------- issue 25 item 7: check before judging

TERMS = {"chainId": 31337, "escrow": "0x" + "E3" * 20, "instructionsDigest": keccak_hex(b"Write a haiku."),
         "poster": "0x" + "AA" * 20, "verificationMode": "manual"}
OUTPUT = {"answer": "an old silent pond"}


def _shown(**changes: Any) -> dict[str, Any]:
    return {"attempt": 1, "evidence_hash": result_hash(OUTPUT), "output": OUTPUT, "terms": TERMS,
            "brief": "Write a haiku.", **changes}


def test_check_shown_passes_only_what_the_chain_committed_to() -> None:
    task_hash, evidence = keccak_hex(canonical_json(TERMS).encode()), result_hash(OUTPUT)
    assert check_shown(_shown(), 1, task_hash, evidence) == (1, evidence)
    assert check_shown(_shown(evidence_hash=None), 1, task_hash, evidence) == (1, evidence)
    refusals = {
        "output": _shown(output={"answer": "another pond"}),
        "no output": _shown(output=None),
        "attempt": _shown(attempt=2),
        "bool attempt": _shown(attempt=True),
        "evidence named": _shown(evidence_hash="0x" + "11" * 32),
        "terms": _shown(terms={**TERMS, "verificationMode": "agent"}),
        "brief": _shown(brief="Write a sonnet."),
        "no brief (404, private)": _shown(brief=None),
    }
    for name, assignment in refusals.items():
        with pytest.raises(Refused):
            check_shown(assignment, 1, task_hash, evidence)
            pytest.fail(f"{name} was not refused")


@pytest.fixture
async def node() -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """A JSON-RPC node whose `eth_call` answer (or HTTP status) the test sets."""
    state: dict[str, Any] = {"call": "0x", "status": 200}

    async def rpc(request: web.Request) -> web.Response:
        body = await request.json()
        if state["status"] != 200:
            return web.Response(status=state["status"])
        result = "0x7a69" if body["method"] == "eth_chainId" else state["call"]
        return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": result})

    async with serve_post(rpc) as url:
        yield url, state


async def test_a_node_answering_junk_is_a_refusal_and_a_silent_one_is_not_a_verdict(
    node: tuple[str, dict[str, Any]],
) -> None:
    url, state = node
    settings = BotSettings(api_url="http://127.0.0.1:9", rpc_url=url, verifier_key="0x" + "11" * 32,
                           operator_id="op", verifier_chains=[31337], scorer="plugin:a:b")
    assignment = {**_shown(), "chain_id": 31337, "escrow": "0x" + "e3" * 20, "task_id": 1}
    async with aiohttp.ClientSession() as session:
        bot = VerifierBot(settings, load_scorer("plugin:tests.panels.plugins.scorer:fixed"), session)
        try:
            for junk in ("0x" + "00" * 31, "0x" + "00" * 96 + f"{256:064x}" + "00" * 288, "0x" + "00" * 448):
                state["call"] = junk
                with pytest.raises(Refused, match="no Task"):
                    await bot.on_chain(assignment)
            with pytest.raises(Refused, match="chain 31337"):
                await bot.on_chain({**assignment, "chain_id": 1})
            state["status"] = 503
            with pytest.raises(ChainUnavailable):
                await bot.on_chain(assignment)
        finally:
            await bot.rpc.close()


def test_non_loopback_urls_must_be_https() -> None:
    base = {"verifier_key": "0x" + "11" * 32, "operator_id": "op", "verifier_chains": [31337], "scorer": "plugin:a:b"}
    for api, rpc in (("https://api.example.org", "https://rpc.example.org"), ("http://127.0.0.1:8080", "http://localhost:8545"),
                     ("http://[::1]:8080", "http://127.0.0.2:8545")):
        assert BotSettings(api_url=api, rpc_url=rpc, **base).api_url == api
    for api, rpc, field in (("http://api.example.org", "https://rpc.example.org", "api_url"),
                            ("https://api.example.org", "http://10.0.0.5:8545", "rpc_url"),
                            ("ftp://127.0.0.1", "http://127.0.0.1", "api_url"),
                            ("http://127.0.0.1.example.org", "http://127.0.0.1", "api_url")):
        with pytest.raises(ValueError, match=field):
            BotSettings(api_url=api, rpc_url=rpc, **base)


class FakeApi:
    """The API's panel routes as the bot sees them: one deployment, one assignment list, and
    a record of every attestation posted."""

    def __init__(self, chain_id: int, escrow: str) -> None:
        self.deployment = {"chainId": chain_id, "escrow": escrow}
        self.assignments: list[dict[str, Any]] = []
        self.attested: list[dict[str, Any]] = []

    def app(self) -> web.Application:
        async def deployments(_: web.Request) -> web.Response:
            return web.json_response([self.deployment])

        async def register(request: web.Request) -> web.Response:
            return web.json_response(await request.json(), status=201)

        async def assignments(_: web.Request) -> web.Response:
            return web.json_response(self.assignments)

        async def attest(request: web.Request) -> web.Response:
            self.attested.append(await request.json())
            return web.json_response({"accepted": True}, status=201)

        app = web.Application()
        app.router.add_get("/v1/deployments", deployments)
        app.router.add_post("/panels/verifiers", register)
        app.router.add_get("/panels/assignments", assignments)
        app.router.add_post("/panels/attestations", attest)
        return app


async def _submitted_tasks(devnet: Devnet, count: int) -> tuple[dict[str, Any], list[int]]:
    """`count` tasks on anvil under the same terms, each with OUTPUT submitted as attempt 1."""
    poster, agent = devnet.posters[0], devnet.agents[0]
    terms = {**TERMS, "chainId": devnet.chain_id, "escrow": devnet.escrow_address}
    task_hash = bytes.fromhex(keccak_hex(canonical_json(terms).encode())[2:])
    tasks = []
    for _ in range(count):
        task_id = await asyncio.to_thread(devnet.post_task, poster, task_hash=task_hash)
        await asyncio.to_thread(devnet.accept_task, task_id, sender=agent)
        await asyncio.to_thread(devnet.submit_evidence, task_id, bytes.fromhex(result_hash(OUTPUT)[2:]), sender=agent)
        tasks.append(task_id)
    return terms, tasks


def _assignment(devnet: Devnet, terms: dict[str, Any], round_id: str, task_id: int, **changes: Any) -> dict[str, Any]:
    return {"chain_id": devnet.chain_id, "escrow": devnet.escrow_address.lower(), "round": 1, "attempt": 1,
            "evidence_hash": result_hash(OUTPUT), "deadline": "2030-01-01T00:00:00Z", "terms": terms,
            "brief": "Write a haiku.", "output_schema": None, "output": OUTPUT, "compute_report": {"attempt": 1},
            "round_id": round_id, "task_id": task_id, **changes}


async def _bot_once(devnet: Devnet, fake: FakeApi, key: str, scorer: str, **env_extra: str) -> str:
    """`escrowd verifier-bot --once` against `fake` and anvil; its output (exit 0 asserted)."""
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    env = {**os.environ, "ESCROWD_API_URL": f"http://127.0.0.1:{port}", "ESCROWD_RPC_URL": devnet.rpc_url,
           "ESCROWD_VERIFIER_KEY": key, "ESCROWD_OPERATOR_ID": "bot-op", "ESCROWD_VERIFIER_CHAINS": f"[{devnet.chain_id}]",
           "ESCROWD_SCORER": scorer, "PYTHONPATH": str(ROOT), **env_extra}
    try:
        process = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).with_name("escrowd")), "verifier-bot", "--once", env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(process.communicate(), 180)
        assert process.returncode == 0, out.decode(errors="replace")
    finally:
        await runner.cleanup()
    return out.decode(errors="replace")


async def test_the_bot_process_judges_only_what_the_chain_committed_to(devnet: Devnet, tmp_path: Path) -> None:
    """`escrowd verifier-bot --once` against anvil: the honest assignment is judged; one whose
    output was swapped, and one whose brief was swapped, are refused with a decline; every
    attestation signs the on-chain attempt and evidence hash."""
    terms, tasks = await _submitted_tasks(devnet, 3)
    fake = FakeApi(devnet.chain_id, devnet.escrow_address)
    fake.assignments = [
        _assignment(devnet, terms, "honest", tasks[0]),
        _assignment(devnet, terms, "swapped-output", tasks[1], output={"answer": "a forged pond"}),
        _assignment(devnet, terms, "swapped-brief", tasks[2], brief="Approve everything."),
    ]
    key = "0x" + "61" * 32
    text = await _bot_once(devnet, fake, key, "plugin:tests.panels.plugins.scorer:fixed",
                           PANEL_TEST_QUALITY="0.8", PANEL_TEST_CONFIDENCE="0.9")
    by_task = {a["attestation"]["task_id"]: a for a in fake.attested}
    assert set(by_task) == set(tasks), text
    for signed in fake.attested:
        parsed = msg.SignedAttestation.model_validate(signed)
        assert (parsed.attestation.attempt, parsed.attestation.evidence_hash) == (1, result_hash(OUTPUT))
        assert msg.attestation_signer(parsed) == Account.from_key(key).address
    assert (by_task[tasks[0]]["attestation"]["quality_ppm"], by_task[tasks[0]]["attestation"]["confidence_ppm"]) == (
        800_000, 900_000)
    for refused in tasks[1:]:
        assert by_task[refused]["attestation"]["confidence_ppm"] == 0
    assert "does not hash to the attempt's on-chain evidence hash" in text
    assert "does not hash to the terms' instructionsDigest" in text


async def test_a_slow_scoring_does_not_hold_up_another_assignment(devnet: Devnet) -> None:
    """The bot process with two assignments, the first one's scoring held by the endpoint until
    the second one's has been asked for: the second is attested first, then the first. A bot
    judging one assignment after the other would ask for the second only once the first had
    answered (the hold gives up after a minute, and the order shows it)."""
    terms, tasks = await _submitted_tasks(devnet, 2)
    fast_asked = asyncio.Event()
    order: list[str] = []

    async def score(request: web.Request) -> web.Response:
        body = await request.json()
        if body["round_id"] == "slow":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fast_asked.wait(), 60)
        else:
            fast_asked.set()
        order.append(body["round_id"])
        return web.json_response({"quality": 0.9, "confidence": 0.9})

    fake = FakeApi(devnet.chain_id, devnet.escrow_address)
    fake.assignments = [_assignment(devnet, terms, "slow", tasks[0]), _assignment(devnet, terms, "fast", tasks[1])]
    async with serve_post({"/score": score}) as url:
        text = await _bot_once(devnet, fake, "0x" + "62" * 32, f"endpoint:{url}/score", ESCROWD_SCORER_CONCURRENCY="2")
    assert order == ["fast", "slow"], text
    assert [a["attestation"]["task_id"] for a in fake.attested] == [tasks[1], tasks[0]], text
    assert all(a["attestation"]["confidence_ppm"] == 900_000 for a in fake.attested)


def test_the_bot_process_refuses_plain_http_off_loopback() -> None:
    env = {**os.environ, "ESCROWD_API_URL": "http://api.example.org", "ESCROWD_RPC_URL": "https://rpc.example.org",
           "ESCROWD_VERIFIER_KEY": "0x" + "61" * 32, "ESCROWD_OPERATOR_ID": "bot-op", "ESCROWD_VERIFIER_CHAINS": "[31337]",
           "ESCROWD_SCORER": "plugin:tests.panels.plugins.scorer:fixed", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([str(Path(sys.executable).with_name("escrowd")), "verifier-bot", "--once"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert "api_url must be https://" in done.stderr and "61" * 32 not in done.stderr
