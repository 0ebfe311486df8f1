"""Migration 090 hands the indexer's events over from per-event outbox rows to the log.

The migrations before 090 are applied in a schema of their own, holding what the old code
left: events whose outbox rows are published, one whose send was attempted but never
marked, one never tried, a retraction not yet sent and another producer's row. After 090
the watermark sits before the first unpublished event, `sending_through` covers the
attempted one, and the log republishes exactly the unpublished events under the ids their
outbox rows had; the other rows stay in the outbox.
"""

from __future__ import annotations

from runtime.db import connect, migration_files
from runtime.eventlog import read_after
from schemas.events import event_id

CHAIN = 31337
TOPIC = "escrow.events.v1"


async def test_migration_090_hands_unpublished_events_to_the_log(database_url: str) -> None:
    conn = await connect(database_url)
    try:
        await conn.execute("CREATE SCHEMA legacy")
        await conn.execute("SET search_path = legacy")
        for version, sql in migration_files():
            if version < "090":
                await conn.execute(sql)
        ids = [event_id(CHAIN, f"0x{n:064x}", 0) for n in range(1, 5)]
        for n, id_ in enumerate(ids, start=1):
            await conn.execute(
                "INSERT INTO escrow_events (event_id, chain_id, escrow_address, block_number, block_hash,"
                " block_timestamp, tx_hash, tx_index, log_index, event_name, task_id, args)"
                " VALUES ($1, $2, $3, $4, $5, 1000, $6, 0, 0, 'TaskAccepted', $7, $8)",
                id_, CHAIN, "0x" + "e" * 40, n, f"0x{n:064x}", "0x" + "1" * 64, n, {"taskId": n},
            )  # fmt: skip
        # e1, e2 published; e3 tried (maybe on Kafka), never marked; e4 never tried.
        for n, (published, attempts) in enumerate([(True, 1), (True, 1), (False, 1), (False, 0)]):
            await conn.execute(
                "INSERT INTO outbox (message_id, topic, payload, chain_id, block_number, event_id, send_attempts,"
                " published_at) VALUES ($1, $2, '\\x7b7d', $3, $4, $1, $5, CASE WHEN $6 THEN now() END)",
                ids[n], TOPIC, CHAIN, n + 1, attempts, published,
            )  # fmt: skip
        await conn.execute(
            "INSERT INTO outbox (message_id, topic, payload, chain_id, event_id) VALUES"
            " ('0xgone:removed', $1, '\\x7b7d', $2, '0xgone'), ('finalize:1', 'escrow.verification-requests.v1',"
            " '\\x7b7d', NULL, NULL)",
            TOPIC, CHAIN,
        )  # fmt: skip
        await conn.execute(
            "INSERT INTO chain_cursor (chain_id, block_number, block_hash) VALUES ($1, 5, $2)", CHAIN, "0x05"
        )

        (sql,) = [sql for version, sql in migration_files() if version.startswith("090")]
        await conn.execute(sql)

        cursor = await conn.fetchrow("SELECT log_position, topic FROM chain_cursor WHERE chain_id = $1", CHAIN)
        assert cursor is not None and (cursor["log_position"], cursor["topic"]) == (4, TOPIC)
        positions = await conn.fetch("SELECT event_id, position FROM escrow_events ORDER BY position")
        assert [r["event_id"] for r in positions] == ids and [r["position"] for r in positions] == [1, 2, 3, 4]
        mark = await conn.fetchrow("SELECT published_through, sending_through FROM event_log_watermarks")
        assert mark is not None and (mark["published_through"], mark["sending_through"]) == (2, 3)
        left = {r["message_id"] for r in await conn.fetch("SELECT message_id FROM outbox WHERE published_at IS NULL")}
        assert left == {"0xgone:removed", "finalize:1"}, "unpublished event rows moved to the log; the rest stay"
        states = {
            r["message_id"]: r["state"] for r in await conn.fetch("SELECT message_id, state FROM event_log_messages")
        }
        assert states == {ids[0]: "published", ids[1]: "published", ids[2]: "sending", ids[3]: "pending"}
        again = await read_after(conn, CHAIN, 2, 100, line=5)
        assert [m.message_id for m in again] == ids[2:], "republished under the ids their outbox rows had"
    finally:
        await conn.close()
