"""A Kafka producer in a process of its own, for `bench.bench_relayer`.

The verification service publishes verdicts from its own process; in the benchmark the
relayer runs in the benchmark's process, so producing there would put the producer's CPU on
the relayer's event loop and in its time. This process does it instead, and says when the
first and the last message of a burst were acknowledged by the broker, as
`time.monotonic()` (CLOCK_MONOTONIC: one clock for every process of the machine).

Protocol (JSON lines): argv is `bootstrap topic`; it prints `{"ready": true}` once its
producer is connected. Each stdin line is a burst, a list of `[value, key, headers]` (value
and key base64, headers a list of `[name, value]` with the value base64); for each burst it
prints `{"first_ack": t, "last_ack": t}`. It exits at end of input.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import sys
import time
from typing import Any


def _stamp(acks: list[float], _: object) -> None:
    acks.append(time.monotonic())


async def _run(bootstrap: str, topic: str) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, linger_ms=1, max_batch_size=256 * 1024)
    await producer.start()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 26)  # one line is a whole burst
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        print(json.dumps({"ready": True}), flush=True)
        while line := await reader.readline():
            burst: list[list[Any]] = json.loads(line)
            acks: list[float] = []
            futures = []
            for value, key, headers in burst:
                future = await producer.send(
                    topic,
                    value=base64.b64decode(value),
                    key=base64.b64decode(key),
                    headers=[(name, base64.b64decode(v)) for name, v in headers],
                )
                future.add_done_callback(functools.partial(_stamp, acks))
                futures.append(future)
            await asyncio.gather(*futures)
            print(json.dumps({"first_ack": min(acks), "last_ack": max(acks)}), flush=True)
    finally:
        await producer.stop()


def encode_burst(messages: list[tuple[bytes, bytes, list[tuple[str, bytes]]]]) -> bytes:
    """One stdin line: (value, key, headers) messages as this process reads them."""
    b64 = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
    return (json.dumps([[b64(v), b64(k), [[n, b64(h)] for n, h in headers]] for v, k, headers in messages]) + "\n").encode()


if __name__ == "__main__":
    asyncio.run(_run(sys.argv[1], sys.argv[2]))
