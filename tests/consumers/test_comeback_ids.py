"""An event that comes back after a reorg (A → B → A) is republished under a new id
(`<event id>#1`); what the consumers derive from it must go out under a new id too.

The outbox keeps one row per (topic, message id) and drops a second row with the same id
(`ON CONFLICT DO NOTHING`), and subscribers deduplicate on the id: an output id built from
the event id alone made the comeback's reputation record the same id as the first one's, so
the record carrying the state after the comeback was never published. On real PostgreSQL,
through the consumers' idempotent runtime.
"""

from __future__ import annotations

import json
import time
from typing import Any

import asyncpg

from indexer.decode import DecodedLog
from indexer.store import event_message
from lifecycle import consumer as lifecycle_consumer
from lifecycle.reputation import consumer as reputation_consumer
from runtime.consumer import IdempotentConsumer, InboundMessage
from runtime.db import connect, migrate_url
from schemas.events import event_id, incarnation_id

CHAIN = 31337
ESCROW = "0x5fbdb2315678afecb367f032d93f642f64180aa3"
AGENT = "0x" + "a1" * 20
POSTER = "0x" + "b2" * 20
VERIFIER = "0x" + "c3" * 20


def _log(block: int, task_id: int, name: str, args: dict[str, Any]) -> DecodedLog:
    block_hash = "0x" + f"{block:064x}"
    return DecodedLog(
        id=event_id(CHAIN, block_hash, 0), chain_id=CHAIN, escrow_address=ESCROW, block_number=block,
        block_hash=block_hash, block_timestamp=int(time.time()), tx_hash=block_hash, tx_index=0, log_index=0,
        event=name, task_id=task_id, args=args,
    )


async def _deliver(conn: asyncpg.Connection, consumer: IdempotentConsumer, log: DecodedLog, **kwargs: Any) -> None:
    out = event_message(log, "escrow.events.v1", **kwargs)
    message = InboundMessage(topic=out.topic, partition=0, offset=log.block_number, key=out.key,
                             headers=dict(out.headers), value=out.payload, timestamp_ms=0)  # fmt: skip
    async with conn.transaction():
        await consumer.handle_one(conn, message)


async def _published(conn: asyncpg.Connection, topic: str) -> list[tuple[str, dict[str, Any]]]:
    rows = await conn.fetch("SELECT message_id, payload FROM outbox WHERE topic = $1 ORDER BY seq", topic)
    return [(r["message_id"], json.loads(bytes(r["payload"]))) for r in rows]


async def test_a_failed_verdict_back_after_a_reorg_republishes_the_agents_reputation(database_url: str) -> None:
    await migrate_url(database_url)
    conn = await connect(database_url)
    try:
        consumer = reputation_consumer.build_consumer(
            bootstrap="unused:9092", database_url=database_url, reputation_topic="t.reputation"
        )
        verdict = _log(10, 7, "VerificationCompleted", {
            "taskId": 7, "verifier": VERIFIER, "attempt": 1, "evidenceHash": "0x" + "22" * 32, "passed": False,
            "score": 10, "agent": AGENT, "agentPayout": 0, "fee": 0, "failedAt": 1, "status": 5})  # fmt: skip
        await _deliver(conn, consumer, verdict)  # A
        await _deliver(conn, consumer, verdict, removed=True)  # B: retracted
        await _deliver(conn, consumer, verdict, message_id=incarnation_id(verdict.id, 1))  # A again
        stored = await conn.fetchrow("SELECT score, failures FROM agent_reputation WHERE agent = $1", AGENT)
        assert (stored["score"], stored["failures"]) == (90, 1)
        published = await _published(conn, "t.reputation")
        ids = [message_id for message_id, _ in published]
        assert len(ids) == 3 == len(set(ids)), ids
        *_, (last_id, last) = published
        assert (last["score"], last["failures"]) == (90, 1), "the newest record is the state after the comeback"
        assert last_id.endswith("#1")
    finally:
        await conn.close()


async def test_a_task_event_back_after_a_reorg_republishes_the_task_state(database_url: str) -> None:
    await migrate_url(database_url)
    conn = await connect(database_url)
    try:
        consumer = lifecycle_consumer.build_consumer(
            bootstrap="unused:9092", database_url=database_url, tasks_topic="t.tasks", timers_topic="t.timers"
        )
        created = _log(20, 8, "TaskCreated", {
            "taskId": 8, "poster": POSTER, "verifier": "0x" + "0" * 40, "token": "0x" + "0" * 40,
            "reward": 10**7, "deadline": int(time.time()) + 86_400, "taskHash": "0x" + "ab" * 32, "status": 0})  # fmt: skip
        accepted = _log(21, 8, "TaskAccepted", {"taskId": 8, "agent": AGENT, "status": 1})
        await _deliver(conn, consumer, created)
        await _deliver(conn, consumer, accepted)  # A
        await _deliver(conn, consumer, accepted, removed=True)  # B: retracted
        await _deliver(conn, consumer, accepted, message_id=incarnation_id(accepted.id, 1))  # A again
        states = [state for _, state in await _published(conn, "t.tasks")]
        assert [s["status"] for s in states] == [0, 1, 0, 1], "every change, the comeback's included, published"
        ids = [message_id for message_id, _ in await _published(conn, "t.tasks")]
        assert len(ids) == len(set(ids)), ids
    finally:
        await conn.close()
