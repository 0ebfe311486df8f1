"""Finality per chain through `escrowd index run`: `publish_at` tags and the finalized-only stream.

Anvil names `safe` (the head minus 32) and `finalized` (the head minus 64) blocks. With
`publish_at: safe` the publisher holds events until their block is safe; with
`finalized_topic` set, the same events reach that topic once finalized, and a reorg's
retraction, on the events topic, never does. A node without the tags (a proxy refusing them)
gets one warning line and the configured fallback confirmations.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import ClientSession, web

from escrowd.devnet import Devnet
from runtime.db import connect
from tests.support.indexer_harness import (
    IndexerProcess,
    chain_config,
    create_topic,
    read_topic,
    wait_for,
    write_config,
)
from tests.support.local_http import serve_post


async def _line(conn: object, chain_id: int) -> tuple[int, int] | None:
    row = await conn.fetchrow(  # type: ignore[attr-defined]
        "SELECT block_number, block_number - confirmations AS line FROM chain_cursor WHERE chain_id = $1", chain_id
    )
    return None if row is None else (row["block_number"], row["line"])


async def _published(conn: object, table: str = "event_log_watermarks", topic: str | None = None) -> bool:
    where = "" if topic is None else " WHERE w.topic = $1"
    args = () if topic is None else (topic,)
    return bool(await conn.fetchval(  # type: ignore[attr-defined]
        f"SELECT coalesce(bool_and(w.published_through >= c.log_position), false) FROM {table} w"
        f" JOIN chain_cursor c USING (chain_id){where}", *args))  # fmt: skip


async def test_publish_at_safe_holds_events_until_their_block_is_safe(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """The line is anvil's safe block (head minus 32): events above it wait, then go."""
    topic = f"{topic_prefix}events"
    await create_topic(kafka_bootstrap, topic)
    devnet.mine(40)  # a safe block above genesis
    for _ in range(3):
        devnet.post_task(devnet.posters[0])
    config = write_config(
        tmp_path / "indexer.yaml", database_url=database_url, kafka_bootstrap=kafka_bootstrap, topic=topic,
        chains=[chain_config(devnet, publish_at="safe", finality_depth=4)], retention={"enabled": False},
    )  # fmt: skip
    process = IndexerProcess(config).start()
    conn = await connect(database_url)
    try:
        head = devnet.block_number()

        async def at(block: int) -> bool:
            assert process.running, process.output()
            line = await _line(conn, devnet.chain_id)
            return line is not None and line[0] >= block

        await wait_for(lambda: at(head), timeout=60, what="indexer at the head")
        assert await _line(conn, devnet.chain_id) == (head, head - 32)
        below, above = await conn.fetchrow(
            "SELECT max(position) FILTER (WHERE block_number <= $1), min(position) FILTER (WHERE block_number > $1)"
            " FROM escrow_events", head - 32,
        )  # fmt: skip
        assert above is not None, "the tasks' events are above the line"
        await wait_for(
            lambda: conn.fetchval("SELECT published_through >= $1 FROM event_log_watermarks", below or 0),
            timeout=60, what="the events below the line published",
        )  # fmt: skip
        await asyncio.sleep(1.0)  # a publisher that ignored the line would send the rest now
        assert await conn.fetchval("SELECT published_through FROM event_log_watermarks") < above

        devnet.mine(40)
        await wait_for(lambda: _published(conn), timeout=60, what="events published once safe")
        ids = {r["event_id"] for r in await conn.fetch("SELECT event_id FROM escrow_events")}
        assert {r.headers["ce_id"] for r in await read_topic(kafka_bootstrap, topic)} == ids
        assert "finality_tag_unsupported" not in process.output(20_000)
    finally:
        process.cleanup()
        await conn.close()


