"""Verification load without a chain: what the judging bench and the judging tests share.

* `LatencyVerifier`: a local endpoint verifier (seed 001's protocol: POST `{task, trajectory}`,
  answer `{reward}`) that takes a set latency per path, can hold a path's calls until
  released, and records every call. The trajectory is the finalized result,
  `{"task", "attempt", "pass"}`: reward 1 when `pass`, else 0.
* `Feed`: writes what the verification consumer reads, as its publishers would: the terms
  row (the API's), escrow events on the events topic (the indexer's messages) and
  finalize requests on the requests topic, signed by an API service key the consumer trusts.
* `VerificationProcess`: `escrowd consume verification run` as a child process.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from aiohttp import web
from eth_account import Account

from escrowd.harness import EscrowdProcess
from indexer.decode import DecodedLog
from indexer.store import event_message
from runtime.db import connect
from runtime.kafka import TopicSpec, encode_headers, ensure_topics, make_producer
from runtime.outbox import OutboxMessage
from schemas import jsoncodec
from schemas.events import event_id
from schemas.task_terms import FinalizeRequested, TaskTerms, result_hash
from verification import results_store as store
from verification.consumer import request_message
from verification.request_auth import request_id_for, service_proof

CHAIN_ID = 31337
ESCROW = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
ZERO = "0x" + "0" * 40
POSTER = "0x1000000000000000000000000000000000000001"
AGENT = "0x2000000000000000000000000000000000000002"


@dataclass(frozen=True)
class Call:
    """One call the verifier answered (monotonic seconds)."""

    path: str
    task: int
    attempt: int
    started: float
    ended: float


@dataclass
class LatencyVerifier:
    """A local endpoint verifier with a latency per path (see the module docstring)."""

    latency_ms: dict[str, float] = field(default_factory=dict)
    default_latency_ms: float = 0.0
    calls: list[Call] = field(default_factory=list)
    started: list[tuple[str, int, int]] = field(default_factory=list)
    held: dict[str, asyncio.Event] = field(default_factory=dict)
    _runner: web.AppRunner | None = None
    base_url: str = ""

    async def start(self) -> str:
        """Serve on 127.0.0.1 (a free port); returns the base URL."""
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_post("/{name}", self._verify)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}"
        return self.base_url

    async def stop(self) -> None:
        for event in self.held.values():
            event.set()
        if self._runner is not None:
            await self._runner.cleanup()

    def url(self, name: str) -> str:
        return f"{self.base_url}/{name}"

    def hold(self, name: str) -> None:
        """Calls to `name` wait (after their latency) until `release(name)`."""
        self.held[name] = asyncio.Event()

    def release(self, name: str) -> None:
        event = self.held.pop(name, None)
        if event is not None:
            event.set()

    async def _verify(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        began = time.monotonic()
        body = await request.json()
        result = body.get("trajectory") or {}
        task, attempt = int(result.get("task", -1)), int(result.get("attempt", 0))
        self.started.append((name, task, attempt))
        await asyncio.sleep(self.latency_ms.get(name, self.default_latency_ms) / 1000)
        held = self.held.get(name)
        if held is not None:
            await held.wait()
        self.calls.append(Call(name, task, attempt, began, time.monotonic()))
        return web.json_response({"reward": 1.0 if result.get("pass") else 0.0})


class Feed:
    """Writes terms, escrow events and signed finalize requests for the verification consumer."""

    def __init__(self, database_url: str, bootstrap: str, prefix: str, *, session_timeout_ms: int | None = None) -> None:
        self.database_url = database_url
        self.bootstrap = bootstrap
        self.prefix = prefix
        self.session_timeout_ms = session_timeout_ms
        """The consumers' group session timeout (None: the service's default)."""
        self.events = f"{prefix}escrow.events.v1"
        self.requests = f"{prefix}escrow.verification-requests.v1"
        self.verdicts = f"{prefix}escrow.verdicts.v1"
        self.dead_letters = f"{prefix}escrow.dlq.v1"
        self.group = f"{prefix}verification"
        self.signing_key = "0x" + secrets.token_hex(32)
        self.service_key = "0x" + secrets.token_hex(32)
        self.block = 1000
        self._producer = make_producer(bootstrap)
        self.conn: asyncpg.Connection | None = None

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a verification consumer reading this feed."""
        service = Account.from_key(self.service_key).address
        return {
            "ESCROWD_DATABASE_URL": self.database_url, "ESCROWD_KAFKA_BOOTSTRAP": self.bootstrap,
            "ESCROWD_VERIFICATION_SIGNING_KEY": self.signing_key, "ESCROWD_VERIFICATION_GROUP": self.group,
            "ESCROWD_EVENTS_TOPIC": self.events, "ESCROWD_VERIFICATION_REQUESTS_TOPIC": self.requests,
            "ESCROWD_VERDICTS_TOPIC": self.verdicts, "ESCROWD_DEAD_LETTER_TOPIC": self.dead_letters,
            "ESCROWD_TRUSTED_API_SIGNERS": jsoncodec.dumps([service]).decode(),
            "ESCROWD_ENDPOINT_HOSTS": '["127.0.0.1"]',
            **({} if self.session_timeout_ms is None else {"ESCROWD_KAFKA_SESSION_TIMEOUT_MS": str(self.session_timeout_ms)}),
            **extra,
        }  # fmt: skip

    async def start(self, partitions: int = 4) -> None:
        await ensure_topics(self.bootstrap, [
            TopicSpec(self.events, partitions), TopicSpec(self.requests, partitions),
            TopicSpec(self.verdicts, partitions), TopicSpec(self.dead_letters, 1),
        ])  # fmt: skip
        await self._producer.start()
        self.conn = await connect(self.database_url)

    async def stop(self) -> None:
        await self._producer.stop()
        if self.conn is not None:
            await self.conn.close()

    async def _send(self, message: OutboxMessage) -> None:
        await self._producer.send_and_wait(
            message.topic, message.payload, key=message.key, headers=encode_headers(message.headers)
        )

    async def event(self, task_id: int, name: str, args: dict[str, Any]) -> None:
        """One escrow event as the indexer publishes it."""
        self.block += 1
        block_hash = "0x" + f"{self.block:064x}"
        log = DecodedLog(
            id=event_id(CHAIN_ID, block_hash, 0), chain_id=CHAIN_ID, escrow_address=ESCROW, block_number=self.block,
            block_hash=block_hash, block_timestamp=int(time.time()), tx_hash=block_hash, tx_index=0, log_index=0,
            event=name, task_id=task_id, args=args,
        )  # fmt: skip
        await self._send(event_message(log, self.events))

    async def task(self, task_id: int, verifier_url: str) -> None:
        """Terms judged by `verifier_url`, then TaskCreated and TaskAccepted."""
        assert self.conn is not None
        task_hash = "0x" + secrets.token_hex(32)
        terms = TaskTerms.model_validate({
            "chainId": CHAIN_ID, "escrow": ESCROW, "poster": POSTER, "instructionsDigest": "0x" + secrets.token_hex(32),
            "verificationMode": "auto", "verifier": {"kind": "endpoint", "ref": verifier_url},
        })  # fmt: skip
        await store.insert_terms(self.conn, task_hash, terms)
        deadline = int(time.time()) + 86_400
        await self.event(task_id, "TaskCreated", {
            "taskId": task_id, "poster": POSTER, "verifier": ZERO, "token": ZERO, "reward": 10**7,
            "deadline": deadline, "taskHash": task_hash, "status": 0,
        })  # fmt: skip
        await self.event(task_id, "TaskAccepted", {"taskId": task_id, "agent": AGENT, "status": 1})

    @staticmethod
    def result(task_id: int, attempt: int, passed: bool) -> dict[str, Any]:
        return {"task": task_id, "attempt": attempt, "pass": passed}

    async def submit(self, task_id: int, attempt: int, passed: bool) -> None:
        """EvidenceSubmitted for the attempt's result, then the agent's finalize (service-signed)."""
        result = self.result(task_id, attempt, passed)
        evidence = result_hash(result)
        await self.event(task_id, "EvidenceSubmitted", {
            "taskId": task_id, "agent": AGENT, "attempt": attempt, "evidenceHash": evidence, "status": 2,
        })  # fmt: skip
        request = FinalizeRequested(
            request_id=request_id_for("finalize", CHAIN_ID, ESCROW, task_id, attempt, evidence), chain_id=CHAIN_ID,
            escrow_address=ESCROW, task_id=task_id, attempt=attempt, evidence_hash=evidence, actor=AGENT,
            requested_at=int(time.time()), result=result,
        )  # fmt: skip
        request = request.model_copy(update={"service": service_proof(request, self.service_key)})
        await self._send(request_message(request, self.requests))

    async def judged_on_chain(self, task_id: int, attempt: int, passed: bool) -> None:
        """The attempt's VerificationCompleted (what settling a verdict indexes)."""
        evidence = result_hash(self.result(task_id, attempt, passed))
        await self.event(task_id, "VerificationCompleted", {
            "taskId": task_id, "verifier": ZERO, "attempt": attempt, "evidenceHash": evidence, "passed": passed,
            "score": 100 if passed else 0, "agent": AGENT, "agentPayout": 0, "fee": 0,
            "failedAt": 0 if passed else int(time.time()), "status": 4 if passed else 3,
        })  # fmt: skip

    async def consumed(self, count: int, timeout: float = 120.0) -> None:  # noqa: ASYNC109  (a deadline for the whole wait)
        """Until the consumer's inbox holds `count` messages."""
        assert self.conn is not None
        deadline = time.monotonic() + timeout
        while await self.conn.fetchval("SELECT count(*) FROM consumer_inbox WHERE consumer = $1", self.group) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the consumer handled fewer than {count} messages in {timeout:g} s")
            await asyncio.sleep(0.05)

    async def results(self) -> list[asyncpg.Record]:
        """Every recorded verdict of this feed's chain: task, attempt, passed, when."""
        assert self.conn is not None
        rows: list[asyncpg.Record] = await self.conn.fetch(
            "SELECT task_id, attempt, passed, created_at FROM verification_results WHERE chain_id = $1"
            " AND escrow_address = $2 ORDER BY created_at",
            CHAIN_ID, ESCROW,
        )  # fmt: skip
        return rows


class VerificationProcess(EscrowdProcess):
    """`escrowd consume verification run` as a child process, output to a log file."""

    def __init__(self, env: dict[str, str]) -> None:
        super().__init__(["consume", "verification", "run"], env=env, name="verification")
