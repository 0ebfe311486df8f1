"""kill -9 the indexer again and again during a backfill: nothing is lost, nothing is doubled.

The chain holds 20,000+ real escrow logs (`createTask`, many per block). `escrowd index run`
runs as a child process and is killed with SIGKILL at random moments, each soon after it has
made progress, then restarted. After every kill the database must hold exactly the chain's
events up to the stored cursor; at the end it must hold exactly all of them, and the
distinct message ids on Kafka must be exactly the event ids (duplicates are allowed: the
publisher is at-least-once and consumers deduplicate on `ce_id`).

Two configurations: a small `finality_depth` so the range backfill does the work, and a
large one so every block goes through the head path (per-block headers and hashes).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from escrowd.devnet import Devnet, deploy_devnet
from runtime.db import connect
from runtime.services.anvil import AnvilProcess
from tests.support.indexer_harness import (
    ChainLog,
    IndexerProcess,
    assert_db_matches_chain,
    chain_config,
    chain_logs,
    create_topic,
    cursor_of,
    read_topic,
    wait_for,
    wait_until_published,
    write_config,
)

EVENTS = 20_000
PER_BLOCK = 250
KILLS = 12


@dataclass(frozen=True)
class LoadedChain:
    """A devnet with `EVENTS` escrow logs, and those logs."""

    devnet: Devnet
    head: int
    logs: list[ChainLog]


def _load(events: int, per_block: int = PER_BLOCK) -> Iterator[LoadedChain]:
    from tests.support.indexer_harness import generate_task_events

    with AnvilProcess(extra_args=("--gas-limit", "1000000000")) as anvil:
        devnet = deploy_devnet(anvil.rpc_url)
        head = generate_task_events(devnet, events, per_block=per_block)
        logs = chain_logs(
            devnet.rpc_url, devnet.chain_id, [devnet.escrow_address], devnet.deploy_block
        )
        assert len(logs) >= events
        yield LoadedChain(devnet, head, logs)


@pytest.fixture(scope="module")
def loaded_chain() -> Iterator[LoadedChain]:
    """One chain for the module: the indexer only reads it."""
    yield from _load(EVENTS)


CONFIGS = {
    # Range backfill: cursor deeper than 8 blocks below the head, small ranges, 2 in flight.
    "ranges": {"finality_depth": 8, "initial_range": 2, "max_range": 3, "ranges_in_flight": 2},
    # Head path for every block: windows of 3 blocks with every header.
    "head": {"finality_depth": 100_000, "head_window": 3},
}


async def _check_prefix(
    conn: asyncpg.Connection, chain: LoadedChain, by_block: dict[int, set[str]]
) -> int:
    """The stored events are exactly the chain's up to the cursor; returns the cursor."""
    cursor = await cursor_of(conn, chain.devnet.chain_id)
    number = -1 if cursor is None else cursor[0]
    stored = [r["event_id"] for r in await conn.fetch("SELECT event_id FROM escrow_events")]
    assert len(stored) == len(set(stored))
    expected = set().union(*(ids for block, ids in by_block.items() if block <= number))
    assert set(stored) == expected, (
        f"cursor {number}: {len(stored)} stored, {len(expected)} expected"
    )
    return number


