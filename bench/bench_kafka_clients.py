"""Kafka producer clients against this broker: aiokafka (what the publisher uses) and
confluent-kafka (librdkafka), when it is installed (it is not a dependency of the project:
`pip install confluent-kafka` into the environment to compare).

`python -m bench.bench_kafka_clients [--messages N] [--rounds R]` prints one JSON object.
Each round produces N messages shaped like the indexer's (a ~630-byte JSON body, a
`chain:task` key, the seven CloudEvents headers) to a fresh 4-partition topic, in batches of
2,000 with every ack awaited (the next batch queued while the previous one's acks are
awaited, as the publisher does), and reads the topic back to count them and to check that
each key landed on the partition the default (murmur2) partitioner names. The clients
alternate within a round; wall and process CPU time are reported for each.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import time
from typing import Any

import orjson
from aiokafka.partitioner import DefaultPartitioner

from escrowd.harness import read_topic
from runtime.kafka import TopicSpec, ensure_topics, make_producer, start_producer
from runtime.outbox import KeyPartitioner, send_batches
from runtime.services.kafka import start_kafka

BATCH = 2_000


def messages(count: int) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    """(key, value, headers) like the indexer's: 50 events per task key."""
    body = {
        "id": "31337:0x" + "ab" * 32 + ":1",
        "chain_id": 31337,
        "escrow_address": "0x5FbDB2315678afecb367f032d93F642f64180aa3",
        "block_number": 12,
        "block_hash": "0x" + "ab" * 32,
        "block_timestamp": 1_700_000_000,
        "tx_hash": "0x" + "cd" * 32,
        "tx_index": 1,
        "log_index": 1,
        "event": "TaskCreated",
        "task_id": 1,
        "removed": False,
        "args": {"taskId": 1, "poster": "0x" + "11" * 20, "reward": 10**18, "taskHash": "0x" + "42" * 32},
    }
    out = []
    for i in range(count):
        headers = [
            ("ce_specversion", b"1.0"),
            ("ce_id", f"31337:{i}".encode()),
            ("ce_source", b"escrowd/indexer/31337/0x5FbDB2315678afecb367f032d93F642f64180aa3"),
            ("ce_type", b"escrow.TaskCreated.v1"),
            ("content-type", b"application/json"),
            ("ce_subject", str(i // 50).encode()),
            ("ce_time", b"2023-11-14T22:13:20Z"),
        ]
        out.append((f"31337:{i // 50}".encode(), orjson.dumps({**body, "log_index": i}), headers))
    return out


async def with_aiokafka(bootstrap: str, topic: str, items: list[Any]) -> None:
    """The publisher's path: `send_batches` per 2,000, one batch's acks awaited behind the next."""
    producer = make_producer(bootstrap, client_id="bench-aiokafka")
    await start_producer(producer)
    try:
        partitioner = KeyPartitioner()
        previous: asyncio.Future[Any] | None = None
        for i in range(0, len(items), BATCH):
            acks = await send_batches(
                producer, [(topic, k, v, h) for k, v, h in items[i : i + BATCH]], partitioner
            )
            if previous is not None:
                await previous
            previous = acks
        if previous is not None:
            await previous
    finally:
        await producer.stop()


def with_confluent(bootstrap: str, topic: str, items: list[Any]) -> None:
    """librdkafka with the same settings (acks all, 256 KiB batches, 1 ms linger, murmur2
    for keys as the default Java/aiokafka partitioner): 2,000 queued, then the previous
    2,000's delivery reports awaited."""
    from confluent_kafka import KafkaException, Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "bench-confluent",
            "acks": "all",
            "enable.idempotence": False,
            "linger.ms": 1,
            "batch.size": 256 * 1024,
            "partitioner": "murmur2_random",
        }
    )
    delivered = 0
    errors: list[Any] = []

    def report(err: Any, _msg: Any) -> None:
        nonlocal delivered
        if err is not None:
            errors.append(err)
        delivered += 1

    for i in range(0, len(items), BATCH):
        for key, value, headers in items[i : i + BATCH]:
            producer.produce(topic, value=value, key=key, headers=headers, on_delivery=report)
        while delivered < i and not errors:
            producer.poll(0.001)
    producer.flush(30)
    if errors or delivered != len(items):
        raise KafkaException(f"{delivered} of {len(items)} delivered, errors: {errors[:3]}")


async def round_of(bootstrap: str, items: list[Any], clients: list[str]) -> list[dict[str, Any]]:
    """Each client once, on a fresh topic; every record read back and its partition checked."""
    results = []
    for client in clients:
        topic = f"bench{secrets.token_hex(3)}.{client}"
        await ensure_topics(bootstrap, [TopicSpec(topic, 4)])
        wall, cpu = time.perf_counter(), time.process_time()
        if client == "aiokafka":
            await with_aiokafka(bootstrap, topic, items)
        else:
            await asyncio.to_thread(with_confluent, bootstrap, topic, items)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        records = await read_topic(bootstrap, topic, timeout=300)
        default = DefaultPartitioner()
        misplaced = sum(1 for r in records if r.partition != default(r.key, [0, 1, 2, 3], [0, 1, 2, 3]))
        assert len({r.id for r in records}) == len(items) == len(records), (len(records), len(items))
        results.append(
            {
                "client": client,
                "messages_per_s": round(len(items) / wall),
                "cpu_us_per_message": round(cpu / len(items) * 1e6, 2),
                "keys_off_the_default_partition": misplaced,
            }
        )
        print(f"[bench_kafka_clients] {results[-1]}", file=sys.stderr, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the rounds, print the JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.bench_kafka_clients")
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    clients = ["aiokafka"]
    try:
        import confluent_kafka

        clients.append("confluent")
        version: str | None = confluent_kafka.version()[0]
    except ImportError:
        version = None
    items = messages(args.messages)
    kafka = start_kafka()
    try:
        rounds = []
        for n in range(args.rounds):
            order = clients if n % 2 == 0 else clients[::-1]
            rounds.append(asyncio.run(round_of(kafka.bootstrap, items, order)))
    finally:
        kafka.stop()
    print(orjson.dumps({"confluent_kafka": version or "not installed", "rounds": rounds}).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
