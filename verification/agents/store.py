"""SQL of listings and briefs (tables of `080_agents.sql`, format constraints of `180_brief_format.sql`)."""

from __future__ import annotations

from typing import Any

import asyncpg

from chain import indexed
from verification.agents import briefs
from verification.agents.listing import BriefState
from verification.routing import TaskKey


async def list_task(conn: asyncpg.Connection, key: TaskKey, task_hash: str, poster: str) -> bool:
    """Record the listing; False when it was listed already."""
    return bool(
        await conn.fetchval(
            "INSERT INTO task_listings (chain_id, escrow_address, task_id, task_hash, poster)"
            " VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING true",
            key.chain_id, key.escrow, key.task_id, task_hash.lower(), poster,
        )
    )


async def listing(conn: asyncpg.Connection, key: TaskKey) -> Any:
    """The task's listing row, or None."""
    return await conn.fetchrow(
        "SELECT * FROM task_listings WHERE chain_id = $1 AND escrow_address = $2 AND task_id = $3",
        key.chain_id, key.escrow, key.task_id,
    )  # fmt: skip


async def is_hash_listed(conn: asyncpg.Connection, task_hash: str) -> bool:
    """True when some task posted with these terms is listed."""
    return bool(await conn.fetchval("SELECT EXISTS (SELECT 1 FROM task_listings WHERE task_hash = $1)", task_hash.lower()))


async def listings(conn: asyncpg.Connection, chain_id: int | None, limit: int) -> list[Any]:
    """Listed tasks, newest first."""
    return list(
        await conn.fetch(
            "SELECT l.*, t.private, t.verification_mode, t.verifier_address FROM task_listings l"
            " JOIN task_terms t ON t.task_hash = l.task_hash WHERE ($1::bigint IS NULL OR l.chain_id = $1)"
            " ORDER BY l.listed_at DESC, l.task_id DESC LIMIT $2",
            chain_id, limit,
        )
    )


async def brief_state(conn: asyncpg.Connection, task_hash: str) -> BriefState:
    """Whether a brief is stored, whether it is encrypted, and its readers."""
    row = await conn.fetchrow("SELECT private FROM task_briefs WHERE task_hash = $1", task_hash.lower())
    if row is None:
        return BriefState(stored=False, private=False, recipients=frozenset())
    keys = await conn.fetch("SELECT recipient, wrapped FROM brief_keys WHERE task_hash = $1", task_hash.lower())
    return BriefState(
        stored=True, private=row["private"], recipients=frozenset(r["recipient"] for r in keys),
        malformed=frozenset(r["recipient"] for r in keys if not briefs.wrapped_key_text_well_formed(r["wrapped"])),
    )  # fmt: skip


async def store_brief(
    conn: asyncpg.Connection, task_hash: str, *, brief: str | None, ciphertext: bytes | None
) -> Any:
    """Store the brief once; returns the stored row (which may be an earlier, different one)."""
    await conn.execute(
        "INSERT INTO task_briefs (task_hash, private, brief, ciphertext) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
        task_hash.lower(), ciphertext is not None, brief, ciphertext,
    )  # fmt: skip
    return await conn.fetchrow("SELECT * FROM task_briefs WHERE task_hash = $1", task_hash.lower())


async def add_wrapped_keys(conn: asyncpg.Connection, task_hash: str, keys: dict[str, str]) -> None:
    """Add readers, or replace a reader's wrapped key (the ciphertext commits to its content key,
    so any replacement that opens it is the same key: replacing cannot show another brief)."""
    await conn.executemany(
        "INSERT INTO brief_keys (task_hash, recipient, wrapped) VALUES ($1, $2, $3)"
        " ON CONFLICT (task_hash, recipient) DO UPDATE SET wrapped = EXCLUDED.wrapped",
        [(task_hash.lower(), address.lower(), wrapped) for address, wrapped in keys.items()],
    )


async def load_brief(conn: asyncpg.Connection, task_hash: str) -> Any:
    """The stored brief row, or None."""
    return await conn.fetchrow("SELECT * FROM task_briefs WHERE task_hash = $1", task_hash.lower())


async def wrapped_key(conn: asyncpg.Connection, task_hash: str, reader: str) -> str | None:
    """The reader's wrapped key, or None."""
    value: str | None = await conn.fetchval(
        "SELECT wrapped FROM brief_keys WHERE task_hash = $1 AND recipient = $2", task_hash.lower(), reader.lower()
    )
    return value


async def verifier_tasks(conn: asyncpg.Connection, verifier: str, limit: int) -> list[Any]:
    """Listed agent-review tasks naming `verifier` whose newest indexed status is Submitted.

    Finished tasks stay listed; filtering them here keeps them from filling the page.
    """
    return list(
        await conn.fetch(
            "SELECT l.chain_id, l.escrow_address, l.task_id, l.task_hash FROM task_listings l"
            " JOIN task_terms t ON t.task_hash = l.task_hash WHERE t.verification_mode = 'agent'"
            " AND lower(t.verifier_address) = lower($1) AND "
            + indexed.LATEST_STATUS_SQL.format(chain="l.chain_id", task="l.task_id", escrow="l.escrow_address")
            + " = 2"
            " ORDER BY l.listed_at, l.task_id LIMIT $2",
            verifier,
            limit,
        )
    )
