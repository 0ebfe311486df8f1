"""One leader per database for a background loop: an advisory lock held on a connection of its own.

The retention pruner and the finalized-only stream each run in every indexer process; the
first to take its lock works, the others wait as standbys (a crashed leader's lock goes
with its socket). A connection error reconnects; any other error is logged and retried.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import asyncpg
import structlog

from runtime.aio import wait_event
from runtime.db import connect, is_connection_error

log = structlog.get_logger(__name__)

Body = Callable[[asyncpg.Connection], Awaitable[None]]
"""The work, on the leader's connection, until the stop event is set."""


async def run_as_leader(
    database_url: str, lock: int, stopping: asyncio.Event, body: Body, *, name: str, poll: float = 1.0
) -> None:
    """Take advisory lock `lock` (polling every `poll` seconds as a standby), then run `body`; until `stopping`."""
    while not stopping.is_set():
        conn: asyncpg.Connection | None = None
        try:
            conn = await connect(database_url)
            if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", lock):
                log.info(f"{name}_standby")
                while not await conn.fetchval("SELECT pg_try_advisory_lock($1)", lock):
                    if await wait_event(stopping, poll):
                        return
            await body(conn)
        except Exception as exc:
            if is_connection_error(exc):
                log.warning(f"{name}_retry", error=repr(exc))
            else:
                log.exception(f"{name}_failed")
            if await wait_event(stopping, poll):
                return
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close(timeout=2)
