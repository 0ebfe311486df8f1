"""The publisher's event-log read-back against committed windows handed over in memory.

`python -m bench.bench_publisher_read [--events N] [--window N] [--rounds N]` prints one JSON
object. Each round commits the same N events in windows of `--window` (as the indexer does,
`IndexerStore.append`) to a fresh database, then publishes them to a fresh 4-partition topic
with one `OutboxPublisher`: once reading the log back (`read_after`), once with every window
handed over (`OutboxPublisher.committed`), alternating. Per event: this process's CPU, the
CPU of the publisher's PostgreSQL backend (`/proc/PID/stat`, so the server must be local),
and the wall time of the publish.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import time
from typing import Any

import orjson

from bench.bench_indexer import fresh_database
from bench.services import with_services
from indexer.decode import DecodedLog
from indexer.reorg import BlockRef
from indexer.store import IndexerStore
from runtime.db import connect
from runtime.kafka import TopicSpec, ensure_topics, make_producer
from runtime.logging import configure_logging
from runtime.outbox import OutboxPublisher
from runtime.services.kafka import KafkaService
from runtime.services.postgres import PostgresService
from schemas.events import event_id


def _events(block: BlockRef, count: int) -> list[DecodedLog]:
    return [
        DecodedLog(
            id=event_id(1, block.hash, i), chain_id=1, escrow_address="0x" + "E" * 40, block_number=block.number,
            block_hash=block.hash, block_timestamp=block.timestamp, tx_hash="0x" + f"{i:064x}", tx_index=i,
            log_index=i, event="TaskCreated", task_id=block.number * 100_000 + i,
            args={"taskId": block.number * 100_000 + i, "poster": "0x" + "a" * 40, "amount": 10**18,
                  "deadline": 1_700_000_000, "specHash": "0x" + "11" * 32},
        )
        for i in range(count)
    ]  # fmt: skip


def _backend_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _round(pg: PostgresService, bootstrap: str, events: int, window: int, memory: bool) -> dict[str, float]:
    url = await fresh_database(pg)
    topic = f"bench-read-{secrets.token_hex(3)}"
    await ensure_topics(bootstrap, [TopicSpec(topic, 4)])
    producer = make_producer(bootstrap)
    await producer.start()
    writer, conn = await connect(url), await connect(url)
    try:
        publisher = OutboxPublisher(url, producer)
        store = IndexerStore(1, topic)
        for n in range(1, events // window + 1):
            block = BlockRef(n, f"0x{n:064x}", f"0x{n - 1:064x}", 1_700_000_000 + n)
            batch = _events(block, window)
            last = await store.append(writer, events=batch, blocks=[block], tip=block, confirmations=0, head=None)
            if memory:
                publisher.committed(1, last, batch)
        total = events // window * window
        pid = conn.get_server_pid()
        cpu, backend, wall = time.process_time(), _backend_cpu(pid), time.perf_counter()
        sent = 0
        while sent < total:
            sent += await publisher.publish_logs(conn)
        return {
            "process_cpu_us_per_event": round((time.process_time() - cpu) / total * 1e6, 1),
            "postgres_cpu_us_per_event": round((_backend_cpu(pid) - backend) / total * 1e6, 1),
            "wall_us_per_event": round((time.perf_counter() - wall) / total * 1e6, 1),
        }
    finally:
        await producer.stop()
        await writer.close()
        await conn.close()


async def run(args: argparse.Namespace, pg: PostgresService, kafka: KafkaService) -> dict[str, Any]:
    """Alternate the two paths for `--rounds` rounds."""
    rounds: dict[str, list[dict[str, float]]] = {"database": [], "memory": []}
    for _ in range(args.rounds):
        for name in ("database", "memory"):
            rounds[name].append(await _round(pg, kafka.bootstrap, args.events, args.window, name == "memory"))
    return {
        "benchmark": "publisher_read",
        "events": args.events,
        "window": args.window,
        "load_average": os.getloadavg()[0],
        "rounds": rounds,
        "median": {
            name: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for name, runs in rounds.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run, print the JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.bench_publisher_read", description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=20_000, help="events per round (default 20000)")
    parser.add_argument("--window", type=int, default=2_000, help="events per committed window (default 2000)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of each path (default 4)")
    args = parser.parse_args(argv)
    configure_logging(json=True)
    result = with_services(lambda pg, kafka: run(args, pg, kafka))
    print(orjson.dumps(result).decode(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