async def _kill_loop(
    chain: LoadedChain, database_url: str, process: IndexerProcess, kills: int, rng: random.Random
) -> tuple[int, int]:
    """Kill the child at random points of the backfill; returns (kills, during backfill).

    Each life of the child gets a random cursor target between the current cursor and an
    even share of what is left, so the kills spread over the whole backfill whatever the
    machine's speed; the kill itself lands a random 0-20 ms after the target is reached,
    in the middle of whatever the child is doing (a fetch, a COPY, a commit, a Kafka send).
    """
    by_block: dict[int, set[str]] = {}
    for log in chain.logs:
        by_block.setdefault(log.block_number, set()).add(log.id)
    conn = await connect(database_url)
    during_backfill = 0
    try:
        process.start()
        while process.kills < kills:
            before = await _check_prefix(conn, chain, by_block)
            share = max(1, (chain.head - before) // (kills - process.kills + 1))
            target = before + rng.randint(1, share)

            async def reached(before: int = before, target: int = target) -> bool:
                if not process.running:
                    raise AssertionError(f"indexer exited:\n{process.output()}")
                cursor = await cursor_of(conn, chain.devnet.chain_id)
                if before >= chain.head:  # backfill done: kill while publishing instead
                    published = await conn.fetchval(
                        "SELECT count(*) FROM event_log_messages WHERE state = 'published'"
                    )
                    return bool(published > 0)
                return cursor is not None and cursor[0] >= target

            await wait_for(reached, timeout=60, interval=0.002, what="progress after a restart")
            await asyncio.sleep(rng.uniform(0.0, 0.02))
            process.kill9()
            at_kill = await _check_prefix(conn, chain, by_block)
            if at_kill < chain.head:
                during_backfill += 1
            process.start()
    finally:
        await conn.close()
    return process.kills, during_backfill


@pytest.mark.parametrize("mode", sorted(CONFIGS))
async def test_kill_9_during_backfill(
    mode: str,
    loaded_chain: LoadedChain,
    database_url: str,
    kafka_bootstrap: str,
    topic_prefix: str,
    tmp_path: Path,
) -> None:
    """≥ 10 SIGKILLs mid-backfill: the DB ends equal to the chain, Kafka ids equal the events."""
    await _run_crash_test(
        mode, loaded_chain, database_url, kafka_bootstrap, topic_prefix, tmp_path, KILLS
    )


async def _run_crash_test(
    mode: str,
    chain: LoadedChain,
    database_url: str,
    kafka_bootstrap: str,
    topic_prefix: str,
    tmp_path: Path,
    kills: int,
) -> None:
    devnet = chain.devnet
    topic = f"{topic_prefix}escrow.events.v1"
    await create_topic(kafka_bootstrap, topic)
    config = write_config(
        tmp_path / "indexer.yaml",
        database_url=database_url,
        kafka_bootstrap=kafka_bootstrap,
        topic=topic,
        chains=[chain_config(devnet, **CONFIGS[mode])],
    )
    process = IndexerProcess(config)
    rng = random.Random(f"{mode}-{time.time_ns()}")
    try:
        total, during_backfill = await _kill_loop(chain, database_url, process, kills, rng)
        assert total >= kills
        assert during_backfill >= 10, f"only {during_backfill} kills landed during the backfill"
        await wait_until_published(database_url, devnet.chain_id, chain.head, timeout=120)
        assert process.running, process.output()
        assert process.terminate() == 0, process.output()
    finally:
        process.cleanup()

    conn = await connect(database_url)
    try:
        logs = await assert_db_matches_chain(conn, devnet, to_block=chain.head)
        assert logs == chain.logs
        unpublished = await conn.fetchval("SELECT count(*) FROM event_log_messages WHERE state <> 'published'")
        assert unpublished == 0
    finally:
        await conn.close()
    records = await read_topic(kafka_bootstrap, topic, timeout=120)
    ids = [r.id for r in records]
    assert set(ids) == {g.id for g in chain.logs}
    assert not any(r.payload["removed"] for r in records)
    print(
        f"{mode}: {total} kills ({during_backfill} mid-backfill), {len(ids) - len(set(ids))} duplicate sends"
    )


@pytest.mark.soak
@pytest.mark.parametrize("mode", sorted(CONFIGS))
async def test_kill_9_soak(
    mode: str, database_url: str, kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """The same with 100,000 events and 30 kills (`make soak`)."""
    for chain in _load(100_000, per_block=1000):
        await _run_crash_test(
            mode, chain, database_url, kafka_bootstrap, topic_prefix, tmp_path, 30
        )
