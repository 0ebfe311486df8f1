"""Static group membership on the broker: does a returning member with the same
`group_instance_id` skip the join, against a dynamic member in the same run?

    python -m bench.bench_static_membership [--rounds N] [--gap SECONDS]

Each round: a member joins a fresh group (two partitions) and is assigned, stops (aiokafka's
`stop()`: a dynamic member leaves, a static one keeps its place for the session timeout of
10 s), and a new member joins again after `--gap` seconds (0: at once; a restarted process
takes about 5 s to reach its join), with the same instance id when static. Reported:
seconds to the first assignment for the first join and the rejoin, medians. One JSON object
on stdout. The consumers' restart itself is `bench.bench_restart`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from typing import Any

from aiokafka import AIOKafkaConsumer

from runtime.kafka import TopicSpec, ensure_topics
from runtime.services.kafka import start_kafka


async def _join(bootstrap: str, topic: str, group: str, instance: str | None) -> tuple[AIOKafkaConsumer, float]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, group_instance_id=instance,
        session_timeout_ms=10_000, heartbeat_interval_ms=1_000, enable_auto_commit=False,
    )  # fmt: skip
    started = time.monotonic()
    await consumer.start()
    while not consumer.assignment():
        await consumer.getmany(timeout_ms=200)
    return consumer, time.monotonic() - started


async def main(rounds: int, gap: float = 0.0) -> dict[str, Any]:
    """Dynamic and static rounds interleaved on one broker."""
    kafka = start_kafka()
    figures: dict[str, dict[str, list[float]]] = {m: {"first_join_s": [], "rejoin_s": []} for m in ("dynamic", "static")}
    try:
        for _ in range(rounds):
            for mode in ("dynamic", "static"):
                topic, group = f"m{uuid.uuid4().hex[:8]}", f"g{uuid.uuid4().hex[:8]}"
                await ensure_topics(kafka.bootstrap, [TopicSpec(topic, 2)])
                instance = "member-0" if mode == "static" else None
                consumer, first = await _join(kafka.bootstrap, topic, group, instance)
                await consumer.stop()
                await asyncio.sleep(gap)
                again, rejoin = await _join(kafka.bootstrap, topic, group, instance)
                await again.stop()
                figures[mode]["first_join_s"].append(round(first, 2))
                figures[mode]["rejoin_s"].append(round(rejoin, 2))
    finally:
        kafka.stop()
    summary: dict[str, Any] = {"benchmark": "static_membership", "rounds": rounds, "gap_s": gap}
    for mode, values in figures.items():
        summary[mode] = {k: {"median": statistics.median(v), "all": v} for k, v in values.items()}
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gap", type=float, default=0.0, help="Seconds between the stop and the rejoin")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.rounds, args.gap))))
