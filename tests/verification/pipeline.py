"""The verification pipeline on real services for the integration tests.

anvil (devnet) → the real indexer → PostgreSQL + outbox → the real outbox publisher → Kafka →
the verification consumer (IdempotentConsumer + VerificationHandler) → signed verdicts on
Kafka; the API runs in process on the same database. Every topic name has the test's prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from escrowd.devnet import Actor, Devnet, anvil_key
from indexer.config import ChainConfig
from indexer.service import ChainIndexer
from runtime.consumer import IdempotentConsumer
from runtime.db import connect
from runtime.kafka import TopicSpec, decode_headers, ensure_topics, make_producer
from runtime.outbox import OutboxPublisher
from schemas import jsoncodec
from schemas.task_terms import result_hash
from schemas.verdict import SignedVerdict
from verification.consumer import Topics, VerificationHandler
from verification.judging_stage import JudgingLimits, JudgingPool
from verification.registry import VerifierRegistry
from verification.routing import RetryPolicy
from verification.service import RetryScheduler
from verification.signing import VerdictSigning
from verification.verifiers import default_registry

from .conftest import Api, Who, api_settings, running_api

SIGNER_ADDRESS, SIGNER_KEY = anvil_key(41)


async def wait_for(predicate: Callable[[], Awaitable[bool]], timeout: float = 30.0, what: str = "condition") -> None:
    """Poll until `predicate` holds."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s")
        await asyncio.sleep(0.05)


