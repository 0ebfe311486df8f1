"""The database refuses a second live slot for a verdict, whether its own or a batch's item
(migration 140), on a real PostgreSQL: the rule the sender's status flow keeps, enforced
where a bug in that flow cannot get past it."""

from __future__ import annotations

import asyncpg
import pytest

from runtime.db import connect

SENDER = "0x" + "ab" * 20


async def _verdict(conn: asyncpg.Connection, task_id: int) -> int:
    verdict_id: int = await conn.fetchval(
        "INSERT INTO settlement_verdicts (chain_id, escrow, task_id, attempt, evidence_hash, passed, score,"
        " message_id, signer, signed_verdict, status) VALUES (31337, $1, $2, 1, $3, true, 90, $4, $5, '{}', 'sent')"
        " RETURNING id",
        "0x" + "cd" * 20, task_id, "0x" + "00" * 32, f"m{task_id}", SENDER,
    )  # fmt: skip
    return verdict_id


async def _slot(conn: asyncpg.Connection, nonce: int, kind: str, verdict_id: int | None = None) -> None:
    await conn.execute(
        "INSERT INTO settlement_transactions (chain_id, sender, nonce, verdict_id, kind, state)"
        " VALUES (31337, $1, $2, $3, $4, 'pending')",
        SENDER, nonce, verdict_id, kind,
    )  # fmt: skip


async def _item(conn: asyncpg.Connection, nonce: int, position: int, verdict_id: int) -> None:
    await conn.execute(
        "INSERT INTO settlement_batch_items (chain_id, sender, nonce, position, verdict_id) VALUES (31337, $1, $2, $3, $4)",
        SENDER, nonce, position, verdict_id,
    )  # fmt: skip


async def test_a_verdict_gets_one_live_slot_across_singles_and_batches(database_url: str) -> None:
    conn = await connect(database_url)
    try:
        a, b, c = [await _verdict(conn, t) for t in (1, 2, 3)]
        await _slot(conn, 0, "batch")
        await _item(conn, 0, 0, a)
        await _item(conn, 0, 1, b)
        # The same verdict twice in one batch, in a second batch, or as a single send: refused.
        with pytest.raises(asyncpg.UniqueViolationError):
            await _item(conn, 0, 2, a)
        await _slot(conn, 1, "batch")
        with pytest.raises(asyncpg.UniqueViolationError):
            await _item(conn, 1, 0, b)
        with pytest.raises(asyncpg.UniqueViolationError):
            await _slot(conn, 2, "verdict", a)
        # A single send first, then the verdict in a batch: refused too.
        await _slot(conn, 2, "verdict", c)
        with pytest.raises(asyncpg.UniqueViolationError):
            await _item(conn, 1, 0, c)
        # A slot that stopped counting (its nonce lost, or mined and reverted) frees its
        # verdicts: they may be sent again.
        await conn.execute("UPDATE settlement_transactions SET state = 'lost' WHERE sender = $1 AND nonce = 0", SENDER)
        await _item(conn, 1, 0, a)
        await conn.execute(
            "UPDATE settlement_transactions SET state = 'mined', receipt_status = 0 WHERE sender = $1 AND nonce = 2", SENDER
        )
        await _item(conn, 1, 1, c)
        await _slot(conn, 3, "verdict", b)  # b's only live batch was lost
        assert await conn.fetchval("SELECT count(*) FROM settlement_batch_items WHERE nonce = 1") == 2
    finally:
        await conn.close()


async def _items(conn: asyncpg.Connection, nonce: int, verdict_ids: list[int]) -> None:
    """A round's items in one statement, as the sender stores them (migration 190 checks
    them once per statement)."""
    await conn.execute(
        "INSERT INTO settlement_batch_items (chain_id, sender, nonce, position, verdict_id)"
        " SELECT 31337, $1, $2, p - 1, v FROM unnest($3::bigint[]) WITH ORDINALITY AS u(v, p)",
        SENDER, nonce, verdict_ids,
    )  # fmt: skip


async def test_a_round_stored_in_one_statement_is_checked_item_by_item(database_url: str) -> None:
    conn = await connect(database_url)
    try:
        a, b, c, d = [await _verdict(conn, t) for t in (11, 12, 13, 14)]
        await _slot(conn, 10, "batch")
        await _items(conn, 10, [a, b])
        await _slot(conn, 11, "batch")
        # The same verdict twice in one statement, or one already live elsewhere: the whole
        # statement is refused, nothing of it stored.
        with pytest.raises(asyncpg.UniqueViolationError):
            await _items(conn, 11, [c, c])
        with pytest.raises(asyncpg.UniqueViolationError):
            await _items(conn, 11, [c, b])
        await _slot(conn, 12, "verdict", d)
        with pytest.raises(asyncpg.UniqueViolationError):
            await _items(conn, 11, [d])
        assert await conn.fetchval("SELECT count(*) FROM settlement_batch_items WHERE nonce = 11") == 0
        await _items(conn, 11, [c])
        assert await conn.fetchval("SELECT count(*) FROM settlement_batch_items WHERE nonce IN (10, 11)") == 3
    finally:
        await conn.close()
