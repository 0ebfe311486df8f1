"""Shared pieces of the ruling-path tests: a disputed task on the devnet, signed ruling
messages, the ruling consumer, one message applied through it, the sender stepped until a
ruling reaches a status."""

from __future__ import annotations

import asyncio
import time

import asyncpg

from escrowd.devnet import Devnet
from relayer.settlement.rulings import RulingHandler, RulingSender
from runtime.consumer import IdempotentConsumer, InboundMessage
from schemas import panels as msg
from schemas.task_state import TaskStatus

PANEL_KEY = "0x" + "5e" * 32
OTHER_KEY = "0x" + "6f" * 32


def disputed_task(devnet: Devnet) -> int:
    """A task that failed verification and whose agent disputed it."""
    poster, agent = devnet.posters[0], devnet.agents[0]
    task_id = devnet.post_task(poster)
    devnet.accept_task(task_id, sender=agent)
    evidence = b"\x11" * 32
    devnet.submit_evidence(task_id, evidence, sender=agent)
    devnet.complete_verification(task_id, 1, evidence, False, 10, sender=devnet.marketplace_verifier)
    devnet.raise_dispute(task_id, sender=agent)
    assert devnet.get_task(task_id).status == TaskStatus.DISPUTED
    return task_id


def ruling_message(devnet: Devnet, task_id: int, share: int, key: str = PANEL_KEY, offset: int = 0) -> InboundMessage:
    ruling = msg.Ruling(chain_id=devnet.chain_id, escrow=devnet.escrow_address, task_id=task_id, round=1,
                        agent_share_bps=share)
    signed = msg.sign_ruling(ruling, key)
    return InboundMessage(topic="escrow.panel-rulings.v1", partition=0, offset=offset, key=None,
                          headers={"ce_id": f"{msg.ruling_message_id(ruling)}:{offset}"},
                          value=signed.model_dump_json().encode(), timestamp_ms=0)


def ruling_consumer(devnet: Devnet) -> IdempotentConsumer:
    trusted = frozenset({msg.sign_ruling(msg.Ruling(chain_id=1, escrow="0x" + "00" * 20, task_id=1, round=1,
                                                    agent_share_bps=0), PANEL_KEY).signer.lower()})
    handler = RulingHandler(chain_id=devnet.chain_id, escrow=devnet.escrow_address, trusted_signers=trusted)
    return IdempotentConsumer(name="escrowd-relayer-rulings", topics=["x"], bootstrap="unused:9092",
                              database_url="unused", handler=handler)


async def admit(pool: asyncpg.Pool, consumer: IdempotentConsumer, message: InboundMessage) -> str:
    async with pool.acquire() as conn, conn.transaction():
        return await consumer.handle_one(conn, message)


async def until_status(pool: asyncpg.Pool, sender: RulingSender, task_id: int, status: str) -> asyncpg.Record:
    """Step the sender until the task's ruling has `status`; its row."""
    deadline = time.monotonic() + 120
    while True:
        await sender.step(pool)
        async with pool.acquire() as conn:
            row = await conn.fetchrow("SELECT * FROM settlement_rulings WHERE task_id = $1", task_id)
        if row is not None and row["status"] == status:
            return row
        assert time.monotonic() < deadline, f"ruling never reached {status}: {row and row['status']}"
        await asyncio.sleep(0.2)