@dataclass
class TopicReader:
    """Collects every record of a topic in the background."""

    bootstrap: str
    topic: str
    partitions: int
    records: list[ConsumerRecord[bytes, bytes]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        # No group: partitions assigned by hand, so there is no group join to wait for.
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=None, auto_offset_reset="earliest",
            enable_auto_commit=False, metadata_max_age_ms=1000,
        )  # fmt: skip
        await consumer.start()
        consumer.assign([TopicPartition(self.topic, p) for p in range(self.partitions)])
        await consumer.seek_to_beginning()

        async def loop() -> None:
            try:
                while True:
                    batch = await consumer.getmany(timeout_ms=200)
                    for items in batch.values():
                        self.records.extend(items)
            finally:
                await consumer.stop()

        self._task = asyncio.create_task(loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def verdicts(self) -> list[SignedVerdict]:
        """The records as signed verdicts."""
        return [SignedVerdict.model_validate(jsoncodec.loads(r.value)) for r in self.records]

    async def wait(self, count: int, timeout: float = 30.0) -> None:
        async def enough() -> bool:
            return len(self.records) >= count

        await wait_for(enough, timeout, f"{count} records on {self.topic}")

    def headers(self) -> list[dict[str, str]]:
        return [decode_headers(r.headers) for r in self.records]


@dataclass
class Pipeline:
    """Everything running for one test, with the test's handles."""

    devnet: Devnet
    database_url: str
    bootstrap: str
    topics: Topics
    api: Api
    verdicts: TopicReader
    dead_letters: TopicReader
    registry: VerifierRegistry
    conn: asyncpg.Connection
    consumer: IdempotentConsumer
    tasks: list[asyncio.Task[None]]

    def who(self, actor: Actor) -> Who:
        return Who(actor.name, actor.address, actor.private_key)

    async def chain(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A devnet call off the event loop (web3 is blocking)."""
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def post(self, poster: Actor, terms: dict[str, Any], *, verifier: Actor | None = None, duration: int = 7 * 86_400) -> int:
        """Register the terms through the API, then post the task on chain with their hash."""
        body = {"chainId": self.devnet.chain_id, "escrow": self.devnet.escrow_address, "poster": poster.address,
                "instructionsDigest": "0x" + secrets.token_hex(32), **terms}  # fmt: skip
        if verifier is not None:
            body["verifierAddress"] = verifier.address
        response = await self.api.call("POST", "/v1/terms", body, as_=self.who(poster))
        assert response.status_code == 201, response.text
        task_hash = bytes.fromhex(response.json()["taskHash"][2:])
        return int(await self.chain(self.devnet.post_task, poster, verifier=verifier, task_hash=task_hash, duration=duration))

    async def submit(self, task_id: int, agent: Actor, result: Any) -> str:
        """submitEvidence with the result's hash; returns the hash."""
        evidence = result_hash(result)
        await self.chain(self.devnet.submit_evidence, task_id, bytes.fromhex(evidence[2:]), sender=agent)
        return evidence

    async def finalize(self, task_id: int, agent: Actor, result: Any) -> Any:
        path = f"/v1/tasks/{self.devnet.chain_id}/{self.devnet.escrow_address}/{task_id}/finalize"
        return await self.api.call("POST", path, {"result": result}, as_=self.who(agent))

    async def settle(self, verdict: SignedVerdict) -> None:
        """What the settlement relayer does: completeVerification from the marketplace key."""
        v = verdict.verdict
        await self.chain(
            self.devnet.complete_verification, v.task_id, v.attempt, bytes.fromhex(v.evidence_hash[2:]), v.passed,
            v.score, sender=self.devnet.marketplace_verifier,
        )  # fmt: skip

    async def result_row(self, task_id: int, attempt: int) -> asyncpg.Record | None:
        return await self.conn.fetchrow(
            "SELECT * FROM verification_results WHERE task_id = $1 AND attempt = $2", task_id, attempt
        )

    async def wait_result(self, task_id: int, attempt: int, timeout: float = 30.0, **expected: Any) -> asyncpg.Record:
        async def ready() -> bool:
            row = await self.result_row(task_id, attempt)
            return row is not None and all(row[k] == v for k, v in expected.items())

        await wait_for(ready, timeout, f"result of task {task_id} attempt {attempt} with {expected}")
        row = await self.result_row(task_id, attempt)
        assert row is not None
        return row

    async def consumed(self, message_id: str, timeout: float = 30.0) -> None:
        """Wait until the verification consumer has handled the message with this `ce_id`, or
        the request with this id (a request's `ce_id` is `<request id>#<payload digest>`); its
        inbox row is written in the same transaction as every effect."""

        async def seen() -> bool:
            return bool(await self.conn.fetchval(
                "SELECT count(*) FROM consumer_inbox WHERE consumer = $1"
                " AND (message_id = $2 OR starts_with(message_id, $2 || '#'))",
                self.consumer.name, message_id,
            ))  # fmt: skip

        await wait_for(seen, timeout, f"message {message_id} consumed")

    async def verdicts_drained(self, timeout: float = 30.0) -> list[SignedVerdict]:
        """Every verdict that will ever reach Kafka for what was handled so far: the outbox
        has published all its verdict rows and the reader has read up to the topic's end."""

        async def published() -> bool:
            return not await self.conn.fetchval(
                "SELECT count(*) FROM outbox WHERE topic = $1 AND published_at IS NULL", self.topics.verdicts
            )

        await wait_for(published, timeout, "verdict outbox rows published")
        probe = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False)
        await probe.start()
        try:
            parts = [TopicPartition(self.topics.verdicts, p) for p in range(self.verdicts.partitions)]
            ends = {tp.partition: offset for tp, offset in (await probe.end_offsets(parts)).items()}
        finally:
            await probe.stop()

        async def read_to_end() -> bool:
            last: dict[int, int] = {}
            for record in self.verdicts.records:
                last[record.partition] = max(last.get(record.partition, -1), record.offset)
            return all(last.get(p, -1) >= end - 1 for p, end in ends.items())

        await wait_for(read_to_end, timeout, "verdict topic read to its end")
        return self.verdicts.verdicts()

    async def indexed(self) -> None:
        """Wait until the indexer stored everything up to the chain head."""
        head = await self.chain(self.devnet.block_number)

        async def caught_up() -> bool:
            value = await self.conn.fetchval("SELECT block_number FROM chain_cursor WHERE chain_id = $1", self.devnet.chain_id)
            return value is not None and value >= head

        await wait_for(caught_up, 30, "indexer at the head")


@contextlib.asynccontextmanager
async def pipeline(
    devnet: Devnet, database_url: str, bootstrap: str, prefix: str, *, registry: VerifierRegistry | None = None,
    trusted_api_signers: frozenset[str] = frozenset(), api_service_key: str | None = None,
) -> AsyncIterator[Pipeline]:
    """Start indexer, publisher, consumer, retry scheduler and API; stop them all afterwards."""
    topics = Topics(
        events=f"{prefix}escrow.events.v1", requests=f"{prefix}escrow.verification-requests.v1",
        verdicts=f"{prefix}escrow.verdicts.v1", dead_letters=f"{prefix}escrow.dlq.v1",
    )  # fmt: skip
    await ensure_topics(bootstrap, [TopicSpec(topics.events, 2), TopicSpec(topics.requests, 2),
                                    TopicSpec(topics.verdicts, 2), TopicSpec(topics.dead_letters, 1)])  # fmt: skip
    registry = registry or default_registry(
        allowed_plugin_packages=["tests.verification.plugins"], allowed_endpoint_hosts=["127.0.0.1"], endpoint_timeout=1.0
    )
    chain = ChainConfig(
        chain_id=devnet.chain_id, rpc_urls=[devnet.rpc_url], ws_url=devnet.ws_url, escrow_addresses=[devnet.escrow_address],
        confirmations=0, finality_depth=4, initial_range=50, poll_interval=0.1,
    )  # fmt: skip
    indexer = ChainIndexer(chain, database_url=database_url, topic=topics.events)
    producer = make_producer(bootstrap)
    await producer.start()
    publisher = OutboxPublisher(database_url, producer, idle_poll_seconds=0.05)
    handler = VerificationHandler(
        registry=registry, signing=VerdictSigning.from_key(SIGNER_KEY), topics=topics, retry_policy=RetryPolicy(0.3, 1.0),
        trusted_api_signers=trusted_api_signers,
    )
    consumer = IdempotentConsumer(
        name=f"{prefix}verification", topics=[topics.events, topics.requests], bootstrap=bootstrap,
        database_url=database_url, handler=handler, dlq_topic=topics.dead_letters, session_timeout_ms=6000,
    )  # fmt: skip
    scheduler = RetryScheduler(database_url, topics.requests, poll_seconds=0.2)
    judging = JudgingPool(database_url, handler, JudgingLimits(poll_seconds=0.2))
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(indexer.run(stop)),
        asyncio.create_task(publisher.run()),
        asyncio.create_task(consumer.run()),
        asyncio.create_task(judging.run()),
        asyncio.create_task(scheduler.run()),
    ]
    verdicts = TopicReader(bootstrap, topics.verdicts, 2)
    dead_letters = TopicReader(bootstrap, topics.dead_letters, 1)
    conn = await connect(database_url)
    settings = api_settings(
        database_url, verification_requests_topic=topics.requests, evidence_wait_seconds=15, finalize_wait_seconds=20,
        marketplace_verifier_address=devnet.marketplace_verifier.address,
        deployments=[{"chain_id": devnet.chain_id, "escrow": devnet.escrow_address}], api_service_key=api_service_key,
    )  # fmt: skip
    try:
        await verdicts.start()
        await dead_letters.start()
        async with running_api(settings) as api:
            yield Pipeline(devnet, database_url, bootstrap, topics, api, verdicts, dead_letters, registry, conn, consumer, tasks)
    finally:
        stop.set()
        consumer.stop()
        judging.stop()
        publisher.stop()
        for task in tasks[:4]:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 10)
        tasks[4].cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tasks[4]
        await verdicts.stop()
        await dead_letters.stop()
        await producer.stop()
        await registry.close()
        await conn.close()
