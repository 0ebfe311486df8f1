"""The escrow-wide roles (marketplace verifier, arbiter) the lifecycle consumer keeps.

`MarketplaceVerifierChanged` and `ArbiterChanged` belong to no task, so they are not folded
into task states; the consumer records each one (a retraction deletes it) and the current
holder of a role is the latest by chain position. `allowed_actions` takes the result to
name the judge and the arbiter and to leave out what a role overlap makes the escrow refuse.
"""

from __future__ import annotations

import asyncpg

from schemas.events import EscrowEventMessage
from schemas.task_state import EscrowRoles

# event name -> (role, the event field holding the new holder)
ROLE_EVENTS = {
    "MarketplaceVerifierChanged": ("marketplace_verifier", "newVerifier"),
    "ArbiterChanged": ("arbiter", "newArbiter"),
}


async def record(conn: asyncpg.Connection, message: EscrowEventMessage) -> bool:
    """Store (or, for a retraction, delete) a role change; False if it is not one."""
    spec = ROLE_EVENTS.get(message.event)
    if spec is None:
        return False
    if message.removed:
        await conn.execute("DELETE FROM escrow_role_events WHERE event_id = $1", message.id)
        return True
    role, field = spec
    await conn.execute(
        "INSERT INTO escrow_role_events (event_id, chain_id, escrow, role, address, block_number, log_index)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (event_id) DO NOTHING",
        message.id,
        message.chain_id,
        message.escrow_address.lower(),
        role,
        str(message.args[field]),
        message.block_number,
        message.log_index,
    )
    return True


async def load(conn: asyncpg.Connection, chain_id: int, escrow: str) -> EscrowRoles | None:
    """The escrow's current roles; None until both have been seen."""
    rows = await conn.fetch(
        "SELECT DISTINCT ON (role) role, address FROM escrow_role_events"
        " WHERE chain_id = $1 AND escrow = $2 ORDER BY role, block_number DESC, log_index DESC",
        chain_id,
        escrow.lower(),
    )
    current = {row["role"]: row["address"] for row in rows}
    if set(current) != {"marketplace_verifier", "arbiter"}:
        return None
    return EscrowRoles(marketplace_verifier=current["marketplace_verifier"], arbiter=current["arbiter"])
