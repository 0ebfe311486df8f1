"""Helpers for the verification tests: actors with keys, signed API calls, an indexed-chain writer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
import pytest

from api.app import create_app
from api.settings import ApiSettings
from escrowd.devnet import anvil_key
from escrowd.verification_load import Feed, LatencyVerifier, VerificationProcess
from indexer.decode import DecodedLog
from indexer.store import event_message
from runtime.consumer import IdempotentConsumer, InboundMessage
from runtime.db import connect, migrate_url
from runtime.outbox import enqueue
from runtime.web.auth import Deployment, UnsignedRequest, sign_request
from schemas import topics
from schemas.events import event_id
from schemas.task_terms import result_hash
from verification.consumer import Topics, VerificationHandler
from verification.judging_stage import JudgingPool
from verification.routing import RetryPolicy
from verification.signing import VerdictSigning
from verification.verifiers import default_registry

CHAIN_ID = 31337
ESCROW = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
ZERO = "0x" + "0" * 40
EVENTS = topics.ESCROW_EVENTS
REQUESTS = topics.VERIFICATION_REQUESTS
VERDICTS = topics.VERDICTS
DLQ = topics.DEAD_LETTERS


@dataclass(frozen=True)
class Who:
    """A test actor: address and key."""

    name: str
    address: str
    key: str


@pytest.fixture
def who() -> dict[str, Who]:
    """Poster, agent, other agent, verifier, marketplace verifier and a stranger."""
    names = ["poster", "agent", "agent2", "verifier", "marketplace", "stranger"]
    out = {}
    for index, name in enumerate(names, start=20):
        address, key = anvil_key(index)
        out[name] = Who(name, address, key)
    return out


_TASK_PATH = re.compile(r"^/v1/tasks/([0-9]+)/(0x[0-9a-fA-F]{40})/")


def deployment_of(path: str, body: Any, default: Deployment | None = None) -> Deployment:
    """The deployment a request acts on, as the API reads it: the task path, else the terms
    body, else the API's own (first) deployment."""
    match = _TASK_PATH.match(path)
    if match is not None and 0 < int(match.group(1)) < 2**256:
        return Deployment(int(match.group(1)), match.group(2))
    chain, escrow = (body.get("chainId"), body.get("escrow")) if isinstance(body, dict) else (None, None)
    if isinstance(chain, int) and 0 < chain < 2**256 and isinstance(escrow, str) and re.fullmatch(r"0x[0-9a-fA-F]{40}", escrow):
        return Deployment(chain, escrow)
    return default or Deployment(CHAIN_ID, ESCROW)


class Api:
    """An HTTP client of the real app (in process) that signs requests as one actor or another."""

    def __init__(self, client: httpx.AsyncClient, default: Deployment | None = None) -> None:
        self.client = client
        self.default = default

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        as_: Who | None = None,
        nonce: str | None = None,
        expires_in: int = 300,
        headers: dict[str, str] | None = None,
        deployment: Deployment | None = None,
    ) -> Any:
        raw = b"" if body is None else json.dumps(body).encode()
        sent = {"content-type": "application/json"} if body is not None else {}
        if as_ is not None:
            sent.update(
                sign_request(
                    as_.key, UnsignedRequest(method, path, raw, deployment=deployment or deployment_of(path, body, self.default),
                    expires_at=int(time.time()) + expires_in, nonce=nonce)
                )
            )  # fmt: skip
        sent.update(headers or {})
        return await self.client.request(method, path, content=raw or None, headers=sent)


def api_settings(database_url: str, **overrides: Any) -> ApiSettings:
    """Settings for tests: short waits, no Kafka."""
    values: dict[str, Any] = {
        "database_url": database_url,
        "evidence_wait_seconds": 0.3,
        "finalize_wait_seconds": 0.3,
        "plugin_packages": ["tests.verification.plugins"],
        "endpoint_hosts": ["127.0.0.1"],
        "deployments": [{"chain_id": CHAIN_ID, "escrow": ESCROW}],
    }
    values.update(overrides)
    return ApiSettings(**values)


@contextlib.asynccontextmanager
async def running_api(settings: ApiSettings) -> AsyncIterator[Api]:
    """The app with its lifespan running, reached in process through httpx."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60) as client:
            served = settings.served_deployments()
            yield Api(client, served[0] if served else None)


@pytest.fixture
async def api(database_url: str, who: dict[str, Who]) -> AsyncIterator[Api]:
    """The real app on the test's own database."""
    settings = api_settings(database_url, marketplace_verifier_address=who["marketplace"].address)
    async with running_api(settings) as client:
        yield client


