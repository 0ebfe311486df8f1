"""The one clock of derived task state: chain time as far as the task's events are applied.

Timers fire, and the API answers "what can whom do now", at one instant per task: the
timestamp of the newest block that is at or below the indexer's confirmation line (cursor
minus confirmations) and below the first of the task's indexed events the lifecycle
consumer has not applied yet. Using the head's time, or even the confirmation line's alone,
could answer for blocks whose events the task state does not hold yet: an event waiting in
the outbox, on Kafka or in a lagging partition could void a timer that fired on its own.
Comparing with what was applied (not with what was published) makes the order hold
whatever the publisher and the broker do.
"""

from __future__ import annotations

import asyncpg

from chain import indexed

# The newest kept block at or below the confirmation line and below the first indexed event
# of the task that the lifecycle consumer has not applied.
TASK_TIME_SQL = indexed.TASK_TIME_SQL.replace(
    "{applied}", "EXISTS (SELECT 1 FROM lifecycle_events l WHERE l.event_id = e.event_id)"
)


async def task_time(conn: asyncpg.Connection, chain_id: int, escrow: str, task_id: int) -> int | None:
    """The task's clock, unix seconds (None while no block below that line is kept)."""
    value = await conn.fetchval(
        TASK_TIME_SQL.format(chain="$1", escrow="$2", task="$3"), chain_id, escrow.lower(), task_id
    )
    return None if value is None else int(value)

