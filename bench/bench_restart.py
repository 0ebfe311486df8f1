"""Consumer restart: how soon a restarted consumer is back at work, after a drain or a kill.

    python -m bench.bench_restart [--rounds N] [--service lifecycle|verification]

Each round runs the consumer as a real process (`escrowd consume ...`), waits until it has
handled a first message (it is in its group), stops it, puts one more message on the topic
and starts it again at once. Two ways to stop, in the same run: SIGTERM (the service shell
drains: the consumer commits and leaves its group) and SIGKILL, the baseline, which leaves
the group to the broker's session timeout, as the verification consumer did on SIGTERM
before it drained. Reported: seconds from the restart to `consumer_started` and to the new
message handled, medians over the rounds. One JSON object on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.services import on_services
from escrowd.devnet import anvil_key
from escrowd.harness import task_created_record
from runtime.db import connect, migrate_url
from runtime.kafka import TopicSpec, ensure_topics, make_producer
from runtime.logging import configure_logging


async def _round(service: str, how: signal.Signals, database_url: str, bootstrap: str, task: int) -> dict[str, float]:
    prefix = f"b{uuid.uuid4().hex[:8]}"
    events = f"{prefix}.events"
    await ensure_topics(bootstrap, [TopicSpec(events, 4), TopicSpec(f"{prefix}.dlq", 1), TopicSpec(f"{prefix}.tasks", 1),
                                    TopicSpec(f"{prefix}.timers", 1)])  # fmt: skip
    argv = ["consume", "lifecycle"]
    env = {**os.environ, "ESCROWD_DATABASE_URL": database_url, "ESCROWD_KAFKA_BOOTSTRAP": bootstrap,
           "ESCROWD_EVENTS_TOPIC": events, "ESCROWD_DEAD_LETTER_TOPIC": f"{prefix}.dlq",
           "ESCROWD_TASKS_TOPIC": f"{prefix}.tasks", "ESCROWD_TIMERS_TOPIC": f"{prefix}.timers"}  # fmt: skip
    group = "escrowd-lifecycle"
    if service == "verification":
        argv, group = ["consume", "verification", "run"], f"{prefix}.verification"
        env |= {"ESCROWD_VERIFICATION_SIGNING_KEY": anvil_key(9)[1], "ESCROWD_VERIFICATION_GROUP": group,
                "ESCROWD_VERIFICATION_REQUESTS_TOPIC": f"{prefix}.requests", "ESCROWD_VERDICTS_TOPIC": f"{prefix}.verdicts"}  # fmt: skip
    producer = make_producer(bootstrap)
    await producer.start()
    conn = await connect(database_url)
    log_dir = Path(tempfile.mkdtemp())

    async def send(n: int) -> str:
        message_id, key, payload, headers = task_created_record(events, n)
        await producer.send_and_wait(events, payload, key=key, headers=headers)
        return message_id

    async def handled(message_id: str) -> None:
        sql = "SELECT 1 FROM consumer_inbox WHERE consumer = $1 AND message_id = $2"
        while True:
            if await conn.fetchval(sql, group, message_id):
                return
            await asyncio.sleep(0.02)

    def spawn(name: str) -> tuple[subprocess.Popen[bytes], Path]:
        path = log_dir / f"{name}.log"
        with path.open("wb") as out:
            return subprocess.Popen([sys.executable, "-m", "escrowd.cli", *argv], env=env, stdout=out, stderr=subprocess.STDOUT), path

    async def started(path: Path) -> None:
        while True:
            if '"consumer_started"' in await asyncio.to_thread(path.read_text, errors="replace"):
                return
            await asyncio.sleep(0.02)

    try:
        first, _ = spawn("first")
        await asyncio.wait_for(handled(await send(task)), 180)
        first.send_signal(how)
        await asyncio.to_thread(first.wait, 60)
        later = await send(task + 1)
        begin = time.monotonic()
        second, path = spawn("second")
        await asyncio.wait_for(started(path), 180)
        to_started = time.monotonic() - begin
        await asyncio.wait_for(handled(later), 180)
        to_handled = time.monotonic() - begin
        second.send_signal(signal.SIGTERM)
        await asyncio.to_thread(second.wait, 60)
    finally:
        await producer.stop()
        await conn.close()
    return {"to_consumer_started_s": round(to_started, 3), "to_first_message_s": round(to_handled, 3)}


async def main(service: str, rounds: int, database_url: str, bootstrap: str) -> dict[str, Any]:
    await migrate_url(database_url)
    runs: dict[str, list[dict[str, float]]] = {"sigterm": [], "sigkill_baseline": []}
    for index in range(rounds):
        for name, how in (("sigterm", signal.SIGTERM), ("sigkill_baseline", signal.SIGKILL)):
            runs[name].append(await _round(service, how, database_url, bootstrap, 10 * index + (1 if how is signal.SIGTERM else 5)))
    summary: dict[str, Any] = {"benchmark": "restart", "service": service, "rounds": rounds}
    for name, results in runs.items():
        for field in ("to_consumer_started_s", "to_first_message_s"):
            summary[f"{name}_{field}"] = round(statistics.median(r[field] for r in results), 3)
    summary["speedup_to_first_message"] = round(
        summary["sigkill_baseline_to_first_message_s"] / summary["sigterm_to_first_message_s"], 2
    )
    summary["runs"] = runs
    return summary


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--service", choices=("lifecycle", "verification"), default="lifecycle")
    args = parser.parse_args()
    configure_logging(json=True, level="WARNING")
    result = on_services(lambda url, bootstrap: main(args.service, args.rounds, url, bootstrap))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    cli()