class IndexedChain:
    """Writes escrow events as the indexer does: an `escrow_events` row, its outbox message, the cursor."""

    def __init__(self, database_url: str, chain_id: int = CHAIN_ID, escrow: str = ESCROW, topic: str = EVENTS) -> None:
        self.database_url = database_url
        self.chain_id = chain_id
        self.escrow = escrow
        self.topic = topic
        self.block = 100
        self.now = int(time.time())
        self.written: list[DecodedLog] = []

    async def _write(self, task_id: int, name: str, args: dict[str, Any]) -> DecodedLog:
        self.block += 1
        block_hash = "0x" + f"{self.block:064x}"
        event = DecodedLog(
            id=event_id(self.chain_id, block_hash, 0), chain_id=self.chain_id, escrow_address=self.escrow,
            block_number=self.block, block_hash=block_hash, block_timestamp=self.now,
            tx_hash="0x" + f"{self.block:064x}", tx_index=0, log_index=0, event=name, task_id=task_id, args=args,
        )  # fmt: skip
        conn: asyncpg.Connection = await connect(self.database_url)
        try:
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO escrow_events (event_id, chain_id, escrow_address, block_number, block_hash,"
                    " block_timestamp, tx_hash, tx_index, log_index, event_name, task_id, args, position)"
                    " VALUES ($1, $2, $3, $4, $5, $6, $7, 0, 0, $8, $9, $10,"
                    " (SELECT COALESCE(max(position), 0) + 1 FROM escrow_events WHERE chain_id = $2))",
                    event.id, self.chain_id, self.escrow, self.block, block_hash, self.now, event.tx_hash,
                    name, task_id, args,
                )  # fmt: skip
                await enqueue(conn, [event_message(event, self.topic)])
                await self._cursor(conn)
        finally:
            await conn.close()
        self.written.append(event)
        return event

    async def _cursor(self, conn: asyncpg.Connection) -> None:
        await conn.execute(
            "INSERT INTO chain_cursor (chain_id, block_number, block_hash, head_number, head_timestamp)"
            " VALUES ($1, $2, $3, $2, $4) ON CONFLICT (chain_id) DO UPDATE SET block_number = $2,"
            " block_hash = $3, head_number = $2, head_timestamp = $4",
            self.chain_id, self.block, "0x" + f"{self.block:064x}", self.now,
        )  # fmt: skip

    async def _retract(self, event: DecodedLog) -> None:
        conn: asyncpg.Connection = await connect(self.database_url)
        try:
            async with conn.transaction():
                await conn.execute("DELETE FROM escrow_events WHERE event_id = $1", event.id)
                await enqueue(conn, [event_message(event, self.topic, removed=True)])
        finally:
            await conn.close()

    async def write(self, task_id: int, name: str, args: dict[str, Any]) -> DecodedLog:
        """Store one event."""
        return await self._write(task_id, name, args)

    async def retract(self, event: DecodedLog) -> None:
        """A reorg removed `event`: delete it and queue its retraction, as the indexer does."""
        await self._retract(event)

    async def created(
        self, task_id: int, poster: str, task_hash: str, *, verifier: str = ZERO, deadline: int | None = None
    ) -> DecodedLog:
        return await self.write(task_id, "TaskCreated", {
            "taskId": task_id, "poster": poster, "verifier": verifier, "token": ZERO, "reward": 10**7,
            "deadline": deadline if deadline is not None else self.now + 86_400, "taskHash": task_hash, "status": 0,
        })  # fmt: skip

    async def accepted(self, task_id: int, agent: str) -> DecodedLog:
        return await self.write(task_id, "TaskAccepted", {"taskId": task_id, "agent": agent, "status": 1})

    async def submitted(self, task_id: int, agent: str, attempt: int, evidence: str) -> DecodedLog:
        return await self.write(task_id, "EvidenceSubmitted", {
            "taskId": task_id, "agent": agent, "attempt": attempt, "evidenceHash": evidence, "status": 2,
        })  # fmt: skip

    async def judged(
        self, task_id: int, verifier: str, agent: str, attempt: int, evidence: str, passed: bool, score: int
    ) -> DecodedLog:
        return await self.write(task_id, "VerificationCompleted", {
            "taskId": task_id, "verifier": verifier, "attempt": attempt, "evidenceHash": evidence, "passed": passed,
            "score": score, "agent": agent, "agentPayout": 0, "fee": 0, "failedAt": 0 if passed else self.now,
            "status": 4 if passed else 3,
        })  # fmt: skip

    async def advance(self, seconds: int) -> None:
        """Move chain time forward (an empty block: only the cursor moves)."""

        async def tick() -> None:
            conn: asyncpg.Connection = await connect(self.database_url)
            try:
                await self._cursor(conn)
            finally:
                await conn.close()

        self.now += seconds
        self.block += 1
        await tick()


