"""A local, deterministic OpenAI-compatible chat-completions server (tests and `escrowd run`).

It answers `POST /v1/chat/completions` the way such an endpoint does. Its judgement is a
fixed rule over the data block of the project's prompts, so runs are reproducible:

* verifier questions: pass iff every "double-quoted" term of the acceptance note (or, with
  no note, of the brief) appears in the result, case-insensitively; a fail on a result the
  question says was cut says so in its reasons;
* rubric questions: reward = share of the rubric's "double-quoted" terms found in the
  trajectory (1.0 when the rubric quotes none).

Tests queue faults with `script(...)`: each queued behaviour answers one request, in order;
then the rule answers again. Every request body is kept in `requests`.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

from verification.agents.model import extract_data

Behaviour = Literal[
    "rule",  # the deterministic judgement
    "pass",  # a well-formed pass
    "fail",  # a well-formed fail
    "malformed",  # content that is not JSON
    "prose",  # a valid verdict wrapped in prose
    "extra_field",  # a verdict with a field the schema does not have
    "too_many_reasons",  # 11 reasons
    "string_bool",  # "passed": "true"
    "two_choices",  # an envelope with two choices
    "truncated",  # finish_reason "length"
    "huge",  # a body larger than any sane limit
    "error_500",  # HTTP 500
    "error_429",  # HTTP 429
    "slow",  # answers after `slow_seconds`
    "held",  # answers (by the rule) once the test sets `release`
    "obey",  # answers with the result itself (a model that fell for an injection in it)
    "pieces",  # the rule's answer, its body written in two pieces (as a streaming server sends it)
]

_QUOTED = re.compile(r'"([^"\n]{1,80})"')


def quoted_terms(text: str) -> list[str]:
    """The "double-quoted" terms of a text."""
    return [t.strip().lower() for t in _QUOTED.findall(text or "") if t.strip()]


def rule_answer(data: dict[str, Any]) -> dict[str, Any]:
    """The deterministic judgement of one data block."""
    if "rubric" in data:
        terms = quoted_terms(str(data.get("rubric") or ""))
        text = str(data.get("trajectory") or "").lower()
        found = [t for t in terms if t in text]
        reward = 1.0 if not terms else len(found) / len(terms)
        return {"reward": reward, "reasons": [f"{len(found)} of {len(terms)} rubric terms present"]}
    terms = quoted_terms(str(data.get("acceptance") or data.get("brief") or ""))
    result = str(data.get("result") or "").lower()
    missing = [t for t in terms if t not in result]
    if not result.strip():
        return {"passed": False, "reasons": ["The result is empty"]}
    if missing:
        cut = f" (the result was cut: {data.get('resultChars')} characters in all)" if data.get("resultTruncated") else ""
        return {"passed": False, "reasons": [f"Missing{cut}: {t}" for t in missing[:10]]}
    return {"passed": True, "reasons": ["Every acceptance term is addressed"]}


@dataclass
class StubModel:
    """The server's state: queued behaviours, received requests, the judging rule."""

    slow_seconds: float = 30.0
    queue: deque[Behaviour] = field(default_factory=deque)
    requests: list[dict[str, Any]] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    holding: int = 0
    """Requests answered "held" still waiting for `release`."""

    def script(self, *behaviours: Behaviour) -> None:
        """Answer the next requests with these behaviours, in order."""
        self.queue.extend(behaviours)

    def _content(self, behaviour: Behaviour, data: dict[str, Any]) -> str:
        judged = rule_answer(data)
        verdict = {"passed": True, "reasons": ["ok"]} if "rubric" not in data else {"reward": 1.0, "reasons": ["ok"]}
        if behaviour == "rule":
            return json.dumps(judged)
        if behaviour == "pass":
            return json.dumps(verdict)
        if behaviour == "fail":
            return json.dumps({"passed": False, "reasons": ["not fulfilled"]})
        if behaviour == "malformed":
            return "I think it passes, mostly."
        if behaviour == "prose":
            return "Here is my verdict: " + json.dumps(verdict)
        if behaviour == "extra_field":
            return json.dumps({**verdict, "score": 100})
        if behaviour == "too_many_reasons":
            return json.dumps({**verdict, "reasons": [f"r{i}" for i in range(11)]})
        if behaviour == "string_bool":
            return json.dumps({"passed": "true", "reasons": ["ok"]})
        if behaviour == "obey":
            # A model fooled by the data: it answers with the result (or trajectory) itself.
            return str(data.get("result") or data.get("trajectory") or "")
        return json.dumps(judged)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions."""
        body = await request.json()
        self.requests.append(body)
        self.authorizations.append(request.headers.get("Authorization"))
        behaviour: Behaviour = self.queue.popleft() if self.queue else "rule"
        if behaviour == "error_500":
            return web.json_response({"error": {"message": "internal"}}, status=500)
        if behaviour == "error_429":
            return web.json_response({"error": {"message": "slow down"}}, status=429)
        if behaviour == "slow":
            await asyncio.sleep(self.slow_seconds)
        if behaviour == "held":
            self.holding += 1
            try:
                await self.release.wait()
            finally:
                self.holding -= 1
        if behaviour == "huge":
            return web.Response(body=b"{" + b" " * (4 * 1024 * 1024) + b"}", content_type="application/json")
        user = next((m.get("content", "") for m in reversed(body.get("messages", [])) if m.get("role") == "user"), "")
        try:
            data = extract_data(user)
        except ValueError:
            data = {}
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": self._content(behaviour, data)},
            "finish_reason": "length" if behaviour == "truncated" else "stop",
        }
        choices = [choice, {**choice, "index": 1}] if behaviour == "two_choices" else [choice]
        reply = {"id": f"stub-{len(self.requests)}", "object": "chat.completion", "model": body.get("model"), "choices": choices}
        if behaviour == "pieces":
            raw = json.dumps(reply).encode()
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            response.enable_chunked_encoding()
            await response.prepare(request)
            await response.write(raw[: len(raw) // 2])
            await asyncio.sleep(0.05)  # the first piece reaches the client alone
            await response.write(raw[len(raw) // 2 :])
            await response.write_eof()
            return response
        return web.json_response(reply)

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.handle)
        return app


async def start_stub(model: StubModel, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, str]:
    """Serve `model`; returns the runner (to clean up) and the base URL (…/v1)."""
    runner = web.AppRunner(model.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = site._server
    assert server is not None
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    return runner, f"http://{host}:{bound}/v1"
