"""The verifier bot's scorers: plugin, endpoint and OpenAI-compatible chat, each over a real
local server speaking its protocol; anything unusable becomes confidence 0."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from panels.bot import BotSettings, VerifierBot, load_scorer

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

    app = web.Application()
    app.router.add_post("/score", endpoint)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/broken", broken)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


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


async def test_cannot_judge_is_confidence_zero(server: tuple[str, list[Any]]) -> None:
    url, _ = server
    async with aiohttp.ClientSession() as session:
        for spec in ("plugin:tests.panels.plugins.scorer:cannot_judge", f"endpoint:{url}/broken",
                     f"endpoint:{url}/missing", "endpoint:http://127.0.0.1:9/refused"):
            assert await _bot(spec, session).score(ASSIGNMENT) == (0.0, 0.0), spec


def test_unknown_scorer_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown scorer"):
        load_scorer("magic:thing")