async def drain(database_url: str, handler: Any, *, name: str = "verification-test", judge: bool = True) -> list[str]:
    """Feed pending outbox rows of the events and requests topics to the consumer's real `handle_one`,
    and let the judging stage judge what they queued (unless `judge` is false), until neither
    has anything left.

    The runtime's own per-message path (inbox, savepoint, dead letter), without a broker:
    the Kafka round trip is covered by the integration tests.
    """
    judging = JudgingPool(database_url, handler)
    consumer = IdempotentConsumer(
        name=name, topics=[EVENTS, REQUESTS], bootstrap="unused:9092", database_url=database_url,
        handler=handler, dlq_topic=DLQ,
    )  # fmt: skip
    outcomes: list[str] = []
    conn: asyncpg.Connection = await connect(database_url)
    try:
        while True:
            rows = await conn.fetch(
                "SELECT seq, topic, key, headers, payload FROM outbox WHERE published_at IS NULL"
                " AND topic = ANY($1::text[]) ORDER BY seq",
                [EVENTS, REQUESTS],
            )
            if not rows:
                if judge and await judging.run_once():
                    continue  # the verdicts may have queued more (none on these topics today)
                return outcomes
            for row in rows:
                message = InboundMessage(
                    topic=row["topic"], partition=0, offset=row["seq"], key=row["key"],
                    headers=dict(row["headers"]), value=row["payload"], timestamp_ms=0,
                )  # fmt: skip
                async with conn.transaction():
                    outcomes.append(await consumer.handle_one(conn, message))
                    await conn.execute("UPDATE outbox SET published_at = now() WHERE seq = $1", row["seq"])
    finally:
        await conn.close()


async def finalized_task(
    api: Api, chain: IndexedChain, who: dict[str, Who], task_id: int, verifier_ref: str, result: str = "x"
) -> None:
    """An auto task judged by the plugin `verifier_ref`: terms registered, posted, accepted,
    submitted and finalized through the API (its messages wait in the outbox)."""
    body = {"chainId": CHAIN_ID, "escrow": ESCROW, "poster": who["poster"].address, "instructionsDigest": "0x" + "ab" * 32,
            "verificationMode": "auto", "verifier": {"kind": "plugin", "ref": verifier_ref}}  # fmt: skip
    task_hash = (await api.call("POST", "/v1/terms", body, as_=who["poster"])).json()["taskHash"]
    await chain.created(task_id, who["poster"].address, task_hash)
    await chain.accepted(task_id, who["agent"].address)
    await chain.submitted(task_id, who["agent"].address, 1, result_hash(result))
    path = f"/v1/tasks/{CHAIN_ID}/{ESCROW}/{task_id}/finalize"
    assert (await api.call("POST", path, {"result": result}, as_=who["agent"])).status_code == 202


SIGNING_KEY = anvil_key(40)[1]


def make_handler(**overrides: Any) -> VerificationHandler:
    """The consumer's handler with the test topics and signing key."""
    values: dict[str, Any] = {
        "registry": default_registry(allowed_plugin_packages=["tests.verification.plugins"], allowed_endpoint_hosts=["127.0.0.1"]),
        "signing": VerdictSigning.from_key(SIGNING_KEY),
        "topics": Topics(events=EVENTS, requests=REQUESTS, verdicts=VERDICTS, dead_letters=DLQ),
        "retry_policy": RetryPolicy(base_seconds=0.0, max_seconds=0.0),
    }
    values.update(overrides)
    return VerificationHandler(**values)


@pytest.fixture
def chain(database_url: str) -> IndexedChain:
    """An indexed chain in the test's database."""
    return IndexedChain(database_url)


# ---------------------------------------------------------------- the verification process as a child


async def until(predicate: Callable[[], Awaitable[bool]], what: str, process: VerificationProcess, timeout: float = 120) -> None:
    """Poll `predicate` (a generous deadline: it only bounds a hung run)."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached\n{process.output()}")
        await asyncio.sleep(0.05)


@pytest.fixture
async def feed(database_url: str, kafka_bootstrap: str, topic_prefix: str) -> AsyncIterator[Feed]:
    await migrate_url(database_url)
    # A short group session: every start and stop of the consumer waits on the group's join.
    fed = Feed(database_url, kafka_bootstrap, topic_prefix, session_timeout_ms=3000)
    await fed.start(partitions=1)  # one partition: every task's messages queue behind each other
    yield fed
    await fed.stop()


@pytest.fixture
async def verifier() -> AsyncIterator[LatencyVerifier]:
    served = LatencyVerifier()
    await served.start()
    yield served
    await served.stop()
