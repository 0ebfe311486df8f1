"""The reputation consumer over Kafka: one agent, whatever case its address is written in.

The indexer reports EIP-55 checksummed addresses; another producer (or a hand-written
replay) may write them in lower or upper case. Every form counts for the same agent, the
reputation is stored, keyed and published under the lower-case address, and the API answers
the same for every form.
"""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest
from fastapi import FastAPI

from indexer.store import event_message
from lifecycle.reputation import consumer as reputation_consumer
from lifecycle.routes import router as lifecycle_router
from runtime.db import connect, create_pool
from runtime.kafka import TopicSpec, encode_headers, ensure_topics, make_producer
from tests.support.escrow_logs import verification_completed
from tests.support.indexer_harness import wait_for

pytestmark = pytest.mark.timeout(180)

AGENT = "0x82f3a1c9d04b7e5a68c21b9d30a7f4e5c8d6291a"
CHECKSUMMED = "0x82f3a1c9d04B7e5A68c21b9d30A7F4E5C8D6291A"


async def test_the_reputation_consumer_counts_an_agent_in_any_case(
    database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    from eth_utils.address import to_checksum_address

    assert to_checksum_address(AGENT) == CHECKSUMMED
    events_topic, reputation_topic, dlq = (f"{topic_prefix}{n}" for n in ("escrow.events.v1", "reputation", "dlq"))
    await ensure_topics(kafka_bootstrap, [TopicSpec(t, 1) for t in (events_topic, reputation_topic, dlq)])
    events = [
        verification_completed(101, CHECKSUMMED, False),  # as the indexer writes it
        verification_completed(102, AGENT, True),
        verification_completed(103, "0x" + AGENT[2:].upper(), True),
    ]
    producer = make_producer(kafka_bootstrap)
    await producer.start()
    try:
        for event in events:
            row = event_message(event, events_topic)
            await producer.send_and_wait(row.topic, row.payload, key=row.key, headers=encode_headers(dict(row.headers)))
    finally:
        await producer.stop()

    member = reputation_consumer.build_consumer(
        bootstrap=kafka_bootstrap, database_url=database_url, events_topic=events_topic,
        group=f"{topic_prefix}reputation", reputation_topic=reputation_topic, dlq_topic=dlq,
    )  # fmt: skip
    task = asyncio.create_task(member.run())
    conn = await connect(database_url)
    try:

        async def all_counted() -> bool:
            return bool(await conn.fetchval("SELECT count(*) = 3 FROM reputation_outcomes"))

        await wait_for(all_counted, timeout=90, what="three verdicts counted")
        rows = [dict(r) for r in await conn.fetch("SELECT agent, score, dispute_count, passes, failures FROM agent_reputation")]
        # 100 - 10 (the failed round) + 1 + 1: all three are the one agent's.
        assert rows == [{"agent": AGENT, "score": 92, "dispute_count": 1, "passes": 2, "failures": 1}]
        assert {r["agent"] for r in await conn.fetch("SELECT agent FROM reputation_outcomes")} == {AGENT}

        app = FastAPI()
        app.include_router(lifecycle_router)
        app.state.pool = await create_pool(database_url)
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as client:
                answers = [(await client.get(f"/v1/agents/{a}/reputation")).json() for a in (AGENT, CHECKSUMMED, AGENT.upper().replace("0X", "0x"))]
                unknown = (await client.get(f"/v1/agents/{to_checksum_address('0x' + '5a' * 20)}/reputation")).json()
        finally:
            await app.state.pool.close()
        assert answers[0] == answers[1] == answers[2]
        assert (answers[0]["agent"], answers[0]["score"], answers[0]["passes"]) == (AGENT, 92, 2)
        assert unknown["agent"] == "0x" + "5a" * 20 and unknown["score"] == 100
        # Published under the lower-case address (the consumer's outbox rows, one per verdict).
        keys = [bytes(r["key"]) for r in await conn.fetch("SELECT key FROM outbox WHERE topic = $1", reputation_topic)]
        assert keys == [AGENT.encode()] * 3
    finally:
        member.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)
        await conn.close()
