"""The one clock of derived task state: chain time as far as the published events go.

Timers fire, and the API answers "what can whom do now", at the timestamp of the newest
block whose events are all published: the indexer's cursor minus its confirmations. Using
the head's time instead would answer for blocks whose events the task state does not hold
yet (an event waiting for its confirmations could void the answer).
"""

from __future__ import annotations

import asyncpg

# Per chain: the newest kept block at or below the publisher's confirmation line.
CONFIRMED_TIME_SQL = (
    "SELECT b.timestamp FROM chain_cursor c"
    " JOIN chain_blocks b ON b.chain_id = c.chain_id AND b.block_number <= c.block_number - c.confirmations"
    " WHERE c.chain_id = {chain} ORDER BY b.block_number DESC LIMIT 1"
)


async def confirmed_time(conn: asyncpg.Connection, chain_id: int) -> int | None:
    """Chain time of `chain_id` as far as its published events go (None before the first block)."""
    value = await conn.fetchval(CONFIRMED_TIME_SQL.format(chain="$1"), chain_id)
    return None if value is None else int(value)