async def test_the_finalized_stream_carries_final_events_only_never_a_reorged_one(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """Events topic at `latest`: an event, its reorg, its retraction; the finalized topic: survivors, once each."""
    events_topic, final_topic = f"{topic_prefix}events", f"{topic_prefix}final"
    for topic in (events_topic, final_topic):
        await create_topic(kafka_bootstrap, topic)
    for _ in range(3):
        devnet.post_task(devnet.posters[0])
    config = write_config(
        tmp_path / "indexer.yaml", database_url=database_url, kafka_bootstrap=kafka_bootstrap, topic=events_topic,
        chains=[chain_config(devnet, publish_at="latest", finality_depth=4)], finalized_topic=final_topic,
        retention={"enabled": False},
    )  # fmt: skip
    process = IndexerProcess(config).start()
    conn = await connect(database_url)
    try:
        head = devnet.block_number()
        await wait_for(
            lambda: conn.fetchval("SELECT block_number >= $1 FROM chain_cursor", head), timeout=60,
            what="indexer at the head",
        )  # fmt: skip
        await wait_for(lambda: _published(conn), timeout=60, what="events published")
        survivors = {r["event_id"] for r in await conn.fetch("SELECT event_id FROM escrow_events")}

        devnet.post_task(devnet.posters[1])
        await wait_for(
            lambda: conn.fetchval("SELECT count(*) > $1 FROM escrow_events", len(survivors)), timeout=60,
            what="the doomed task indexed",
        )  # fmt: skip
        await wait_for(lambda: _published(conn), timeout=60, what="the doomed task published")
        doomed_block = await conn.fetchval("SELECT max(block_number) FROM escrow_events")
        devnet.reorg(devnet.block_number() - doomed_block + 1)  # replaced by empty blocks
        await wait_for(
            lambda: conn.fetchval("SELECT count(*) > 0 FROM escrow_event_retractions"), timeout=60,
            what="the reorg repaired with a retraction",
        )  # fmt: skip
        assert {r["event_id"] for r in await conn.fetch("SELECT event_id FROM escrow_events")} == survivors

        devnet.mine(70)  # every block so far is finalized (anvil: head minus 64)
        await wait_for(
            lambda: conn.fetchval(
                "SELECT c.finalized_through >= (SELECT max(block_number) FROM escrow_events) FROM chain_cursor c"
                " WHERE c.chain_id = $1", devnet.chain_id
            ),
            timeout=60, what="the finalized line past the events",
        )  # fmt: skip
        await wait_for(lambda: _published(conn, "event_log_stream_watermarks", final_topic), timeout=60,
                       what="finalized stream caught up")  # fmt: skip
        final = await read_topic(kafka_bootstrap, final_topic)
        assert sorted(r.headers["ce_id"] for r in final) == sorted(survivors), "each final event once, no other"
        assert not any(r.payload["removed"] for r in final)
        events = await read_topic(kafka_bootstrap, events_topic)
        assert any(r.payload["removed"] for r in events), "the events topic did retract the reorged one"
    finally:
        process.cleanup()
        await conn.close()


@contextlib.asynccontextmanager
async def _tagless_proxy(upstream: str) -> AsyncIterator[str]:
    """A JSON-RPC endpoint in front of anvil that knows no `safe`/`finalized` tag, as older nodes."""

    async def handle(request: web.Request) -> web.Response:
        body = await request.json()
        calls = body if isinstance(body, list) else [body]
        if any(c.get("method") == "eth_getBlockByNumber" and c["params"][0] in ("safe", "finalized") for c in calls):
            replies = [
                {"jsonrpc": "2.0", "id": c.get("id"), "error": {"code": -32602, "message": "invalid block tag"}}
                for c in calls
            ]
            return web.json_response(replies if isinstance(body, list) else replies[0])
        async with ClientSession() as session, session.post(upstream, json=body) as reply:
            return web.Response(body=await reply.read(), content_type="application/json")

    async with serve_post(handle) as url:
        yield url + "/"


async def test_a_node_without_finality_tags_gets_a_warning_and_the_fallback_confirmations(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """The finalized stream's line falls back to `fallback_confirmations`; a fixed `publish_at` is untouched."""
    topic = f"{topic_prefix}events"
    await create_topic(kafka_bootstrap, topic)
    devnet.post_task(devnet.posters[0])
    devnet.mine(10)
    async with _tagless_proxy(devnet.rpc_url) as url:
        config = write_config(
            tmp_path / "indexer.yaml", database_url=database_url, kafka_bootstrap=kafka_bootstrap, topic=topic,
            chains=[chain_config(devnet, rpc_urls=[url], publish_at=3, fallback_confirmations=5, finality_depth=4)],
            finalized_topic=f"{topic_prefix}final", retention={"enabled": False},
        )  # fmt: skip
        process = IndexerProcess(config).start()
        conn = await connect(database_url)
        try:
            head = devnet.block_number()

            async def at_head() -> bool:
                assert process.running, process.output()
                line = await _line(conn, devnet.chain_id)
                return line is not None and line[0] >= head

            await wait_for(at_head, timeout=60, what="indexer at the head")
            assert await _line(conn, devnet.chain_id) == (head, head - 3), "publish_at: 3 needs no tag"
            await wait_for(
                lambda: conn.fetchval("SELECT finalized_through = $1 FROM chain_cursor", head - 5), timeout=30,
                what="the finalized line at the fallback depth",
            )  # fmt: skip
            warnings = [
                json.loads(line) for line in process.output(20_000).splitlines() if "finality_tag_unsupported" in line
            ]
            assert warnings and warnings[0]["tag"] == "finalized" and warnings[0]["fallback_confirmations"] == 5
        finally:
            process.cleanup()
            await conn.close()


async def _metric(port: int, name: str) -> float | None:
    with contextlib.suppress(OSError):
        async with ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as reply:
            for line in (await reply.text()).splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
    return None


async def test_a_reorg_below_the_finalized_line_is_counted_as_a_finality_violation(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """A node without tags, `fallback_confirmations: 1`: an event reaches the finalized stream
    once one block covers it, then a reorg two blocks deep takes it back. The stream cannot
    retract it; the indexer counts it (`escrowd_finality_violations_total`, 0 before)."""
    events_topic, final_topic = f"{topic_prefix}events", f"{topic_prefix}final"
    for topic in (events_topic, final_topic):
        await create_topic(kafka_bootstrap, topic)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with _tagless_proxy(devnet.rpc_url) as url:
        config = write_config(
            tmp_path / "indexer.yaml", database_url=database_url, kafka_bootstrap=kafka_bootstrap, topic=events_topic,
            chains=[chain_config(devnet, rpc_urls=[url], publish_at="latest", fallback_confirmations=1, finality_depth=8)],
            finalized_topic=final_topic, retention={"enabled": False}, metrics_port=port,
        )  # fmt: skip
        process = IndexerProcess(config).start()
        conn = await connect(database_url)
        try:
            async def exported() -> bool:
                assert process.running, process.output()
                return await _metric(port, "escrowd_finality_violations_total") is not None

            await wait_for(exported, timeout=60, what="the indexer's metrics")
            assert await _metric(port, "escrowd_finality_violations_total") == 0
            devnet.post_task(devnet.posters[0])
            doomed_block = devnet.block_number()
            devnet.mine(1)
            await wait_for(
                lambda: conn.fetchval(
                    "SELECT block_number > $1 AND finalized_through >= $1 FROM chain_cursor WHERE chain_id = $2",
                    doomed_block, devnet.chain_id,
                ),
                timeout=60, what="the task's block indexed and below the fallback line",
            )  # fmt: skip
            await wait_for(lambda: _published(conn, "event_log_stream_watermarks", final_topic), timeout=60,
                           what="the task on the finalized stream")  # fmt: skip
            doomed = {r["event_id"] for r in await conn.fetch(
                "SELECT event_id FROM escrow_events WHERE block_number = $1", doomed_block)}  # fmt: skip
            assert doomed
            assert doomed <= {r.headers["ce_id"] for r in await read_topic(kafka_bootstrap, final_topic)}

            devnet.reorg(devnet.block_number() - doomed_block + 1)  # replaced by empty blocks
            await wait_for(
                lambda: conn.fetchval("SELECT count(*) > 0 FROM escrow_event_retractions"), timeout=60,
                what="the reorg repaired with a retraction",
            )  # fmt: skip

            async def counted() -> bool:
                return await _metric(port, "escrowd_finality_violations_total") == len(doomed)

            await wait_for(counted, timeout=30, what="the violation counted")
            assert '"finality_violated"' in process.output(50_000)
        finally:
            process.cleanup()
            await conn.close()
