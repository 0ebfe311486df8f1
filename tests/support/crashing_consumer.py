"""A consumer process on the project's runtime whose handler really kills the process.

`python -m tests.support.crashing_consumer DATABASE_URL BOOTSTRAP TOPIC GROUP [DEATHS]`: a payload
`{"crash": true}` makes the handler dereference a null pointer (SIGSEGV, no Python
exception, no cleanup); any other payload `{"value": ...}` is recorded in `poison_seen`.
"""

from __future__ import annotations

import asyncio
import ctypes
import sys

import asyncpg

from runtime.consumer import IdempotentConsumer, InboundMessage


async def handler(conn: asyncpg.Connection, message: InboundMessage) -> None:
    payload = message.json()
    if payload.get("crash"):
        ctypes.string_at(0)  # a genuine segfault: the process dies inside the handler
    await conn.execute("INSERT INTO poison_seen (value) VALUES ($1)", str(payload["value"]))


async def main(database_url: str, bootstrap: str, topic: str, group: str, deaths: str = "1") -> None:
    consumer = IdempotentConsumer(
        name=group, topics=[topic], bootstrap=bootstrap, database_url=database_url, handler=handler,
        dlq_topic=f"{topic}.dlq", session_timeout_ms=6000, poison_after_deaths=int(deaths),
    )  # fmt: skip
    await consumer.run()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
