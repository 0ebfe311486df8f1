"""Drive the indexer from outside: raw JSON-RPC, load generation, topic reads, child processes.

Shared by the benchmarks (`bench/`) and the tests (`tests/support/indexer_harness.py`
re-exports it); stdlib, orjson and aiokafka only, nothing of the test suite.
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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import orjson
import yaml
from aiokafka import AIOKafkaConsumer, TopicPartition

from escrowd.devnet import Devnet
from indexer.decode import DecodedLog
from indexer.store import event_message
from runtime.kafka import encode_headers
from schemas import jsoncodec
from schemas.cloudevents import decode_headers
from schemas.events import event_id

__all__ = [
    "HARNESS_ESCROW",
    "IndexerProcess",
    "TopicRecord",
    "chain_config",
    "escrowd_command",
    "generate_task_events",
    "read_topic",
    "rpc",
    "rpc_batch",
    "task_created_record",
    "write_config",
]

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


# ---------------------------------------------------------------------------- Kafka


HARNESS_ESCROW = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
"""The escrow address of the synthetic records (the first contract anvil's first account deploys)."""


def task_created_record(topic: str, task: int) -> tuple[str, bytes, bytes, list[tuple[str, bytes]]]:
    """A `TaskCreated` event record for `topic` as the indexer would produce it: (message id, key, payload, headers).

    For driving a consumer without a chain (the drain test, the restart benchmark): block
    `task`, block hash derived from `task`, so each task's record is distinct and stable."""
    block_hash = "0x" + f"{task:064x}"
    event = DecodedLog(
        id=event_id(31337, block_hash, 0), chain_id=31337, escrow_address=HARNESS_ESCROW, block_number=task,
        block_hash=block_hash, block_timestamp=int(time.time()), tx_hash=block_hash, tx_index=0, log_index=0,
        event="TaskCreated", task_id=task, args={
            "taskId": task, "poster": HARNESS_ESCROW, "verifier": "0x" + "0" * 40, "token": "0x" + "0" * 40,
            "reward": 10**7, "deadline": int(time.time()) + 86_400, "taskHash": "0x" + "11" * 32, "status": 0,
        },
    )  # fmt: skip
    message = event_message(event, topic)
    return message.message_id, message.key or b"", message.payload, encode_headers(message.headers)


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


async def read_topic(bootstrap: str, topic: str, *, timeout: float = 60.0) -> list[TopicRecord]:  # noqa: ASYNC109  (a deadline for the whole read)
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


class EscrowdProcess:
    """`escrowd <args>` as a child process, output to a log file."""

    def __init__(self, args: Sequence[str], *, env: dict[str, str] | None = None, name: str = "escrowd") -> None:
        self.args = list(args)
        self.env = {**os.environ, **(env or {})}
        self.name = name
        self.log_path = Path(tempfile.mkstemp(prefix=f"escrowd-{name}-", suffix=".log")[1])
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

    def start(self) -> Self:
        """Start a new child (the previous one must be gone)."""
        assert not self.running, f"{self.name} already running"
        with self.log_path.open("ab") as out:
            out.write(f"--- start {self.starts}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                [*escrowd_command(), *self.args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
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


class IndexerProcess(EscrowdProcess):
    """`escrowd index run --config FILE` as a child process, output to a log file."""

    def __init__(self, config: Path, *, env: dict[str, str] | None = None) -> None:
        super().__init__(["index", "run", "--config", str(config)], env=env, name="indexer")
        self.config = config
